"""The short summary `bridge run` prints: what the pipeline found, what still awaits people,
and where the time went.

Only verified labels count as found holes: a debate consensus that passed its checks where
the dataset trusts it (bridge_assets.qrels.trust), or people's votes. Pending pairs (escalated,
awaiting people) are counted and the command to annotate them is shown; what a model guessed
for them (the opt-in LLM adjudicator, the agents' vote beyond a human budget, a provisional
consensus) is reported apart and never counted, and so are the filter's drops, whose hidden
holes the audit estimates.
"""

from __future__ import annotations

import time
from pathlib import Path

import duckdb

from bridge_assets.analysis.retrieval import measure_label
from bridge_assets.labeling.debate import FLAG_DEFERRED
from bridge_assets.lake.store import one_row, table_exists
from bridge_assets.qrels.known_holes import read_known_holes, score_known_holes
from bridge_assets.qrels.trust import debate_trust, dropped_holes, trusted_by_rule
from bridge_assets.registry.datasets import DatasetSpec
from bridge_assets.student.model import ONE_CLASS_QUERY, SAMPLED_OUT


def _rows(con: duckdb.DuckDBPyConnection, table: str, sql: str, params: list) -> list[tuple]:
    return con.execute(sql, params).fetchall() if table_exists(con, table) else []


def _labels(con: duckdb.DuckDBPyConnection, dataset: str) -> list[str]:
    # imported sources: a correction changes original judgments; an unverified source's
    # relevant labels are labels, never found holes (bridge qrels import)
    by_source = _rows(con, "bridge_qrels", """
        select source || case when bool_or(original_relevance is not null) then ' (corrections)'
                              when source = 'filter' then ' (drops, unverified)'
                              when bool_or(import_file is not null) and not bool_or(verified)
                              then ' (unverified)' else '' end,
               count(*) filter (where relevance > 0), count(*) filter (where relevance = 0),
               count(*) filter (where source = 'pending'
                                and coalesce(unverified_source not in ('vote', 'provisional'), true)),
               count(*) filter (where relevance > 0 and verified and original_relevance is null)
        from bridge_qrels where dataset = ? and source <> 'original' group by source
        order by source""", [dataset])
    if not by_source:
        return []
    holes = sum(verified_new for *_, verified_new in by_source)
    pending = sum(n for *_, n, _ in by_source)
    lines = [f"holes found (verified: debate consensus that passed its checks where it is trusted on "
             f"this dataset, people's votes, or verified imported judgments): {holes}",
             "new labels by source: " + (", ".join(
                 f"{source} {relevant} relevant / {irrelevant} not"
                 for source, relevant, irrelevant, _, _ in by_source if source != "pending") or "none")]
    voted = _rows(con, "bridge_qrels", "select count(*) from bridge_qrels where dataset = ? "
                                       "and unverified_source = 'vote'", [dataset])[0][0]
    if voted:
        lines.append(f"beyond the human budget (the agents' vote, unverified; not labels, metrics "
                     f"bound them): {voted}")
    if pending:
        lines.append(f"pending (escalated, awaiting people; not labels, metrics bound them): {pending}")
        lines.append("  annotate them: bridge annotate add-annotator NAME; "
                     f"bridge annotate serve --dataset {dataset}")
    guesses = _rows(con, "bridge_qrels", """
        select unverified_source, count(*) filter (where unverified_label = 1),
               count(*) filter (where unverified_label = 0)
        from bridge_qrels where dataset = ? and unverified_source is not null
        group by unverified_source order by 1""", [dataset])
    for source, relevant, irrelevant in guesses:
        what = {"adjudicator": "the LLM adjudicator", "vote": "the agents' vote beyond the human budget",
                "provisional": "the debate's consensus, provisional until measured right on this "
                               "dataset (metrics bound them)"}[source]
        lines.append(f"  unverified guesses by {what} (not counted): {relevant} relevant / {irrelevant} not")
    return lines


def _trust(con: duckdb.DuckDBPyConnection, spec: DatasetSpec) -> list[str]:
    """What the models' labels count for on this dataset (qrels.trust): the debate's consensus
    per class, with people's measured agreement, and the audit of the filter's drops."""
    if not table_exists(con, "debate_labels"):
        return []
    trust = debate_trust(con, spec.name, by_rule=trusted_by_rule(con, spec.name),
                         bar=spec.relevance.min_precision)
    lines = [f"debate consensus \"{'yes' if c.label else 'no'}\": "
             + ("counted as labels" if c.trusted else "provisional, not counted")
             + f" ({c.reason}); people agreed {c.precision.describe()}" for c in (trust.yes, trust.no)]
    return [*lines, dropped_holes(con, spec.name).describe(spec.relevance.drops_in_bounds)]


