"""Export votes (CSV/JSON) and import votes collected elsewhere (CSV/JSON, Label Studio's JSON
export), validated record by record; an import is all or nothing.

CSV/JSON columns are the export's: dataset, query_id, doc_id, annotator_id, label (0/1, or
yes/no, relevant/irrelevant; a grade 0-3 on a graded dataset), and optionally comment, with_history (default true),
is_attention_check, expected_label, status ('accepted' | 'excluded'), created_at.
Label Studio tasks must carry dataset, query_id and doc_id in their `data`; each annotation
needs one `choices` result (or one named `relevance`) whose choice is yes/no-like, and an
optional `textarea` result becomes the comment. Its annotators become `labelstudio-<id>` (or
their e-mail).

An import never speaks for someone who logs in to the app: votes under the name of an annotator
holding a token are refused unless the admin overrides, and then their source says so
('import:override:<file>'). The CSV export defuses cells a spreadsheet would run as formulas.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Collection, Iterator
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import duckdb
import polars as pl
from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from bridge_assets.errors import BridgeError
from bridge_assets.human import annotators
from bridge_assets.human.labels import for_people_sql
from bridge_assets.human.tables import ensure_schema
from bridge_assets.human.votes import insert_vote, votes_frame
from bridge_assets.lake.store import table_exists, transaction
from bridge_assets.registry.datasets import validate_dataset_name

MAX_COMMENT = 2000
ImportFormat = Literal["auto", "csv", "json", "label-studio"]
ExportFormat = Literal["csv", "json"]

_LABEL_WORDS = {"1": 1, "yes": 1, "y": 1, "relevant": 1, "true": 1,
                "0": 0, "no": 0, "n": 0, "irrelevant": 0, "not relevant": 0, "false": 0}


def _to_label(value: Any) -> Any:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word.isdigit():
            return int(word)
        if word not in _LABEL_WORDS:
            raise ValueError(f"label {value!r} is not one of yes/no, relevant/irrelevant, 1/0 "
                             "or a grade 0-3")
        return _LABEL_WORDS[word]
    return value


def _check_label(value: int | None) -> int | None:
    if value not in (None, 0, 1):
        raise ValueError(f"label must be 0 or 1, got {value}")
    return value


def _check_vote(value: int) -> int:
    if value not in (0, 1, 2, 3):
        raise ValueError(f"label must be 0 or 1, or a grade 0-3 on a graded dataset, got {value}")
    return value


def _to_id(value: Any) -> Any:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _naive_utc(value: datetime | None) -> datetime | None:
    if value is not None and value.tzinfo is not None:
        return value.astimezone(UTC).replace(tzinfo=None)
    return value


Label = Annotated[int, BeforeValidator(_to_label), AfterValidator(_check_vote)]
Identifier = Annotated[str, BeforeValidator(_to_id), Field(min_length=1, max_length=500)]


class VoteRecord(BaseModel):
    """One imported vote."""

    model_config = ConfigDict(extra="ignore", str_strip_whitespace=True)

    dataset: Annotated[Identifier, AfterValidator(validate_dataset_name)]
    query_id: Identifier
    doc_id: Identifier
    annotator_id: Annotated[str, AfterValidator(annotators.check_name)]
    label: Label
    comment: str | None = Field(None, max_length=MAX_COMMENT)
    with_history: bool = True
    is_attention_check: bool = False
    expected_label: Annotated[int | None, BeforeValidator(_to_label), AfterValidator(_check_label)] = None
    status: Literal["accepted", "excluded"] = "accepted"
    created_at: Annotated[datetime | None, AfterValidator(_naive_utc)] = None

    @model_validator(mode="after")
    def _attention_check_has_expected_label(self) -> VoteRecord:
        if self.is_attention_check != (self.expected_label is not None):
            raise ValueError("expected_label is required for an attention check and only for one")
        return self


class ImportFailed(BridgeError, ValueError):
    """The file cannot be imported; `errors` name each record and field at fault, and
    `token_holders` the annotators who log in to the app that the file votes for."""

    def __init__(self, source: str, errors: list[str], token_holders: tuple[str, ...] = ()):
        self.errors, self.token_holders = errors, token_holders
        shown = "\n".join(errors[:50]) + (f"\n... and {len(errors) - 50} more" if len(errors) > 50 else "")
        super().__init__(f"{source}: {len(errors)} problem(s), nothing imported:\n{shown}")


def _describe(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'record'}: {e['msg']}" for e in exc.errors())


def _csv_rows(text: str) -> Iterator[tuple[str, dict[str, Any]]]:
    reader = csv.DictReader(io.StringIO(text))
    required = {"dataset", "query_id", "doc_id", "annotator_id", "label"}
    missing = required - set(reader.fieldnames or [])
    if missing:
        raise ValueError(f"line 1: missing column(s) {', '.join(sorted(missing))}")
    for row in reader:
        # empty cells are absent values; the optional fields take their defaults
        yield f"line {reader.line_num}", {k: v for k, v in row.items() if k and v not in ("", None)}


def _json_rows(data: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    records = data.get("votes") if isinstance(data, dict) else data
    if not isinstance(records, list):
        raise ValueError("expected a list of votes (or an object with a 'votes' list)")
    for n, record in enumerate(records, 1):
        yield f"record {n}", record if isinstance(record, dict) else {"record": record}


class _StudioRegion(BaseModel):
    type: str
    from_name: str | None = None
    value: dict[str, Any] = Field(default_factory=dict)


class _StudioUser(BaseModel):
    id: int | str | None = None
    email: str | None = None


class _StudioAnnotation(BaseModel):
    completed_by: int | str | _StudioUser
    result: list[_StudioRegion] = Field(default_factory=list)
    was_cancelled: bool = False
    created_at: str | None = None


class _StudioTask(BaseModel):
    """A task of Label Studio's JSON export (older versions call annotations `completions`)."""

    id: int | str | None = None
    data: dict[str, Any]
    annotations: list[_StudioAnnotation] = Field(
        default_factory=list, validation_alias=AliasChoices("annotations", "completions"))


