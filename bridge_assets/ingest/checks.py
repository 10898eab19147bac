"""Asset checks of the ingest tables, as great-expectations suites (see bridge_assets.quality).

Checks read the whole table (every dataset at once), so one check result covers all
partitions and a failure names the datasets concerned.
"""


import dagster as dg

from bridge_assets.quality import expectations, validate
from bridge_assets.resources import DuckDBStore


def _result(outcome, rows: int) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(passed=outcome.success, metadata={"rows": rows, **outcome.failures})


@dg.asset_check(asset="corpus", description="doc_id unique per dataset; title present; text non-empty.")
def corpus_is_valid(store: DuckDBStore) -> dg.AssetCheckResult:
    frame = store.read("select dataset, doc_id, title, text from corpus")
    expect = expectations()
    outcome = validate(frame, [
        expect.ExpectCompoundColumnsToBeUnique(column_list=["dataset", "doc_id"]),
        expect.ExpectColumnValuesToNotBeNull(column="doc_id"),
        expect.ExpectColumnValuesToNotBeNull(column="text"),
        expect.ExpectColumnValueLengthsToBeBetween(column="text", min_value=1),
    ], "corpus")
    return _result(outcome, frame.height)


@dg.asset_check(asset="queries", description="query_id unique per dataset; text non-empty; in a "
                "dataset that declares answers, every query has at least one.")
def queries_are_valid(store: DuckDBStore) -> dg.AssetCheckResult:
    frame = store.read("""
        select dataset, query_id, text, len(answers) as answer_count,
               max(len(answers)) over (partition by dataset) > 0 as dataset_has_answers
        from queries""")
    with_answers = frame.filter(frame["dataset_has_answers"])
    expect = expectations()
    outcome = validate(frame, [
        expect.ExpectCompoundColumnsToBeUnique(column_list=["dataset", "query_id"]),
        expect.ExpectColumnValuesToNotBeNull(column="text"),
        expect.ExpectColumnValueLengthsToBeBetween(column="text", min_value=1),
    ], "queries")
    answers = validate(with_answers, [
        expect.ExpectColumnValuesToBeBetween(column="answer_count", min_value=1),
    ], "queries_answers")
    outcome.success &= answers.success
    outcome.failures.update(answers.failures)
    return _result(outcome, frame.height)


@dg.asset_check(asset="original_qrels", additional_deps=["corpus", "queries"],
                description="one judgment per (query, doc); every row names a known query and document.")
def original_qrels_are_valid(store: DuckDBStore) -> dg.AssetCheckResult:
    frame = store.read("""
        select r.dataset, r.query_id, r.doc_id, r.relevance,
               exists (select 1 from corpus c
                       where c.dataset = r.dataset and c.doc_id = r.doc_id) as doc_known,
               exists (select 1 from queries q
                       where q.dataset = r.dataset and q.query_id = r.query_id) as query_known
        from original_qrels r""")
    expect = expectations()
    outcome = validate(frame, [
        expect.ExpectCompoundColumnsToBeUnique(column_list=["dataset", "query_id", "doc_id"]),
        expect.ExpectColumnValuesToBeInSet(column="doc_known", value_set=[True]),
        expect.ExpectColumnValuesToBeInSet(column="query_known", value_set=[True]),
        expect.ExpectColumnValuesToNotBeNull(column="relevance"),
    ], "original_qrels")
    return _result(outcome, frame.height)
