"""The dataset registry: `resources/datasets.yaml`, one entry per dataset, loaded by kind."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from bridge_assets.errors import DatasetError
from bridge_assets.paths import PROJECT_ROOT
from bridge_assets.registry import registry_files
from bridge_assets.registry.relevance import RelevanceSettings

DatasetKind = Literal["beir", "nq_open", "trec", "bridge_release", "beir_url", "huggingface",
                      "ir_datasets"]
# Which part of a TREC topic is the query's text: its title, its description, or both.
QueryField = Literal["title", "description", "title_description"]
# What labelers and people judge: relevant or not (0/1), or the 0-3 grades of TREC DL and
# UMBRELA (0 irrelevant, 1 related, 2 highly relevant, 3 perfectly relevant).
LabelScale = Literal["binary", "graded"]
GRADES = (0, 1, 2, 3)
# `BRIDGE_DATASETS` points at another registry file (tests, or a user's own set of datasets);
# `<BRIDGE_REGISTRY_DIR>/datasets.yaml` is merged over it (bridge_assets.registry.registry_files).
REGISTRY_FILE = registry_files.DATASETS_FILE
REGISTRY_PATH = registry_files.DATASETS_PATH
# A dataset name becomes a partition key, a folder name (exports, reports, downloads) and a
# value in SQL, so it is kept to characters that are plain in all three.
_DATASET_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def validate_dataset_name(name: str) -> str:
    """`name` itself when it is a valid dataset name, else DatasetError saying what is allowed."""
    if not isinstance(name, str) or not _DATASET_NAME.fullmatch(name) or name in {".", ".."}:
        raise DatasetError(f"invalid dataset name {name!r}: use letters, digits, '_', '.' and '-' "
                           f"only (and not '.' or '..')")
    return name


class AutomationSettings(BaseModel):
    """What the daemon's automation may spend on a dataset (bridge_assets.pipeline.automation)."""

    model_config = ConfigDict(extra="forbid")

    # LLM calls one automation run may make (cached calls are free). 0: new pairs stay pending
    # for people or an explicit `bridge run`; the benchmark tables still refresh.
    llm_calls_per_run: int = Field(0, ge=0)


class DatasetSpec(BaseModel):
    """One dataset entry. Which fields are needed depends on `kind` (see datasets.yaml)."""

    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, AfterValidator(validate_dataset_name)]
    kind: DatasetKind
    description: str = ""
    # Local sources (paths relative to the project root).
    path: str | None = None          # beir folder, nq_open jsonl(.gz)
    split: str = "test"              # beir qrels/<split>.tsv
    corpus: str | None = None        # trec / bridge_release: jsonl or tsv collection
    topics: str | None = None        # trec topics (tsv or <top> format)
    qrels: str | None = None         # trec qrels
    answers: str | None = None       # optional answers jsonl {"query_id"|"_id", "answers"}
    queries: str | None = None       # bridge_release: the q_id/query/doc_id/answers file
    query_field: QueryField = "title"  # trec <top> topics: the field that is the query
    label_scale: LabelScale = "binary"  # new labels (LLM and human): 0/1 or the grades 0-3
    # What relevant means here: {definition: answer_support | useful | narrative | <your text>}
    # (bridge_assets.registry.relevance); unset: answer_support where a query has short answers,
    # narrative where it has a TREC topic, useful otherwise. Every labeler reads it.
    relevance: RelevanceSettings = Field(default_factory=RelevanceSettings)
    # Optional answer key: jsonl {"query_id", "doc_ids": [...], "partial": [...]} of unjudged
    # passages people read and verified as holes (or as partial answers). The run summary and
    # the report score the pipeline's labels against it (bridge_assets.qrels.known_holes).
    known_holes: str | None = None
    # Remote sources (machines with network).
    url: str | None = None           # beir_url: a BEIR zip
    id: str | None = None            # huggingface dataset id, or ir_datasets id
    options: dict[str, Any] = Field(default_factory=dict)
    # Per-asset configuration the main job uses for this dataset, e.g.
    # {"candidate_pool": {"depth": 3}}: the fields of each asset's Config class.
    pipeline: dict[str, dict[str, Any]] = Field(default_factory=dict)
    automation: AutomationSettings = Field(default_factory=AutomationSettings)
    # Size caps of the loaders (bridge_assets.ingest.loaders), when the defaults are too tight.
    max_line_bytes: int | None = Field(None, gt=0)
    max_text_chars: int | None = Field(None, gt=0)
    # Where the entry was read, and the folder its relative paths start from: the project root
    # for the shipped registry, the registry folder for a user's entry.
    _file: Path = PrivateAttr(default=REGISTRY_PATH)
    _base: Path = PrivateAttr(default=PROJECT_ROOT)

    @model_validator(mode="after")
    def _query_field_needs_topics(self) -> DatasetSpec:
        if self.query_field != "title" and self.kind != "trec":
            raise ValueError(f"query_field {self.query_field} applies to kind trec (TREC topics) only")
        return self

    def resolve(self, value: str | None, field: str) -> Path:
        if not value:
            raise DatasetError(f"dataset '{self.name}' of kind {self.kind} needs `{field}`",
                               self._file, field=field)
        path = Path(value)
        return path if path.is_absolute() else (self._base / path).resolve()

    @property
    def source(self) -> str:
        return self.path or self.url or self.id or self.queries or self.corpus or ""


