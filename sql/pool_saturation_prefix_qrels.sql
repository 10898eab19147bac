-- pool_saturation, qrels for the marginal-contribution curve: one variant per prefix of an
-- order of adding systems (temp table saturation_prefixes: variant, members VARCHAR[]), the
-- qrels the pipeline would have built from the pools of those systems only: original
-- judgments and new judgments of pairs outside the pool always (as in
-- pool_saturation_qrels.sql), new judgments of pool pairs only when a member surfaced them.
-- The variant with every system is the refined qrels; the empty one, the original qrels and
-- the new judgments nobody's pool holds.
-- Parameter $relevant_only: the measures tell an irrelevant judgment from no judgment only
-- through the queries they evaluate (Hit, nDCG, Recall, P, MRR, MAP), so a new irrelevant
-- judgment is left out of the variants where its query keeps a judgment in every variant (an
-- original one, or one outside the pool): the scores are the same, the variants much smaller
-- (at the paper's shape most new judgments are irrelevant).
-- Inputs: candidate_pool, the analysis views (bridge_assets.analysis.views), saturation_prefixes.
with judged as (
    select b.query_id, b.doc_id, b.relevance, o.query_id is not null as original, p.systems
    from analysis_refined_qrels b
    left join analysis_original_qrels o on o.query_id = b.query_id and o.doc_id = b.doc_id
    left join candidate_pool p
           on p.dataset = b.dataset and p.query_id = b.query_id and p.doc_id = b.doc_id
),
always_judged as (
    select distinct query_id from judged where original or systems is null
),
varying as (
    select j.*
    from judged j
    where not (j.original or j.systems is null)
      and (j.relevance > 0 or not $relevant_only
           or j.query_id not in (select query_id from always_judged))
)
select v.variant as dataset, j.query_id, j.doc_id, j.relevance
from saturation_prefixes v
cross join judged j
where j.original or j.systems is null
union all
select v.variant as dataset, j.query_id, j.doc_id, j.relevance
from saturation_prefixes v
join varying j on list_has_any(j.systems, v.members)
