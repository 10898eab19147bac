"""Partitions: `dataset` (static, from resources/datasets.yaml) and `retriever` (dynamic, one
per entry of resources/retrievers.yaml, kept in sync by a sensor)."""

from __future__ import annotations

import dagster as dg

from bridge_assets.registry.registry_files import dataset_names

dataset_partitions = dg.StaticPartitionsDefinition(dataset_names())

# One partition per entry of resources/retrievers.yaml; the retriever sensor adds and retires them
# (through the instance, by this name: the definition types its name as optional).
RETRIEVER_PARTITIONS = "retriever"
retriever_partitions = dg.DynamicPartitionsDefinition(name=RETRIEVER_PARTITIONS)

# Retrieval runs are per (dataset, retriever).
run_partitions = dg.MultiPartitionsDefinition(
    {"dataset": dataset_partitions, "retriever": retriever_partitions})
