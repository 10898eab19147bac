"""The `bridge` command line: one module per command group, over orchestration and the stages'
plain functions (the UI, sensors and schedules reach the same functions through the assets)."""

from bridge_assets.cli.main import app

__all__ = ["app"]
