"""Run labeling methods on a gold set: labels, the paper's figures and what they cost.

    results = evaluate(triplets, specs, generate, profiles_for=role_profiles)

Each method gets the same `generate(profile, requests)` (the cached LLM clients) wrapped in a
`CostMeter`, so its cost is what the method needs, whether the ledger answered or a model did:
distinct calls, tokens and the model seconds recorded with them (a re-run from the cache
reports the same cost, and `new_calls` = 0). Escalated cases are resolved by gold labels
(standing in for humans) or, for DREAM, by the LLM adjudicator.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import polars as pl

from bridge_assets.evaluation.diras import diras
from bridge_assets.evaluation.goldsets import GoldTriplet, MethodSpec
from bridge_assets.evaluation.lara import lara
from bridge_assets.evaluation.metrics import (LabelerMetrics, agreement, calibration_metrics, escalation_count,
                                              labeler_metrics)
from bridge_assets.evaluation.pointwise import score_triplets
from bridge_assets.evaluation.utility import utility_labels
from bridge_assets.labeling.adjudicator import adjudicate
from bridge_assets.labeling.calls import Generate
from bridge_assets.labeling.debate import (DEBATE_TEMPLATES, DebateChecks, DebateOutcome, debate_agents,
                                           fewshot_examples, run_debate)
from bridge_assets.labeling.filter import run_filter
from bridge_assets.labeling.judge import run_judge
from bridge_assets.labeling.prompts import Prompts
from bridge_assets.llm.types import LLMRequest, LLMResult

ProfilesFor = Callable[[str], list[str]]  # role -> profile names (models.yaml `defaults`)


@dataclass
class Cost:
    calls: int = 0          # distinct model calls the method needs (cached or made now)
    new_calls: int = 0      # of those, made now (not answered by the ledger)
    failures: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    model_seconds: float = 0.0  # model latency recorded with those calls
    wall_seconds: float = 0.0   # time this run spent in the method

    def as_dict(self) -> dict[str, Any]:
        values = asdict(self)
        values["model_seconds"] = round(self.model_seconds, 2)
        values["wall_seconds"] = round(self.wall_seconds, 2)
        return values


class CostMeter:
    """Wraps a `Generate` and keeps every distinct result it returned."""

    def __init__(self, generate: Generate):
        self._generate = generate
        self._results: dict[str, LLMResult] = {}

    def __call__(self, profile: str, requests: Sequence[LLMRequest]) -> list[LLMResult]:
        results = list(self._generate(profile, requests)) if requests else []
        for result in results:
            self._results.setdefault(result.key, result)
        return results

    def cost(self, wall_seconds: float) -> Cost:
        results = self._results.values()
        return Cost(calls=len(self._results), new_calls=sum(1 for r in results if not r.cached),
                    failures=sum(1 for r in results if not r.ok),
                    tokens_in=sum(r.tokens_in for r in results),
                    tokens_out=sum(r.tokens_out for r in results),
                    model_seconds=sum(r.latency_s for r in results), wall_seconds=wall_seconds)


@dataclass(frozen=True)
class ItemOutcome:
    """One triplet under one method (a row of `labeler_eval_items`)."""

    id: str
    domain: str | None
    gold: int
    label: int | None        # the method's own label (None where escalated)
    escalated: bool
    resolved: int | None     # label of an escalated case after resolution
    score: float | None      # P(relevant) where the method has one (LARA: calibrated)
    detail: str | None       # e.g. the debate outcome and rounds used, or an error


@dataclass
class MethodResult:
    spec: MethodSpec
    models: list[str]
    items: list[ItemOutcome]
    metrics: LabelerMetrics
    cost: Cost
    extra: dict[str, Any] = field(default_factory=dict)   # calibration, agreement, ...
    stability: list[dict[str, Any]] = field(default_factory=list)  # DREAM, per round

    def summary(self) -> dict[str, Any]:
        """The method's row of the gold set's table."""
        return {"method": self.spec.name, "kind": self.spec.method, "models": ",".join(self.models),
                **self.metrics.as_dict(), "resolver": self.spec.resolve, **self.cost.as_dict(),
                **{key: self.extra.get(key) for key in EXTRA_COLUMNS},
                "config": self.spec.model_dump_json()}


EXTRA_COLUMNS = ("ece", "brier", "auroc", "kappa", "agreement")


def method_models(spec: MethodSpec, profiles_for: ProfilesFor) -> list[str]:
    if spec.models:
        return list(spec.models)
    role = {"dream": "debate", "filter": "filter"}.get(spec.method, "judge")
    return profiles_for(role)[:1]


def _single(spec: MethodSpec, models: list[str]) -> str:
    if len(models) != 1:
        raise ValueError(f"method '{spec.name}' ({spec.method}) takes one model profile, got {models}")
    return models[0]


def run_method(spec: MethodSpec, triplets: Sequence[GoldTriplet], generate: Generate, *,
               profiles_for: ProfilesFor, prompts: Prompts | None = None) -> MethodResult:
    """Label `triplets` with one method and score it against their gold labels."""
    if spec.resolve == "adjudicator" and spec.method != "dream":
        raise ValueError(f"method '{spec.name}': only dream escalations can go to the adjudicator")
    prompts = prompts or Prompts()
    models = method_models(spec, profiles_for)
    meter = CostMeter(generate)
    started = time.perf_counter()
    gold = [t.label for t in triplets]
    extra: dict[str, Any] = {}
    stability: list[dict[str, Any]] = []
    scores: list[float | None] = [None] * len(triplets)
    if spec.method in ("judge", "dream"):
        kept = list(range(len(triplets)))
        if spec.prefilter:
            # As the pipeline does (filtered_pool before debate_labels): a pair every filter
            # model says no to is labelled not relevant by the filter; the rest go on.
            kept = prefilter_kept(triplets, list(spec.prefilter), meter, prompts)
            extra["prefiltered"] = len(triplets) - len(kept)
        labels: list[int | None] = [0] * len(triplets)
        escalated = [False] * len(triplets)
        resolved: list[int | None] = [None] * len(triplets)
        details: list[str | None] = ["filtered"] * len(triplets)
        judged = _judge_or_debate(spec, [triplets[i] for i in kept], models, meter, prompts,
                                  profiles_for, extra)
        for i, label, escalation, resolution, detail in zip(kept, *judged.columns(), strict=True):
            labels[i], escalated[i], resolved[i], details[i] = label, escalation, resolution, detail
        models = [*models, *(f"prefilter:{name}" for name in spec.prefilter),
                  *([f"adjudicator:{judged.adjudicator}"] if judged.adjudicator else [])]
        stability = judged.stability
    elif spec.method == "filter":
        votes = run_filter([t.pair() for t in triplets], [_single(spec, models)], meter, prompts=prompts)
        labels = [None if v.is_supported is None else int(v.is_supported) for v in votes]
        escalated = [label is None for label in labels]
        resolved = list(gold)
        details = [v.error for v in votes]
    elif spec.method == "lara":
        point = score_triplets(triplets, _single(spec, models), meter, prompts=prompts,
                               temperature=spec.temperature)
        chosen = lara([s.p_yes for s in point], gold, spec.escalation_ratio)
        labels, escalated, resolved = chosen.labels, chosen.escalated, list(gold)
        scores = chosen.calibrated
        extra.update(calibration_metrics(gold, [s.p_yes for s in point]))
        extra["calibrator"] = asdict(chosen.calibrator)
        details = [s.error for s in point]
    elif spec.method == "diras":
        out = diras(triplets, _single(spec, models), meter, prompts=prompts,
                    use_definitions=spec.use_definitions, temperature=spec.temperature)
        labels, escalated, resolved = out.labels, out.escalated, list(gold)
        scores = [s.p_yes for s in out.scores]
        extra.update(out.calibration)
        details = [s.error for s in out.scores]
    else:
        out = utility_labels(triplets, spec.method, _single(spec, models), meter, prompts=prompts,
                             top_percent=spec.top_percent, temperature=spec.temperature)
        labels = [out.labels[t.id] for t in triplets]
        escalated = [label is None for label in labels]
        resolved = list(gold)
        labelled = [i for i, label in enumerate(labels) if label is not None]
        extra.update(agreement([gold[i] for i in labelled], [labels[i] for i in labelled]))
        details = [out.errors.get(t.query) for t in triplets]
    items = [ItemOutcome(t.id, t.domain, t.label, None if escalated[i] else labels[i], escalated[i],
                         resolved[i] if escalated[i] else None, scores[i], details[i])
             for i, t in enumerate(triplets)]
    metrics = labeler_metrics(gold, [None if e else lab for lab, e in zip(labels, escalated)],
                              escalated, [r if e else None for r, e in zip(resolved, escalated)])
    return MethodResult(spec, models, items, metrics, meter.cost(time.perf_counter() - started),
                        extra, stability)


def prefilter_kept(triplets: Sequence[GoldTriplet], filter_models: list[str], generate: Generate,
                   prompts: Prompts) -> list[int]:
    """Indices of the triplets the filter keeps: dropped only when every model says no (a
    failed vote keeps the pair), as sql/filtered_pool.sql decides."""
    votes = run_filter([t.pair() for t in triplets], filter_models, generate, prompts=prompts)
    n = len(triplets)
    return [i for i in range(n)
            if any(votes[k * n + i].is_supported is not False for k in range(len(filter_models)))]


@dataclass
class _Judged:
    """A judge's or a debate's outcome on the triplets it was given, in their order."""

    labels: list[int | None]
    escalated: list[bool]
    resolved: list[int | None]
    details: list[str | None]
    stability: list[dict[str, Any]]
    adjudicator: str = ""

    def columns(self) -> tuple[list, ...]:
        return self.labels, self.escalated, self.resolved, self.details


def _judge_or_debate(spec: MethodSpec, triplets: Sequence[GoldTriplet], models: list[str],
                     meter: CostMeter, prompts: Prompts, profiles_for: ProfilesFor,
                     extra: dict[str, Any]) -> _Judged:
    pairs = [t.pair() for t in triplets]
    gold = [t.label for t in triplets]
    examples = fewshot_examples(spec.fewshot)
    stability: list[dict[str, Any]] = []
    adjudicator = ""
    if spec.method == "judge":
        outcome = run_judge(pairs, _single(spec, models), meter, temperature=spec.temperature,
                            reason_words=spec.reason_words, examples=examples, prompts=prompts)
    else:
        agents = debate_agents(models, spec.agents, spec.stance_order,
                               template=DEBATE_TEMPLATES[spec.prompt])
        checks = DebateChecks(
            evidence=spec.evidence_check, answer_presence=spec.answer_check,
            min_confidence=spec.min_confidence,
            budget=None if spec.budget_ratio is None else escalation_count(len(pairs), spec.budget_ratio))
        outcome = run_debate(pairs, agents, meter, rounds=spec.rounds, temperature=spec.temperature,
                             reason_words=spec.reason_words, examples=examples, prompts=prompts,
                             checks=checks, answer_first=spec.answer_first)
        if spec.resolve == "adjudicator":
            adjudicator = spec.adjudicator or profiles_for("adjudicator")[0]
            outcome = adjudicate(outcome, pairs, adjudicator, meter, prompts=prompts)
        stability = consensus_stability(outcome, gold)
        extra["consensus_by_round"] = outcome.consensus_by_round()
    labels = [label.label for label in outcome.labels]
    escalated = [label.outcome in ("escalated", "failed") for label in outcome.labels]
    resolved = [label.adjudicator_label for label in outcome.labels] \
        if spec.resolve == "adjudicator" else list(gold)
    details = [f"{label.outcome}@{label.rounds_used}"
               + "".join(f" {flag}" for flag in label.flags if flag not in ("failed", "disagreement"))
               for label in outcome.labels]
    extra["flags"] = outcome.flag_counts()
    return _Judged(labels, escalated, resolved, details, stability, adjudicator)


def consensus_stability(outcome: DebateOutcome, gold: Sequence[int]) -> list[dict[str, Any]]:
    """How consensus forms round by round (the paper's Table 12, as defined here): per round,
    the pairs still debating, those agreeing now and how often that agreement is right, the
    cumulative consensus share, the turns whose answer changed since the agent's previous
    turn, the turns that answer against the agent's opening stance, and failures."""
    by_pair = outcome.histories()
    n = len(outcome.labels)
    rows, cumulative = [], 0
    for r in range(1, outcome.rounds + 1):
        debating = agreed = correct = changed = against = failed = 0
        for i, label in enumerate(outcome.labels):
            rounds = by_pair.get((label.query_id, label.doc_id), [])
            if len(rounds) < r:
                continue
            debating += 1
            for turn in rounds[r - 1]:
                if turn.response is None:
                    continue
                if turn.stance is not None and (turn.response == "yes") != (turn.stance == "relevant"):
                    against += 1
                if r > 1:
                    previous = next((t for t in rounds[r - 2] if t.agent == turn.agent), None)
                    changed += previous is not None and previous.response != turn.response
            if label.rounds_used == r and label.outcome == "consensus":
                agreed += 1
                correct += label.label == gold[i]
            failed += label.rounds_used == r and label.outcome == "failed"
        cumulative += agreed
        rows.append({"round": r, "debating": debating, "agreed": agreed,
                     "agreed_accuracy": correct / agreed if agreed else None,
                     "consensus_share_cumulative": cumulative / n if n else 0.0,
                     "answer_changes": changed, "against_opening_stance": against, "failed": failed})
    return rows


def evaluate(triplets: Sequence[GoldTriplet], specs: Sequence[MethodSpec], generate: Generate, *,
             profiles_for: ProfilesFor, prompts: Prompts | None = None,
             on_result: Callable[[MethodResult], None] | None = None) -> list[MethodResult]:
    """Every method on the same triplets, one after the other (`on_result` after each)."""
    results = []
    for spec in specs:
        result = run_method(spec, triplets, generate, profiles_for=profiles_for, prompts=prompts)
        if on_result is not None:
            on_result(result)
        results.append(result)
    return results


# --- tables -------------------------------------------------------------------------------

RESULT_SCHEMA = {
    "method": pl.Utf8, "kind": pl.Utf8, "models": pl.Utf8, "n": pl.Int32, "escalated": pl.Int32,
    "escalation_ratio": pl.Float64, "recall_relevant": pl.Float64, "recall_irrelevant": pl.Float64,
    "bacc": pl.Float64, "bacc_resolved": pl.Float64, "unresolved": pl.Int32,
    "bacc_ci_low": pl.Float64, "bacc_ci_high": pl.Float64, "bacc_resolved_ci_low": pl.Float64,
    "bacc_resolved_ci_high": pl.Float64, "resolver": pl.Utf8,
    "calls": pl.Int32, "new_calls": pl.Int32, "failures": pl.Int32, "tokens_in": pl.Int64,
    "tokens_out": pl.Int64, "model_seconds": pl.Float64, "wall_seconds": pl.Float64,
    "ece": pl.Float64, "brier": pl.Float64, "auroc": pl.Float64, "kappa": pl.Float64,
    "agreement": pl.Float64, "config": pl.Utf8}
ITEM_SCHEMA = {"method": pl.Utf8, "id": pl.Utf8, "domain": pl.Utf8, "gold": pl.Int32,
               "label": pl.Int32, "escalated": pl.Boolean, "resolved": pl.Int32,
               "score": pl.Float64, "detail": pl.Utf8}
STABILITY_SCHEMA = {"method": pl.Utf8, "round": pl.Int32, "debating": pl.Int32, "agreed": pl.Int32,
                    "agreed_accuracy": pl.Float64, "consensus_share_cumulative": pl.Float64,
                    "answer_changes": pl.Int32, "against_opening_stance": pl.Int32, "failed": pl.Int32}


def result_frames(result: MethodResult, goldset: str) -> dict[str, pl.DataFrame]:
    """The method's rows of `labeler_eval_results`, `labeler_eval_items`, `consensus_stability`."""
    name = result.spec.name
    tag = pl.lit(goldset).alias("goldset")
    results = pl.DataFrame([result.summary()], schema=RESULT_SCHEMA).with_columns(tag)
    items = pl.DataFrame([{"method": name, **asdict(item)} for item in result.items],
                         schema=ITEM_SCHEMA).with_columns(tag)
    stability = pl.DataFrame([{"method": name, **row} for row in result.stability],
                             schema=STABILITY_SCHEMA).with_columns(tag)
    return {"labeler_eval_results": results, "labeler_eval_items": items,
            "consensus_stability": stability}


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """A plain-text table of result summaries (the gold set's Table 1)."""
    columns = [("method", 26, "s"), ("n", 4, "d"), ("R_irr", 7, "%"), ("R_rel", 7, "%"),
               ("bAcc", 7, "%"), ("95% CI", 13, "ci"), ("esc", 7, "%"), ("bAcc_res", 9, "%"), ("calls", 7, "d"),
               ("tokens", 9, "d"), ("model_s", 9, ".0f"), ("ECE", 7, ".3f"), ("AUROC", 7, ".3f"),
               ("kappa", 7, ".3f")]
    keys = {"R_irr": "recall_irrelevant", "R_rel": "recall_relevant", "esc": "escalation_ratio",
            "bAcc_res": "bacc_resolved", "model_s": "model_seconds", "ECE": "ece", "AUROC": "auroc"}

    def cell(row: dict[str, Any], name: str, width: int, style: str) -> str:
        if style == "ci":
            low, high = row.get("bacc_ci_low"), row.get("bacc_ci_high")
            text = "-" if low is None else f"{100 * low:.1f}-{100 * high:.1f}"
            return text.rjust(width)
        key = keys.get(name, name.lower() if name != "bAcc" else "bacc")
        value = row["tokens_in"] + row["tokens_out"] if name == "tokens" else row.get(key)
        if value is None:
            text = "-"
        elif style == "%":
            text = f"{100 * value:.1f}"
        elif style == "s":
            text = str(value)
        else:
            text = format(value, style)
        return text.rjust(width) if style != "s" else text.ljust(width)

    lines = ["".join(name.rjust(w) if s != "s" else name.ljust(w) for name, w, s in columns)]
    lines += ["".join(cell(row, name, w, s) for name, w, s in columns) for row in rows]
    return "\n".join(lines)


def format_stability(result: MethodResult) -> str:
    lines = [f"{result.spec.name}: round  debating  agreed  agreed_acc  cum_share  changes  against  failed"]
    for row in result.stability:
        accuracy = "-" if row["agreed_accuracy"] is None else f"{100 * row['agreed_accuracy']:.1f}"
        lines.append(f"{'':>{len(result.spec.name) + 2}}{row['round']:>5}{row['debating']:>10}"
                     f"{row['agreed']:>8}{accuracy:>12}{100 * row['consensus_share_cumulative']:>11.1f}"
                     f"{row['answer_changes']:>9}{row['against_opening_stance']:>9}{row['failed']:>8}")
    return "\n".join(lines)


def summary_json(result: MethodResult) -> str:
    """The CLI's --json output: the issue's keys first, then every other figure."""
    summary = result.summary()
    ordered = {key: summary[key] for key in ("bacc", "recall_relevant", "recall_irrelevant",
                                              "escalation_ratio", "n", "calls")}
    rest = {k: v for k, v in summary.items() if k not in ordered and k != "config"}
    return json.dumps({**ordered, **rest, **({"stability": result.stability} if result.stability else {}),
                       **({"flags": result.extra["flags"]} if result.extra.get("flags") else {}),
                       "config": json.loads(summary["config"])}, indent=2)
