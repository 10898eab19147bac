-- ranking_shift: each system's score and place under the original and the refined qrels,
-- per measure, from the averages of retrieval_metrics (query_id 'all').
-- Parameters: $dataset; $measures VARCHAR[] (those to rank by).
-- Places are competition ranks (equal scores share the best place); rank_change > 0 means
-- the system moved up with the refined qrels.
with means as (
    select retriever, measure,
           max(value) filter (where qrels_version = 'original') as value_original,
           max(value) filter (where qrels_version = 'refined') as value_refined
    from retrieval_metrics
    where dataset = $dataset and query_id = 'all' and list_contains($measures, measure)
    group by retriever, measure
),
ranked as (
    select measure, retriever, value_original, value_refined,
           value_refined - value_original as value_change,
           rank() over (partition by measure order by value_original desc)::integer as rank_original,
           rank() over (partition by measure order by value_refined desc)::integer as rank_refined
    from means
    where value_original is not null and value_refined is not null
)
select $dataset as dataset, measure, retriever, value_original, value_refined, value_change,
       rank_original, rank_refined, rank_original - rank_refined as rank_change
from ranked
order by measure, rank_refined, retriever
