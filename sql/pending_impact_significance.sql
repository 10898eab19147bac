-- pending_impact, the significance side: for each pending pair of one dataset, the significance
-- calls on the headline measure that its label may flip. Parameters: $dataset; $measure (the
-- retrieval_metrics name, e.g. 'ndcg_cut_10'); $k (its cutoff).
--
-- A significance call (a system pair and a test of the significance table: paired_t or
-- randomization) is in doubt when its conclusion differs between the two bounds: refined (every
-- pending pair irrelevant) and refined_upper (every one relevant): significant at one bound and
-- not at the other, or significant in opposite directions (the conclusion 'a', 'b' or 'none' of
-- sql/significance_concordance.sql, on the Holm-corrected p-value at the significance asset's
-- alpha). A pending pair may flip a call in doubt when its chunk stands in the top k of either
-- system's ranking (as for rank changes in sql/pending_impact.sql): its label then moves that
-- system's value on its query, so the paired test's differences.
--
-- Inputs: significance, retrieval_metrics (the queries each system is evaluated on) and
-- retrieval_run through the top_k_rankings macro (sql/top_k_rankings.sql), bridge_qrels. One
-- row per pending pair, in no particular order: its calls
-- (significance_pairs, one per system pair and test), the system pairs among them (flips), and
-- the system pairs with a call in doubt on the dataset (significance_in_doubt).
with
calls as (
    select system_a, system_b, test,
           max(p_holm) filter (where qrels_version = 'refined') as p_low,
           max(p_holm) filter (where qrels_version = 'refined_upper') as p_high,
           max(conclusion) filter (where qrels_version = 'refined') as conclusion_low,
           max(conclusion) filter (where qrels_version = 'refined_upper') as conclusion_high
    from significance
    where dataset = $dataset and measure = $measure and qrels_version in ('refined', 'refined_upper')
    group by system_a, system_b, test
),
doubtful as (
    select * from calls
    where conclusion_low is not null and conclusion_high is not null and conclusion_low <> conclusion_high
),
pending as (
    select query_id, doc_id from bridge_qrels where dataset = $dataset and relevance is null
),
ranked as (
    select * from top_k_rankings($dataset, $measure, $k)
),
flips as (
    select p.query_id, p.doc_id, s.system_a, s.system_b, s.test,
           a.rank::integer as rank_a, b.rank::integer as rank_b,
           s.p_low, s.p_high, s.conclusion_low, s.conclusion_high
    from pending p
    cross join doubtful s
    left join ranked a on a.retriever = s.system_a and a.query_id = p.query_id and a.doc_id = p.doc_id
    left join ranked b on b.retriever = s.system_b and b.query_id = p.query_id and b.doc_id = p.doc_id
    where a.rank is not null or b.rank is not null
),
flipped as (
    select query_id, doc_id,
           list({'system_a': system_a, 'system_b': system_b, 'test': test, 'rank_a': rank_a,
                 'rank_b': rank_b, 'p_low': p_low, 'p_high': p_high,
                 'conclusion_low': conclusion_low, 'conclusion_high': conclusion_high}
                order by system_a, system_b, test) as significance_pairs,
           count(distinct (system_a, system_b))::integer as flips
    from flips
    group by query_id, doc_id
)
select p.query_id, p.doc_id,
       coalesce(f.significance_pairs, []) as significance_pairs,
       coalesce(f.flips, 0) as flips,
       (select count(distinct (system_a, system_b)) from doubtful)::integer as significance_in_doubt
from pending p
left join flipped f on f.query_id = p.query_id and f.doc_id = p.doc_id
