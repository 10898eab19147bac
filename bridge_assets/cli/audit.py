"""`bridge audit`: the whole story of one (dataset, query, chunk) label.

Query text and answers, the chunk; every system and rank that surfaced it (retrieval_run,
candidate_pool); the filter votes; every debate turn (each quote marked when it is not in the
chunk) and the checks the agreement passed or failed; the human votes (annotator ids, with or
without history, attention-check status); the final label and its source, or that the pair is
pending and what a model guessed for it, apart (bridge_qrels), and every judgment of the pair
imported from a file (imported_qrels: source, file, line; a correction says the original
relevance and the corrected one); the
models and prompt hashes of every LLM call behind it (llm_calls, by call key); and the Dagster
runs that materialized each stage for the dataset. A stage whose table does not exist yet is
reported as not materialized; the story of an original gold pair simply has no labeling steps.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any

import dagster as dg
import duckdb
import typer

from bridge_assets.errors import BridgeError
from bridge_assets.labeling.evidence import quote_matches
from bridge_assets.labeling.pairs import chunk_text, topic_columns
from bridge_assets.labeling.prompts import Prompts
from bridge_assets.lake.snapshots import snapshot_of
from bridge_assets.lake.store import one_row, table_exists
from bridge_assets.llm.parsing import canonical_json
from bridge_assets.registry.relevance import resolve_relevance
from bridge_assets.student.model import ONE_CLASS_QUERY, SAMPLED_OUT, TRAIN

# Assets whose latest materialization of the dataset's partition the story names.
DATASET_ASSETS = ("corpus", "queries", "original_qrels", "candidate_pool", "filter_votes",
                  "filtered_pool", "debate_labels", "debate_turns", "human_labels", "bridge_qrels",
                  "student_annotator", "student_scores", "retrieval_metrics", "report")
# Which prompt template made the calls of each purpose.
TEMPLATES = {"filter": "filter", "debate": "debate_turn", "debate_paper": "debate_turn_paper",
             "adjudicator": "adjudicator", "judge": "judge", "rag_answer": "rag_answer",
             "rag_judgment": "rag_judgment"}


class AuditError(BridgeError, LookupError):
    """The pair is unknown to the data lake."""


def _records(con: duckdb.DuckDBPyConnection, sql: str, params: list) -> list[dict[str, Any]]:
    cursor = con.execute(sql, params)
    columns = [c[0] for c in cursor.description]
    return [dict(zip(columns, row)) for row in cursor.fetchall()]


class _Reader:
    """Reads the pair's rows table by table, noting tables that do not exist."""

    def __init__(self, con: duckdb.DuckDBPyConnection, dataset: str, query_id: str, doc_id: str):
        self.con, self.params = con, [dataset, query_id, doc_id]
        self.not_materialized: list[str] = []

    def exists(self, table: str) -> bool:
        if table_exists(self.con, table):
            return True
        if table not in self.not_materialized:
            self.not_materialized.append(table)
        return False

    def pair_rows(self, table: str, columns: str = "*", order: str = "") -> list[dict] | None:
        if not self.exists(table):
            return None
        return _records(self.con, f"select {columns} from {table} where dataset = ? and query_id = ? "
                                  f"and doc_id = ? {('order by ' + order) if order else ''}", self.params)


def _prompt_hash(request_json: str | None) -> str | None:
    """sha256 (16 hex) of the exact rendered messages of a call."""
    if not request_json:
        return None
    messages = json.loads(request_json).get("messages")
    return hashlib.sha256(canonical_json(messages).encode()).hexdigest()[:16]


def _llm_calls(reader: _Reader, keys: list[str]) -> list[dict] | None:
    if not keys:
        return []
    if not reader.exists("llm_calls"):
        return None
    rows = _records(reader.con, """
        select key, profile, backend, model, purpose, context as run_id, request_json, error,
               tokens_in, tokens_out, latency_s, created_at
        from llm_calls where key in (select unnest(?::varchar[]))
        qualify row_number() over (partition by key order by (error is null) desc, created_at desc) = 1""",
        [keys])
    for row in rows:
        row["prompt_hash"] = _prompt_hash(row.pop("request_json"))
    order = {key: i for i, key in enumerate(keys)}  # the order of the story: filter, turns, adjudicator
    return sorted(rows, key=lambda row: order[row["key"]])


