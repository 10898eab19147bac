"""What the annotation page shows for an assignment: the query, its gold answers (or, without
them, the TREC topic's description and narrative), the chunk with each agent's quoted sentences
highlighted, the debate round by round, each quote marked when the chunk does not contain it
(an agent quoting its own words), and the scale to vote on (yes/no, or the grades 0-3).

The view never says whether an item is an attention check, nor shows anyone's vote. An
attention check gets a debate of its own, quoting its own chunk, so nothing on the page sets it
apart from a real item.
"""

from __future__ import annotations

import random
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb

from bridge_assets.errors import BridgeError
from bridge_assets.human.queue import Assignment
from bridge_assets.labeling.evidence import quote_in_chunk
from bridge_assets.labeling.pairs import topic_columns
from bridge_assets.lake.store import table_exists
from bridge_assets.registry.datasets import LabelScale
from bridge_assets.registry.relevance import resolve_relevance


def _known_texts(con: duckdb.DuckDBPyConnection, assignment: Assignment) -> tuple | None:
    """A gold set's item: its query, answers and chunk as loaded (None: the lake's texts)."""
    if not table_exists(con, "known_answers"):
        return None
    return con.execute("""select query, answers, '', chunk, null, null, null from known_answers
                          where dataset = ? and query_id = ? and doc_id = ? and query is not null""",
                       [assignment.dataset, assignment.query_id, assignment.doc_id]).fetchone()


@dataclass(frozen=True)
class Segment:
    """A run of chunk text quoted by the same set of agents (empty: not quoted)."""

    text: str
    agents: tuple[str, ...] = ()


@dataclass(frozen=True)
class Quote:
    text: str
    in_chunk: bool              # False: the chunk does not contain it (the agent's own words)


@dataclass(frozen=True)
class Turn:
    agent: str
    stance: str
    response: str | None        # 'yes' | 'no' (a grade '0'..'3' when graded) | None when the call failed
    reason: str
    quotes: tuple[Quote, ...]
    failed: bool


@dataclass(frozen=True)
class Round:
    number: int
    turns: tuple[Turn, ...]


@dataclass(frozen=True)
class ItemView:
    assignment_id: str
    dataset: str
    query: str
    answers: tuple[str, ...]
    title: str
    segments: tuple[Segment, ...]
    with_history: bool
    rounds: tuple[Round, ...] = field(default_factory=tuple)
    agents: tuple[str, ...] = field(default_factory=tuple)
    description: str | None = None   # a TREC topic's, shown when there are no answers
    narrative: str | None = None
    relevance: str = "answer_support"  # what relevant means for the pair (labeling.relevance)
    definition: str | None = None      # the definition shown (useful, or the dataset's or query's own)
    scale: LabelScale = "binary"

    @property
    def shared_quotes(self) -> bool:
        """Whether some text was quoted by more than one agent."""
        return any(len(segment.agents) > 1 for segment in self.segments)


class ItemNotFound(BridgeError, LookupError):
    """The assignment's query or chunk is missing from the ingest tables."""


def _quote_pattern(quote: str) -> re.Pattern[str] | None:
    """Match a quoted sentence despite different whitespace or case (LLMs reflow quotes)."""
    words = quote.split()
    return re.compile(r"\s+".join(map(re.escape, words)), re.IGNORECASE) if words else None


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The spans sorted, overlapping or touching ones joined."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def highlight(text: str, quotes_by_agent: Mapping[str, Sequence[str]]) -> tuple[Segment, ...]:
    """Cut `text` into segments, each marked with the agents that quoted it.

    Works on match intervals (merged per agent, then swept in order), so its cost grows with the
    number of matches, not with the length of the chunk."""
    changes: defaultdict[int, list[tuple[str, bool]]] = defaultdict(list)  # where agents start/stop
    for agent, quotes in quotes_by_agent.items():
        patterns = [p for p in map(_quote_pattern, quotes) if p is not None]
        spans = [match.span() for pattern in patterns for match in pattern.finditer(text)]
        for start, end in _merged(spans):
            changes[start].append((agent, True))
            changes[end].append((agent, False))
    # an agent's merged spans never touch, so the set of agents changes at every position here
    segments: list[Segment] = []
    active: set[str] = set()
    start = 0
    for position in sorted(changes):
        if position > start:
            segments.append(Segment(text[start:position], tuple(sorted(active))))
            start = position
        for agent, starts in changes[position]:
            (active.add if starts else active.discard)(agent)
    if start < len(text):
        segments.append(Segment(text[start:], ()))
    return tuple(segments)


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_CLAUSE_END = re.compile(r"(?<=[.!?;:,])\s+")
MAX_OWN_QUOTE = 300  # characters of a sentence an attention check's agent quotes
# Reasons for an attention check's debate: plausible, and no hint of the expected answer.
NEUTRAL_REASONS: dict[str | None, tuple[str, ...]] = {  # a leaning (None: none) -> reasons
    "yes": ("The quoted sentence addresses what the query asks.",
            "This passage bears on the question and points to an answer.",
            "The quoted text speaks to the query's topic directly."),
    "no": ("The quoted sentence does not settle what the query asks.",
           "This passage is on a nearby topic but does not give the answer.",
           "The quoted text alone is not enough to answer the question."),
}
_Row = tuple[Any, ...]  # round, agent, stance, response, reason, reference, failed


