"""LLMJudge: one stance-less agent, one call per pair, no escalation (the paper's baseline).

It is the debate machinery with a single agent and a single round, so its turns, failures
and outcomes have the same shape: a pair is 'consensus' with a label, or 'failed'.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from pydantic import Field

from bridge_assets.labeling.calls import Generate
from bridge_assets.labeling.debate import DebateOutcome, run_debate
from bridge_assets.labeling.debate_turns import DEFAULT_REASON_WORDS, AgentConfig, fewshot_examples
from bridge_assets.labeling.labeler import Labeler, LabelerRun, LabelerSettings, LabelItem
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


class JudgeSettings(LabelerSettings):
    reason_words: int = Field(DEFAULT_REASON_WORDS, ge=5, le=300, description="The reason's word "
                              "limit (the reply's JSON schema bounds it, so it also bounds the cost).")
    fewshot: bool = Field(False, description="Worked examples (resources/prompts/examples.yaml) in "
                          "the prompt.")


class JudgeLabeler(Labeler):
    """One call per pair. Its label is one model's word, not checked by another: a `vote`."""

    Settings = JudgeSettings
    templates = (JUDGE_TEMPLATE,)
    settings: JudgeSettings

    def label(self, items: Sequence[LabelItem], generate: Generate,
              prompts: Prompts | None = None) -> LabelerRun:
        s = self.settings
        outcome = run_judge([item.pair for item in items], self.model, generate,
                            temperature=s.temperature, reason_words=s.reason_words,
                            examples=fewshot_examples(s.fewshot), prompts=prompts)
        labels = [replace(label, outcome="vote") if label.outcome == "consensus" else label
                  for label in outcome.labels]
        details: list[str | None] = [f"{label.outcome}@{label.rounds_used}" for label in labels]
        return LabelerRun(labels, outcome.turns, details=details,
                          extra={"flags": outcome.flag_counts()}, models=list(self.models))
