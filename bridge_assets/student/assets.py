"""Dagster wiring of the student stage, per dataset: bridge_qrels -> student_annotator ->
student_scores (annotator.py does the work), and student_rerank_run (rerank.py): the runs of
the registry's evaluation-only systems (`student_rerank`, `trained_retriever`), which
retrieval_metrics reads.

student_annotator trains (or finds again) the student of the dataset's verified labels and
records what it learned from: the table `student_annotator` (one row: its key, weights hash,
settings, figures, the lake snapshot it read) and `student_training_set` (every label it saw,
with its split). Its data version is the student's key, so student_scores, and what reads it,
are stale only when the labels or settings changed. student_scores gives every candidate-pool
pair the student's calibrated P(relevant).
"""

# No `from __future__ import annotations`: Dagster resolves dg.Config annotations at runtime.
import hashlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import dagster as dg
import polars as pl
from pydantic import Field

from bridge_assets.labeling.pairs import load_pairs
from bridge_assets.lake import ducklake, snapshots
from bridge_assets.lake.resource import DuckDBStore
from bridge_assets.lake.store import one_row
from bridge_assets.llm.resource import LLMResource
from bridge_assets.pipeline import asset_config
from bridge_assets.pipeline.partitions import dataset_partitions
from bridge_assets.pipeline.staleness import external_input, reuse_when_current
from bridge_assets.settings import env
from bridge_assets.student.annotator import (
    TrainingSet,
    calibration_queries,
    ensure_student,
    score_pairs,
    splits,
    student_folder,
    training_set,
)
from bridge_assets.student.model import StudentSettings, untrainable

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

    from bridge_assets.retrieval.registry import RetrieverRegistry

GROUP = "student"
READS: dict[str, tuple[str, ...]] = {
    # debate_labels: the teacher's P(yes) of the debated verified labels, read to distil them
    "student_annotator": ("bridge_qrels", "debate_labels", "queries", "corpus"),
    "student_scores": ("student_annotator", "candidate_pool", "queries", "corpus"),
    # retrieval_run: every retriever's run of the dataset (Dagster maps the dataset partition
    # to all of them), for the first stages and the trained retrievers' hard negatives;
    # original_qrels: a trained retriever's positives with `labels: original`; candidate_pool:
    # what its LLM selects useful candidates from with `labels: utility`
    "student_rerank_run": ("bridge_qrels", "debate_labels", "queries", "corpus", "retrieval_run",
                           "original_qrels", "candidate_pool"),
}
_DEFAULTS = StudentSettings()


class StudentConfig(dg.Config):
    """How the student is trained (bridge_assets/student/model.py StudentSettings)."""

    base_model: str = Field(_DEFAULTS.base_model, description="The encoder it starts from: a "
                            "model of resources/retrievers.yaml (sentence-transformers).")
    epochs: int = Field(_DEFAULTS.epochs, ge=1)
    learning_rate: float = Field(_DEFAULTS.learning_rate, gt=0)
    batch_size: int = Field(_DEFAULTS.batch_size, ge=1)
    max_length: int = Field(_DEFAULTS.max_length, ge=16)
    calibration_share: float = Field(_DEFAULTS.calibration_share, ge=0.0, lt=1.0,
                                     description="Share of the queries held out to calibrate.")
    max_labels: int = Field(_DEFAULTS.max_labels, ge=2, description="At most this many labels "
                            "train it (half from each class at most) and as many calibrate it.")
    teacher_weight: float = Field(_DEFAULTS.teacher_weight, ge=0.0, le=1.0, description="Distillation: "
                                  "a debated label's target mixes in the debate's P(yes) at this "
                                  "weight (0: the verified label only; docs/student.md).")
    low_memory: bool = Field(_DEFAULTS.low_memory, description="Train to the same weights in "
                             "less memory and more time (all-mpnet-base-v2: 5.9 -> 2.9 GiB at "
                             "1.6-1.7x the time; docs/student.md).")
    seed: int = _DEFAULTS.seed
    precision: str = Field(_DEFAULTS.precision, description="auto | float32 | bfloat16: the "
                           "encoder's arithmetic when it scores (auto: bfloat16 where the CPU "
                           "computes it natively).")

    def settings(self) -> StudentSettings:
        return StudentSettings(**self.model_dump())


