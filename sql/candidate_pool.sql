-- candidate_pool: for each query, the union of every retrieval system's top-$depth
-- (the paper pools the top-10 of 25 systems). One row per (query, document) with the
-- systems that surfaced it and their ranks (same order), the best rank, how many systems,
-- and whether the benchmark's original qrels already judge the pair.
-- Parameters: $dataset; $depth; $query_limit (> 0: a stable sample of that many queries,
-- chosen by md5 of the query id, so adding a retriever keeps the same sample).
with top_ranked as (
    select query_id, doc_id, retriever, rank
    from retrieval_run
    where dataset = $dataset and rank <= $depth
),
sampled_queries as (
    select query_id
    from (select distinct query_id from top_ranked)
    qualify $query_limit <= 0
         or row_number() over (order by md5(query_id), query_id) <= $query_limit
),
judged as (
    select distinct query_id, doc_id
    from original_qrels
    where dataset = $dataset
)
select
    $dataset as dataset,
    t.query_id,
    t.doc_id,
    list(t.retriever order by t.retriever) as systems,
    list(t.rank::integer order by t.retriever) as ranks,
    min(t.rank)::integer as best_rank,
    count(*)::integer as n_systems,
    bool_or(j.query_id is not null) as in_original_qrels
from top_ranked t
join sampled_queries using (query_id)
left join judged j on j.query_id = t.query_id and j.doc_id = t.doc_id
group by t.query_id, t.doc_id
order by t.query_id, best_rank, t.doc_id