def _leaning(response: str | None) -> str | None:
    """A turn's yes/no; a grade leans yes from 2 (the chunk answers), no below."""
    if response is not None and response.isdigit():
        return "yes" if int(response) >= 2 else "no"
    return response


def _quotable(text: str, wanted: int) -> list[str]:
    """Sentences of `text`, or its clauses when it has fewer than `wanted` sentences (so that
    agents quote different parts, as they mostly do), each cut to MAX_OWN_QUOTE characters."""
    parts = [part.strip() for part in _SENTENCE_END.split(text) if part.strip()]
    if len(parts) < wanted:
        parts = [part.strip() for part in _CLAUSE_END.split(text) if part.strip()]
    return [p if len(p) <= MAX_OWN_QUOTE else p[:MAX_OWN_QUOTE].rsplit(" ", 1)[0] for p in parts]


def _own_debate(rows: list[_Row], chunk: str, seed: str) -> list[_Row]:
    """An attention check's debate: the shape of an unrelated pair's debate (rounds, agents,
    stances, verdicts, failed calls), each agent quoting a sentence of the check's own chunk, with
    a neutral reason. Shown as it was, the unrelated debate quoted another chunk, highlighted
    nothing in this one and gave the check away. `seed` (the assignment) keeps the page the same
    on reload."""
    rng = random.Random(seed)
    agents = sorted({row[1] for row in rows})
    parts = _quotable(chunk, len(agents))
    picks = rng.sample(parts, min(len(agents), len(parts)))
    quoted = {agent: [picks[i % len(picks)]] if picks else [] for i, agent in enumerate(agents)}
    return [(number, agent, stance, response, "", [], True) if failed else
            (number, agent, stance, response, rng.choice(NEUTRAL_REASONS.get(_leaning(response), ("",))),
             quoted[agent], False)
            for number, agent, stance, response, _, _, failed in rows]


def _rounds(con: duckdb.DuckDBPyConnection, assignment: Assignment, chunk: str) -> tuple[Round, ...]:
    if not table_exists(con, "debate_turns"):
        return ()
    dressed = assignment.is_attention_check and (assignment.known_source is None
                                                 or assignment.dressing_pair_key is not None)
    if dressed:
        if assignment.dressing_pair_key is None:
            return ()
        # a gold set's item borrows the shape of any dataset's debate (the first holding the key)
        where, params = ("dataset = (select min(dataset) from debate_turns where pair_key = ?) and pair_key = ?",
                         [assignment.dressing_pair_key] * 2) if assignment.dataset.startswith("goldset:") \
            else ("dataset = ? and pair_key = ?", [assignment.dataset, assignment.dressing_pair_key])
    else:  # a real pair, or a known-answer item that was debated: its own debate
        where, params = "dataset = ? and query_id = ? and doc_id = ?", \
            [assignment.dataset, assignment.query_id, assignment.doc_id]
    rows = con.execute(f"""
        select round, agent, stance, response, coalesce(reason, ''), coalesce(reference, []),
               error is not null
        from debate_turns where {where} order by round, agent""", params).fetchall()
    if dressed:
        rows = _own_debate(rows, chunk, assignment.assignment_id)
    rounds: dict[int, list[Turn]] = {}
    for number, agent, stance, response, reason, reference, failed in rows:
        quotes = tuple(Quote(q, quote_in_chunk(q, chunk)) for q in reference)
        rounds.setdefault(number, []).append(Turn(agent, stance, response, reason, quotes, bool(failed)))
    return tuple(Round(n, tuple(turns)) for n, turns in sorted(rounds.items()))


def load_item(con: duckdb.DuckDBPyConnection, assignment: Assignment,
              scale: LabelScale = "binary") -> ItemView:
    row = _known_texts(con, assignment) if assignment.known_source is not None else None
    row = row or con.execute(f"""
        select q.text, q.answers, coalesce(c.title, ''), c.text, {topic_columns(con)}
        from queries q, corpus c
        where q.dataset = ? and q.query_id = ? and c.dataset = q.dataset and c.doc_id = ?""",
        [assignment.dataset, assignment.query_id, assignment.doc_id]).fetchone()
    if row is None:
        raise ItemNotFound(f"dataset '{assignment.dataset}': query '{assignment.query_id}' or "
                           f"chunk '{assignment.doc_id}' is missing from queries/corpus")
    query, answers, title, text, description, narrative, query_definition = row
    relevance = resolve_relevance(_dataset_definition(assignment.dataset), answers=tuple(answers or ()),
                                  description=description, narrative=narrative,
                                  query_definition=query_definition)
    rounds = _rounds(con, assignment, text) if assignment.with_history else ()
    quotes: dict[str, list[str]] = {}
    for debate_round in rounds:
        for turn in debate_round.turns:
            quotes.setdefault(turn.agent, []).extend(q.text for q in turn.quotes)
    return ItemView(
        assignment_id=assignment.assignment_id, dataset=assignment.dataset, query=query,
        answers=tuple(answers or ()), title=title, segments=highlight(text, quotes),
        with_history=assignment.with_history, rounds=rounds, agents=tuple(sorted(quotes)),
        description=description, narrative=narrative, scale=scale, relevance=relevance.kind,
        definition=relevance.text)


def _dataset_definition(dataset: str) -> str | None:
    """The dataset's `relevance.definition` (None where the registry does not name it: a gold
    set's items, a dataset removed since)."""
    from bridge_assets.registry.datasets import load_registry

    spec = load_registry().get(dataset)
    return spec.relevance.definition if spec is not None else None
