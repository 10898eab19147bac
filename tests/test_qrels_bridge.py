"""bridge_qrels: sources and their precedence, pending pairs, the asset and its checks, and the
exports read back by the project's own loaders (TREC, BEIR, BRIDGE release) and `datasets`.

Also home of the small labeled data lake the analysis, report and audit tests build on: three
retrieval systems on four queries, the real candidate pool and human_labels functions over
hand-written filter, debate and human tables in the stages' table contracts.
"""

from __future__ import annotations

import json

import dagster as dg
import polars as pl
import pytest
from typer.testing import CliRunner

from bridge_assets import store
from bridge_assets.human.labels import compute_human_labels
from bridge_assets.human.tables import ensure_schema
from bridge_assets.human.votes import insert_vote
from bridge_assets.ingest.loaders import load_beir_folder, load_bridge_release, read_trec_qrels
from bridge_assets.labeling.pooling import candidate_pool
from bridge_assets.llm import ledger
from bridge_assets.llm.types import LLMRequest, LLMResult
from bridge_assets.qrels import assets as qrels_assets
from bridge_assets.qrels.cli import app as qrels_app
from bridge_assets.qrels.merge import build_bridge_qrels
from bridge_assets.resources import DuckDBStore
from conftest import annotations

DATASET = "demo"
SHORT = "Short note."
LONG = "A long passage that goes on and on about the subject, with many details and asides. " * 3
CORPUS = {"d1": f"d1 {SHORT}", "d2": f"d2 {SHORT}", "d3": f"d3 {SHORT}", "d4": f"d4 {SHORT}",
          "d5": f"d5 {LONG}", "d6": "d6 medium length text about lambdas.",
          "d7": f"d7 {LONG}", "d8": f"d8 {LONG}", "d9": "d9 medium length text on loops.",
          "d10": "d10 medium length text on classes.", "d11": "d11 medium text on modules.",
          "d12": "d12 medium text on imports."}
QUERIES = {"q1": ("What does len() return?", ["the number of items"]),
           "q2": ("Which keyword defines a function?", ["def"]),
           "q3": ("What is the default recursion limit?", ["1000"]),
           "q4": ("What does zip() return?", ["an iterator of tuples"])}
ORIGINAL = [("q1", "d1", 1), ("q2", "d2", 1), ("q3", "d3", 1), ("q4", "d4", 1), ("q1", "d9", 0)]
RUNS = {
    "bm25": {"q1": ["d1", "d5", "d9", "d12", "d6"], "q2": ["d6", "d2", "d10", "d3", "d4"],
             "q3": ["d12", "d3", "d1", "d2", "d4"], "q4": ["d8", "d4", "d1", "d2", "d3"]},
    "dense": {"q1": ["d5", "d1", "d11", "d2", "d3"], "q2": ["d2", "d6", "d1", "d3", "d4"],
              "q3": ["d7", "d3", "d1", "d2", "d4"], "q4": ["d4", "d1", "d2", "d3", "d5"]},
    "splade": {"q1": ["d11", "d9", "d1", "d2", "d3"], "q2": ["d2", "d1", "d3", "d4", "d5"],
               "q3": ["d3", "d1", "d2", "d4", "d5"], "q4": ["d4", "d1", "d2", "d3", "d5"]},
}
# (query, doc): outcome, consensus label, adjudicator label
DEBATES = {("q1", "d5"): ("consensus", 1, None), ("q2", "d6"): ("consensus", 0, None),
           ("q3", "d7"): ("escalated", None, None), ("q4", "d8"): ("escalated", None, None),
           ("q2", "d10"): ("escalated", None, 0), ("q1", "d11"): ("failed", None, 1),
           ("q1", "d9"): ("consensus", 1, None)}  # an originally judged pair debated again
FILTER_DROPPED = [("q1", "d12"), ("q3", "d12")]
HUMAN_VOTES = {("q3", "d7"): {"alice": 1, "bob": 1, "carol": 0},
               ("q4", "d8"): {"alice": 1, "bob": 1, "carol": 1},
               ("q1", "d11"): {"alice": 0, "bob": 0, "carol": 0}}
