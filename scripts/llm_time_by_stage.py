"""Where the model's time goes: per stage of a lake's LLM call ledger (`llm_calls`), the calls,
prompt tokens computed (prefill evaluated) and reused (taken from the KV cache), decode tokens
and seconds, with totals. Reads the lake read-only.

    .venv/bin/python scripts/llm_time_by_stage.py                      # the environment's lake
    .venv/bin/python scripts/llm_time_by_stage.py --lake /tmp/demo_lake [--context RUN_ID]
    .venv/bin/python scripts/llm_time_by_stage.py --by purpose,profile

A stage is the ledger's `purpose` (filter, debate, debate_paper, judge, rerank, hyde, rag_answer,
rag_judgment, adjudicator, relevance_score, ...). Every recorded model call counts, failed ones
included (their time was spent); a key answered from the ledger made no call and has no row.
Calls recorded before the ledger measured prefill (or by a backend that does not report it, such
as llama-cpp-python's HTTP server) have NULL there: the table says how many, and its computed /
reused / decode sums cover only the calls that have them, never an estimate for the others.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import duckdb

from bridge_assets import settings, store
from bridge_assets.llm.ledger import ADDED_COLUMNS, TABLE

GROUPS = ("purpose", "profile", "model", "backend", "context")


def stage_table(con: duckdb.DuckDBPyConnection, by: list[str], context: str | None = None) -> tuple[list[tuple], bool]:
    """One row per group (then a total row): group values, calls, failed, calls measured,
    prompt tokens, computed, reused, decode tokens, seconds, whether it is the total row. The
    flag says whether the ledger has the prefill columns at all."""
    columns = {row[0] for row in con.execute(f"describe {TABLE}").fetchall()}
    measured = all(name in columns for name in ADDED_COLUMNS)
    # a call is measured when the backend gave both halves of its prompt
    known = "prompt_tokens_computed is not null and prompt_tokens_reused is not null" if measured else "false"
    when = "where context = ?" if context else ""
    null = "cast(null as bigint)"
    computed = f"sum(prompt_tokens_computed) filter (where {known})" if measured else null
    reused = f"sum(prompt_tokens_reused) filter (where {known})" if measured else null
    decoded = "sum(decode_tokens)" if measured else null
    keys = ", ".join(by)
    rows = con.execute(f"""
        select {keys}, count(*), count(*) filter (where error is not null), count(*) filter (where {known}),
               coalesce(sum(tokens_in), 0), {computed}, {reused}, {decoded}, coalesce(sum(latency_s), 0),
               grouping({keys}) > 0
        from {TABLE} {when}
        group by grouping sets (({keys}), ())
        order by grouping({keys}), sum(latency_s) desc nulls last, {keys}""",
                       [context] if context else []).fetchall()
    return rows, measured


def _n(value) -> str:
    return "-" if value is None else f"{value:,}"


def markdown(rows: list[tuple], by: list[str]) -> str:
    total_s = rows[-1][-2] if rows else 0.0
    lines = ["| " + " | ".join(by) + " | calls | failed | measured | prompt tokens | computed | reused "
             "(share) | decode tokens | seconds (share) | s/call |",
             "|" + "---|" * (len(by) + 9)]
    for row in rows:
        names, (calls, failed, measured, prompt, computed, reused, decoded, seconds, total) = \
            row[:len(by)], row[len(by):]
        label = ["**total**"] + [""] * (len(by) - 1) if total else [str(name) for name in names]
        share = "" if computed is None or not (computed + reused) else f" ({reused / (computed + reused):.0%})"
        lines.append(
            "| " + " | ".join(label) + f" | {calls:,} | {failed:,} | {measured:,} | {_n(prompt)} | {_n(computed)} | "
            f"{_n(reused)}{share} | {_n(decoded)} | {seconds:,.1f} ({seconds / total_s if total_s else 0:.0%}) | "
            f"{seconds / calls if calls else 0:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lake", type=Path, help="the lake folder (default: BRIDGE_DATA_LAKE, else the project's data_lake/)")
    parser.add_argument("--context", help="only the calls recorded under this context (a Dagster run id)")
    parser.add_argument("--by", default="purpose", help=f"group by these ledger columns, comma-separated ({', '.join(GROUPS)})")
    args = parser.parse_args()
    by = [name.strip() for name in args.by.split(",") if name.strip()]
    if not by or any(name not in GROUPS for name in by):
        parser.error(f"--by takes some of {', '.join(GROUPS)}")
    location = settings.lake_location(args.lake or "")
    where = store.describe(location)
    try:
        with store.connect_read_only(location, wait_seconds=5) as con:
            if not store.table_exists(con, TABLE):
                print(f"{where}: no LLM call was ever recorded ({TABLE} does not exist)")
                return
            rows, measured = stage_table(con, by, args.context)
    except store.StoreBusy as exc:
        sys.exit(f"{where} is busy ({exc}); copy the lake folder elsewhere and point --lake at the copy")
    scope = f" (context {args.context})" if args.context else ""
    print(f"LLM calls by {', '.join(by)} in {where}{scope}\n")
    if len(rows) <= 1 and (not rows or rows[0][len(by)] == 0):
        print("no calls")
        return
    print(markdown(rows, by))
    total = rows[-1][len(by):]
    calls, measured_calls = total[0], total[2]
    if not measured:
        print(f"\nThis ledger predates the prefill columns ({', '.join(ADDED_COLUMNS)}): prompt tokens "
              "computed / reused and decode tokens are unknown (NULL) for all its calls. Run the stages "
              "again with the current code on a fresh lake to measure them.")
    elif measured_calls < calls:
        print(f"\n{calls - measured_calls:,} of {calls:,} calls have no prefill measurement (NULL: recorded "
              "before the ledger measured it, or by a backend that does not report it); the computed, "
              "reused and decode sums cover only the calls that have them.")


if __name__ == "__main__":
    main()
