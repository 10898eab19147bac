"""Whether a model's labels count as findings on a dataset, and what the filter's drops hide.

The rule (ARCHITECTURE.md, "Relevance is the dataset's to define"): a model's labels are
findings on a dataset only where the product has measured, on that dataset, that they are
right. Per class of the debate's consensus ("yes" and "no" apart):

- measured: the consensus labels of the calibration sample (and any other consensus pair)
  that people labelled. Precision = the share people agreed with, with its 95% Wilson interval.
- trusted by rule: on a dataset judged by `answer_support` whose queries have short answers,
  with the debate's answer-presence check on, the consensus was measured right on the hard
  gold set (docs/labeler-eval.md); it counts until a measurement on the dataset shows it
  wrong (the interval's upper end under the bar).
- otherwise (no short answers, another definition, the check off): provisional until a
  measurement shows it right (the interval's lower end at or above the bar).

A provisional label is stored like a pending pair (relevance NULL, the guess kept apart as
unverified_label 'provisional'): shown, bounded in the metrics, never a found hole.

The audit: people's labels on a seeded random sample of the filter's drops estimate the share
of the drops that are holes; scaled to the number of drops, that is the estimate of the holes
the filter dropped, with the Wilson interval of the share scaled the same way. Where a dataset
asks for it (`relevance.drops_in_bounds`), the metrics' upper bound counts as relevant as many of
the drops people have not labelled as the interval's high end allows (`DroppedHoles.at_upper`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import duckdb

from bridge_assets.labeling.review import AUDIT
from bridge_assets.lake.store import one_row, table_exists

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Proportion:
    """k of n, with its 95% Wilson interval (n = 0: no interval)."""

    k: int
    n: int

    @property
    def share(self) -> float | None:
        return self.k / self.n if self.n else None

    @property
    def interval(self) -> tuple[float, float] | None:
        if not self.n:
            return None
        from scipy.stats import binomtest  # scipy loads in the steps that use it, not with the definitions

        ci = binomtest(self.k, self.n).proportion_ci(confidence_level=CONFIDENCE, method="wilson")
        return float(ci.low), float(ci.high)

    def describe(self) -> str:
        if not self.n:
            return "not measured"
        low, high = self.interval  # type: ignore[misc]
        return f"{self.k}/{self.n} = {self.share:.2f} [{low:.2f}, {high:.2f}]"


@dataclass(frozen=True)
class ClassTrust:
    """One class of the debate's consensus ("yes" or "no") on one dataset."""

    label: int
    precision: Proportion     # people agreeing with the consensus, among those they labelled
    trusted: bool
    reason: str


@dataclass(frozen=True)
class DebateTrust:
    yes: ClassTrust
    no: ClassTrust
    by_rule: bool             # trusted without a measurement on the dataset

    def trusted(self, label: int) -> bool:
        return (self.yes if label > 0 else self.no).trusted


def class_trust(label: int, precision: Proportion, by_rule: bool, bar: float) -> ClassTrust:
    interval = precision.interval
    if by_rule:
        if interval is not None and interval[1] < bar:
            return ClassTrust(label, precision, False, f"measured below the bar {bar:g}")
        return ClassTrust(label, precision, True, "answer check on short answers (hard gold set)"
                          + ("" if interval is None else f"; measured here, not below {bar:g}"))
    if interval is not None and interval[0] >= bar:
        return ClassTrust(label, precision, True, f"measured here at or above the bar {bar:g}")
    return ClassTrust(label, precision, False, "provisional: " + (
        "no calibration labels yet" if interval is None else f"not yet shown at or above {bar:g}"))


def measured_precision(con: duckdb.DuckDBPyConnection, dataset: str, label: int) -> Proportion:
    """People's decided labels on the debate's consensus pairs of `label` (`con`: debate_labels
    and human_labels)."""
    if not (table_exists(con, "debate_labels") and table_exists(con, "human_labels")):
        return Proportion(0, 0)
    k, n = one_row(con, """
        select count(*) filter (where (h.label > 0) = (d.label > 0)), count(*)
        from debate_labels d
        join human_labels h using (dataset, query_id, doc_id)
        where d.dataset = ? and d.outcome = 'consensus' and (d.label > 0) = ? and h.label is not null""",
        [dataset, label > 0])
    return Proportion(int(k), int(n))


