"""Recording votes: one per served item, attention checks judged, failures excluding votes.

`human_votes` is append-only: a vote is never deleted and its label never changes. When an
annotator fails an attention check they are flagged, and their votes since their last passed
check become status 'excluded' (they stay in the table, so the audit trail keeps them).

A vote is 0/1, or a grade 0-3 on a graded dataset. An attention check asks only whether the
chunk is relevant: on a graded dataset any grade of 1 or more passes a known relevant pair,
grade 0 a known irrelevant one.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import TypedDict

import duckdb
import polars as pl

from bridge_assets.errors import BridgeError
from bridge_assets.human import annotators
from bridge_assets.human.queue import close_assignment, get_assignment, pair_is_decided
from bridge_assets.human.tables import ensure_schema, utc_now
from bridge_assets.lake.store import one_row, transaction
from bridge_assets.registry.datasets import GRADES

# The longest a judgment counts (served -> answered); longer is idle time.
IDLE_CAP_SECONDS = 300.0


class VoteRejected(BridgeError):
    """A vote the server refuses; `status` is the HTTP status the app answers with."""

    status = 400


class NotYourItem(VoteRejected):
    status = 404


class AlreadyAnswered(VoteRejected):
    status = 409


class PairCompleted(VoteRejected):
    status = 409


class AnnotatorFlagged(VoteRejected):
    status = 403


class Verdict(str, Enum):
    RECORDED = "recorded"
    CHECK_PASSED = "check_passed"
    CHECK_FAILED = "check_failed"
    KNOWN_ANSWER = "known_answer"   # a known-answer item's vote: scored, never pauses anyone


@dataclass(frozen=True)
class VoteReceipt:
    vote_id: int
    verdict: Verdict
    excluded_votes: int = 0


def insert_vote(con: duckdb.DuckDBPyConnection, *, dataset: str, query_id: str, doc_id: str,
                 annotator_id: str, label: int, comment: str | None, with_history: bool,
                 is_attention_check: bool, expected_label: int | None, status: str,
                 source: str, created_at: datetime | None = None, seconds: float | None = None,
                 known_source: str | None = None) -> int:
    return one_row(con, """
        insert into human_votes (dataset, query_id, doc_id, annotator_id, label, comment,
                                 with_history, is_attention_check, expected_label, status,
                                 created_at, source, seconds, known_source)
        values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) returning vote_id""",
        [dataset, query_id, doc_id, annotator_id, label, comment, with_history,
         is_attention_check, expected_label, status, created_at or utc_now(), source,
         seconds, known_source])[0]


def judgment_seconds(served: datetime, answered: datetime, idle_cap: float = IDLE_CAP_SECONDS) -> float:
    """The time a judgment took: from the item being served to the vote, at most `idle_cap`
    seconds (an annotator who left the page open over lunch did not judge for an hour)."""
    return round(min(max((answered - served).total_seconds(), 0.0), idle_cap), 3)


def exclude_since_last_passed_check(con: duckdb.DuckDBPyConnection, annotator_id: str) -> int:
    """Mark the annotator's accepted votes cast after their last passed attention check as
    excluded; returns how many."""
    return len(con.execute("""
        update human_votes set status = 'excluded'
        where annotator_id = $annotator and not is_attention_check and status = 'accepted'
          and vote_id > coalesce((select max(vote_id) from human_votes
                                  where annotator_id = $annotator and is_attention_check
                                    and known_source is null
                                    and least(label, 1) = expected_label), 0)
        returning vote_id""", {"annotator": annotator_id}).fetchall())


def record_vote(con: duckdb.DuckDBPyConnection, *, assignment_id: str, annotator_id: str,
                label: int, comment: str | None, graded: Collection[str] = (),
                idle_cap: float = IDLE_CAP_SECONDS, now: datetime | None = None) -> VoteReceipt:
    """Record `annotator_id`'s answer to the item `assignment_id` they were served; `graded`:
    the datasets whose votes are grades 0-3 (else 0/1). The vote keeps the time the judgment
    took (judgment_seconds: served -> now, at most `idle_cap`).

    The pair, whether it is an attention check and the expected answer all come from the
    assignment the server stored, never from the form. One transaction: a refused vote
    changes nothing.
    """
    ensure_schema(con)
    try:
        with transaction(con):
            return _record(con, assignment_id, annotator_id, label, comment, graded, idle_cap,
                           now or utc_now())
    except PairCompleted:  # refuse the vote (rolled back), but stop serving the item
        close_assignment(con, assignment_id, "dropped")
        raise


class _Pair(TypedDict):
    dataset: str
    query_id: str
    doc_id: str


class _Timing(TypedDict):
    created_at: datetime
    seconds: float


def _record(con: duckdb.DuckDBPyConnection, assignment_id: str, annotator_id: str, label: int, comment: str | None,
            graded: Collection[str], idle_cap: float, now: datetime) -> VoteReceipt:
    assignment = get_assignment(con, assignment_id)
    # Another annotator's item looks exactly like an unknown one: no hint that it exists.
    if assignment is None or assignment.annotator_id != annotator_id:
        raise NotYourItem("no such item for you")
    top = GRADES[-1] if assignment.dataset in graded else 1
    if not 0 <= label <= top:
        raise VoteRejected(f"a vote on dataset '{assignment.dataset}' is a whole number from 0 to {top}")
    if assignment.state != "open":
        raise AlreadyAnswered("you already answered this item")
    annotator = annotators.get_annotator(con, annotator_id)
    if annotator is None or annotator.flagged:
        raise AnnotatorFlagged("your account is paused after a failed attention check")
    pair = _Pair(dataset=assignment.dataset, query_id=assignment.query_id, doc_id=assignment.doc_id)
    timing = _Timing(created_at=now, seconds=judgment_seconds(assignment.assigned_at, now, idle_cap))
    if not assignment.is_attention_check:
        voted = one_row(con, """select count(*) from human_votes where dataset = ? and query_id = ?
                               and doc_id = ? and annotator_id = ? and not is_attention_check""",
                        [*pair.values(), annotator_id])[0]
        if voted:
            raise AlreadyAnswered("you already voted on this pair")
        if pair_is_decided(con, **pair):
            raise PairCompleted("other annotators completed this pair meanwhile; here is the next one")
        vote_id = insert_vote(con, **pair, annotator_id=annotator_id, label=label, comment=comment,
                              with_history=assignment.with_history, is_attention_check=False,
                              expected_label=None, status="accepted", source="app", **timing)
        close_assignment(con, assignment_id, "answered")
        return VoteReceipt(vote_id, Verdict.RECORDED)

    if assignment.known_source is not None:  # a known-answer item: measured, never a pause
        vote_id = insert_vote(con, **pair, annotator_id=annotator_id, label=label, comment=comment,
                              with_history=assignment.with_history, is_attention_check=True,
                              expected_label=assignment.expected_label, status="accepted", source="app",
                              known_source=assignment.known_source, **timing)
        close_assignment(con, assignment_id, "answered")
        return VoteReceipt(vote_id, Verdict.KNOWN_ANSWER)
    passed = min(label, 1) == assignment.expected_label
    vote_id = insert_vote(con, **pair, annotator_id=annotator_id, label=label, comment=comment,
                          with_history=assignment.with_history, is_attention_check=True,
                          expected_label=assignment.expected_label,
                          status="accepted" if passed else "excluded", source="app", **timing)
    close_assignment(con, assignment_id, "answered")
    if passed:
        return VoteReceipt(vote_id, Verdict.CHECK_PASSED)
    excluded = exclude_since_last_passed_check(con, annotator_id)
    # free the slots their other served items held
    con.execute("update annotation_assignments set state = 'dropped', closed_at = ? "
                "where annotator_id = ? and state = 'open'", [utc_now(), annotator_id])
    annotators.flag(con, annotator_id, f"failed attention check (vote {vote_id}: answered {label}, "
                                       f"expected {assignment.expected_label})")
    return VoteReceipt(vote_id, Verdict.CHECK_FAILED, excluded)


def votes_frame(con: duckdb.DuckDBPyConnection, dataset: str | None = None) -> pl.DataFrame:
    """Every vote (accepted and excluded), oldest first: the export."""
    ensure_schema(con)
    return con.execute("""
        select vote_id, dataset, query_id, doc_id, annotator_id, label, comment, with_history,
               is_attention_check, expected_label, status, created_at, source
        from human_votes where $dataset is null or dataset = $dataset
        order by vote_id""", {"dataset": dataset}).pl()


def annotator_activity(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """Per annotator and dataset: accepted and excluded votes, attention checks passed/failed."""
    ensure_schema(con)
    return con.execute("""
        select annotator_id, dataset,
               count(*) filter (where not is_attention_check and status = 'accepted') as accepted,
               count(*) filter (where not is_attention_check and status = 'excluded') as excluded,
               count(*) filter (where is_attention_check and known_source is null
                                and least(label, 1) = expected_label) as checks_passed,
               count(*) filter (where is_attention_check and known_source is null
                                and least(label, 1) <> expected_label) as checks_failed,
               max(created_at) as last_vote_at
        from human_votes group by all order by annotator_id, dataset""").pl()


def judgment_times(con: duckdb.DuckDBPyConnection, dataset: str | None = None,
                   idle_cap: float = IDLE_CAP_SECONDS) -> pl.DataFrame:
    """Per annotator and arm (with / without the debate history): timed judgments (attention
    checks included: they take the same look), their median and mean seconds and the share of
    them that reached the idle cap; and their accuracy on the attention checks (answered as
    expected / answered; every source of known answers: bridge_assets.human.known)."""
    ensure_schema(con)
    return con.execute("""
        select annotator_id, with_history, count(seconds) as timed,
               median(seconds) as median_seconds, avg(seconds) as mean_seconds,
               count(*) filter (where seconds >= $cap) / greatest(count(seconds), 1) as capped_share,
               count(*) filter (where is_attention_check and known_source is null) as checks,
               avg((least(label, 1) = expected_label)::integer)
                   filter (where is_attention_check and known_source is null) as check_accuracy
        from human_votes
        where $dataset is null or dataset = $dataset
        group by all order by annotator_id, with_history desc""",
        {"dataset": dataset, "cap": idle_cap}).pl()
