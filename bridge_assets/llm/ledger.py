"""The LLM call ledger: every call's key, request, reply and cost, in DuckDB (`llm_calls`).

The ledger is also the cache. A call's key hashes everything that determines its reply
(backend, model, rendered messages, JSON schema, sampling parameters, top_logprobs); a key
with a reply is never sent again, even a reply that failed strict parsing (it stays a failure,
never a label); a call that got no reply (timeout, HTTP error) is. The table is append-only: a failed call stays
recorded beside the later success, so the history of every key can be audited.
Connections are short (one per lookup, one per batch write) and never held during model calls:
a DuckDB file (BRIDGE_STORAGE=duckdb) allows one writing process. On DuckLake (the default) a batch is one
snapshot whose rows stay in the catalog (data inlining) until FLUSH_ROWS of them are written out
as one Parquet file, so a ledger of a million calls is not a million tiny files.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

import duckdb
import polars as pl

from bridge_assets.lake import store
from bridge_assets.llm.parsing import canonical_json
from bridge_assets.llm.types import LLMRequest, LLMResult, TokenLogprob
from bridge_assets.paths import LakeLocation

logger = logging.getLogger(__name__)

TABLE = "llm_calls"

CREATE_TABLE = f"""
create table if not exists {TABLE} (
    key VARCHAR not null,          -- sha256 of backend, model, messages, schema, sampling
    profile VARCHAR,               -- models.yaml profile that made the call
    backend VARCHAR,
    model VARCHAR,
    purpose VARCHAR,               -- e.g. filter, debate (not part of the key)
    context VARCHAR,               -- caller's provenance, e.g. the Dagster run id
    request_json VARCHAR,          -- the LLMRequest as JSON
    raw_reply VARCHAR,             -- the model's text as received
    parsed_json VARCHAR,           -- the validated JSON object (schema requests)
    logprobs_json VARCHAR,         -- token log-probabilities when asked
    tokens_in INTEGER,
    tokens_out INTEGER,
    prompt_tokens_computed INTEGER, -- prompt tokens the model evaluated (prefill); NULL: unknown
    prompt_tokens_reused INTEGER,   -- prompt tokens taken from the KV cache; NULL: unknown
    decode_tokens INTEGER,          -- tokens decoded (the completion); NULL: unknown
    latency_s DOUBLE,
    attempts INTEGER,              -- model calls made for this key in this batch
    error VARCHAR,                 -- NULL when the call succeeded
    created_at TIMESTAMP
)
"""

# Columns added after the table's first version: ledgers from before get them, NULL in their
# rows (their calls' prefill was never measured), on their next append.
ADDED_COLUMNS = {"prompt_tokens_computed": "INTEGER", "prompt_tokens_reused": "INTEGER",
                 "decode_tokens": "INTEGER"}


def migrate(con: duckdb.DuckDBPyConnection) -> None:
    """Create the table, or add the columns an older ledger lacks (inside the caller's
    transaction; a no-op, with no schema change, when it has them all)."""
    con.execute(CREATE_TABLE)
    known = {row[0] for row in con.execute(f"describe {TABLE}").fetchall()}
    for name, kind in ADDED_COLUMNS.items():
        if name not in known:
            con.execute(f"alter table {TABLE} add column {name} {kind}")


def call_key(backend: str, model_id: str, request: LLMRequest) -> str:
    """The cache key: what decides the reply, and nothing else (`purpose` is left out)."""
    payload = {
        "backend": backend,
        "model": model_id,
        "messages": [list(m) for m in request.messages],
        "json_schema": request.json_schema,
        "sampling": {"max_tokens": request.max_tokens, "temperature": request.temperature,
                     "stop": list(request.stop), "seed": request.seed},
        "top_logprobs": request.top_logprobs,
    }
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


@dataclass(frozen=True)
class CallRecord:
    """One row to append: a result plus what the result itself does not say."""

    request: LLMRequest
    result: LLMResult
    attempts: int


def lookup(keys: Sequence[str], lake: LakeLocation) -> dict[str, LLMResult]:
    """The recorded answer of each key that has one (cached=True): its latest success, else
    its latest reply that failed strict parsing (the model's answer, final: re-asking the same
    request would repeat it; the result keeps its `error`). Calls that got no reply (timeouts,
    HTTP errors, a prompt over the context) are not answers: they are asked again."""
    if not keys:
        return {}
    with store.connect(lake) as con:
        if not store.table_exists(con, TABLE):
            return {}
        rows = con.execute(
            f"""select key, raw_reply, parsed_json, logprobs_json, tokens_in, tokens_out, latency_s, error
                from {TABLE}
                where (error is null or coalesce(raw_reply, '') <> '')
                  and key in (select unnest(?::VARCHAR[]))
                qualify row_number() over (partition by key
                                           order by error is null desc, created_at desc) = 1""",
            [list(set(keys))]).fetchall()
    found = {}
    for key, raw, parsed, logprobs, tokens_in, tokens_out, latency, error in rows:
        found[key] = LLMResult(
            key=key, text=raw or "", error=error,
            parsed=json.loads(parsed) if parsed is not None else None,
            logprobs=[TokenLogprob(**t) for t in json.loads(logprobs)] if logprobs is not None else None,
            tokens_in=tokens_in or 0, tokens_out=tokens_out or 0, latency_s=latency or 0.0,
            cached=True)
    return found


def append(records: Sequence[CallRecord], *, profile: str, backend: str, model: str,
           context: str | None, lake: LakeLocation) -> None:
    """Append one batch's calls in one short transaction."""
    if not records:
        return
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    frame = pl.DataFrame({
        "key": [r.result.key for r in records],
        "profile": [profile] * len(records),
        "backend": [backend] * len(records),
        "model": [model] * len(records),
        "purpose": [r.request.purpose for r in records],
        "context": [context] * len(records),
        "request_json": [r.request.model_dump_json() for r in records],
        "raw_reply": [r.result.text for r in records],
        "parsed_json": [json.dumps(r.result.parsed) if r.result.parsed is not None else None
                        for r in records],
        "logprobs_json": [json.dumps([t.model_dump() for t in r.result.logprobs])
                          if r.result.logprobs is not None else None for r in records],
        "tokens_in": [r.result.tokens_in for r in records],
        "tokens_out": [r.result.tokens_out for r in records],
        "prompt_tokens_computed": [r.result.prompt_computed for r in records],
        "prompt_tokens_reused": [r.result.prompt_reused for r in records],
        "decode_tokens": [r.result.decode_tokens for r in records],
        "latency_s": [r.result.latency_s for r in records],
        "attempts": [r.attempts for r in records],
        "error": [r.result.error for r in records],
        "created_at": [now] * len(records),
    }, schema_overrides={"context": pl.Utf8, "parsed_json": pl.Utf8, "logprobs_json": pl.Utf8,
                         "error": pl.Utf8, "tokens_in": pl.Int32, "tokens_out": pl.Int32,
                         "prompt_tokens_computed": pl.Int32, "prompt_tokens_reused": pl.Int32,
                         "decode_tokens": pl.Int32, "attempts": pl.Int32})
    def insert(con: duckdb.DuckDBPyConnection) -> None:
        migrate(con)
        con.register("_incoming_calls", frame.to_arrow())
        try:
            con.execute(f"insert into {TABLE} by name select * from _incoming_calls")
        finally:
            con.unregister("_incoming_calls")

    # one transaction (on DuckLake: one snapshot, its rows inlined in the catalog; retried when
    # another writer committed first)
    store.run_transaction(insert, lake)
    _flush_now_and_then(len(records), lake)


