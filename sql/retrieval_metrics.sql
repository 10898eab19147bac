-- retrieval_metrics: what trec_eval's measures are computed from, in three statements (split on
-- the line holding only ';'). The measures themselves are vectorised numpy over these rows in
-- bridge_assets/metrics/measures.py (one pass over every ranking at once); conventions in
-- docs/metrics.md.
--
-- Inputs, temp views made by bridge_assets.metrics.measures:
--   metrics_run(dataset, retriever, query_id, doc_id, score)       score: a C float, as trec_eval
--                                                                  keeps it (a rank-only run: -rank)
--   metrics_qrels(dataset, query_id, doc_id, relevance)            the qrels evaluated against
--   metrics_original_qrels(dataset, query_id, doc_id, relevance)   for hole_k (measures.py drops
--                                              the last join of 1. and 2. when it is not asked for)
--
-- 1. The run as stored, with what tells whether it is already in trec_eval's order: ranking
--    by ranking, each by score descending, ties by doc id descending. A streaming window (in the
--    run's own row order, no sort) marks new_ranking where (dataset, retriever, query_id)
--    changes; the keys travel only on a ranking's first row. Whether the scores fall and tied
--    doc ids descend within each ranking is checked in numpy (measures.py, _as_stored) from the
--    scores and doc ids handed over: every other comparison in this window (lag and lead of
--    score and doc id) ran on its single thread. The join with the qrels does not keep the row
--    order, scan_position restores it; the window's result is materialized so that the join
--    (hashing the string keys) runs on all threads. When the run is in order, but maybe for its
--    ties, nothing else is read; otherwise (a score rising, a ranking's rows apart, a doc id
--    hash repeated) measures.py reads statement 2.
with r as materialized (
    select row_number() over () - 1 as scan_position, dataset, retriever, query_id, doc_id, score,
           dataset is distinct from lag(dataset) over ()
               or retriever is distinct from lag(retriever) over ()
               or query_id is distinct from lag(query_id) over () as new_ranking
    from metrics_run
)
select r.scan_position, r.score, r.new_ranking, r.doc_id,
       case when r.new_ranking then r.dataset end as dataset,
       case when r.new_ranking then r.retriever end as retriever,
       case when r.new_ranking then r.query_id end as query_id,
       hash(r.doc_id) as doc_hash, q.relevance, o.relevance as original_relevance
from r
left join metrics_qrels q
       on q.dataset = r.dataset and q.query_id = r.query_id and q.doc_id = r.doc_id
left join metrics_original_qrels o
       on o.dataset = r.dataset and o.query_id = r.query_id and o.doc_id = r.doc_id
;
-- 2. Read only when the run is not in that order (or a doc id may repeat): every retrieved
--    document with its ids and judgment, relevance NULL for a document the qrels do not list,
--    original_relevance likewise; ranking_hash tells the rankings apart in one pass, doc_hash
--    screens for a document listed twice in a ranking (the ids confirm both).
with r as materialized (select row_number() over () - 1 as scan_position, * from metrics_run)
select r.scan_position, r.dataset, r.retriever, r.query_id, r.doc_id, r.score,
       hash(r.dataset, r.retriever, r.query_id) as ranking_hash, hash(r.doc_id) as doc_hash,
       q.relevance, o.relevance as original_relevance
from r
left join metrics_qrels q
       on q.dataset = r.dataset and q.query_id = r.query_id and q.doc_id = r.doc_id
left join metrics_original_qrels o
       on o.dataset = r.dataset and o.query_id = r.query_id and o.doc_id = r.doc_id
;
-- 3. Per query, from the qrels alone. A query is known to the qrels with any judgment, even
--    only non-relevant or -1 ("in the pool, unjudged"). R = num_rel, N = num_nonrel; the ideal
--    ranking's gains: every judged document with a positive gain, highest first.
select dataset, query_id,
       count(*) filter (where relevance >= $relevance_level) as num_rel,
       count(*) filter (where relevance >= 0 and relevance < $relevance_level) as num_nonrel,
       coalesce(list_sort(list(relevance) filter (where relevance > 0), 'DESC'), []) as ideal_gains
from metrics_qrels
group by dataset, query_id
