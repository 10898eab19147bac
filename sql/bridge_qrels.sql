-- bridge_qrels: the refined qrels of one dataset ($dataset). Every pair the pipeline knows a
-- status of appears once, with its relevance, the source of that judgment and the keys that
-- trace it back (the debate's pair_key and config_hash, the LLM call keys, the human vote ids).
--
-- When several sources hold one pair, the first of this order wins:
--   1 original     the benchmark's own judgment: refinement adds judgments, it never
--                  overrides the gold.
--   2 human        the majority of the accepted human votes on an escalated pair
--                  (human_labels): people settle what the agents could not.
--   3 debate       DREAM consensus that passed the debate's checks (debate_labels.outcome =
--                  'consensus').
--   4 pending      an escalated or failed debate pair nobody has voted on yet. Pending is not a
--                  label: relevance is NULL. What a model guessed for it is kept apart as
--                  unverified_label, with unverified_source 'adjudicator' (the opt-in LLM
--                  adjudicator) or 'vote' (the agents' pooled vote beyond the human budget).
--                  Metrics bound pending pairs (every one irrelevant / every one relevant).
--   5 filter       every filter model said the chunk supports no answer, so the pair never
--                  reached the debate: judged irrelevant (relevance 0).
-- (A pair holds several sources only when the tables come from different configurations,
-- e.g. a debate re-run after people voted on the earlier escalation.)
--
-- Inputs: original_qrels, human_labels, human_votes, debate_labels, debate_turns,
-- filtered_pool, filter_votes (the caller stands in empty ones for tables not made yet).
with
original as (
    select query_id, doc_id, relevance::integer as relevance, 'original' as source,
           1 as precedence, null::integer as unverified_label, null::varchar as unverified_source,
           null::varchar as pair_key, null::varchar as config_hash, []::varchar[] as call_keys,
           []::bigint[] as vote_ids
    from original_qrels
    where dataset = $dataset
),
debated as (
    select d.query_id, d.doc_id, any_value(d.pair_key) as pair_key,
           any_value(d.config_hash) as config_hash, any_value(d.outcome) as outcome,
           any_value(d.label) as label, any_value(d.adjudicator_label) as adjudicator_label,
           any_value(d.adjudicator_call_key) as adjudicator_call_key,
           list(t.call_key order by t.round, t.agent) filter (where t.call_key is not null)
               as turn_call_keys
    from debate_labels d
    left join debate_turns t
           on t.dataset = d.dataset and t.query_id = d.query_id and t.doc_id = d.doc_id
    where d.dataset = $dataset
    group by d.query_id, d.doc_id
),
counted_votes as (
    select query_id, doc_id, list(vote_id order by vote_id) as vote_ids
    from human_votes
    where dataset = $dataset and status = 'accepted' and not is_attention_check
    group by query_id, doc_id
),
human as (
    select h.query_id, h.doc_id, h.label::integer as relevance, 'human' as source,
           2 as precedence, null::integer as unverified_label, null::varchar as unverified_source,
           d.pair_key, d.config_hash, []::varchar[] as call_keys,
           coalesce(v.vote_ids, []::bigint[]) as vote_ids
    from human_labels h
    left join debated d using (query_id, doc_id)
    left join counted_votes v using (query_id, doc_id)
    where h.dataset = $dataset and h.label is not null
),
debate as (
    select query_id, doc_id, label::integer as relevance, 'debate' as source, 3 as precedence,
           null::integer as unverified_label, null::varchar as unverified_source,
           pair_key, config_hash, coalesce(turn_call_keys, []::varchar[]) as call_keys,
           []::bigint[] as vote_ids
    from debated
    where outcome = 'consensus' and label is not null
),
pending as (
    select query_id, doc_id, null::integer as relevance, 'pending' as source, 4 as precedence,
           coalesce(adjudicator_label, case when outcome = 'vote' then label end)::integer
               as unverified_label,
           case when adjudicator_label is not null then 'adjudicator'
                when outcome = 'vote' and label is not null then 'vote' end as unverified_source,
           pair_key, config_hash,
           coalesce(turn_call_keys, []::varchar[])
               || case when adjudicator_call_key is not null then [adjudicator_call_key]
                       else []::varchar[] end as call_keys,
           []::bigint[] as vote_ids
    from debated
    where outcome in ('escalated', 'failed', 'vote')
),
filtered_out as (
    select p.query_id, p.doc_id, 0 as relevance, 'filter' as source, 5 as precedence,
           null::integer as unverified_label, null::varchar as unverified_source,
           any_value(v.pair_key) as pair_key, null::varchar as config_hash,
           coalesce(list(v.call_key order by v.model) filter (where v.call_key is not null),
                    []::varchar[]) as call_keys,
           []::bigint[] as vote_ids
    from filtered_pool p
    left join filter_votes v
           on v.dataset = p.dataset and v.query_id = p.query_id and v.doc_id = p.doc_id
    where p.dataset = $dataset and not p.kept
    group by p.query_id, p.doc_id
),
judgments as (
    select * from original
    union all by name select * from human
    union all by name select * from debate
    union all by name select * from pending
    union all by name select * from filtered_out
)
select $dataset as dataset, query_id, doc_id, relevance, source, unverified_label,
       unverified_source, pair_key, config_hash, call_keys, vote_ids
from judgments
qualify row_number() over (partition by query_id, doc_id order by precedence) = 1
order by query_id, doc_id
