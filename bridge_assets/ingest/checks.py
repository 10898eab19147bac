"""Asset checks of the ingest tables, as great-expectations suites (see bridge_assets.quality).

Checks read the whole table (every dataset at once), so one check result covers all
partitions and a failure names the datasets concerned. The three are one step
(`ingest_tables_are_valid`, each still its own check in the UI): under the multiprocess
executor a step is a process, and each would import Dagster, the definitions and
great_expectations (about 5 s on 2 cores) to validate tables of a few thousand rows.
"""

from collections.abc import Callable, Iterator

import dagster as dg

from bridge_assets.lake.resource import DuckDBStore
from bridge_assets.quality import SuiteOutcome, expectations, validate


def _result(outcome: SuiteOutcome, rows: int) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(passed=outcome.success, metadata={"rows": rows, **outcome.failures})


def corpus_is_valid(store: DuckDBStore) -> dg.AssetCheckResult:
    """doc_id unique per dataset; title present; text non-empty."""
    frame = store.read("select dataset, doc_id, title, text from corpus")
    expect = expectations()
    outcome = validate(frame, [
        expect.ExpectCompoundColumnsToBeUnique(column_list=["dataset", "doc_id"]),
        expect.ExpectColumnValuesToNotBeNull(column="doc_id"),
        expect.ExpectColumnValuesToNotBeNull(column="text"),
        expect.ExpectColumnValueLengthsToBeBetween(column="text", min_value=1),
    ], "corpus")
    return _result(outcome, frame.height)


def queries_are_valid(store: DuckDBStore) -> dg.AssetCheckResult:
    """query_id unique per dataset; text non-empty; in a dataset that declares answers, every
    query has at least one."""
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


def original_qrels_are_valid(store: DuckDBStore) -> dg.AssetCheckResult:
    """one judgment per (query, doc); every row names a known query and document."""
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


CHECKS: dict[str, tuple[Callable[[DuckDBStore], dg.AssetCheckResult], list[str]]] = {
    # check name: (function, the tables it reads; the first is the asset it checks)
    "corpus_is_valid": (corpus_is_valid, ["corpus"]),
    "queries_are_valid": (queries_are_valid, ["queries"]),
    "original_qrels_are_valid": (original_qrels_are_valid, ["original_qrels", "corpus", "queries"]),
}


@dg.multi_asset_check(
    specs=[dg.AssetCheckSpec(name, asset=tables[0], additional_deps=tables[1:],
                             description=" ".join((function.__doc__ or "").split()))
           for name, (function, tables) in CHECKS.items()],
    can_subset=True)
def ingest_tables_are_valid(context: dg.AssetCheckExecutionContext,
                            store: DuckDBStore) -> Iterator[dg.AssetCheckResult]:
    for key in context.selected_asset_check_keys:
        result = CHECKS[key.name][0](store)
        yield dg.AssetCheckResult(asset_key=key.asset_key, check_name=key.name, passed=result.passed,
                                  metadata=result.metadata)
