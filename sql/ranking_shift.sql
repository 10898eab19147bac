-- ranking_shift: each system's score and place under the original and the refined qrels,
-- per measure, from the averages of retrieval_metrics (query_id 'all').
-- Parameters: $dataset; $measures VARCHAR[] (those to rank by).
-- Places are competition ranks (equal scores share the best place); rank_change > 0 means
-- the system moved up with the refined qrels. The refined qrels come as two bounds over the
-- pending pairs (bridge_assets.analysis.views): `refined` counts every pending pair
-- irrelevant, `refined_upper` relevant. A change is robust when it goes the same way at both
-- ends; robust_rank_change is then the smaller of the two moves, else 0.
-- Means are compared at 12 decimals: sums taken in another order differ in their last bits,
-- and two systems with the same run must share their place (and tie in Kendall's tau).
with means as (
    select retriever, measure,
           round(max(value) filter (where qrels_version = 'original'), 12) as value_original,
           round(max(value) filter (where qrels_version = 'refined'), 12) as value_refined,
           round(max(value) filter (where qrels_version = 'refined_upper'), 12) as value_refined_upper
    from retrieval_metrics
    where dataset = $dataset and query_id = 'all' and list_contains($measures, measure)
    group by retriever, measure
),
ranked as (
    select measure, retriever, value_original, value_refined,
           coalesce(value_refined_upper, value_refined) as value_refined_upper,
           value_refined - value_original as value_change,
           rank() over (partition by measure order by value_original desc)::integer as rank_original,
           rank() over (partition by measure order by value_refined desc)::integer as rank_refined,
           rank() over (partition by measure
                        order by coalesce(value_refined_upper, value_refined) desc)::integer
               as rank_refined_upper
    from means
    where value_original is not null and value_refined is not null
),
changes as (
    select *, rank_original - rank_refined as rank_change,
           rank_original - rank_refined_upper as rank_change_upper
    from ranked
)
select $dataset as dataset, measure, retriever, value_original, value_refined,
       value_refined_upper, value_change, rank_original, rank_refined, rank_refined_upper,
       rank_change, rank_change_upper,
       case when sign(rank_change) = sign(rank_change_upper) and rank_change <> 0
            then sign(rank_change) * least(abs(rank_change), abs(rank_change_upper))
            else 0 end::integer as robust_rank_change
from changes
order by measure, rank_refined, retriever
