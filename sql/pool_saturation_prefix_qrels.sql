-- pool_saturation, judgments for the marginal-contribution curve. The qrels the pipeline would
-- have built from the pools of a set of systems C only, D(C), hold the original judgments and
-- the new judgments of pairs outside the pool always (as in pool_saturation_qrels.sql), and the
-- new judgments of pool pairs only when a system of C surfaced them. One row per judgment:
-- `systems` NULL when every D(C) holds it, else the systems whose top-k surfaced it.
-- D(every system) is the refined qrels; D(no system), the original qrels and the new judgments
-- nobody's pool holds.
-- Parameter $relevant_only: the measures tell an irrelevant judgment from no judgment only
-- through the queries they evaluate (Hit, nDCG, Recall, P, MRR, MAP), so a new irrelevant
-- judgment is left out where its query keeps a judgment in every D(C) (an original one, or one
-- outside the pool): the scores are the same, the work much smaller (at the paper's shape most
-- new judgments are irrelevant).
-- Inputs: candidate_pool, the analysis views (bridge_assets.analysis.views).
with judged as (
    select b.query_id, b.doc_id, b.relevance, o.query_id is not null as original, p.systems
    from analysis_refined_qrels b
    left join analysis_original_qrels o on o.query_id = b.query_id and o.doc_id = b.doc_id
    left join candidate_pool p
           on p.dataset = b.dataset and p.query_id = b.query_id and p.doc_id = b.doc_id
),
always_judged as (
    select distinct query_id from judged where original or systems is null
)
select query_id, doc_id, relevance,
       case when not (original or systems is null) then systems end as systems
from judged
where original or systems is null or relevance > 0 or not $relevant_only
   or query_id not in (select query_id from always_judged)
order by query_id, doc_id
