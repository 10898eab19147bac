"""DREAM as a labeler (the pipeline's default): its settings, spelled once, and the debate,
checks, budget and optional adjudicator they describe (the machinery is in debate.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field

from bridge_assets.labeling.adjudicator import ADJUDICATOR_TEMPLATE, adjudicate, adjudicator_schema
from bridge_assets.labeling.calls import Generate
from bridge_assets.labeling.debate import DebateChecks, DebateOutcome, debate_config_hash, escalation_count, run_debate
from bridge_assets.labeling.debate_turns import (
    DEBATE_TEMPLATES,
    AgentConfig,
    Turn,
    debate_agents,
    fewshot_examples,
    turn_max_tokens,
)
from bridge_assets.labeling.labeler import (
    Labeler,
    LabelerError,
    LabelerRun,
    LabelerSettings,
    LabelItem,
    ModelId,
    ProfilesFor,
    profile_model_id,
)
from bridge_assets.labeling.persistence import debate_persistence
from bridge_assets.labeling.prompts import Prompts
from bridge_assets.llm.budget import prompt_tokens
from bridge_assets.llm.profiles import load_models_config
from bridge_assets.llm.replay import NOT_ANSWERED, LedgerReplay, StageCalls
from bridge_assets.llm.types import LLMRequest, LLMResult
from bridge_assets.registry.datasets import LabelScale

ADJUDICATOR_MAX_TOKENS = 256


class DreamSettings(LabelerSettings):
    """DREAM's knobs. `models`: one profile for every agent or one per agent."""

    rounds: int = Field(2, ge=1, description="Maximum rounds R before escalation (paper: 2).")
    agents: int = Field(2, ge=2, description="Number of agents, half per stance (2 or 4).")
    stance_order: Literal["relevant_first", "irrelevant_first"] = Field(
        "relevant_first", description="Which opening stance agent A (listed first) takes.")
    prompt: Literal["paper", "soft_stance"] = Field(
        "soft_stance", description="The debate prompt: the paper's (agents defend their stance) "
        "or a softer one (a stance is a starting point to test).")
    fewshot: bool = Field(False, description="Worked examples (resources/prompts/examples.yaml) in "
                          "the agents' prompt.")
    answer_first: bool = Field(False, description="Each turn gives its yes/no before its quotes and "
                               "reason (the paper's turns argue first).")
    reason_words: int = Field(40, ge=5, le=300, description="The word limit of each turn's reason "
                              "(the reply's JSON schema bounds it, so it also bounds the cost).")
    evidence_check: bool = Field(False, description="Escalate a 'yes' consensus that no agent backs "
                                 "with a quote found in the chunk.")
    answer_check: Literal["off", "short", "all"] = Field(
        "short", description="Escalate a 'yes' consensus on a chunk that contains no reference "
        "answer: on pairs whose answers are short spans (NQ-style), on all pairs with answers, or off.")
    min_confidence: float = Field(0.0, ge=0.0, le=1.0, description="Escalate a consensus whose "
                                  "weakest agent gives its answer a probability below this (0: off).")
    escalation_budget: int = Field(0, ge=0, description="> 0: escalate at most this many pairs, "
                                   "least confident first; the others get the agents' pooled vote "
                                   "(outcome 'vote', an unverified label).")
    escalation_budget_ratio: float = Field(0.0, ge=0.0, le=1.0, description="> 0: the same budget "
                                           "as a share of the debated pairs.")
    adjudicate: bool = Field(False, description="Let an LLM adjudicator decide escalated and "
                             "failed pairs (stored as adjudicator_label, apart from consensus; "
                             "always reported as unverified, never as found holes).")
    adjudicator_model: str = Field("", description="Empty: the `adjudicator` role's profile.")
    grade_consensus: Literal["exact", "within_one"] = Field(
        "exact", description="On a graded dataset (label_scale: graded), when the agents' grades "
        "agree: exact (all equal), or within_one (at most one grade apart, the lower grade kept).")


