"""`partial_annotation_study` (D-MERIT): how far partial annotation distorts system rankings.

"Full" qrels are the refined ones (bridge_qrels); the study queries are those with at least
one relevant document there. Each setting keeps only part of every query's relevant
documents, re-scores the systems with the metrics core (trec_eval conventions, `-c`: a
system that returned nothing for a query scores 0 on it) and compares the resulting system
ranking with the full one:
- random_single: one relevant document per query, drawn at random; `samples` draws (1000).
- most_popular_single / longest_single / shortest_single: the document most systems
  retrieved / with the longest / shortest text (ties: the smallest doc id).
- system_single: the relevant document a base system ranks highest (a random one where it
  retrieved none), the base system left out of the comparison; one row per base system and
  one (base_system NULL) with mean and std over the bases.
- fraction: each query keeps ceil(f * n) of its n relevant documents at random, for every f
  in `fractions`, `sweep_samples` draws each.
Statistics (mean and std over the draws): kendall_tau_b (scipy's tau-b, computed for all draws
at once from the pairs' order signs) between the full and the
partial system scores, and error_rate: the share of system pairs whose order differs (a pair
tied on one side and not on the other counts as an error). Per paired t-test bucket (p-value
of the two systems' per-query scores on the full qrels, scipy.stats.ttest_rel; 'undefined'
when their scores are identical): error_rate and kendall_tau over the pairs of that bucket
((concordant - discordant) / pairs), showing that partial annotation errs on close systems.

With one relevant document per query (the dataset allows no partial annotation) every
setting equals the full qrels; the asset says so in its metadata.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import duckdb
import numpy as np
import polars as pl

from bridge_assets.analysis.views import Scope, ScopeInfo, analysis_views, require_rows
from bridge_assets.errors import SettingsError
from bridge_assets.metrics import compute_measures, resolve_measures
from bridge_assets.paths import read_sql

DEFAULT_MEASURES = ("ndcg_cut_10", "success_10", "recall_10")
DEFAULT_FRACTIONS = (0.1, 0.25, 0.5, 0.75, 1.0)
P_BUCKETS = ((0.0, 0.01, "p<0.01"), (0.01, 0.05, "0.01<=p<0.05"), (0.05, 0.1, "0.05<=p<0.1"),
             (0.1, math.inf, "p>=0.1"))
UNDEFINED_BUCKET = "undefined"
STUDY_SCHEMA = {
    "dataset": pl.Utf8, "setting": pl.Utf8, "base_system": pl.Utf8, "fraction": pl.Float64,
    "measure": pl.Utf8, "p_bucket": pl.Utf8, "statistic": pl.Utf8, "mean": pl.Float64,
    "std": pl.Float64, "samples": pl.Int32, "pairs": pl.Int32, "systems": pl.Int32, "queries": pl.Int32,
}


@dataclass
class StudyData:
    """Per-query scores the settings are built from."""

    systems: list[str]
    queries: list[str]
    candidates: list[list[str]]          # per query: its relevant doc ids (sorted)
    full: dict[str, np.ndarray]          # measure -> (systems, queries) on the full qrels
    single: dict[str, list[np.ndarray]]  # measure -> per query (systems, candidates): only that doc known
    features: pl.DataFrame               # query_id, doc_id, length, popularity, systems, ranks

    @property
    def multi_relevant_queries(self) -> int:
        return sum(1 for docs in self.candidates if len(docs) > 1)


@contextlib.contextmanager
def _registered(con: duckdb.DuckDBPyConnection, frames: dict[str, pl.DataFrame]) -> Iterator[None]:
    try:
        for name, frame in frames.items():
            con.register(name, frame.to_arrow())
        yield
    finally:
        for name in frames:
            con.unregister(name)


def _per_query(con: duckdb.DuckDBPyConnection, measures: Sequence[str], run: str, qrels: str) -> pl.DataFrame:
    """Per-query values of the systems that answered; the callers' arrays start at 0, which is
    trec_eval -c's score for a query a system did not answer (asking the SQL for -c instead
    stalled DuckDB 1.5.5 on the bench lake at 366 queries; docs/scale.md)."""
    selection = resolve_measures(measures)
    values = compute_measures(con, selection, run=run, qrels=qrels, per_query=True, max_docs=selection.depth)
    return values.filter(pl.col("query_id") != "all")


@contextlib.contextmanager
def _study_run(con: duckdb.DuckDBPyConnection, measures: Sequence[str]) -> Iterator[None]:
    """Temp table study_run: the rankings of the queries with a relevant document, cut to the
    depth the measures read (each ranking in trec_eval's order, score descending and ties by
    doc id descending, as retrieval_metrics.sql forms it). Every subset evaluation copies its
    query's rankings, so this cut (10 of 100 documents at the paper's shape) saves most of the
    study's work."""
    depth = resolve_measures(measures).depth
    cut = "" if depth is None else (
        f"qualify row_number() over (partition by retriever, query_id order by score desc, doc_id desc) <= {depth}")
    con.execute(f"""create or replace temp table study_run as
                    select retriever, query_id, doc_id, score from analysis_run
                    where query_id in (select query_id from analysis_refined_qrels where relevance >= 1)
                    {cut}""")
    try:
        yield
    finally:
        con.execute("drop table if exists study_run")


