"""The judged rows of the evaluated rankings, and each measure family's definition over them."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bridge_assets.metrics.measure_names import MeasureSelection

UNJUDGED = -(2**62)  # the relevance of a document the qrels do not list (below every judgment)


def judgments(column: pa.ChunkedArray, at: np.ndarray) -> np.ndarray:
    """The relevance values at rows `at`, UNJUDGED where the qrels do not list the document."""
    values = pc.fill_null(column, 0).to_numpy()[at].astype(np.int64)
    if column.null_count:
        values[~pc.is_valid(column).to_numpy(zero_copy_only=False)[at]] = UNJUDGED
    return values


def _round_half_away(x: np.ndarray) -> np.ndarray:
    """DuckDB's round() and C's lround for x >= 0: halves away from zero (x + 0.5 would round
    0.49999999999999994 up)."""
    floor = np.floor(x)
    return np.where(x - floor >= 0.5, floor + 1, floor)


def _divide(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator, 0 where the denominator is 0 (trec_eval's convention)."""
    out = np.zeros(len(numerator))
    np.divide(numerator, denominator, out=out, where=denominator > 0)
    return out


@dataclass
class JudgedRows:
    """The evaluated rankings, as every measure reads them.

    `num_ret` holds each ranking's length. The rows (`ranking`, `rank` 1-based, `relevance`,
    `original` relevance or UNJUDGED) are the retrieved documents that the qrels judge (every
    measure depends only on those), ranking by ranking, each in trec_eval's order; the others
    count only in num_ret. What several measures derive from them is computed once, when first
    read. Every value is a sum over a ranking's rows (bincount) or reads its first relevant row."""

    relevance_level: int
    num_ret: np.ndarray
    ranking: np.ndarray
    rank: np.ndarray
    relevance: np.ndarray
    original: np.ndarray | None
    R: np.ndarray          # relevant documents per ranking's query (num_rel)
    N: np.ndarray          # judged non-relevant documents per ranking's query
    ideal_dcg: np.ndarray
    ideal_dcg_at: dict[int, np.ndarray]

    @property
    def rankings(self) -> int:
        return len(self.num_ret)

    def per_ranking(self, rows_of: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        return np.bincount(rows_of, weights=weights, minlength=self.rankings).astype(np.float64)

    @functools.cached_property
    def relevant(self) -> np.ndarray:
        return self.relevance >= self.relevance_level

    @functools.cached_property
    def judged_nonrel(self) -> np.ndarray:
        return (self.relevance >= 0) & ~self.relevant

    @functools.cached_property
    def rel_ranking(self) -> np.ndarray:
        return self.ranking[self.relevant]

    @functools.cached_property
    def rel_rank(self) -> np.ndarray:
        return self.rank[self.relevant]

    @functools.cached_property
    def first_rel(self) -> np.ndarray:
        """Whether a relevant row is its ranking's first relevant row."""
        first = np.ones(len(self.rel_ranking), dtype=bool)
        first[1:] = self.rel_ranking[1:] != self.rel_ranking[:-1]
        return first

    @functools.cached_property
    def nth(self) -> np.ndarray:
        """Each relevant row's place among its ranking's relevant rows (1-based)."""
        first_rows = np.flatnonzero(self.first_rel)
        count = len(self.rel_ranking)
        return np.arange(1, count + 1) - np.repeat(first_rows, np.diff(first_rows, append=count))

    @functools.cached_property
    def precision(self) -> np.ndarray:
        """Precision at each relevant row: the terms of average precision."""
        return self.nth / self.rel_rank

    @functools.cached_property
    def first_rank(self) -> np.ndarray:
        """The rank of each ranking's first relevant document (0: none)."""
        first_rows = np.flatnonzero(self.first_rel)
        found = np.zeros(self.rankings)
        found[self.rel_ranking[first_rows]] = self.rel_rank[first_rows]
        return found

    @functools.cached_property
    def recip(self) -> np.ndarray:
        out = np.zeros(self.rankings)
        np.divide(1.0, self.first_rank, out=out, where=self.first_rank > 0)
        return out

    @functools.cached_property
    def gains(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """nDCG's rows (ranking, rank, discounted gain): its gain is the relevance value, not
        binarised, so at a relevance level above 1 the rows of relevance 1 count too."""
        if self.relevance_level == 1:  # the same rows as the relevant ones
            rows, ranking, rank = self.relevant, self.rel_ranking, self.rel_rank
        else:
            rows = self.relevance > 0
            ranking, rank = self.ranking[rows], self.rank[rows]
        discounted = self.relevance[rows] / np.log2(np.arange(2.0, rank.max(initial=0) + 2))[rank - 1]
        return ranking, rank, discounted


# One definition per measure family, as ir_measures keeps them: family name -> its per-ranking
# values, given the rows and the family's parameter (a cutoff or a recall level; None without).
# runid and num_q have no per-query value (_long_frame gives their summaries).
Definition = Callable[[JudgedRows, float | None], np.ndarray]
DEFINITIONS: dict[str, Definition] = {}


def defines(*families: str) -> Callable[[Definition], Definition]:
    def register(definition: Definition) -> Definition:
        for family in families:
            DEFINITIONS[family] = definition
        return definition
    return register


def _cutoff(param: float | None) -> int:
    assert param is not None, "a cutoff family is always given its cutoff"
    return int(param)


@defines("num_ret")
def _num_ret(rows: JudgedRows, _: float | None) -> np.ndarray:
    return rows.num_ret.astype(np.float64)


@defines("num_rel")
def _num_rel(rows: JudgedRows, _: float | None) -> np.ndarray:
    return rows.R


@defines("num_rel_ret")
def _num_rel_ret(rows: JudgedRows, _: float | None) -> np.ndarray:
    return rows.per_ranking(rows.rel_ranking)


@defines("num_nonrel_judged_ret")
def _num_nonrel_judged_ret(rows: JudgedRows, _: float | None) -> np.ndarray:
    return rows.per_ranking(rows.ranking[rows.judged_nonrel])


@defines("map", "gm_map")  # gm_map: each query's average precision, summarised geometrically
def _average_precision(rows: JudgedRows, _: float | None) -> np.ndarray:
    return _divide(rows.per_ranking(rows.rel_ranking, rows.precision), rows.R)


@defines("Rprec")
def _r_precision(rows: JudgedRows, _: float | None) -> np.ndarray:
    """Relevant among the top R."""
    return _divide(rows.per_ranking(rows.rel_ranking, rows.rel_rank <= rows.R[rows.rel_ranking]), rows.R)


@defines("bpref")
def _bpref(rows: JudgedRows, _: float | None) -> np.ndarray:
    """Each relevant document: 1 - (judged non-relevant above it, at most R) / min(R, N) (a
    cumulative count over all rows, less its value where the ranking's rows begin)."""
    nonrel_so_far = np.cumsum(rows.judged_nonrel, dtype=np.int64)
    rows_per_ranking = np.bincount(rows.ranking, minlength=rows.rankings)
    before = np.concatenate([[0], nonrel_so_far])[np.cumsum(rows_per_ranking) - rows_per_ranking]
    above = nonrel_so_far[rows.relevant] - before[rows.rel_ranking]
    R_rel = rows.R[rows.rel_ranking]
    term = 1.0 - np.minimum(above, R_rel) / np.maximum(np.minimum(rows.N, rows.R), 1)[rows.rel_ranking]
    return _divide(rows.per_ranking(rows.rel_ranking, term), rows.R)


@defines("recip_rank")
def _recip_rank(rows: JudgedRows, _: float | None) -> np.ndarray:
    return rows.recip


@defines("ndcg")
def _ndcg(rows: JudgedRows, _: float | None) -> np.ndarray:
    ranking, _rank, discounted = rows.gains
    return _divide(rows.per_ranking(ranking, discounted), rows.ideal_dcg)


@defines("iprec_at_recall")
def _iprec_at_recall(rows: JudgedRows, level: float | None) -> np.ndarray:
    """The best precision at or after the c-th relevant document, c = round(level * R)."""
    assert level is not None
    c = np.maximum(_round_half_away(level * rows.R), 1)
    eligible = np.where(rows.nth >= c[rows.rel_ranking], rows.precision, 0.0)
    best = np.zeros(rows.rankings)
    if len(eligible):
        best[rows.rel_ranking[rows.first_rel]] = np.maximum.reduceat(eligible, np.flatnonzero(rows.first_rel))
    return best


@defines("P")
def _precision_at(rows: JudgedRows, param: float | None) -> np.ndarray:
    k = _cutoff(param)
    return rows.per_ranking(rows.rel_ranking, rows.rel_rank <= k) / k


@defines("recall")
def _recall_at(rows: JudgedRows, param: float | None) -> np.ndarray:
    return _divide(rows.per_ranking(rows.rel_ranking, rows.rel_rank <= _cutoff(param)), rows.R)


@defines("ndcg_cut")
def _ndcg_at(rows: JudgedRows, param: float | None) -> np.ndarray:
    k = _cutoff(param)
    ranking, rank, discounted = rows.gains
    return _divide(rows.per_ranking(ranking, np.where(rank <= k, discounted, 0.0)), rows.ideal_dcg_at[k])


@defines("map_cut")
def _average_precision_at(rows: JudgedRows, param: float | None) -> np.ndarray:
    k = _cutoff(param)
    return _divide(rows.per_ranking(rows.rel_ranking, np.where(rows.rel_rank <= k, rows.precision, 0.0)), rows.R)


@defines("success")
def _success_at(rows: JudgedRows, param: float | None) -> np.ndarray:
    return ((rows.first_rank > 0) & (rows.first_rank <= _cutoff(param))).astype(np.float64)


@defines("recip_rank_cut")
def _recip_rank_at(rows: JudgedRows, param: float | None) -> np.ndarray:
    return np.where(rows.first_rank <= _cutoff(param), rows.recip, 0.0)


def _judged_at(rows: JudgedRows, k: int) -> np.ndarray:
    return rows.per_ranking(rows.ranking, (rows.relevance >= 0) & (rows.rank <= k))


@defines("judged")
def _judged_share_at(rows: JudgedRows, param: float | None) -> np.ndarray:
    k = _cutoff(param)
    return _judged_at(rows, k) / k


@defines("unj")
def _unjudged_share_at(rows: JudgedRows, param: float | None) -> np.ndarray:
    """Empty slots past the end of a short ranking count as judged (trec_eval's unj)."""
    k = _cutoff(param)
    return (np.minimum(rows.num_ret, k) - _judged_at(rows, k)) / k


@defines("hole")
def _hole_at(rows: JudgedRows, param: float | None) -> np.ndarray:
    """Relevant now, not judged in the original qrels."""
    k = _cutoff(param)
    assert rows.original is not None, "hole needs the original qrels"
    return rows.per_ranking(rows.ranking, rows.relevant & (rows.original < 0) & (rows.rank <= k)) / k


def measure_values(selection: MeasureSelection, rows: JudgedRows) -> dict[str, np.ndarray]:
    """Every requested per-query value, one array per measure name, over the rankings."""
    return {name: DEFINITIONS[family.name](rows, selection.param_of.get(name))
            for name, family in ((name, selection.family_of[name]) for name in selection.names)
            if family.name in DEFINITIONS}
