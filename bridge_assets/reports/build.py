"""The report of one dataset: one HTML page and its Markdown twin, PNG figures beside them.

Sections: the labels (found holes, pending pairs, unverified guesses apart, and the score
against the dataset's known holes when it has them); holes per system; metrics before/after
with both bounds over pending pairs, robust rank changes and Kendall tau; which differences
between systems are significant before and after refinement, and the concordance of those
conclusions; pool saturation and the marginal-contribution curve; pool coverage and its
extrapolation;
the partial-annotation study; RAG alignment before/after.
Each section reads its tables from the data lake; a table not materialized yet (the RAG
assets are optional, for instance) leaves its section saying so instead of failing the report.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import jinja2
import polars as pl

from bridge_assets.lake.store import table_exists
from bridge_assets.qrels.known_holes import KnownHoles
from bridge_assets.registry.datasets import validate_dataset_name
from bridge_assets.registry.relevance import RelevanceSettings
from bridge_assets.reports.label_sections import (
    holes_section,
    impact_section,
    known_holes_section,
    qrels_section,
    trust_section,
)
from bridge_assets.reports.system_sections import (
    coverage_section,
    partial_section,
    rag_section,
    saturation_section,
    shift_section,
    significance_section,
    student_section,
)
from bridge_assets.reports.tables import Section

TEMPLATES = Path(__file__).parent / "templates"
REPORT_TABLES = ("bridge_qrels", "candidate_pool", "retrieval_metrics", "ranking_shift", "significance",
                 "pool_saturation", "partial_annotation_study", "rag_alignment", "pending_impact",
                 "pool_coverage", "student_annotator", "student_scores",
                 # what the models' labels count for here (the trust section)
                 "debate_labels", "human_labels", "filtered_pool", "review_sample")


@dataclass(frozen=True)
class ReportFiles:
    html: Path
    markdown: Path
    figures: tuple[Path, ...]
    sections: tuple[Section, ...]


def _rows(con: duckdb.DuckDBPyConnection, table_name: str, dataset: str) -> pl.DataFrame | None:
    if not table_exists(con, table_name):
        return None
    frame = con.execute(f"select * from {table_name} where dataset = ?", [dataset]).pl()
    return frame if frame.height else None


# --- the report -------------------------------------------------------------------------------

def _environment() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined,
                              autoescape=jinja2.select_autoescape(["html.j2"]), trim_blocks=True,
                              lstrip_blocks=True)


def build_report(con: duckdb.DuckDBPyConnection, dataset: str, out: Path, *, k: int = 10,
                 known_holes: KnownHoles | None = None, known_holes_source: str | None = None,
                 relevance: RelevanceSettings | None = None) -> ReportFiles:
    """Write report.html, report.md and the figures of `dataset` into `out`; `known_holes`: the
    dataset's answer key of verified holes, when it has one; `relevance`: its `relevance:`
    entry (the trust section)."""
    validate_dataset_name(dataset)  # callers name `out` after it; the Markdown shows it unescaped
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.png"):  # a figure whose table is gone must not linger
        old.unlink()
    tables = {name: _rows(con, name, dataset) for name in REPORT_TABLES if name != "candidate_pool"}
    sections = tuple(section for section in (
        qrels_section(tables["bridge_qrels"], dataset),
        trust_section(con, dataset, relevance),
        known_holes_section(con, dataset, known_holes, known_holes_source),
        holes_section(tables["retrieval_metrics"], k, out),
        shift_section(tables["ranking_shift"], k, out),
        impact_section(tables["pending_impact"], tables["bridge_qrels"]),
        significance_section(tables["significance"], k),
        saturation_section(tables["pool_saturation"], out),
        coverage_section(tables["pool_coverage"], out),
        student_section(tables["student_annotator"], tables["student_scores"], tables["bridge_qrels"], out),
        partial_section(tables["partial_annotation_study"], out),
        rag_section(tables["rag_alignment"], k, out),
    ) if section is not None)
    context = {"dataset": dataset, "sections": sections, "k": k,
               "generated": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")}
    environment = _environment()
    html = out / "report.html"
    markdown = out / "report.md"
    html.write_text(environment.get_template("report.html.j2").render(**context), encoding="utf-8")
    markdown.write_text(environment.get_template("report.md.j2").render(**context), encoding="utf-8")
    figures = tuple(out / name for section in sections for _, name in section.figures)
    return ReportFiles(html, markdown, figures, sections)