def _lake_snapshot(store: DuckDBStore) -> int | str:
    """The DuckLake snapshot current now ("n/a" on a DuckDB file, which keeps no history)."""
    if store.lake.ducklake is None:
        return snapshots.NOT_AVAILABLE
    with store.connect() as con:
        return ducklake.current_snapshot(con)


ANNOTATOR_SCHEMA: "dict[str, PolarsDataType]" = {
    "dataset": pl.Utf8, "student_key": pl.Utf8, "not_trained": pl.Utf8, "weights_hash": pl.Utf8,
    "folder": pl.Utf8, "base_model": pl.Utf8, "settings": pl.Utf8, "training_set_version": pl.Utf8,
    "labels": pl.Int64, "relevant": pl.Int64, "trained_on": pl.Int64, "calibrated_on": pl.Int64,
    "calibration": pl.Utf8, "held_out_ece": pl.Float64, "held_out_auroc": pl.Float64,
    "calibration_queries": pl.List(pl.Utf8), "learned_from_snapshot": pl.Utf8, "train_seconds": pl.Float64}


def annotator_frame(row: dict) -> pl.DataFrame:
    """The one row of `student_annotator` (a student, or `not_trained` saying why none)."""
    return pl.DataFrame([{name: row.get(name) for name in ANNOTATOR_SCHEMA}], schema=ANNOTATOR_SCHEMA)


def training_frame(data: TrainingSet, dataset: str, key: str | None, split: list[str] | None) -> pl.DataFrame:
    """`student_training_set`: every label it saw, its split, the teacher's P(yes) it distilled
    (null where none), the student that learned from it."""
    labels = data.labels if "teacher" in data.labels.columns else \
        data.labels.with_columns(pl.lit(None, dtype=pl.Float64).alias("teacher"))
    return labels.with_columns(pl.lit(dataset).alias("dataset"),
                                    pl.Series("split", split or [None] * data.labels.height, dtype=pl.Utf8),
                                    pl.lit(key, dtype=pl.Utf8).alias("student_key"))


@dg.asset(
    partitions_def=dataset_partitions, group_name=GROUP, deps=list(READS["student_annotator"]),
    code_version="1",
    description="A small cross-encoder (DIRAS's student) trained on the dataset's verified labels "
                "(bridge_qrels: original, human, DREAM consensus, filter, verified imports; never "
                "pending pairs or unverified guesses) and Platt-calibrated on held-out queries. "
                "Stored under <data lake>/students/<dataset>/<key>/; retrained only when the "
                "labels or settings change.",
)
@reuse_when_current
def student_annotator(context: dg.AssetExecutionContext, config: StudentConfig,
                      store: DuckDBStore) -> dg.MaterializeResult:
    dataset = context.partition_key
    resolved = asset_config.for_run(context, config)  # defaults < the dataset's entry < run config
    settings = resolved.config.settings()
    learned_from = _lake_snapshot(store)
    with snapshots.inputs(store, dataset, READS["student_annotator"]) as con:
        data = training_set(con, dataset, teacher=settings.teacher_weight > 0)
    row = {"dataset": dataset, "base_model": settings.base_model,
           "settings": json.dumps(settings.model_dump(), sort_keys=True),
           "training_set_version": data.version, "labels": data.labels.height,
           "relevant": int(data.labels["label"].sum()), "learned_from_snapshot": str(learned_from)}
    problem = untrainable(data.examples(), settings)
    if problem:  # a dataset can be short of labels (all relevant, say): no student, said so
        context.log.warning(f"{dataset}: no student annotator: {problem}")
        store.write_partitions({"student_annotator": annotator_frame({**row, "not_trained": problem}),
                                "student_training_set": training_frame(data, dataset, None, None)},
                               dataset=dataset)
        return dg.MaterializeResult(metadata={**resolved.metadata(), "not_trained": problem,
                                              "labels": row["labels"],
                                              "relevant": row["relevant"]},
                                    data_version=dg.DataVersion(f"none-{data.version}"))
    stored = ensure_student(store.lake.folder, dataset, data, settings)
    report = stored.meta["report"]
    held_out = report["held_out"].get("after") or {}
    row |= {"student_key": stored.key, "weights_hash": stored.meta["weights_hash"],
            "folder": str(stored.folder), "trained_on": report["trained_on"],
            "calibrated_on": report["calibrated_on"], "calibration": report["calibration"],
            "held_out_ece": held_out.get("ece"), "held_out_auroc": held_out.get("auroc"),
            "calibration_queries": calibration_queries(data, settings), "train_seconds": report["seconds"]}
    store.write_partitions({"student_annotator": annotator_frame(row),
                            "student_training_set": training_frame(data, dataset, stored.key,
                                                                   splits(data, settings))},
                           dataset=dataset)
    verb = "trained" if stored.trained_now else "unchanged labels: kept"
    context.log.info(f"{dataset}: student {stored.key} {verb} ({report['examples']} verified labels, "
                     f"{report['relevant']} relevant; calibration {report['calibration']})")
    return dg.MaterializeResult(
        metadata={**resolved.metadata(), "student_key": stored.key,
                  "weights_hash": stored.meta["weights_hash"],
                  "trained_now": stored.trained_now, "labels": report["examples"],
                  "relevant": report["relevant"], "sources": json.dumps(report["sources"]),
                  "calibration": report["calibration"],
                  "held_out_ece": held_out.get("ece"), "held_out_auroc": held_out.get("auroc"),
                  "learned_from_snapshot": str(learned_from),
                  "folder": dg.MetadataValue.path(str(stored.folder))},
        data_version=dg.DataVersion(stored.key))


