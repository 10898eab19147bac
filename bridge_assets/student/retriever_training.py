"""Fine-tuning the trained retriever's bi-encoder: the base model, the multi-positive in-batch
softmax loss, cached-gradient steps and the seeded training loop."""

from __future__ import annotations

import contextlib
import hashlib
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bridge_assets.student.retriever_data import TrainedRetrieverError, TrainingQuery, TrainSettings

if TYPE_CHECKING:
    import torch
    from sentence_transformers import SentenceTransformer


def base_location(name: str = "all-minilm-l6-v2") -> str:
    """The local folder of a retrievers.yaml model, through its declared sources (no download
    when HF_HUB_OFFLINE is set)."""
    from bridge_assets.student.model import base_model_location

    return base_model_location(name)


def load_encoder(location: str, max_length: int) -> SentenceTransformer:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(location, device="cpu")
    model.max_seq_length = max_length
    return model


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch's intra-op threads set to `count` inside, restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _embed(model: SentenceTransformer, texts: Sequence[str]) -> torch.Tensor:
    import torch.nn.functional as F

    features = model.tokenize(list(texts))
    return F.normalize(model(features)["sentence_embedding"], dim=-1)


def cached_gradient_step(model: SentenceTransformer, texts: Sequence[str],
                         loss_of: Callable[[torch.Tensor], torch.Tensor], chunk: int) -> float:
    """One step's gradients of `loss_of(embeddings of texts)` accumulated into `model`, with at
    most `chunk` texts' activations held at a time (gradient caching, Gao et al. 2021, as
    sentence-transformers' CachedMultipleNegativesRankingLoss): the embeddings are computed
    without a graph, the loss's gradient with respect to them is taken, then each chunk is
    encoded again with its graph (the same dropout: its RNG state replayed) and back-propagates
    its part. The gradients are the whole batch's; the memory is one chunk's (a batch of 8
    queries with 5 positives and 4 negatives of 256 tokens: 8.7 GiB in one graph, 1.7 GiB in
    chunks of 8; scripts/bench_retriever_step.py, docs/trained-retriever.md)."""
    import torch

    states, parts = [], []
    with torch.no_grad():
        for start in range(0, len(texts), chunk):
            states.append(torch.get_rng_state())
            parts.append(_embed(model, texts[start:start + chunk]))
    embeddings = torch.cat(parts).requires_grad_()
    loss = loss_of(embeddings)
    loss.backward()
    for n, start in enumerate(range(0, len(texts), chunk)):
        torch.set_rng_state(states[n])
        _embed(model, texts[start:start + chunk]).backward(embeddings.grad[start:start + chunk])
    return float(loss.detach())


def multi_positive_loss(query_embeddings: torch.Tensor, doc_embeddings: torch.Tensor, positive_mask: torch.Tensor,
                        scale: float) -> torch.Tensor:
    """Mean over queries of -log(sum of the softmax over all batch documents at the query's
    positives): every positive counts, no positive is its own query's negative."""
    import torch

    scores = scale * query_embeddings @ doc_embeddings.T
    positive_scores = scores.masked_fill(~positive_mask, float("-inf"))
    return (torch.logsumexp(scores, dim=1) - torch.logsumexp(positive_scores, dim=1)).mean()


def _batch(queries: Sequence[TrainingQuery]) -> tuple[list[str], torch.Tensor]:
    """The batch's distinct document texts and which are each query's positives."""
    import torch

    texts: list[str] = []
    index: dict[str, int] = {}
    for q in queries:
        for text in (*q.positives, *q.negatives):
            if text not in index:
                index[text] = len(texts)
                texts.append(text)
    mask = torch.zeros(len(queries), len(texts), dtype=torch.bool)
    for row, q in enumerate(queries):
        for text in q.positives:
            mask[row, index[text]] = True
    return texts, mask


def _queries_first_loss(queries: int, positive_mask: torch.Tensor,
                        scale: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """multi_positive_loss of embeddings whose first `queries` rows are the batch's queries and
    the others its documents."""
    return lambda embeddings: multi_positive_loss(embeddings[:queries], embeddings[queries:], positive_mask, scale)


@dataclass
class TrainingLog:
    queries: int
    positives: int
    negatives: int
    steps: int = 0
    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def loss_trend(self, window: int = 5) -> str:
        """The mean loss of the first and of the last `window` steps (at most half the steps
        each): one batch's loss says more about that batch than about the training."""
        n = max(1, min(window, len(self.losses) // 2))
        return (f"mean loss of the first {n} step(s) {sum(self.losses[:n]) / n:.3f} -> of the last {n} "
                f"{sum(self.losses[-n:]) / n:.3f}")


def train_retriever(model: SentenceTransformer, queries: Sequence[TrainingQuery], settings: TrainSettings) -> TrainingLog:
    """Fine-tune `model` (a SentenceTransformer, changed in place) on `queries`. Seeded: the
    batch order comes from random.Random(seed), dropout from torch.manual_seed(seed)."""
    import torch

    from bridge_assets.student.model import release_resident_llm

    if not queries:
        raise TrainedRetrieverError("no training query has a positive")
    release_resident_llm()  # the LLM of labels: utility (UtilSel) asked before the training
    log = TrainingLog(len(queries), sum(len(q.positives) for q in queries), sum(len(q.negatives) for q in queries))
    started = time.perf_counter()
    torch.manual_seed(settings.seed)
    order_rng = random.Random(settings.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.learning_rate)
    model.train()
    with torch_threads(settings.threads):
        for _ in range(settings.epochs):
            order = list(queries)
            order_rng.shuffle(order)
            for start in range(0, len(order), settings.batch_queries):
                batch = order[start:start + settings.batch_queries]
                texts, mask = _batch(batch)
                queries_first = [q.query for q in batch] + texts   # one pass encodes both, in chunks
                optimizer.zero_grad()
                loss = cached_gradient_step(model, queries_first, _queries_first_loss(len(batch), mask, settings.scale),
                                            settings.encode_chunk)
                optimizer.step()
                log.steps += 1
                log.losses.append(loss)
    model.eval()
    log.seconds = time.perf_counter() - started
    return log


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 over every parameter and buffer (name, dtype, bytes): equal iff the weights are."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(str(tensor.dtype).encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()