# The refined qrels this lake must give: (query, doc) -> (relevance, source). The escalated
# pair nobody voted on (q2/d10) is pending, with no relevance: the adjudicator's guess on it
# is kept apart.
EXPECTED = {("q1", "d1"): (1, "original"), ("q2", "d2"): (1, "original"),
            ("q3", "d3"): (1, "original"), ("q4", "d4"): (1, "original"),
            ("q1", "d9"): (0, "original"), ("q1", "d5"): (1, "debate"), ("q2", "d6"): (0, "debate"),
            ("q3", "d7"): (1, "human"), ("q4", "d8"): (1, "human"), ("q1", "d11"): (0, "human"),
            ("q2", "d10"): (None, "pending"), ("q1", "d12"): (0, "filter"), ("q3", "d12"): (0, "filter")}
EXPECTED_LABELS = {pair: value for pair, value in EXPECTED.items() if value[1] != "pending"}
MODEL = "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF:q4_k_m"


def pair_key(query_id: str, doc_id: str) -> str:
    return f"pk-{query_id}-{doc_id}"


def turn_call(query_id: str, doc_id: str, round_: int, agent: str) -> LLMRequest:
    return LLMRequest(messages=(("system", "debate"), ("user", f"{query_id} {doc_id} round {round_} {agent}")),
                      purpose="debate")


def _frame(rows: list[dict], schema: dict) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=schema, orient="row")


def write_labeled_lake(lake) -> None:
    """The tables of every stage up to human_labels for dataset 'demo' (see the module doc)."""
    path = lake / "bridge.duckdb"
    corpus = pl.DataFrame({"dataset": DATASET, "doc_id": list(CORPUS), "title": "",
                           "text": list(CORPUS.values())})
    queries = pl.DataFrame({"dataset": DATASET, "query_id": list(QUERIES),
                            "text": [q for q, _ in QUERIES.values()],
                            "answers": [a for _, a in QUERIES.values()]})
    original = _frame([{"dataset": DATASET, "query_id": q, "doc_id": d, "relevance": r} for q, d, r in ORIGINAL],
                      {"dataset": pl.Utf8, "query_id": pl.Utf8, "doc_id": pl.Utf8, "relevance": pl.Int32})
    run = _frame([{"dataset": DATASET, "retriever": system, "query_id": q, "doc_id": d, "rank": rank,
                   "score": 10.0 - rank, "config_hash": f"cfg-{system}"}
                  for system, ranking in RUNS.items() for q, docs in ranking.items()
                  for rank, d in enumerate(docs, 1)],
                 {"dataset": pl.Utf8, "retriever": pl.Utf8, "query_id": pl.Utf8, "doc_id": pl.Utf8,
                  "rank": pl.Int32, "score": pl.Float64, "config_hash": pl.Utf8})
    store.write_partitions({"corpus": corpus, "queries": queries, "original_qrels": original}, {"dataset": DATASET}, path)
    for system in RUNS:
        store.write_partitions({"retrieval_run": run.filter(pl.col("retriever") == system)},
                               {"dataset": DATASET, "retriever": system}, path)
    with store.connect(path) as con:
        pool = candidate_pool(con, DATASET, depth=10)
    store.write_partitions({"candidate_pool": pool}, {"dataset": DATASET}, path)

    filtered = [*DEBATES, *FILTER_DROPPED]
    votes = _frame([{"dataset": DATASET, "query_id": q, "doc_id": d, "pair_key": pair_key(q, d),
                     "model": "qwen-0.5b", "is_supported": (q, d) not in FILTER_DROPPED,
                     "call_key": f"filter-{q}-{d}", "error": None} for q, d in filtered],
                   {"dataset": pl.Utf8, "query_id": pl.Utf8, "doc_id": pl.Utf8, "pair_key": pl.Utf8,
                    "model": pl.Utf8, "is_supported": pl.Boolean, "call_key": pl.Utf8, "error": pl.Utf8})
    kept = votes.select("dataset", "query_id", "doc_id", pl.col("is_supported").alias("kept"),
                        pl.col("is_supported").cast(pl.Int32).alias("votes_supported"),
                        pl.lit(1, pl.Int32).alias("votes_total"))
    labels, turns, calls = [], [], []
    for (q, d), (outcome, label, adjudicator) in DEBATES.items():
        rounds = 1 if outcome == "consensus" else 2
        labels.append({"dataset": DATASET, "query_id": q, "doc_id": d, "pair_key": pair_key(q, d),
                       "label": label, "outcome": outcome, "rounds_used": rounds, "config_hash": "debate-cfg",
                       "adjudicator_label": adjudicator,
                       "adjudicator_call_key": f"adjudicator-{q}-{d}" if adjudicator is not None else None})
        for round_ in range(1, rounds + 1):
            for agent, stance in (("A", "relevant"), ("B", "irrelevant")):
                failed = outcome == "failed" and round_ == 2 and agent == "B"
                agrees = outcome == "consensus"
                response = None if failed else ("yes" if label == 1 else "no") if agrees else \
                    ("yes" if agent == "A" else "no")
                request = turn_call(q, d, round_, agent)
                key = ledger.call_key("llama_cpp", MODEL, request)
                calls.append(ledger.CallRecord(request, LLMResult(
                    key=key, text="" if failed else json.dumps({"response": response}),
                    error="invalid JSON after 3 tries" if failed else None), 1))
                turns.append({"dataset": DATASET, "query_id": q, "doc_id": d, "pair_key": pair_key(q, d),
                              "round": round_, "agent": agent, "stance": stance, "model": "qwen-0.5b",
                              "reference": [] if failed else [f"quote from {d}"],
                              "reason": None if failed else f"agent {agent} on {q}/{d} round {round_}",
                              "response": response, "call_key": key,
                              "error": "invalid JSON after 3 tries" if failed else None})
    ledger.append(calls, profile="qwen-0.5b", backend="llama_cpp", model=MODEL, context="run-debate-1", path=path)
    store.write_partitions({
        "filter_votes": votes, "filtered_pool": kept,
        "debate_labels": _frame(labels, {
            "dataset": pl.Utf8, "query_id": pl.Utf8, "doc_id": pl.Utf8, "pair_key": pl.Utf8, "label": pl.Int32,
            "outcome": pl.Utf8, "rounds_used": pl.Int32, "config_hash": pl.Utf8, "adjudicator_label": pl.Int32,
            "adjudicator_call_key": pl.Utf8}),
        "debate_turns": _frame(turns, {
            "dataset": pl.Utf8, "query_id": pl.Utf8, "doc_id": pl.Utf8, "pair_key": pl.Utf8, "round": pl.Int32,
            "agent": pl.Utf8, "stance": pl.Utf8, "model": pl.Utf8, "reference": pl.List(pl.Utf8),
            "reason": pl.Utf8, "response": pl.Utf8, "call_key": pl.Utf8, "error": pl.Utf8}),
    }, {"dataset": DATASET}, path)
    with annotations(lake) as con:  # the votes store
        ensure_schema(con)
        for (q, d), ballots in HUMAN_VOTES.items():
            for annotator, label in ballots.items():
                insert_vote(con, dataset=DATASET, query_id=q, doc_id=d, annotator_id=annotator, label=label,
                            comment=None, with_history=annotator != "carol", is_attention_check=False,
                            expected_label=None, status="accepted", source="test")
        # an attention check and an excluded vote never count
        insert_vote(con, dataset=DATASET, query_id="q3", doc_id="d7", annotator_id="dave", label=0,
                    comment="check", with_history=True, is_attention_check=True, expected_label=1,
                    status="excluded", source="test")
        insert_vote(con, dataset=DATASET, query_id="q3", doc_id="d7", annotator_id="erin", label=0,
                    comment=None, with_history=False, is_attention_check=False, expected_label=None,
                    status="excluded", source="test")
        labels = compute_human_labels(con, DATASET).labels
    store.write_partitions({"human_labels": labels}, {"dataset": DATASET}, path)


