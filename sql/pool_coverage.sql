-- pool_coverage, relevant chunks: every pair of the queries in scope judged relevant in the
-- refined qrels, at both bounds over pending pairs (refined: pending irrelevant; refined_upper:
-- pending relevant), with the systems whose top-k surfaced it (candidate_pool.systems). NULL
-- systems: no system surfaced it, a relevant chunk known to lie outside the pool (original
-- gold the systems missed, a judgment imported for a pair outside it).
-- Inputs: candidate_pool, the analysis views (bridge_assets.analysis.views).
with judged as (
    select 'refined' as qrels_version, dataset, query_id, doc_id, relevance from analysis_refined_qrels
    union all
    select 'refined_upper', dataset, query_id, doc_id, relevance from analysis_refined_upper_qrels
)
select j.qrels_version, j.query_id, j.doc_id, p.systems
from judged j
left join candidate_pool p
       on p.dataset = j.dataset and p.query_id = j.query_id and p.doc_id = j.doc_id
where j.relevance > 0
order by j.qrels_version, j.query_id, j.doc_id
