"""The LLM layer: profiles (resources/models.yaml), offline weights, backends, and the cached client."""

from bridge_assets.llm.client import ClientStats, LLMClient
from bridge_assets.llm.profiles import ModelProfile, get_profile, load_models_config, role_profiles
from bridge_assets.llm.types import LLMRequest, LLMResult, TokenLogprob

__all__ = ["ClientStats", "LLMClient", "LLMRequest", "LLMResult", "ModelProfile", "TokenLogprob",
           "get_profile", "load_models_config", "role_profiles"]