def subset_scores(con: duckdb.DuckDBPyConnection, measures: Sequence[str], systems: Sequence[str],
                  query_ids: Sequence[str], subsets: Sequence[Sequence[str]]) -> dict[str, np.ndarray]:
    """measure -> (len(subsets), systems): each system's score on query_ids[k] when subsets[k]
    are its only relevant documents; all subsets in one evaluation by the metrics core (each
    subset is a `dataset` of its own). Reads the temp table study_run; a system without a
    ranking for the query scores 0 (trec_eval -c)."""
    scores = {m: np.zeros((len(subsets), len(systems))) for m in measures}
    if not subsets:
        return scores
    keys = [str(k) for k in range(len(subsets))]
    qrels = pl.DataFrame({"dataset": keys, "query_id": list(query_ids), "doc_id": [list(d) for d in subsets]},
                         schema={"dataset": pl.Utf8, "query_id": pl.Utf8, "doc_id": pl.List(pl.Utf8)})
    qrels = qrels.explode("doc_id").with_columns(pl.lit(1).alias("relevance"))
    variants = qrels.select("dataset", "query_id").unique()
    with _registered(con, {"study_subset_qrels": qrels, "study_subsets": variants}):
        con.execute("""create or replace temp view study_subset_run as
                       select v.dataset, r.retriever, r.query_id, r.doc_id, r.score
                       from study_run r join study_subsets v using (query_id)""")
        try:
            values = _per_query(con, measures, "study_subset_run", "study_subset_qrels")
        finally:
            con.execute("drop view if exists study_subset_run")
    system_index = {s: i for i, s in enumerate(systems)}
    for (measure,), group in values.group_by("measure"):
        rows = group["dataset"].cast(pl.Int64).to_numpy()
        columns = group["retriever"].replace_strict(system_index, return_dtype=pl.Int64).to_numpy()
        scores[measure][rows, columns] = group["value"].to_numpy()
    return scores


def load_study_data(con: duckdb.DuckDBPyConnection, dataset: str, measures: Sequence[str]) -> StudyData:
    """Scores on the full qrels and on every single-relevant qrels; reads the analysis views
    and the temp table study_run."""
    features = con.execute(read_sql("partial_annotation_study"), {"dataset": dataset}).pl()
    systems = [r[0] for r in con.execute("select distinct retriever from analysis_run order by 1").fetchall()]
    grouped = features.group_by("query_id", maintain_order=True).agg(pl.col("doc_id"))
    queries, candidates = grouped["query_id"].to_list(), grouped["doc_id"].to_list()
    system_index = {s: i for i, s in enumerate(systems)}
    query_index = {q: i for i, q in enumerate(queries)}
    with _registered(con, {"study_relevant": features.select("query_id").unique()}):
        con.execute("""create or replace temp view study_full_qrels as
                       select * from analysis_refined_qrels
                       where query_id in (select query_id from study_relevant)""")
        try:
            full_values = _per_query(con, measures, "analysis_run", "study_full_qrels")
        finally:
            con.execute("drop view if exists study_full_qrels")
    full = {m: np.zeros((len(systems), len(queries))) for m in measures}
    for _, retriever, query_id, measure, value in full_values.iter_rows():
        full[measure][system_index[retriever], query_index[query_id]] = value
    # one subset per relevant document, in (query, doc) order: each query's form one block
    singles = subset_scores(con, measures, systems, features["query_id"].to_list(),
                            [[d] for d in features["doc_id"]])
    bounds = np.cumsum([0] + [len(docs) for docs in candidates])
    single = {m: [singles[m][bounds[q]:bounds[q + 1]].T for q in range(len(queries))] for m in measures}
    return StudyData(systems, queries, candidates, full, single, features)


# --- comparing rankings --------------------------------------------------------------------

