"""Asset checks of the labeling tables, as great-expectations suites (see bridge_assets.quality).

Like the ingest checks, each reads the whole table (every dataset), so one result covers all
partitions; cross-table rules are joined in SQL first, then expressed as column expectations.
"""

from __future__ import annotations

import dagster as dg

from bridge_assets.lake.resource import DuckDBStore
from bridge_assets.quality import SuiteOutcome, expectations, validate
from bridge_assets.registry.datasets import graded_datasets


def _result(outcome: SuiteOutcome, rows: int) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(passed=outcome.success, metadata={"rows": rows, **outcome.failures})


@dg.asset_check(asset="candidate_pool", description="one row per (query, doc); systems and ranks "
                "line up; ranks start at 1.")
def candidate_pool_is_valid(store: DuckDBStore) -> dg.AssetCheckResult:
    frame = store.read("""
        select dataset, query_id, doc_id, best_rank,
               len(systems) = n_systems and len(ranks) = n_systems
               and len(list_distinct(systems)) = n_systems as systems_line_up
        from candidate_pool""")
    expect = expectations()
    outcome = validate(frame, [
        expect.ExpectCompoundColumnsToBeUnique(column_list=["dataset", "query_id", "doc_id"]),
        expect.ExpectColumnValuesToBeInSet(column="systems_line_up", value_set=[True]),
        expect.ExpectColumnValuesToBeBetween(column="best_rank", min_value=1),
    ], "candidate_pool")
    return _result(outcome, frame.height)


@dg.asset_check(asset="debate_labels", description="labels on the dataset's scale ({0,1}, or the "
                "grades 0-3 when graded), set exactly on consensus pairs and the pairs voted beyond "
                "the human budget; escalated pairs carry the reasons; outcomes known; one row per "
                "(query, doc).")
def debate_labels_are_valid(store: DuckDBStore) -> dg.AssetCheckResult:
    frame = store.read("""
        select dataset, query_id, doc_id, label, adjudicator_label, outcome,
               (label is not null) = (outcome in ('consensus', 'vote')) as label_matches_outcome,
               outcome not in ('escalated', 'failed') or len(flags) > 0 as escalation_has_reason,
               coalesce(label between 0 and top, true)
                   and coalesce(adjudicator_label between 0 and top, true) as labels_on_scale
        from (select *, if(list_contains(?, dataset), 3, 1) as top from debate_labels)""",
        [list(graded_datasets())])
    expect = expectations()
    outcome = validate(frame, [
        expect.ExpectCompoundColumnsToBeUnique(column_list=["dataset", "query_id", "doc_id"]),
        expect.ExpectColumnValuesToBeInSet(column="labels_on_scale", value_set=[True]),
        expect.ExpectColumnValuesToBeInSet(column="outcome",
                                           value_set=["consensus", "escalated", "failed", "vote"]),
        expect.ExpectColumnValuesToBeInSet(column="label_matches_outcome", value_set=[True]),
        expect.ExpectColumnValuesToBeInSet(column="escalation_has_reason", value_set=[True]),
    ], "debate_labels")
    return _result(outcome, frame.height)


# A pair's history is complete when rounds 1..rounds_used are all there, each with one turn
# per agent (at least two); an escalated pair's turns all answered; a failed pair's last
# round holds the failed turn(s) and every earlier round answered.
HISTORY_SQL = """
with rounds as (
    select dataset, query_id, doc_id, round, count(*) as turns, count(response) as answered,
           max(round) over (partition by dataset, query_id, doc_id) as last_round
    from debate_turns
    group by dataset, query_id, doc_id, round
),
history as (
    select dataset, query_id, doc_id, count(*) as rounds_present, max(round) as last_round,
           min(turns) as min_turns, max(turns) as max_turns,
           coalesce(sum(turns - answered) filter (where round < last_round), 0) as unanswered_before,
           coalesce(sum(turns - answered) filter (where round = last_round), 0) as unanswered_last
    from rounds
    group by dataset, query_id, doc_id
)
select l.dataset, l.query_id, l.doc_id, l.outcome, l.rounds_used,
       coalesce(h.rounds_present = l.rounds_used and h.last_round = l.rounds_used
                and h.min_turns = h.max_turns and h.min_turns >= 2 and h.unanswered_before = 0
                and case when l.outcome = 'escalated' then h.unanswered_last = 0
                         else h.unanswered_last > 0 end, false) as history_complete
from debate_labels l
left join history h using (dataset, query_id, doc_id)
where l.outcome in ('escalated', 'failed')
"""


@dg.asset_check(asset="debate_labels", additional_deps=["debate_turns"],
                description="every escalated or failed pair carries its full debate history.")
def escalated_pairs_have_full_history(store: DuckDBStore) -> dg.AssetCheckResult:
    frame = store.read(HISTORY_SQL)
    expect = expectations()
    outcome = validate(frame, [
        expect.ExpectColumnValuesToBeInSet(column="history_complete", value_set=[True]),
    ], "debate_history")
    return _result(outcome, frame.height)
