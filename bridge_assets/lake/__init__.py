"""The storage core: the lake's tables (`store`, over DuckDB or a DuckLake: `ducklake`), the
Dagster resource that hands its location to the assets (`resource`), and snapshots of what a
run read (`snapshots`)."""
