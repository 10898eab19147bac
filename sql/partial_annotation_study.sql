-- partial_annotation_study: the relevant documents of each query under the full (refined)
-- qrels, with what the single-relevant simulations pick by: popularity (how many systems
-- retrieved the document), length (characters of its title and text), and every system's
-- rank of it (systems and ranks in the same order).
-- Inputs: corpus, the analysis views (bridge_assets.analysis.views). Parameter: $dataset.
with relevant as (
    select query_id, doc_id
    from analysis_refined_qrels
    where relevance >= 1
),
hits as (
    select r.query_id, r.doc_id, r.retriever, min(r.rank) as rank
    from analysis_run r
    join relevant using (query_id, doc_id)
    group by r.query_id, r.doc_id, r.retriever
)
select rel.query_id, rel.doc_id,
       any_value(coalesce(length(c.title), 0) + coalesce(length(c.text), 0))::integer as length,
       count(h.retriever)::integer as popularity,
       coalesce(list(h.retriever order by h.retriever) filter (where h.retriever is not null),
                []::varchar[]) as systems,
       coalesce(list(h.rank::integer order by h.retriever) filter (where h.retriever is not null),
                []::integer[]) as ranks
from relevant rel
left join corpus c on c.dataset = $dataset and c.doc_id = rel.doc_id
left join hits h on h.query_id = rel.query_id and h.doc_id = rel.doc_id
group by rel.query_id, rel.doc_id
order by rel.query_id, rel.doc_id
