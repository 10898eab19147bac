-- significance inputs: per measure, qrels version and pair of systems (system_a < system_b in
-- byte order), the two systems' per-query values from retrieval_metrics, paired by query over
-- the queries where both have a value, in query order.
-- Parameters: $dataset; $measures VARCHAR[]; $versions VARCHAR[] (qrels versions).
with per_query as (
    select retriever, qrels_version, measure, query_id, value
    from retrieval_metrics
    where dataset = $dataset and query_id <> 'all' and value is not null
      and list_contains($measures, measure) and list_contains($versions, qrels_version)
)
select a.measure, a.qrels_version, a.retriever as system_a, b.retriever as system_b,
       list(a.value order by a.query_id) as values_a,
       list(b.value order by a.query_id) as values_b
from per_query a
join per_query b
  on b.measure = a.measure and b.qrels_version = a.qrels_version and b.query_id = a.query_id
 and a.retriever < b.retriever
group by a.measure, a.qrels_version, a.retriever, b.retriever
order by a.measure, a.qrels_version, system_a, system_b