@pytest.fixture
def labeled_lake(data_lake):
    write_labeled_lake(data_lake)
    return data_lake


def materialize_qrels(lake) -> dg.ExecuteInProcessResult:
    result = dg.materialize([qrels_assets.bridge_qrels, qrels_assets.bridge_qrels_is_valid,
                             qrels_assets.bridge_qrels_escalations_resolved],
                            partition_key=DATASET, resources={"store": DuckDBStore(data_lake=str(lake))})
    assert result.success
    return result


def read(lake, sql: str) -> pl.DataFrame:
    with store.connect(lake / "bridge.duckdb") as con:
        return con.execute(sql).pl()


# --- the merge -------------------------------------------------------------------------------------

def test_sources_follow_the_documented_precedence_and_pending_pairs_are_not_labels(labeled_lake):
    with qrels_assets.qrels_inputs(DuckDBStore(), DATASET) as con:  # what the asset reads, votes included
        result = build_bridge_qrels(con, DATASET)
    got = {(r["query_id"], r["doc_id"]): (r["relevance"], r["source"]) for r in result.qrels.iter_rows(named=True)}
    assert got == EXPECTED
    rows = {(r["query_id"], r["doc_id"]): r for r in result.qrels.iter_rows(named=True)}
    # original beats a later debate consensus; human beats the adjudicator
    assert rows[("q1", "d9")]["relevance"] == 0 and rows[("q1", "d11")]["source"] == "human"
    # provenance: debate turns' call keys, human vote ids (accepted, no attention check), adjudicator call
    assert rows[("q1", "d5")]["pair_key"] == pair_key("q1", "d5")
    assert rows[("q1", "d5")]["config_hash"] == "debate-cfg" and len(rows[("q1", "d5")]["call_keys"]) == 2
    with annotations() as con:
        counted = [r[0] for r in con.execute(
            "select vote_id from human_votes where query_id = 'q3' and doc_id = 'd7' and status = 'accepted' "
            "order by vote_id").fetchall()]
    assert rows[("q3", "d7")]["vote_ids"] == counted and len(counted) == 3
    # the adjudicator's guess is kept apart, never as the pair's relevance
    assert (rows[("q2", "d10")]["unverified_label"], rows[("q2", "d10")]["unverified_source"]) == (0, "adjudicator")
    assert rows[("q2", "d10")]["call_keys"][-1] == "adjudicator-q2-d10" and len(rows[("q2", "d10")]["call_keys"]) == 5
    assert [r for r in result.qrels.iter_rows(named=True) if r["unverified_label"] is not None] == [rows[("q2", "d10")]]
    # people beat the adjudicator's guess (q1/d11) and decide escalations (q4/d8)
    assert rows[("q1", "d11")]["unverified_label"] is None and rows[("q4", "d8")]["source"] == "human"
    assert rows[("q3", "d12")]["call_keys"] == ["filter-q3-d12"]
    assert result.pending.select("query_id", "doc_id").rows() == [("q2", "d10")]
    counts = result.counts()
    assert (counts["pairs"], counts["relevant"], counts["holes_found"], counts["pending"]) == (13, 7, 3, 1)
    assert counts["pairs_filter"] == 2 and counts["unverified_adjudicator_irrelevant"] == 1
    assert result.missing_inputs == ()


