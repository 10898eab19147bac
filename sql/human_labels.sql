-- human_labels: the majority vote of the accepted human votes on each escalated pair.
-- Parameters: $dataset (NULL: every dataset), $required_votes (accepted votes a pair needs).
-- One row per escalated pair (debate_labels.outcome 'escalated' or 'failed'). A pair is
-- `decided` once it has $required_votes accepted votes and a strict majority; attention-check
-- votes and excluded votes never count. The asset keeps the decided rows; the annotation
-- queue serves the others.
with escalated as (
    select distinct dataset, query_id, doc_id
    from debate_labels
    where outcome in ('escalated', 'failed') and ($dataset is null or dataset = $dataset)
),
tallies as (
    select e.dataset, e.query_id, e.doc_id,
           count(v.label)::int as votes,
           coalesce(sum(v.label), 0)::int as votes_relevant
    from escalated e
    left join human_votes v
      on v.dataset = e.dataset and v.query_id = e.query_id and v.doc_id = e.doc_id
     and v.status = 'accepted' and not v.is_attention_check
    group by all
)
select dataset, query_id, doc_id,
       case when 2 * votes_relevant > votes then 1
            when 2 * votes_relevant < votes then 0 end as label,
       votes,
       votes_relevant,
       case when votes > 0 then greatest(votes_relevant, votes - votes_relevant) / votes end
           as agreement,
       votes >= $required_votes and 2 * votes_relevant <> votes as decided
from tallies
order by dataset, query_id, doc_id