def _label_studio_vote(task: _StudioTask, annotation: _StudioAnnotation) -> dict[str, Any]:
    choices = [r for r in annotation.result if r.type == "choices"]
    if len(choices) > 1:
        choices = [r for r in choices if r.from_name == "relevance"]
    if len(choices) != 1:
        raise ValueError("needs exactly one 'choices' result (or one whose from_name is 'relevance')")
    picked = choices[0].value.get("choices") or []
    if len(picked) != 1:
        raise ValueError(f"needs exactly one choice, got {picked}")
    comment = "\n".join(str(t) for r in annotation.result if r.type == "textarea"
                        for t in r.value.get("text", []))
    who = annotation.completed_by
    annotator = (who.email or f"labelstudio-{who.id}") if isinstance(who, _StudioUser) \
        else f"labelstudio-{who}"
    vote = {"dataset": task.data.get("dataset"), "query_id": task.data.get("query_id"),
            "doc_id": task.data.get("doc_id"), "annotator_id": annotator, "label": picked[0],
            "comment": comment or None, "created_at": annotation.created_at,
            "with_history": task.data.get("with_history")}
    return {k: v for k, v in vote.items() if v is not None}


def _label_studio_rows(data: Any) -> Iterator[tuple[str, dict[str, Any] | ValueError]]:
    if not isinstance(data, list):
        raise ValueError("expected Label Studio's list of tasks")
    for n, raw in enumerate(data, 1):
        try:
            task = _StudioTask.model_validate(raw)
        except ValidationError as exc:
            yield f"task {n}", ValueError(_describe(exc))
            continue
        for m, annotation in enumerate(task.annotations, 1):
            if annotation.was_cancelled:
                continue  # skipped in Label Studio: no answer
            where = f"task {n} (id {task.id}), annotation {m}"
            try:
                yield where, _label_studio_vote(task, annotation)
            except ValueError as exc:
                yield where, exc


MAX_JSON_DEPTH = 100  # a votes file needs about 6 levels


