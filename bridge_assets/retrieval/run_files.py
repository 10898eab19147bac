"""External runs as systems: the `run_file` kind reads a TREC run file per dataset.

A run file is read the way trec_eval reads it (bridge_assets.trec_io.read_trec_run): the rank
column is ignored, documents are ranked by score, a malformed line or a document retrieved
twice for one query is an error naming the file and the line. Lines whose query or document
the dataset does not know are skipped and counted (or, with `unknown_ids: error`, stop the
run); the counts and the first examples go to the run's metadata. What is left is ranked by
`top_k` like every other system and cut at the system's k.

Run files live in `<runs folder>/<dataset>/<name>.trec[.gz]`: the registry folder's `runs/`
when BRIDGE_REGISTRY_DIR is set (the `run_files_sensor` watches it), else `<data lake>/runs/`.
"""

from __future__ import annotations

import gzip
import hashlib
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from bridge_assets.ingest.errors import DatasetError
from bridge_assets.paths import LakeLocation
from bridge_assets.registry import registry_files
from bridge_assets.retrieval.errors import RegistryError
from bridge_assets.retrieval.registry import DATASET_PLACEHOLDER, RetrieverRegistry, append_system, load_registry
from bridge_assets.trec_io import read_trec_run

SUFFIXES = (".trec.gz", ".trec")
# A system name read from a file name becomes a partition key and a file name again.
_NAME = re.compile(r"[A-Za-z0-9_.-]+")
EXAMPLES = 5  # unknown ids quoted in the metadata and the log


def runs_dir(lake: LakeLocation) -> Path:
    """Where run files are kept: `<registry dir>/runs` (BRIDGE_REGISTRY_DIR), else the runs/ of
    `lake` (the store resource's)."""
    folder = registry_files.registry_dir()
    return folder / "runs" if folder else lake.runs


def validate_system_name(name: str) -> str:
    if not _NAME.fullmatch(name) or name in {".", ".."}:
        raise RegistryError(f"invalid system name {name!r}: use letters, digits, '_', '.' and '-' only")
    return name


def run_file_name(path: Path) -> tuple[str, str] | None:
    """(system name, suffix) of `<name>.trec` or `<name>.trec.gz`; None for other files."""
    for suffix in SUFFIXES:
        if path.name.endswith(suffix) and len(path.name) > len(suffix):
            return path.name[: -len(suffix)], suffix
    return None


@dataclass(frozen=True)
class FoundRun:
    dataset: str
    name: str
    path: Path

    @property
    def key(self) -> str:
        return f"{self.dataset}/{self.name}"


def find_run_files(folder: Path) -> list[FoundRun]:
    """Every `<folder>/<dataset>/<name>.trec[.gz]`, sorted."""
    found = []
    for path in sorted(folder.glob("*/*.trec*")) if folder.is_dir() else []:
        parsed = run_file_name(path)
        if parsed and path.is_file():
            found.append(FoundRun(path.parent.name, parsed[0], path))
    return found


