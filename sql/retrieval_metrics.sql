-- retrieval_metrics: what trec_eval's measures are computed from, in two statements (split on
-- the line holding only ';'). The measures themselves are vectorised numpy over these rows in
-- bridge_assets/metrics/measures.py (one pass over every ranking at once); conventions in
-- docs/metrics.md.
--
-- Inputs, temp views made by bridge_assets.metrics.measures:
--   metrics_run(dataset, retriever, query_id, doc_id, score)
--   metrics_qrels(dataset, query_id, doc_id, relevance)            the qrels evaluated against
--   metrics_original_qrels(dataset, query_id, doc_id, relevance)   for hole_k (may be empty)
--
-- 1. Every retrieved document with its judgment: relevance is NULL for a document the qrels do
--    not list, original_relevance likewise. scan_position is the run's own row order (a
--    streaming row_number, cheap): the join does not keep that order, measures.py restores it,
--    and a run stored ranking by ranking, best first (as BRIDGE writes them) then needs no sort
--    at all. doc_hash only screens for a document listed twice in a ranking (the ids confirm).
select r.scan_position, r.dataset, r.retriever, r.query_id, r.doc_id, hash(r.doc_id) as doc_hash,
       r.score, q.relevance, o.relevance as original_relevance
from (select row_number() over () - 1 as scan_position, * from metrics_run) r
left join metrics_qrels q
       on q.dataset = r.dataset and q.query_id = r.query_id and q.doc_id = r.doc_id
left join metrics_original_qrels o
       on o.dataset = r.dataset and o.query_id = r.query_id and o.doc_id = r.doc_id
;
-- 2. Per query, from the qrels alone. A query is known to the qrels with any judgment, even
--    only non-relevant or -1 ("in the pool, unjudged"). R = num_rel, N = num_nonrel; the ideal
--    ranking's gains: every judged document with a positive gain, highest first.
select dataset, query_id,
       count(*) filter (where relevance >= $relevance_level) as num_rel,
       count(*) filter (where relevance >= 0 and relevance < $relevance_level) as num_nonrel,
       coalesce(list_sort(list(relevance) filter (where relevance > 0), 'DESC'), []) as ideal_gains
from metrics_qrels
group by dataset, query_id