def _dagster_runs(instance: dg.DagsterInstance, dataset: str, retrievers: list[str]) -> list[dict]:
    wanted = [(name, dataset) for name in DATASET_ASSETS]
    wanted += [("retrieval_run", str(dg.MultiPartitionKey({"dataset": dataset, "retriever": r})))
               for r in retrievers]
    runs = []
    for asset, partition in wanted:
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[partition]), limit=1).records
        if records:
            runs.append({"asset": asset, "partition": partition, "run_id": records[0].run_id,
                         "materialized_at": datetime.fromtimestamp(records[0].timestamp, UTC)
                         .strftime("%Y-%m-%d %H:%M:%S UTC"),
                         # the lake snapshot that materialization wrote (DuckLake id; "n/a" on DuckDB)
                         "snapshot": snapshot_of(records[0])})
    return runs


def audit_pair(con: duckdb.DuckDBPyConnection, dataset: str, query_id: str, doc_id: str, *,
               instance: dg.DagsterInstance | None = None, prompts: Prompts | None = None) -> dict[str, Any]:
    """The story of (dataset, query_id, doc_id) as one JSON-ready dict."""
    reader = _Reader(con, dataset, query_id, doc_id)
    story: dict[str, Any] = {"dataset": dataset, "query_id": query_id, "doc_id": doc_id}

    query = _records(con, f"select q.text, q.answers, {topic_columns(con)} from queries q "
                          "where q.dataset = ? and q.query_id = ?",
                     [dataset, query_id]) if reader.exists("queries") else []
    chunk = _records(con, "select title, text from corpus where dataset = ? and doc_id = ?",
                     [dataset, doc_id]) if reader.exists("corpus") else []
    if not query and not chunk:
        raise AuditError(f"dataset '{dataset}' knows neither query '{query_id}' nor document "
                         f"'{doc_id}' (are the ingest assets materialized?)")
    story["query"] = {"text": query[0]["text"], "answers": query[0]["answers"]} if query else None
    story["chunk"] = chunk[0] if chunk else None
    story["relevance"] = _relevance(dataset, query[0]) if query else None

    original = reader.pair_rows("original_qrels", "relevance")
    story["original_judgment"] = original[0]["relevance"] if original else None
    story["retrieval"] = reader.pair_rows("retrieval_run", "retriever, rank, score, config_hash", "rank, retriever")
    pool = reader.pair_rows("candidate_pool", "systems, ranks, best_rank, n_systems, in_original_qrels")
    story["candidate_pool"] = pool[0] if pool else None

    filtered = reader.pair_rows("filtered_pool", "kept, votes_supported, votes_total")
    votes = reader.pair_rows("filter_votes", "model, is_supported, pair_key, call_key, error", "model")
    story["filter"] = {"outcome": filtered[0] if filtered else None, "votes": votes or []} \
        if filtered is not None or votes is not None else None

    labels = reader.pair_rows("debate_labels")
    turns = reader.pair_rows("debate_turns", order="round, agent")
    story["debate"] = None
    if labels:
        label = {k: v for k, v in labels[0].items() if k not in ("dataset", "query_id", "doc_id")}
        text = chunk_text(story["chunk"]["title"], story["chunk"]["text"]) if story["chunk"] else ""
        story["debate"] = {**label, "turns": [
            {**{k: v for k, v in turn.items() if k not in ("dataset", "query_id", "doc_id", "pair_key")},
             "quotes_in_chunk": quote_matches(turn["reference"] or [], text)} for turn in turns or []]}

    human = reader.pair_rows("human_labels", "label, votes, votes_relevant, agreement")
    human_votes = reader.pair_rows("human_votes", "vote_id, annotator_id, label, with_history, "
                                                  "is_attention_check, expected_label, status, comment, "
                                                  "created_at", "vote_id")
    review = reader.pair_rows("review_sample", "kind, stratum")
    story["human"] = {"label": human[0] if human else None, "votes": human_votes or [],
                      "review_sample": review[0] if review else None}

    final = reader.pair_rows("bridge_qrels", "*")
    story["final"] = {k: v for k, v in final[0].items() if k not in ("dataset", "query_id", "doc_id")} \
        if final else None
    if final is not None and not final:
        story["final_status"] = "unjudged"
    # imports are optional, not a stage: no table is not "not materialized"
    story["imported"] = _records(con, """
        select i.source, i.relevance, i.file, i.line, i.imported_at, s.precedence, s.verified,
               s.corrects_original
        from imported_qrels i
        join qrels_sources s on s.dataset = i.dataset and s.source = i.source
        where i.dataset = ? and i.query_id = ? and i.doc_id = ?
        order by s.precedence""", reader.params) \
        if table_exists(con, "imported_qrels") and table_exists(con, "qrels_sources") else []

    story["student"] = _student(reader)

    keys = [v["call_key"] for v in story["filter"]["votes"] if v["call_key"]] if story["filter"] else []
    if story["debate"]:
        keys += [t["call_key"] for t in story["debate"]["turns"] if t["call_key"]]
        if story["debate"].get("adjudicator_call_key"):
            keys.append(story["debate"]["adjudicator_call_key"])
    story["llm_calls"] = _llm_calls(reader, list(dict.fromkeys(keys)))
    prompts = prompts or Prompts()
    purposes = sorted({c["purpose"] for c in story["llm_calls"] or [] if c["purpose"] in TEMPLATES})
    story["prompt_templates"] = {TEMPLATES[p]: prompts.hash(TEMPLATES[p]) for p in purposes}

    retrievers = [r["retriever"] for r in story["retrieval"] or []]
    story["dagster_runs"] = _dagster_runs(instance, dataset, retrievers) if instance is not None else None
    story["not_materialized"] = reader.not_materialized
    return story