def _escalations(con: duckdb.DuckDBPyConnection, dataset: str) -> list[str]:
    outcomes = _rows(con, "debate_labels", """
        select count(*), count(*) filter (where outcome in ('escalated', 'failed'))
        from debate_labels where dataset = ?""", [dataset])
    if not outcomes or not outcomes[0][0]:
        return []
    total, escalated = outcomes[0]
    columns = {c for (c,) in con.execute("select column_name from information_schema.columns "
                                         "where table_name = 'debate_labels'").fetchall()}
    reasons = _rows(con, "debate_labels", """
        select flag, count(*) from (
            select unnest(flags) as flag from debate_labels
            where dataset = ? and outcome in ('escalated', 'failed'))
        group by flag order by 2 desc, 1""", [dataset]) if "flags" in columns else []  # older lakes
    why = ", ".join(f"{flag} {n}" for flag, n in reasons)
    lines = [f"debated pairs {total}; escalated {escalated} ({escalated / total:.1%})"
             + (f": {why}" if why else "")]
    deferred = dict(reasons).get(FLAG_DEFERRED)
    if deferred:
        lines.append(f"  {deferred} deferred by the automation cap (automation.llm_calls_per_run of the "
                     f"dataset): an explicit `bridge run --dataset {dataset}` labels them")
    return lines


def _pool_coverage(con: duckdb.DuckDBPyConnection, dataset: str) -> list[str]:
    """One line with the extrapolation of the relevant chunks outside the pool (pool_coverage,
    verified labels), only when it is meaningful (enough systems, a levelling curve); the report
    says why when it is not."""
    rows = _rows(con, "pool_coverage", """
        select max(value) filter (where statistic = 'in_pool'),
               max(value) filter (where statistic = 'outside_pool_estimate'),
               max(low) filter (where statistic = 'outside_pool_estimate'),
               max(high) filter (where statistic = 'outside_pool_estimate'),
               bool_or(note is not null) filter (where statistic = 'outside_pool_estimate'),
               max(systems_added) filter (where statistic = 'relevant_found')
        from pool_coverage where dataset = ? and qrels_version = 'refined'""", [dataset])
    if not rows or rows[0][1] is None or rows[0][4]:
        return []
    in_pool, outside, low, high, _, systems = rows[0]
    return [f"relevant chunks outside the pool (saturation curve fitted over {systems} systems): about "
            f"{outside:.0f} (95% interval {low:.0f}..{high:.0f}) beyond the {in_pool:.0f} in the pool"]


def rank_range(rank_a: int, rank_b: int) -> str:
    """A rank at both bounds as 'best..worst' (pending = 1 can rank a system better or worse
    than pending = 0), or the one rank when they agree."""
    best, worst = sorted((rank_a, rank_b))
    return f"{best}..{worst}" if best != worst else f"{best}"


def _rank_changes(con: duckdb.DuckDBPyConnection, dataset: str) -> list[str]:
    shifts = _rows(con, "ranking_shift", """
        select retriever, rank_original, rank_refined, rank_refined_upper, robust_rank_change
        from ranking_shift
        where dataset = ? and measure = 'ndcg_cut_10' and robust_rank_change <> 0
        order by abs(robust_rank_change) desc, retriever limit 3""", [dataset])
    unsure = _rows(con, "ranking_shift", """
        select count(*) from ranking_shift
        where dataset = ? and measure = 'ndcg_cut_10' and robust_rank_change = 0
          and (rank_change <> 0 or rank_change_upper <> 0)""", [dataset])
    line = "robust rank changes (nDCG@10, hold whichever way the pending pairs go): " + (", ".join(
        f"{name} {before}->{rank_range(at_zero, at_one)}"
        for name, before, at_zero, at_one, _ in shifts) or "none")
    if unsure and unsure[0][0]:
        line += f"; {unsure[0][0]} more system(s) move only at one bound"
    return [line]