def test_merge_works_before_the_labeling_stages_ran(data_lake):
    write_labeled_lake(data_lake)
    with store.connect() as con:  # (the votes live in the votes store: not seen here)
        for table in ("debate_labels", "debate_turns", "human_labels", "filtered_pool", "filter_votes"):
            con.execute(f"drop table {table}")
        result = build_bridge_qrels(con, DATASET)
    assert result.qrels.select("query_id", "doc_id", "relevance").rows() == sorted(ORIGINAL)
    assert set(result.qrels["source"]) == {"original"} and result.pending.is_empty()
    assert set(result.missing_inputs) == {"debate_labels", "debate_turns", "human_labels", "human_votes",
                                          "filtered_pool", "filter_votes"}


def test_merge_refuses_a_dataset_without_original_qrels(data_lake):
    write_labeled_lake(data_lake)
    with store.connect() as con, pytest.raises(LookupError, match="dataset 'scifact': no original_qrels rows"):
        build_bridge_qrels(con, "scifact")


# --- the asset and its checks ----------------------------------------------------------------------

def test_asset_writes_the_table_the_trec_file_and_reports_pending_pairs(labeled_lake):
    result = materialize_qrels(labeled_lake)
    metadata = result.asset_materializations_for_node("bridge_qrels")[0].metadata
    assert metadata["pending"].value == 1 and metadata["holes_found"].value == 3
    assert metadata["pairs_human"].value == 3 and metadata["unverified_adjudicator_irrelevant"].value == 1
    assert "| q2 | d10 | adjudicator: 0 |" in metadata["pending_sample"].value
    assert metadata["precedence"].value == "original > human > debate > pending > filter"
    table = read(labeled_lake, "select query_id, doc_id, relevance, source from bridge_qrels")
    assert {(q, d): (r, s) for q, d, r, s in table.rows()} == EXPECTED
    trec = metadata["trec_qrels"].value
    assert trec == str(labeled_lake / "exports" / DATASET / "demo.bridge.qrels")
    checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert checks == {"bridge_qrels_is_valid": True, "bridge_qrels_escalations_resolved": False}
    # the adjudicator's guess did not resolve the pending pair; people's votes do
    with store.connect() as con:
        con.execute("insert into human_labels (dataset, query_id, doc_id, label) values ('demo', 'q2', 'd10', 1)")
    resolved = materialize_qrels(labeled_lake)
    assert {e.check_name: e.passed for e in resolved.get_asset_check_evaluations()}[
        "bridge_qrels_escalations_resolved"]
    metadata = resolved.asset_materializations_for_node("bridge_qrels")[0].metadata
    assert metadata["pending"].value == 0 and metadata["holes_found"].value == 4


