"""What a labeler judges: a (query, answers, chunk) triplet, keyed by its content.

A query without reference answers may carry a TREC topic's description and narrative. What
relevant means for the pair (bridge_assets.registry.relevance) comes from the query's own
definition, else its dataset's, else the default for what the query has. The scale says
whether labels are 0/1 or the grades 0-3.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import duckdb

from bridge_assets.labeling.errors import PairsError
from bridge_assets.registry.datasets import LabelScale
from bridge_assets.registry.relevance import Relevance, legacy_kind, resolve_relevance


def pair_key(query: str, answers: tuple[str, ...], chunk: str, *, description: str | None = None,
             narrative: str | None = None, scale: LabelScale = "binary",
             relevance: Relevance | None = None) -> str:
    """Content hash of what a labeler reads, by which definition and on which scale it answers:
    the same gives the same key in any dataset or run. A topic's description and narrative
    count only where the pair is judged by them; they, the scale and the definition enter only
    when they differ from what the prompts applied before definitions existed, so a binary pair
    with answers judged by them keeps the key its stored labels carry."""
    implied = legacy_kind(answers, description, narrative)
    relevance = relevance or Relevance(implied)
    if answers and relevance.kind != "narrative":
        description = narrative = None
    content: list[Any] = [query, list(answers), chunk]
    if description or narrative or scale != "binary":
        content += [description, narrative, scale]
    if relevance.kind != implied:
        content += [relevance.kind, relevance.text]
    payload = json.dumps(content, ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Pair:
    """One (query, chunk) candidate with the texts a labeler reads."""

    query_id: str
    doc_id: str
    query: str
    answers: tuple[str, ...]
    chunk: str
    description: str | None = None   # a TREC topic's, for queries without answers
    narrative: str | None = None
    scale: LabelScale = "binary"
    definition: str | None = None         # the dataset's `relevance.definition` (None: default)
    query_definition: str | None = None   # the query's own, which wins over the dataset's

    @property
    def relevance(self) -> Relevance:
        return resolve_relevance(self.definition, answers=self.answers, description=self.description,
                                 narrative=self.narrative, query_definition=self.query_definition)

    @property
    def key(self) -> str:
        return pair_key(self.query, self.answers, self.chunk, description=self.description,
                        narrative=self.narrative, scale=self.scale, relevance=self.relevance)

    def prompt_context(self) -> dict[str, Any]:
        """The variables of the labeling templates this pair fills."""
        relevance = self.relevance
        return {"query": self.query, "answers": self.answers, "chunk": self.chunk,
                "description": self.description, "narrative": self.narrative, "scale": self.scale,
                "relevance": relevance.kind, "definition": relevance.text}


def chunk_text(title: str | None, text: str) -> str:
    """The chunk as labelers see it: the document's title (BEIR convention) above its text."""
    return f"{title}\n{text}" if title else text


def topic_columns(con: duckdb.DuckDBPyConnection, alias: str = "q") -> str:
    """Select items for the description, narrative and own relevance definition of `queries`
    (as `alias`): NULL in a lake whose queries were ingested before those columns existed."""
    present = {row[0] for row in con.execute(
        "select column_name from information_schema.columns where table_name = 'queries'").fetchall()}
    return ", ".join(f"{alias}.{name}" if name in present else f"null as {name}"
                     for name in ("description", "narrative", "definition"))


def load_pairs(con: duckdb.DuckDBPyConnection, dataset: str, pairs_sql: str,
               scale: LabelScale = "binary", definition: str | None = None) -> list[Pair]:
    """Join (query_id, doc_id) rows selected by `pairs_sql` (it may use $dataset) with the
    query texts, answers, topic fields and chunk texts of `dataset`, in the order of
    `pairs_sql`; `scale`: the dataset's label scale; `definition`: its relevance definition."""
    rows = con.execute(f"""
        with wanted as ({pairs_sql})
        select w.query_id, w.doc_id, q.text, q.answers, c.title, c.text,
               q.query_id is null as unknown_query, c.doc_id is null as unknown_doc,
               {topic_columns(con)}
        from wanted w
        left join queries q on q.dataset = $dataset and q.query_id = w.query_id
        left join corpus c on c.dataset = $dataset and c.doc_id = w.doc_id
        order by w.query_id, w.doc_id""", {"dataset": dataset}).fetchall()
    unknown = [(row[0], row[1]) for row in rows if row[6] or row[7]]
    if unknown:
        raise PairsError(f"dataset '{dataset}': {len(unknown)} pair(s) name a query or document "
                          f"missing from the queries/corpus tables, e.g. {unknown[:3]}")
    return [Pair(query_id, doc_id, query, tuple(answers or ()), chunk_text(title, text),
                 description, narrative, scale, definition, query_definition)
            for query_id, doc_id, query, answers, title, text, _, _, description, narrative,
            query_definition in rows]
