-- bridge_qrels, open pairs: escalated or failed debate pairs of $dataset that nobody has
-- decided yet (no human label, no adjudicator decision, not in the original qrels). They stay
-- out of the refined qrels until annotated; the asset reports them.
select d.query_id, d.doc_id, d.pair_key, d.outcome
from debate_labels d
where d.dataset = $dataset
  and d.outcome in ('escalated', 'failed')
  and d.adjudicator_label is null
  and not exists (select 1 from human_labels h
                  where h.dataset = d.dataset and h.query_id = d.query_id
                    and h.doc_id = d.doc_id and h.label is not null)
  and not exists (select 1 from original_qrels o
                  where o.dataset = d.dataset and o.query_id = d.query_id and o.doc_id = d.doc_id)
order by d.query_id, d.doc_id
