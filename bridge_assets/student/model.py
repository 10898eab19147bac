"""The student annotator (DIRAS): a small cross-encoder trained on verified labels, calibrated
on held-out queries, that gives P(relevant) for any (query, chunk) at a fraction of an LLM
call's cost.

    student = train_student(examples, StudentSettings())
    student.save(folder); student = Student.load(folder)
    student.score([(query, chunk), ...])          # calibrated P(relevant), one per pair

The encoder starts from a shipped bi-encoder checkpoint (retrievers.yaml `models`, default
all-MiniLM-L6-v2) with a new one-logit relevance head, trained with binary cross-entropy
(targets may be soft: with `teacher_weight` w > 0, a pair with a teacher's P(yes) t learns
(1 - w) * label + w * t, DIRAS's distillation). A share of the queries (never their pairs apart)
is held out and a Platt calibration (the same logistic fit LARA uses) is fitted on it; with
too few held-out labels of both classes the calibration is the identity and says so.
Training is seeded and runs single-process on the CPU.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import json
import logging
import math
import random
import sys
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from bridge_assets.errors import BridgeError
from bridge_assets.evaluation.lara import IDENTITY, Calibrator, fit_calibrator
from bridge_assets.evaluation.scores import calibration_metrics

if TYPE_CHECKING:
    import torch
    from sentence_transformers import CrossEncoder
    from transformers import PreTrainedTokenizerBase

CALIBRATION_FILE = "calibration.json"
WEIGHTS_FILE = "model.safetensors"


class StudentError(BridgeError, ValueError):
    """A student that cannot be trained (no labels, one class) or loaded."""


class StudentSettings(BaseModel):
    """How a student is trained (every field is part of its key: a change retrains it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_model: str = Field("all-minilm-l6-v2", description="The encoder it starts from: a "
                            "model of resources/retrievers.yaml `models` (sentence-transformers).")
    epochs: int = Field(4, ge=1)
    learning_rate: float = Field(5e-5, gt=0)
    batch_size: int = Field(8, ge=1, description="Pairs per training step (16 at 256 tokens peaks at "
                            "3.2 GiB on the CPU, 8 at 2.4 GiB; docs/student.md).")
    max_length: int = Field(256, ge=16, description="Tokens of query + chunk it reads.")
    calibration_share: float = Field(0.25, ge=0.0, lt=1.0, description="Share of the queries "
                                     "held out of training to fit the calibration.")
    max_labels: int = Field(800, ge=2, description="At most this many labels train it and as many "
                            "calibrate it; beyond that a seeded sample (training: at most half "
                            "from each class; calibration: uniform). It bounds the time: 800 "
                            "labels, 4 epochs, batch 8 is 400 steps, about 1.25 s each at 256 "
                            "tokens on 2 cores (docs/student.md).")
    teacher_weight: float = Field(0.0, ge=0.0, le=1.0, description="Distillation: a training "
                                  "pair with a teacher's P(yes) t learns (1 - w) * label + w * t "
                                  "(0: its verified label only; docs/student.md).")
    low_memory: bool = Field(False, description="Train to the same weights in less memory and "
                             "more time: each layer's activations recomputed in the backward pass, "
                             "large blocks returned to the system when freed (all-mpnet-base-v2: "
                             "5.9 -> 2.9 GiB at 1.6-1.7x the time; docs/student.md). Not part of "
                             "the student's key.")
    seed: int = 0
    precision: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="The encoder's arithmetic when it scores (calibration and pool "
        "alike; training is float32): bfloat16 runs its matrix products about 2x faster on a CPU "
        "that computes bfloat16 natively (AVX512-BF16 or AMX) and slower on one that does not; "
        "`auto` is bfloat16 on such a CPU, float32 elsewhere (docs/student.md).")


