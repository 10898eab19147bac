-- pool_saturation, filled holes: every pair of the candidate pool (queries in scope) that the
-- refined qrels judge relevant and the original qrels never judged, with the systems whose
-- top-k surfaced it (candidate_pool.systems). Growth and saturation are counted on these.
-- Inputs: candidate_pool, the analysis views (bridge_assets.analysis.views).
select p.query_id, p.doc_id, p.systems
from candidate_pool p
join analysis_refined_qrels b
  on b.dataset = p.dataset and b.query_id = p.query_id and b.doc_id = p.doc_id
anti join analysis_original_qrels o
  on o.query_id = p.query_id and o.doc_id = p.doc_id
where b.relevance > 0
order by p.query_id, p.doc_id