def _too_deep_line(text: str, limit: int = MAX_JSON_DEPTH) -> int:
    """The line where JSON `text` first nests deeper than `limit` (brackets in strings aside)."""
    depth, line, in_string, escaped = 0, 1, False, False
    for char in text:
        if char == "\n":
            line += 1
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                return line
        elif char in "]}":
            depth -= 1
    return line


def _is_label_studio(data: Any) -> bool:
    return isinstance(data, list) and bool(data) and all(
        isinstance(t, dict) and "data" in t and ("annotations" in t or "completions" in t) for t in data)


def parse_votes(content: bytes, source: str,
                fmt: ImportFormat = "auto") -> tuple[list[tuple[str, VoteRecord]], list[str]]:
    """The valid records of a votes file (each with where it came from: "line 3", "record 2")
    and a message naming the record and field of each invalid one."""
    try:
        text = content.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ImportFailed(source, [f"{source}: not UTF-8 text ({exc})"]) from None
    if fmt == "auto":
        fmt = "csv" if source.lower().endswith(".csv") else "json"
    rows: Iterator[tuple[str, Any]]
    if fmt == "csv":
        rows = _csv_rows(text)
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ImportFailed(source, [f"{source}, line {exc.lineno}: malformed JSON: {exc.msg}"]) from None
        except RecursionError:  # only looked for once the parser gave up: no cost on good files
            raise ImportFailed(source, [f"{source}, line {_too_deep_line(text)}: JSON nested deeper "
                                        f"than {MAX_JSON_DEPTH} levels"]) from None
        if fmt == "label-studio" or (fmt == "json" and _is_label_studio(data)):
            rows = _label_studio_rows(data)
        else:
            rows = _json_rows(data)
    records, errors = [], []
    try:
        for where, row in rows:
            if isinstance(row, ValueError):
                errors.append(f"{source}, {where}: {row}")
                continue
            try:
                records.append((where, VoteRecord.model_validate(row)))
            except ValidationError as exc:
                errors.append(f"{source}, {where}: {_describe(exc)}")
    except csv.Error as exc:
        errors.append(f"{source}: malformed CSV: {exc}")
    except ValueError as exc:  # the file's overall shape (header, list of records) is wrong
        raise ImportFailed(source, [f"{source}, {exc}" if str(exc).startswith("line")
                                    else f"{source}: {exc}"]) from None
    if not records and not errors:
        errors.append(f"{source}: no votes in the file")
    return records, errors


def _pair_errors(con: duckdb.DuckDBPyConnection, records: list[tuple[str, VoteRecord]],
                 source: str) -> list[str]:
    """Votes must be on an escalated pair (attention checks: on a known query and chunk), once
    per annotator and pair, and not repeat a vote already stored."""
    errors: list[str] = []
    seen: dict[tuple[str, str, str, str, bool], str] = {}  # annotator and pair -> where first
    for where, r in records:
        key = (r.dataset, r.query_id, r.doc_id, r.annotator_id, r.is_attention_check)
        if key in seen:
            errors.append(f"{source}, {where}: same annotator and pair as {seen[key]}")
        seen.setdefault(key, where)
    if not records:
        return errors
    frame = pl.DataFrame([{"where": w, **r.model_dump(include={"dataset", "query_id", "doc_id",
                                                               "annotator_id", "is_attention_check"})}
                          for w, r in records])
    has_debate = table_exists(con, "debate_labels")
    has_ingest = table_exists(con, "queries") and table_exists(con, "corpus")
    escalated = for_people_sql(con, "f") if has_debate else "false"
    known = """exists (select 1 from queries q where q.dataset = f.dataset and q.query_id = f.query_id)
               and exists (select 1 from corpus c where c.dataset = f.dataset and c.doc_id = f.doc_id)""" \
        if has_ingest else "false"
    con.register("_imported", frame.to_arrow())
    try:
        rows = con.execute(f"""
            select f."where", f.is_attention_check,
                   case when f.is_attention_check then {known} else {escalated} end as pair_ok,
                   exists (select 1 from human_votes v where v.dataset = f.dataset
                           and v.query_id = f.query_id and v.doc_id = f.doc_id
                           and v.annotator_id = f.annotator_id
                           and v.is_attention_check = f.is_attention_check) as already_voted
            from _imported f""").fetchall()
    finally:
        con.unregister("_imported")
    for where, is_check, pair_ok, already_voted in rows:
        if not pair_ok:
            errors.append(f"{source}, {where}: " + ("query or chunk unknown in queries/corpus" if is_check
                                          else "not a pair sent to people (an escalated pair of "
                                          "debate_labels, or one of the review sample)"))
        if already_voted:
            errors.append(f"{source}, {where}: this annotator already has a vote on this pair")
    return errors


