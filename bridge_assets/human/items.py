"""What the annotation page shows for an assignment: the query, its gold answers, the chunk with
each agent's quoted sentences highlighted, and the debate round by round.

The view never says whether an item is an attention check, nor shows anyone's vote.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import duckdb

from bridge_assets.human.queue import Assignment
from bridge_assets.store import table_exists


@dataclass(frozen=True)
class Segment:
    """A run of chunk text quoted by the same set of agents (empty: not quoted)."""

    text: str
    agents: tuple[str, ...] = ()


@dataclass(frozen=True)
class Turn:
    agent: str
    stance: str
    response: str | None        # 'yes' | 'no' | None when the agent's call failed
    reason: str
    quotes: tuple[str, ...]
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

    @property
    def shared_quotes(self) -> bool:
        """Whether some text was quoted by more than one agent."""
        return any(len(segment.agents) > 1 for segment in self.segments)


class ItemNotFound(LookupError):
    """The assignment's query or chunk is missing from the ingest tables."""


def _quote_pattern(quote: str) -> re.Pattern[str] | None:
    """Match a quoted sentence despite different whitespace or case (LLMs reflow quotes)."""
    words = quote.split()
    return re.compile(r"\s+".join(map(re.escape, words)), re.IGNORECASE) if words else None


def highlight(text: str, quotes_by_agent: Mapping[str, Sequence[str]]) -> tuple[Segment, ...]:
    """Cut `text` into segments, each marked with the agents that quoted it."""
    owners: list[set[str]] = [set() for _ in text]
    for agent, quotes in quotes_by_agent.items():
        for quote in quotes:
            pattern = _quote_pattern(quote)
            if pattern is None:
                continue
            for match in pattern.finditer(text):
                for i in range(match.start(), match.end()):
                    owners[i].add(agent)
    segments: list[Segment] = []
    start = 0
    for i in range(1, len(text) + 1):
        if i == len(text) or owners[i] != owners[start]:
            segments.append(Segment(text[start:i], tuple(sorted(owners[start]))))
            start = i
    return tuple(segments)


def _rounds(con: duckdb.DuckDBPyConnection, assignment: Assignment) -> tuple[Round, ...]:
    if not table_exists(con, "debate_turns"):
        return ()
    if assignment.is_attention_check:
        if assignment.dressing_pair_key is None:
            return ()
        where, params = "dataset = ? and pair_key = ?", [assignment.dataset, assignment.dressing_pair_key]
    else:
        where, params = "dataset = ? and query_id = ? and doc_id = ?", \
            [assignment.dataset, assignment.query_id, assignment.doc_id]
    rows = con.execute(f"""
        select round, agent, stance, response, coalesce(reason, ''), coalesce(reference, []),
               error is not null
        from debate_turns where {where} order by round, agent""", params).fetchall()
    rounds: dict[int, list[Turn]] = {}
    for number, agent, stance, response, reason, reference, failed in rows:
        rounds.setdefault(number, []).append(
            Turn(agent, stance, response, reason, tuple(reference), bool(failed)))
    return tuple(Round(n, tuple(turns)) for n, turns in sorted(rounds.items()))


def load_item(con: duckdb.DuckDBPyConnection, assignment: Assignment) -> ItemView:
    row = con.execute("""
        select q.text, q.answers, coalesce(c.title, ''), c.text
        from queries q, corpus c
        where q.dataset = ? and q.query_id = ? and c.dataset = q.dataset and c.doc_id = ?""",
        [assignment.dataset, assignment.query_id, assignment.doc_id]).fetchone()
    if row is None:
        raise ItemNotFound(f"dataset '{assignment.dataset}': query '{assignment.query_id}' or "
                           f"chunk '{assignment.doc_id}' is missing from queries/corpus")
    query, answers, title, text = row
    rounds = _rounds(con, assignment) if assignment.with_history else ()
    quotes: dict[str, list[str]] = {}
    for debate_round in rounds:
        for turn in debate_round.turns:
            quotes.setdefault(turn.agent, []).extend(turn.quotes)
    return ItemView(
        assignment_id=assignment.assignment_id, dataset=assignment.dataset, query=query,
        answers=tuple(answers or ()), title=title, segments=highlight(text, quotes),
        with_history=assignment.with_history, rounds=rounds, agents=tuple(sorted(quotes)))
