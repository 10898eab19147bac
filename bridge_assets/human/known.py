"""People's accuracy against known answers, per arm (debate history shown / hidden).

Three sources of known answers:
- **attention checks** (bridge_assets.human.queue): original-qrels pairs and constructed
  irrelevant ones; a wrong answer pauses the annotator;
- **a dataset's known holes** (its `known_holes:` key, e.g. resources/data/demo/holes.jsonl),
  loaded with `bridge annotate load-known --dataset D`: the key's holes in the corpus (expected
  relevant) and as many of its other unjudged pairs of the candidate pool (expected irrelevant;
  the key reads every passage of the queries it lists, partial answers left out);
- **a label-eval gold set** (`--goldset NAME` from goldsets.yaml, or `--gold FILE`): its
  triplets, texts kept in the votes store, as the items of a dataset `goldset:<name>`.

Loaded pairs are *known-answer items*: served at `known_rate` like attention checks (the same
look; a gold set's item or an undebated pair wears an unrelated debate's shape, a debated pair
its own debate), recorded with their source, and a wrong answer pauses nobody. A known pair the
debate escalated is not served as such: people's votes on it in the queue are scored against
the key instead. `known_accuracy` scores every vote whose answer is known, per source and arm.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import duckdb
import polars as pl

from bridge_assets.errors import BridgeError
from bridge_assets.human.tables import ensure_schema, utc_now
from bridge_assets.lake.store import one_row, table_exists

if TYPE_CHECKING:
    from bridge_assets.qrels.known_holes import KnownHoles

ATTENTION = "attention checks"


class KnownAnswersError(BridgeError, ValueError):
    """Known answers that cannot be loaded (no key, pairs missing from the lake)."""


def goldset_source(name: str) -> str:
    return f"goldset:{name}"


def _replace(con: duckdb.DuckDBPyConnection, source: str, frame: pl.DataFrame) -> int:
    """Load `frame` as `source`'s known answers (replacing what that source held)."""
    ensure_schema(con)
    con.register("_known", frame.to_arrow())
    try:
        con.execute("delete from known_answers where source = ?", [source])
        clash = one_row(con, "select count(*) from _known k join known_answers a using (dataset, query_id, doc_id)"
                        )[0]
        if clash:
            raise KnownAnswersError(f"{clash} pair(s) of {source} are already loaded from another source")
        con.execute("insert into known_answers by name select *, $now as loaded_at from _known",
                    {"now": utc_now()})
    finally:
        con.unregister("_known")
    return frame.height


def load_holes(con: duckdb.DuckDBPyConnection, dataset: str, key: KnownHoles,
               irrelevant: int | None = None) -> tuple[int, int]:
    """`dataset`'s known holes (a qrels.known_holes.KnownHoles) as known answers: its holes that
    the corpus holds, expected relevant, and `irrelevant` (None: as many as the holes) of the
    candidate pool's unjudged pairs that the key says are no hole, expected irrelevant, in a
    fixed pseudo-random order. `con` reads the lake. Returns (relevant, irrelevant) loaded."""
    for table in ("corpus", "queries"):
        if not table_exists(con, table):
            raise KnownAnswersError(f"the lake has no {table} table: ingest {dataset} first")
    holes = [(q, d) for q, docs in key.holes.items() for d in sorted(docs)]
    frame = pl.DataFrame(holes, schema={"query_id": pl.String, "doc_id": pl.String}, orient="row")
    con.register("_holes", frame.to_arrow())
    try:
        present = con.execute("""select h.query_id, h.doc_id from _holes h
                                 join corpus c on c.dataset = $dataset and c.doc_id = h.doc_id
                                 join queries q on q.dataset = $dataset and q.query_id = h.query_id
                                 order by all""", {"dataset": dataset}).fetchall()
    finally:
        con.unregister("_holes")
    others: list[tuple[str, str]] = []
    if table_exists(con, "candidate_pool"):
        pool = con.execute("""select query_id, doc_id from candidate_pool
                              where dataset = ? and not in_original_qrels
                              order by hash(query_id || '/' || doc_id), query_id, doc_id""",
                           [dataset]).fetchall()
        others = [(q, d) for q, d in pool if key.label(q, d) == 0]
    others = others[:len(present) if irrelevant is None else irrelevant]
    if not present and not others:
        raise KnownAnswersError(f"none of {dataset}'s known holes is in its corpus")
    rows = [(q, d, 1) for q, d in present] + [(q, d, 0) for q, d in others]
    frame = pl.DataFrame(rows, schema={"query_id": pl.String, "doc_id": pl.String,
                                       "expected_label": pl.Int32}, orient="row")
    _replace(con, f"holes:{dataset}", frame.with_columns(source=pl.lit(f"holes:{dataset}"),
                                                        dataset=pl.lit(dataset)))
    return len(present), len(others)


