"""What an asset runs with for one dataset, whichever door started the run: `bridge run`, the
UI's Materialize button, a backfill, a sensor, a schedule, a GraphQL launch, `dagster job
execute`. One rule, applied inside the run from its partition:

    the asset's defaults  <  the dataset's `pipeline:` entry (resources/datasets.yaml)
                          <  the run config its launcher gave explicitly

so no launcher needs to know the registry, and the UI's empty run config builds the same
tables as the command line. Each materialization shows every setting and where it came from
(`settings` in its metadata) and a hash of them and of the files outside the lake the asset
reads (`settings_hash`: LLM profiles and prompts for the LLM stages, the known holes for the
report), which `bridge run` compares to decide whether a partition is out of date.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

import dagster as dg
from pydantic import ValidationError

from bridge_assets.errors import DatasetError
from bridge_assets.registry.relevance import RelevanceSettings

DEFAULT, DATASET, RUN_CONFIG = "default", "dataset", "run config"

C = TypeVar("C", bound=dg.Config)


def dataset_pipeline(dataset: str) -> dict[str, dict[str, Any]]:
    """The dataset's `pipeline:` entry: {asset name: {field: value}}."""
    from bridge_assets.registry.datasets import get_dataset

    return get_dataset(dataset).pipeline


def dataset_of(partition_key: str | dg.MultiPartitionKey) -> str:
    """The dataset a partition belongs to (`dataset` or `dataset|retriever`)."""
    if isinstance(partition_key, dg.MultiPartitionKey):
        return partition_key.keys_by_dimension["dataset"]
    return partition_key


# What an asset's output depends on beyond its settings, declared on the asset itself (a tag of
# its spec, `READS_TAG: "llm_files.relevance"`): the LLM profiles and prompt templates (the
# calling stages), the dataset's `relevance:` entry (what relevant means, what people review:
# shown and hashed with the settings), the dataset's known holes (the report).
READS_TAG = "bridge/reads"
LLM_FILES, RELEVANCE, KNOWN_HOLES = "llm_files", "relevance", "known_holes"


def reads_tags(*reads: str) -> dict[str, str]:
    """The tags an asset spec declares its reads with."""
    unknown = set(reads) - {LLM_FILES, RELEVANCE, KNOWN_HOLES}
    if unknown:
        raise ValueError(f"unknown reads {sorted(unknown)}")  # a programming error
    return {READS_TAG: ".".join(sorted(reads))}  # (a tag value has no spaces)


def declared_reads(assets_def: dg.AssetsDefinition) -> frozenset[str]:
    """What the op writing `assets_def` declares it reads beyond its settings (all its specs)."""
    return frozenset(read for spec in assets_def.specs
                     for read in (spec.tags or {}).get(READS_TAG, "").split(".") if read)


def dataset_relevance(dataset: str) -> dict[str, Any]:
    """The dataset's `relevance:` entry, every field (defaults filled in)."""
    from bridge_assets.registry.datasets import get_dataset

    return get_dataset(dataset).relevance.model_dump(mode="json")


def input_files(dataset: str, reads: frozenset[str]) -> list[Path]:
    from bridge_assets.llm.profiles import MODELS_FILE, MODELS_PATH
    from bridge_assets.paths import PROMPTS_DIR
    from bridge_assets.registry import registry_files
    from bridge_assets.registry.datasets import get_dataset

    files: list[Path | None] = []
    if LLM_FILES in reads:
        files += [MODELS_PATH, registry_files.user_file(MODELS_FILE), *sorted(PROMPTS_DIR.glob("*"))]
    if KNOWN_HOLES in reads:
        spec = get_dataset(dataset)
        if spec.known_holes:
            files.append(spec.resolve(spec.known_holes, "known_holes"))
    return [f for f in files if f is not None]


