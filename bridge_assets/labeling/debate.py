"""DREAM: agents with opposing opening stances debate each (query, answers, chunk) triplet.

Round 1 shows each agent only the opening stances; every later round shows all earlier turns.
After each round, pairs whose agents all give the same response agree; after the last round
the others are escalated with their full history. A turn whose call failed, or whose reply is
not the JSON the schema asks for, ends the pair as `failed` (escalated too): a failure never
becomes a label.

An agreement becomes the pair's label (outcome `consensus`) only when it passes the checks
(`DebateChecks`, all optional): a "yes" must rest on a quote that is really in the chunk
(evidence), on a chunk that contains a reference answer (answer presence, for short-answer
datasets), and every agent must be sure enough of its answer (confidence: the probability
of its yes/no token). An agreement that fails a check is escalated, with the failed checks
as its `flags`. A human budget caps the escalations: beyond it the least confident pairs are
escalated and the others get the agents' pooled vote (outcome `vote`, an unverified label).

On a graded dataset (`Pair.scale` 'graded') agents answer with a grade 0-3 (TREC DL / UMBRELA)
instead of yes/no. Their grades agree under the `grade_consensus` rule: `exact` (all equal) or
`within_one` (at most one grade apart; the lower grade is kept, so a label never claims more
relevance than every agent saw). The evidence check then applies to a grade of 1 or more, the
answer check to 2 or more (a grade of 1 says the chunk does not answer); grades carry no
confidence, so `min_confidence` does not apply.

Persistence mode (`persistence` R, an evaluation of the debate, `bridge label-eval
--persistence R`; never the pipeline's) keeps every pair debating to round R whatever its
agents said (a failed turn still ends it): each pair is still decided as above, at the round
the debate would have stopped, and the turns after that round are kept apart
(`DebateOutcome.continued`), so labels, turns and adjudication are those of the debate that
stops; only the measurement of how agreements hold (labeling/persistence.py) reads them.

Agents within a round answer independently, so a round is one batch: the requests of all
pairs still debating go to the model in one `generate` call per model profile, which lets a
server see many requests at once and lets the call ledger store the round as it returns.
`pair_major` debates one pair at a time instead (its rounds one after the other, then the next
pair): for a model in this process, which keeps one KV sequence and reuses only the prefix a
prompt shares with the previous one, a pair's round 2 then follows its own round 1 (the
demo's 12-pair debate sequence: 5,687 prompt tokens computed instead of 8,018, simulated;
docs/llm-time.md). Each pair's debate depends on its own turns only, so the labels and turns
are the same in either order.

A turn itself (the agents, the reply's schema, the request and the reading of the reply) is in
debate_turns.py.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Literal, TypedDict

import polars as pl

from bridge_assets.labeling.calls import Generate, generate_grouped
from bridge_assets.labeling.debate_turns import (
    DEFAULT_REASON_WORDS,
    AgentConfig,
    Turn,
    read_turn,
    turn_request,
    turn_schema,
)
from bridge_assets.labeling.evidence import DEFAULT_MIN_RATIO, answer_in_chunk, answers_are_short
from bridge_assets.labeling.pairs import Pair
from bridge_assets.labeling.prompts import Prompts
from bridge_assets.llm.budget import DEFERRED
from bridge_assets.registry.datasets import LabelScale

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

Outcome = Literal["consensus", "escalated", "failed", "vote"]
AnswerPresence = Literal["off", "short", "all"]
GradeConsensus = Literal["exact", "within_one"]

# Escalation reasons (the `flags` of a pair): why people, not the agents, must decide.
FLAG_DISAGREEMENT = "disagreement"
FLAG_FAILED = "failed"
FLAG_EVIDENCE = "unverified_evidence"
FLAG_ANSWER = "answer_absent"
FLAG_CONFIDENCE = "low_confidence"
# A turn an automation run's LLM call cap left unasked: the pair waits (pending), and the next
# explicit run asks it.
FLAG_DEFERRED = "deferred"


def failure_flags(turns: Sequence[Turn]) -> tuple[str, ...]:
    """Why a pair failed: its calls were deferred by an automation cap, or they failed."""
    errors = {t.error for t in turns if t.response is None}
    return (FLAG_DEFERRED,) if errors == {DEFERRED} else (FLAG_FAILED,)


@dataclass(frozen=True)
class PairLabel:
    """A pair's outcome (a row of the `debate_labels` table, without dataset and config)."""

    query_id: str
    doc_id: str
    pair_key: str
    label: int | None  # 1 relevant, 0 not (or the grade); outcome 'consensus' (and 'vote', unverified)
    outcome: Outcome
    rounds_used: int
    agreed_label: int | None = None    # what the agents agreed on, whether or not it passed the checks
    flags: tuple[str, ...] = ()        # why the pair went to people (see FLAG_*)
    confidence: float | None = None    # the weakest agent's P(its answer) in the last round
    p_yes: float | None = None         # the agents' mean P(yes) in the last round
    answer_present: bool | None = None  # a reference answer occurs in the chunk (when checked)
    adjudicator_label: int | None = None
    adjudicator_call_key: str | None = None
    adjudicator_error: str | None = None