def pair_p_values(full: np.ndarray) -> np.ndarray:
    """Paired t-test p-value of every system pair (i < j, triu order) over the queries, in one
    vectorised scipy call. Where the per-query difference is constant the t statistic is 0/0
    (identical systems: NaN) or infinite (p = 0), so those are set directly."""
    from scipy import stats

    first, second = np.triu_indices(full.shape[0], k=1)
    if not len(first):
        return np.array([], dtype=float)
    diff = full[first] - full[second]
    constant = np.isclose(diff, diff[:, :1]).all(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the constant rows, overwritten below
        values = np.asarray(stats.ttest_rel(full[first], full[second], axis=1).pvalue, dtype=float)
    values[constant] = np.where(np.isclose(diff[constant, 0], 0.0), np.nan, 0.0)
    return values


def kendall_tau_b_of_signs(full_signs: np.ndarray, partial_signs: np.ndarray) -> np.ndarray:
    """Kendall's tau-b of each draw against the full ranking from the pairs' order signs:
    (concordant - discordant) / sqrt((pairs - ties in full) * (pairs - ties in the draw)), the
    definition scipy.stats.kendalltau(variant="b") computes; NaN where either side is all ties.
    `full_signs` (pairs,), `partial_signs` (draws, pairs); one pass for all draws."""
    numerator = (partial_signs * full_signs).sum(axis=1)
    denominator = np.sqrt(np.count_nonzero(full_signs) * np.count_nonzero(partial_signs, axis=1).astype(float))
    with np.errstate(divide="ignore", invalid="ignore"):  # 0/0 where a side is all ties: NaN
        return np.where(denominator > 0, numerator / denominator, np.nan)


def bucket_of(p_values: np.ndarray) -> np.ndarray:
    labels = np.full(len(p_values), UNDEFINED_BUCKET, dtype=object)
    for low, high, label in P_BUCKETS:
        labels[(p_values >= low) & (p_values < high)] = label
    return labels


def compare_rankings(full_means: np.ndarray, partial_means: np.ndarray,
                     p_values: np.ndarray) -> list[dict]:
    """Statistic rows for one setting. `full_means` (systems,), `partial_means` (draws, systems),
    `p_values` per system pair in triu order."""
    upper = np.triu_indices(len(full_means), k=1)
    full_signs = np.sign(full_means[:, None] - full_means[None, :])[upper]
    partial_signs = np.sign(partial_means[:, :, None] - partial_means[:, None, :])[:, upper[0], upper[1]]
    errors = partial_signs != full_signs
    taus = kendall_tau_b_of_signs(full_signs, partial_signs)
    draws = len(partial_means)
    rows = [
        {"p_bucket": "all", "statistic": "kendall_tau_b", "values": taus, "pairs": len(full_signs)},
        {"p_bucket": "all", "statistic": "error_rate", "values": errors.mean(axis=1), "pairs": len(full_signs)},
    ]
    buckets = bucket_of(p_values)
    for label in [b[2] for b in P_BUCKETS] + [UNDEFINED_BUCKET]:
        mask = buckets == label
        if not mask.any():
            continue
        rows.append({"p_bucket": label, "statistic": "error_rate", "values": errors[:, mask].mean(axis=1),
                     "pairs": int(mask.sum())})
        rows.append({"p_bucket": label, "statistic": "kendall_tau",
                     "values": (partial_signs[:, mask] * full_signs[mask]).mean(axis=1),
                     "pairs": int(mask.sum())})
    for row in rows:
        values = row.pop("values")
        defined = values[~np.isnan(values)]
        row.update(mean=float(defined.mean()) if defined.size else None,
                   std=float(defined.std()) if defined.size else None, samples=draws)
    return rows


# --- the settings ----------------------------------------------------------------------------

def single_choice_means(data: StudyData, measure: str, choices: np.ndarray) -> np.ndarray:
    """System means when query q keeps only candidate choices[d, q]: (draws, systems)."""
    draws = choices.shape[0]
    total = np.zeros((draws, len(data.systems)))
    for q, values in enumerate(data.single[measure]):
        total += values[:, choices[:, q]].T
    return total / len(data.queries)


def _feature_choice(data: StudyData, column: str, largest: bool) -> np.ndarray:
    choice = []
    for (query_id,), group in data.features.group_by(["query_id"], maintain_order=True):
        values = group[column].to_numpy()  # rows ordered by doc_id: argmax/argmin keep the first tie
        choice.append(int(np.argmax(values) if largest else np.argmin(values)))
    return np.array([choice])


def _system_choice(data: StudyData, base: str, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """Per query the candidate `base` ranks highest (random where it has none); and how many
    queries the base system found a relevant document for."""
    best: dict[tuple[str, str], int] = {}
    for query_id, doc_id, systems, ranks in data.features.select("query_id", "doc_id", "systems", "ranks").iter_rows():
        if base in systems:
            best[(query_id, doc_id)] = ranks[systems.index(base)]
    choice, found = [], 0
    for query_id, docs in zip(data.queries, data.candidates):
        ranked = [(best[(query_id, d)], j) for j, d in enumerate(docs) if (query_id, d) in best]
        if ranked:
            choice.append(min(ranked)[1])
            found += 1
        else:
            choice.append(int(rng.integers(len(docs))))
    return np.array([choice]), found


def draw_fraction_subsets(candidates: Sequence[Sequence[str]], fractions: Sequence[float], draws: int,
                          rng: np.random.Generator) -> tuple[list[int], list[list[str]], np.ndarray]:
    """The fraction setting's draws: query q keeps ceil(f * n) of its n relevant documents,
    chosen at random, in each of `draws` draws per fraction. Returns the distinct (query, kept
    documents) subsets, as query positions and document lists, and per (fraction, draw, query)
    the index of its subset. Draws repeat subsets (a query with 2 relevant documents has 3
    possible ones), and each distinct subset is evaluated once."""
    chosen = np.zeros((len(fractions), draws, len(candidates)), dtype=np.int64)
    subset_query: list[int] = []
    subset_docs: list[list[str]] = []
    sizes = np.array([len(docs) for docs in candidates])
    for n in np.unique(sizes):
        members = np.flatnonzero(sizes == n)  # the queries with n relevant documents, drawn together
        masks = np.zeros((len(fractions), draws, len(members), n), dtype=bool)
        for f, fraction in enumerate(fractions):
            keep = max(1, math.ceil(fraction * n))
            picked = rng.random((draws, len(members), n)).argsort(axis=2)[:, :, :keep]
            np.put_along_axis(masks[f], picked, True, axis=2)
        keyed = np.concatenate([np.broadcast_to(members[None, None, :, None], masks.shape[:3] + (1,)),
                                masks.astype(np.int64)], axis=3).reshape(-1, n + 1)
        distinct, inverse = np.unique(keyed, axis=0, return_inverse=True)
        chosen[:, :, members] = len(subset_query) + inverse.reshape(masks.shape[:3])
        for row in distinct:
            subset_query.append(int(row[0]))
            subset_docs.append([candidates[int(row[0])][int(j)] for j in np.flatnonzero(row[1:])])
    return subset_query, subset_docs, chosen


def _fraction_means(con: duckdb.DuckDBPyConnection, data: StudyData, measures: Sequence[str],
                    fractions: Sequence[float], draws: int, rng: np.random.Generator) -> dict[tuple[float, str], np.ndarray]:
    """(fraction, measure) -> system means (draws, systems): each distinct subset scored once,
    every draw's mean gathered from those scores. Reads the temp table study_run."""
    subset_query, subset_docs, chosen = draw_fraction_subsets(data.candidates, fractions, draws, rng)
    scores = subset_scores(con, measures, data.systems, [data.queries[q] for q in subset_query], subset_docs)
    means = {}
    for measure in measures:
        totals = scores[measure][chosen].sum(axis=2)  # (fractions, draws, queries, systems) -> over queries
        for f, fraction in enumerate(fractions):
            means[(fraction, measure)] = totals[f] / len(data.queries)
    return means


def _rows(setting: str, measure: str, comparison: list[dict], *, systems: int, queries: int,
          base_system: str | None = None, fraction: float | None = None) -> list[dict]:
    return [{"setting": setting, "base_system": base_system, "fraction": fraction, "measure": measure,
             "systems": systems, "queries": queries, **row} for row in comparison]


def run_study(con: duckdb.DuckDBPyConnection, data: StudyData, measures: Sequence[str], *,
              samples: int, fractions: Sequence[float], sweep_samples: int, seed: int) -> tuple[list[dict], dict]:
    """Every setting's statistic rows, and notes for the metadata."""
    rng = np.random.default_rng(seed)
    n_systems, n_queries = len(data.systems), len(data.queries)
    sizes = np.array([len(docs) for docs in data.candidates])
    random_choices = rng.integers(0, sizes[None, :], size=(samples, n_queries))
    fixed = {"most_popular_single": _feature_choice(data, "popularity", largest=True),
             "longest_single": _feature_choice(data, "length", largest=True),
             "shortest_single": _feature_choice(data, "length", largest=False)}
    system_choices = {base: _system_choice(data, base, rng) for base in data.systems} if n_systems > 2 else {}
    fraction_means = _fraction_means(con, data, measures, fractions, sweep_samples, rng)
    rows: list[dict] = []
    for measure in measures:
        full_means = data.full[measure].mean(axis=1)
        p_values = pair_p_values(data.full[measure])
        rows += _rows("random_single", measure, compare_rankings(
            full_means, single_choice_means(data, measure, random_choices), p_values),
            systems=n_systems, queries=n_queries)
        for setting, choice in fixed.items():
            rows += _rows(setting, measure, compare_rankings(
                full_means, single_choice_means(data, measure, choice), p_values),
                systems=n_systems, queries=n_queries)
        per_base = []
        for base, (choice, _) in system_choices.items():
            keep = np.array([s != base for s in data.systems])
            kept_pairs = keep[np.triu_indices(n_systems, k=1)[0]] & keep[np.triu_indices(n_systems, k=1)[1]]
            comparison = compare_rankings(full_means[keep], single_choice_means(data, measure, choice)[:, keep],
                                          p_values[kept_pairs])
            per_base.append(comparison)
            rows += _rows("system_single", measure, comparison, base_system=base,
                          systems=n_systems - 1, queries=n_queries)
        if per_base:
            rows += _rows("system_single", measure, _across_bases(per_base), systems=n_systems - 1,
                          queries=n_queries)
        for fraction in fractions:
            rows += _rows("fraction", measure, compare_rankings(
                full_means, fraction_means[(fraction, measure)], p_values), fraction=fraction,
                systems=n_systems, queries=n_queries)
    notes = {"systems": n_systems, "study_queries": n_queries,
             "queries_with_several_relevant": data.multi_relevant_queries,
             "relevant_documents": int(sizes.sum()) if n_queries else 0,
             "base_system_found_relevant": {base: found for base, (_, found) in system_choices.items()}}
    return rows, notes


def _across_bases(per_base: list[list[dict]]) -> list[dict]:
    """Mean and std over base systems of each statistic's per-base mean."""
    merged: dict[tuple[str, str], list[dict]] = {}
    for comparison in per_base:
        for row in comparison:
            merged.setdefault((row["p_bucket"], row["statistic"]), []).append(row)
    rows = []
    for (bucket, statistic), group in merged.items():
        means = np.array([r["mean"] for r in group if r["mean"] is not None], dtype=float)
        rows.append({"p_bucket": bucket, "statistic": statistic,
                     "mean": float(means.mean()) if means.size else None,
                     "std": float(means.std()) if means.size else None,
                     "samples": len(group), "pairs": group[0]["pairs"]})
    return rows


def compute_partial_annotation_study(
        con: duckdb.DuckDBPyConnection, dataset: str, *, measures: Sequence[str] = DEFAULT_MEASURES,
        samples: int = 1000, fractions: Sequence[float] = DEFAULT_FRACTIONS, sweep_samples: int = 20,
        seed: int = 0, scope: Scope = "pooled") -> tuple[pl.DataFrame, ScopeInfo, dict]:
    """Rows of the partial_annotation_study table for `dataset`, the scope, and notes."""
    if samples < 1 or sweep_samples < 1:
        raise ValueError("partial_annotation_study needs at least one draw per setting")
    if set(resolve_measures(measures).names) != set(measures):
        raise SettingsError(f"partial_annotation_study: name each measure with its cutoff, e.g. ndcg_cut_10 "
                         f"(got {list(measures)})")
    bad = [f for f in fractions if not 0.0 < f <= 1.0]
    if bad:
        raise SettingsError(f"partial_annotation_study: fractions must lie in (0, 1], got {bad}")
    require_rows(con, "corpus", dataset, "partial_annotation_study")
    with (analysis_views(con, dataset, scope, asset="partial_annotation_study") as info,
          _study_run(con, measures)):
        data = load_study_data(con, dataset, measures)
        if len(data.systems) < 2 or not data.queries:
            rows: list[dict] = []
            notes = {"systems": len(data.systems), "study_queries": len(data.queries),
                     "skipped": "needs at least two systems and one query with a relevant document"}
        else:
            rows, notes = run_study(con, data, measures, samples=samples, fractions=fractions,
                                    sweep_samples=sweep_samples, seed=seed)
    frame = pl.DataFrame(rows, schema={k: v for k, v in STUDY_SCHEMA.items() if k != "dataset"})
    frame = frame.with_columns(pl.lit(dataset).alias("dataset")).select(list(STUDY_SCHEMA))
    return frame, info, notes
