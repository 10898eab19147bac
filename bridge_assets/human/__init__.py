"""Human escalation: the annotation app for escalated pairs and the `human_labels` asset.

Escalated pairs (debate_labels.outcome 'escalated' or 'failed') go to three annotators each,
who see the query, its gold answers, the chunk and (per batch) the debate history. Votes land
in the append-only `human_votes` table of the votes store (votes_store.py: a DuckDB file apart
from the pipeline's); `human_labels` is their median vote per pair.
"""
