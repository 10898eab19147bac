"""People's votes as a gold set: every escalated pair people have decided (human_labels' rule:
REQUIRED_VOTES accepted votes and a median), in the JSONL format `bridge label-eval --gold`
reads (bridge_assets.evaluation.goldsets), so every labeler can be re-measured on the team's
own judgments.

One triplet per decided pair: id `<dataset>/<query_id>/<doc_id>`, the query, its answers (or,
without answers, the TREC topic's narrative or description as the relevance definition), the
chunk, label 1 when the median vote is relevant (a grade of 1 or more on a graded dataset),
domain = the dataset, kind "human_votes", and a note with the votes and their agreement.
`min_agreement` keeps only the pairs people agreed on at least that much (the share of the
most frequent vote).
"""

from __future__ import annotations

import json

import duckdb
import polars as pl

from bridge_assets.human.labels import pair_tallies
from bridge_assets.human.tables import ensure_schema
from bridge_assets.labeling.pairs import topic_columns

KIND = "human_votes"


def gold_id(dataset: str, query_id: str, doc_id: str) -> str:
    return f"{dataset}/{query_id}/{doc_id}"


def gold_records(con: duckdb.DuckDBPyConnection, dataset: str | None = None,
                 min_agreement: float = 0.0) -> list[dict]:
    """The decided pairs as gold-set records (`con` sees the votes store and the pipeline's
    debate_labels, queries and corpus)."""
    ensure_schema(con)
    tallies = pair_tallies(con, dataset).filter(pl.col("decided") & (pl.col("agreement") >= min_agreement))
    if tallies.is_empty():
        return []
    con.register("gold_tallies", tallies)
    try:
        rows = con.execute(f"""
            select t.dataset, t.query_id, t.doc_id, t.label, t.votes, t.votes_relevant, t.agreement,
                   q.text, coalesce(q.answers, []), c.text, {topic_columns(con)}
            from gold_tallies t
            join queries q on q.dataset = t.dataset and q.query_id = t.query_id
            join corpus c on c.dataset = t.dataset and c.doc_id = t.doc_id
            order by t.dataset, t.query_id, t.doc_id""").fetchall()
    finally:
        con.unregister("gold_tallies")
    records = []
    for (ds, query_id, doc_id, label, votes, relevant, agreement, query, answers, chunk,
         description, narrative, query_definition) in rows:
        record = {"id": gold_id(ds, query_id, doc_id), "query": query, "answers": list(answers),
                  "chunk": chunk, "label": int(label >= 1), "domain": ds, "kind": KIND,
                  "note": f"median of {votes} people's votes (label {label}; {relevant} of {votes} "
                          f"relevant), agreement {agreement:.0%}"}
        definition = query_definition or ((narrative or description) if not answers else None)
        if definition:
            record["definition"] = definition
        records.append(record)
    return records


def export_gold(con: duckdb.DuckDBPyConnection, dataset: str | None = None,
                min_agreement: float = 0.0) -> str:
    """The gold set as JSONL text (one triplet a line)."""
    return "".join(json.dumps(record, ensure_ascii=False) + "\n"
                   for record in gold_records(con, dataset, min_agreement))
