"""Scores from token log-probabilities: P(yes) for LARA/DIRAS-style calibrated judges."""

from __future__ import annotations

import math
from collections.abc import Sequence

from bridge_assets.llm.types import TokenLogprob

YES = frozenset({"yes", "true"})
NO = frozenset({"no", "false"})


def _word(token: str) -> str:
    return token.strip().strip('"').lower()


def _p_yes(token: TokenLogprob, yes: frozenset[str], no: frozenset[str]) -> float:
    alternatives = dict(token.top) or {token.token: token.logprob}
    alternatives.setdefault(token.token, token.logprob)
    p_yes = sum(math.exp(lp) for t, lp in alternatives.items() if _word(t) in yes)
    p_no = sum(math.exp(lp) for t, lp in alternatives.items() if _word(t) in no)
    return p_yes / (p_yes + p_no)


def yes_probability(logprobs: Sequence[TokenLogprob] | None, yes: frozenset[str] = YES,
                    no: frozenset[str] = NO) -> float | None:
    """P(yes) at the first generated token that says yes or no (in any casing or quoting).

    The probability mass of every "yes"-like alternative there (from `top`), renormalised over
    the yes-like and no-like alternatives. None when no token of the reply says yes or no:
    the caller must treat that as a failed score, not as 0.5.
    """
    for token in logprobs or ():
        if _word(token.token) in yes | no:
            return _p_yes(token, yes, no)
    return None


def field_yes_probability(logprobs: Sequence[TokenLogprob] | None, field: str = "response",
                          yes: frozenset[str] = YES, no: frozenset[str] = NO) -> float | None:
    """P(yes) at the value of a JSON reply's `field`: the first yes/no token after the text
    `"<field>"`, so a "no" inside an earlier reason is never taken for the answer. None when
    the reply carries no such token."""
    text, key = "", f'"{field}"'
    for token in logprobs or ():
        if key in text and _word(token.token) in yes | no:
            return _p_yes(token, yes, no)
        text += token.token
    return None
