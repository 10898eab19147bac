"""Gold sets and the labeler-evaluation registry: the shipped gold set, its build script,
and clear errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

from bridge_assets.evaluation.goldsets import GoldSetError, GoldTriplet, load_registry, read_goldset, stratified_head
from fixtures.paths import PROJECT_ROOT, shared_data

SHIPPED = PROJECT_ROOT / "resources" / "goldsets" / "nq_scifact_mini" / "goldset.jsonl"
HARD = PROJECT_ROOT / "resources" / "goldsets" / "nq_scifact_hard"


def line(**fields) -> str:
    record = {"id": "t1", "query": "q", "answers": ["a"], "chunk": "c", "label": 1}
    record.update(fields)
    return json.dumps({k: v for k, v in record.items() if v is not None})


def write(tmp_path, *lines: str):
    path = tmp_path / "gold.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_shipped_gold_set_is_balanced_with_one_positive_and_one_negative_per_query():
    triplets = read_goldset(SHIPPED)
    assert len(triplets) == 48
    assert Counter(t.label for t in triplets) == {1: 24, 0: 24}
    assert Counter(t.domain for t in triplets) == {"scifact": 24, "nq": 24}
    by_query = Counter((t.query, t.label) for t in triplets)
    assert set(by_query.values()) == {1} and len(by_query) == 48
    assert all(t.answers for t in triplets)


def test_the_registry_names_the_shipped_gold_set_and_valid_methods():
    registry = load_registry()
    assert registry.goldset("nq_scifact_mini").file == SHIPPED
    kinds = {spec.method for spec in registry.methods.values()}
    assert kinds == {"filter", "judge", "lara", "dream", "diras", "utilsel", "utilrank"}
    assert [s.name for s in registry.select_methods(["judge-0.5b", "dream-1.5b-r2"])] == ["judge-0.5b", "dream-1.5b-r2"]
    with pytest.raises(GoldSetError, match="unknown method"):
        registry.select_methods(["nope"])
    with pytest.raises(GoldSetError, match="unknown gold set 'nope'"):
        registry.goldset("nope")


def test_a_registry_entry_with_an_unknown_knob_names_the_entry(tmp_path):
    path = tmp_path / "goldsets.yaml"
    path.write_text("goldsets: {}\nmethods:\n  bad: {method: dream, round: 2}\n")
    with pytest.raises(GoldSetError, match="(?s)invalid methods entry 'bad'.*round"):
        load_registry(path)


def test_the_build_script_reproduces_the_shipped_file(tmp_path):
    shared_data("scifact")
    shared_data("nq_open_mini")
    out = tmp_path / "rebuilt.jsonl"
    subprocess.run([sys.executable, str(PROJECT_ROOT / "scripts" / "build_goldset.py"), "--out", str(out)],
                   check=True, capture_output=True, cwd=PROJECT_ROOT)
    assert out.read_bytes() == SHIPPED.read_bytes()


def test_the_hard_gold_set_is_balanced_read_and_holds_answer_string_negatives():
    triplets = read_goldset(HARD / "goldset.jsonl")
    records = [json.loads(raw) for raw in (HARD / "goldset.jsonl").read_text().splitlines()]
    assert len(triplets) >= 200 and Counter(t.label for t in triplets) == {1: 112, 0: 112}
    kinds = Counter((r["domain"], r["kind"], r["label"]) for r in records)
    assert kinds[("nq", "answer_string", 0)] >= 50  # passages that name an answer without giving it
    # the reading's verdicts are applied: relabelled triplets carry their note
    assert all(r["note"].startswith("relabelled") for r in records if r["kind"] == "answer_string" and r["label"])
    fewshot = read_goldset(HARD / "fewshot.jsonl")
    assert not {t.query for t in fewshot} & {t.query for t in triplets}
    assert load_registry().goldset("nq_scifact_hard").file == HARD / "goldset.jsonl"


def test_the_build_script_reproduces_the_hard_gold_set(tmp_path):
    shared_data("scifact")
    shared_data("nq_open_mini")
    subprocess.run([sys.executable, str(PROJECT_ROOT / "scripts" / "build_goldset.py"), "--goldset", "hard",
                    "--out-dir", str(tmp_path)], check=True, capture_output=True, cwd=PROJECT_ROOT)
    for name in ("goldset.jsonl", "fewshot.jsonl"):
        assert (tmp_path / name).read_bytes() == (HARD / name).read_bytes()


@pytest.mark.parametrize("bad, where", [
    (line(label=2), 'line 2, field "label": expected 0 or 1, got 2'),
    (line(label=True), 'field "label"'),
    (line(id="t0"), 'line 2, field "id": duplicate id \'t0\' (first on line 1)'),
    (line(id="t2", chunk=""), 'line 2, field "chunk": expected a non-empty string'),
    (line(id="t2", answers="a"), 'field "answers": expected a list'),
    (line(id="t2", score=1), "line 2: unknown field(s) ['score']"),
    ("{not json", "line 2: not valid JSON"),
])
def test_bad_gold_set_lines_are_named_by_file_line_and_field(tmp_path, bad, where):
    path = write(tmp_path, line(id="t0"), bad)
    with pytest.raises(GoldSetError) as error:
        read_goldset(path)
    assert str(path) in str(error.value) and where in str(error.value)


def test_missing_and_empty_gold_sets_fail_clearly(tmp_path):
    with pytest.raises(GoldSetError, match="gold set file not found"):
        read_goldset(tmp_path / "absent.jsonl")
    with pytest.raises(GoldSetError, match="holds no triplet"):
        read_goldset(write(tmp_path, ""))


def test_optional_fields_are_read(tmp_path):
    [triplet] = read_goldset(write(tmp_path, line(domain="nq", definition="exact year", answers=[])))
    assert (triplet.domain, triplet.definition, triplet.answers) == ("nq", "exact year", ())
    assert triplet.pair().query_id == triplet.pair().doc_id == "t1"


def test_stratified_head_alternates_classes_and_keeps_file_order():
    triplets = [GoldTriplet(f"t{i}", "q", (), "c", label) for i, label in enumerate([1, 1, 1, 0, 0, 1])]
    assert [t.id for t in stratified_head(triplets, 3)] == ["t0", "t1", "t3"]
    assert [t.id for t in stratified_head(triplets, 5)] == ["t0", "t1", "t2", "t3", "t4"]
    assert len(stratified_head(triplets, None)) == 6 and len(stratified_head(triplets, 99)) == 6
    only_relevant = [GoldTriplet(f"t{i}", "q", (), "c", 1) for i in range(3)]
    assert [t.id for t in stratified_head(only_relevant, 2)] == ["t0", "t1"]
