"""The tables the annotation app owns, created on first use.

- annotators: one row per person; only a SHA-256 hash of their personal token is kept (tokens
  are 256-bit random strings, so a fast hash is enough). Imported annotators have no token.
  `session_epoch` goes up at every logout and token rotation; a session cookie carries the epoch
  it was opened in and is refused once it differs, so those end every open session.
- annotation_assignments: every item served to an annotator (a real escalated pair or an
  attention check). A vote refers to its assignment, so the server, not the form, decides which
  pair a vote is for and whether it is an attention check. Open assignments reserve a vote slot.
- human_votes: append-only. Rows are never deleted and labels never change; the only update is
  `status` going from 'accepted' to 'excluded' when an attention check fails. A label is 0/1,
  or a grade 0-3 on a graded dataset (the app checks which); an attention check's expected
  label stays 0/1 (known irrelevant or relevant). `seconds`: the time the judgment took, from
  the item being served to the vote, idle time capped (bridge_assets.human.votes); NULL for
  imported votes and for votes cast before it was recorded (stores from before it get the
  column on first use). `known_source`: set on a vote for a known-answer item (below), which
  is served and recorded as an attention check is, but never pauses anyone.
- known_answers: pairs whose answer is known, loaded to measure people's accuracy
  (bridge_assets.human.known): a dataset's known holes (source `holes:<dataset>`, the texts in
  the lake) or a label-eval gold set (source and dataset `goldset:<name>`, the texts here).
"""

from __future__ import annotations

from datetime import UTC, datetime

import duckdb

from bridge_assets.lake.store import one_row, transaction

# Votes each escalated pair needs (the paper: three crowd annotators per pair).
REQUIRED_VOTES = 3

HUMAN_VOTES = """
create table if not exists human_votes (
    vote_id bigint primary key default nextval('human_vote_ids'),
    dataset varchar not null,
    query_id varchar not null,
    doc_id varchar not null,
    annotator_id varchar not null,
    label integer not null check (label between 0 and 3),
    comment varchar,
    with_history boolean not null,
    is_attention_check boolean not null,
    expected_label integer check (expected_label in (0, 1)),
    status varchar not null check (status in ('accepted', 'excluded')),
    created_at timestamp not null,
    source varchar not null,
    seconds double check (seconds >= 0),
    known_source varchar,
    unique (dataset, query_id, doc_id, annotator_id, is_attention_check)
);
"""
# votes stores from before the time per judgment was recorded, and before known-answer items
_SECONDS = """alter table human_votes add column if not exists seconds double;
alter table human_votes add column if not exists known_source varchar;
alter table annotation_assignments add column if not exists known_source varchar;
"""
KNOWN_ANSWERS = """
create table if not exists known_answers (
    source varchar not null,
    dataset varchar not null,
    query_id varchar not null,
    doc_id varchar not null,
    expected_label integer not null check (expected_label in (0, 1)),
    query varchar,
    answers varchar[],
    chunk varchar,
    loaded_at timestamp not null,
    primary key (dataset, query_id, doc_id)
);
"""

SCHEMA = """
create sequence if not exists human_vote_ids start 1;

create table if not exists annotators (
    annotator_id varchar primary key,
    token_hash varchar unique,
    is_admin boolean not null,
    created_at timestamp not null,
    flagged_at timestamp,
    flag_reason varchar,
    session_epoch integer not null default 0
);
-- data lakes from before session epochs
alter table annotators add column if not exists session_epoch integer default 0;

create table if not exists annotation_assignments (
    assignment_id varchar primary key,
    annotator_id varchar not null,
    dataset varchar not null,
    query_id varchar not null,
    doc_id varchar not null,
    is_attention_check boolean not null,
    expected_label integer,
    dressing_pair_key varchar,
    with_history boolean not null,
    state varchar not null check (state in ('open', 'answered', 'dropped')),
    assigned_at timestamp not null,
    closed_at timestamp,
    known_source varchar
);
""" + HUMAN_VOTES + _SECONDS + KNOWN_ANSWERS

# The check of lakes from before graded votes, which allowed 0 and 1 only.
_BINARY_VOTES = """
    select count(*) from duckdb_constraints()
    where table_name = 'human_votes' and constraint_type = 'CHECK'
      and expression = '("label" IN (0, 1))'"""


def ensure_schema(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(SCHEMA)
    if one_row(con, _BINARY_VOTES)[0]:
        _allow_grades(con)


def _allow_grades(con: duckdb.DuckDBPyConnection) -> None:
    """Rebuild human_votes with the graded check, keeping every row and vote id: DuckDB cannot
    drop a check constraint. One transaction: a failure leaves the table as it was."""
    with transaction(con):
        con.execute("create temp table human_votes_binary as select * from human_votes")
        con.execute("drop table human_votes")
        con.execute(HUMAN_VOTES)
        con.execute("insert into human_votes by name select * from human_votes_binary")
        con.execute("drop table human_votes_binary")


def utc_now() -> datetime:
    """Timestamps are stored as naive UTC (DuckDB TIMESTAMP)."""
    return datetime.now(UTC).replace(tzinfo=None)


# The votes of a dataset that count (accepted, no attention check), as one hash: what the votes
# sensor and `bridge run` compare with the one human_labels was built from. Computed in place on
# the votes store (votes_store.votes_version) and on human_labels' snapshot, by this one query.
_VOTES_VERSION = """
    select md5(coalesce(string_agg(to_json([vote_id::varchar, query_id, doc_id, annotator_id, label::varchar]),
                                   chr(10) order by vote_id), ''))
    from human_votes
    where dataset = $dataset and status = 'accepted' and not is_attention_check"""


def votes_version(con: duckdb.DuckDBPyConnection, dataset: str) -> str:
    """A hash of `dataset`'s counted votes in the human_votes `con` sees."""
    return str(one_row(con, _VOTES_VERSION, {"dataset": dataset})[0])
