"""The metrics against pytrec_eval and ranx on generated runs (to 1e-9), and the pipeline's API:
many datasets and systems in one query, rank-only runs, holes, -c/-M, refusals."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import duckdb
import numpy as np
import polars as pl
import pytest
import pytrec_eval

from bridge_assets.metrics import MeasureError, compute_measures, compute_retrieval_metrics, resolve_measures

CUTOFFS = "1,3,5,10,20,100"
PYTREC_MEASURES = {f"P.{CUTOFFS}", f"recall.{CUTOFFS}", f"ndcg_cut.{CUTOFFS}", f"map_cut.{CUTOFFS}",
                   f"success.{CUTOFFS}", "map", "Rprec", "bpref", "recip_rank", "ndcg", "num_ret",
                   "num_rel", "num_rel_ret", "num_nonrel_judged_ret", "gm_map"}


def generate(seed: int, *, ties: bool, edge_cases: bool, n_queries: int = 120, n_docs: int = 300):
    """(qrels, run) as pytrec_eval's nested dicts: graded judgments and random scores.

    edge_cases: -1 judgments ("in the pool, unjudged"), queries with no relevant document,
    queries only in the run, queries only in the qrels. ties: scores rounded to 0.1.
    Without edge cases every query has a relevant and a judged non-relevant document."""
    rng = np.random.default_rng(seed)
    grades = [-1, 0, 0, 0, 1, 1, 2, 3] if edge_cases else [0, 0, 1, 1, 2, 3]
    qrels: dict[str, dict[str, int]] = {}
    run: dict[str, dict[str, float]] = {}
    for q in range(n_queries):
        qid = f"q{q}"
        if not (edge_cases and q % 10 == 9):
            judged = rng.choice(n_docs, size=rng.integers(2, 40), replace=False)
            rels = rng.choice(grades, size=len(judged))
            if edge_cases and q % 7 == 0:
                rels[:] = 0
            elif not edge_cases:
                rels[0], rels[1] = 0, rng.integers(1, 4)
            qrels[qid] = {f"d{d}": int(r) for d, r in zip(judged, rels)}
        if not (edge_cases and q % 13 == 12):
            retrieved = rng.choice(n_docs, size=rng.integers(1, 60), replace=False)
            scores = np.round(rng.random(len(retrieved)), 1) if ties else rng.random(len(retrieved))
            run[qid] = {f"d{d}": float(s) for d, s in zip(retrieved, scores)}
    return qrels, run


def frames(qrels, run) -> tuple[pl.DataFrame, pl.DataFrame]:
    qrels_frame = pl.DataFrame([(q, d, r) for q, docs in qrels.items() for d, r in docs.items()],
                               schema=["query_id", "doc_id", "relevance"], orient="row")
    run_frame = pl.DataFrame([(q, d, s) for q, docs in run.items() for d, s in docs.items()],
                             schema=["query_id", "doc_id", "score"], orient="row")
    return qrels_frame, run_frame


def ours(qrels, run, measures, **options) -> dict[tuple[str, str], float]:
    qrels_frame, run_frame = frames(qrels, run)
    con = duckdb.connect()
    con.register("test_run", run_frame)
    con.register("test_qrels", qrels_frame)
    frame = compute_measures(con, resolve_measures(measures), run="test_run", qrels="test_qrels",
                             **options)
    return {(q, m): v for q, m, v in frame.select("query_id", "measure", "value").iter_rows()}


@pytest.mark.parametrize("relevance_level", [1, 2])
@pytest.mark.parametrize("seed", [1, 2])
def test_equal_to_pytrec_eval_with_ties_and_edge_cases(seed, relevance_level):
    qrels, run = generate(seed, ties=True, edge_cases=True)
    reference = pytrec_eval.RelevanceEvaluator(qrels, PYTREC_MEASURES,
                                               relevance_level=relevance_level).evaluate(run)
    got = ours(qrels, run, [*PYTREC_MEASURES, "num_q"],  # trec_eval syntax: P.1,3,5,...
               relevance_level=relevance_level)
    evaluated = {q for q, _ in got} - {"all"}
    assert evaluated == set(reference)  # queries in both; those without relevant ones included
    assert any(all(r < relevance_level for r in qrels[q].values()) for q in evaluated)
    compared = 0
    for query_id, values in reference.items():
        for name, value in values.items():
            if name != "gm_map":  # pytrec_eval's per-query gm_map is log(AP); ours is summary-only
                assert got[query_id, name] == pytest.approx(value, abs=1e-9), (query_id, name)
                compared += 1
    assert compared > 3000
    for name in ("map", "P_10", "ndcg_cut_10", "recall_100", "bpref"):
        mean = pytrec_eval.compute_aggregated_measure(name, [v[name] for v in reference.values()])
        assert got["all", name] == pytest.approx(mean, abs=1e-9)
    for name in ("num_ret", "num_rel_ret"):
        assert got["all", name] == sum(v[name] for v in reference.values())
    gm_map = pytrec_eval.compute_aggregated_measure("gm_map", [v["gm_map"] for v in reference.values()])
    assert got["all", "gm_map"] == pytest.approx(gm_map, rel=1e-9)
    assert got["all", "num_q"] == len(reference)


@pytest.mark.parametrize("layout, reads", [("trec_order", 1), ("ties_ascending", 1), ("shuffled", 2)])
def test_the_run_s_row_order_does_not_matter(layout, reads, monkeypatch):
    """The run read as stored (already in trec_eval's order: nothing sorted), with tied
    documents stored in ascending doc id order (as BRIDGE's own runs keep them: statement 1
    hands over the doc ids, and only the tied rows of those rankings are re-sorted), and with its rows
    scattered over the table (read a second time with every id, statement 2, and the rankings
    regrouped by their ids) give the same values as pytrec_eval."""
    from bridge_assets.metrics import measures

    qrels, run = generate(3, ties=True, edge_cases=True)
    reference = pytrec_eval.RelevanceEvaluator(qrels, PYTREC_MEASURES).evaluate(run)
    qrels_frame, run_frame = frames(qrels, run)
    if layout == "trec_order":
        run_frame = run_frame.sort(["query_id", "score", "doc_id"], descending=[False, True, True])
    elif layout == "ties_ascending":
        run_frame = run_frame.sort(["query_id", "score", "doc_id"], descending=[False, True, False])
        tie_out_of_order = ((pl.col("query_id") == pl.col("query_id").shift())
                            & (pl.col("score") == pl.col("score").shift())
                            & (pl.col("doc_id") > pl.col("doc_id").shift()))
        assert run_frame.select(tie_out_of_order).to_series().any()  # the layout needs the fix
    else:
        run_frame = run_frame.sample(fraction=1.0, shuffle=True, seed=5)
    second_reads = []
    in_trec_order = measures._in_trec_order
    monkeypatch.setattr(measures, "_in_trec_order",
                        lambda *args: second_reads.append(args) or in_trec_order(*args))
    con = duckdb.connect()
    con.register("test_run", run_frame)
    con.register("test_qrels", qrels_frame)
    frame = compute_measures(con, resolve_measures(list(PYTREC_MEASURES)), run="test_run",
                             qrels="test_qrels")
    assert 1 + len(second_reads) == reads
    got = {(q, m): v for q, m, v in frame.select("query_id", "measure", "value").iter_rows()}
    for query_id, values in reference.items():
        for name, value in values.items():
            if name != "gm_map":
                assert got[query_id, name] == pytest.approx(value, abs=1e-9), (layout, query_id, name)


def trec_eval_iprec(qrels, run, level: float, relevance_level: int = 1) -> dict[str, float]:
    """iprec_at_recall as current trec_eval computes it (m_iprec_at_recall.c): the c-th relevant
    document with c = lround(level * R). pytrec_eval-terrier 0.5.x bundles an older trec_eval
    that used (long)(level * R + 0.9), hence this reference implementation."""
    out = {}
    for qid in set(qrels) & set(run):
        by_doc_desc = sorted(run[qid].items(), key=lambda item: item[0].encode(), reverse=True)
        ranking = sorted(by_doc_desc, key=lambda item: -item[1])  # stable: ties stay doc-desc
        relevant = sum(1 for r in qrels[qid].values() if r >= relevance_level)
        cutoff = math.floor(level * relevant + 0.5)
        precisions, found = [], 0
        for rank, (doc, _) in enumerate(ranking, start=1):
            if qrels[qid].get(doc, -1) >= relevance_level:
                found += 1
                precisions.append(found / rank)
        out[qid] = max(precisions[max(cutoff, 1) - 1:], default=0.0) if cutoff <= found else 0.0
    return out


def test_iprec_at_recall_follows_current_trec_eval():
    qrels, run = generate(3, ties=True, edge_cases=True)
    got = ours(qrels, run, ["iprec_at_recall.0,0.1,0.25,0.5,0.75,1"])
    for level in (0.0, 0.1, 0.25, 0.5, 0.75, 1.0):
        for query_id, value in trec_eval_iprec(qrels, run, level).items():
            assert got[query_id, f"iprec_at_recall_{level:.2f}"] == pytest.approx(value, abs=1e-12)


RANX = {"map": "map", "ndcg": "ndcg", "recip_rank": "mrr", "Rprec": "r-precision", "bpref": "bpref",
        "num_rel_ret": "hits"}
for _k in (1, 5, 10, 20):
    RANX.update({f"P_{_k}": f"precision@{_k}", f"recall_{_k}": f"recall@{_k}",
                 f"ndcg_cut_{_k}": f"ndcg@{_k}", f"map_cut_{_k}": f"map@{_k}",
                 f"success_{_k}": f"hit_rate@{_k}", f"recip_rank_cut_{_k}": f"mrr@{_k}"})


RANX_SCRIPT = """
import json, sys, warnings
from ranx import Qrels, Run, evaluate
qrels, run, metrics = json.load(sys.stdin)
ranx_run = Run(run)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # numba's type-safety notes
    evaluate(Qrels(qrels), ranx_run, metrics)
json.dump({"scores": ranx_run.scores, "mean_scores": ranx_run.mean_scores}, sys.stdout)
"""


def ranx_values(qrels, run, metrics: list[str]) -> dict:
    """ranx's per-query and mean values, its functions run as plain Python (NUMBA_DISABLE_JIT):
    the same definitions, without the 30-60 s of compiling them that every fresh venv paid here
    (3 s instead); in a subprocess, so no other test's numba is affected. The compiled ranx is
    compared on the paper's scale by scripts/bench_metrics.py."""
    done = subprocess.run([sys.executable, "-c", RANX_SCRIPT], input=json.dumps([qrels, run, metrics]),
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NUMBA_DISABLE_JIT": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_equal_to_ranx_without_ties():
    """ranx breaks score ties in no defined order and needs the same queries in run and qrels;
    its bpref divides by min(R, N), so every query here has relevant and non-relevant ones."""
    qrels, run = generate(4, ties=False, edge_cases=False)
    got = ours(qrels, run, list(RANX))
    ranx = ranx_values(qrels, run, list(RANX.values()))
    compared = 0
    for name, ranx_name in RANX.items():
        for query_id, value in ranx["scores"][ranx_name].items():
            assert got[query_id, name] == pytest.approx(value, abs=1e-9), (query_id, name)
            compared += 1
        queries = len(ranx["scores"][ranx_name]) if name == "num_rel_ret" else 1  # a sum in trec_eval
        assert got["all", name] == pytest.approx(ranx["mean_scores"][ranx_name] * queries, abs=1e-9)
    assert compared == len(RANX) * len(run)


# --- the pipeline's API ---------------------------------------------------------------------------

def pipeline_tables(con: duckdb.DuckDBPyConnection) -> None:
    """Two datasets, two retrievers each, as the pipeline stores them (rank and score)."""
    run_rows, qrels_rows = [], []
    for dataset, seed in (("alpha", 5), ("beta", 6)):
        qrels, _ = generate(seed, ties=True, edge_cases=True, n_queries=30)
        qrels_rows += [(dataset, q, d, r) for q, docs in qrels.items() for d, r in docs.items()]
        for retriever, run_seed in (("bm25", seed * 10), ("dense", seed * 10 + 1)):
            _, run = generate(run_seed, ties=True, edge_cases=True, n_queries=30)
            for q, docs in run.items():
                ordered = sorted(docs.items(), key=lambda item: (-item[1], item[0]))
                run_rows += [(dataset, retriever, q, d, rank, s)
                             for rank, (d, s) in enumerate(ordered, start=1)]
    con.execute("create table retrieval_run (dataset varchar, retriever varchar, query_id varchar, "
                "doc_id varchar, rank integer, score double)")
    con.executemany("insert into retrieval_run values (?, ?, ?, ?, ?, ?)", run_rows)
    con.execute("create table original_qrels (dataset varchar, query_id varchar, doc_id varchar, "
                "relevance integer)")
    con.executemany("insert into original_qrels values (?, ?, ?, ?)", qrels_rows)


def test_all_datasets_and_retrievers_at_once_equal_one_at_a_time():
    con = duckdb.connect()
    pipeline_tables(con)
    together = compute_retrieval_metrics(con)
    assert together.columns == ["dataset", "retriever", "query_id", "measure", "value"]
    assert set(together["measure"]) == {"success_10", "recall_10", "P_10", "recip_rank_cut_10",
                                        "ndcg_cut_10", "map", "judged_10", "num_rel", "num_rel_ret"}
    for dataset in ("alpha", "beta"):
        for retriever in ("bm25", "dense"):
            alone = compute_retrieval_metrics(
                con, run=f"(select * exclude (dataset, retriever) from retrieval_run "
                         f"where dataset = '{dataset}' and retriever = '{retriever}')",
                qrels=f"(select * exclude (dataset) from original_qrels where dataset = '{dataset}')")
            part = together.filter((pl.col("dataset") == dataset) & (pl.col("retriever") == retriever))
            joined = part.join(alone, on=["query_id", "measure"], how="full", coalesce=True)
            assert joined.height == part.height == alone.height
            assert (joined["value"] - joined["value_right"]).abs().max() < 1e-12


def test_rank_only_runs_are_ranked_by_rank():
    con = duckdb.connect()
    pipeline_tables(con)
    with_scores = compute_retrieval_metrics(con, per_query=False).sort("dataset", "retriever", "measure")
    con.execute("create view ranks_only as select * exclude (score) from retrieval_run")
    # ties in score were broken by doc id ascending when ranks were given, trec_eval breaks them
    # descending: the same ranking only where no tie exists, so compare the tie-free measures
    with_ranks = compute_retrieval_metrics(con, run="ranks_only", per_query=False,
                                           measures=["num_rel_ret", "num_rel", "recall_100"])
    expected = compute_retrieval_metrics(con, per_query=False,
                                         measures=["num_rel_ret", "num_rel", "recall_100"])
    joined = with_ranks.join(expected, on=["dataset", "retriever", "query_id", "measure"],
                             how="full", coalesce=True)
    assert joined.height == expected.height == with_ranks.height
    # equal up to the order DuckDB sums the per-query values in
    assert (joined["value"] - joined["value_right"]).abs().max() < 1e-12
    assert with_scores.filter(pl.col("query_id") != "all").is_empty()


def test_hole_judged_complete_and_max_docs_by_hand():
    con = duckdb.connect()
    con.execute("create table run as select * from (values "
                "('q1', 'd3', 0.9), ('q1', 'd1', 0.8), ('q1', 'd4', 0.8), ('q1', 'd5', 0.1), "
                "('q9', 'd1', 1.0)) t(query_id, doc_id, score)")
    con.execute("create table original as select * from (values "
                "('q1', 'd1', 1), ('q1', 'd5', 0), ('q2', 'd7', 1)) t(query_id, doc_id, relevance)")
    con.execute("create table refined as select * from (values "
                "('q1', 'd1', 1), ('q1', 'd5', 0), ('q1', 'd3', 2), ('q1', 'd4', -1), ('q2', 'd7', 1)) "
                "t(query_id, doc_id, relevance)")
    selection = resolve_measures(["hole_2", "hole_4", "judged_4", "unj_4", "P_2", "ndcg_cut_2",
                                  "num_ret", "num_rel", "recip_rank", "num_q"])

    def values(**options):
        frame = compute_measures(con, selection, run="run", qrels="refined", original_qrels="original",
                                 **options)
        return {(q, m): v for q, m, v in frame.select("query_id", "measure", "value").iter_rows()}

    got = values()
    # ranking of q1: d3 (0.9), then the tie d4/d1 at 0.8 by doc id descending, then d5
    assert got["q1", "hole_2"] == 0.5           # d3 relevant now, unknown to the original qrels
    assert got["q1", "hole_4"] == 0.25          # d4 is -1 ("unjudged"), not relevant
    assert got["q1", "judged_4"] == 0.75        # d3, d1, d5 judged; d4's -1 counts as unjudged
    assert got["q1", "unj_4"] == 0.25
    assert got["q1", "P_2"] == 0.5              # d3 relevant, d4 not
    assert got["q1", "ndcg_cut_2"] == pytest.approx(2 / (2 + 1 / math.log2(3)))
    assert ("q9", "num_ret") not in got         # q9 has no judgments: skipped
    assert ("q2", "num_ret") not in got         # q2 has no results: skipped without -c
    assert got["all", "num_q"] == 1

    complete = values(complete=True)
    assert complete["q2", "num_ret"] == 0 and complete["q2", "num_rel"] == 1
    assert complete["all", "num_q"] == 2
    assert complete["all", "recip_rank"] == pytest.approx(0.5)  # (1 + 0) / 2 queries

    cut = values(max_docs=2)
    assert cut["q1", "num_ret"] == 2
    assert cut["q1", "judged_4"] == 0.25        # only d3 among the two kept
    assert cut["q1", "hole_4"] == 0.25


def test_refusals_name_the_problem():
    con = duckdb.connect()
    con.execute("create table qrels as select 'q1' as query_id, 'd1' as doc_id, 1 as relevance")
    con.execute("create table twice as select * from (values ('q1', 'd1', 1.0), ('q1', 'd1', 0.5)) "
                "t(query_id, doc_id, score)")
    with pytest.raises(ValueError, match="'twice': a document appears twice in the ranking of query 'q1'"):
        compute_retrieval_metrics(con, run="twice", qrels="qrels")
    con.execute("create table nan_score as select 'q1' as query_id, 'd1' as doc_id, 'nan'::double as score")
    with pytest.raises(ValueError, match="no finite score .* query 'q1'"):
        compute_retrieval_metrics(con, run="nan_score", qrels="qrels")
    con.execute("create table judged_twice as select * from (values ('q1', 'd1', 1), ('q1', 'd1', 0)) "
                "t(query_id, doc_id, relevance)")
    with pytest.raises(ValueError, match="'judged_twice': document 'd1' is judged twice for query 'q1'"):
        compute_retrieval_metrics(con, run="nan_score", qrels="judged_twice")
    con.execute("create table no_order as select 'q1' as query_id, 'd1' as doc_id")
    with pytest.raises(ValueError, match="needs a 'score' or a 'rank' column"):
        compute_retrieval_metrics(con, run="no_order", qrels="qrels")
    with pytest.raises(MeasureError, match="original qrels"):
        compute_retrieval_metrics(con, run="twice", qrels="qrels", measures=["hole"])
    with pytest.raises(ValueError, match="cannot read 'missing_table'"):
        compute_retrieval_metrics(con, run="missing_table", qrels="qrels")


def test_complete_on_a_few_hundred_queries_finishes():
    """-c with every query's values on 366 queries x 100 documents, 6 judged queries unanswered:
    DuckDB 1.5.5's join-order optimizer made this statement stall for minutes (0.3 s without
    it). In a subprocess, so that a stall fails the test instead of hanging the suite."""
    script = textwrap.dedent("""
        import duckdb
        from bridge_assets.metrics import compute_measures, resolve_measures
        con = duckdb.connect()
        con.execute('''create table retrieval_run as
            select 'bench' as dataset, 'sys' as retriever, printf('q%05d', q) as query_id,
                   printf('d%05d_%03d', q, j) as doc_id, (j + 1)::integer as rank, -j::double as score
            from range(366) t(q), range(100) s(j)''')
        con.execute('''create table original_qrels as
            select 'bench' as dataset, printf('q%05d', q) as query_id,
                   printf('d%05d_%03d', q, (q * 7) % 100) as doc_id, 1 as relevance
            from range(372) t(q)''')
        values = compute_measures(con, resolve_measures(["official"]), complete=True, per_query=True)
        summary = dict(values.filter(values["query_id"] == "all").select("measure", "value").iter_rows())
        print(summary["num_q"], summary["recip_rank"])
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    num_q, recip_rank = map(float, done.stdout.split())
    # the relevant document of query q sits at rank (7q mod 100) + 1; 6 judged queries score 0
    expected = sum(1 / ((q * 7) % 100 + 1) for q in range(366)) / 372
    assert num_q == 372 and recip_rank == pytest.approx(expected)
