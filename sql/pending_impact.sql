-- pending_impact: for each pending pair of one dataset, the system pairs whose order it can
-- decide on the headline measure (nDCG@k), and how much of each one's doubt it carries.
-- Parameters: $dataset; $measure (the retrieval_metrics name, e.g. 'ndcg_cut_10'); $k (its
-- cutoff); $gain (the relevance a pending pair has at the upper bound: the scale's top grade).
--
-- A system pair is in doubt when its order differs between the two bounds (refined: every
-- pending pair irrelevant; refined_upper: every one relevant), means compared at 12 decimals
-- as in ranking_shift.sql, and one of the two systems has a rank change that is not robust as
-- ranking_shift.sql judges it (its place, a competition rank, moves from the original one in
-- different ways at the two bounds): an order that differs between the bounds without changing
-- whether any rank change holds is no doubt about a conclusion. So no system pair is in doubt
-- exactly when every rank change is robust. Its swing is how much the gap between the two moves from one bound
-- to the other. A pending pair decides a system pair in doubt when its chunk stands in the
-- top k of either system and its label moves the gap: the move is the difference of the two
-- systems' mean nDCG@k with the pair relevant rather than not, the other pending pairs held
-- at the lower bound, or at the upper one (the larger), over the swing (at most 1). Its share
-- of the pair's doubt is the larger of that move and its query's share: the part of the swing
-- the query's pending pairs carry together (the doubt a query leaves is settled only once all
-- of them are labelled, so the pairs of the query carrying most doubt come first, and a
-- query's pairs come together). A pair's impact is the sum of its shares; ties go to the
-- larger moves.
--
-- nDCG@k is trec_eval's (sql/retrieval_metrics.sql): rankings by score, ties by doc id
-- descending; the gain is the relevance grade; the ideal DCG is over the query's qrels. A
-- pending pair changes both: its own gain where it is ranked, and the ideal DCG of its query
-- (so a chunk at the same rank in two rankings can still move their gap). Every pending pair
-- of a query flips the same gain, so each query needs its ideal DCG at four states only.
--
-- Inputs: retrieval_metrics (the means at both bounds and the queries each system is averaged
-- over), retrieval_run (through the top_k_rankings macro, sql/top_k_rankings.sql), bridge_qrels.
with
evaluated as (
    select retriever, query_id
    from retrieval_metrics
    where dataset = $dataset and measure = $measure and qrels_version = 'refined'
      and query_id <> 'all'
),
counts as (
    select retriever, count(*) as n_queries from evaluated group by retriever
),
means as (
    select retriever,
           round(max(value) filter (where qrels_version = 'refined'), 12) as low,
           round(coalesce(max(value) filter (where qrels_version = 'refined_upper'),
                          max(value) filter (where qrels_version = 'refined')), 12) as high
    from retrieval_metrics
    where dataset = $dataset and measure = $measure and query_id = 'all'
    group by retriever
),
-- each system's place, a competition rank as in ranking_shift.sql, under the original qrels
-- and at both bounds; unsettled: the systems whose rank change is not robust
places as (
    select m.retriever,
           rank() over (order by o.value desc) as original,
           rank() over (order by m.low desc) as low,
           rank() over (order by m.high desc) as high
    from means m
    join (select retriever, round(value, 12) as value from retrieval_metrics
          where dataset = $dataset and measure = $measure and query_id = 'all'
            and qrels_version = 'original') o using (retriever)
    where m.low is not null
),
unsettled as (
    select retriever from places where sign(original - low) <> sign(original - high)
),
doubtful as (
    select a.retriever as system_a, b.retriever as system_b,
           abs((a.high - b.high) - (a.low - b.low)) as swing
    from means a
    join means b on a.retriever < b.retriever
    where sign(a.low - b.low) <> sign(a.high - b.high)
      and (a.retriever in (select retriever from unsettled) or b.retriever in (select retriever from unsettled))
),
qrels as (
    select query_id, doc_id, relevance
    from bridge_qrels
    where dataset = $dataset
),
pending as (
    select query_id, doc_id from qrels where relevance is null
),
-- per query: the known gains, and how many pending pairs it has
gains as (
    select query_id,
           coalesce(list(relevance) filter (where relevance > 0), []) as known,
           count(*) filter (where relevance is null) as n_pending
    from qrels
    group by query_id
),
states as (
    select query_id,
           list_sort(known, 'DESC') as low,
           list_sort(list_concat(known, [$gain]), 'DESC') as low_plus,
           list_sort(list_concat(known, list_resize([]::integer[], n_pending, $gain)), 'DESC') as high,
           list_sort(list_concat(known, list_resize([]::integer[], greatest(n_pending - 1, 0), $gain)),
                     'DESC') as high_minus
    from gains
),
ideal as (
    select query_id,
           coalesce(list_sum(list_transform(list_slice(low, 1, $k), lambda g, i: g / log2(i + 1))), 0) as low,
           coalesce(list_sum(list_transform(list_slice(low_plus, 1, $k), lambda g, i: g / log2(i + 1))), 0)
               as low_plus,
           coalesce(list_sum(list_transform(list_slice(high, 1, $k), lambda g, i: g / log2(i + 1))), 0) as high,
           coalesce(list_sum(list_transform(list_slice(high_minus, 1, $k), lambda g, i: g / log2(i + 1))), 0)
               as high_minus
    from states
),
ranked as (
    select * from top_k_rankings($dataset, $measure, $k)
),
-- each evaluated ranking's DCG@k at both bounds
dcg as (
    select e.retriever, e.query_id,
           coalesce(sum(if(q.doc_id is null, 0, greatest(coalesce(q.relevance, 0), 0)) / log2(r.rank + 1)), 0)
               as low,
           coalesce(sum(if(q.doc_id is null, 0, greatest(coalesce(q.relevance, $gain), 0)) / log2(r.rank + 1)), 0)
               as high
    from evaluated e
    left join ranked r on r.retriever = e.retriever and r.query_id = e.query_id
    left join qrels q on q.query_id = r.query_id and q.doc_id = r.doc_id
    group by e.retriever, e.query_id
),
-- per pending pair and system that evaluates its query: how much the system's mean moves when
-- the pair is relevant rather than not, at each bound
effects as (
    select p.query_id, p.doc_id, e.retriever, r.rank,
           ((d.low + coalesce($gain / log2(r.rank + 1), 0)) / i.low_plus
            - if(i.low > 0, d.low / i.low, 0)) / c.n_queries as effect_low,
           (if(i.high > 0, d.high / i.high, 0)
            - if(i.high_minus > 0, (d.high - coalesce($gain / log2(r.rank + 1), 0)) / i.high_minus, 0))
               / c.n_queries as effect_high
    from pending p
    join evaluated e on e.query_id = p.query_id
    join counts c on c.retriever = e.retriever
    join dcg d on d.retriever = e.retriever and d.query_id = p.query_id
    join ideal i on i.query_id = p.query_id
    left join ranked r on r.retriever = e.retriever and r.query_id = p.query_id and r.doc_id = p.doc_id
),
-- each system's spread on each query: how far its mean moves from one bound to the other
-- through that query's pending pairs
spreads as (
    select d.retriever, d.query_id,
           (if(i.high > 0, d.high / i.high, 0) - if(i.low > 0, d.low / i.low, 0)) / c.n_queries as spread
    from dcg d
    join ideal i on i.query_id = d.query_id
    join counts c on c.retriever = d.retriever
),
-- the part of each system pair's swing a query's pending pairs carry together (settled only
-- once they are all labelled)
query_shares as (
    select q.query_id, s.system_a, s.system_b,
           least(abs(coalesce(a.spread, 0) - coalesce(b.spread, 0)) / s.swing, 1.0) as query_share
    from (select distinct query_id from pending) q
    cross join doubtful s
    left join spreads a on a.retriever = s.system_a and a.query_id = q.query_id
    left join spreads b on b.retriever = s.system_b and b.query_id = q.query_id
),
-- the system pairs in doubt whose rankings hold the chunk, the share of their doubt its label
-- moves alone, and the share its query carries (the larger is the pair's share)
decisions as (
    select p.query_id, p.doc_id, s.system_a, s.system_b, a.rank as rank_a, b.rank as rank_b,
           least(greatest(abs(coalesce(a.effect_low, 0) - coalesce(b.effect_low, 0)),
                          abs(coalesce(a.effect_high, 0) - coalesce(b.effect_high, 0))) / s.swing, 1.0)
               as move,
           coalesce(qs.query_share, 0) as query_share
    from pending p
    cross join doubtful s
    left join effects a on a.query_id = p.query_id and a.doc_id = p.doc_id and a.retriever = s.system_a
    left join effects b on b.query_id = p.query_id and b.doc_id = p.doc_id and b.retriever = s.system_b
    left join query_shares qs on qs.query_id = p.query_id and qs.system_a = s.system_a
                             and qs.system_b = s.system_b
    where (a.rank is not null or b.rank is not null)
),
decided as (
    select query_id, doc_id, sum(greatest(move, query_share)) as impact, sum(move) as moves,
           count(*)::integer as decides,
           list({'system_a': system_a, 'system_b': system_b, 'rank_a': rank_a::integer,
                 'rank_b': rank_b::integer, 'share': greatest(move, query_share)}
                order by greatest(move, query_share) desc, system_a, system_b) as system_pairs
    from decisions
    where round(move, 12) > 0
    group by query_id, doc_id
)
select $dataset as dataset, p.query_id, p.doc_id, $measure as measure,
       coalesce(d.impact, 0.0) as impact,
       coalesce(d.decides, 0) as decides,
       coalesce(d.system_pairs, []) as system_pairs,
       (select count(*) from doubtful)::integer as pairs_in_doubt,
       row_number() over (order by coalesce(d.impact, 0.0) desc, coalesce(d.moves, 0.0) desc,
                               p.query_id, p.doc_id)::integer as impact_rank
from pending p
left join decided d on d.query_id = p.query_id and d.doc_id = p.doc_id
order by impact_rank
