"""`bridge label-eval`: evaluate one labeler and print its figures.

    bridge label-eval --dataset demo                  # the labeler the pipeline runs for demo,
                                                      # on the pairs it labelled, against the
                                                      # dataset's known holes
    bridge label-eval --gold FILE --method dream --set rounds=3 --profile qwen-1.5b
    bridge label-eval --gold FILE --method dream --persistence 4   # debates go on to round 4:
                                                      # consensus survival and flips by round

Register on the `bridge` app as `app.command("label-eval")(label_eval_command)`. Every model
call goes through the data lake's LLM call ledger, so a repeated command is answered from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
import yaml

from bridge_assets.cli.errors import fail as _fail
from bridge_assets.errors import BridgeError
from bridge_assets.labeling.labeler import LABELERS

if TYPE_CHECKING:
    from bridge_assets.evaluation.goldsets import MethodSpec
    from bridge_assets.evaluation.runner import MethodResult
    from bridge_assets.labeling.labeler import LabelItem
    from bridge_assets.llm.types import LLMRequest, LLMResult


def _shard(text: str) -> tuple[int, int]:
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise BridgeError(f"--shard takes K/N (e.g. 0/2), got {text!r}") from None
    if not 0 <= index < count:
        raise BridgeError(f"--shard K/N needs 0 <= K < N, got {text!r}")
    return index, count


def _settings(method: str | None, assignments: list[str], profiles: list[str]) -> dict[str, Any]:
    """The labeler settings typed on the command line (`--set key=value`, values read as YAML)."""
    values: dict[str, Any] = {} if method is None else {"labeler": method}
    for text in assignments:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise BridgeError(f"--set takes key=value (e.g. rounds=3), got {text!r}")
        values[key.strip()] = yaml.safe_load(value)
    if profiles:
        values["models"] = list(profiles)
    return values


def label_eval_command(
    gold: Path = typer.Option(None, "--gold", help="Gold-set JSONL: id, query, answers, chunk, label "
                              "(0/1). Without it, --dataset's labelled pairs against its known holes."),
    dataset: str = typer.Option(None, "--dataset", "-d", help="Evaluate the labeler the pipeline runs "
                                "for this dataset (its `pipeline:` settings; --method and --set "
                                "on top)."),
    method: str = typer.Option(None, "--method", help=f"The labeler: {' | '.join(LABELERS)}, or "
                               "module:Class. Default: the dataset's (with --dataset), else dream."),
    assignments: list[str] = typer.Option(None, "--set", help="A labeler setting, key=value "
                                          "(repeatable), e.g. --set rounds=3 --set answer_check=off. "
                                          "dream: rounds, agents, stance_order, prompt, fewshot, "
                                          "answer_first, reason_words, evidence_check, answer_check, "
                                          "min_confidence, escalation_budget(_ratio), adjudicate, "
                                          "adjudicator_model, grade_consensus; judge: reason_words, "
                                          "fewshot; lara: escalation_ratio; utilrank: top_percent; "
                                          "every labeler: temperature, definition (what relevant "
                                          "means: answer_support | useful | narrative | a text "
                                          "of your own; default: the dataset's, else answer_support "
                                          "with short answers, useful without)."),
    profile: list[str] = typer.Option(None, "--profile", help="LLM profile(s) of models.yaml (the "
                                      "`models` setting); dream takes one for all agents or one per "
                                      "agent. Default: the labeler's role's."),
    prefilter: list[str] = typer.Option(None, "--prefilter", help="judge/dream: a filter profile run "
                                        "first, as the pipeline does: a pair it says no to is labelled "
                                        "not relevant, only the others are judged (repeatable)."),
    limit: int = typer.Option(None, "--limit", min=1, help="Only the first N triplets, classes alternating."),
    shard: str = typer.Option(None, "--shard", help="K/N: only every N-th of the (limited) triplets, "
                              "starting at the K-th (0-based). Run the N shards in parallel to fill "
                              "the call ledger, then once without --shard for the whole table (all "
                              "from the ledger)."),
    threads: int = typer.Option(None, "--threads", min=1, help="llama.cpp CPU threads for this run "
                                "(not part of the cache key; 1 is fastest on a busy CPU)."),
    persistence: int = typer.Option(None, "--persistence", min=2, help="dream: debate every pair to "
                                    "round R even after its agents agree (an evaluation; the "
                                    "labels and figures stay those of the debate that stops, the "
                                    "cost counts the extra rounds) and print how often a consensus "
                                    "reached at round r survives to later rounds and the agents' "
                                    "flips by opening stance and round. R: at least the debate's rounds."),
    reliability: Path = typer.Option(None, "--reliability", help="Also draw the reliability diagram of the "
                                     "method's P(relevant) (the bins of its ECE) to this PNG and print its bins."),
    items_out: Path = typer.Option(None, "--items", help="Also write each scored triplet's outcome to "
                                   "this JSONL file: id, domain, gold, label (null where escalated), "
                                   "escalated, resolved, score (the method's P(relevant), if any), detail."),
    as_json: bool = typer.Option(False, "--json", help="Print the figures as JSON."),
) -> None:
    """Label a gold set (or a dataset's labelled pairs) with one labeler; print recalls, bAcc,
    escalation ratio, cost and the labeler's config hash (the key the pipeline stores its labels
    under)."""
    from bridge_assets.evaluation.runner import (
        format_persistence_tables,
        format_reliability,
        format_stability,
        format_table,
        summary_json,
        write_items,
    )

    if gold is None and dataset is None:
        _fail("give --gold FILE, or --dataset D to evaluate its labeler against its known holes")
    spec = _method_spec(dataset, _settings(method, assignments or [], profile or []), prefilter or [])
    source, items = _eval_items(gold, dataset, limit, shard)
    result = _run(spec, items, threads, persistence or 0,
                  context=f"label-eval:{gold.name if gold else dataset}:{spec.method}")
    drawn = format_reliability(result, reliability) if reliability is not None else None
    if items_out is not None:
        write_items(result, items_out)
    if as_json:
        typer.echo(summary_json(result))
        return
    typer.echo(f"{source}  ({len(result.items)} scored of {len(items)}, labeler {spec.method}, "
               f"models {', '.join(result.models)}, relevance {spec.definition or 'default'}, "
               f"config hash {result.config_hash})")
    typer.echo(format_table([result.summary()]))
    if result.stability:
        typer.echo(format_stability(result))
    if persistence:
        typer.echo(format_persistence_tables(result))
    if drawn:
        typer.echo(drawn)


def _method_spec(dataset: str | None, typed: dict[str, Any], prefilter: list[str]) -> MethodSpec:
    """The labeler to evaluate: `typed` (on the dataset's pipeline settings, with --dataset), its
    prefilter, and the relevance definition (the dataset's, or the gold set's default: it is not
    a labeler setting)."""
    from bridge_assets.evaluation.goldsets import MethodSpec

    definition = typed.pop("definition", None)
    if definition is None and dataset:
        from bridge_assets.registry.datasets import get_dataset

        definition = get_dataset(dataset).relevance.definition
    settings = _dataset_settings(dataset, typed) if dataset else typed
    return MethodSpec.parse(f"{dataset}:{settings.get('labeler', 'dream')}" if dataset
                            else settings.get("labeler", "dream"),
                            {**settings, "prefilter": list(prefilter),
                             **({"definition": definition} if definition is not None else {})})


def _eval_items(gold: Path | None, dataset: str | None, limit: int | None,
                shard: str | None) -> tuple[str, list[LabelItem]]:
    """What the figures are computed on (said in the output's first line), and its items: the
    gold set's first `limit` (classes alternating), or the dataset's labelled pairs; one shard."""
    from bridge_assets.evaluation.goldsets import read_goldset, stratified_head

    if gold is not None:
        source = str(gold)
        items = [t.item() for t in stratified_head(read_goldset(gold), limit)]
    else:
        assert dataset is not None  # the command asks for --gold or --dataset
        source = f"dataset {dataset}: the pairs its labeler labelled, scored against its known holes"
        items = _dataset_items(dataset)
    if shard:
        index, count = _shard(shard)
        items = items[index::count]
    return source, items


def _run(spec: MethodSpec, items: list[LabelItem], threads: int | None, persistence: int, *,
         context: str) -> MethodResult:
    """run_method with one LLM client per profile (llama.cpp ones on `threads`), closed after."""
    from bridge_assets.evaluation.runner import run_method
    from bridge_assets.llm import LLMClient, get_profile
    from bridge_assets.llm.profiles import role_profiles

    clients: dict[str, LLMClient] = {}

    def generate(name: str, requests: Sequence[LLMRequest]) -> list[LLMResult]:
        if name not in clients:
            chosen = get_profile(name)
            if threads is not None and chosen.backend == "llama_cpp":
                chosen = chosen.model_copy(update={"threads": threads})
            clients[name] = LLMClient(chosen)
        return clients[name].generate(requests, context=context)

    try:
        return run_method(spec, items, generate, profiles_for=role_profiles, persistence=persistence)
    finally:
        for client in clients.values():
            client.close()


def _dataset_settings(dataset: str, typed: dict[str, Any]) -> dict[str, Any]:
    """The labeler settings the pipeline resolves for `dataset`, `typed` on top (as run config)."""
    from bridge_assets.orchestration.runs import asset_settings

    return asset_settings("debate_labels", dataset, {"debate_labels": typed}).model_dump()


def _dataset_items(dataset: str) -> list:
    """The pairs the dataset's labeler labelled in the lake, each with what the dataset's known
    holes say of it (scored where the key decides; the others are labelled, as in the run, but
    not scored)."""
    from bridge_assets.labeling.labeler import LabelItem, pipeline_pairs
    from bridge_assets.lake import store
    from bridge_assets.lake.resource import DuckDBStore
    from bridge_assets.qrels.known_holes import read_known_holes
    from bridge_assets.registry.datasets import get_dataset

    spec = get_dataset(dataset)
    if not spec.known_holes:
        raise BridgeError(f"dataset '{dataset}' has no known_holes key to score against: give --gold FILE")
    key = read_known_holes(spec.resolve(spec.known_holes, "known_holes"))
    lake = DuckDBStore().lake
    if not store.exists(lake):
        raise BridgeError(f"no data lake yet: run `bridge run --dataset {dataset}` first")
    with store.connect_read_only(lake) as con:
        if not store.table_exists(con, "filtered_pool"):
            raise BridgeError(f"dataset '{dataset}' has no filtered pool yet: run `bridge run --dataset "
                             f"{dataset}` first")
        pairs = pipeline_pairs(con, dataset, spec.label_scale, spec.relevance.definition)
    return [LabelItem(f"{p.query_id}|{p.doc_id}", p, key.label(p.query_id, p.doc_id)) for p in pairs]