def _relevance(dataset: str, query: dict[str, Any]) -> dict[str, Any]:
    """What relevant meant for the pair: the query's own definition, else its dataset's, else
    the default for what the query has (bridge_assets.registry.relevance)."""
    from bridge_assets.registry.datasets import load_registry

    spec = load_registry().get(dataset)
    relevance = resolve_relevance(spec.relevance.definition if spec else None, answers=tuple(query["answers"] or ()),
                                  description=query["description"], narrative=query["narrative"],
                                  query_definition=query["definition"])
    return {"kind": relevance.kind, "definition": relevance.text,
            "from": "the query" if query["definition"] else
                    "the dataset" if spec and spec.relevance.definition else "the default"}


def _student(reader: _Reader) -> dict[str, Any] | None:
    """The student's score of the pair, which student gave it (weights, labels, snapshot) and
    whether the pair was one of the labels it learned from."""
    scores = reader.pair_rows("student_scores", "p_relevant, student_key")
    if scores is None or not reader.exists("student_annotator"):
        return None
    if not scores:  # not in the pool, or no student at all (which says why)
        untrained = _records(reader.con, "select not_trained from student_annotator where dataset = ? "
                                         "and student_key is null", reader.params[:1])
        return {"not_trained": untrained[0]["not_trained"]} if untrained else None
    student = _records(reader.con, """
        select student_key, weights_hash, labels, relevant, trained_on, calibrated_on, calibration,
               learned_from_snapshot
        from student_annotator where dataset = ? and student_key = ?""",
                       [reader.params[0], scores[0]["student_key"]])
    learned = None
    if reader.exists("student_training_set"):
        # a lake from before distillation has no `teacher` column
        teacher = one_row(reader.con, "select count(*) from information_schema.columns where table_name = "
                          "'student_training_set' and column_name = 'teacher'")[0]
        learned = reader.pair_rows("student_training_set", "label, source, split" + (", teacher" if teacher else ""))
    return {**scores[0], "student": student[0] if student else None,
            "learned_from_pair": learned[0] if learned else None}


# --- text -----------------------------------------------------------------------------------------

def _line(label: str, value: Any) -> str:
    return f"  {label:<20}  {value}"


def _missing(story: dict, *tables: str) -> str | None:
    gone = [t for t in tables if t in story["not_materialized"]]
    return f"  not materialized: {', '.join(gone)}" if gone else None