def load_goldset(con: duckdb.DuckDBPyConnection, name: str, triplets: Sequence) -> int:
    """A gold set's triplets (evaluation.goldsets.GoldTriplet) as the known answers of the
    dataset `goldset:<name>`, their texts kept with them."""
    source = goldset_source(name)
    frame = pl.DataFrame({"query_id": [t.id for t in triplets], "doc_id": [t.id for t in triplets],
                          "expected_label": [t.label for t in triplets], "query": [t.query for t in triplets],
                          "answers": [list(t.answers) for t in triplets], "chunk": [t.chunk for t in triplets]},
                         schema={"query_id": pl.String, "doc_id": pl.String, "expected_label": pl.Int32,
                                 "query": pl.String, "answers": pl.List(pl.String), "chunk": pl.String})
    return _replace(con, source, frame.with_columns(source=pl.lit(source), dataset=pl.lit(source)))


def known_accuracy(con: duckdb.DuckDBPyConnection, dataset: str | None = None) -> pl.DataFrame:
    """Per source of known answers and arm (with_history): votes scored, accuracy, and the
    recall of each class (relevant / irrelevant expected) with its count, over every vote
    whose answer is known (accepted or excluded): attention checks, known-answer items, and
    queue votes on pairs a loaded key knows. A grade of 1 or more counts as relevant."""
    ensure_schema(con)
    frame = con.execute(f"""
        with scored as (
            select dataset, with_history, coalesce(known_source, '{ATTENTION}') as source,
                   expected_label as expected, least(label, 1) as said
            from human_votes where is_attention_check and expected_label is not null
            union all
            select v.dataset, v.with_history, k.source, k.expected_label, least(v.label, 1)
            from human_votes v join known_answers k using (dataset, query_id, doc_id)
            where not v.is_attention_check
        )
        select source, with_history, count(*) as votes, avg((said = expected)::integer) as accuracy,
               count(*) filter (where expected = 1) as relevant,
               avg((said = 1)::integer) filter (where expected = 1) as recall_relevant,
               count(*) filter (where expected = 0) as irrelevant,
               avg((said = 0)::integer) filter (where expected = 0) as recall_irrelevant
        from scored where $dataset is null or dataset = $dataset or source = $dataset
        group by source, with_history order by source <> '{ATTENTION}', source, with_history desc""",
        {"dataset": dataset}).pl()
    return frame.with_columns(balanced_accuracy=(pl.col("recall_relevant") + pl.col("recall_irrelevant")) / 2)


def loaded(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """Per source: the known answers loaded (relevant / irrelevant)."""
    ensure_schema(con)
    return con.execute("""select source, count(*) filter (where expected_label = 1) as relevant,
                                 count(*) filter (where expected_label = 0) as irrelevant
                          from known_answers group by source order by source""").pl()


def _share(value: float | None, n: int) -> str:
    return "-" if value is None or not n else f"{value:.0%} of {n}"


def describe_accuracy(frame: pl.DataFrame) -> str:
    """The accuracy table as `bridge annotate accuracy` prints it."""
    if frame.is_empty():
        return "no vote on a known answer yet"
    header = ("source", "arm", "votes", "accuracy", "relevant right", "irrelevant right", "bAcc")
    rows = [(r["source"], "with history" if r["with_history"] else "without", str(r["votes"]),
             f"{r['accuracy']:.0%}", _share(r["recall_relevant"], r["relevant"]),
             _share(r["recall_irrelevant"], r["irrelevant"]),
             "-" if r["balanced_accuracy"] is None else f"{r['balanced_accuracy']:.0%}")
            for r in frame.to_dicts()]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) if i < 2 else cell.rjust(w)
                               for i, (cell, w) in enumerate(zip(row, widths, strict=True))).rstrip()
                     for row in [header, *rows])
