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
from pathlib import Path
from typing import Any

import polars as pl

from bridge_assets.evaluation.goldsets import GoldTriplet, MethodSpec
from bridge_assets.evaluation.scores import LabelerMetrics, labeler_metrics, reliability_bins
from bridge_assets.labeling.calls import Generate
from bridge_assets.labeling.dream import DreamLabeler
from bridge_assets.labeling.filter import run_filter
from bridge_assets.labeling.labeler import LabelerError, LabelItem, ModelId, ProfilesFor, build_labeler
from bridge_assets.labeling.persistence import DebatePersistence, format_persistence
from bridge_assets.labeling.prompts import Prompts
from bridge_assets.llm.types import LLMRequest, LLMResult


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
    gold: int | None         # the known label (None: an item without one, left out of the metrics)
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
    config_hash: str = ""   # the key the pipeline stores this labeler's labels under

    def summary(self) -> dict[str, Any]:
        """The method's row of the gold set's table."""
        return {"method": self.spec.name, "kind": self.spec.method, "models": ",".join(self.models),
                **self.metrics.as_dict(), "resolver": self.resolver, **self.cost.as_dict(),
                **{key: self.extra.get(key) for key in EXTRA_COLUMNS},
                "config": json.dumps(self.spec.entry())}

    @property
    def resolver(self) -> str:
        return "adjudicator" if getattr(self.spec.settings, "adjudicate", False) else "gold"


EXTRA_COLUMNS = ("ece", "brier", "auroc", "kappa", "agreement")


def run_method(spec: MethodSpec, triplets: Sequence[GoldTriplet | LabelItem], generate: Generate, *,
               profiles_for: ProfilesFor, prompts: Prompts | None = None,
               model_id: ModelId | None = None, persistence: int = 0) -> MethodResult:
    """Label `triplets` with one labeler and score it against their gold labels (an item
    without one is labelled but not scored). Escalated items are resolved by their gold label
    (people standing in) or by the labeler's adjudicator when it has one. `model_id`: a
    profile's model id for the config hash (default: models.yaml's). `persistence` R (dream
    only): the debates go on to round R after their decision, for the survival and flip tables
    (`extra["persistence"]`); the labels and figures stay those of the debate that stops, the
    cost counts the rounds it went on."""
    prompts = prompts or Prompts()
    labeler = build_labeler(spec.settings, profiles_for)
    items = [(t.item() if isinstance(t, GoldTriplet) else t).judged_by(spec.definition) for t in triplets]
    debate = labeler if isinstance(labeler, DreamLabeler) and persistence else None
    if persistence:
        if debate is None:
            raise LabelerError(f"persistence applies to a debate (dream), not to labeler '{spec.method}'")
        debate.check_persistence(persistence, items)
    meter = CostMeter(generate)
    started = time.perf_counter()
    kept = list(range(len(items)))
    extra: dict[str, Any] = {}
    if spec.prefilter:
        if spec.method not in ("judge", "dream"):
            raise LabelerError(f"method '{spec.name}': only judge and dream take a prefilter")
        # As the pipeline does (filtered_pool before debate_labels): a pair every filter
        # model says no to is labelled not relevant by the filter; the rest go on.
        kept = prefilter_kept(items, list(spec.prefilter), meter, prompts)
        extra["prefiltered"] = len(items) - len(kept)
    chosen = [items[i] for i in kept]
    run = debate.label(chosen, meter, prompts, persistence=persistence) if debate is not None \
        else labeler.label(chosen, meter, prompts)
    extra.update(run.extra)
    outcomes = {i: ItemOutcome(item.id, item.domain, item.gold, 0, False, None, None, "filtered")
                for i, item in enumerate(items)}
    adjudicated = getattr(spec.settings, "adjudicate", False)
    for n, (i, label) in enumerate(zip(kept, run.labels, strict=True)):
        escalated = label.outcome in ("escalated", "failed")
        resolved = (label.adjudicator_label if adjudicated else items[i].gold) if escalated else None
        outcomes[i] = ItemOutcome(items[i].id, items[i].domain, items[i].gold,
                                  None if escalated else label.label, escalated, resolved,
                                  run.scores[n] if run.scores else None,
                                  run.details[n] if run.details else None)
    known = [(o, o.gold) for _, o in sorted(outcomes.items()) if o.gold is not None]
    scored = [o for o, _ in known]
    metrics = labeler_metrics([gold for _, gold in known], [o.label for o in scored],
                              [o.escalated for o in scored], [o.resolved for o in scored])
    models = [*run.models, *(f"prefilter:{name}" for name in spec.prefilter)]
    return MethodResult(spec, models, scored, metrics, meter.cost(time.perf_counter() - started),
                        extra, run.stability,
                        labeler.config_hash(prompts, items=len(kept), model_id=model_id,
                                            definition=spec.definition))


