"""The student annotator of one dataset, from the lake: what it learns from, where its trained
model lives, and the scores it gives the candidate pool. Plain functions (no Dagster): the
assets in assets.py wire them.

A student is stored once per key, `<data lake>/students/<dataset>/<key>/` (the folder holds
the encoder, calibration.json and meta.json), where the key hashes its training set (the
verified labels, sql/student_training_set.sql), its settings and its base encoder (its
retrievers.yaml entry and source, not the folder it lies in): unchanged labels find the trained
student again, changed ones train a new one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from bridge_assets.labeling.pairs import Pair, load_pairs
from bridge_assets.paths import read_sql
from bridge_assets.retrieval.cache import ensure_built, read_meta
from bridge_assets.student.model import (
    Example,
    Student,
    StudentSettings,
    assign_splits,
    held_out_queries,
    resolve_base_model,
    train_student,
    weights_hash,
)

SCORE_BATCH = 64


@dataclass(frozen=True)
class TrainingSet:
    """The verified labels of a dataset, with their texts (and, to distil, the teacher's P(yes))."""

    labels: pl.DataFrame   # query_id, doc_id, label, source[, teacher]
    pairs: list[Pair]      # the same rows' texts, in the same order

    @property
    def version(self) -> str:
        """Changes exactly when a label, its source, a text it reads or a teacher's P(yes) does
        (the last only where it was read: a student that distils nothing keeps its version)."""
        digest = hashlib.sha256()
        for row, pair in zip(self.labels.iter_rows(), self.pairs, strict=True):
            digest.update(json.dumps([*row, pair.query, pair.chunk]).encode())
        return digest.hexdigest()[:16]

    def without_queries(self, queries: set[str]) -> TrainingSet:
        """The labels of every other query (a fold's training set)."""
        keep = [pair.query_id not in queries for pair in self.pairs]
        return TrainingSet(self.labels.filter(pl.Series(keep, dtype=pl.Boolean)),
                           [pair for pair, kept in zip(self.pairs, keep) if kept])

    def examples(self) -> list[Example]:
        return [Example(pair.query_id, pair.query, pair.chunk, float(row["label"]), row["source"],
                        row.get("teacher"))
                for row, pair in zip(self.labels.iter_rows(named=True), self.pairs, strict=True)]


def training_set(con: duckdb.DuckDBPyConnection, dataset: str, *, teacher: bool = False) -> TrainingSet:
    """The verified labels of `dataset` in `con` (bridge_qrels, queries, corpus; with `teacher`,
    debate_labels too: each label's teacher P(yes) where the debate gave one)."""
    labels = con.execute(read_sql("student_training_set"), {"dataset": dataset}).pl()
    if teacher:
        scores = con.execute(read_sql("student_teacher_scores"), {"dataset": dataset}).pl()
        labels = labels.join(scores, on=["query_id", "doc_id"], how="left", maintain_order="left")
    pairs = load_pairs(con, dataset, "select query_id, doc_id from bridge_qrels where dataset = $dataset "
                       "and verified and relevance is not null")
    return TrainingSet(labels, pairs)


def student_folder(lake_folder: Path, dataset: str, key: str) -> Path:
    return lake_folder / "students" / dataset / key


def student_key(version: str, settings: StudentSettings, base: dict) -> str:
    """Its training set's version, its settings and what the encoder it starts from is (not
    where it lies: a lake moved to another environment finds its students again)."""
    # low_memory trains the same weights: never part of the key. Distillation's weight counts
    # only once it is set: students trained before it existed (weight 0) keep their keys
    dumped = settings.model_dump(exclude={"low_memory"} | (set() if settings.teacher_weight else {"teacher_weight"}))
    config = {"training_set": version, "settings": dumped, "base": base}
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class StoredStudent:
    key: str
    folder: Path
    meta: dict[str, Any]
    trained_now: bool

    def load(self) -> Student:
        return Student.load(self.folder)


def ensure_student(lake_folder: Path, dataset: str, data: TrainingSet,
                   settings: StudentSettings) -> StoredStudent:
    """The student of `data` under `settings`: found again when one was trained on the same
    labels, else trained now (under a file lock; a half-trained folder is never read)."""
    base = resolve_base_model(settings.base_model)
    key = student_key(data.version, settings, base.identity)

    def build(folder: Path) -> dict[str, Any]:
        student = train_student(data.examples(), settings, base.location)
        student.save(folder)
        return {"weights_hash": weights_hash(folder), "training_set": data.version,
                "report": asdict(student.report), "settings": settings.model_dump()}

    folder, built_now = ensure_built(student_folder(lake_folder, dataset, key), build)
    return StoredStudent(key, folder, read_meta(folder), built_now)


def calibration_queries(data: TrainingSet, settings: StudentSettings) -> list[str]:
    """The queries the training held out whole to calibrate on (sorted)."""
    return sorted(held_out_queries(data.examples(), settings))


def splits(data: TrainingSet, settings: StudentSettings) -> list[str]:
    """Each label's part in the training (model.assign_splits), for the audit table."""
    return assign_splits(data.examples(), settings)


def score_pairs(student: Student, pairs: Sequence[Pair]) -> list[float]:
    """Calibrated P(relevant) of each pair."""
    return student.score([(pair.query, pair.chunk) for pair in pairs], batch_size=SCORE_BATCH)
