"""What a labeler judges: a (query, answers, chunk) triplet, keyed by its content."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import duckdb


def pair_key(query: str, answers: tuple[str, ...], chunk: str) -> str:
    """Content hash of a triplet: the same texts give the same key in any dataset or run."""
    payload = json.dumps([query, list(answers), chunk], ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Pair:
    """One (query, chunk) candidate with the texts a labeler reads."""

    query_id: str
    doc_id: str
    query: str
    answers: tuple[str, ...]
    chunk: str

    @property
    def key(self) -> str:
        return pair_key(self.query, self.answers, self.chunk)


def chunk_text(title: str | None, text: str) -> str:
    """The chunk as labelers see it: the document's title (BEIR convention) above its text."""
    return f"{title}\n{text}" if title else text


def load_pairs(con: duckdb.DuckDBPyConnection, dataset: str, pairs_sql: str) -> list[Pair]:
    """Join (query_id, doc_id) rows selected by `pairs_sql` (it may use $dataset) with the
    query texts, answers and chunk texts of `dataset`, in the order of `pairs_sql`."""
    rows = con.execute(f"""
        with wanted as ({pairs_sql})
        select w.query_id, w.doc_id, q.text, q.answers, c.title, c.text,
               q.query_id is null as unknown_query, c.doc_id is null as unknown_doc
        from wanted w
        left join queries q on q.dataset = $dataset and q.query_id = w.query_id
        left join corpus c on c.dataset = $dataset and c.doc_id = w.doc_id
        order by w.query_id, w.doc_id""", {"dataset": dataset}).fetchall()
    unknown = [(row[0], row[1]) for row in rows if row[6] or row[7]]
    if unknown:
        raise LookupError(f"dataset '{dataset}': {len(unknown)} pair(s) name a query or document "
                          f"missing from the queries/corpus tables, e.g. {unknown[:3]}")
    return [Pair(query_id, doc_id, query, tuple(answers or ()), chunk_text(title, text))
            for query_id, doc_id, query, answers, title, text, _, _ in rows]
