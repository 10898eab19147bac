"""`bridge label-eval`: evaluate one labeling method on a gold-set file and print its figures.

Register on the `bridge` app as `app.command("label-eval")(label_eval_command)`. Every model
call goes through the data lake's LLM call ledger, so a repeated command is answered from it.
"""

from __future__ import annotations

from pathlib import Path

import typer

from bridge_assets.cli_errors import fail as _fail
from bridge_assets.evaluation.goldsets import GoldSetError, MethodKind, MethodSpec, read_goldset, stratified_head


def _shard(text: str) -> tuple[int, int]:
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard takes K/N (e.g. 0/2), got {text!r}") from None
    if not 0 <= index < count:
        raise ValueError(f"--shard K/N needs 0 <= K < N, got {text!r}")
    return index, count


def label_eval_command(
    gold: Path = typer.Option(..., "--gold", help="Gold-set JSONL: id, query, answers, chunk, label (0/1)."),
    method: str = typer.Option(..., "--method", help="filter | judge | lara | dream | diras | utilsel | utilrank"),
    profile: list[str] = typer.Option(None, "--profile", help="LLM profile(s) of models.yaml; dream takes "
                                      "one for all agents or one per agent. Default: the role's."),
    rounds: int = typer.Option(2, "--rounds", min=1, help="dream: maximum rounds before escalation."),
    agents: int = typer.Option(2, "--agents", min=2, help="dream: agents, half per opening stance."),
    stance_order: str = typer.Option("relevant_first", "--stance-order",
                                     help="dream: relevant_first | irrelevant_first (agent A's stance)."),
    resolve: str = typer.Option("gold", "--resolve", help="Who labels escalated pairs: gold | adjudicator (dream)."),
    adjudicator: str = typer.Option("", "--adjudicator", help="dream: adjudicator profile (default: the role's)."),
    temperature: float = typer.Option(0.0, "--temperature", min=0.0),
    escalation_ratio: float = typer.Option(0.035, "--escalation-ratio", min=0.0, max=1.0,
                                           help="lara: share of pairs escalated to humans."),
    top_percent: float = typer.Option(0.2, "--top-percent", min=0.01, max=1.0,
                                      help="utilrank: top share of a query's candidates counted useful."),
    prompt: str = typer.Option("soft_stance", "--prompt", help="dream: the debate prompt, paper | soft_stance."),
    fewshot: bool = typer.Option(False, "--fewshot", help="judge/dream: worked examples in the prompt."),
    answer_first: bool = typer.Option(False, "--answer-first", help="dream: each turn gives its yes/no "
                                      "before its quotes and reason."),
    reason_words: int = typer.Option(40, "--reason-words", min=5, max=300,
                                     help="judge/dream: the reason's word limit (bounds the reply)."),
    evidence_check: bool = typer.Option(False, "--evidence-check", help="dream: escalate a 'yes' "
                                        "consensus no agent backs with a quote found in the chunk."),
    answer_check: str = typer.Option("off", "--answer-check", help="dream: escalate a 'yes' consensus "
                                     "on a chunk without a reference answer: off | short (pairs with "
                                     "short span answers) | all."),
    min_confidence: float = typer.Option(0.0, "--min-confidence", min=0.0, max=1.0,
                                         help="dream: escalate a consensus whose weakest agent's "
                                              "P(its answer) is below this."),
    budget_ratio: float = typer.Option(None, "--budget-ratio", min=0.0, max=1.0,
                                       help="dream: escalate at most this share of the pairs, least "
                                            "confident first; the others get the agents' pooled vote."),
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
    as_json: bool = typer.Option(False, "--json", help="Print the figures as JSON."),
) -> None:
    """Label a gold set with one method; print recalls, bAcc, escalation ratio and cost."""
    from bridge_assets.evaluation.runner import format_stability, format_table, run_method, summary_json
    from bridge_assets.llm import LLMClient, get_profile
    from bridge_assets.llm.profiles import ModelConfigError, role_profiles

    kinds = MethodKind.__args__
    if method not in kinds:
        _fail(f"unknown method '{method}' (methods: {', '.join(kinds)})")
    try:
        spec = MethodSpec(name=method, method=method, models=tuple(profile or ()), rounds=rounds,
                          agents=agents, stance_order=stance_order, resolve=resolve,
                          adjudicator=adjudicator, temperature=temperature,
                          escalation_ratio=escalation_ratio, top_percent=top_percent,
                          prompt=prompt, fewshot=fewshot, answer_first=answer_first,
                          reason_words=reason_words, evidence_check=evidence_check,
                          answer_check=answer_check, min_confidence=min_confidence,
                          budget_ratio=budget_ratio, prefilter=tuple(prefilter or ()))
        triplets = stratified_head(read_goldset(gold), limit)
        if shard:
            index, count = _shard(shard)
            triplets = triplets[index::count]
    except (GoldSetError, ValueError) as exc:
        _fail(str(exc))
    clients: dict[str, LLMClient] = {}

    def generate(name, requests):
        if name not in clients:
            chosen = get_profile(name)
            if threads is not None and chosen.backend == "llama_cpp":
                chosen = chosen.model_copy(update={"threads": threads})
            clients[name] = LLMClient(chosen)
        return clients[name].generate(requests, context=f"label-eval:{gold.name}:{method}")

    try:
        result = run_method(spec, triplets, generate, profiles_for=role_profiles)
    except (ModelConfigError, ValueError) as exc:
        _fail(str(exc))
    finally:
        for client in clients.values():
            client.close()
    if as_json:
        typer.echo(summary_json(result))
        return
    typer.echo(f"{gold}  ({len(triplets)} triplets, method {method}, models {', '.join(result.models)})")
    typer.echo(format_table([result.summary()]))
    if result.stability:
        typer.echo(format_stability(result))
