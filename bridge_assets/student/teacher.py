"""The teacher's labels a general student learns from: DIRAS's GPT-4 Yes/No labels on 5,196
ASQA / QAMPARI / RAG-Bench (question, passage) pairs, under the `useful` definition
(resources/data/diras_general_qa, MIT), split by question (its split.json: test, calibration,
train; scripts/diras_split.py writes it).

    examples = teacher_examples("train")      # Example per pair: hard label, teacher's P(yes)

A pair's `target` is GPT-4's label (1 = Yes); its `teacher` is GPT-4's P(yes) from its stated
confidence c in that label (c for a Yes, 1 - c for a No), what a distilled student learns at
`teacher_weight` > 0. The query id is the question's SHA-256 (16 hex), so every pair of one
question shares it and the student's splits keep questions whole.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Literal

from bridge_assets.paths import PROJECT_ROOT
from bridge_assets.student.model import Example

TEACHER_FOLDER = PROJECT_ROOT / "resources" / "data" / "diras_general_qa"
TEACHER_DATA = TEACHER_FOLDER / "train.jsonl.gz"
SPLIT_FILE = TEACHER_FOLDER / "split.json"

Split = Literal["train", "calibration", "test"]


def question_id(question: str) -> str:
    return hashlib.sha256(question.encode("utf-8")).hexdigest()[:16]


def teacher_pairs(path: Path = TEACHER_DATA) -> Iterator[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                yield json.loads(line)


@cache
def split_questions(path: Path = SPLIT_FILE) -> dict[str, frozenset[str]]:
    """Each split's questions (texts), as split.json fixes them."""
    return {name: frozenset(questions) for name, questions in json.loads(path.read_text())["questions"].items()}


def teacher_example(pair: dict) -> Example:
    label = int(pair["teacher_label"])
    confidence = float(pair["teacher_confidence"])
    return Example(query_id=question_id(pair["query"]), query=pair["query"], chunk=pair["chunk"],
                   target=float(label), source=pair["dataset"],
                   teacher=confidence if label else 1.0 - confidence)


def teacher_examples(*splits: Split, path: Path = TEACHER_DATA, split_file: Path = SPLIT_FILE) -> list[Example]:
    """The pairs of the questions of `splits`, in the file's order."""
    questions = frozenset().union(*(split_questions(split_file)[name] for name in splits))
    return [teacher_example(pair) for pair in teacher_pairs(path) if pair["query"] in questions]