class DreamLabeler(Labeler):
    Settings = DreamSettings
    role = "debate"
    max_models = None
    settings: DreamSettings

    def __init__(self, settings: DreamSettings, profiles_for: ProfilesFor):
        super().__init__(settings, profiles_for)
        self.agents: tuple[AgentConfig, ...] = debate_agents(
            self.models, settings.agents, settings.stance_order,
            template=DEBATE_TEMPLATES[settings.prompt])
        self.adjudicator = (settings.adjudicator_model or profiles_for("adjudicator")[0]) \
            if settings.adjudicate else ""

    def checks(self, pairs: int) -> DebateChecks:
        s = self.settings
        budgets = [b for b in (s.escalation_budget,
                               escalation_count(pairs, s.escalation_budget_ratio)
                               if s.escalation_budget_ratio else 0) if b > 0]
        return DebateChecks(evidence=s.evidence_check, answer_presence=s.answer_check,
                            min_confidence=s.min_confidence, budget=min(budgets) if budgets else None)

    def describe(self, items: int = 0) -> dict[str, Any]:
        return {"agents": ", ".join(f"{a.name}:{a.stance}:{a.model}" for a in self.agents),
                "rounds": self.settings.rounds,
                "checks": ", ".join(f"{k}={v}" for k, v in self.checks(items).as_config().items())}

    def check(self, scale: LabelScale) -> None:
        if scale == "graded" and self.settings.fewshot:
            raise LabelerError("the dataset is graded: the worked examples (fewshot) answer "
                               "yes/no, so they cannot show a graded debate")

    def in_process(self) -> bool:
        """Every agent's model runs in this process on llama.cpp one call at a time, which keeps
        one KV sequence and reuses the prefix a prompt shares with the previous one: the debate
        then goes pair by pair (run_debate's `pair_major`, same labels), so each round follows
        its own pair's last. A profile that decodes in lanes (engine_args.decode_lanes) wants a
        round's calls together, as a server does."""
        profiles = load_models_config().profiles
        return all(name in profiles and profiles[name].backend == "llama_cpp"
                   and profiles[name].decode_lanes == 1
                   for name in {agent.model for agent in self.agents})

    def debate(self, items: Sequence[LabelItem], generate: Generate, prompts: Prompts | None = None,
               *, adjudicated: bool = True, persistence: int = 0,
               pair_major: bool | None = None) -> DebateOutcome:
        """The debate these settings describe, adjudicated when opted in (and `adjudicated`);
        `persistence` R: every pair debated on to round R (an evaluation, `label()`);
        `pair_major` None: pair by pair when the agents' models run in process (in_process())."""
        s = self.settings
        if pair_major is None:
            pair_major = self.in_process()
        pairs = [item.pair for item in items]
        outcome = run_debate(pairs, self.agents, generate, rounds=s.rounds, temperature=s.temperature,
                             reason_words=s.reason_words, examples=fewshot_examples(s.fewshot),
                             prompts=prompts, checks=self.checks(len(pairs)),
                             grade_consensus=s.grade_consensus, answer_first=s.answer_first,
                             persistence=persistence, pair_major=pair_major)
        if self.adjudicator and adjudicated:
            outcome = adjudicate(outcome, pairs, self.adjudicator, generate, prompts=prompts,
                                 max_tokens=ADJUDICATOR_MAX_TOKENS)
        return outcome

    def check_persistence(self, persistence: int, items: Sequence[LabelItem] = ()) -> None:
        """Raise LabelerError unless the debate can go on to round `persistence` on `items`."""
        if persistence < self.settings.rounds:
            raise LabelerError(f"persistence {persistence} is fewer rounds than the debate's "
                               f"(rounds={self.settings.rounds}): give at least {self.settings.rounds}")
        if any(item.pair.scale == "graded" for item in items):
            raise LabelerError("persistence counts yes/no flips; the dataset is graded")

    def estimate(self, items: Sequence[LabelItem], unsure: set[tuple[str, str]],
                 replay: LedgerReplay) -> list[StageCalls]:
        """Every turn whose request is known, per round (bounded for `unsure` pairs, which the
        filter may drop); the later rounds of debates that wait on a reply bounded (each later
        prompt grows by one round of turns at their most); the adjudicator's calls when opted in."""
        rounds = self.settings.rounds
        purpose = "debate_paper" if self.settings.prompt == "paper" else "debate"
        stages = {(r, m): replay.stage(f"debate round {r}", m, purpose)
                  for r in range(1, rounds + 1) for m in dict.fromkeys(a.model for a in self.agents)}
        # round by round: the replay answers from the ledger, one lookup per round, not per pair
        outcome = self.debate(items, replay, adjudicated=False, pair_major=False)
        reply = turn_max_tokens(self.settings.reason_words)
        open_turns: dict[tuple[str, str], int] = {}  # turns not answered yet, per pair
        for pair, history in outcome.histories().items():
            for turns in history:
                for turn in turns:
                    stages[(turn.round, turn.model)].add(turn.call_key, replay.requests[turn.call_key],
                                                         turn.error != NOT_ANSWERED, pair not in unsure)
            later = _open_rounds(history, rounds)
            for turn in history[-1] if later else ():
                asked = prompt_tokens(replay.requests[turn.call_key])
                for step in range(1, later + 1):
                    stages[(turn.round + step, turn.model)].add_bound(
                        asked + step * len(self.agents) * reply, reply)
            waiting = sum(t.error == NOT_ANSWERED for turns in history for t in turns)
            open_turns[pair] = waiting + later * len(self.agents)
        adjudicator = [self._adjudicator_calls(outcome, items, unsure, open_turns, reply, replay)] \
            if self.adjudicator else []
        return [*stages.values(), *adjudicator]

    def _adjudicator_calls(self, outcome: DebateOutcome, items: Sequence[LabelItem],
                           unsure: set[tuple[str, str]], open_turns: dict[tuple[str, str], int],
                           reply: int, replay: LedgerReplay) -> StageCalls:
        """A call per pair left open: known for debates the ledger answered whole, else bounded
        (the prompt grows by the turns not answered yet)."""
        stage = replay.stage("adjudicator", self.adjudicator, "adjudicator")
        decided = adjudicate(outcome, [item.pair for item in items], self.adjudicator, replay,
                             max_tokens=ADJUDICATOR_MAX_TOKENS)
        for label in decided.labels:
            if label.adjudicator_call_key is None:
                continue
            pair = (label.query_id, label.doc_id)
            request = replay.requests[label.adjudicator_call_key]
            if open_turns.get(pair):
                stage.add_bound(prompt_tokens(request) + open_turns[pair] * reply, request.max_tokens)
            else:
                stage.add(label.adjudicator_call_key, request, label.adjudicator_error != NOT_ANSWERED,
                          pair not in unsure)
        return stage

    def label(self, items: Sequence[LabelItem], generate: Generate,
              prompts: Prompts | None = None, *, persistence: int = 0) -> LabelerRun:
        """The debate's labels. `persistence` R (an evaluation; the pipeline never passes it):
        the pairs are debated on to round R after their decision, the labels and turns stay
        those of the debate that stops, and `extra["persistence"]` holds the survival and flip
        tables of every round (labeling/persistence.py)."""
        if persistence:
            self.check_persistence(persistence, items)
        answered: dict[str, bool] = {}  # call key -> answered by the ledger
        outcome = self.debate(items, _noting_ledger(generate, answered) if persistence else generate,
                              prompts, persistence=persistence)
        gold = [item.gold for item in items]
        known = all(g is not None for g in gold)
        details: list[str | None] = [f"{label.outcome}@{label.rounds_used}"
                   + "".join(f" {flag}" for flag in label.flags if flag not in ("failed", "disagreement"))
                   for label in outcome.labels]
        extra: dict[str, Any] = {"consensus_by_round": outcome.consensus_by_round(),
                                 "flags": outcome.flag_counts()}
        if persistence:
            extra["persistence"] = debate_persistence(outcome.all_turns(), persistence, answered)
        return LabelerRun(
            outcome.labels, outcome.turns, details=details, extra=extra,
            stability=consensus_stability(outcome, gold) if known else [],
            models=[*self.models, *([f"adjudicator:{self.adjudicator}"] if self.adjudicator else [])])

    def config_hash(self, prompts: Prompts | None = None, scale: LabelScale = "binary",
                    items: int = 0, model_id: ModelId | None = None,
                    definition: str | None = None) -> str:
        # debate_config_hash, as before the labeler interface: the labels already stored keep
        # their keys. A budget given as a share depends on how many pairs are debated.
        s, prompts, model_id = self.settings, prompts or Prompts(), model_id or profile_model_id
        model_ids = {name: model_id(name) for name in {*self.models, self.adjudicator} if name}
        adjudicator: dict[str, Any] | None = None
        if self.adjudicator:
            adjudicator = {"model": self.adjudicator, "model_id": model_ids[self.adjudicator],
                           "prompt": prompts.hash(ADJUDICATOR_TEMPLATE),
                           "schema": adjudicator_schema(ADJUDICATOR_MAX_TOKENS, scale)}
        return debate_config_hash(self.agents, rounds=s.rounds, temperature=s.temperature,
                                  reason_words=s.reason_words, prompts=prompts, model_ids=model_ids,
                                  adjudicator=adjudicator, checks=self.checks(items),
                                  examples=fewshot_examples(s.fewshot), scale=scale,
                                  grade_consensus=s.grade_consensus, answer_first=s.answer_first,
                                  definition=definition)


def _noting_ledger(generate: Generate, answered: dict[str, bool]) -> Generate:
    """`generate`, noting for each call key whether the call ledger answered it."""
    def noting(profile: str, requests: Sequence[LLMRequest]) -> list[LLMResult]:
        results = list(generate(profile, requests))
        answered.update((result.key, result.cached) for result in results)
        return results
    return noting


def _open_rounds(history: list[list[Turn]], rounds: int) -> int:
    """Rounds a replayed debate may still take: after a round with an unanswered turn (and no
    failed one, which ends the pair in any case), every round up to the last."""
    last = history[-1]
    waiting = any(t.error == NOT_ANSWERED for t in last)
    failed = any(t.error not in (None, NOT_ANSWERED) for t in last)
    return rounds - len(history) if waiting and not failed else 0


def consensus_stability(outcome: DebateOutcome, gold: Sequence[int | None]) -> list[dict[str, Any]]:
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
