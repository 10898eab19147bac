"""Errors of the retrieval stage. Each message names the thing at fault and what to do."""

from __future__ import annotations

from bridge_assets.errors import BridgeError


class RetrievalError(BridgeError, RuntimeError):
    """A retrieval system cannot run (bad registry entry, bad input, failed LLM calls...)."""


class RegistryError(RetrievalError):
    """resources/retrievers.yaml is missing, malformed, or refers to something unknown."""


class MissingRun(BridgeError, LookupError):
    """No stored run of a (dataset, retriever) in the lake: materialize retrieval_run first."""


class ModelUnavailableError(RetrievalError):
    """A system's model cannot be loaded here; the message says how to provide it."""
