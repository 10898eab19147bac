"""The retrieval stage: the systems of resources/retrievers.yaml, run per (dataset, retriever).

Plain functions (no Dagster):
    registry.load_registry()            the registry (profiles, systems, models, config hashes)
    systems.run_retriever(dataset, system, corpus, queries, k=...) -> RunResult(run, config_hash, metadata)
    runs.top_k / rank_problems / write_trec / read_trec / export_trec_run
    weights.resolve_model / availability   where a model's weights are, whether a system loads here
    run_files.read_run_file / register_run_file   external TREC runs as `run_file` systems

Dagster wiring: assets.py (retrieval_run, retrieval_job, retrieval_run_is_valid,
retrieval_rebenchmark_schedule), sensors.py (retriever_registry_sensor, sync_partitions,
run_files_sensor); command line: cli.py (`bridge retrievers list|add|export`, `bridge runs import`).
"""
