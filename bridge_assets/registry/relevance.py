"""What "relevant" means for a dataset: the one definition every labeler reads.

A dataset states it in resources/datasets.yaml as `relevance: {definition: <preset or text>}`;
a query may carry its own (`definition` in its query file, DIRAS's per-question explanation),
which wins over the dataset's. Presets:

    answer_support  the chunk supports at least one of the query's short reference answers
                    (the default where the query has answers)
    narrative       a TREC topic's description and narrative say what counts (the default
                    where the query has them and no answers)
    useful          some of the chunk's content directly answers the question or a part of it;
                    content on the topic that answers nothing is not relevant (DIRAS's
                    definition, TREC's "any part"; the default where the query has neither)

Any other text is the user's own definition (kind `custom`), shown to the labelers as written.
The prompts (resources/prompts/*.j2) branch on the kind; the definition is part of a pair's
key, so changing it re-asks exactly the calls whose prompts changed and re-keys the labels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

RelevanceKind = Literal["answer_support", "narrative", "useful", "custom"]
PRESETS: tuple[RelevanceKind, ...] = ("answer_support", "narrative", "useful")
# DIRAS's definition (its general-QA prompt), in our words: the text the labelers read for `useful`.
USEFUL_DEFINITION = ("A chunk is relevant if some of its content directly answers the question or "
                     "a part of it. A chunk on the same topic that answers no part of the question "
                     "is not relevant.")
MAX_DEFINITION_CHARS = 2000


class RelevanceSettings(BaseModel):
    """A dataset's `relevance:` entry: what relevant means, and how far the models' labels are
    trusted on it (bridge_assets.labeling.review, bridge_assets.qrels.trust)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # A preset name or the user's own definition; None: the default per query (module doc).
    definition: str | None = None
    # The audit of the filter's drops: a seeded random share of them goes to people (at least
    # audit_min_pairs, or every drop when there are fewer).
    audit_share: float = Field(0.05, ge=0.0, le=1.0)
    audit_min_pairs: int = Field(10, ge=0)
    # The calibration sample: this many debate consensus labels (half "yes", half "no") go to
    # people first, to measure the labels on this dataset. None: 20 where the model's labels are
    # provisional without a measurement, 0 where the rule trusts them (qrels.trust).
    calibration_pairs: int | None = Field(None, ge=0)
    # The bar: a model's labels of one class become findings only while the 95% interval of
    # their measured precision lies above it (see qrels.trust for the rule).
    min_precision: float = Field(0.7, gt=0.0, le=1.0)
    # The metrics' upper bound counts as relevant the drops the audit estimates to be holes (the
    # high end of its 95% interval; bridge_assets.qrels.trust). Off until measured: the
    # estimate rests on a small sample, and the plain bounds already hold the verified labels.
    drops_in_bounds: bool = False
    seed: int = 0

    @field_validator("definition")
    @classmethod
    def _definition(cls, value: str | None) -> str | None:
        return None if value is None else validate_definition(value)


def validate_definition(value: object) -> str:
    """A preset name or a definition text, stripped; ValueError when it is neither."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError("a relevance definition is a preset "
                         f"({', '.join(PRESETS)}) or a non-empty text of your own")
    text = " ".join(value.split())
    if len(text) > MAX_DEFINITION_CHARS:
        raise ValueError(f"a relevance definition of {len(text):,} characters is over the cap of "
                         f"{MAX_DEFINITION_CHARS:,}")
    return text


@dataclass(frozen=True)
class Relevance:
    """The definition one pair is judged by: its kind and the text the labelers read (None for
    answer_support and narrative, whose wording the prompts carry with the answers or topic)."""

    kind: RelevanceKind
    text: str | None = None

    @property
    def label(self) -> str:
        """How reports and `bridge audit` name it."""
        if self.kind == "custom":
            return f"custom: {self.text}"
        return self.kind


def default_kind(answers: tuple[str, ...] | list[str], description: str | None,
                 narrative: str | None) -> RelevanceKind:
    """The kind a query is judged by when neither it nor its dataset states one."""
    if answers:
        return "answer_support"
    if description or narrative:
        return "narrative"
    return "useful"


def legacy_kind(answers: tuple[str, ...] | list[str], description: str | None,
                narrative: str | None) -> RelevanceKind:
    """The kind the prompts applied before definitions existed (a query without answers or
    topic was judged against "a correct, complete answer"): pairs judged by it keep the keys
    their stored labels carry."""
    return "narrative" if not answers and (description or narrative) else "answer_support"


def resolve_relevance(setting: str | None, *, answers: tuple[str, ...] | list[str],
                      description: str | None = None, narrative: str | None = None,
                      query_definition: str | None = None) -> Relevance:
    """The definition a query is judged by: its own, else its dataset's `setting`, else the
    default for what it has. `narrative` on a query without a topic falls back to `useful`."""
    if query_definition and query_definition.strip():
        chosen = validate_definition(query_definition)
    elif setting:
        chosen = validate_definition(setting)
    else:
        chosen = default_kind(answers, description, narrative)
    if chosen == "narrative" and not (description or narrative):
        chosen = "useful"
    if chosen == "useful":
        return Relevance("useful", USEFUL_DEFINITION)
    if chosen in PRESETS:
        return Relevance(chosen)
    return Relevance("custom", chosen)
