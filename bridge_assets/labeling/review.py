"""Which of a model's labels people check: the audit of the filter's drops and the calibration
sample of the debate's consensus labels (the `review_sample` table).

A model's "no" is as unverified as its "yes". The filter's drops never reach the debate, so a
seeded random share of them goes to people (`audit`): from their votes the summary estimates
how many holes the drops hide (bridge_assets.qrels.trust). The debate's consensus labels are
findings only where they were measured right on the dataset; `calibration` pairs, drawn at
random from each consensus outcome, are that measurement and go first in the queue.

A pair is drawn by a hash of (seed, query, chunk), so the same pairs are drawn on every re-run;
and a pair drawn once stays in the sample while it is still a drop (or a consensus), so votes
people gave keep counting when a new retriever grows the pool and the minimum is met otherwise.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection

import polars as pl

from bridge_assets.registry.relevance import RelevanceSettings

REVIEW_SAMPLE_SCHEMA = {"query_id": pl.Utf8, "doc_id": pl.Utf8, "kind": pl.Utf8, "stratum": pl.Utf8}
REVIEW_SAMPLE_DDL = ("dataset varchar, query_id varchar, doc_id varchar, kind varchar, "
                     "stratum varchar")
AUDIT, CALIBRATION = "audit", "calibration"
DEFAULT_CALIBRATION_PAIRS = 20


def pair_trusted_by_rule(kind: str, answer_present: bool | None) -> bool:
    """Whether the rule trusts the debate's consensus on one pair without a measurement on its
    dataset (bridge_assets.qrels.trust): judged by `answer_support`, and the debate's
    answer-presence check applied to it (its answers are short spans and the check is on:
    `answer_present` is not None), as on the hard gold set."""
    return kind == "answer_support" and answer_present is not None


def draw(seed: int, query_id: str, doc_id: str) -> float:
    """The pair's uniform draw in [0, 1) under `seed`."""
    digest = hashlib.sha256(f"{seed}\0{query_id}\0{doc_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def _drawn(pairs: list[tuple[str, str]], seed: int) -> list[tuple[float, str, str]]:
    return sorted((draw(seed, q, d), q, d) for q, d in pairs)


def audit_sample(drops: list[tuple[str, str]], share: float, min_pairs: int, seed: int) -> list[tuple[str, str]]:
    """The drops whose draw is under `share`, topped up with the lowest draws to `min_pairs`
    (every drop when there are fewer)."""
    ranked = _drawn(drops, seed)
    chosen = [(q, d) for u, q, d in ranked if u < share]
    if len(chosen) < min_pairs:
        chosen = [(q, d) for _, q, d in ranked[:min_pairs]]
    return chosen


def calibration_sample(by_stratum: dict[str, list[tuple[str, str]]], size: int,
                       seed: int) -> list[tuple[str, str, str]]:
    """`size` pairs spread evenly over the strata (a short stratum's share goes to the others),
    each stratum's lowest draws: (stratum, query_id, doc_id)."""
    ranked = {name: _drawn(pairs, seed) for name, pairs in sorted(by_stratum.items())}
    taken = {name: 0 for name in ranked}
    left = size
    while left > 0:
        open_strata = [name for name in ranked if taken[name] < len(ranked[name])]
        if not open_strata:
            break
        each = max(1, math.floor(left / len(open_strata)))
        for name in open_strata:
            step = min(each, len(ranked[name]) - taken[name], left)
            taken[name] += step
            left -= step
            if left == 0:
                break
    return [(name, q, d) for name in ranked for _, q, d in ranked[name][:taken[name]]]


def review_sample(filtered_pool: pl.DataFrame, debate_labels: pl.DataFrame,
                  settings: RelevanceSettings, *, trusted_by_rule: bool,
                  previous: Collection[tuple[str, str, str]] = ()) -> pl.DataFrame:
    """The `review_sample` rows of one dataset: `filtered_pool` (query_id, doc_id, kept),
    `debate_labels` (query_id, doc_id, outcome, label); `trusted_by_rule`: whether the debate's
    consensus counts without a measurement on the dataset (qrels.trust), which sets the default
    calibration size; `previous`: the (query_id, doc_id, kind) drawn before, kept where they
    still qualify."""
    drops = [(q, d) for q, d, kept in filtered_pool.select("query_id", "doc_id", "kept").iter_rows()
             if not kept]
    audited = set(audit_sample(drops, settings.audit_share, settings.audit_min_pairs, settings.seed))
    previous = set(previous)
    audited |= {(q, d) for q, d, kind in previous if kind == AUDIT} & set(drops)
    rows = [(q, d, AUDIT, "filter_drop") for q, d in sorted(audited)]
    size = settings.calibration_pairs
    if size is None:
        size = 0 if trusted_by_rule else DEFAULT_CALIBRATION_PAIRS
    strata: dict[str, list[tuple[str, str]]] = {}
    for q, d, outcome, label in debate_labels.select("query_id", "doc_id", "outcome", "label").iter_rows():
        if outcome == "consensus" and label is not None:
            strata.setdefault("consensus_yes" if label > 0 else "consensus_no", []).append((q, d))
    chosen = {(q, d): stratum for stratum, q, d in calibration_sample(strata, size, settings.seed)}
    for stratum, pairs in strata.items():  # drawn before, still a consensus (maybe voted on)
        chosen.update({pair: stratum for pair in pairs if (*pair, CALIBRATION) in previous})
    rows += [(q, d, CALIBRATION, stratum) for (q, d), stratum in chosen.items()]
    return pl.DataFrame(rows, schema=REVIEW_SAMPLE_SCHEMA, orient="row").sort("kind", "query_id", "doc_id")
