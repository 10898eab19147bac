-- pool_saturation, qrels for the marginal contribution MC(r) of each system r, one variant
-- per value of the `dataset` column (the metrics core evaluates every variant at once):
--   'with'           the refined qrels, built from every system's pool;
--   'without:<r>'    the qrels the pipeline would have built without r: the refined qrels
--                    minus the new judgments of the pairs only r surfaced. Original judgments
--                    stay whoever surfaced them, and so do new judgments of pairs outside the
--                    pool (nobody's in particular).
-- Inputs: candidate_pool, the analysis views (bridge_assets.analysis.views).
with judged as (
    select b.query_id, b.doc_id, b.relevance, o.query_id is not null as original, p.systems
    from analysis_refined_qrels b
    left join analysis_original_qrels o on o.query_id = b.query_id and o.doc_id = b.doc_id
    left join candidate_pool p
           on p.dataset = b.dataset and p.query_id = b.query_id and p.doc_id = b.doc_id
),
systems as (
    select distinct retriever from analysis_run
)
select 'with' as dataset, query_id, doc_id, relevance
from judged
union all
select 'without:' || s.retriever as dataset, j.query_id, j.doc_id, j.relevance
from judged j
cross join systems s
where j.original or j.systems is null or j.systems <> [s.retriever]
