"""Dataset loaders: real datasets' counts, every local format, and every kind of bad input."""

from __future__ import annotations

import gzip
import json
import time

import pytest

from bridge_assets.ingest.errors import DatasetError, SourceUnreachable
from bridge_assets.ingest.loaders import (load_beir_folder, load_bridge_release, load_dataset,
                                          load_nq_open, load_trec)
from bridge_assets.ingest.registry import DatasetSpec, get_dataset, load_registry
from conftest import PROJECT_ROOT, shared_data


def write_beir(folder, corpus=None, queries=None, qrels=None):
    corpus = corpus if corpus is not None else [
        {"_id": "d1", "title": "T1", "text": "Paris is the capital of France."},
        {"_id": "d2", "title": "T2", "text": "Berlin is the capital of Germany."},
    ]
    queries = queries if queries is not None else [
        {"_id": "q1", "text": "capital of france?", "answers": ["Paris"]},
        {"_id": "q2", "text": "capital of germany?", "answers": ["Berlin"]},
    ]
    qrels = qrels if qrels is not None else ["q1\td1\t1", "q2\td2\t1"]
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    (folder / "corpus.jsonl").write_text("".join(
        (line if isinstance(line, str) else json.dumps(line)) + "\n" for line in corpus))
    (folder / "queries.jsonl").write_text("".join(
        (line if isinstance(line, str) else json.dumps(line)) + "\n" for line in queries))
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(qrels) + "\n")
    return folder


def test_demo_dataset_ships_with_answers_and_one_judgment_per_query():
    tables = load_dataset(get_dataset("demo"))
    counts = tables.counts()
    assert 200 <= counts["documents"] <= 400
    assert 10 <= counts["queries"] <= 20
    assert counts["queries_with_answers"] == counts["queries"]
    assert counts["qrels"] == counts["queries"]
    judged = tables.qrels.join(tables.corpus, on="doc_id").join(
        tables.queries.rename({"text": "question"}), on="query_id")
    for row in judged.iter_rows(named=True):  # every gold answer occurs in its judged passage
        assert any(a.lower() in row["text"].lower() for a in row["answers"]), row["query_id"]


def test_nq_open_mini_counts():
    tables = load_nq_open(shared_data("nq_open_mini/nq-open-oracle.jsonl.gz"))
    assert tables.queries.height == 2655
    assert tables.counts()["queries_with_answers"] == 2655
    assert tables.qrels.height == 2655
    # identical gold passages are merged into one document, keeping every question's qrel
    assert tables.corpus.height == tables.qrels["doc_id"].n_unique()
    assert tables.corpus.height == 2599  # 56 passages are gold for several questions
    assert tables.corpus["doc_id"].is_unique().all()


def test_scifact_counts():
    tables = load_beir_folder(shared_data("scifact"), "test")
    assert (tables.corpus.height, tables.queries.height, tables.qrels.height) == (5183, 300, 339)


def test_registry_lists_the_shipped_datasets():
    registry = load_registry()
    assert {"demo", "nq_open_mini", "scifact"} <= set(registry)
    assert registry["nq_open_mini"].kind == "nq_open"


def test_beir_answers_from_a_separate_file(tmp_path):
    folder = write_beir(tmp_path / "b", queries=[{"_id": "q1", "text": "a?"}, {"_id": "q2", "text": "b?"}])
    (folder / "answers.jsonl").write_text('{"query_id": "q1", "answers": ["Paris"]}\n')
    tables = load_beir_folder(folder)
    assert tables.queries.filter(tables.queries["query_id"] == "q1")["answers"].to_list() == [["Paris"]]
    assert tables.queries.filter(tables.queries["query_id"] == "q2")["answers"].to_list() == [[]]