def prefilter_kept(items: Sequence[LabelItem], filter_models: list[str], generate: Generate,
                   prompts: Prompts) -> list[int]:
    """Indices of the items the filter keeps: dropped only when every model says no (a
    failed vote keeps the pair), as sql/filtered_pool.sql decides."""
    votes = run_filter([item.pair for item in items], filter_models, generate, prompts=prompts)
    n = len(items)
    return [i for i in range(n)
            if any(votes[k * n + i].is_supported is not False for k in range(len(filter_models)))]


def evaluate(triplets: Sequence[GoldTriplet], specs: Sequence[MethodSpec], generate: Generate, *,
             profiles_for: ProfilesFor, prompts: Prompts | None = None,
             on_result: Callable[[MethodResult], None] | None = None,
             model_id: ModelId | None = None) -> list[MethodResult]:
    """Every method on the same triplets, one after the other (`on_result` after each)."""
    results = []
    for spec in specs:
        result = run_method(spec, triplets, generate, profiles_for=profiles_for, prompts=prompts,
                            model_id=model_id)
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


def write_items(result: MethodResult, path: Path) -> None:
    """One JSON line per scored triplet (`labeler_eval_items`' columns), in the gold set's order:
    what other analyses join on the triplet id (e.g. one labeler's decisions with another's
    scores) without calling a model again."""
    path.write_text("".join(json.dumps({"method": result.spec.name, **asdict(item)}) + "\n"
                            for item in result.items), encoding="utf-8")


def read_items(path: Path) -> dict[str, dict]:
    """A `write_items` file (or one of the same shape): triplet id -> its row."""
    rows = (json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
    return {str(row["id"]): row for row in rows}


def item_scores(path: Path) -> dict[str, float]:
    """Triplet id -> the labeler's score (P(relevant) or P(yes)), from an items file; triplets
    without a score are left out."""
    return {i: float(row["score"]) for i, row in read_items(path).items() if row.get("score") is not None}


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
            text = "-" if low is None or high is None else f"{100 * low:.1f}-{100 * high:.1f}"
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


def persistence_table(result: MethodResult) -> DebatePersistence | None:
    """The survival and flip tables of a run with --persistence (None without)."""
    return result.extra.get("persistence")


def format_persistence_tables(result: MethodResult) -> str:
    table = persistence_table(result)
    return "" if table is None else format_persistence(table)


def format_reliability(result: MethodResult, path: Path) -> str:
    """Draw the reliability diagram of the method's P(relevant) over its scored items to `path`
    and return its bins as text; a method without probabilities draws nothing and says so."""
    from bridge_assets.plots import reliability  # matplotlib: loaded only when drawing

    # (every item of a result has its known label)
    scored = [(item.gold, item.score) for item in result.items if item.score is not None and item.gold is not None]
    if not scored:
        return f"reliability diagram: {result.spec.name} gives no P(relevant), nothing drawn"
    rows = reliability_bins([g for g, _ in scored], [p for _, p in scored])
    reliability({result.spec.name: rows}, path, title=f"Reliability: {result.spec.name} (n={len(scored)})")
    lines = [f"reliability diagram ({len(scored)} items with a P(relevant)) -> {path}",
             f"{'bin':>11}  {'cases':>5}  {'predicted':>9}  {'relevant':>8}"]
    lines += [f"{r['low']:.1f} .. {r['high']:.1f}  {r['cases']:5d}  {r['predicted']:9.3f}  {r['observed']:8.3f}"
              for r in rows]
    return "\n".join(lines)


def summary_json(result: MethodResult) -> str:
    """The CLI's --json output: the issue's keys first, then every other figure."""
    summary = result.summary()
    ordered = {key: summary[key] for key in ("bacc", "recall_relevant", "recall_irrelevant",
                                              "escalation_ratio", "n", "calls")}
    rest = {k: v for k, v in summary.items() if k not in ordered and k != "config"}
    table = persistence_table(result)
    return json.dumps({**ordered, **rest, **({"stability": result.stability} if result.stability else {}),
                       **({"flags": result.extra["flags"]} if result.extra.get("flags") else {}),
                       **({"persistence": table.as_dict()} if table is not None else {}),
                       "config": json.loads(summary["config"]), "config_hash": result.config_hash},
                      indent=2)
