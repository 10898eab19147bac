"""Ingest: dataset registry (resources/datasets.yaml) and loaders, one per source kind."""
