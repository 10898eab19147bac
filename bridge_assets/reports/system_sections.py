"""The report's sections on what the refined labels change for the systems: metrics
before/after, significance and its concordance, pool saturation and coverage, the student,
the partial-annotation study and RAG alignment."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from bridge_assets import plots
from bridge_assets.analysis.retrieval import measure_label, measures_at
from bridge_assets.analysis.significance import TESTS, concordance_summary
from bridge_assets.reports.tables import Section, Table, table


def shift_section(shift: pl.DataFrame | None, k: int, out: Path) -> Section:
    names = measures_at(k)
    section = Section("shift", "Metrics before and after refinement",
                      "Each system's score and place on the original and on the refined qrels, "
                      "the refined ones as a range over the pending pairs (all irrelevant .. all "
                      "relevant); rank change > 0: the system moved up. A change is robust when it "
                      "holds at both ends of the range. Kendall tau (tau-a) and tau-b compare the "
                      "original ranking with the refined one (pending pairs irrelevant).")
    if shift is None:
        section.missing.append("ranking_shift")
        return section
    shown = [m for m in (names["ndcg"], names["hit"], names["recall"], names["mrr"], names["map"])
             if m in set(shift["measure"])]
    panels = []
    for measure in shown:
        rows = shift.filter(pl.col("measure") == measure).sort("rank_refined", "retriever")
        rows = rows.with_columns(
            # low .. high, best .. worst: pending = 1 can lower a measure (recall's denominator
            # grows, nDCG's ideal too) and so rank a system better or worse than pending = 0
            pl.format("{} .. {}", pl.min_horizontal("value_refined", "value_refined_upper").round(4),
                      pl.max_horizontal("value_refined", "value_refined_upper").round(4))
            .alias("refined_range"),
            pl.format("{} .. {}", pl.min_horizontal("rank_refined", "rank_refined_upper"),
                      pl.max_horizontal("rank_refined", "rank_refined_upper")).alias("rank_range"))
        section.tables.append(table(measure_label(measure), rows, {
            "retriever": "system", "value_original": "original", "refined_range": "refined (range)",
            "rank_original": "rank original", "rank_range": "rank refined (range)",
            "robust_rank_change": "robust rank change"}))
        if measure in (names["hit"], names["ndcg"], names["recall"]):
            panels.append((measure_label(measure), rows.sort("retriever")))
    taus = (shift.unique("measure", keep="first", maintain_order=True)
            .with_columns(pl.col("measure").map_elements(measure_label, return_dtype=pl.Utf8)))
    section.tables.insert(0, table("Agreement of the rankings", taus, {
        "measure": "measure", "systems": "systems", "kendall_tau": "Kendall tau",
        "kendall_tau_b": "Kendall tau-b", "kendall_tau_b_p_value": "tau-b p-value"}))
    if panels:
        plots.before_after(panels, out / "before_after.png")
        section.figures.append(("Scores on the original and the refined qrels", "before_after.png"))
    return section


def significance_section(significance: pl.DataFrame | None, k: int) -> Section:
    names = measures_at(k)
    section = Section("significance", "Significance before and after refinement",
                      "Every pair of systems, tested on the per-query values (the queries both "
                      "were evaluated on) with a two-sided paired t-test and a randomization test; "
                      "p-values are Holm-Bonferroni corrected over all system pairs of a measure "
                      "and qrels version and compared with the significance asset's alpha (0.05 "
                      "by default). Verdict: significant on the original and on the refined qrels "
                      "(pending pairs irrelevant) = significant both (reversed: in opposite "
                      "directions), only on the refined = gained, only on the original = lost. "
                      "Both bounds: whether the refined verdict holds with the pending pairs "
                      "relevant too. Difference: mean of system a - mean of system b. Concordance "
                      "(D-MERIT): the share of system pairs whose conclusion (a better, b better, "
                      "or no significant difference) is the same on the refined qrels as on the "
                      "original ones, at each bound over pending pairs; a pair significant on "
                      "neither side (ties included) agrees, one significant on one side only or in "
                      "opposite directions does not. 'Over significant pairs' leaves out the pairs "
                      "significant on neither side. A measure's table of system pairs lists those "
                      "significant on some qrels (original, refined, or with the pending pairs "
                      "relevant); the verdict counts include the others, and a measure on which no "
                      "pair is significant anywhere has no such table.")
    if significance is None:
        section.missing.append("significance")
        return section
    wide = (significance.with_columns((pl.col("mean_a") - pl.col("mean_b")).alias("difference"))
            .pivot(on="qrels_version", index=["measure", "test", "system_a", "system_b"],
                   values=["difference", "p_holm", "significant"]))
    wide = wide.with_columns([pl.lit(None, dtype).alias(f"{column}_{version}")
                              for column, dtype in (("difference", pl.Float64), ("p_holm", pl.Float64),
                                                    ("significant", pl.Boolean))
                              for version in ("original", "refined", "refined_upper")
                              if f"{column}_{version}" not in wide.columns])
    before, after, upper = (pl.col(f"significant_{v}") for v in ("original", "refined", "refined_upper"))
    reversed_ = pl.col("difference_original").sign() != pl.col("difference_refined").sign()
    wide = wide.with_columns(
        pl.when(before.is_null() | after.is_null()).then(None)
        .when(before & after & reversed_).then(pl.lit("reversed"))
        .when(before & after).then(pl.lit("significant both")).when(after).then(pl.lit("gained"))
        .when(before).then(pl.lit("lost")).otherwise(pl.lit("neither")).alias("verdict"),
        pl.when(after.is_null() | upper.is_null()).then(None)
        .when(after & upper).then(pl.lit("significant")).when(~after & ~upper).then(pl.lit("not significant"))
        .otherwise(pl.lit("depends on pending")).alias("both_bounds"),
        pl.format("{} vs {}", "system_a", "system_b").alias("pair"),
        # a p-value too small for four decimals must not read as 0
        pl.col("^p_holm_.*$").map_elements(lambda p: "< 0.0001" if p < 1e-4 else f"{p:.4f}", return_dtype=pl.Utf8),
        pl.col("test").replace_strict({"paired_t": "paired t-test"}, default=pl.col("test")).alias("test_label"),
        pl.col("test").replace_strict(list(TESTS), list(range(len(TESTS))), default=len(TESTS)).alias("test_order"))
    preferred = [names["ndcg"], names["hit"], names["recall"], names["mrr"]]
    present = set(wide["measure"])
    measures = [m for m in preferred if m in present] + sorted(present - set(preferred))
    verdicts = ["significant both", "reversed", "gained", "lost", "neither"]
    counts = (wide.filter(pl.col("verdict").is_not_null())
              .with_columns(pl.col("measure").replace_strict(measures, list(range(len(measures))))
                            .alias("measure_order"),
                            pl.col("measure").map_elements(measure_label, return_dtype=pl.Utf8))
              .pivot(on="verdict", index=["measure_order", "measure", "test_order", "test_label"],
                     values="pair", aggregate_function="len"))
    counts = counts.with_columns([pl.lit(0, pl.UInt32).alias(v) for v in verdicts if v not in counts.columns])
    section.tables.append(table("System pairs by verdict", counts.fill_null(0).sort("measure_order", "test_order"),
                                {"measure": "measure", "test_label": "test", **{v: v for v in verdicts}}))
    concordance = concordance_table(significance, measures)
    if concordance is not None:
        section.tables.append(concordance)
    # per measure, the system pairs significant somewhere (original, refined, pending relevant):
    # 15 systems make 105 pairs x 2 tests, a wall of 'neither' the verdict counts above already give
    somewhere = pl.any_horizontal(before.fill_null(False), after.fill_null(False), upper.fill_null(False))
    for measure in measures:
        tested = wide.filter(pl.col("measure") == measure)
        rows = tested.filter(somewhere).sort("system_a", "system_b", "test_order")
        if rows.is_empty():
            continue
        section.tables.append(table(f"{measure_label(measure)}: system pairs", rows, {
            "pair": "system a vs b", "test_label": "test", "difference_original": "difference original",
            "p_holm_original": "p original (Holm)", "difference_refined": "difference refined",
            "p_holm_refined": "p refined (Holm)", "p_holm_refined_upper": "p refined, pending relevant (Holm)",
            "verdict": "verdict", "both_bounds": "refined, both bounds"}))
    return section


def concordance_table(significance: pl.DataFrame, measures: list[str]) -> Table | None:
    """D-MERIT's concordance of the significance conclusions, original vs refined at both bounds
    over pending pairs, per measure and test (None on a table without it: an older lake)."""
    if "concordance" not in significance.columns or significance["agrees_with_original"].is_null().all():
        return None
    summary = concordance_summary(significance)
    wide = summary.pivot(on="qrels_version", index=["measure", "test"],
                         values=["pairs", "concordance", "concordance_significant"])
    wide = wide.with_columns([pl.lit(None, pl.Float64).alias(f"{c}_{v}") for c in ("concordance",
                              "concordance_significant") for v in ("refined", "refined_upper")
                              if f"{c}_{v}" not in wide.columns])
    if "pairs_refined" not in wide.columns:
        wide = wide.with_columns(pl.lit(None, pl.UInt32).alias("pairs_refined"))
    wide = wide.with_columns(
        pl.col("measure").replace_strict(measures, list(range(len(measures))), default=len(measures))
        .alias("measure_order"),
        pl.col("test").replace_strict(list(TESTS), list(range(len(TESTS))), default=len(TESTS)).alias("test_order"),
        pl.col("measure").map_elements(measure_label, return_dtype=pl.Utf8),
        pl.col("test").replace_strict({"paired_t": "paired t-test"}, default=pl.col("test")))
    return table("Concordance with the original qrels (D-MERIT)", wide.sort("measure_order", "test_order"), {
        "measure": "measure", "test": "test", "pairs_refined": "pairs",
        "concordance_refined": "concordance", "concordance_refined_upper": "concordance, pending relevant",
        "concordance_significant_refined": "over significant pairs",
        "concordance_significant_refined_upper": "over significant pairs, pending relevant"})


def saturation_section(saturation: pl.DataFrame | None, out: Path) -> Section:
    section = Section("saturation", "Pool saturation",
                      "Holes found |H(C_m)| and their growth rate GR(m) = (|H(C_m)| - |H(C_m-1)|) / "
                      "|H(C_m-1)| as systems are added, mean and std over random orders; marginal "
                      "contribution MC(r) = |Perf(r) on all labels - Perf(r) on the labels built "
                      "without r's pool| (new judgments of pairs only r surfaced removed).")
    if saturation is None:
        section.missing.append("pool_saturation")
        return section
    found = saturation.filter(pl.col("statistic") == "holes_found").sort("systems_added")
    growth = saturation.filter(pl.col("statistic") == "growth_rate").sort("systems_added")
    curve = found.join(growth.select("systems_added", pl.col("value").alias("growth"),
                                     pl.col("std").alias("growth_std")), on="systems_added", how="left")
    section.tables.append(table("Growth", curve, {
        "systems_added": "systems added (m)", "value": "holes found (mean)", "std": "std",
        "growth": "GR(m) (mean)", "growth_std": "GR std"}))
    shown = {"perf_all": "all labels", "perf_without": "without its pool", "marginal_contribution": "MC"}
    contribution = (saturation.filter(pl.col("statistic").is_in(list(shown)))
                    .sort("measure", pl.col("statistic").replace_strict(list(shown), list(range(len(shown)))))
                    .with_columns((pl.col("measure").map_elements(measure_label, return_dtype=pl.Utf8) + " "
                                   + pl.col("statistic").replace_strict(shown)).alias("column"))
                    .pivot(on="column", index="retriever", values="value").sort("retriever"))
    section.tables.append(table("Marginal contribution", contribution.rename({"retriever": "system"})))
    mc_curve = saturation.filter(pl.col("statistic") == "marginal_contribution_curve")
    if mc_curve.height:
        labelled = mc_curve.with_columns(pl.col("measure").map_elements(measure_label, return_dtype=pl.Utf8))
        section.tables.append(table("Marginal contribution as the pool grows (mean over orders)",
                                    labelled.pivot(on="measure", index="systems_added", values="value")
                                    .sort("systems_added").rename({"systems_added": "systems added (m)"})))
        ranks = (saturation.filter(pl.col("statistic").is_in(["mean_contribution", "contribution_rank"]))
                 .with_columns((pl.col("measure").map_elements(measure_label, return_dtype=pl.Utf8) + " "
                                + pl.col("statistic").replace_strict({"mean_contribution": "mean MC",
                                                                      "contribution_rank": "rank"})).alias("column"))
                 .pivot(on="column", index="retriever", values="value"))
        order = next((c for c in ranks.columns if c.endswith(" rank")), None)
        ranks = ranks.sort([order, "retriever"] if order else ["retriever"], nulls_last=True)
        section.tables.append(table("Systems by their mean contribution when added",
                                    ranks.with_columns(pl.col("^.* rank$").cast(pl.Int64))
                                    .rename({"retriever": "system"})))
    if found.height:
        plots.saturation(found, growth, out / "saturation.png")
        section.figures.append(("Saturation curves", "saturation.png"))
    if mc_curve.height:
        plots.contribution_curve(labelled, out / "contribution.png")
        section.figures.append(("Marginal contribution of the m-th system added", "contribution.png"))
    return section


COVERAGE_BOUNDS = {"refined": "verified labels", "refined_upper": "pending pairs relevant"}


def coverage_section(coverage: pl.DataFrame | None, out: Path) -> Section:
    section = Section("coverage", "Pool coverage",
                      "Relevant chunks (verified labels; with the pending pairs counted relevant as "
                      "the upper bound) in the pool of the first m systems, mean and 5-95% band over "
                      "random orders of adding them; and a Michaelis-Menten saturation curve "
                      "total * m / (half + m) fitted to it, whose asymptote estimates how many relevant "
                      "chunks systems like these would find in the end, so how many the pool still "
                      "misses (95% interval from pools drawn from the fitted curve). Known outside: "
                      "relevant judgments no system surfaced.")
    if coverage is None:
        section.missing.append("pool_coverage")
        return section
    found = coverage.filter((pl.col("statistic") == "relevant_found") & (pl.col("qrels_version") == "refined"))
    upper = coverage.filter((pl.col("statistic") == "relevant_found") & (pl.col("qrels_version") == "refined_upper"))
    curve = found.join(upper.select("systems_added", pl.col("value").alias("upper")), on="systems_added", how="left")
    section.tables.append(table("Relevant chunks found as systems are added", curve.sort("systems_added"), {
        "systems_added": "systems added (m)", "value": "found (mean)", "std": "std", "low": "band 5%",
        "high": "band 95%", "upper": "found, pending relevant (mean)"}))

    def scalar(version: str, statistic: str) -> dict | None:
        rows = coverage.filter((pl.col("qrels_version") == version) & (pl.col("statistic") == statistic))
        return rows.row(0, named=True) if rows.height else None

    rows, findings = [], []  # findings: what the estimate means, or why there is none
    for version, label in COVERAGE_BOUNDS.items():
        estimate = scalar(version, "outside_pool_estimate")
        if estimate is None:
            continue
        in_pool, known = scalar(version, "in_pool"), scalar(version, "known_outside_pool")
        shown = estimate["note"] is None and estimate["value"] is not None
        rows.append((label, int(in_pool["value"]) if in_pool else None, int(known["value"]) if known else None,
                     f"{estimate['value']:.0f} ({estimate['low']:.0f} .. {estimate['high']:.0f})" if shown
                     else "not shown"))
        if shown:
            total = scalar(version, "total_estimate")
            # coverage_rows writes both beside an estimate with a value
            assert in_pool is not None and total is not None
            findings.append(
                f"{label}: the pool holds {int(in_pool['value'])} relevant chunks; the fitted curve puts "
                f"about {estimate['value']:.0f} more (95% interval {estimate['low']:.0f} .. {estimate['high']:.0f}, "
                f"from {estimate['resamples']} pools drawn from the fitted curve) "
                f"within reach of more systems like these, a total of {total['value']:.0f}. "
                + ("More systems are worth running." if estimate["high"] >= 0.1 * in_pool["value"] else
                   "The pool is close to saturation: more such systems would add little."))
        else:
            findings.append(f"{label}: no extrapolation shown: {estimate['note']}.")
    section.intro = " ".join([section.intro, *(f"{f[0].upper()}{f[1:]}" for f in findings)])
    if rows:
        section.tables.append(table("Outside the pool", pl.DataFrame(rows, schema=[
            "labels", "relevant in the pool", "known outside (no system surfaced)",
            "estimated outside (95% interval)"], orient="row")))
    if found.height:
        fitted = coverage.filter((pl.col("statistic") == "fitted") & (pl.col("qrels_version") == "refined"))
        total = scalar("refined", "total_estimate")
        plots.coverage(found.sort("systems_added"), fitted.sort("systems_added") if fitted.height else None,
                       (total["value"], total["low"], total["high"]) if total else None, out / "coverage.png")
        section.figures.append(("Relevant chunks in the pool as systems are added, and the fitted extrapolation",
                                "coverage.png"))
    return section


def student_section(annotator: pl.DataFrame | None, scores: pl.DataFrame | None, qrels: pl.DataFrame | None,
                    out: Path) -> Section:
    """The student annotator: what it learned from, its reliability diagram and DIRAS's
    threshold retrieval on its held-out queries (student/threshold.py)."""
    from bridge_assets.student.threshold import held_out_pairs, reliability, threshold_retrieval

    section = Section("student", "Student annotator",
                      "A cross-encoder trained on the verified labels only, calibrated on queries it "
                      "held out. Its scores are not labels: they never enter the qrels.")
    if annotator is None:
        section.missing.append("student_annotator")
        return section
    row = annotator.row(0, named=True)
    if row["student_key"] is None:
        section.notes.append(f"No student was trained: {row['not_trained']}.")
        return section
    section.tables.append(table("The student", pl.DataFrame([row]), {
        "student_key": "key", "weights_hash": "weights", "labels": "verified labels",
        "relevant": "relevant", "trained_on": "trained on", "calibrated_on": "calibrated on",
        "calibration": "calibration", "held_out_ece": "held-out ECE", "held_out_auroc": "held-out AUROC"}))
    left_out = row["labels"] - (row["trained_on"] or 0) - (row["calibrated_on"] or 0)
    if left_out > 0:
        section.notes.append(f"{left_out} of its {row['labels']} verified labels were left out: those of "
                             "queries labelled one way only (they teach a base rate, not relevance) and "
                             "any past max_labels; student_training_set.split names each.")
    if row.get("held_out_auroc") is not None and row["held_out_auroc"] <= 0.5:
        section.notes.append(f"Its held-out AUROC is {row['held_out_auroc']:.2f}: it orders those pairs no "
                             "better than chance, so its scores carry no information here (too few "
                             "labels to learn from; docs/student.md).")
    if scores is None or qrels is None:
        section.missing.extend(name for name, frame in (("student_scores", scores), ("bridge_qrels", qrels))
                               if frame is None)
        return section
    queries = row.get("calibration_queries") or []
    pairs = held_out_pairs(scores, qrels, queries)
    if not pairs.height:
        section.notes.append("No held-out query to measure the student on (calibration_share 0, or "
                             "a student trained before its calibration queries were recorded).")
        return section
    section.intro += (f" Measured on the {len(queries)} queries it held out ({pairs.height} pool pairs, "
                      f"{int(pairs['judged'].sum())} with a verified label): the order within a query is "
                      "out of sample, the calibration map was fitted on these labels. Threshold "
                      "retrieval (DIRAS) keeps every pair scored at least P instead of a fixed top-k; "
                      "a pending pair counts as not relevant.")
    section.tables.append(table("Threshold retrieval against top-k (held-out queries)",
                                threshold_retrieval(pairs), {
                                    "rule": "rule", "retrieved_per_query": "retrieved per query",
                                    "recall": "recall", "recall_queries": "queries (recall)",
                                    "precision": "precision", "precision_queries": "queries (precision)"}))
    bins = reliability(pairs)
    if bins:
        plots.reliability({"student (held-out queries)": bins}, out / "student_reliability.png",
                          title="Student: reliability on held-out queries")
        section.figures.append(("Reliability diagram of the student's P(relevant) on its held-out "
                                "queries (marker area: pairs in the bin)", "student_reliability.png"))
    return section


def partial_section(study: pl.DataFrame | None, out: Path) -> Section:
    section = Section("partial", "Partial annotation (D-MERIT)",
                      "How much the system ranking under partial qrels agrees with the ranking "
                      "under the full refined qrels: Kendall tau-b and error rate (share of system "
                      "pairs ordered differently), mean and std over draws.")
    if study is None:
        section.missing.append("partial_annotation_study")
        return section
    overall = study.filter((pl.col("p_bucket") == "all") & pl.col("base_system").is_null())
    wide = (overall.with_columns(pl.col("measure").map_elements(measure_label, return_dtype=pl.Utf8))
            .pivot(on="statistic", index=["setting", "fraction", "measure", "samples"],
                   values=["mean", "std"]).sort("setting", "fraction", "measure", nulls_last=False))
    section.tables.append(table("Settings", wide, {
        "setting": "setting", "fraction": "fraction", "measure": "measure", "samples": "draws",
        "mean_kendall_tau_b": "tau-b (mean)", "std_kendall_tau_b": "tau-b std",
        "mean_error_rate": "error rate (mean)", "std_error_rate": "error rate std"}))
    buckets = study.filter((pl.col("setting") == "random_single") & (pl.col("p_bucket") != "all"))
    if buckets.height:
        by_bucket = (buckets.with_columns(pl.col("measure").map_elements(measure_label, return_dtype=pl.Utf8))
                     .pivot(on="statistic", index=["measure", "p_bucket", "pairs"], values="mean")
                     .sort("measure", "p_bucket"))
        section.tables.append(table("Random single-relevant, by paired t-test p-value of the system pair",
                                    by_bucket, {"measure": "measure", "p_bucket": "p-value bucket",
                                                "pairs": "system pairs", "error_rate": "error rate",
                                                "kendall_tau": "tau over the pairs"}))
    taus = (overall.filter(pl.col("statistic") == "kendall_tau_b")
            .with_columns(pl.col("measure").map_elements(measure_label, return_dtype=pl.Utf8)))
    sweep = taus.filter(pl.col("setting") == "fraction")
    if sweep.height:
        plots.partial_curves(sweep, taus.filter(pl.col("setting") == "random_single"), out / "partial.png")
        section.figures.append(("Ranking agreement against the fraction of known relevant items", "partial.png"))
    return section


def rag_section(alignment: pl.DataFrame | None, k: int, out: Path) -> Section:
    section = Section("rag", "RAG alignment before and after",
                      f"RAGAlign@{k}: share of queries where Hit@{k} of a system agrees with the "
                      f"judged correctness of the answer generated from its top-{k}; point-biserial "
                      f"correlation of that judgment with nDCG@{k}; Pearson correlation across systems.")
    if alignment is None:
        section.missing.append("rag_alignment")
        return section
    per_system = alignment.filter(pl.col("retriever") != "all")
    wide = (per_system.with_columns((pl.col("statistic") + ":" + pl.col("qrels_version")).alias("column"))
            .pivot(on="column", index="retriever", values="value").sort("retriever"))
    headers = {"retriever": "system", f"rag_align_{k}:original": f"RAGAlign@{k} original",
               f"rag_align_{k}:refined": f"RAGAlign@{k} refined",
               f"point_biserial_ndcg_{k}:original": "point-biserial original",
               f"point_biserial_ndcg_{k}:refined": "point-biserial refined",
               "rag_accuracy:refined": "answers correct"}
    wide = wide.with_columns([pl.lit(None, pl.Float64).alias(c) for c in headers if c not in wide.columns])
    section.tables.append(table("Per system", wide, headers))
    overall = alignment.filter(pl.col("retriever") == "all").sort("statistic", "qrels_version")
    section.tables.append(table("All systems", overall, {
        "statistic": "statistic", "qrels_version": "qrels", "value": "value", "p_value": "p-value",
        "queries": "n"}))
    plots.bars(wide, "retriever", {f"rag_align_{k}:original": "original qrels",
                                   f"rag_align_{k}:refined": "refined qrels"},
               f"RAGAlign@{k} per system", f"RAGAlign@{k}", out / "rag_alignment.png")
    section.figures.append((f"RAGAlign@{k} on the original and the refined qrels", "rag_alignment.png"))
    return section
