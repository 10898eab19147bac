"""BRIDGE: find and fill the holes in IR benchmarks (DREAM), as a Dagster code location."""
