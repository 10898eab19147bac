-- student_teacher_scores: the teacher's P(yes) of each verified pair of one dataset ($dataset)
-- that the pipeline's labeler scored: the debate's (debate_labels.p_yes, the agents' mean P(yes)
-- in the last round) under the configuration bridge_qrels traces the pair to. The student
-- distils it at `teacher_weight` (student/model.py). A pending pair is not verified, so what a
-- model said of it never gets here.
select q.query_id, q.doc_id, d.p_yes as teacher
from bridge_qrels q
join debate_labels d
  on d.dataset = q.dataset and d.query_id = q.query_id and d.doc_id = q.doc_id
 and d.config_hash = q.config_hash
where q.dataset = $dataset and q.verified and q.relevance is not null and d.p_yes is not null
