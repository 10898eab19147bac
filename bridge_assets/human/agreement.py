"""Inter-annotator agreement: Fleiss' kappa (Fleiss 1971) over the votes per pair, and
quadratic-weighted Cohen's kappa between two annotators (for grades: a 1 against a 2 is a
smaller disagreement than a 0 against a 3)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from bridge_assets.registry.datasets import GRADES

LABELS = (0, 1)
Item = TypeVar("Item", bound=Hashable)  # what an annotator votes on (a pair)


def category_counts(votes_per_subject: Iterable[Sequence[int]],
                    categories: Sequence[int] = LABELS) -> np.ndarray:
    """The subjects x categories table Fleiss' kappa reads: how many raters chose each category."""
    index = {c: i for i, c in enumerate(categories)}
    rows = []
    for n, votes in enumerate(votes_per_subject):
        row = [0] * len(categories)
        for vote in votes:
            if vote not in index:
                raise ValueError(f"subject {n}: vote {vote!r} is not one of {list(categories)}")
            row[index[vote]] += 1
        rows.append(row)
    return np.array(rows, dtype=int).reshape(len(rows), len(categories))


def fleiss_kappa(table: np.ndarray | Sequence[Sequence[int]]) -> float | None:
    """Fleiss' kappa of a subjects x categories count table (every subject rated by the same
    number of raters). None when undefined: no subjects, or every rating in one category."""
    table = np.asarray(table, dtype=float)
    if table.ndim != 2 or table.shape[0] == 0:
        return None
    raters = table.sum(axis=1)
    if raters[0] < 2 or not np.all(raters == raters[0]):
        raise ValueError("Fleiss' kappa needs the same number (>= 2) of ratings per subject; "
                         f"got {sorted(set(raters.astype(int).tolist()))}")
    if np.count_nonzero(table.sum(axis=0)) < 2:
        return None
    # imported here: statsmodels and scikit-learn take seconds to import, which every `bridge
    # annotate` command and the app's start would pay without computing a kappa
    from statsmodels.stats.inter_rater import fleiss_kappa as _statsmodels_fleiss_kappa

    kappa = float(_statsmodels_fleiss_kappa(table, method="fleiss"))
    return None if math.isnan(kappa) else kappa


@dataclass(frozen=True)
class PairKappa:
    """Quadratic-weighted Cohen's kappa of two annotators over the pairs both voted on."""

    first: str
    second: str
    items: int
    kappa: float


def weighted_kappas(votes: Mapping[str, Mapping[Item, int]],
                    categories: Sequence[int] = GRADES) -> list[PairKappa]:
    """Every two annotators of `votes` (annotator -> item -> vote) who voted on at least two
    common items, with scikit-learn's quadratic-weighted kappa over the scale `categories`.
    A pair whose kappa is undefined (both gave one and the same vote throughout) is left out."""
    kappas = []
    for first, second in itertools.combinations(sorted(votes), 2):
        shared = sorted(set(votes[first]) & set(votes[second]), key=repr)
        a, b = [votes[first][i] for i in shared], [votes[second][i] for i in shared]
        if len(shared) < 2 or len(set(a) | set(b)) < 2:
            continue
        from sklearn.metrics import cohen_kappa_score  # see fleiss_kappa

        kappa = cohen_kappa_score(a, b, labels=list(categories), weights="quadratic")
        kappas.append(PairKappa(first, second, len(shared), float(kappa)))
    return kappas
