"""The report's sections on the labels: the qrels and their sources, the trust in the models'
labels, the known holes, holes per system and what the pending pairs can change."""

from __future__ import annotations

from pathlib import Path

import duckdb
import polars as pl

from bridge_assets import plots
from bridge_assets.analysis.retrieval import measure_label, measures_at
from bridge_assets.lake.store import int_max, table_exists
from bridge_assets.qrels.known_holes import KnownHoles, score_known_holes
from bridge_assets.qrels.merge import corrections, qrels_counts
from bridge_assets.qrels.trust import debate_trust, dropped_holes, trusted_by_rule
from bridge_assets.registry.relevance import RelevanceSettings
from bridge_assets.reports.tables import Section, table


def qrels_section(qrels: pl.DataFrame | None, dataset: str) -> Section:
    section = Section("qrels", "Labels", "Every pair the pipeline judged, with the source of its "
                      "judgment (precedence original > human > debate > pending > filter; sources "
                      "imported with bridge qrels import rank where they were placed). Only "
                      "people's votes, debate consensus that passed its checks where it is trusted "
                      "on this dataset, and imported sources marked verified count as found holes; "
                      "the filter's drops are relevance 0 but unverified. Only a correction source may change an "
                      "original judgment, and every change is listed. Pending pairs (escalated, "
                      "awaiting people) are not labels: the metrics below give a range over them, and "
                      "what a model guessed for them is listed apart as unverified, like the labels "
                      "of unverified imported sources.")
    if qrels is None:
        section.missing.append("bridge_qrels")
        return section
    counts = qrels.group_by("source").agg(
        pl.len().alias("pairs"), (pl.col("relevance") > 0).sum().alias("relevant")).sort("source")
    total = pl.DataFrame({"source": ["all"], "pairs": [qrels.height],
                          "relevant": [int((qrels["relevance"] > 0).sum())]}).cast(counts.schema)
    section.tables.append(table("Judgments by source", pl.concat([counts, total])))
    figures = qrels_counts(qrels)
    rows: list[tuple[str, int | str]] = [("holes found (verified)", figures["holes_found"]),
            ("pending pairs (awaiting people)", figures["awaiting_people"]),
            ("filter drops (unverified \"no\", audited by a sample)", figures["pairs_filter"])]
    for source, name in (("adjudicator", "LLM adjudicator"), ("vote", "agents' vote beyond the human budget"),
                         ("provisional", "debate's consensus, provisional until measured here")):
        relevant, irrelevant = figures[f"unverified_{source}_relevant"], figures[f"unverified_{source}_irrelevant"]
        if relevant or irrelevant:
            rows.append((f"unverified guesses by the {name}: relevant / not", f"{relevant} / {irrelevant}"))
    relevant, irrelevant = (figures.get(f"unverified_imported_{w}", 0) for w in ("relevant", "irrelevant"))
    if relevant or irrelevant:
        rows.append(("new labels from unverified imported sources (not holes): relevant / not",
                     f"{relevant} / {irrelevant}"))
    if figures.get("corrections"):
        rows.append(("original judgments corrected", figures["corrections"]))
    section.tables.append(table("Found and pending", pl.DataFrame(rows, schema=["what", "pairs"], orient="row")))
    if "import_file" in qrels.columns and qrels["import_file"].is_not_null().any():
        imported = (qrels.filter(pl.col("import_file").is_not_null())
                    .group_by("source", "precedence", "verified", "import_file")
                    .agg(pl.len().alias("pairs"), (pl.col("relevance") > 0).sum().alias("relevant"),
                         pl.col("original_relevance").is_not_null().sum().alias("corrections"))
                    .sort("precedence"))
        section.tables.append(table("Imported sources (pairs where they are the final label)", imported.with_columns(
            pl.col("precedence").map_elements(lambda p: f"{p:g}", return_dtype=pl.Utf8),
            pl.when(pl.col("verified")).then(pl.lit("yes")).otherwise(pl.lit("no")).alias("verified")),
            {"source": "source", "precedence": "precedence", "verified": "verified", "pairs": "pairs",
             "relevant": "relevant", "corrections": "corrections", "import_file": "file"}))
    fixed = corrections(qrels)
    if fixed.height:
        section.tables.append(table("Corrections of original judgments", fixed.sort("query_id", "doc_id"), {
            "query_id": "query", "doc_id": "doc", "original_relevance": "original relevance",
            "relevance": "corrected relevance", "source": "source", "import_file": "file",
            "import_line": "line"}))
        section.notes.append(f"{fixed.height} original judgment(s) were changed by correction sources "
                             f"({', '.join(sorted(set(fixed['source'])))}); bridge audit -d {dataset} -q QUERY "
                             "--doc DOC tells each one's story.")
    if figures["awaiting_people"]:
        section.notes.append(f"{figures['awaiting_people']} pair(s) await people: bridge annotate "
                             f"add-annotator NAME, then bridge annotate serve --dataset {dataset}.")
    return section


