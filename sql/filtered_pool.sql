-- filtered_pool: one row per pair sent to the filter, from its votes (table filter_votes).
-- A pair is dropped only when every filter model said false; a failed vote (is_supported
-- NULL) is not a "false", so it keeps the pair.
select
    dataset,
    query_id,
    doc_id,
    any_value(pair_key) as pair_key,
    count(*) filter (where is_supported is distinct from false) > 0 as kept,
    count(*) filter (where is_supported) as votes_supported,
    count(*) as votes_total,
    count(*) filter (where is_supported is null) as votes_failed
from filter_votes
group by dataset, query_id, doc_id
order by query_id, doc_id