class RoundMeasures(TypedDict, total=False):
    """The PairLabel fields a round measures whatever its outcome."""

    confidence: float | None
    p_yes: float | None
    answer_present: bool | None


@dataclass(frozen=True)
class DebateChecks:
    """What an agreement must pass to become a label; see the module docstring.

    Off (the defaults) means the agents' agreement is the label, as in the paper.
    """

    evidence: bool = False           # a "yes" needs an agent's quote found in the chunk
    # a "yes" needs a reference answer in the chunk: on pairs whose answers are short spans
    # (NQ-style; `answers_are_short`), on every pair with answers, or never
    answer_presence: AnswerPresence = "off"
    min_confidence: float = 0.0      # every agent's P(its answer) at least this
    quote_ratio: float = DEFAULT_MIN_RATIO
    budget: int | None = None        # escalate at most this many pairs (None: no cap)

    def as_config(self) -> dict:
        return asdict(self)


@dataclass
class DebateOutcome:
    labels: list[PairLabel]
    turns: list[Turn]
    agents: tuple[AgentConfig, ...] = ()
    rounds: int = 0
    # persistence mode: the rounds every pair was debated, and the turns after each pair's
    # decision (the debate that stops has none)
    persistence: int = 0
    continued: list[Turn] = field(default_factory=list)

    def all_turns(self) -> list[Turn]:
        """The turns of the debate that stops, then those of the rounds it continued."""
        return [*self.turns, *self.continued]

    def consensus_by_round(self) -> dict[int, int]:
        """Pairs agreed by the end of each round (cumulative), for rounds 1..R."""
        agreed = [label.rounds_used for label in self.labels if label.outcome == "consensus"]
        return {r: sum(1 for used in agreed if used <= r) for r in range(1, self.rounds + 1)}

    def count(self, outcome: Outcome) -> int:
        return sum(1 for label in self.labels if label.outcome == outcome)

    def flag_counts(self) -> dict[str, int]:
        """Escalated or failed pairs per reason (a pair may carry several)."""
        counts: dict[str, int] = {}
        for label in self.labels:
            if label.outcome in ("escalated", "failed"):
                for flag in label.flags:
                    counts[flag] = counts.get(flag, 0) + 1
        return dict(sorted(counts.items()))

    def histories(self) -> dict[tuple[str, str], list[list[Turn]]]:
        """Each pair's turns, (query_id, doc_id) -> rounds in order -> turns in agent order."""
        grouped: dict[tuple[str, str], dict[int, list[Turn]]] = defaultdict(lambda: defaultdict(list))
        for turn in self.turns:
            grouped[(turn.query_id, turn.doc_id)][turn.round].append(turn)
        return {pair: [rounds[r] for r in sorted(rounds)] for pair, rounds in grouped.items()}