def files_digest(files: Iterable[Path]) -> str:
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.name).encode())
        digest.update(path.read_bytes() if path.is_file() else b"<absent>")
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class Resolved(Generic[C]):
    """An asset's effective settings and, per field, where its value came from."""

    config: C
    sources: dict[str, str] = field(default_factory=dict)
    inputs: str = ""  # digest of the files outside the settings it depends on (input_files)
    relevance: dict[str, Any] | None = None  # the dataset's `relevance:` entry, where it applies

    @property
    def values(self) -> dict[str, Any]:
        return self.config.model_dump(mode="json")

    @property
    def hash(self) -> str:
        parts: list[Any] = [type(self.config).__name__, self.values, self.inputs]
        if self.relevance is not None:  # absent elsewhere, so the hashes already stored stay
            parts.append(self.relevance)
        text = json.dumps(parts, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def table(self) -> str:
        lines = ["| setting | value | from |", "| --- | --- | --- |"]
        lines += [f"| {name} | {json.dumps(value)} | {self.sources[name]} |"
                  for name, value in self.values.items()]
        return "\n".join(lines)

    def metadata(self) -> dict[str, Any]:
        """For the materialization: the table (the UI shows it) and its hash."""
        def named(source: str) -> str:
            return ", ".join(name for name, where in self.sources.items() if where == source) or "none"

        metadata = {"settings": dg.MetadataValue.md(self.table()), "settings_hash": self.hash,
                    "settings_from_dataset": named(DATASET), "settings_from_run_config": named(RUN_CONFIG)}
        if self.relevance is not None:
            definition = self.relevance.get("definition")
            metadata["relevance_definition"] = definition or "default (answer_support with short answers, " \
                "narrative with a TREC topic, useful otherwise; a query's own wins)"
            metadata["relevance_settings"] = dg.MetadataValue.json(self.relevance)
        return metadata


def resolve(config_cls: type[C], dataset: str, assets: Iterable[str],
            explicit: Mapping[str, Any] | None = None,
            pipeline: Mapping[str, Mapping[str, Any]] | None = None,
            reads: frozenset[str] = frozenset()) -> Resolved[C]:
    """`config_cls` for the op writing `assets` on `dataset`: defaults < the dataset's entry
    (a multi-asset's entries merged) < `explicit`; `reads`: what the op declares it reads beyond
    them (declared_reads). A field the class does not have, or a value it refuses, is a
    DatasetError naming the dataset's entry."""
    # the dataset's entries, from the registry unless given (then its relevance entry's defaults)
    relevance = None
    if RELEVANCE in reads:
        relevance = dataset_relevance(dataset) if pipeline is None else \
            RelevanceSettings().model_dump(mode="json")
    pipeline = dataset_pipeline(dataset) if pipeline is None else pipeline
    entry: dict[str, Any] = {}
    for name in assets:
        entry.update(pipeline.get(name) or {})
    explicit = dict(explicit or {})
    applicable = getattr(config_cls, "applicable_entry", None)
    if applicable is not None:  # a config whose explicit values may set the entry aside
        entry = applicable(entry, explicit)
    config = _validated(config_cls, dataset, assets, entry, explicit)
    sources = {name: RUN_CONFIG if name in explicit else DATASET if name in entry else DEFAULT
               for name in type(config).model_fields}
    return Resolved(config, sources, files_digest(input_files(dataset, reads)), relevance)


def _validated(config_cls: type[C], dataset: str, assets: Iterable[str], entry: dict[str, Any],
               explicit: dict[str, Any]) -> Any:
    """The entry under the explicit values, validated by the config class, or by the model its
    `build_settings` makes (a permissive config whose keys another model defines: the labeler's)."""
    where = ", ".join(assets)
    build = getattr(config_cls, "build_settings", None)
    if build is not None:
        try:
            return build({**entry, **explicit})
        except ValueError as exc:
            raise DatasetError(f"dataset '{dataset}': the settings of {where}: {exc}",
                               field="pipeline") from None
    unknown = sorted(set(entry) - set(config_cls.model_fields))
    if unknown:
        raise DatasetError(f"dataset '{dataset}': {where} has no setting "
                           f"{', '.join(unknown)} (its settings: {', '.join(config_cls.model_fields)})",
                           field="pipeline")
    try:
        return config_cls(**{**entry, **explicit})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise DatasetError(f"dataset '{dataset}': the settings of {where} do not fit "
                           f"{config_cls.__name__} ({problems})", field="pipeline") from None


def explicit_config(context: dg.AssetExecutionContext) -> dict[str, Any]:
    """The op's config exactly as the run's launcher gave it (Dagster fills the defaults in
    `config`, so only the run's own record tells an explicit value from a default)."""
    # the run config's `ops` section, a mapping (Dagster types a run config's values as object)
    ops = cast(Mapping[str, Any], (context.run.run_config or {}).get("ops") or {})
    return dict((ops.get(context.op_execution_context.op.name) or {}).get("config") or {})


def for_run(context: dg.AssetExecutionContext, config: C) -> Resolved[C]:
    """The settings this run must use for the asset's partition (see the module docstring)."""
    assets = [key.to_user_string() for key in context.assets_def.keys]
    return resolve(type(config), dataset_of(context.partition_key), assets, explicit_config(context),
                   reads=declared_reads(context.assets_def))