def format_story(story: dict[str, Any]) -> str:
    """The story as readable text, one section per stage."""
    out: list[str] = [f"Audit of ({story['dataset']}, {story['query_id']}, {story['doc_id']})", ""]

    def section(title: str, lines: list[str | None]) -> None:
        out.append(title)
        out.extend(line for line in lines if line is not None)
        out.append("")

    query, chunk = story["query"], story["chunk"]
    relevance = story["relevance"]
    section("Query", [_line("text", query["text"]), _line("answers", "; ".join(query["answers"] or []) or "(none)"),
                      _line("relevant means", f"{relevance['kind']} ({relevance['from']})"
                            + (f": {relevance['definition']}" if relevance["definition"] else ""))]
            if query else ["  unknown query"])
    section("Chunk", [_line("title", chunk["title"]) if chunk["title"] else None, _line("text", chunk["text"])]
            if chunk else ["  unknown document"])
    original = story["original_judgment"]
    section("Original qrels", [_missing(story, "original_qrels"),
                               _line("judgment", f"relevance {original}" if original is not None
                                     else "not judged by the benchmark")])

    section("Surfaced by", _surfaced_lines(story))
    section("Filter", _filtered_lines(story))
    section("Debate", _debated_lines(story))
    section("Humans", _voted_lines(story))
    section("Final label (bridge_qrels)", _final_lines(story))
    section("Student annotator (a score, not a label)", _student_lines(story))
    section("Models and prompts", _models_lines(story))

    runs = story["dagster_runs"]
    section("Dagster runs", [_line(r["asset"] if r["partition"] == story["dataset"] else
                                   f"{r['asset']} {r['partition'].split('|')[-1]}",
                                   f"{r['run_id']}  {r['materialized_at']}"
                                   + (f"  snapshot {r['snapshot']}" if r.get("snapshot") is not None else ""))
                             for r in runs] if runs else ["  no materialization recorded in the Dagster instance"])
    return "\n".join(out).rstrip() + "\n"


def _surfaced_lines(story: dict[str, Any]) -> list[str | None]:
    """The systems that retrieved the pair, and its place in the pool."""
    lines: list[str | None] = [_missing(story, "retrieval_run", "candidate_pool")]
    for run in story["retrieval"] or []:
        lines.append(_line(run["retriever"], f"rank {run['rank']}  score {run['score']:.4f}  "
                                             f"config {run['config_hash']}"))
    if story["retrieval"] == []:
        lines.append("  no system retrieved it")
    if story["candidate_pool"]:
        pool = story["candidate_pool"]
        lines.append(_line("in the pool", f"{pool['n_systems']} system(s), best rank {pool['best_rank']}"))
    return lines


def _filtered_lines(story: dict[str, Any]) -> list[str | None]:
    """The filter's votes and outcome."""
    lines: list[str | None] = [_missing(story, "filter_votes", "filtered_pool")]
    if story["filter"]:
        outcome = story["filter"]["outcome"]
        if outcome:
            lines.append(_line("outcome", f"{'kept' if outcome['kept'] else 'dropped'} "
                                          f"({outcome['votes_supported']}/{outcome['votes_total']} supported)"))
        for vote in story["filter"]["votes"]:
            verdict = "failed: " + vote["error"] if vote["is_supported"] is None else \
                ("supported" if vote["is_supported"] else "not supported")
            lines.append(_line(vote["model"], f"{verdict}  call {vote['call_key']}"))
        if not outcome and not story["filter"]["votes"]:
            lines.append("  not filtered (judged by the original qrels, or not pooled)")
    return lines