def decide_graded(pair: Pair, turns: Sequence[Turn], round_number: int, last_round: bool,
                  checks: DebateChecks | None, consensus: GradeConsensus) -> PairLabel | None:
    """decide() on the graded scale: see the module docstring."""
    common = RoundMeasures(answer_present=answer_in_chunk(pair.answers, pair.chunk)
                           if checks and answer_check_applies(checks.answer_presence, pair.answers) else None)
    responses = [t.response for t in turns if t.response is not None]
    if len(responses) < len(turns):
        return PairLabel(pair.query_id, pair.doc_id, pair.key, None, "failed", round_number,
                         flags=failure_flags(turns), **common)
    grades = [int(response) for response in responses]
    if max(grades) - min(grades) > (1 if consensus == "within_one" else 0):
        if not last_round:
            return None
        return PairLabel(pair.query_id, pair.doc_id, pair.key, None, "escalated", round_number,
                         flags=(FLAG_DISAGREEMENT,), **common)
    agreed = min(grades)
    flags = []
    if checks is not None:
        if agreed >= 1 and checks.evidence and not any(t.evidence == "verified" for t in turns):
            flags.append(FLAG_EVIDENCE)
        if agreed >= 2 and common["answer_present"] is False:
            flags.append(FLAG_ANSWER)
    if flags:
        return PairLabel(pair.query_id, pair.doc_id, pair.key, None, "escalated", round_number,
                         agreed_label=agreed, flags=tuple(flags), **common)
    return PairLabel(pair.query_id, pair.doc_id, pair.key, agreed, "consensus", round_number,
                     agreed_label=agreed, **common)


def decide(pair: Pair, turns: Sequence[Turn], round_number: int, last_round: bool,
           checks: DebateChecks | None) -> PairLabel | None:
    """The pair's label after a round, or None while its agents still disagree and rounds are
    left."""
    p_yes_values = [t.p_yes for t in turns if t.p_yes is not None]
    confidences = [t.confidence for t in turns if t.confidence is not None]
    # each None unless every agent's is known
    common = RoundMeasures(
        confidence=min(confidences) if len(confidences) == len(turns) else None,
        p_yes=sum(p_yes_values) / len(p_yes_values) if len(p_yes_values) == len(turns) else None,
        answer_present=answer_in_chunk(pair.answers, pair.chunk)
        if checks and answer_check_applies(checks.answer_presence, pair.answers) else None)
    responses = {t.response for t in turns}
    if None in responses:
        return PairLabel(pair.query_id, pair.doc_id, pair.key, None, "failed", round_number,
                         flags=failure_flags(turns), **common)
    if len(responses) > 1:
        if not last_round:
            return None
        return PairLabel(pair.query_id, pair.doc_id, pair.key, None, "escalated", round_number,
                         flags=(FLAG_DISAGREEMENT,), **common)
    agreed = int(responses.pop() == "yes")
    flags = []
    if checks is not None:
        if agreed and checks.evidence and not any(t.evidence == "verified" for t in turns):
            flags.append(FLAG_EVIDENCE)
        if agreed and common["answer_present"] is False:
            flags.append(FLAG_ANSWER)
        confidence = common["confidence"]
        if checks.min_confidence > 0 and confidence is not None and confidence < checks.min_confidence:
            flags.append(FLAG_CONFIDENCE)
    if flags:
        return PairLabel(pair.query_id, pair.doc_id, pair.key, None, "escalated", round_number,
                         agreed_label=agreed, flags=tuple(flags), **common)
    return PairLabel(pair.query_id, pair.doc_id, pair.key, agreed, "consensus", round_number,
                     agreed_label=agreed, **common)


def answer_check_applies(mode: AnswerPresence, answers: Sequence[str]) -> bool:
    if mode == "off" or not answers:
        return False
    return mode == "all" or answers_are_short([answers])


def escalation_count(n: int, ratio: float) -> int:
    """How many of `n` cases an escalation ratio sends to humans: the fewest whose share
    reaches `ratio` (3.5% of 48 -> 2 cases, 4.2%)."""
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"escalation ratio must be within [0, 1], got {ratio}")
    return min(n, math.ceil(ratio * n - 1e-9))


def certainty(label: PairLabel) -> float:
    """How far the pooled P(yes) is from a coin toss, 0 (the least certain) when unknown."""
    return 0.0 if label.p_yes is None else abs(label.p_yes - 0.5)


