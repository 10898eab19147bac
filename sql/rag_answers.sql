-- rag_answers: what each answer is generated from: for each chosen system and query, the
-- system's top-$depth chunks in rank order (title and text).
-- Queries: those of the analysis scope with gold answers (a RAG answer is judged against
-- them); with $query_limit > 0 a stable sample of that many (by md5 of the query id, as
-- candidate_pool samples), the same for every system.
-- Parameters: $dataset, $depth, $query_limit, $systems (empty list: every system).
-- Inputs: queries, corpus, retrieval_run, analysis_scope (bridge_assets.analysis.views).
with chosen_queries as (
    select query_id, text, answers
    from queries
    where dataset = $dataset and len(answers) > 0
      and query_id in (select query_id from analysis_scope)
    qualify $query_limit <= 0
         or row_number() over (order by md5(query_id), query_id) <= $query_limit
)
select r.retriever, q.query_id, any_value(q.text) as query, any_value(q.answers) as answers,
       list(r.doc_id order by r.rank) as doc_ids,
       list(case when coalesce(c.title, '') = '' then c.text else c.title || ': ' || c.text end
            order by r.rank) as passages
from retrieval_run r
join chosen_queries q on q.query_id = r.query_id
join corpus c on c.dataset = r.dataset and c.doc_id = r.doc_id
where r.dataset = $dataset and r.rank <= $depth
  and (len($systems::varchar[]) = 0 or list_contains($systems::varchar[], r.retriever))
group by r.retriever, q.query_id
order by r.retriever, q.query_id
