"""Which item an annotator gets next.

Every escalated pair needs REQUIRED_VOTES accepted votes from distinct annotators (one more
while tied). An annotator is never served the same pair twice, and an item served but not yet
answered reserves its slot for a while (the lease), so three people do not vote on a pair that
needs one more vote. About `attention_rate` of the items are attention checks: a pair whose
answer is known (an original-qrels chunk with its query, or a chunk gold for another query that
contains none of this query's answers) dressed in the shape of an unrelated pair's debate (the
item view fills it with quotes from the check's own chunk). About `known_rate` of them are
known-answer items, while any are loaded (bridge_assets.human.known: a dataset's known holes, a
gold set): served and recorded as attention checks are, but a wrong answer pauses nobody; they
measure people's accuracy. A known pair the debate escalated is never served this way (its own
votes are scored against the key instead); one it debated shows its own debate.

Order: pairs that already have votes first (finish what was started), then by impact (the
pipeline's pending_impact table: pairs whose label can decide a rank change first, largest
share of the doubt first; bridge_assets.analysis.impact), then by dataset, query and chunk.
Without pending_impact (not materialized yet) the impact is left out of the order.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import astuple, dataclass
from datetime import datetime, timedelta

import duckdb
import polars as pl

from bridge_assets.human.labels import REQUIRED_VOTES, for_people_sql, pair_tallies, tallies_sql
from bridge_assets.human.tables import ensure_schema, utc_now
from bridge_assets.lake.store import one_row, table_exists


@dataclass(frozen=True)
class QueueSettings:
    with_history: bool = True          # serve this batch with the debate history (recorded per vote)
    attention_rate: float = 0.1        # share of items that are attention checks
    known_rate: float = 0.1            # share of items that are known-answer items (when loaded)
    datasets: tuple[str, ...] | None = None   # None: every dataset with escalated pairs
    lease: timedelta = timedelta(minutes=30)


@dataclass(frozen=True)
class Assignment:
    assignment_id: str
    annotator_id: str
    dataset: str
    query_id: str
    doc_id: str
    is_attention_check: bool
    expected_label: int | None
    dressing_pair_key: str | None
    with_history: bool
    state: str
    assigned_at: datetime
    known_source: str | None = None  # a known-answer item's source (known_answers); None otherwise


_ASSIGNMENT_COLUMNS = ("assignment_id, annotator_id, dataset, query_id, doc_id, is_attention_check, "
                       "expected_label, dressing_pair_key, with_history, state, assigned_at, known_source")


def get_assignment(con: duckdb.DuckDBPyConnection, assignment_id: str) -> Assignment | None:
    row = con.execute(f"select {_ASSIGNMENT_COLUMNS} from annotation_assignments "
                      "where assignment_id = ?", [assignment_id]).fetchone()
    return Assignment(*row) if row else None


def pairs_open_to(con: duckdb.DuckDBPyConnection, annotator_id: str, settings: QueueSettings,
                  now: datetime) -> pl.DataFrame:
    """Escalated pairs `annotator_id` may vote on, pairs closest to done first, then by impact
    (see the module doc): still short of votes once the others' live leases are counted, and
    never served to (or voted on by) them."""
    ensure_schema(con)
    if not table_exists(con, "debate_labels"):
        return pl.DataFrame(schema={"dataset": pl.String, "query_id": pl.String,
                                    "doc_id": pl.String, "votes": pl.Int32, "impact": pl.Float64,
                                    "impact_rank": pl.Int32})
    impact = table_exists(con, "pending_impact")
    frame = con.execute(f"""
        with tallies as ({tallies_sql(con)}),
        impact as ({"select dataset, query_id, doc_id, impact, impact_rank from pending_impact"
                    if impact else "select null::varchar as dataset, null::varchar as query_id, "
                    "null::varchar as doc_id, null::double as impact, null::integer as impact_rank"}),
        leases as (
            select dataset, query_id, doc_id, count(*) as n
            from annotation_assignments
            where state = 'open' and not is_attention_check and assigned_at > $lease_start
              and annotator_id <> $annotator
            group by all
        )
        select t.dataset, t.query_id, t.doc_id, t.votes, i.impact, i.impact_rank
        from tallies t left join leases l using (dataset, query_id, doc_id)
        left join impact i using (dataset, query_id, doc_id)
        where not t.decided
          -- votes still needed: the missing ones, or one more to break a tie
          and greatest($required_votes - t.votes, 1) > coalesce(l.n, 0)
          and not exists (select 1 from annotation_assignments a
                          where a.annotator_id = $annotator and not a.is_attention_check
                            and a.dataset = t.dataset and a.query_id = t.query_id
                            and a.doc_id = t.doc_id)
          and not exists (select 1 from human_votes v
                          where v.annotator_id = $annotator and not v.is_attention_check
                            and v.dataset = t.dataset and v.query_id = t.query_id
                            and v.doc_id = t.doc_id)
        -- the calibration sample first: the measurement that decides what the models' labels count for
        order by t.review is not distinct from 'calibration' desc, t.votes desc, coalesce(i.impact, 0) desc, t.dataset, i.impact_rank nulls last,
                 t.query_id, t.doc_id""",
        {"dataset": None, "required_votes": REQUIRED_VOTES, "annotator": annotator_id,
         "lease_start": now - settings.lease}).pl()
    if settings.datasets is not None:
        frame = frame.filter(pl.col("dataset").is_in(list(settings.datasets)))
    return frame


def _open_assignment(con: duckdb.DuckDBPyConnection, annotator_id: str,
                     datasets: tuple[str, ...] | None) -> Assignment | None:
    """The annotator's unanswered item among `datasets` (None: any). An item of another
    dataset is left alone: its lease runs out as usual."""
    among = "" if datasets is None else "and list_contains(?, dataset) "
    row = con.execute(f"select {_ASSIGNMENT_COLUMNS} from annotation_assignments "
                      f"where annotator_id = ? and state = 'open' {among}order by assigned_at limit 1",
                      [annotator_id, *([list(datasets)] if datasets is not None else [])]).fetchone()
    return Assignment(*row) if row else None


def pair_is_decided(con: duckdb.DuckDBPyConnection, dataset: str, query_id: str, doc_id: str) -> bool:
    """Whether the pair has its votes: REQUIRED_VOTES accepted ones and a median (the two middle
    votes agree), as sql/human_labels.sql decides. Reads the votes store only, so that recording
    a vote never waits on the pipeline's file."""
    labels = sorted(row[0] for row in con.execute(
        "select label from human_votes where dataset = ? and query_id = ? and doc_id = ? "
        "and status = 'accepted' and not is_attention_check", [dataset, query_id, doc_id]).fetchall())
    votes = len(labels)
    return votes >= REQUIRED_VOTES and labels[(votes + 1) // 2 - 1] == labels[votes // 2]


def close_assignment(con: duckdb.DuckDBPyConnection, assignment_id: str, state: str) -> None:
    con.execute("update annotation_assignments set state = ?, closed_at = ? where assignment_id = ?",
                [state, utc_now(), assignment_id])


def _insert(con: duckdb.DuckDBPyConnection, annotator_id: str, dataset: str, query_id: str,
            doc_id: str, *, with_history: bool, now: datetime, expected_label: int | None = None,
            dressing_pair_key: str | None = None, known_source: str | None = None) -> Assignment:
    assignment = Assignment(uuid.uuid4().hex, annotator_id, dataset, query_id, doc_id,
                            expected_label is not None, expected_label, dressing_pair_key,
                            with_history, "open", now, known_source)
    con.execute(f"insert into annotation_assignments ({_ASSIGNMENT_COLUMNS}) "
                "values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", list(astuple(assignment)))
    return assignment


def _known_relevant(con: duckdb.DuckDBPyConnection, dataset: str, annotator_id: str, rng: random.Random) -> tuple[str, str] | None:
    rows = con.execute("""
        select r.query_id, r.doc_id
        from original_qrels r
        join queries q on q.dataset = r.dataset and q.query_id = r.query_id
        join corpus c on c.dataset = r.dataset and c.doc_id = r.doc_id
        where r.dataset = ? and r.relevance > 0
          and not exists (select 1 from annotation_assignments a
                          where a.annotator_id = ? and a.is_attention_check and a.dataset = r.dataset
                            and a.query_id = r.query_id and a.doc_id = r.doc_id)
        order by r.query_id, r.doc_id""", [dataset, annotator_id]).fetchall()
    return tuple(rng.choice(rows)) if rows else None


def _known_irrelevant(con: duckdb.DuckDBPyConnection, dataset: str, annotator_id: str, rng: random.Random) -> tuple[str, str] | None:
    """A query with answers and a chunk that is gold for another query, not judged for this one,
    and mentions none of this query's answers: irrelevant by construction. Without these, an
    annotator answering "yes" to everything would pass every check."""
    queries = [r[0] for r in con.execute(
        "select query_id from queries where dataset = ? and len(answers) > 0 order by query_id",
        [dataset]).fetchall()]
    if not queries:
        return None
    query_id = rng.choice(queries)
    docs = [r[0] for r in con.execute("""
        select distinct r.doc_id
        from original_qrels r
        join corpus c on c.dataset = r.dataset and c.doc_id = r.doc_id
        join queries q on q.dataset = r.dataset and q.query_id = $query_id
        where r.dataset = $dataset and r.query_id <> $query_id and r.relevance > 0
          and not exists (select 1 from original_qrels o where o.dataset = r.dataset
                          and o.query_id = $query_id and o.doc_id = r.doc_id)
          and not list_bool_or(list_transform(q.answers,
                                              lambda a: contains(lower(c.text), lower(trim(a)))))
          and not exists (select 1 from annotation_assignments a
                          where a.annotator_id = $annotator and a.is_attention_check
                            and a.dataset = r.dataset and a.query_id = $query_id and a.doc_id = r.doc_id)
        order by r.doc_id""", {"dataset": dataset, "query_id": query_id,
                               "annotator": annotator_id}).fetchall()]
    return (query_id, rng.choice(docs)) if docs else None


def _dressing(con: duckdb.DuckDBPyConnection, dataset: str | None, query_id: str, rng: random.Random) -> str | None:
    """An unrelated pair (another query) whose debate lends its shape to an attention check's;
    `dataset` None: of any dataset (a gold set's item)."""
    if not table_exists(con, "debate_turns"):
        return None
    keys = [r[0] for r in con.execute(
        "select distinct pair_key from debate_turns where ($dataset is null or dataset = $dataset) "
        "and query_id <> $query order by pair_key", {"dataset": dataset, "query": query_id}).fetchall()]
    return rng.choice(keys) if keys else None


def _known_item(con: duckdb.DuckDBPyConnection, annotator_id: str, settings: QueueSettings, rng: random.Random,
                now: datetime) -> Assignment | None:
    """A known-answer item this annotator has not been served (in an order of their own), among
    the served datasets' known pairs and the loaded gold sets; None when none is left."""
    if not table_exists(con, "known_answers"):
        return None
    escalated = f"and not {for_people_sql(con, 'k')}"
    row = con.execute(f"""
        select k.source, k.dataset, k.query_id, k.doc_id, k.expected_label, k.query is not null
        from known_answers k
        where (k.query is not null or $datasets is null or list_contains($datasets, k.dataset))
          and not exists (select 1 from annotation_assignments a where a.annotator_id = $annotator
                          and a.dataset = k.dataset and a.query_id = k.query_id and a.doc_id = k.doc_id)
          and not exists (select 1 from human_votes v where v.annotator_id = $annotator
                          and v.dataset = k.dataset and v.query_id = k.query_id and v.doc_id = k.doc_id)
          {escalated}
        order by hash($annotator || k.dataset || k.query_id || k.doc_id), k.dataset, k.query_id, k.doc_id
        limit 1""", {"annotator": annotator_id, "datasets": list(settings.datasets) if settings.datasets
                     is not None else None}).fetchone()
    if row is None:
        return None
    source, dataset, query_id, doc_id, expected, own_texts = row
    dressing = None
    if settings.with_history and (own_texts or not _debated(con, dataset, query_id, doc_id)):
        dressing = _dressing(con, None if own_texts else dataset, query_id, rng)
    return _insert(con, annotator_id, dataset, query_id, doc_id, with_history=settings.with_history,
                   now=now, expected_label=expected, dressing_pair_key=dressing, known_source=source)


def _debated(con: duckdb.DuckDBPyConnection, dataset: str, query_id: str, doc_id: str) -> bool:
    """Whether the pair has a debate of its own (shown as it was on its known-answer item)."""
    return table_exists(con, "debate_turns") and one_row(
        con, "select count(*) > 0 from debate_turns where dataset = ? and query_id = ? and doc_id = ?",
        [dataset, query_id, doc_id])[0]


def _attention_check(con: duckdb.DuckDBPyConnection, dataset: str, annotator_id: str, settings: QueueSettings,
                     rng: random.Random, now: datetime) -> Assignment | None:
    if not all(table_exists(con, t) for t in ("original_qrels", "queries", "corpus")):
        return None
    kinds = [(1, _known_relevant), (0, _known_irrelevant)]
    rng.shuffle(kinds)
    for expected_label, pick in kinds:
        pair = pick(con, dataset, annotator_id, rng)
        if pair:
            dressing = _dressing(con, dataset, pair[0], rng) if settings.with_history else None
            return _insert(con, annotator_id, dataset, *pair, with_history=settings.with_history,
                           now=now, expected_label=expected_label, dressing_pair_key=dressing)
    return None


@dataclass(frozen=True)
class Served:
    assignment: Assignment | None
    # pairs still open to the annotator once `assignment` is served (progress's remaining_for_you),
    # when serving it read them; None when it was their unanswered item, found without reading them
    open_after: int | None


def next_assignment(con: duckdb.DuckDBPyConnection, annotator_id: str, settings: QueueSettings,
                    rng: random.Random, now: datetime | None = None) -> Assignment | None:
    """The item to show `annotator_id` now (their unanswered one first); None when nothing is
    left for them. Attention checks are only mixed in while real work remains."""
    return serve(con, annotator_id, settings, rng, now).assignment


def serve(con: duckdb.DuckDBPyConnection, annotator_id: str, settings: QueueSettings,
          rng: random.Random, now: datetime | None = None) -> Served:
    """next_assignment's item, and the open pairs it leaves, so that a page's progress does not
    read the open pairs a second time (the largest query of a page)."""
    ensure_schema(con)
    now = now or utc_now()
    current = _open_assignment(con, annotator_id, settings.datasets)
    if current is not None:
        if current.is_attention_check or not pair_is_decided(
                con, current.dataset, current.query_id, current.doc_id):
            return Served(current, None)
        close_assignment(con, current.assignment_id, "dropped")  # others completed it meanwhile
    candidates = pairs_open_to(con, annotator_id, settings, now)
    if candidates.is_empty():
        return Served(None, 0)
    dataset, query_id, doc_id = candidates.row(0)[:3]
    draw = rng.random()
    # a check (attention or known answer) is no escalated pair: the open pairs stay as they are
    if draw < settings.attention_rate:
        check = _attention_check(con, dataset, annotator_id, settings, rng, now)
        if check is not None:
            return Served(check, candidates.height)
    elif draw < settings.attention_rate + settings.known_rate:
        known = _known_item(con, annotator_id, settings, rng, now)
        if known is not None:
            return Served(known, candidates.height)
    # served to them, the pair is no longer open to them (pairs_open_to: never served twice)
    return Served(_insert(con, annotator_id, dataset, query_id, doc_id,
                          with_history=settings.with_history, now=now), candidates.height - 1)


@dataclass(frozen=True)
class Progress:
    labelled: int               # items this annotator answered
    remaining_for_you: int      # further pairs they could still be served
    decided_pairs: int          # escalated pairs with their votes complete (all annotators)
    escalated_pairs: int
    # labels left, in impact order, until every rank change is decided (the stopping point,
    # bridge_assets.human.plan); None without pending_impact
    stopping_point: int | None = None


def progress(con: duckdb.DuckDBPyConnection, annotator_id: str, settings: QueueSettings,
             now: datetime | None = None, open_pairs: int | None = None) -> Progress:
    """`open_pairs`: the pairs still open to the annotator when the caller has just counted them
    (Served.open_after); read here otherwise."""
    ensure_schema(con)
    labelled = one_row(con, "select count(*) from human_votes where annotator_id = ?", [annotator_id])[0]
    tallies = pair_tallies(con)
    if settings.datasets is not None:
        tallies = tallies.filter(pl.col("dataset").is_in(list(settings.datasets)))
    remaining = open_pairs if open_pairs is not None else \
        pairs_open_to(con, annotator_id, settings, now or utc_now()).height
    from bridge_assets.human.plan import stopping_points  # plan imports nothing of the queue's

    left = stopping_points(con, settings.datasets)
    return Progress(labelled, remaining, tallies.filter(pl.col("decided")).height, tallies.height,
                    sum(left.values()) if left else None)