def debate_trust(con: duckdb.DuckDBPyConnection, dataset: str, *, by_rule: bool, bar: float) -> DebateTrust:
    return DebateTrust(class_trust(1, measured_precision(con, dataset, 1), by_rule, bar),
                       class_trust(0, measured_precision(con, dataset, 0), by_rule, bar), by_rule)


@dataclass(frozen=True)
class DroppedHoles:
    """The estimate of the holes among the filter's drops, from the audited ones."""

    drops: int
    audited: Proportion          # audited drops people found relevant, of those they labelled
    sampled: int                 # drops in the audit sample (labelled or not)

    @property
    def estimate(self) -> tuple[float, float, float] | None:
        """(holes, low, high): the share and its interval scaled to the drops."""
        if not self.audited.n:
            return None
        low, high = self.audited.interval  # type: ignore[misc]
        return self.audited.share * self.drops, low * self.drops, high * self.drops  # type: ignore[operator]

    @property
    def at_upper(self) -> int:
        """How many of the drops people have not labelled the upper bound counts as holes: the
        high end of the share's interval times their number, rounded up (0 before any audit
        label: the estimate does not exist yet)."""
        if not self.audited.n:
            return 0
        high = self.audited.interval[1]  # type: ignore[index]
        # the rounding guards against 0.3 * 10 = 3.0000000000000004 becoming 4
        return math.ceil(round(high * (self.drops - self.audited.n), 9))

    def describe(self, in_bounds: bool = False) -> str:
        """One line; `in_bounds`: the dataset's upper bound counts the estimate (drops_in_bounds)."""
        if not self.drops:
            return "the filter dropped no pair"
        head = f"the filter dropped {self.drops} pairs (unverified); audit sample {self.sampled}"
        if self.estimate is None:
            return f"{head}, none labelled by people yet: holes among the drops not estimated"
        holes, low, high = self.estimate
        line = (f"{head}, {self.audited.n} labelled by people, {self.audited.k} of them holes: "
                f"about {holes:.1f} holes among the drops [95% CI {low:.1f}, {high:.1f}]")
        if in_bounds:
            line += (f"; the metrics' upper bound counts {self.at_upper} of the "
                     f"{self.drops - self.audited.n} unlabelled drops as holes")
        return line


def dropped_holes(con: duckdb.DuckDBPyConnection, dataset: str) -> DroppedHoles:
    """`con`: filtered_pool, review_sample and human_labels of `dataset`."""
    if not table_exists(con, "filtered_pool"):
        return DroppedHoles(0, Proportion(0, 0), 0)
    drops = one_row(con, "select count(*) from filtered_pool where dataset = ? and not kept", [dataset])[0]
    if not table_exists(con, "review_sample"):
        return DroppedHoles(int(drops), Proportion(0, 0), 0)
    labelled = "human_labels" if table_exists(con, "human_labels") else \
        "(select null::varchar as dataset, null::varchar as query_id, null::varchar as doc_id, null::integer as label)"
    sampled, k, n = one_row(con, f"""
        select count(*), count(*) filter (where h.label > 0), count(h.label)
        from review_sample r
        left join {labelled} h using (dataset, query_id, doc_id)
        where r.dataset = ? and r.kind = ?""", [dataset, AUDIT])
    return DroppedHoles(int(drops), Proportion(int(k), int(n)), int(sampled))


def trusted_by_rule(con: duckdb.DuckDBPyConnection, dataset: str) -> bool:
    """Whether every consensus pair of `dataset` was judged where the rule trusts the debate
    (debate_labels.trusted_by_rule; a lake written before that column: as then, trusted)."""
    if not table_exists(con, "debate_labels"):
        return False
    columns = {c for (c,) in con.execute("select column_name from information_schema.columns "
                                         "where table_name = 'debate_labels'").fetchall()}
    if "trusted_by_rule" not in columns:
        return True
    value = one_row(con, "select bool_and(coalesce(trusted_by_rule, false)) from debate_labels "
                    "where dataset = ? and outcome = 'consensus'", [dataset])[0]
    return bool(value) if value is not None else False