def _debated_lines(story: dict[str, Any]) -> list[str | None]:
    """The labeler's outcome, its checks and every debate turn."""
    lines: list[str | None] = [_missing(story, "debate_labels", "debate_turns")]
    debate = story["debate"]
    if debate:
        lines.append(_line("outcome", f"{debate['outcome']}  label {debate['label']}  rounds "
                                      f"{debate['rounds_used']}  config {debate['config_hash']}"))
        if debate.get("flags"):
            agreed = debate.get("agreed_label")
            lines.append(_line("escalated because", ", ".join(debate["flags"])
                               + (f"  (the agents agreed on {agreed})" if agreed is not None else "")))
        if debate.get("confidence") is not None:
            lines.append(_line("confidence", f"weakest agent {debate['confidence']:.3f}  mean P(yes) "
                                             f"{debate['p_yes']:.3f}" if debate.get("p_yes") is not None
                               else f"weakest agent {debate['confidence']:.3f}"))
        if debate.get("answer_present") is not None:
            lines.append(_line("answer in chunk", "yes" if debate["answer_present"] else "no"))
        lines.append(_line("pair key", debate["pair_key"]))
        if debate.get("adjudicator_label") is not None:
            lines.append(_line("adjudicator", f"label {debate['adjudicator_label']}  call "
                                              f"{debate['adjudicator_call_key']}"))
        for turn in debate["turns"]:
            head = f"round {turn['round']} agent {turn['agent']} ({turn['stance']}, {turn['model']})"
            if turn["error"]:
                lines.append(f"  {head}: failed: {turn['error']}")
                continue
            sure = f"  (P {turn['confidence']:.3f})" if turn.get("confidence") is not None else ""
            lines.append(f"  {head}: {turn['response']}{sure}")
            for quote, found in zip(turn["reference"] or [], turn["quotes_in_chunk"]):
                lines.append(f"      quote: \"{quote}\"" + ("" if found else "  [NOT IN THE CHUNK]"))
            lines.append(f"      reason: {turn['reason']}")
    elif "debate_labels" not in story["not_materialized"]:
        lines.append("  not debated")
    return lines


def _voted_lines(story: dict[str, Any]) -> list[str | None]:
    """People's votes and their majority."""
    lines: list[str | None] = [_missing(story, "human_labels", "human_votes")]
    human = story["human"]
    if human["label"]:
        label = human["label"]
        lines.append(_line("majority", f"label {label['label']}  ({label['votes_relevant']}/{label['votes']} "
                                       f"relevant, agreement {label['agreement']:.2f})"))
    for vote in human["votes"]:
        kind = "attention check" if vote["is_attention_check"] else "vote"
        lines.append(_line(f"#{vote['vote_id']} {vote['annotator_id']}",
                           f"label {vote['label']}  {kind}  {'with' if vote['with_history'] else 'without'} "
                           f"history  {vote['status']}  {vote['created_at']}"))
    if human.get("review_sample"):
        kind = human["review_sample"]["kind"]
        lines.append(_line("sent to people", "in the audit of the filter's drops" if kind == "audit" else
                           f"in the calibration sample ({human['review_sample']['stratum']})"))
    if not human["label"] and not human["votes"]:
        lines.append("  no human votes")
    return lines


def _final_lines(story: dict[str, Any]) -> list[str | None]:
    """The label bridge_qrels holds, where it came from, and the imports behind it."""
    lines: list[str | None] = [_missing(story, "bridge_qrels")]
    final = story["final"]
    if final and final["source"] == "pending" and final["unverified_source"] == "provisional":
        lines.append(_line("label", "pending: a provisional debate consensus, not yet measured right "
                                    "on this dataset (not a label)"))
    elif final and final["source"] == "pending":
        lines.append(_line("label", "pending: escalated, awaiting people (not a label)"))
        if final["unverified_source"]:
            lines.append(_line("unverified guess", f"{final['unverified_label']} by the "
                                                   f"{final['unverified_source']} (not counted)"))
    elif final:
        lines.append(_line("label", f"relevance {final['relevance']}  source {final['source']}"
                                    + ("  (unverified: a model's drop)" if final["source"] == "filter" else "")))
        if final.get("import_file") and final.get("original_relevance") is not None:
            lines.append(_line("corrects", f"the original relevance {final['original_relevance']} -> "
                                           f"{final['relevance']} ({final['source']}: {final['import_file']}, "
                                           f"line {final['import_line']})"))
        elif final.get("import_file"):
            lines.append(_line("imported from", f"{final['import_file']}, line {final['import_line']}  ("
                                                + ("verified" if final.get("verified") else
                                                   "unverified: not counted as a found hole") + ")"))
    for judgment in story.get("imported") or []:
        won = final is not None and final["source"] == judgment["source"]
        kind = "correction" if judgment["corrects_original"] else \
            ("verified" if judgment["verified"] else "unverified")
        status = "the final label" if won else \
            ("same as the original: no change" if judgment["corrects_original"]
             and judgment["relevance"] == story["original_judgment"]
             else f"outranked by {final['source']}" if final else "not merged yet")
        lines.append(_line(f"import {judgment['source']}",
                           f"relevance {judgment['relevance']}  {judgment['file']}, line {judgment['line']}  "
                           f"({kind}, precedence {judgment['precedence']:g}; {status})"))
    if final:
        if final["vote_ids"]:
            lines.append(_line("votes", ", ".join(str(v) for v in final["vote_ids"])))
        if final["call_keys"]:
            lines.append(_line("calls", len(final["call_keys"])))
    if not final and story.get("final_status"):
        lines.append(_line("label", story["final_status"]))
    return lines


