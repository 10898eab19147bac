-- bridge_qrels: the refined qrels of one dataset ($dataset). Every pair the pipeline knows a
-- status of appears once, with its relevance, the source of that judgment and the keys that
-- trace it back (the debate's pair_key and config_hash, the LLM call keys, the human vote ids,
-- an imported judgment's file and line), the pair's original relevance (NULL when the original
-- qrels do not judge it), whether the label is verified, and the precedence of its source.
--
-- When several sources hold one pair, the one of lowest precedence wins:
--  10 original     the benchmark's own judgment: refinement adds judgments, it never
--                  overrides the gold (only a correction source does, explicitly).
--  20 human        the majority of the accepted human votes on an escalated pair
--                  (human_labels): people settle what the agents could not.
--  30 debate       DREAM consensus that passed the debate's checks (debate_labels.outcome =
--                  'consensus'), of a class trusted on this dataset ($trust_yes, $trust_no:
--                  bridge_assets.qrels.trust); a consensus of an untrusted class is
--                  provisional: stored as pending, its label kept apart (unverified_source
--                  'provisional').
--  40 pending      an escalated or failed debate pair nobody has voted on yet. Pending is not a
--                  label: relevance is NULL. What a model guessed for it is kept apart as
--                  unverified_label, with unverified_source 'adjudicator' (the opt-in LLM
--                  adjudicator), 'vote' (the agents' pooled vote beyond the human budget) or
--                  'provisional' (a consensus not yet measured right on this dataset).
--                  Metrics bound pending pairs (every one irrelevant / every one relevant).
--  50 filter       every filter model said the chunk is not relevant, so the pair never
--                  reached the debate: relevance 0, but unverified. A model's "no" is a guess
--                  like its "yes": never a found non-hole, never a training label; a seeded
--                  sample of the drops goes to people (the audit), whose votes then win as
--                  'human', and the summary estimates how many holes the drops hide. Where
--                  the dataset asks for it (relevance.drops_in_bounds), the upper bound counts
--                  that many of the drops as relevant: estimated_hole marks the
--                  $drops_at_upper drops the filter found most likely relevant (its P(yes),
--                  highest first, then the pair key), $drops_at_upper being the high end of
--                  the estimate's 95% interval over the drops people have not labelled.
--  imported        `bridge qrels import` sources (imported_qrels), each at the precedence
--                  qrels_sources gives it: above 10 for an ordinary source (it never overrides
--                  the gold), below 10 for a correction source (corrects_original), which
--                  holds original pairs only and applies where it changes the grade; where it
--                  agrees with the original, 'original' stays the source.
-- verified: original, human and debate labels, and an imported source's if it was imported
-- as verified; only a verified relevant label outside the original qrels is a found hole. (The numbers are bridge_assets.qrels.sources.BUILTIN_PRECEDENCE.)
-- (A pair holds several built-in sources only when the tables come from different
-- configurations, e.g. a debate re-run after people voted on the earlier escalation.)
--
-- Inputs: original_qrels, human_labels (with the ids of the votes each label counted: the
-- votes store is not read here), debate_labels, debate_turns, filtered_pool, filter_votes,
-- imported_qrels, qrels_sources (the caller stands in empty ones for tables not made yet).
with
original as (
    select query_id, doc_id, relevance::integer as relevance, 'original' as source,
           10 as precedence, true as verified, null::integer as unverified_label,
           null::varchar as unverified_source, null::varchar as pair_key,
           null::varchar as config_hash, []::varchar[] as call_keys, []::bigint[] as vote_ids
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
human as (
    select h.query_id, h.doc_id, h.label::integer as relevance, 'human' as source,
           20 as precedence, true as verified, null::integer as unverified_label,
           null::varchar as unverified_source,
           d.pair_key, d.config_hash, []::varchar[] as call_keys,
           coalesce(h.vote_ids, []::bigint[]) as vote_ids
    from human_labels h
    left join debated d using (query_id, doc_id)
    where h.dataset = $dataset and h.label is not null
),
debate as (
    select query_id, doc_id, label::integer as relevance, 'debate' as source, 30 as precedence,
           true as verified, null::integer as unverified_label, null::varchar as unverified_source,
           pair_key, config_hash, coalesce(turn_call_keys, []::varchar[]) as call_keys,
           []::bigint[] as vote_ids
    from debated
    where outcome = 'consensus' and label is not null
      and case when label > 0 then $trust_yes else $trust_no end
),
pending as (
    select query_id, doc_id, null::integer as relevance, 'pending' as source, 40 as precedence,
           false as verified,
           coalesce(adjudicator_label, case when outcome in ('vote', 'consensus') then label end)::integer
               as unverified_label,
           case when adjudicator_label is not null then 'adjudicator'
                when outcome = 'vote' and label is not null then 'vote'
                when outcome = 'consensus' then 'provisional' end as unverified_source,
           pair_key, config_hash,
           coalesce(turn_call_keys, []::varchar[])
               || case when adjudicator_call_key is not null then [adjudicator_call_key]
                       else []::varchar[] end as call_keys,
           []::bigint[] as vote_ids
    from debated
    where outcome in ('escalated', 'failed', 'vote')
       or (outcome = 'consensus' and label is not null
           and not case when label > 0 then $trust_yes else $trust_no end)
),
filtered_out as (
    select p.query_id, p.doc_id, 0 as relevance, 'filter' as source, 50 as precedence,
           false as verified, null::integer as unverified_label, null::varchar as unverified_source,
           any_value(v.pair_key) as pair_key, null::varchar as config_hash,
           coalesce(list(v.call_key order by v.model) filter (where v.call_key is not null),
                    []::varchar[]) as call_keys,
           []::bigint[] as vote_ids, max(v.p_yes) as p_yes
    from filtered_pool p
    left join filter_votes v
           on v.dataset = p.dataset and v.query_id = p.query_id and v.doc_id = p.doc_id
    where p.dataset = $dataset and not p.kept
    group by p.query_id, p.doc_id
),
imported as (
    select i.query_id, i.doc_id, i.relevance::integer as relevance, i.source, s.precedence,
           s.verified, null::integer as unverified_label, null::varchar as unverified_source,
           null::varchar as pair_key, null::varchar as config_hash, []::varchar[] as call_keys,
           []::bigint[] as vote_ids, i.file as import_file, i.line as import_line
    from imported_qrels i
    join qrels_sources s on s.dataset = i.dataset and s.source = i.source
    left join original o using (query_id, doc_id)
    where i.dataset = $dataset
      -- a correction applies only where it changes an original judgment; an ordinary source
      -- ranks below 'original' (the import refuses else), so it never wins an original pair
      and (not s.corrects_original or (o.relevance is not null and o.relevance <> i.relevance))
),
judgments as (
    select * from original
    union all by name select * from human
    union all by name select * from debate
    union all by name select * from pending
    union all by name select * from filtered_out
    union all by name select * from imported
),
winners as (
    select * from judgments
    qualify row_number() over (partition by query_id, doc_id order by precedence, source) = 1
),
estimated_holes as (
    select query_id, doc_id
    from winners
    where source = 'filter'
    qualify row_number() over (order by p_yes desc nulls last, pair_key, query_id, doc_id)
            <= $drops_at_upper
)
select $dataset as dataset, w.query_id, w.doc_id, w.relevance, w.source, w.unverified_label,
       w.unverified_source, w.pair_key, w.config_hash, w.call_keys, w.vote_ids,
       o.relevance as original_relevance, w.verified, w.precedence::double as precedence,
       w.import_file, w.import_line, e.query_id is not null as estimated_hole
from winners w
left join original o using (query_id, doc_id)
left join estimated_holes e using (query_id, doc_id)
order by w.query_id, w.doc_id