@functools.cache
def cpu_has_bfloat16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether the CPU computes bfloat16 natively (its flags list avx512_bf16 or amx_bf16).
    False where the listing cannot be read: float32 is right on every CPU, only slower."""
    try:
        flags = {flag for line in cpuinfo.read_text().splitlines() if line.startswith("flags")
                 for flag in line.split(":", 1)[1].split()}
    except OSError:
        return False
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def scoring_precision(setting: str) -> str:
    """The precision a student of this setting scores in on this machine."""
    if setting == "auto":
        return "bfloat16" if cpu_has_bfloat16() else "float32"
    return setting


@dataclass(frozen=True)
class Example:
    """One training pair: `target` is 1/0 for a verified label, or a teacher's P(yes);
    `teacher`, where a teacher scored the pair, its P(yes) (distilled at `teacher_weight`)."""

    query_id: str
    query: str
    chunk: str
    target: float
    source: str = ""
    teacher: float | None = None

    def training_target(self, teacher_weight: float) -> float:
        """What the encoder learns for this pair."""
        if self.teacher is None or not teacher_weight:
            return self.target
        return (1 - teacher_weight) * self.target + teacher_weight * self.teacher


@dataclass
class TrainingReport:
    """What a training learned from and how well it calibrates on its held-out queries."""

    examples: int
    trained_on: int                       # contrast queries only, after the max_labels sample
    calibrated_on: int
    relevant: int
    sources: dict[str, int]
    calibration: str                      # "platt" | "identity (why)"
    held_out: dict[str, Any] = field(default_factory=dict)   # ECE/Brier/AUROC before and after
    seconds: float = 0.0
    precision: str = "float32"            # what the calibration's scores were computed in


def split_by_query(examples: Sequence[Example], share: float, seed: int) -> tuple[list[Example], list[Example]]:
    """(train, held out): `share` of the queries, chosen at random (seeded), are held out
    whole, so the calibration never sees a query the encoder trained on."""
    queries = sorted({e.query_id for e in examples})
    random.Random(seed).shuffle(queries)
    held = set(queries[:round(len(queries) * share)]) if share else set()
    return ([e for e in examples if e.query_id not in held], [e for e in examples if e.query_id in held])


# a label's part in a training (student_training_set.split)
TRAIN, CALIBRATION = "train", "calibration"
ONE_CLASS_QUERY = "one-class query"  # left out: its query's labels are all relevant, or all not
SAMPLED_OUT = "sampled out"          # left out: past max_labels


def contrast_queries(examples: Sequence[Example]) -> set[str]:
    """The queries whose hard labels hold both classes. Only they teach the student to tell a
    relevant chunk from another for the same query; a query labelled one way only (thousands
    of original positives of queries outside the pool, say) would teach the base rate instead."""
    classes: dict[str, set[bool]] = {}
    for e in examples:
        if e.target in (0.0, 1.0):
            classes.setdefault(e.query_id, set()).add(e.target == 1.0)
    return {query for query, seen in classes.items() if len(seen) == 2}


def held_out_queries(examples: Sequence[Example], settings: StudentSettings) -> set[str]:
    """The contrast queries held out whole to calibrate on (split_by_query, seeded)."""
    contrast = contrast_queries(examples)
    _, held = split_by_query([e for e in examples if e.query_id in contrast],
                             settings.calibration_share, settings.seed)
    return {e.query_id for e in held}


def _sample(indices: list[int], size: int, rng: random.Random) -> list[int]:
    return indices if len(indices) <= size else sorted(rng.sample(indices, size))


def assign_splits(examples: Sequence[Example], settings: StudentSettings,
                  calibration_queries: Collection[str] | None = None) -> list[str]:
    """Each example's part: TRAIN, CALIBRATION, or left out (ONE_CLASS_QUERY, SAMPLED_OUT).
    Only contrast queries count; of them `calibration_share` is held out whole (only hard
    labels calibrate), or the `calibration_queries` given (a fixed split, as the teacher data's),
    then at most `settings.max_labels` labels of each part are kept, a
    seeded sample. The training sample takes at most half of it from each class, so a scarce
    class is kept whole and not drowned; the calibration sample is uniform, so Platt fits the
    held-out labels' own proportion."""
    contrast = contrast_queries(examples)
    held = held_out_queries(examples, settings) if calibration_queries is None else set(calibration_queries)
    rng = random.Random(settings.seed)
    parts = [ONE_CLASS_QUERY if e.query_id not in contrast else SAMPLED_OUT for e in examples]
    by_class: dict[bool, list[int]] = {True: [], False: []}
    calibrating = []
    for i, e in enumerate(examples):
        if e.query_id not in contrast:
            continue
        if e.query_id not in held:
            by_class[e.target >= 0.5].append(i)
        elif e.target in (0.0, 1.0):
            calibrating.append(i)
    for members in by_class.values():
        for i in _sample(members, settings.max_labels // 2, rng):
            parts[i] = TRAIN
    for i in _sample(calibrating, settings.max_labels, rng):
        parts[i] = CALIBRATION
    return parts


@dataclass(frozen=True)
class BaseEncoder:
    """The encoder a student starts from: where its weights are here, and what they are."""

    location: str
    identity: dict   # what keys hash (`ResolvedModel.identity`): the same on every machine


def resolve_base_model(name: str) -> BaseEncoder:
    """A retrievers.yaml model, through its declared sources."""
    from bridge_assets.retrieval.registry import load_registry
    from bridge_assets.retrieval.weights import resolve_model

    registry = load_registry()
    if name not in registry.models:
        raise StudentError(f"student base_model '{name}' is not a model of retrievers.yaml "
                           f"(known: {', '.join(registry.models)})")
    spec = registry.models[name]
    resolved = resolve_model(spec)
    return BaseEncoder(resolved.location, resolved.identity(spec))


def base_model_location(name: str) -> str:
    """The folder (or Hub id) of a retrievers.yaml model."""
    return resolve_base_model(name).location


def _cross_encoder(location: str, max_length: int) -> CrossEncoder:
    from sentence_transformers import CrossEncoder

    return CrossEncoder(location, num_labels=1, max_length=max_length, device="cpu")


def release_resident_llm() -> None:
    """Close the in-process LLM an earlier step of the same process (`bridge run`'s) left
    resident, before a training: beside one, the demo's peak went past 4 GiB. The backends
    module is only imported if a local model ran, so nothing is loaded to close nothing."""
    llama = sys.modules.get("bridge_assets.llm.llama_backend")
    if llama is not None:
        llama.release_local_models()


def train_encoder(examples: Sequence[Example], settings: StudentSettings, location: str) -> CrossEncoder:
    """A CrossEncoder fine-tuned on `examples` (binary cross-entropy on the relevance logit,
    soft targets allowed), seeded."""
    import torch
    from transformers import logging as hf_logging

    release_resident_llm()
    torch.manual_seed(settings.seed)
    hf_logging.set_verbosity_error()  # "newly initialized classifier weights" is the point here
    model = _cross_encoder(location, settings.max_length)
    network, tokenizer = model.model, model.tokenizer
    if settings.low_memory:
        _recompute_layers(network)
    # foreach=False: the optimizer updates one tensor at a time, without temporaries the size of
    # the whole model (the same arithmetic)
    optimizer = torch.optim.AdamW(network.parameters(), lr=settings.learning_rate,
                                  foreach=not settings.low_memory)
    with _large_blocks_returned(settings.low_memory):
        _train_steps(network, tokenizer, optimizer, examples, settings)
    network.eval()
    return model


def _recompute_layers(network: torch.nn.Module) -> None:
    """Each transformer layer keeps only its input for the backward pass and computes its
    activations again there (torch's checkpoint, which replays dropout's random numbers, so
    the gradients are the same). Per layer, because not every architecture implements
    transformers' own switch (MPNet does not)."""
    import torch
    from torch.utils.checkpoint import checkpoint

    for layer in network.base_model.encoder.layer:
        # a layer's forward, whatever its arguments
        def recomputed(*args: Any, _forward: Callable[..., Any] = layer.forward, **kwargs: Any) -> Any:
            if network.training and torch.is_grad_enabled():
                return checkpoint(_forward, *args, use_reentrant=False, **kwargs)
            return _forward(*args, **kwargs)
        layer.forward = recomputed


@contextlib.contextmanager
def _large_blocks_returned(enabled: bool) -> Iterator[None]:
    """glibc keeps freed activations in its heap, fragmented, and the process grows step after
    step; with blocks of 1 MiB and more taken from mmap they go back to the system when freed
    (slower: every large block is a system call). Setting it ends glibc's own adaptation of the
    threshold, so after training it is left at that adaptation's ceiling (32 MiB on 64-bit),
    where a process that allocated large blocks ends up."""
    libc = None
    if enabled:
        try:
            libc = ctypes.CDLL("libc.so.6")
        except OSError:  # not glibc: the layers are still recomputed, only this tuning is skipped
            logging.getLogger(__name__).warning("low_memory: no glibc (libc.so.6) here, so freed "
                                                "blocks stay with the process")
            libc = None
    if libc is not None:
        libc.mallopt(_M_MMAP_THRESHOLD, 1 << 20)
    try:
        yield
    finally:
        if libc is not None:
            libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)


_M_MMAP_THRESHOLD = -3  # glibc's malloc.h


def _train_steps(network: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, optimizer: torch.optim.Optimizer,
                 examples: Sequence[Example], settings: StudentSettings) -> None:
    import torch

    loss_fn = torch.nn.BCEWithLogitsLoss()
    order = list(range(len(examples)))
    shuffle = random.Random(settings.seed)
    steps = settings.epochs * math.ceil(len(order) / settings.batch_size)
    every = max(1, steps // 10)  # progress: about ten lines a training
    step, losses = 0, []
    network.train()
    for _ in range(settings.epochs):
        shuffle.shuffle(order)
        for start in range(0, len(order), settings.batch_size):
            batch = [examples[i] for i in order[start:start + settings.batch_size]]
            features = tokenizer([e.query for e in batch], [e.chunk for e in batch], padding=True,
                                 truncation=True, max_length=settings.max_length, return_tensors="pt")
            # the last step's gradients are dropped before the forward pass, not after it: they
            # would sit beside its activations, the training's peak (one model's size more)
            optimizer.zero_grad(set_to_none=True)
            logits = network(**features).logits.view(-1)
            targets = [e.training_target(settings.teacher_weight) for e in batch]
            loss = loss_fn(logits, torch.tensor(targets, dtype=torch.float32))
            loss.backward()
            optimizer.step()
            step += 1
            losses.append(loss.item())
            if step % every == 0 or step == steps:
                logging.getLogger(__name__).info("student training: step %d of %d, mean loss %.4f",
                                                 step, steps, sum(losses) / len(losses))
                losses.clear()


def encoder_probabilities(model: CrossEncoder, pairs: Sequence[tuple[str, str]], batch_size: int = 64,
                          precision: str = "float32") -> list[float]:
    """sigmoid(logit) of each (query, chunk): the uncalibrated score, the encoder's matrix
    products in `precision` (float32 or bfloat16: torch's CPU autocast)."""
    import contextlib

    import torch

    if not pairs:
        return []
    arithmetic = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bfloat16" \
        else contextlib.nullcontext()
    # the raw logit (activation_fn=None would mean the model's default, a sigmoid, applied twice)
    with arithmetic:
        logits = model.predict(list(pairs), batch_size=batch_size, show_progress_bar=False,
                               activation_fn=torch.nn.Identity(), convert_to_numpy=True)
    return [1 / (1 + math.exp(-float(z))) for z in np.asarray(logits).reshape(-1)]


@dataclass
class Student:
    """A trained student: its encoder and its calibration."""

    encoder: Any
    calibrator: Calibrator
    settings: StudentSettings
    report: TrainingReport

    def score(self, pairs: Sequence[tuple[str, str]], batch_size: int = 64) -> list[float]:
        """Calibrated P(relevant) of each (query, chunk)."""
        return [self.calibrator(p) for p in encoder_probabilities(
            self.encoder, pairs, batch_size, scoring_precision(self.settings.precision))]

    def save(self, folder: Path) -> None:
        self.encoder.save_pretrained(str(folder))
        (folder / CALIBRATION_FILE).write_text(json.dumps(
            {"calibrator": asdict(self.calibrator), "settings": self.settings.model_dump(),
             "report": asdict(self.report)}, indent=2, sort_keys=True))

    @classmethod
    def load(cls, folder: Path) -> Student:
        try:
            saved = json.loads((folder / CALIBRATION_FILE).read_text())
        except FileNotFoundError:
            raise StudentError(f"{folder} holds no trained student ({CALIBRATION_FILE} missing)") from None
        settings = StudentSettings(**saved["settings"])
        return cls(_cross_encoder(str(folder), settings.max_length), Calibrator(**saved["calibrator"]),
                   settings, TrainingReport(**saved["report"]))


def weights_hash(folder: Path) -> str:
    """sha256 (16 hex) of the saved weights: the student's identity in lineage and audits."""
    digest = hashlib.sha256()
    with open(folder / WEIGHTS_FILE, "rb") as weights:
        for block in iter(lambda: weights.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def calibrate(probabilities: Sequence[float], labels: Sequence[int]) -> tuple[Calibrator, str]:
    """Platt scaling of the encoder's P on held-out labels; the identity (and why) when they
    do not hold both classes."""
    if not labels:
        return IDENTITY, "identity (no held-out queries)"
    if len(set(labels)) < 2:
        return IDENTITY, "identity (held-out labels of one class only)"
    return fit_calibrator(probabilities, labels), "platt"


def untrainable(examples: Sequence[Example], settings: StudentSettings) -> str | None:
    """Why no student can learn from `examples` (None when one can)."""
    if not examples:
        return "no verified labels to learn from"
    if len({e.target for e in examples if e.target in (0.0, 1.0)}) < 2:
        return "it needs verified labels of both classes (relevant and not)"
    contrast = contrast_queries(examples)
    if not contrast:
        return ("no query has verified labels of both classes (a query labelled one way only "
                "teaches no contrast)")
    if not contrast - held_out_queries(examples, settings):
        return "no query left to train on after holding out the calibration queries"
    return None


def train_student(examples: Sequence[Example], settings: StudentSettings,
                  location: str | None = None, calibration_queries: Collection[str] | None = None) -> Student:
    """Train on `examples` (held-out queries apart), then calibrate on the held-out ones
    (`calibration_queries` where the split is fixed, else `calibration_share` of them drawn).
    Hard labels (0/1) of held-out queries fit the calibration; soft targets only train."""
    import time

    started = time.perf_counter()
    problem = untrainable(examples, settings)
    if problem:
        raise StudentError(f"the student cannot be trained: {problem}")
    hard = [e for e in examples if e.target in (0.0, 1.0)]
    parts = assign_splits(examples, settings, calibration_queries)
    train = [e for e, part in zip(examples, parts) if part == TRAIN]
    held = [e for e, part in zip(examples, parts) if part == CALIBRATION]
    encoder = train_encoder(train, settings, location or base_model_location(settings.base_model))
    precision = scoring_precision(settings.precision)
    raw = encoder_probabilities(encoder, [(e.query, e.chunk) for e in held], precision=precision)
    labels = [int(e.target) for e in held]
    calibrator, how = calibrate(raw, labels)
    before = calibration_metrics(labels, raw) if held else {}
    after = calibration_metrics(labels, [calibrator(p) for p in raw]) if held else {}
    sources: dict[str, int] = {}
    for e in examples:
        sources[e.source] = sources.get(e.source, 0) + 1
    report = TrainingReport(
        examples=len(examples), trained_on=len(train), calibrated_on=len(held),
        relevant=sum(1 for e in hard if e.target == 1.0), sources=sources, calibration=how,
        held_out={"before": before, "after": after}, seconds=round(time.perf_counter() - started, 1),
        precision=precision)
    return Student(encoder, calibrator, settings, report)