# On DuckLake each append's rows stay in the catalog (data inlining: no Parquet file per chunk);
# every FLUSH_ROWS rows appended by this process they are written out as one Parquet file.
FLUSH_ROWS = 20_000
_appended_since_flush = 0


def _flush_now_and_then(rows: int, lake: LakeLocation) -> None:
    global _appended_since_flush
    if lake.ducklake is None:
        return
    _appended_since_flush += rows
    if _appended_since_flush < FLUSH_ROWS:
        return
    _appended_since_flush = 0
    from bridge_assets.lake import ducklake

    try:  # maintenance: a conflict with another writer just leaves it for the next time
        with store.connect(lake) as con:
            con.execute(f"CALL ducklake_flush_inlined_data('{ducklake.ALIAS}', table_name => '{TABLE}')")
    except duckdb.Error as exc:  # StoreBusy and StoreConflict are duckdb errors too
        logger.warning("the LLM ledger's inlined rows were not flushed to Parquet this time: %s", exc)


def read_calls(lake: LakeLocation) -> pl.DataFrame:
    """The whole ledger (empty frame when no call was ever made)."""
    with store.connect(lake) as con:
        if not store.table_exists(con, TABLE):
            return pl.DataFrame()
        return con.execute(f"select * from {TABLE} order by created_at").pl()
