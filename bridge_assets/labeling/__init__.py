"""DREAM labeling: candidate pool, LLM filter, multi-agent debate, adjudicator, LLMJudge.

Plain typed functions (pooling, filter, debate, judge, adjudicator, prompts) that take a
`generate(profile, requests) -> results` callable and know nothing of Dagster; `assets.py`
and `checks.py` wire them to DuckDB tables and the LLM resource.
"""
