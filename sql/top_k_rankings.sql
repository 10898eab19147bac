-- top_k_rankings(ds, ms, k): the first k documents of every ranking of dataset `ds` that
-- retrieval_metrics evaluates on measure `ms` (refined qrels; a system's run on a query it is
-- not averaged over is left out), ranked as trec_eval ranks (sql/retrieval_metrics.sql): by
-- score, ties by doc id descending. Columns retriever, query_id, doc_id, rank (1 = first).
-- A macro, so pending_impact.sql and pending_impact_significance.sql read one definition.
-- benchmark_run: a temp view of every evaluated run (retrieval_run and the evaluation-only
-- systems' student_rerank_run; bridge_assets.analysis.views.benchmark_runs).
create or replace temp macro top_k_rankings(ds, ms, k) as table
select r.retriever, r.query_id, r.doc_id,
       row_number() over (partition by r.retriever, r.query_id
                          order by r.score desc, r.doc_id desc) as rank
from benchmark_run r
semi join (select retriever, query_id
           from retrieval_metrics
           where dataset = ds and measure = ms and qrels_version = 'refined' and query_id <> 'all') e
     on e.retriever = r.retriever and e.query_id = r.query_id
where r.dataset = ds
qualify rank <= k