def _student_lines(story: dict[str, Any]) -> list[str | None]:
    scored = story.get("student")
    if scored is None:
        return [_missing(story, "student_scores") or "  not scored (not in the candidate pool)"]
    if "not_trained" in scored:
        return [f"  no student annotator for this dataset: {scored['not_trained']}"]
    lines: list[str | None] = [_line("P(relevant)", f"{scored['p_relevant']:.3f}")]
    student = scored["student"]
    if student:
        lines.append(_line("scored by", f"student {student['student_key']} (weights {student['weights_hash']}), "
                                        f"trained on {student['trained_on']} and calibrated on "
                                        f"{student['calibrated_on']} of {student['labels']} verified "
                                        f"labels ({student['relevant']} relevant) as of lake snapshot "
                                        f"{student['learned_from_snapshot']}; calibration {student['calibration']}"))
    learned = scored["learned_from_pair"]
    if learned and learned["split"] == SAMPLED_OUT:
        said = f"no: its label {learned['label']} ({learned['source']}) was left out by the max_labels sample"
    elif learned and learned["split"] == ONE_CLASS_QUERY:
        said = (f"no: its label {learned['label']} ({learned['source']}) was left out, its query's "
                "verified labels being all of one class")
    else:
        said = f"yes: label {learned['label']} ({learned['source']}, {learned['split']} split)" if learned else "no"
        if learned and learned["split"] == TRAIN and learned.get("teacher") is not None:
            said += f", distilled with the debate's P(yes) {learned['teacher']:.2f}"
    lines.append(_line("learned from it", said))
    return lines


def _models_lines(story: dict[str, Any]) -> list[str | None]:
    """The model calls behind the label and the prompts' current versions."""
    lines: list[str | None] = [_missing(story, "llm_calls")]
    for call in story["llm_calls"] or []:
        lines.append(_line(call["purpose"] or "call", f"{call['profile']} ({call['model']})  prompt "
                                                      f"{call['prompt_hash']}  run {call['run_id']}  "
                                                      f"{'failed' if call['error'] else 'ok'}  key {call['key'][:16]}"))
    for template, digest in story["prompt_templates"].items():
        lines.append(_line(f"template {template}", f"{digest} (current)"))
    if story["llm_calls"] == []:
        lines.append("  no LLM call behind this label")
    return lines


def audit_command(
    dataset: str = typer.Option(..., "--dataset", "-d", help="Dataset of the pair."),
    query: str = typer.Option(..., "--query", "-q", help="Query id."),
    doc: str = typer.Option(..., "--doc", help="Document (chunk) id."),
    as_json: bool = typer.Option(False, "--json", help="Print the story as JSON."),
) -> None:
    """The whole story of one label: texts, systems and ranks, filter votes, debate turns,
    human votes, final label and source, models, prompt hashes and Dagster run ids."""
    from bridge_assets.cli.errors import fail
    from bridge_assets.human.votes_store import VotesConflict, copy_votes
    from bridge_assets.lake import store
    from bridge_assets.lake.location import lake_location
    from bridge_assets.orchestration import runs as orchestration

    lake = lake_location()  # the command's edge
    if not store.exists(lake):
        fail(f"no data lake at {store.describe(lake)}")
    try:
        with store.connect(lake) as con:
            # the pair's votes live in the votes store: copied in for the audit (read-only)
            copy_votes(con, dataset, lake)
            story = audit_pair(con, dataset, query, doc, instance=orchestration.instance())
    except (AuditError, VotesConflict) as exc:
        fail(str(exc))
    typer.echo(json.dumps(story, indent=2, default=str) if as_json else format_story(story).rstrip("\n"))