def trust_section(con: duckdb.DuckDBPyConnection, dataset: str,
                  relevance: RelevanceSettings | None) -> Section | None:
    """What relevant means here, what the models' labels count for, measured on this dataset
    (bridge_assets.qrels.trust), and the holes the filter's drops are estimated to hide."""
    if relevance is None:
        return None
    definition = relevance.definition or ("default: answer_support where a query has short answers, "
                                          "narrative where it has a TREC topic, useful otherwise")
    section = Section("trust", "What the models' labels count for",
                      f"Relevance definition: {definition}. A model's labels are findings on a "
                      "dataset only where people's labels on that dataset show them right: the "
                      "debate's consensus of one class counts when it is trusted by rule (short "
                      "answers with the answer check, measured on the hard gold set) and not shown "
                      "wrong here, or when the calibration sample people labelled shows its "
                      f"precision's 95% interval at or above {relevance.min_precision:g}; otherwise "
                      "it is provisional (pending: bounded in the metrics, never a found hole). "
                      "The filter's drops are a model's unverified \"no\": people label a seeded "
                      "random sample of them (the audit), from which the holes they hide are "
                      "estimated.")
    if not table_exists(con, "debate_labels"):
        section.missing.append("debate_labels")
        return section
    trust = debate_trust(con, dataset, by_rule=trusted_by_rule(con, dataset), bar=relevance.min_precision)
    section.tables.append(table("Debate consensus", pl.DataFrame(
        [("yes" if c.label else "no", c.precision.describe(), "yes" if c.trusted else "no (provisional)",
          c.reason) for c in (trust.yes, trust.no)],
        schema=["consensus", "people agreed (95% CI)", "counted as labels", "why"], orient="row")))
    section.notes.append(dropped_holes(con, dataset).describe(relevance.drops_in_bounds) + ".")
    return section


def known_holes_section(con: duckdb.DuckDBPyConnection, dataset: str, key: KnownHoles | None,
                        source: str | None) -> Section | None:
    """The labels scored against the holes people verified (only for datasets that have them)."""
    if key is None:
        return None
    section = Section("known", "Against the known holes",
                      f"The dataset's answer key ({source}) lists unjudged passages people read and "
                      "verified as holes, and partial answers. Verified holes the candidate pool "
                      "holds: found, missed or pending; reported holes: verified, partial or false.")
    score = score_known_holes(con, dataset, key)
    if score is None:
        section.missing.append("candidate_pool")
        return section
    section.tables.append(table("Score", pl.DataFrame([
        ("verified holes in the pool", score.pooled_holes), ("found", score.found),
        ("missed", score.missed), ("pending", score.pending), ("reported holes", score.reported),
        ("reported and verified", score.reported_true), ("reported, partial", score.reported_partial),
        ("reported, false", score.reported_false)], schema=["what", "pairs"], orient="row")))
    wrong = [(q, d, "false hole", s) for q, d, s in score.false_pairs] + \
            [(q, d, "missed", s) for q, d, s in score.missed_pairs]
    if wrong:
        section.tables.append(table("Pairs the labels got wrong", pl.DataFrame(
            wrong, schema=["query", "doc", "error", "label source"], orient="row")))
    return section


def _means(metrics: pl.DataFrame) -> pl.DataFrame:
    return metrics.filter(pl.col("query_id") == "all")


