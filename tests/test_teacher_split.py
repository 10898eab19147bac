"""The DIRAS teacher data's fixed by-question split, the silver gold set drawn from its test
questions, and the read SciFact claims gold set: splits disjoint by question, silver labels equal
to the teacher's, both gold sets readable by the loader and registered, and the files on disk
what their build scripts write."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections import Counter
from functools import lru_cache

import pytest

from bridge_assets.evaluation.goldsets import load_registry, read_goldset
from fixtures.paths import PROJECT_ROOT, shared_data

DATA = PROJECT_ROOT / "resources" / "data" / "diras_general_qa"
SILVER = PROJECT_ROOT / "resources" / "goldsets" / "diras_silver" / "goldset.jsonl"
SCIFACT = PROJECT_ROOT / "resources" / "goldsets" / "scifact_claims" / "goldset.jsonl"


@lru_cache(maxsize=1)
def teacher() -> dict[str, dict]:
    with gzip.open(DATA / "train.jsonl.gz", "rt", encoding="utf-8") as handle:
        return {row["id"]: row for row in map(json.loads, handle)}


@lru_cache(maxsize=1)
def split() -> dict:
    return json.loads((DATA / "split.json").read_text(encoding="utf-8"))


def test_the_split_is_by_question_disjoint_and_covers_every_question():
    questions = {name: set(qs) for name, qs in split()["questions"].items()}
    assert set(questions) == {"test", "calibration", "train"}
    assert not questions["test"] & questions["train"]
    assert not questions["calibration"] & questions["train"]
    assert not questions["test"] & questions["calibration"]
    every = {row["query"] for row in teacher().values()}
    assert len(every) == 499
    assert questions["test"] | questions["calibration"] | questions["train"] == every
    assert [len(questions[n]) for n in ("test", "calibration", "train")] == [50, 50, 399]
    counts = split()["counts"]
    pairs = Counter(name for row in teacher().values() for name, qs in questions.items() if row["query"] in qs)
    assert {n: counts[n]["pairs"] for n in questions} == dict(pairs)
    assert sum(pairs.values()) == len(teacher()) == 5196


def test_the_silver_gold_set_holds_test_questions_with_the_teachers_labels():
    test_questions = set(split()["questions"]["test"])
    triplets = read_goldset(SILVER)
    assert len(triplets) == 200
    assert Counter(t.label for t in triplets) == {1: 100, 0: 100}
    for t in triplets:
        row = teacher()[t.id]
        assert t.query == row["query"] and t.query in test_questions
        assert t.chunk == row["chunk"]
        assert t.label == row["teacher_label"]
        assert t.domain == row["dataset"]
        assert t.answers == ()
    assert [t.id for t in triplets] == sorted((t.id for t in triplets),
                                              key=lambda i: (i.rpartition("-")[0], int(i.rpartition("-")[2])))


def test_thresholds_are_chosen_on_calibration_questions_only():
    calibration_questions = set(split()["questions"]["calibration"])
    triplets = read_goldset(SILVER.with_name("calibration.jsonl"))
    assert len(triplets) == 100 and Counter(t.label for t in triplets) == {1: 50, 0: 50}
    assert all(t.query in calibration_questions and t.label == teacher()[t.id]["teacher_label"] for t in triplets)


def test_the_scifact_claims_gold_set_pairs_each_claim_with_its_gold_abstract_and_one_negative():
    triplets = read_goldset(SCIFACT)
    assert len(triplets) == 40
    assert Counter(t.label for t in triplets) == {1: 20, 0: 20}
    assert Counter((t.query, t.label) for t in triplets) == {(q, label): 1 for q in {t.query for t in triplets}
                                                             for label in (0, 1)}
    assert all(t.domain == "scifact" and t.answers == () for t in triplets)
    records = [json.loads(line) for line in SCIFACT.read_text(encoding="utf-8").splitlines()]
    assert {(r["kind"], r["label"]) for r in records} == {("gold", 1), ("bm25_negative", 0)}
    assert all(r["note"].strip() for r in records)


def test_both_gold_sets_are_registered():
    registry = load_registry()
    assert registry.goldset("diras_silver").file == SILVER
    assert registry.goldset("scifact_claims").file == SCIFACT


def test_the_split_and_silver_set_are_what_the_script_writes():
    result = subprocess.run([sys.executable, str(PROJECT_ROOT / "scripts" / "diras_split.py"), "--check"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_the_scifact_claims_set_is_what_its_build_writes():
    folder = shared_data("scifact")
    result = subprocess.run([sys.executable, str(PROJECT_ROOT / "scripts" / "build_scifact_claims.py"),
                             "--check", "--scifact", str(folder)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("stale", ["split.json", "goldset.jsonl", "calibration.jsonl"])
def test_the_check_fails_when_a_file_differs(tmp_path, stale, monkeypatch):
    """--check compares bytes: a file that differs (here one line changed) fails it."""
    sys.path.insert(0, str(PROJECT_ROOT / "scripts"))
    try:
        import diras_split
    finally:
        sys.path.pop(0)
    names = {diras_split.SPLIT: "SPLIT", diras_split.GOLDSET: "GOLDSET", diras_split.CALIBRATION: "CALIBRATION"}
    for path, text in diras_split.render().items():
        copy = tmp_path / path.name
        copy.write_text(text.replace("\n", "\n ", 1) if path.name == stale else text, encoding="utf-8")
        monkeypatch.setattr(diras_split, names[path], copy)
    monkeypatch.setattr(diras_split, "ROOT", tmp_path)
    monkeypatch.setattr(sys, "argv", ["diras_split.py", "--check"])
    assert diras_split.main() == 1


def test_the_students_teacher_examples_keep_the_split_and_the_teachers_confidence():
    from bridge_assets.student.model import CALIBRATION, TRAIN, Example, StudentSettings, assign_splits
    from bridge_assets.student.teacher import question_id, teacher_examples

    train, calibration, test = (teacher_examples(name) for name in ("train", "calibration", "test"))
    assert [len(train), len(calibration), len(test)] == [split()["counts"][n]["pairs"]
                                                         for n in ("train", "calibration", "test")]
    # a question's pairs share its id, and no id is on two sides
    ids = [{e.query_id for e in part} for part in (train, calibration, test)]
    assert [len(i) for i in ids] == [399, 50, 50] and not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])
    rows = list(teacher().values())
    first = next(row for row in rows if row["query"] in split()["questions"]["train"])
    example = train[0]
    assert (example.query, example.chunk, example.target) == (first["query"], first["chunk"], first["teacher_label"])
    assert example.query_id == question_id(first["query"]) and example.source == first["dataset"]
    # P(yes) from GPT-4's stated confidence in its own answer
    no = next(e for e in train if e.target == 0.0)
    row = next(r for r in rows if r["chunk"] == no.chunk and r["query"] == no.query)
    assert no.teacher == pytest.approx(1 - row["teacher_confidence"])
    assert all(e.teacher >= 0.5 for e in train if e.target == 1.0)

    # the student calibrates on the calibration questions given, never on a training one
    parts = assign_splits(train + calibration, StudentSettings(max_labels=10_000),
                          calibration_queries=ids[1])
    held = {e.query_id for e, part in zip(train + calibration, parts) if part == CALIBRATION}
    trained = {e.query_id for e, part in zip(train + calibration, parts) if part == TRAIN}
    assert held and held <= ids[1] and trained <= ids[0] and not held & trained
    assert isinstance(example, Example)
