"""Concordance (D-MERIT) between the significance conclusions of the original and the refined
qrels, on a hand-made significance table: ties and insignificant pairs, gained, lost and
reversed conclusions, both bounds over pending pairs, and the report's table of it."""

from __future__ import annotations

import polars as pl
import pytest

from bridge_assets.analysis.significance import SIGNIFICANCE_SCHEMA, concordance_summary, with_concordance
from bridge_assets.reports.system_sections import significance_section

PAIRS = [("a", "b"), ("a", "c"), ("a", "d"), ("b", "c"), ("b", "d"), ("c", "d")]


def rows(version: str, test: str, verdicts: list[tuple[float, float, float | None]]) -> list[dict]:
    """One row per pair of PAIRS: (mean_a, mean_b, p_holm); significant at 0.05."""
    return [{"dataset": "toy", "measure": "ndcg_cut_10", "qrels_version": version, "system_a": x,
             "system_b": y, "queries": 20, "mean_a": mean_a, "mean_b": mean_b, "test": test,
             "statistic": mean_a - mean_b, "p_value": p, "p_holm": p,
             "significant": p is not None and p <= 0.05}
            for (x, y), (mean_a, mean_b, p) in zip(PAIRS, verdicts, strict=True)]


# original: a>b significant, a~c not significant, a=d a tie (undefined p), b<c significant,
# b>d significant, c~d not significant
ORIGINAL = [(0.6, 0.4, 0.01), (0.6, 0.55, 0.40), (0.6, 0.6, None), (0.4, 0.55, 0.02),
            (0.4, 0.3, 0.03), (0.55, 0.3, 0.20)]
# refined (pending irrelevant): a>b kept (agree), a~c still not (agree), a=d tie still (agree),
# b<c lost (disagree), b>d reversed to b<d significant (disagree), c>d gained (disagree)
REFINED = [(0.7, 0.4, 0.001), (0.6, 0.58, 0.60), (0.62, 0.62, None), (0.45, 0.5, 0.30),
           (0.4, 0.5, 0.04), (0.58, 0.3, 0.001)]
# refined_upper (pending relevant): everything as the original but b<c turned insignificant
# with b ahead (disagree), and c>d gained (disagree)
UPPER = [(0.7, 0.4, 0.002), (0.6, 0.58, 0.70), (0.62, 0.62, None), (0.5, 0.45, 0.50),
         (0.45, 0.3, 0.01), (0.58, 0.3, 0.01)]


def table(test: str = "paired_t") -> pl.DataFrame:
    return pl.DataFrame(rows("original", test, ORIGINAL) + rows("refined", test, REFINED)
                        + rows("refined_upper", test, UPPER),
                        schema={k: v for k, v in SIGNIFICANCE_SCHEMA.items()
                                if k not in ("conclusion", "agrees_with_original", "concordance",
                                             "concordance_significant")})


def test_conclusions_and_agreement_by_hand():
    frame = with_concordance(table())
    assert list(frame.columns) == list(SIGNIFICANCE_SCHEMA)
    by = {(r["qrels_version"], r["system_a"] + r["system_b"]): r for r in frame.iter_rows(named=True)}
    assert [by[("original", x + y)]["conclusion"] for x, y in PAIRS] == ["a", "none", "none", "b", "a", "none"]
    assert [by[("refined", x + y)]["conclusion"] for x, y in PAIRS] == ["a", "none", "none", "none", "b", "a"]
    assert [by[("refined", x + y)]["agrees_with_original"] for x, y in PAIRS] == [
        True, True, True, False, False, False]
    assert [by[("refined_upper", x + y)]["agrees_with_original"] for x, y in PAIRS] == [
        True, True, True, False, True, False]
    assert all(by[("original", x + y)]["agrees_with_original"] is None for x, y in PAIRS)


def test_concordance_counts_ties_and_insignificant_pairs_as_agreeing():
    frame = with_concordance(table())
    per_version = {r["qrels_version"]: (r["concordance"], r["concordance_significant"])
                   for r in frame.unique("qrels_version").iter_rows(named=True)}
    # refined: 3 of 6 pairs agree (a>b, a~c, the tie a=d); of the 5 pairs significant on at
    # least one side (all but a~c and a=d... a~c and a=d are silent on both: 4 remain), 1 agrees
    assert per_version["refined"] == (pytest.approx(3 / 6), pytest.approx(1 / 4))
    # refined_upper: a>b, a~c, a=d, b>d agree (4 of 6); significant somewhere: a>b, b<c, b>d, c>d
    assert per_version["refined_upper"] == (pytest.approx(4 / 6), pytest.approx(2 / 4))
    assert per_version["original"] == (None, None)


def test_concordance_significant_is_null_without_any_conclusion():
    silent = [(0.5, 0.4, 0.5)] * 6
    frame = pl.DataFrame(rows("original", "paired_t", silent) + rows("refined", "paired_t", silent),
                         schema={k: SIGNIFICANCE_SCHEMA[k] for k in list(SIGNIFICANCE_SCHEMA)[:13]})
    refined = with_concordance(frame).filter(pl.col("qrels_version") == "refined")
    assert refined["concordance"].to_list() == [1.0] * 6
    assert refined["concordance_significant"].to_list() == [None] * 6


def test_families_are_separate_per_test_and_summary_counts():
    frame = with_concordance(pl.concat([table("paired_t"), table("randomization").with_columns(
        # the randomization test finds nothing significant anywhere: every pair agrees
        pl.lit(0.5).alias("p_holm"), pl.lit(False).alias("significant"))]))
    summary = concordance_summary(frame)
    assert summary.select("qrels_version", "test", "pairs", "agree", "significant_either").rows() == [
        ("refined", "paired_t", 6, 3, 4), ("refined", "randomization", 6, 6, 0),
        ("refined_upper", "paired_t", 6, 4, 4), ("refined_upper", "randomization", 6, 6, 0)]
    assert summary["concordance"].to_list() == pytest.approx([0.5, 1.0, 4 / 6, 1.0])
    assert summary["concordance_significant"].to_list()[1] is None


def test_report_shows_the_concordance():
    section = significance_section(with_concordance(table()), 10)
    concordance = next(t for t in section.tables if t.title.startswith("Concordance"))
    assert concordance.columns == ["measure", "test", "pairs", "concordance", "concordance, pending relevant",
                                   "over significant pairs", "over significant pairs, pending relevant"]
    assert concordance.rows == [["nDCG@10", "paired t-test", "6", "0.5000", "0.6667", "0.2500", "0.5000"]]
