"""The report asset: HTML + Markdown + PNG figures from the analysis tables of the labeled lake
of fixtures.labeled_lake, checked as files and in a real headless chromium (Playwright driving
Debian's chromium; never `playwright install`)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from bridge_assets.analysis import assets as analysis_assets
from bridge_assets.analysis import impact_asset
from bridge_assets.lake import store
from bridge_assets.qrels import assets as qrels_assets
from bridge_assets.reports import assets as report_assets
from fixtures.labeled_lake import DATASET
from fixtures.paths import lake_resources, location

CHROMIUM = Path(os.environ.get("BRIDGE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ANALYSES = [qrels_assets.bridge_qrels, analysis_assets.retrieval_metrics, analysis_assets.ranking_shift,
            analysis_assets.significance, analysis_assets.pool_saturation, analysis_assets.pool_coverage,
            analysis_assets.partial_annotation_study,
            analysis_assets.rag_alignment, impact_asset.pending_impact, report_assets.report]
CONFIG = {"ops": {"partial_annotation_study": {"config": {"samples": 100, "fractions": [0.5, 1.0],
                                                          "sweep_samples": 3}}}}
FIGURES = {"holes.png", "before_after.png", "saturation.png", "contribution.png", "coverage.png", "partial.png",
           "rag_alignment.png", "student_reliability.png"}


def write_judgments(lake) -> None:
    store.write_partitions({"rag_judgments": pl.DataFrame({
        "dataset": DATASET, "retriever": ["bm25", "bm25", "dense", "dense", "splade", "splade"],
        "query_id": ["q1", "q3", "q1", "q3", "q1", "q3"], "judgment": [True, False, True, True, False, False],
        "decided_by": "llm", "model": "m", "prompt_hash": "h", "call_key": "k", "error": None})},
        {"dataset": DATASET}, location(lake))


def write_student(lake) -> None:
    """A student's rows as student_annotator and student_scores write them (tests/test_student.py
    trains a real one): q1 and q3 held out, every pool pair scored."""
    with store.connect(location(lake)) as con:
        pool = con.execute("select distinct query_id, doc_id from candidate_pool order by all").pl()
    store.write_partitions({
        "student_annotator": pl.DataFrame([{
            "dataset": DATASET, "student_key": "k1", "weights_hash": "w1", "labels": 8, "relevant": 4,
            "trained_on": 5, "calibrated_on": 3, "calibration": "platt", "held_out_ece": 0.1,
            "held_out_auroc": 0.8, "calibration_queries": ["q1", "q3"]}]),
        "student_scores": pool.with_columns(pl.lit(DATASET).alias("dataset"), pl.lit("k1").alias("student_key"),
                                            ((pl.int_range(pl.len()) % 10) / 10 + 0.05).alias("p_relevant"))},
        {"dataset": DATASET}, location(lake))


@pytest.fixture
def report_lake(labeled_lake):
    write_judgments(labeled_lake)
    write_student(labeled_lake)
    result = dg.materialize(ANALYSES, partition_key=DATASET, run_config=CONFIG,
                            resources=lake_resources(labeled_lake))
    assert result.success
    return labeled_lake, result.asset_materializations_for_node("report")[0].metadata


def test_report_files_hold_every_section_table_and_figure(report_lake):
    lake, metadata = report_lake
    folder = lake / "reports" / DATASET
    html, markdown = folder / "report.html", folder / "report.md"
    assert metadata["path"].value == str(html) and metadata["url"].value == html.as_uri()
    assert metadata["not_materialized"].value == "none" and metadata["figures"].value == len(FIGURES)
    assert {p.name for p in folder.glob("*.png")} == FIGURES
    assert all((folder / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for name in FIGURES)
    page = html.read_text()
    for caption in ("Judgments by source", "Found and pending", "Hole@10 and Judged@10",
                    "Agreement of the rankings", "nDCG@10", "System pairs by verdict",
                    "Growth", "Marginal contribution", "Settings", "Per system", "All systems",
                    "Concordance with the original qrels (D-MERIT)",
                    "Marginal contribution as the pool grows (mean over orders)",
                    "Systems by their mean contribution when added", "Relevant chunks found as systems are added",
                    "Outside the pool"):
        assert f"<caption>{caption}</caption>" in page
    # no system pair is significant on any qrels of the labeled lake: counted, not listed
    assert "<caption>nDCG@10: system pairs</caption>" not in page
    assert "a measure on which no pair is significant anywhere has no such table" in page
    # three systems: the report says why it shows no extrapolation of the pool's coverage
    assert "Verified labels: no extrapolation shown: 3 system(s): the extrapolation needs at least 6" in page
    assert page.count('<table class="report-table"') >= 10
    assert "Not materialized" not in page
    text = markdown.read_text()
    assert "## Holes per system (Hole@10)" in text and "![Hole@10 per system](holes.png)" in text
    # the markdown holes table: bm25 and dense 0.0500, splade 0; with the pending q2/d10 bm25 0.0750
    holes = text.split("**Hole@10 and Judged@10**", 1)[1].split("\n\n", 2)[1].splitlines()
    assert holes[0] == "| system | Hole@10 | Hole@10 with pending | Judged@10 original | Judged@10 refined |"
    assert holes[1] == "| --- | --- | --- | --- | --- |"
    assert holes[2].startswith("| bm25 | 0.0500 | 0.0750 |") and holes[4].startswith("| splade | 0.0000 |")
    assert "| original | 5 | 4 |" in text and "| pending | 1 | 0 |" in text  # pairs, relevant
    # found holes count verified labels only; the pending pair and its command are named
    assert "| holes found (verified) | 3 |" in text and "| pending pairs (awaiting people) | 1 |" in text
    assert "| unverified guesses by the LLM adjudicator: relevant / not | 0 / 1 |" in text
    assert "**Next:** 1 pair(s) await people: bridge annotate add-annotator NAME, then bridge annotate " \
           "serve --dataset demo." in text
    # ranks as a range over the pending pair, and the robust change (recall: splade falls at both ends)
    recall = text.split("**Recall@10**", 1)[1].split("\n\n", 2)[1].splitlines()
    assert recall[0] == "| system | original | refined (range) | rank original | rank refined (range) | " \
                        "robust rank change |"
    # ranges read low .. high: the pending pair lowers splade's recall (its denominator grows)
    assert any(line.startswith("| splade | 1.0000 | 0.5 .. 0.625 | 1 | 3 .. 3 | -2 |") for line in recall)
    assert metadata["report"].value == text


def test_report_says_which_sections_wait_for_their_tables(labeled_lake):
    result = dg.materialize([qrels_assets.bridge_qrels, report_assets.report], partition_key=DATASET,
                            resources=lake_resources(labeled_lake))
    assert result.success
    metadata = result.asset_materializations_for_node("report")[0].metadata
    assert metadata["not_materialized"].value == ("partial_annotation_study, pending_impact, pool_coverage, "
                                                  "pool_saturation, rag_alignment, ranking_shift, retrieval_metrics, "
                                                  "significance, student_annotator")
    page = (labeled_lake / "reports" / DATASET / "report.html").read_text()
    assert page.count('class="missing"') == 9 and "<caption>Judgments by source</caption>" in page
    assert not list((labeled_lake / "reports" / DATASET).glob("*.png"))


def test_report_renders_in_headless_chromium(report_lake):
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is absent: `make browser` installs Debian's chromium")
    playwright = pytest.importorskip("playwright.sync_api")
    lake, metadata = report_lake
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(metadata["url"].value)
            assert page.title() == f"BRIDGE report: {DATASET}"
            captions = page.locator("table.report-table caption").all_inner_texts()
            assert {"Judgments by source", "Hole@10 and Judged@10", "Marginal contribution", "Per system"} <= set(captions)
            holes = page.locator("section#holes table.report-table tbody tr")
            assert holes.count() == 3 and holes.first.locator("td").first.inner_text() == "bm25"
            images = page.locator("img")
            assert images.count() == len(FIGURES)
            widths = page.eval_on_selector_all("img", "imgs => imgs.map(i => i.complete ? i.naturalWidth : 0)")
            assert all(width > 100 for width in widths), widths  # every figure loaded
            assert page.locator("nav a").count() == len(metadata["report"].value.split("\n## ")) - 1
        finally:
            browser.close()
