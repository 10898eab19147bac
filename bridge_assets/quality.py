"""Data quality: run a great-expectations suite on a frame and turn it into a check result.

Checks are expressed as GX expectations so users read them in GX's vocabulary and can reuse
the suites outside Dagster; cross-table rules (qrels pointing into the corpus) are joined in
SQL first, then expressed as column expectations on the joined frame.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import lru_cache
from types import ModuleType
from typing import TYPE_CHECKING

import polars as pl

if TYPE_CHECKING:
    from great_expectations.data_context import AbstractDataContext
    from great_expectations.expectations import Expectation
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")


@dataclass
class SuiteOutcome:
    success: bool
    failures: dict[str, str] = field(default_factory=dict)  # expectation -> what failed


def expectations() -> ModuleType:
    """GX's expectation classes (`expectations().ExpectColumnValuesToNotBeNull(...)`), imported
    when a check runs: great_expectations takes about 2 s to import, which every step process
    of a multiprocess run (the UI's, the daemon's) would otherwise pay for nothing."""
    import great_expectations as gx

    return gx.expectations


@lru_cache(maxsize=1)
def _context() -> AbstractDataContext:
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)  # keep run logs readable
    return context


def _describe(expectation: Expectation | ExpectationConfiguration) -> str:
    config = expectation.configuration if hasattr(expectation, "configuration") else expectation
    kwargs = {k: v for k, v in config.kwargs.items() if k not in {"batch_id", "result_format"}}
    return f"{config.type}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"


def validate(frame: pl.DataFrame, expectations: list, name: str) -> SuiteOutcome:
    """Validate `frame` against GX `expectations`; an empty frame passes trivially."""
    import great_expectations as gx
    from great_expectations.datasource.fluent import PandasDatasource

    if frame.is_empty():
        return SuiteOutcome(True)
    context = _context()
    source_name = f"bridge_{name}"
    try:
        found = context.data_sources.get(source_name)
        assert isinstance(found, PandasDatasource)  # added below, the first time
        source = found
    except (KeyError, ValueError):
        source = context.data_sources.add_pandas(source_name)
    try:
        asset = source.get_asset(name)
    except LookupError:
        asset = source.add_dataframe_asset(name=name)
    batch_definition = next(iter(asset.batch_definitions), None) or \
        asset.add_batch_definition_whole_dataframe("whole")
    batch = batch_definition.get_batch(batch_parameters={"dataframe": frame.to_pandas()})
    suite = gx.ExpectationSuite(name=f"{name}_suite", expectations=list(expectations))
    result = batch.validate(suite, result_format="SUMMARY")
    failures = {}
    for item in result.results:
        if not item.success:
            details = item.result or {}
            sample = details.get("partial_unexpected_list") or details.get("observed_value")
            failures[_describe(item.expectation_config)] = (
                f"unexpected={details.get('unexpected_count', '?')} sample={str(sample)[:200]}")
    return SuiteOutcome(bool(result.success), failures)
