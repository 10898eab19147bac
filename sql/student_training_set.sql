-- student_training_set: the labels the student annotator of one dataset ($dataset) learns from.
-- Only verified judgments of the refined qrels: the original gold, people's labels (the
-- audited filter drops among them), DREAM consensus that passed its checks, and imported
-- judgments imported as verified (bridge_qrels.verified). A pending pair (relevance NULL), any
-- model's unverified guess on it (unverified_label) and the filter's unaudited "no" never get
-- here. Graded judgments become
-- relevant (1) at grade 1 and above, the convention of every measure of this project.
select query_id, doc_id, (relevance > 0)::integer as label, source
from bridge_qrels
where dataset = $dataset and verified and relevance is not null
order by query_id, doc_id
