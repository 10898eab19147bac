-- Rows of retrieval_run with what its asset check needs: whether each document and query is
-- known, and how many documents the (dataset, retriever, query) ranks (ranks must be 1..n).
select r.dataset, r.retriever, r.query_id, r.doc_id, r.rank, r.score,
       c.doc_id is not null as doc_known,
       q.query_id is not null as query_known,
       count(*) over (partition by r.dataset, r.retriever, r.query_id) as ranked_in_query
from retrieval_run r
left join corpus c on c.dataset = r.dataset and c.doc_id = r.doc_id
left join queries q on q.dataset = r.dataset and q.query_id = r.query_id
