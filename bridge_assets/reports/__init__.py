"""The per-dataset report: HTML and Markdown with tables and matplotlib figures."""

from bridge_assets.reports.build import ReportFiles, build_report

__all__ = ["ReportFiles", "build_report"]
