"""Checks a label must pass before it counts: is the quoted evidence really in the chunk, and
does the chunk contain a reference answer at all?

Neither check is a label on its own. They flag a "yes" that rests on nothing the chunk says,
and the debate escalates such a pair to people instead of counting it as a found hole.

- Evidence: each quoted sentence is looked up in the chunk after both are normalised
  (case folded, whitespace collapsed). An exact substring matches. Otherwise rapidfuzz's
  `partial_ratio` (the best alignment of the quote against any stretch of the chunk) must
  reach `min_ratio`, so a changed quote mark, a dropped comma or a line break still match,
  and a paraphrase or the agent's own words do not.
- Answer presence (the paper's guideline 2: the chunk must contain the answer's key content):
  an answer matches when its normalised word sequence occurs in the chunk's. Normalisation is
  the one of the SQuAD / NQ-open evaluation scripts (lower case, punctuation and the articles
  a/an/the removed, whitespace collapsed), applied to both sides. It is meaningful for short
  span answers (NQ, SQuAD, TriviaQA); `answers_are_short` tells when a dataset has them.
"""

from __future__ import annotations

import re
import statistics
import string
import unicodedata
from collections.abc import Iterable, Sequence
from typing import Literal

from rapidfuzz import fuzz

Evidence = Literal["verified", "unverified", "none"]

DEFAULT_MIN_RATIO = 0.9
SHORT_ANSWER_WORDS = 5  # NQ-open keeps answers of at most five tokens
_WHITESPACE = re.compile(r"\s+")
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def _folded(text: str) -> str:
    return _WHITESPACE.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


def quote_in_chunk(quote: str, chunk: str, min_ratio: float = DEFAULT_MIN_RATIO) -> bool:
    """Whether `quote` occurs in `chunk`, up to case, whitespace and small edits."""
    needle, haystack = _folded(quote), _folded(chunk)
    if not needle:
        return False
    if needle in haystack:
        return True
    return fuzz.partial_ratio(needle, haystack, score_cutoff=min_ratio * 100) >= min_ratio * 100


def evidence_status(quotes: Sequence[str], chunk: str, min_ratio: float = DEFAULT_MIN_RATIO) -> Evidence:
    """'verified' when at least one quote is in the chunk, 'unverified' when quotes were given
    and none is, 'none' when nothing was quoted."""
    quotes = [q for q in quotes if q.strip()]
    if not quotes:
        return "none"
    return "verified" if any(quote_in_chunk(q, chunk, min_ratio) for q in quotes) else "unverified"


def quote_matches(quotes: Sequence[str], chunk: str, min_ratio: float = DEFAULT_MIN_RATIO) -> list[bool]:
    """For each quote, whether it is in the chunk (what the audit and the annotation page mark)."""
    return [quote_in_chunk(q, chunk, min_ratio) for q in quotes]


def normalize_answer(text: str) -> str:
    """SQuAD / NQ-open answer normalisation: lower case, no punctuation, no articles, single spaces."""
    text = unicodedata.normalize("NFKC", text).lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def answer_in_chunk(answers: Iterable[str], chunk: str) -> bool:
    """Whether any answer's normalised words occur, as a whole-word sequence, in the chunk's."""
    haystack = f" {normalize_answer(chunk)} "
    return any(needle and f" {needle} " in haystack for needle in map(normalize_answer, answers))


def answers_are_short(answer_lists: Iterable[Sequence[str]], max_words: int = SHORT_ANSWER_WORDS) -> bool:
    """Whether a dataset's reference answers are short spans: the median answer has at most
    `max_words` words. False when there are no answers (TREC topics, SciFact claims)."""
    lengths = [len(answer.split()) for answers in answer_lists for answer in answers if answer.strip()]
    return bool(lengths) and statistics.median(lengths) <= max_words
