-- human_labels: the label people gave each pair sent to them, from the accepted human votes.
-- Parameters: $dataset (NULL: every dataset), $required_votes (accepted votes a pair needs).
-- One row per pair for people: escalated by the debate (debate_labels.outcome 'escalated' or
-- 'failed'), or drawn into the review sample (the audit of the filter's drops, the calibration
-- sample of the debate's consensus; `review` says which, NULL for an escalation). The label is the
-- median vote: on 0/1 votes the majority, on grades 0-3 the middle grade (an ordinal scale has
-- no mean, and one outlying vote does not move it). When the two middle votes of an even
-- number differ (on 0/1 votes, a tie) there is no median and the pair waits for one more vote.
-- A pair is `decided` once it has $required_votes accepted votes and a median; attention-check
-- votes and excluded votes never count. `votes_relevant` counts the votes of 1 or more,
-- `agreement` is the share of the most frequent vote, `vote_ids` the votes counted (the refined
-- qrels cite them: bridge_qrels reads them here, not from the votes store). The asset keeps the
-- decided rows; the annotation queue serves the others.
with escalated as (
    select dataset, query_id, doc_id, any_value(review) as review
    from (select dataset, query_id, doc_id, null::varchar as review
          from debate_labels
          where outcome in ('escalated', 'failed') and ($dataset is null or dataset = $dataset)
          union all
          select dataset, query_id, doc_id, kind as review
          from review_sample
          where $dataset is null or dataset = $dataset)
    group by dataset, query_id, doc_id
),
tallies as (
    select e.dataset, e.query_id, e.doc_id, e.review,
           count(v.label)::int as votes,
           count(v.label) filter (where v.label >= 1)::int as votes_relevant,
           list_sort(list(v.label) filter (where v.label is not null)) as sorted,
           coalesce(list(v.vote_id order by v.vote_id) filter (where v.vote_id is not null),
                    []::bigint[]) as vote_ids
    from escalated e
    left join human_votes v
      on v.dataset = e.dataset and v.query_id = e.query_id and v.doc_id = e.doc_id
     and v.status = 'accepted' and not v.is_attention_check
    group by all
),
medians as (
    select *, sorted[(votes + 1) // 2] as low_median, sorted[votes // 2 + 1] as high_median
    from tallies
)
select dataset, query_id, doc_id, review,
       case when low_median = high_median then low_median end as label,
       votes,
       votes_relevant,
       case when votes > 0 then list_max(list_transform(list_distinct(sorted),
                                         g -> len(list_filter(sorted, x -> x = g)))) / votes end
           as agreement,
       vote_ids,
       votes >= $required_votes and coalesce(low_median = high_median, false) as decided
from medians
order by dataset, query_id, doc_id
