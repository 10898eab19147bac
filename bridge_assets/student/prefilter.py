"""The student as a pre-filter, measured before it may become a default: pairs the student
scores below a threshold would skip the LLM filter. What that saves (filter calls) and what
it loses (relevant pairs that would never reach the debate), per threshold.

On a gold set the scores are out of fold (labeler.cross_fitted_scores: no student scores a
query it learned from). On a dataset's lake the same holds: the pairs the filter saw are
scored, fold by fold, by a student trained on the verified labels of the other queries only,
as a student trained on the labels so far would meet the pairs a new retriever surfaces.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import duckdb

from bridge_assets.labeling.labeler import LabelItem
from bridge_assets.labeling.pairs import load_pairs
from bridge_assets.lake.store import one_row
from bridge_assets.qrels.known_holes import KnownHoles
from bridge_assets.student.annotator import training_set
from bridge_assets.student.labeler import StudentLabelerSettings, cross_fitted_scores

THRESHOLDS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5)


@dataclass(frozen=True)
class ThresholdRow:
    threshold: float
    pairs: int
    skipped: int              # pairs below the threshold: filter calls saved (x filter models)
    relevant: int
    relevant_lost: int        # relevant pairs below the threshold
    lost_share: float | None
    lost_ci: tuple[float, float] | None   # 95% Wilson interval of lost_share

    @property
    def skipped_share(self) -> float:
        return self.skipped / self.pairs if self.pairs else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "skipped_share": self.skipped_share}


def threshold_table(scores: Sequence[float], relevant: Sequence[bool],
                    thresholds: Sequence[float] = THRESHOLDS) -> list[ThresholdRow]:
    """Per threshold: pairs skipped, and relevant pairs lost with a 95% Wilson interval."""
    from scipy.stats import binomtest

    rows = []
    total_relevant = sum(relevant)
    for t in thresholds:
        skipped = sum(1 for p in scores if p < t)
        lost = sum(1 for p, r in zip(scores, relevant, strict=True) if r and p < t)
        interval = None
        if total_relevant:
            ci = binomtest(lost, total_relevant).proportion_ci(confidence_level=0.95, method="wilson")
            interval = (float(ci.low), float(ci.high))
        rows.append(ThresholdRow(t, len(scores), skipped, total_relevant, lost,
                                 lost / total_relevant if total_relevant else None, interval))
    return rows


@dataclass
class LakeStudy:
    rows: list[ThresholdRow]        # over the pairs the filter saw; relevant = verified holes
    filter_models: int
    folds: list[dict]


def lake_study(con: duckdb.DuckDBPyConnection, dataset: str, holes: KnownHoles,
               settings: StudentLabelerSettings, thresholds: Sequence[float] = THRESHOLDS) -> LakeStudy:
    """`con`: the dataset's bridge_qrels, debate_labels, filtered_pool, filter_votes, queries and
    corpus. Relevant pairs are the known holes among the pairs the filter saw."""
    data = training_set(con, dataset, teacher=settings.teacher_weight > 0)
    known = [LabelItem(f"{p.query_id}|{p.doc_id}", p, int(label))
             for p, label in zip(data.pairs, data.labels["label"], strict=True)]
    teacher = data.labels["teacher"].to_list() if "teacher" in data.labels.columns else None
    seen = load_pairs(con, dataset, "select query_id, doc_id from filtered_pool where dataset = $dataset")
    to_score = [LabelItem(f"{p.query_id}|{p.doc_id}", p) for p in seen]
    scores, folds = cross_fitted_scores(known, to_score, settings, teacher)
    relevant = [p.doc_id in holes.holes.get(p.query_id, ()) for p in seen]
    models = one_row(con, "select count(distinct model) from filter_votes where dataset = ?", [dataset])[0]
    return LakeStudy(threshold_table(scores, relevant, thresholds), int(models), folds)