def load_registry(path: Path = REGISTRY_PATH) -> dict[str, DatasetSpec]:
    """Parse the registry (`path`, with the user's datasets.yaml merged over it); a malformed
    entry fails naming its file, line and name."""
    try:
        registry = registry_files.load(path, REGISTRY_FILE)
    except registry_files.RegistryFileError as exc:
        raise DatasetError(exc.problem, exc.file, exc.line) from None
    specs = {}
    for name, body in (registry.data.get("datasets") or {}).items():
        origin = registry.origin("datasets", name)
        try:
            spec = DatasetSpec(name=name, **(body or {}))
        except Exception as exc:  # pydantic's message names the offending field
            raise DatasetError(f"invalid entry {name!r}: {exc}", origin.file, origin.line,
                               field=str(name)) from None
        spec._file, spec._base = origin.file, origin.base
        specs[name] = spec
    return specs


def add_dataset(name: str, body: dict[str, Any], replace: bool = False, path: Path | None = None) -> Path:
    """Write a dataset entry to `<registry dir>/datasets.yaml` (BRIDGE_REGISTRY_DIR set) or to
    `path` (default: the registry file), keeping the file's comments; refuses a registered name
    unless `replace`. The file is unchanged when the registry does not load with the entry.
    Returns the file written."""
    path = path or REGISTRY_PATH
    try:
        DatasetSpec(name=name, **body)  # fails before touching any file
    except ValidationError as exc:
        raise DatasetError(f"invalid entry {name!r}: {exc}") from None
    known = load_registry(path)
    if name in known and not replace:
        raise DatasetError(f"dataset '{name}' already exists (use --replace to replace it)",
                           known[name]._file)
    target = registry_files.target_file(path, REGISTRY_FILE)
    try:
        registry_files.add_entry(target, "datasets", name, body, lambda: load_registry(path), replace)
    except registry_files.RegistryFileError as exc:
        raise DatasetError(exc.problem, exc.file, exc.line) from None
    return target


def graded_datasets() -> tuple[str, ...]:
    """The registered datasets whose labels are grades 0-3 (`label_scale: graded`)."""
    return tuple(name for name, spec in load_registry().items() if spec.label_scale == "graded")


def get_dataset(name: str, registry: dict[str, DatasetSpec] | None = None) -> DatasetSpec:
    registry = registry if registry is not None else load_registry()
    if name not in registry:
        known = ", ".join(sorted(registry)) or "none"
        raise DatasetError(f"unknown dataset '{name}' (known: {known})",
                           registry_files.describe(REGISTRY_PATH, REGISTRY_FILE))
    return registry[name]