def _stopping_point(con: duckdb.DuckDBPyConnection, dataset: str) -> list[str]:
    """One line: labels left, in impact order, until every rank change holds (pending_impact);
    a second with significance (pending_impact read the significance table): until every
    significance call that differs between the bounds is settled too."""
    if not table_exists(con, "pending_impact"):
        return []
    significance = bool(one_row(con, "select count(*) from information_schema.columns where table_name = "
                                "'pending_impact' and column_name = 'significance_in_doubt'")[0])
    flips = "coalesce(flips, 0)" if significance else "0"
    rows = _rows(con, "pending_impact", f"""
        select coalesce(max(impact_rank) filter (where decides > 0), 0), count(*), max(pairs_in_doubt),
               any_value(measure),
               coalesce(max(impact_rank) filter (where decides > 0 or {flips} > 0), 0),
               {"max(significance_in_doubt)" if significance else "null::integer"}
        from pending_impact where dataset = ?""", [dataset])
    if not rows or not rows[0][1]:
        return []
    deciding, pending, doubt, measure, with_significance, significance_doubt = rows[0]
    label = measure_label(measure)
    lines = [f"stopping point: {deciding} more label(s), in impact order, decide every rank change on "
             f"{label} ({doubt} system pair(s) in doubt; the other {pending - deciding} "
             f"pending pair(s) cannot change any): bridge annotate plan --dataset {dataset}"]
    if significance_doubt is not None:
        lines.append(f"stopping point with significance: {with_significance} more label(s), in impact order, "
                     f"also settle every significance call on {label} that differs between the bounds "
                     f"({significance_doubt} system pair(s); an upper figure: every pair that may flip a call "
                     "is counted)")
    return lines


def _student(con: duckdb.DuckDBPyConnection, dataset: str) -> list[str]:
    rows = _rows(con, "student_annotator", """
        select student_key, labels, relevant, calibration, not_trained, trained_on, calibrated_on,
               held_out_auroc
        from student_annotator where dataset = ?""", [dataset])
    if not rows:
        return []
    key, labels, relevant, calibration, not_trained, trained_on, calibrated_on, auroc = rows[0]
    if key is None:
        return [f"student annotator: none ({not_trained}; {labels} verified labels, {relevant} relevant)"]
    scored = _rows(con, "student_scores", """
        select count(*), count(*) filter (where p_relevant >= 0.5) from student_scores
        where dataset = ? and student_key = ?""", [dataset, key])
    learned = f"trained on {labels} verified labels ({relevant} relevant)"
    if trained_on + calibrated_on < labels:
        left_out = dict(_rows(con, "student_training_set", """
            select split, count(*) from student_training_set
            where dataset = ? and student_key = ? and split not in ('train', 'calibration')
            group by split order by split""", [dataset, key]))
        why = {ONE_CLASS_QUERY: "of queries labelled one way only", SAMPLED_OUT: "past max_labels"}
        learned = (f"trained on {trained_on} and calibrated on {calibrated_on} of {labels} verified "
                   f"labels ({relevant} relevant; left out: "
                   + ", ".join(f"{n} {why.get(split, split)}" for split, n in left_out.items()) + ")")
    line = f"student annotator {key}: {learned}, calibration {calibration}"
    if auroc is not None:  # 0.5: it orders its held-out pairs no better than chance
        line += f", held-out AUROC {auroc:.2f}"
    if scored:
        line += f"; scores {scored[0][0]} pool pairs, {scored[0][1]} at P(relevant) >= 0.5 (not labels)"
    return [line]


def _student_rerank(con: duckdb.DuckDBPyConnection, dataset: str) -> list[str]:
    """Each evaluation-only student re-ranker against its first stage, on the refined qrels'
    lower bound (its unjudged documents count as not relevant: Judged@10 says how many)."""
    rows = _rows(con, "student_rerank_run", """
        with runs as (select distinct retriever, first_stage from student_rerank_run
                      where dataset = $1 and first_stage is not null),
        metric as (select retriever, measure, value from retrieval_metrics
                   where dataset = $1 and qrels_version = 'refined' and query_id = 'all'
                     and measure in ('ndcg_cut_10', 'judged_10'))
        select r.retriever, r.first_stage, s.value, f.value, sj.value, fj.value
        from runs r
        left join metric s on s.retriever = r.retriever and s.measure = 'ndcg_cut_10'
        left join metric f on f.retriever = r.first_stage and f.measure = 'ndcg_cut_10'
        left join metric sj on sj.retriever = r.retriever and sj.measure = 'judged_10'
        left join metric fj on fj.retriever = r.first_stage and fj.measure = 'judged_10'
        order by r.retriever""", [dataset]) if table_exists(con, "retrieval_metrics") else []
    return [f"student re-ranker {name} (evaluated, never pooled; students of the other query fold): "
            f"nDCG@10 {value:.3f} vs its first stage {first} {first_value:.3f} on the verified labels "
            f"(Judged@10 {judged:.2f} vs {first_judged:.2f}: unjudged counts as not relevant)"
            for name, first, value, first_value, judged, first_judged in rows
            if None not in (value, first_value, judged, first_judged)]


