"""LLMJudge: one stance-less agent, one call per pair, no escalation (the paper's baseline).

It is the debate machinery with a single agent and a single round, so its turns, failures
and outcomes have the same shape: a pair is 'consensus' with a label, or 'failed'.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from bridge_assets.labeling.calls import Generate
from bridge_assets.labeling.debate import DEFAULT_REASON_WORDS, AgentConfig, DebateOutcome, run_debate
from bridge_assets.labeling.pairs import Pair
from bridge_assets.labeling.prompts import Prompts

JUDGE_TEMPLATE = "judge"


def judge_agent(model: str) -> AgentConfig:
    return AgentConfig("judge", None, model, template=JUDGE_TEMPLATE)


def run_judge(pairs: Sequence[Pair], model: str, generate: Generate, *, temperature: float = 0.0,
              reason_words: int = DEFAULT_REASON_WORDS, examples: Sequence[Mapping] = (),
              prompts: Prompts | None = None) -> DebateOutcome:
    """Label every pair with one call to `model`."""
    return run_debate(pairs, [judge_agent(model)], generate, rounds=1, temperature=temperature,
                      reason_words=reason_words, examples=examples, prompts=prompts)