def test_trec_topics_and_qrels(tmp_path):
    (tmp_path / "docs.tsv").write_text("d1\tParis is in France\nd2\tBerlin is in Germany\n")
    (tmp_path / "topics.txt").write_text(
        "<top>\n<num> Number: 301\n<title> french capital\n<desc> ...\n</top>\n"
        "<top>\n<num> Number: 302\n<title> german capital\n</top>\n")
    (tmp_path / "qrels.txt").write_text("301 0 d1 1\n302 0 d2 2\n302 0 d1 0\n")
    tables = load_trec(tmp_path / "docs.tsv", tmp_path / "topics.txt", tmp_path / "qrels.txt", None)
    assert tables.queries["query_id"].to_list() == ["301", "302"]
    assert tables.queries["text"].to_list() == ["french capital", "german capital"]
    assert sorted(tables.qrels["relevance"].to_list()) == [0, 1, 2]


def test_bridge_release_layout(tmp_path):
    (tmp_path / "corpus.jsonl").write_text('{"_id": "c1", "text": "x"}\n{"_id": "c2", "text": "y"}\n')
    (tmp_path / "bridge.jsonl").write_text(
        '{"q_id": "7", "query": "what?", "doc_id": ["c1", "c2"], "answers": ["x"]}\n')
    tables = load_bridge_release(tmp_path / "bridge.jsonl", tmp_path / "corpus.jsonl")
    assert tables.qrels.height == 2 and tables.queries["answers"].to_list() == [["x"]]


@pytest.mark.parametrize("case, expected", [
    ("malformed_json", "corpus.jsonl, line 2: malformed JSON"),
    ("duplicate_id", 'corpus.jsonl, line 2, field "_id": duplicate id "d1" (first on line 1)'),
    ("unknown_doc", 'test.tsv, line 3, field "corpus-id": unknown document "d9"'),
    ("missing_file", "queries.jsonl: file not found"),
    ("empty_text", 'queries.jsonl, line 1, field "text": empty value'),
])
def test_bad_input_names_file_line_and_problem(tmp_path, case, expected):
    folder = tmp_path / "bad"
    if case == "malformed_json":
        write_beir(folder, corpus=[{"_id": "d1", "text": "x"}, '{"_id": "d2", "text": '])
    elif case == "duplicate_id":
        write_beir(folder, corpus=[{"_id": "d1", "text": "x"}, {"_id": "d1", "text": "y"}])
    elif case == "unknown_doc":
        write_beir(folder, qrels=["q1\td1\t1", "q2\td9\t1"])
    elif case == "missing_file":
        write_beir(folder)
        (folder / "queries.jsonl").unlink()
    elif case == "empty_text":
        write_beir(folder, queries=[{"_id": "q1", "text": "  "}])
    with pytest.raises(DatasetError) as error:
        load_beir_folder(folder)
    assert expected in str(error.value)
    assert str(folder) in str(error.value)


def test_unknown_dataset_name_lists_known_ones():
    with pytest.raises(DatasetError, match=r"unknown dataset 'nope' \(known: .*demo"):
        get_dataset("nope")


def test_nq_open_line_without_answers(tmp_path):
    path = tmp_path / "nq.jsonl.gz"
    with gzip.open(path, "wt") as handle:
        handle.write(json.dumps({"question": "q", "answers": ["a"], "ctxs": [
            {"title": "t", "text": "a", "isgold": True}]}) + "\n")
        handle.write(json.dumps({"question": "q2", "answers": [], "ctxs": []}) + "\n")
    with pytest.raises(DatasetError, match=r'line 2, field "answers": question without answers'):
        load_nq_open(path)


@pytest.mark.parametrize("spec", [
    DatasetSpec(name="hub", kind="huggingface", id="DISLab/BRIDGE"),
    DatasetSpec(name="zip", kind="beir_url",
                url="https://public.ukp.informatik.tu-darmstadt.de/thakur/BEIR/datasets/scifact.zip"),
    DatasetSpec(name="ird", kind="ir_datasets", id="beir/scifact/test"),
])
def test_remote_sources_fail_fast_when_unreachable(spec, data_lake, monkeypatch):
    monkeypatch.setenv("IR_DATASETS_HOME", str(data_lake / "ir_datasets"))
    started = time.monotonic()
    with pytest.raises(SourceUnreachable, match="unreachable"):
        load_dataset(spec)
    assert time.monotonic() - started < 30