def _trained_retrievers(con: duckdb.DuckDBPyConnection, dataset: str) -> list[str]:
    """Each evaluation-only trained retriever, on the refined qrels' lower bound (never pooled:
    its unjudged documents count as not relevant, Judged@10 says how many)."""
    rows = _rows(con, "student_rerank_run", """
        with runs as (select distinct retriever from student_rerank_run
                      where dataset = $1 and first_stage is null),
        metric as (select retriever, measure, value from retrieval_metrics
                   where dataset = $1 and qrels_version = 'refined' and query_id = 'all'
                     and measure in ('ndcg_cut_10', 'judged_10'))
        select r.retriever, s.value, j.value
        from runs r
        left join metric s on s.retriever = r.retriever and s.measure = 'ndcg_cut_10'
        left join metric j on j.retriever = r.retriever and j.measure = 'judged_10'
        order by r.retriever""", [dataset]) if table_exists(con, "retrieval_metrics") else []
    return [f"trained retriever {name} (evaluated, never pooled; fine-tuned on the labels of the other "
            f"query fold): nDCG@10 {value:.3f} on the verified labels (Judged@10 {judged:.2f}: unjudged "
            f"counts as not relevant)" for name, value, judged in rows if None not in (value, judged)]


def run_summary(con: duckdb.DuckDBPyConnection, dataset: str, started: float,
                spec: DatasetSpec | None = None, report: Path | None = None) -> str:
    """Counts, found holes, pending pairs, robust rank changes, the score against the
    dataset's known holes (when the registry names them), the share of wall time spent in the
    model (from the call ledger) since `started`, and the report's path (`report`, named by
    the caller) when it exists."""
    lines = [f"== {dataset} =="]
    counts = _rows(con, "corpus", """
        select (select count(*) from corpus where dataset = $1),
               (select count(*) from queries where dataset = $1),
               (select count(*) from original_qrels where dataset = $1)""", [dataset])
    if counts:
        lines.append("documents {}, queries {}, original judgments {}".format(*counts[0]))
    systems = _rows(con, "retrieval_run",
                    "select count(distinct retriever) from retrieval_run where dataset = ?", [dataset])
    pool = _rows(con, "candidate_pool", """
        select count(*), count(*) filter (where not in_original_qrels), count(distinct query_id)
        from candidate_pool where dataset = ?""", [dataset])
    if systems and pool:
        lines.append(f"retrievers {systems[0][0]}; candidate pairs {pool[0][0]} over {pool[0][2]} "
                     f"queries ({pool[0][1]} not judged before)")
    lines += _labels(con, dataset)
    lines += _escalations(con, dataset)
    if spec is not None:
        lines += _trust(con, spec)
    lines += _student(con, dataset)
    lines += _student_rerank(con, dataset)
    lines += _trained_retrievers(con, dataset)
    if spec is not None and spec.known_holes:
        score = score_known_holes(con, dataset, read_known_holes(spec.resolve(spec.known_holes, "known_holes")))
        if score is not None:
            lines.append(f"against the known holes ({spec.known_holes}): {score.summary_line()}")
    lines += _rank_changes(con, dataset)
    lines += _pool_coverage(con, dataset)
    lines += _stopping_point(con, dataset)
    wall = time.time() - started
    calls = _rows(con, "llm_calls", """
        select count(*), coalesce(sum(latency_s), 0), coalesce(sum(tokens_out), 0) from llm_calls
        where epoch(created_at) >= ?""", [started - 1])
    if calls:
        count, model_seconds, tokens = calls[0]
        lines.append(f"time {wall:.0f}s: {count} LLM calls took {model_seconds:.0f}s in the model "
                     f"({model_seconds / max(wall, 1e-9):.0%}), {tokens} tokens out; "
                     f"everything else {max(wall - model_seconds, 0):.0f}s")
    if report is not None and report.exists():
        lines.append(f"report: {report}")
    return "\n".join(lines)