@dg.asset(
    partitions_def=dataset_partitions, group_name=GROUP, deps=list(READS["student_scores"]),
    code_version="1",
    description="The student's calibrated P(relevant) of every candidate-pool pair (all of "
                "them, debated or not), with the key of the student that scored it.",
)
@reuse_when_current
def student_scores(context: dg.AssetExecutionContext, store: DuckDBStore) -> dg.MaterializeResult:
    from bridge_assets.student.model import Student

    dataset = context.partition_key
    with snapshots.inputs(store, dataset, READS["student_scores"]) as con:
        key, problem = one_row(con, "select student_key, not_trained from student_annotator "
                                    "where dataset = ?", [dataset])
        pairs = load_pairs(con, dataset, "select distinct query_id, doc_id from candidate_pool "
                                         "where dataset = $dataset") if key else []
    if key is None:
        context.log.warning(f"{dataset}: no student annotator ({problem}): no pair scored")
    scores = score_pairs(Student.load(student_folder(store.lake.folder, dataset, key)), pairs) if key else []
    frame = pl.DataFrame({"dataset": [dataset] * len(pairs),
                          "query_id": [p.query_id for p in pairs], "doc_id": [p.doc_id for p in pairs],
                          "p_relevant": scores, "student_key": [key] * len(pairs)},
                         schema={"dataset": pl.Utf8, "query_id": pl.Utf8, "doc_id": pl.Utf8,
                                 "p_relevant": pl.Float64, "student_key": pl.Utf8})
    store.write_partitions({"student_scores": frame}, dataset=dataset)
    return dg.MaterializeResult(
        metadata={"dagster/row_count": frame.height, "student_key": key or f"none ({problem})",
                  "above_half": int((frame["p_relevant"] >= 0.5).sum()) if frame.height else 0},
        data_version=snapshots.frame_version(frame))


def evaluation_system_hashes(registry: "RetrieverRegistry | None" = None) -> dict[str, str]:
    """The active profile's evaluation-only systems and their configuration hashes (what makes a
    stored student_rerank_run out of date when the registry changes)."""
    from bridge_assets.retrieval.registry import load_registry

    registry = registry or load_registry()
    return {name: registry.config_hash(name) for name in registry.evaluation_systems()}