def _token_holders(con: duckdb.DuckDBPyConnection, records: list[tuple[str, VoteRecord]]) -> set[str]:
    """The annotators of `records` who log in to the app (hold a token)."""
    names = sorted({r.annotator_id for _, r in records})
    if not names:
        return set()
    return {row[0] for row in con.execute(
        "select annotator_id from annotators where token_hash is not null "
        "and list_contains(?, annotator_id)", [names]).fetchall()}


def import_votes(con: duckdb.DuckDBPyConnection, content: bytes, source: str,
                 fmt: ImportFormat = "auto", *, override: bool = False,
                 graded: Collection[str] = ()) -> int:
    """Validate a votes file and store it in one transaction, or raise ImportFailed listing every
    problem and store nothing. Annotators unknown here are created without a token (they cannot
    log in). Votes for annotators who log in to the app (attention checks too) are refused, so an
    import cannot vote or pass checks in their name, unless `override`: then they are stored with
    source 'import:override:<file>'. Votes of 2 or 3 are grades, for the `graded` datasets only.
    Returns how many votes were added."""
    ensure_schema(con)
    records, errors = parse_votes(content, source, fmt)
    errors += [f"{source}, {where}: label {r.label} is a grade, and dataset '{r.dataset}' is not "
               "graded (votes 0 or 1)" for where, r in records if r.label > 1 and r.dataset not in graded]
    errors += _pair_errors(con, records, source)
    holders = _token_holders(con, records)
    if not override:
        errors += [f"{source}, {where}: annotator '{r.annotator_id}' logs in to the app; "
                   "votes in their name come from the app only" for where, r in records
                   if r.annotator_id in holders]
    if errors:
        raise ImportFailed(source, errors, tuple(sorted(holders)) if not override else ())
    with transaction(con):
        for _, r in records:
            annotators.ensure_external_annotator(con, r.annotator_id)
            origin = "import:override" if r.annotator_id in holders else "import"
            insert_vote(con, dataset=r.dataset, query_id=r.query_id, doc_id=r.doc_id,
                        annotator_id=r.annotator_id, label=r.label, comment=r.comment,
                        with_history=r.with_history, is_attention_check=r.is_attention_check,
                        expected_label=r.expected_label, status=r.status,
                        source=f"{origin}:{source}"[:300], created_at=r.created_at)
    return len(records)


# What makes a spreadsheet read a cell as a formula (OWASP's CSV injection list).
_FORMULA_START = r"^[=+\-@\t\r]"


def _defused(column: str) -> pl.Expr:
    """The column with a single quote before each cell a spreadsheet would run as a formula."""
    cell = pl.col(column)
    return pl.when(cell.str.contains(_FORMULA_START)).then("'" + cell).otherwise(cell).alias(column)


def export_votes(con: duckdb.DuckDBPyConnection, fmt: ExportFormat,
                 dataset: str | None = None) -> str:
    frame = votes_frame(con, dataset).with_columns(
        pl.col("created_at").dt.to_string("%Y-%m-%dT%H:%M:%S%.6f"))
    if fmt == "csv":  # the JSON export stays exact
        return frame.with_columns(_defused(c) for c, t in frame.schema.items()
                                  if t == pl.String).write_csv()
    return json.dumps(frame.to_dicts(), indent=1, ensure_ascii=False)
