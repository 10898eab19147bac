"""Score the refined qrels against an answer key of holes people verified by reading.

A dataset may name such a key in the registry (`known_holes:`; the demo's is
resources/data/demo/holes.jsonl): per query, the unjudged passages that answer it
(`doc_ids`) and those that answer it only in part (`partial`). Every other unjudged passage
is taken as not a hole (the demo's key was made by reading every passage that contains an
answer string). Only the queries the key lists, and the pairs the candidate pool holds for
them, are scored:

- verified holes in the pool: found (a verified relevant label), missed (a verified
  irrelevant one: debate, filter or people; or a label nobody verified, e.g. an unverified
  imported source's), pending (awaiting people);
- reported holes (verified relevant labels outside the original qrels): true, partial, false.
Verified: bridge_qrels.verified (people's votes, debate consensus that passed its checks,
sources imported as verified).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from bridge_assets.ingest.errors import DatasetError
from bridge_assets.lake.store import table_exists


@dataclass(frozen=True)
class KnownHoles:
    holes: dict[str, frozenset[str]]    # query_id -> verified hole doc ids
    partial: dict[str, frozenset[str]]  # query_id -> partial answers

    def label(self, query_id: str, doc_id: str) -> int | None:
        """What the key says of an unjudged pair: 1 a hole, 0 not one; None for a partial
        answer or a query the key does not list."""
        if query_id not in self.holes or doc_id in self.partial.get(query_id, frozenset()):
            return None
        return int(doc_id in self.holes[query_id])


def read_known_holes(path: Path) -> KnownHoles:
    holes: dict[str, frozenset[str]] = {}
    partial: dict[str, frozenset[str]] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise DatasetError(f"cannot read the known holes ({exc.strerror})", path) from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            query_id = str(record["query_id"])
            holes[query_id] = frozenset(map(str, record.get("doc_ids") or []))
            partial[query_id] = frozenset(map(str, record.get("partial") or []))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise DatasetError(f"not a known-holes record ({exc})", path, number) from None
    return KnownHoles(holes, partial)


@dataclass
class HoleScore:
    queries: int = 0             # queries of the key that are in the candidate pool
    pooled_holes: int = 0        # verified holes the candidate pool holds
    found: int = 0
    missed: int = 0
    pending: int = 0
    reported: int = 0            # verified relevant labels outside the original qrels
    reported_true: int = 0
    reported_partial: int = 0
    reported_false: int = 0
    false_pairs: list[tuple[str, str, str]] = field(default_factory=list)  # query, doc, source
    missed_pairs: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def precision(self) -> float | None:
        return self.reported_true / self.reported if self.reported else None

    @property
    def recall(self) -> float | None:
        return self.found / self.pooled_holes if self.pooled_holes else None

    def summary_line(self) -> str:
        precision = "-" if self.precision is None else f"{self.precision:.0%}"
        recall = "-" if self.recall is None else f"{self.recall:.0%}"
        return (f"{self.pooled_holes} verified holes in the pool: {self.found} found, "
                f"{self.missed} missed, {self.pending} pending (recall {recall}); "
                f"{self.reported} reported holes: {self.reported_true} verified, "
                f"{self.reported_partial} partial, {self.reported_false} false (precision {precision})")


def score_known_holes(con: duckdb.DuckDBPyConnection, dataset: str, key: KnownHoles) -> HoleScore | None:
    """The score of `dataset`'s bridge_qrels against `key`; None before the pool and the qrels exist."""
    if not (table_exists(con, "candidate_pool") and table_exists(con, "bridge_qrels")):
        return None
    rows = con.execute("""
        select p.query_id, p.doc_id, b.relevance, b.source, coalesce(b.verified, false) as verified
        from candidate_pool p
        left join bridge_qrels b
               on b.dataset = p.dataset and b.query_id = p.query_id and b.doc_id = p.doc_id
        where p.dataset = ? and not p.in_original_qrels
        order by p.query_id, p.doc_id""", [dataset]).fetchall()
    score = HoleScore()
    pooled_queries = set()
    for query_id, doc_id, relevance, source, verified in rows:
        if query_id not in key.holes:
            continue
        pooled_queries.add(query_id)
        # people's votes, passed debate checks, verified imports (the pool holds no original pair)
        verified_relevant = relevance is not None and relevance > 0 and verified
        if doc_id in key.holes[query_id]:
            score.pooled_holes += 1
            if verified_relevant:
                score.found += 1
            elif source == "pending":
                score.pending += 1
            else:
                score.missed += 1
                score.missed_pairs.append((query_id, doc_id, source or "unlabelled"))
        if verified_relevant:
            score.reported += 1
            if doc_id in key.holes[query_id]:
                score.reported_true += 1
            elif doc_id in key.partial.get(query_id, frozenset()):
                score.reported_partial += 1
            else:
                score.reported_false += 1
                score.false_pairs.append((query_id, doc_id, source))
    score.queries = len(pooled_queries)
    return score
