"""Running the asset graph: plans and in-process runs for the command line (`runs`), the Dagster
instance's run launcher, the dry-run cost estimate and the webserver. It sits above the
definitions (bridge_assets.definitions) and below the command line."""
