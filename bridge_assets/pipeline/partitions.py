"""Partitions: `dataset` (static, from resources/datasets.yaml) and `retriever` (dynamic, one
per entry of resources/retrievers.yaml, kept in sync by a sensor)."""

from __future__ import annotations

import dagster as dg

from bridge_assets.registry.registry_files import dataset_names

dataset_partitions = dg.StaticPartitionsDefinition(dataset_names())

# One partition per entry of resources/retrievers.yaml; the retriever sensor adds and retires them.
retriever_partitions = dg.DynamicPartitionsDefinition(name="retriever")

# Retrieval runs are per (dataset, retriever).
run_partitions = dg.MultiPartitionsDefinition(
    {"dataset": dataset_partitions, "retriever": retriever_partitions})
