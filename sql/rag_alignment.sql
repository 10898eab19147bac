-- rag_alignment inputs: per (system, qrels version, query) the system's Hit@k and nDCG@k
-- (retrieval_metrics, per query) beside the judgment of the RAG answer generated from the
-- same system's top-k (rag_judgments; failed or undecided judgments left out), on the
-- original and the refined qrels (the verified labels: pending pairs irrelevant).
-- Parameters: $dataset, $hit (e.g. 'success_10'), $ndcg (e.g. 'ndcg_cut_10').
select j.retriever, m.qrels_version, j.query_id, j.judgment::integer as judgment,
       max(m.value) filter (where m.measure = $hit) as hit,
       max(m.value) filter (where m.measure = $ndcg) as ndcg
from rag_judgments j
join retrieval_metrics m
  on m.dataset = j.dataset and m.retriever = j.retriever and m.query_id = j.query_id
where j.dataset = $dataset and j.judgment is not null and m.measure in ($hit, $ndcg)
  and m.qrels_version in ('original', 'refined')
group by j.retriever, m.qrels_version, j.query_id, j.judgment
order by j.retriever, m.qrels_version, j.query_id
