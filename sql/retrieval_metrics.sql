-- retrieval_metrics: trec_eval's measures for every (dataset, retriever, query) at once, plus
-- their average over the evaluated queries (query_id 'all'). Conventions: docs/metrics.md.
--
-- Inputs, temp views made by bridge_assets.metrics.measures:
--   metrics_run(dataset, retriever, query_id, doc_id, score)
--   metrics_qrels(dataset, query_id, doc_id, relevance)            the qrels evaluated against
--   metrics_original_qrels(dataset, query_id, doc_id, relevance)   for hole_k (may be empty)
-- Parameters: $relevance_level (trec_eval -l), $max_docs (-M), $complete (-c),
--   $cutoffs INTEGER[] (P, recall, ndcg_cut, ...), $recall_levels DOUBLE[] (iprec_at_recall),
--   $families VARCHAR[] (the measure families asked for), $per_query (false: only 'all').
--
-- Output, one column per measure family (wide: far fewer rows to hand over than one row per
-- value; measures.py names the values trec_eval's way, e.g. P at depth 10 -> P_10, and keeps
-- the ones asked for; a family not asked for may be left NULL).
-- Keys: dataset, retriever, query_id ('all' for the summary), and
--   depth NULL, level NULL   the whole-ranking measures (map, Rprec, ndcg, num_*, ...)
--   depth k                  the measures at cutoff k (P, recall, ndcg_cut, ...)
--   level x                  iprec_at_recall at recall level x
--
-- Cost: each ranking is sorted once, as a list (one group-by, no window function), and every
-- measure is a list expression over that sorted list; what depends on the qrels alone (R, N,
-- the ideal DCG at each cutoff) is computed once per query, not once per ranking. Lists that
-- only some families need are built only when one of them is asked for (the condition
-- list_contains($families, ...) is the same for every row, so the other branch never runs).
with
-- Per query, from the qrels alone. A query is known to the qrels with any judgment, even only
-- non-relevant or -1 ("in the pool, unjudged"). The ideal ranking: every judged document with
-- a positive gain, highest first; its DCG in full and cut at each of $cutoffs (same order).
judged_queries as (
    select dataset, query_id, num_rel, num_nonrel,
           coalesce(list_sum(ideal_gains), 0) as ideal_dcg,
           list_transform($cutoffs::integer[], lambda depth:
               coalesce(list_sum(list_slice(ideal_gains, 1, depth)), 0)) as ideal_dcg_at
    from (
        select dataset, query_id,
               count(*) filter (where relevance >= $relevance_level) as num_rel,
               count(*) filter (where relevance >= 0 and relevance < $relevance_level) as num_nonrel,
               list_transform(list_sort(list(relevance) filter (where relevance > 0), 'DESC'),
                              lambda g, i: g / log2(i + 1)) as ideal_gains
        from metrics_qrels
        group by dataset, query_id
    )
),
-- Each ranking as trec_eval forms it: the rank column is ignored, documents go by score
-- descending, ties by doc id descending (strcmp order = DuckDB's binary collation; sorting
-- the (score, doc_id) structs descending does both), and only the top $max_docs count.
-- relevance is NULL for a document the qrels do not know, original_relevance likewise.
-- Every ranking must have finite scores and no document twice (trec_eval stops on that too;
-- distinct hashes are counted first, the ids themselves only to confirm a repeat).
ranked as (
    select dataset, retriever, query_id,
           list_transform(documents, lambda d: d.relevance) as relevances,
           if(list_contains($families, 'hole'),
              list_transform(documents, lambda d: d.original_relevance), null) as original_relevances
    from (
        select run.dataset, run.retriever, run.query_id,
               list_slice(list_sort(list({'score': run.score, 'doc_id': run.doc_id,
                                          'relevance': q.relevance,
                                          'original_relevance': o.relevance}), 'DESC'),
                          1, $max_docs) as documents,
               count(*) = count(run.score) and bool_and(isfinite(run.score)) as scores_are_finite
        from metrics_run run
        left join metrics_qrels q
               on q.dataset = run.dataset and q.query_id = run.query_id and q.doc_id = run.doc_id
        left join metrics_original_qrels o
               on o.dataset = run.dataset and o.query_id = run.query_id and o.doc_id = run.doc_id
        group by run.dataset, run.retriever, run.query_id
    )
    where case
        when not scores_are_finite then error(printf(
            'no finite score for some document of query ''%s'' (dataset ''%s'', retriever ''%s'')',
            query_id, dataset, retriever))
        when list_unique(list_transform(documents, lambda d: hash(d.doc_id))) < len(documents)
             and list_unique(list_transform(documents, lambda d: d.doc_id)) < len(documents)
        then error(printf(
            'a document appears twice in the ranking of query ''%s'' (dataset ''%s'', retriever ''%s'')',
            query_id, dataset, retriever))
        else true end
),
-- Queries without judgments are skipped; with $complete, a judged query a retriever did not
-- answer counts as an empty ranking.
rankings_to_evaluate as (
    select r.dataset, r.retriever, r.query_id, j.num_rel, j.num_nonrel, j.ideal_dcg, j.ideal_dcg_at,
           r.relevances, r.original_relevances
    from ranked r
    join judged_queries j on j.dataset = r.dataset and j.query_id = r.query_id
    union all
    select r.dataset, r.retriever, j.query_id, j.num_rel, j.num_nonrel, j.ideal_dcg, j.ideal_dcg_at,
           [], []
    from (select distinct dataset, retriever from metrics_run where $complete) r
    join judged_queries j on j.dataset = r.dataset
    anti join ranked a on a.dataset = r.dataset and a.retriever = r.retriever and a.query_id = j.query_id
),
-- Where the relevant and the judged non-relevant documents sit in each ranking (1-based
-- ranks), the precision at each relevant document (the terms of average precision), and each
-- rank's discounted gain.
rankings as (
    select *,
           list_transform(rel_ranks, lambda rank, nth: nth / rank) as rel_precisions
    from (
        select *,
               len(relevances) as num_ret,
               list_filter(list_transform(relevances, lambda rel, i: if(rel >= $relevance_level, i, null)),
                           lambda i: i is not null) as rel_ranks,
               len(list_filter(relevances, lambda rel: rel >= 0 and rel < $relevance_level))
                   as num_nonrel_judged_ret,
               if(list_contains($families, 'bpref'),
                  list_filter(list_transform(relevances, lambda rel, i:
                                  if(rel >= 0 and rel < $relevance_level, i, null)),
                              lambda i: i is not null), null) as nonrel_ranks,
               -- nDCG's gain is the relevance value itself (not binarised by $relevance_level)
               if(list_contains($families, 'ndcg') or list_contains($families, 'ndcg_cut'),
                  list_transform(relevances, lambda rel, i: greatest(coalesce(rel, 0), 0) / log2(i + 1)),
                  null) as discounted_gains
        from rankings_to_evaluate
    )
),
whole_ranking as (
    select dataset, retriever, query_id,
           num_ret::double as num_ret,
           num_rel::double as num_rel,
           len(rel_ranks)::double as num_rel_ret,
           num_nonrel_judged_ret::double as num_nonrel_judged_ret,
           if(num_rel > 0, coalesce(list_sum(rel_precisions), 0) / num_rel, 0) as map,
           -- relevant among the top R = num_rel
           if(num_rel > 0, len(list_filter(rel_ranks, lambda rank: rank <= num_rel)) / num_rel, 0)
               as "Rprec",
           -- each relevant document scores 1 - (judged non-relevant above it, at most R) / min(R, N)
           case when not list_contains($families, 'bpref') then null
                when num_rel > 0 then coalesce(list_sum(list_transform(rel_ranks, lambda rank:
                    1.0 - least(len(list_filter(nonrel_ranks, lambda above: above < rank)), num_rel)
                          / greatest(least(num_nonrel, num_rel), 1))), 0) / num_rel
                else 0 end as bpref,
           coalesce(1 / rel_ranks[1], 0) as recip_rank,
           case when discounted_gains is null then null
                when ideal_dcg > 0 then coalesce(list_sum(discounted_gains), 0) / ideal_dcg
                else 0 end as ndcg
    from rankings
),
-- nth: the cutoff's place in $cutoffs, to pick the query's ideal DCG at that depth
cutoff_values as (
    select dataset, retriever, query_id, depth,
           rel_ret / depth as "P",
           if(num_rel > 0, rel_ret / num_rel, 0) as recall,
           case when discounted_gains is null then null
                when ideal_dcg_at[nth] > 0
                then coalesce(list_sum(list_slice(discounted_gains, 1, depth)), 0) / ideal_dcg_at[nth]
                else 0 end as ndcg_cut,
           if(num_rel > 0, coalesce(list_sum(list_slice(rel_precisions, 1, rel_ret)), 0) / num_rel, 0)
               as map_cut,
           if(rel_ret > 0, 1.0, 0.0) as success,
           -- empty slots past the end of a short ranking count as judged (trec_eval's unj)
           (least(num_ret, depth) - judged_ret) / depth as unj,
           if(rel_ret > 0, 1 / rel_ranks[1], 0) as recip_rank_cut,
           judged_ret / depth as judged,
           holes_ret / depth as hole
    from (
        select r.*, c.depth, c.nth,
               len(list_filter(r.rel_ranks, lambda rank: rank <= c.depth)) as rel_ret,
               len(list_filter(list_slice(r.relevances, 1, c.depth), lambda rel: rel >= 0)) as judged_ret,
               if(list_contains($families, 'hole'),
                  len(list_filter(list_slice(r.relevances, 1, c.depth), lambda rel, i:
                      rel >= $relevance_level and coalesce(r.original_relevances[i] < 0, true))), null)
                   as holes_ret
        from rankings r
        cross join (select unnest($cutoffs::integer[]) as depth,
                           generate_subscripts($cutoffs::integer[], 1) as nth) c
    )
),
-- iprec_at_recall: the best precision at or after the c-th relevant document retrieved,
-- c = round(level * num_rel) (half away from zero, as lround); 0 when c > num_rel_ret.
interpolated as (
    select dataset, retriever, query_id, level,
           coalesce(list_max(list_slice(rel_precisions,
                                        greatest(round(level * num_rel), 1)::bigint,
                                        len(rel_precisions))), 0) as iprec_at_recall
    from rankings
    cross join (select unnest($recall_levels::double[]) as level)
)
-- Every query's values (when $per_query), then the summary over the evaluated queries:
-- counts are summed, the rest averaged; gm_map is the geometric mean of average precision,
-- each floored at trec_eval's MIN_GEO_MEAN 0.00001.
select * from whole_ranking where $per_query
union all by name
select * from cutoff_values where $per_query
union all by name
select * from interpolated where $per_query
union all by name
select dataset, retriever, 'all' as query_id,
       count(*)::double as num_q,
       sum(columns('^num_(ret|rel|rel_ret|nonrel_judged_ret)$')),
       avg(columns(* exclude (dataset, retriever, query_id, num_ret, num_rel, num_rel_ret,
                              num_nonrel_judged_ret))),
       exp(avg(ln(greatest(map, 0.00001)))) as gm_map
from whole_ranking
group by dataset, retriever
union all by name
select dataset, retriever, 'all' as query_id, depth,
       avg(columns(* exclude (dataset, retriever, query_id, depth)))
from cutoff_values
group by dataset, retriever, depth
union all by name
select dataset, retriever, 'all' as query_id, level, avg(iprec_at_recall) as iprec_at_recall
from interpolated
group by dataset, retriever, level