def test_validity_check_catches_a_pair_outside_the_corpus(labeled_lake):
    materialize_qrels(labeled_lake)
    with store.connect() as con:
        con.execute("insert into bridge_qrels (dataset, query_id, doc_id, relevance, source) "
                    "values ('demo', 'q1', 'ghost', 1, 'debate')")
    result = dg.materialize([qrels_assets.bridge_qrels_is_valid], resources={"store": DuckDBStore()},
                            selection=dg.AssetSelection.checks(qrels_assets.bridge_qrels_is_valid))
    evaluation = result.get_asset_check_evaluations()[0]
    assert not evaluation.passed
    assert any("doc_known" in name for name in evaluation.metadata)


# --- exports ---------------------------------------------------------------------------------------

def expected_frame() -> pl.DataFrame:
    """The exported labels: pending pairs are not labels."""
    return pl.DataFrame([(q, d, r) for (q, d), (r, _) in sorted(EXPECTED_LABELS.items())],
                        schema={"query_id": pl.Utf8, "doc_id": pl.Utf8, "relevance": pl.Int32}, orient="row")


def test_trec_export_reads_back_with_the_trec_loader(labeled_lake, tmp_path):
    materialize_qrels(labeled_lake)
    out = tmp_path / "refined.qrels"
    result = CliRunner().invoke(qrels_app, ["export", "-d", DATASET, "-f", "trec", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == str(out)
    qrels, _ = read_trec_qrels(out)
    assert qrels.sort("query_id", "doc_id").equals(expected_frame())
    assert out.read_text().splitlines()[0] == "q1 0 d1 1"
    # the asset wrote the same file
    asset_copy, _ = read_trec_qrels(labeled_lake / "exports" / DATASET / "demo.bridge.qrels")
    assert asset_copy.sort("query_id", "doc_id").equals(expected_frame())


def test_beir_and_bridge_release_exports_load_as_datasets(labeled_lake, tmp_path):
    materialize_qrels(labeled_lake)
    runner = CliRunner()
    for fmt in ("beir", "bridge"):
        result = runner.invoke(qrels_app, ["export", "-d", DATASET, "-f", fmt, "-o", str(tmp_path / fmt)])
        assert result.exit_code == 0, result.output
    beir = load_beir_folder(tmp_path / "beir")
    assert beir.qrels.sort("query_id", "doc_id").equals(expected_frame())
    assert beir.corpus.height == len(CORPUS)
    assert dict(zip(beir.queries["query_id"], beir.queries["answers"].to_list())) == \
        {q: a for q, (_, a) in QUERIES.items()}
    release = load_bridge_release(tmp_path / "bridge" / "queries.jsonl", tmp_path / "bridge" / "corpus.jsonl")
    relevant = expected_frame().filter(pl.col("relevance") > 0)
    assert release.qrels.sort("query_id", "doc_id").equals(relevant.sort("query_id", "doc_id"))
    first = json.loads((tmp_path / "bridge" / "queries.jsonl").read_text().splitlines()[0])
    assert first == {"q_id": "q1", "query": "What does len() return?", "doc_id": ["d1", "d5"],
                     "answers": ["the number of items"]}


def test_hugging_face_export_loads_with_datasets(labeled_lake, tmp_path):
    datasets = pytest.importorskip("datasets")
    materialize_qrels(labeled_lake)
    result = CliRunner().invoke(qrels_app, ["export", "-d", DATASET, "-f", "hf", "-o", str(tmp_path / "hf")])
    assert result.exit_code == 0, result.output
    loaded = datasets.load_from_disk(str(tmp_path / "hf"))
    assert set(loaded) == {"qrels", "queries", "corpus"}
    qrels = pl.from_arrow(loaded["qrels"].data.table)
    assert {(q, d): (r, s) for q, d, r, s in qrels.select("query_id", "doc_id", "relevance", "source").rows()} \
        == EXPECTED_LABELS
    assert loaded["corpus"].num_rows == len(CORPUS)


def test_export_names_what_is_missing(data_lake, tmp_path):
    write_labeled_lake(data_lake)
    result = CliRunner().invoke(qrels_app, ["export", "-d", DATASET, "-o", str(tmp_path / "x.qrels")])
    assert result.exit_code == 2
    assert "bridge_qrels does not exist yet" in result.output
