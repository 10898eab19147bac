"""The Dagster code location. Each stage exports its own assets, checks, jobs, sensors and
schedules (`<stage>/definitions.py`, a `defs`); this module merges them and adds the resources.
(The stages' modules are imported, not their `defs`: Dagster loads the one Definitions object
at this module's scope.)"""

import warnings

import dagster as dg

from bridge_assets.analysis import definitions as analysis
from bridge_assets.evaluation import definitions as evaluation
from bridge_assets.human import definitions as human
from bridge_assets.human.votes_resource import VotesStore
from bridge_assets.ingest import definitions as ingest
from bridge_assets.labeling import definitions as labeling
from bridge_assets.lake.resource import DuckDBStore
from bridge_assets.llm.resource import LLMResource
from bridge_assets.pipeline import automation, staleness
from bridge_assets.pipeline.executors import executor_from_env
from bridge_assets.qrels import definitions as qrels
from bridge_assets.reports import definitions as reports
from bridge_assets.retrieval import definitions as retrieval
from bridge_assets.student import definitions as student

STAGES = [ingest, retrieval, labeling, human, qrels, student, analysis, reports, evaluation]

# What `make run` / `bridge run` materializes for one dataset: the whole pipeline. The labeler
# evaluation runs on gold sets, not datasets, so it is left out; human_labels runs with
# whatever votes exist (the votes sensor refreshes it, and everything after it, as votes arrive).
main_selection = dg.AssetSelection.all() - dg.AssetSelection.groups(evaluation.GROUP)
# What the daemon keeps current by itself: everything after the retrieval runs (automation.py).
automated_selection = automation.automated(main_selection)

# One store: it holds where the lake (and the votes store) lives; the LLM resource and the votes
# store take it (nested), so the call ledger and the votes are that lake's.
_store = DuckDBStore()

with warnings.catch_warnings():
    # map_resolved_asset_specs is a Dagster preview API: its warning would open every `bridge run`
    # and every step process's log, and tells a user nothing they can act on
    warnings.simplefilter("ignore", dg.PreviewWarning)
    defs = dg.Definitions.merge(
        *(stage.defs for stage in STAGES),
        dg.Definitions(resources={"store": _store, "llm": LLMResource(store=_store),
                                  "votes": VotesStore(store=_store)},
                       sensors=[automation.sensor(automated_selection)],
                       executor=executor_from_env()),  # $BRIDGE_EXECUTOR: multiprocess (default) | dask | in_process
    ).map_resolved_asset_specs(func=automation.with_condition, selection=automated_selection)

# staleness (below the stages) judges a partition against the whole graph and reads the inputs
# outside the lake (the votes...) through the resources, which only this module assembles
staleness.use_definitions(defs.resolve_asset_graph, defs.resources or {})
