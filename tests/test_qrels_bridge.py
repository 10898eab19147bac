"""bridge_qrels: sources and their precedence, pending pairs, the asset and its checks, and the
exports read back by the project's own loaders (TREC, BEIR, BRIDGE release) and `datasets`,
over the labeled lake of tests/fixtures/labeled_lake.py.
"""

from __future__ import annotations

import json

import dagster as dg
import polars as pl
import pytest
from typer.testing import CliRunner

from bridge_assets.cli.qrels import app as qrels_app
from bridge_assets.ingest.loaders import load_beir_folder, load_bridge_release, read_trec_qrels
from bridge_assets.lake import store
from bridge_assets.lake.resource import DuckDBStore
from bridge_assets.qrels import assets as qrels_assets
from bridge_assets.qrels.merge import build_bridge_qrels
from fixtures.labeled_lake import (
    CORPUS,
    DATASET,
    EXPECTED,
    EXPECTED_LABELS,
    ORIGINAL,
    QUERIES,
    materialize_qrels,
    pair_key,
    read,
    write_labeled_lake,
)

# labeled_lake: test_lineage.py still imports the fixture from here
from fixtures.paths import annotations, lake_resources, location

# --- the merge -------------------------------------------------------------------------------------

def test_sources_follow_the_documented_precedence_and_pending_pairs_are_not_labels(labeled_lake):
    with qrels_assets.qrels_inputs(DuckDBStore(), DATASET) as con:  # what the asset reads
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
    assert rows[("q3", "d12")]["call_keys"] == ["filter-q3-d12"] and not rows[("q3", "d12")]["verified"]
    assert result.pending.select("query_id", "doc_id").rows() == [("q2", "d10")]
    counts = result.counts()
    assert (counts["pairs"], counts["relevant"], counts["holes_found"], counts["pending"]) == (13, 7, 3, 1)
    assert counts["pairs_filter"] == 2 and counts["unverified_adjudicator_irrelevant"] == 1
    assert result.missing_inputs == ()


def test_merge_works_before_the_labeling_stages_ran(data_lake):
    write_labeled_lake(data_lake)
    with store.connect(location()) as con:  # (the votes live in the votes store: not seen here)
        for table in ("debate_labels", "debate_turns", "human_labels", "filtered_pool", "filter_votes"):
            con.execute(f"drop table {table}")
        result = build_bridge_qrels(con, DATASET)
    assert result.qrels.select("query_id", "doc_id", "relevance").rows() == sorted(ORIGINAL)
    assert set(result.qrels["source"]) == {"original"} and result.pending.is_empty()
    assert set(result.missing_inputs) == {"debate_labels", "debate_turns", "human_labels",
                                          "filtered_pool", "filter_votes"}


def test_a_run_copies_the_votes_once_and_the_qrels_cite_the_votes_human_labels_counted(
        labeled_lake, tmp_path, monkeypatch):
    """The votes store is copied once per run (by human_labels); bridge_qrels cites the vote ids
    human_labels counted, from the lake; the staleness check and the sensor read the votes'
    version in place. In a run that reuses, current assets copy nothing."""
    from bridge_assets.definitions import defs
    from bridge_assets.human import votes_resource
    from bridge_assets.pipeline.staleness import ONLY_WHAT_CHANGED_TAG
    from fixtures.escalated_set import vote

    copies, versions = [], []
    copy_votes, votes_version = votes_resource.copy_votes, votes_resource.votes_version
    monkeypatch.setattr(votes_resource, "copy_votes", lambda *a, **k: (copies.append(1), copy_votes(*a, **k))[1])
    monkeypatch.setattr(votes_resource, "votes_version",
                        lambda *a, **k: (versions.append(1), votes_version(*a, **k))[1])
    job = defs.resolve_implicit_global_asset_job_def()

    def run() -> tuple[int, int, dict]:
        copies.clear(), versions.clear()
        result = job.execute_in_process(instance=instance, partition_key=DATASET,
                                        asset_selection=[dg.AssetKey("human_labels"), dg.AssetKey("bridge_qrels")],
                                        tags={ONLY_WHAT_CHANGED_TAG: "true"})
        assert result.success
        with store.connect(location()) as con:
            labels = dict(con.execute("select query_id || '/' || doc_id, vote_ids from human_labels").fetchall())
            cited = dict(con.execute("select query_id || '/' || doc_id, vote_ids from bridge_qrels "
                                     "where source = 'human'").fetchall())
        assert cited == labels  # the qrels cite exactly the votes each label counted
        return len(copies), len(versions), labels

    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        copied, _, labels = run()
        assert copied == 1 and len(labels["q3/d7"]) == 3  # the excluded vote and the attention check not counted
        assert run()[:2] == (0, 1)  # both current: the votes' version read in place, nothing copied
        with annotations() as con:
            for who in ("ann", "bob", "cat"):
                vote(con, ("q2", "d10"), who, 1)
        copied, read, labels = run()
        assert (copied, read) == (1, 1) and len(labels["q2/d10"]) == 3  # the new votes, copied once


def test_merge_reads_human_labels_written_before_they_listed_their_votes(labeled_lake):
    with store.connect(location()) as con:
        con.execute("alter table human_labels drop column vote_ids")  # human_labels code version 1
    with qrels_assets.qrels_inputs(DuckDBStore(), DATASET) as con:
        result = build_bridge_qrels(con, DATASET)
    human = result.qrels.filter(pl.col("source") == "human")
    assert human.height == 3 and human["vote_ids"].to_list() == [[], [], []]  # labels kept, no ids to cite


def test_merge_refuses_a_dataset_without_original_qrels(data_lake):
    write_labeled_lake(data_lake)
    with store.connect(location()) as con, pytest.raises(LookupError, match="dataset 'scifact': no original_qrels rows"):
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
    with store.connect(location()) as con:
        con.execute("insert into human_labels (dataset, query_id, doc_id, label) values ('demo', 'q2', 'd10', 1)")
    resolved = materialize_qrels(labeled_lake)
    assert {e.check_name: e.passed for e in resolved.get_asset_check_evaluations()}[
        "bridge_qrels_escalations_resolved"]
    metadata = resolved.asset_materializations_for_node("bridge_qrels")[0].metadata
    assert metadata["pending"].value == 0 and metadata["holes_found"].value == 4


def test_validity_check_catches_a_pair_outside_the_corpus(labeled_lake):
    materialize_qrels(labeled_lake)
    with store.connect(location()) as con:
        con.execute("insert into bridge_qrels (dataset, query_id, doc_id, relevance, source) "
                    "values ('demo', 'q1', 'ghost', 1, 'debate')")
    result = dg.materialize([qrels_assets.bridge_qrels_is_valid], resources=lake_resources(),
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