@dg.asset(
    partitions_def=dataset_partitions, group_name=GROUP, deps=list(READS["student_rerank_run"]),
    code_version="1",
    description="The runs of the registry's evaluation-only systems: student_rerank (a first "
                "stage's top documents re-scored by students trained on the verified labels of the "
                "other query folds) and trained_retriever (a bi-encoder fine-tuned on the labels of "
                "the other query folds), so no query is ranked by a model that learned its labels. "
                "retrieval_metrics evaluates them beside the pooled systems; candidate_pool never "
                "reads them. Empty when the active profile declares none.",
)
@reuse_when_current
def student_rerank_run(context: dg.AssetExecutionContext, config: StudentConfig,
                       store: DuckDBStore, llm: LLMResource) -> dg.MaterializeResult:
    from bridge_assets.retrieval.registry import load_registry
    from bridge_assets.student.rerank import RERANK_SCHEMA, EvaluationRuns, RerankInputs, run_evaluation_systems

    dataset = context.partition_key
    resolved = asset_config.for_run(context, config)
    registry = load_registry()
    systems = registry.evaluation_systems()
    found = EvaluationRuns(pl.DataFrame(schema=RERANK_SCHEMA))
    if systems:
        with snapshots.inputs(store, dataset, READS["student_rerank_run"]) as con:
            inputs = RerankInputs.read(con, dataset, teacher=resolved.config.teacher_weight > 0)
        found = run_evaluation_systems(registry, systems, inputs, resolved.config.settings(),
                                       lake_folder=store.lake.folder, dataset=dataset, progress=context.log.info,
                                       generate=llm.generate_fn(context.run_id, context.log.info))
    for name, why in found.not_run.items():
        context.log.warning(f"{dataset}: no run of {name}: {why}")
    store.write_partitions({"student_rerank_run": found.frame}, dataset=dataset)
    llm_stats = {name: stats.as_metadata() for name, stats in llm.stats().items()}
    return dg.MaterializeResult(
        metadata={**resolved.metadata(), "dagster/row_count": found.frame.height,
                  "systems": json.dumps(evaluation_system_hashes(registry), sort_keys=True),
                  "not_run": json.dumps(found.not_run, sort_keys=True),
                  "details": json.dumps(found.details, sort_keys=True),
                  **({"llm": llm_stats} if llm_stats else {})},
        data_version=snapshots.frame_version(found.frame))


student_rerank_job = dg.define_asset_job(
    "student_rerank_job", selection=dg.AssetSelection.assets(student_rerank_run).downstream(),
    description="student_rerank_run of one dataset and everything downstream of it (the metrics, "
                "the analyses, the report).")


@dg.sensor(job=student_rerank_job, minimum_interval_seconds=env.sensor_interval(60), default_status=dg.DefaultSensorStatus.RUNNING,
           description="Runs student_rerank_job for every dataset whose student_rerank_run was built "
                       "under other evaluation-only systems (student_rerank, trained_retriever) than the registry's "
                       "active profile now declares: one added, changed or removed is benchmarked "
                       "as `bridge run` would. (The pooled systems have retriever_registry_sensor.)")
def evaluation_systems_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
    current = json.dumps(evaluation_system_hashes(), sort_keys=True)
    requests = []
    for dataset in dataset_partitions.get_partition_keys():
        built = context.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=student_rerank_run.key, asset_partitions=[dataset]), limit=1).records
        materialization = built[0].asset_materialization if built else None
        if materialization is None:  # never built: the main job builds it with everything else
            continue
        if materialization.metadata.get("systems") == dg.MetadataValue.text(current):
            continue
        digest = hashlib.sha256(current.encode()).hexdigest()[:16]
        requests.append(dg.RunRequest(partition_key=dataset, run_key=f"student_rerank:{dataset}:{digest}"))
    if requests:
        return dg.SensorResult(run_requests=requests)
    return dg.SkipReason("every built student_rerank_run holds the registry's evaluation-only systems")


@external_input("student_rerank_run")
def _evaluation_systems_changed(dataset: str, metadata: dict[str, Any],
                   resources: Mapping[str, Any]) -> str | None:
    if metadata.get("systems") != json.dumps(evaluation_system_hashes(), sort_keys=True):
        return "the registry's evaluation-only systems changed"
    return None