def apply_budget(labels: list[PairLabel], budget: int) -> list[PairLabel]:
    """Escalate at most `budget` pairs: failed pairs always (nobody answered them), then the
    least certain of the others (pooled P(yes) closest to 0.5; unknown counts as least
    certain). The others over the budget get the pooled vote, P(yes) >= 0.5 (or, without
    log-probabilities, what the agents agreed on), as outcome 'vote'; a disagreement with
    neither stays escalated."""
    open_ = [i for i, label in enumerate(labels) if label.outcome in ("escalated", "failed")]
    if len(open_) <= budget:
        return labels
    failed = [i for i in open_ if labels[i].outcome == "failed"]
    others = sorted((i for i in open_ if labels[i].outcome != "failed"),
                    key=lambda i: (certainty(labels[i]), i))
    over = others[max(0, budget - len(failed)):]
    decided = list(labels)
    for i in over:
        label = labels[i]
        vote = int(label.p_yes >= 0.5) if label.p_yes is not None else label.agreed_label
        if vote is not None:
            decided[i] = replace(label, label=vote, outcome="vote")
    return decided


def run_debate(pairs: Sequence[Pair], agents: Sequence[AgentConfig], generate: Generate, *,
               rounds: int = 2, temperature: float = 0.0, reason_words: int = DEFAULT_REASON_WORDS,
               examples: Sequence[Mapping] = (), prompts: Prompts | None = None,
               checks: DebateChecks | None = None,
               grade_consensus: GradeConsensus = "exact", answer_first: bool = False,
               persistence: int = 0, pair_major: bool = False) -> DebateOutcome:
    """Debate every pair for at most `rounds` rounds; see the module docstring. `checks`
    None: no checks (the LLMJudge); `reason_words`: the word limit of each turn's reason;
    `examples`: worked examples shown in the prompt (`worked_examples()`);
    `grade_consensus`: when graded pairs' agents agree; `answer_first`: each turn gives its
    yes/no before its quotes and reason (`turn_schema`); `persistence` R (0: off, else at
    least `rounds`): every pair goes on to round R after its decision (the module docstring);
    `pair_major`: one pair's rounds at a time rather than one round of every pair (same result)."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    if persistence and persistence < rounds:
        raise ValueError(f"persistence must be 0 (off) or at least the debate's rounds ({rounds}), "
                         f"got {persistence}")
    if not agents:
        raise ValueError("a debate needs at least one agent")
    if len({agent.name for agent in agents}) != len(agents):
        raise ValueError(f"agent names must be distinct: {[a.name for a in agents]}")
    prompts = prompts or Prompts()
    agents = tuple(agents)
    quote_ratio = checks.quote_ratio if checks else DEFAULT_MIN_RATIO
    histories: dict[int, list[list[Turn]]] = {i: [] for i in range(len(pairs))}
    labels: dict[int, PairLabel] = {}

    def debate_rounds(active: list[int]) -> None:
        """Debate the pairs `active` round by round (one batch a round) until each is decided."""
        for round_number in range(1, max(rounds, persistence) + 1):
            if not active:
                return
            slots = [(i, agent) for i in active for agent in agents]
            requests = [(agent.model, turn_request(pairs[i], agent, agents, histories[i], round_number,
                                                   prompts, temperature, reason_words, examples,
                                                   answer_first))
                        for i, agent in slots]
            results = generate_grouped(requests, generate)
            round_turns: dict[int, list[Turn]] = defaultdict(list)
            for (i, agent), result in zip(slots, results, strict=True):
                round_turns[i].append(read_turn(pairs[i], agent, round_number, result, reason_words, quote_ratio))
            still_active = []
            for i in active:
                histories[i].append(round_turns[i])
                if i in labels:  # persistence mode: decided, debating on while every turn is answered
                    if all(t.response is not None for t in round_turns[i]):
                        still_active.append(i)
                    continue
                last_round = round_number == rounds
                if pairs[i].scale == "graded":
                    label = decide_graded(pairs[i], round_turns[i], round_number, last_round, checks,
                                          grade_consensus)
                else:
                    label = decide(pairs[i], round_turns[i], round_number, last_round, checks)
                if label is None:
                    still_active.append(i)
                else:
                    labels[i] = label
                    if persistence and label.outcome != "failed":
                        still_active.append(i)
            active = still_active

    for group in ([[i] for i in range(len(pairs))] if pair_major else [list(range(len(pairs)))]):
        debate_rounds(group)
    ordered = [labels[i] for i in range(len(pairs))]
    if checks is not None and checks.budget is not None:
        ordered = apply_budget(ordered, checks.budget)
    turns = [turn for i in range(len(pairs)) for round_turns in histories[i][:labels[i].rounds_used]
             for turn in round_turns]
    continued = [turn for i in range(len(pairs)) for round_turns in histories[i][labels[i].rounds_used:]
                 for turn in round_turns]
    return DebateOutcome(ordered, turns, agents, rounds, persistence, continued)


def debate_config_hash(agents: Sequence[AgentConfig], *, rounds: int, temperature: float,
                       reason_words: int, prompts: Prompts, model_ids: Mapping[str, str],
                       adjudicator: Mapping[str, object] | None = None,
                       checks: DebateChecks | None = None, examples: Sequence[Mapping] = (),
                       scale: LabelScale = "binary", grade_consensus: GradeConsensus = "exact",
                       answer_first: bool = False, definition: str | None = None) -> str:
    """A label's labeler configuration: agents, their models (profile and model id), rounds,
    sampling, the prompts' content hashes and extra variables, the checks and the
    adjudicator's settings when one runs; on the graded scale, the scale and the consensus
    rule (absent on the binary one, whose hashes stay those already stored); the dataset's
    relevance definition where it states one."""
    templates = sorted({agent.template for agent in agents})
    config = {
        "agents": [[a.name, a.stance, a.model, model_ids.get(a.model, "")] for a in agents],
        "rounds": rounds, "temperature": temperature, "reason_words": reason_words,
        "prompts": {name: prompts.hash(name) for name in templates}, "examples": list(examples),
        "checks": checks.as_config() if checks else None,
        "schema": turn_schema(reason_words), "adjudicator": adjudicator,
    }
    if scale == "graded":
        config.update(scale=scale, grade_consensus=grade_consensus,
                      schema=turn_schema(reason_words, scale))
    if answer_first:  # absent when off, so the hashes already stored stay valid
        config.update(answer_first=True, schema=turn_schema(reason_words, answer_first=True))
    if definition is not None:  # likewise absent where the dataset states none
        config["definition"] = definition
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


LABEL_SCHEMA: dict[str, PolarsDataType] = {
    "query_id": pl.Utf8, "doc_id": pl.Utf8, "pair_key": pl.Utf8, "label": pl.Int32, "outcome": pl.Utf8,
    "rounds_used": pl.Int32, "agreed_label": pl.Int32, "flags": pl.List(pl.Utf8), "confidence": pl.Float64,
    "p_yes": pl.Float64, "answer_present": pl.Boolean, "adjudicator_label": pl.Int32,
    "adjudicator_call_key": pl.Utf8, "adjudicator_error": pl.Utf8}
TURN_COLUMNS: dict[str, PolarsDataType] = {
    "query_id": pl.Utf8, "doc_id": pl.Utf8, "pair_key": pl.Utf8, "round": pl.Int32, "agent": pl.Utf8,
    "stance": pl.Utf8, "model": pl.Utf8, "reference": pl.List(pl.Utf8), "reason": pl.Utf8, "response": pl.Utf8,
    "call_key": pl.Utf8, "error": pl.Utf8, "evidence": pl.Utf8, "confidence": pl.Float64}


def labels_frame(outcome: DebateOutcome, dataset: str, config_hash: str) -> pl.DataFrame:
    """The `debate_labels` rows of `dataset`."""
    rows = [{**asdict(label), "flags": list(label.flags)} for label in outcome.labels]
    frame = pl.DataFrame(rows, schema=LABEL_SCHEMA)
    return frame.with_columns(pl.lit(dataset).alias("dataset"), pl.lit(config_hash).alias("config_hash"))


def turns_frame(outcome: DebateOutcome, dataset: str) -> pl.DataFrame:
    """The `debate_turns` rows of `dataset`."""
    rows = [{**asdict(turn), "reference": list(turn.reference)} for turn in outcome.turns]
    return pl.DataFrame(rows, schema=TURN_COLUMNS).with_columns(pl.lit(dataset).alias("dataset"))