def holes_section(metrics: pl.DataFrame | None, k: int, out: Path) -> Section:
    names = measures_at(k)
    section = Section("holes", f"Holes per system (Hole@{k})",
                      f"Hole@{k}: the share of a system's top-{k} that are relevant chunks the "
                      f"original qrels never judged (found by the pipeline and verified); 'with "
                      f"pending' counts every pending pair as a hole too (the upper bound). "
                      f"Judged@{k}: the share of the top-{k} that the qrels judge at all.")
    if metrics is None:
        section.missing.append("retrieval_metrics")
        return section
    means = _means(metrics).filter(pl.col("measure").is_in([names["hole"], names["judged"]]))
    wide = (means.with_columns((pl.col("measure") + ":" + pl.col("qrels_version")).alias("column"))
            .pivot(on="column", index="retriever", values="value").sort("retriever"))
    headers = {"retriever": "system", f"{names['hole']}:refined": f"Hole@{k}",
               f"{names['hole']}:refined_upper": f"Hole@{k} with pending",
               f"{names['judged']}:original": f"Judged@{k} original",
               f"{names['judged']}:refined": f"Judged@{k} refined"}
    wide = wide.with_columns([pl.lit(None, pl.Float64).alias(c) for c in headers if c not in wide.columns])
    section.tables.append(table(f"Hole@{k} and Judged@{k}", wide, headers))
    plots.bars(wide, "retriever", {f"{names['hole']}:refined": f"Hole@{k}"}, f"Hole@{k} per system",
               f"Hole@{k}", out / "holes.png")
    section.figures.append((f"Hole@{k} per system", "holes.png"))
    return section

IMPACT_SHOWN = 10  # pairs of the impact order listed in the report


def impact_section(impact: pl.DataFrame | None, qrels: pl.DataFrame | None) -> Section:
    """The stopping point: how many more labels, in impact order, decide every rank change
    (pending_impact, bridge_assets.analysis.impact), and with significance settle every
    significance call that differs between the bounds too; and the first pairs to label."""
    section = Section("impact", "What people's labels can still change",
                      "A pending pair decides a system pair when the two systems' order differs "
                      "between the bounds and its chunk stands in either's top k; its impact is "
                      "the share of that doubt its label moves, summed over the system pairs. It "
                      "may flip a significance call (a system pair and a test of the significance "
                      "section) when the call differs between the bounds and its chunk stands in "
                      "either system's top k; each system pair it may flip adds a modest weight "
                      "to its impact. The annotation queue serves pairs in this order (pairs with "
                      "votes first).")
    pending = 0 if qrels is None else qrels.filter(pl.col("source") == "pending").height
    if impact is None:
        if pending:
            section.missing.append("pending_impact")
        else:
            section.notes.append("No pending pair: every rank change already holds whatever people decide.")
        return section
    flips = pl.col("flips").fill_null(0) > 0 if "flips" in impact.columns else pl.lit(False)
    deciding_rank = int_max(impact.filter(pl.col("decides") > 0)["impact_rank"]) or 0
    listed = impact.filter((pl.col("decides") > 0) | flips).sort("impact_rank")
    label = measure_label(impact["measure"][0])
    section.notes.append(f"Stopping point: {deciding_rank} more label(s), in impact order, decide every "
                         f"rank change on {label} ({int_max(impact['pairs_in_doubt']) or 0} system pair(s) "
                         f"in doubt); the other {impact.height - deciding_rank} pending pair(s) cannot "
                         "change any. (Read at the current bounds: each vote moves them.)")
    significance_doubt = (int_max(impact["significance_in_doubt"])
                          if "significance_in_doubt" in impact.columns else None)
    if significance_doubt is not None:
        with_significance = int_max(listed["impact_rank"]) or 0
        section.notes.append(
            f"With significance: {with_significance} more label(s), in impact order, also settle every "
            f"significance call on {label} that differs between the bounds ({significance_doubt} system "
            "pair(s) with such a call). An upper figure: every pending pair that may flip a call is "
            "counted, though one label may settle it.")
    if listed.height:
        section.tables.append(table(f"The first {min(IMPACT_SHOWN, listed.height)} pairs to label",
                                    listed.head(IMPACT_SHOWN), {
            "impact_rank": "#", "query_id": "query", "doc_id": "chunk", "impact": "impact",
            "reason": "why"}))
    return section