@dataclass
class RunFileReport:
    """What reading a run file found; stored in the run's materialization metadata."""

    path: str
    sha256: str
    tag: str
    lines: int                       # result lines read (comments and blank lines aside)
    kept: int = 0                    # lines naming a known query and a known document
    unknown_query_lines: int = 0
    unknown_query_ids: int = 0       # distinct
    unknown_document_lines: int = 0  # among lines of known queries
    unknown_document_ids: int = 0    # distinct
    examples: list[str] = field(default_factory=list)

    def as_metadata(self) -> dict[str, Any]:
        return dict(self.__dict__)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_run_file(path: Path, dataset: str, query_ids: set[str], doc_ids: set[str],
                  unknown_ids: str = "skip") -> tuple[pl.DataFrame, RunFileReport]:
    """The (query_id, doc_id, score) rows of a TREC run file that `dataset` knows, and the report.

    Unknown ids are skipped and counted (`skip`) or the first one is an error (`error`); a file
    with no line left is an error either way."""
    trec = read_trec_run(path)
    frame = trec.frame.with_columns(line=pl.Series(trec.lines, dtype=pl.Int64),
                                    known_query=pl.col("query_id").is_in(list(query_ids)),
                                    known_doc=pl.col("doc_id").is_in(list(doc_ids)))
    bad_query = frame.filter(~pl.col("known_query"))
    bad_doc = frame.filter(pl.col("known_query") & ~pl.col("known_doc"))
    report = RunFileReport(str(path), file_sha256(path), trec.run_id, frame.height,
                           unknown_query_lines=bad_query.height, unknown_query_ids=bad_query["query_id"].n_unique(),
                           unknown_document_lines=bad_doc.height, unknown_document_ids=bad_doc["doc_id"].n_unique())
    problems = sorted(
        [(line, f"query \"{q}\" is not a query of dataset '{dataset}'", "qid")
         for q, line in bad_query.head(EXAMPLES).select("query_id", "line").iter_rows()]
        + [(line, f"document \"{d}\" is not in the corpus of dataset '{dataset}'", "docid")
           for d, line in bad_doc.head(EXAMPLES).select("doc_id", "line").iter_rows()])[:EXAMPLES]
    report.examples = [f"line {line}: {problem}" for line, problem, _ in problems]
    kept = frame.filter(pl.col("known_query") & pl.col("known_doc")).select("query_id", "doc_id", "score")
    report.kept = kept.height
    if problems and (unknown_ids == "error" or kept.is_empty()):
        line, problem, column = problems[0]
        why = "" if unknown_ids == "error" else " (and no line names a known query and document)"
        raise DatasetError(problem + why, path, line, column)
    return kept, report


# ---- registering a run file as a system ---------------------------------------------------

def template_for(path: Path, dataset: str) -> str:
    """The registry `path:` of the system whose run file on `dataset` is `path`: relative to the
    registry folder when the file is in it, else absolute."""
    path = Path(path).resolve()
    if path.parent.name != dataset:
        raise RegistryError(f"{path}: a run file lives in a folder named after its dataset "
                            f"(<runs folder>/{dataset}/{path.name})")
    template = path.parent.parent / DATASET_PLACEHOLDER / path.name
    folder = registry_files.registry_dir()
    return str(template.relative_to(folder)) if folder and template.is_relative_to(folder) else str(template)


def reads(registry: RetrieverRegistry, name: str, dataset: str, path: Path) -> bool:
    """Whether system `name` is a run_file that reads `path` on `dataset`."""
    return (name in registry.systems and registry.system(name).kind == "run_file"
            and registry.run_file(name, dataset) == Path(path).resolve())


def register_run_file(name: str, dataset: str, path: Path, *, k: int | None = None,
                      profiles: list[str] | None = None, replace: bool = False) -> tuple[RetrieverRegistry, bool]:
    """Make `path`, the run file of `name` on `dataset`, a run_file system: (registry, whether an
    entry was written). A system already reading that file (with that k) is left as it is; any
    other system of that name is refused unless `replace`."""
    validate_system_name(name)
    registry = load_registry()
    if reads(registry, name, dataset, path) and k in (None, registry.system(name).params().k):
        return registry, False
    if name in registry.systems and not replace:
        spec = registry.system(name)
        what = f"reads {spec.path}" if spec.kind == "run_file" else f"is a {spec.kind} system"
        raise RegistryError(f"{registry.origin('systems', name)}: '{name}' already exists and {what}; "
                            f"choose another name or replace it (--replace)")
    body: dict[str, Any] = {"kind": "run_file", "description": "External run imported from TREC run files.",
                            "path": template_for(path, dataset),
                            "profiles": list(profiles or [registry.active_profile])}
    if k:
        body["parameters"] = {"k": k}
    return append_system(name, body, replace=replace), True


def copy_run_file(source: Path, target: Path) -> Path:
    """Copy a run file, gzipping or unzipping it when the suffixes differ."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.resolve() == target.resolve():
        return target
    zipped_in, zipped_out = source.name.endswith(".gz"), target.name.endswith(".gz")
    if zipped_in == zipped_out:
        shutil.copyfile(source, target)
    else:
        with (gzip.open(source, "rb") if zipped_in else source.open("rb")) as reader, \
                (gzip.open(target, "wb") if zipped_out else target.open("wb")) as writer:
            shutil.copyfileobj(reader, writer)
    return target
