"""trec_eval's measure families, their names and cutoffs, and the parsing of measure requests."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from bridge_assets.errors import BridgeError

TREC_CUTOFFS = (5, 10, 15, 20, 30, 100, 200, 500, 1000)
RECALL_LEVELS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
NO_LIMIT = 2**62  # trec_eval's default -M (MAXLONG): every retrieved document counts

ParamKind = Literal["none", "cutoff", "level"]


@dataclass(frozen=True)
class MeasureFamily:
    """One measure as trec_eval knows it; `cutoff`/`level` families expand to `name_param`."""

    name: str
    params: ParamKind = "none"
    defaults: tuple[float, ...] = ()
    count: bool = False         # printed as an integer and summed (not averaged) over queries
    summary_only: bool = False  # trec_eval prints it for 'all' only


# In trec_eval's printing order (its measures.c), then BRIDGE's own measures.
FAMILIES: dict[str, MeasureFamily] = {f.name: f for f in (
    MeasureFamily("runid", summary_only=True),
    MeasureFamily("num_q", count=True, summary_only=True),
    MeasureFamily("num_ret", count=True),
    MeasureFamily("num_rel", count=True),
    MeasureFamily("num_rel_ret", count=True),
    MeasureFamily("map"),
    MeasureFamily("gm_map", summary_only=True),
    MeasureFamily("Rprec"),
    MeasureFamily("bpref"),
    MeasureFamily("recip_rank"),
    MeasureFamily("iprec_at_recall", "level", RECALL_LEVELS),
    MeasureFamily("P", "cutoff", TREC_CUTOFFS),
    MeasureFamily("recall", "cutoff", TREC_CUTOFFS),
    MeasureFamily("ndcg"),
    MeasureFamily("ndcg_cut", "cutoff", TREC_CUTOFFS),
    MeasureFamily("map_cut", "cutoff", TREC_CUTOFFS),
    MeasureFamily("success", "cutoff", (1, 5, 10)),
    MeasureFamily("num_nonrel_judged_ret", count=True),
    MeasureFamily("unj", "cutoff", (5, 10, 20)),
    # BRIDGE's own: MRR@k, Judged@k, Hole@k (docs/metrics.md)
    MeasureFamily("recip_rank_cut", "cutoff", (5, 10, 20)),
    MeasureFamily("judged", "cutoff", (5, 10, 20)),
    MeasureFamily("hole", "cutoff", (5, 10, 20)),
)}

NICKNAMES = {
    # trec_eval's default when no -m is given
    "official": ("runid", "num_q", "num_ret", "num_rel", "num_rel_ret", "map", "gm_map",
                 "Rprec", "bpref", "recip_rank", "iprec_at_recall", "P"),
}

# What the pipeline's retrieval_metrics asset reports (cutoff families at its k).
PIPELINE_MEASURES = ("success", "recall", "P", "recip_rank_cut", "ndcg_cut", "map", "judged",
                     "num_rel", "num_rel_ret")


class MeasureError(BridgeError, ValueError):
    """A measure name or parameter that this module does not offer."""


@dataclass(frozen=True)
class MeasureSelection:
    """Requested measures, expanded: ordered names and the cutoffs/levels they need."""

    names: tuple[str, ...]
    family_of: dict[str, MeasureFamily]
    cutoffs: tuple[int, ...]
    levels: tuple[float, ...]
    param_of: dict[str, float] = field(default_factory=dict)  # P_10 -> 10, iprec_at_recall_0.10 -> 0.1

    def uses(self, family: str) -> bool:
        return any(f.name == family for f in self.family_of.values())

    @property
    def depth(self) -> int | None:
        """How deep a ranking these measures read: the largest cutoff when every measure is a
        cutoff measure (their values are then the same under trec_eval's -M depth), else None."""
        if self.cutoffs and all(f.params == "cutoff" for f in self.family_of.values()):
            return max(self.cutoffs)
        return None


def _param_name(family: MeasureFamily, value: float) -> str:
    # trec_eval: "%s_%ld" for cutoffs, "%s_%3.2f" for recall levels
    return f"{family.name}_{int(value)}" if family.params == "cutoff" else f"{family.name}_{value:.2f}"


def _parse_params(family: MeasureFamily, text: str, spec: str) -> list[float]:
    values: list[float] = []
    for part in text.split(","):
        try:
            value = int(part) if family.params == "cutoff" else float(part)
        except ValueError:
            raise MeasureError(f"measure '{spec}': parameter '{part}' is not "
                               f"{'an integer' if family.params == 'cutoff' else 'a number'}") from None
        if family.params == "cutoff" and value <= 0:
            raise MeasureError(f"measure '{spec}': cutoffs must be positive")
        if family.params == "level" and not 0.0 <= value <= 1.0:
            raise MeasureError(f"measure '{spec}': recall levels lie between 0 and 1")
        values.append(value)
    if len(set(values)) != len(values):
        raise MeasureError(f"measure '{spec}': duplicate parameters")
    return values


def _split_spec(spec: str) -> tuple[MeasureFamily, list[float] | None]:
    """`P` -> (P, None: defaults); `P.5,10` (trec_eval) or `P_10` (pytrec_eval) -> (P, [..])."""
    if spec in FAMILIES:
        return FAMILIES[spec], None
    name, dot, params = spec.partition(".")
    if dot and name in FAMILIES and FAMILIES[name].params != "none":
        return FAMILIES[name], _parse_params(FAMILIES[name], params, spec)
    name, underscore, param = spec.rpartition("_")
    if underscore and name in FAMILIES and FAMILIES[name].params != "none":
        return FAMILIES[name], _parse_params(FAMILIES[name], param, spec)
    offered = ", ".join(f.name for f in FAMILIES.values())
    raise MeasureError(f"unknown measure '{spec}' (offered: {offered}; nickname: official)")


def resolve_measures(specs: Iterable[str], cutoffs: Sequence[int] | None = None) -> MeasureSelection:
    """Expand measure names into the values to compute, in trec_eval's printing order.

    A bare cutoff family (`P`, `ndcg_cut`, ...) takes `cutoffs` when given (the pipeline's k),
    otherwise trec_eval's default cutoffs. Several requests for one family are united.
    """
    wanted: dict[str, set[float] | None] = {}
    for spec in specs:
        for item in NICKNAMES.get(spec, (spec,)):
            family, params = _split_spec(item)
            if family.params == "none":
                wanted[family.name] = None
                continue
            if params is None:
                params = list(cutoffs) if cutoffs and family.params == "cutoff" else list(family.defaults)
            chosen = wanted.setdefault(family.name, set())
            assert chosen is not None, family.name  # only a family without parameters maps to None
            chosen.update(params)
    names: list[str] = []
    family_of: dict[str, MeasureFamily] = {}
    param_of: dict[str, float] = {}
    needed_cutoffs: set[int] = set()
    needed_levels: set[float] = set()
    for family in FAMILIES.values():
        if family.name not in wanted:
            continue
        values = wanted[family.name]
        if values is None:
            names.append(family.name)
            family_of[family.name] = family
            continue
        for value in sorted(values):
            name = _param_name(family, value)
            names.append(name)
            family_of[name] = family
            param_of[name] = value
        if family.params == "cutoff":
            needed_cutoffs.update(int(v) for v in values)
        else:
            needed_levels.update(values)
    if not names:
        raise MeasureError("no measure requested")
    return MeasureSelection(tuple(names), family_of, tuple(sorted(needed_cutoffs)),
                            tuple(sorted(needed_levels)), param_of)


def format_value(family: MeasureFamily, value: float) -> str:
    """trec_eval's printf: `%ld` for counts, `%6.4f` for the rest."""
    return str(int(value)) if family.count else f"{value:6.4f}"
