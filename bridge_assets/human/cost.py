"""What people's time costs: minutes x a rate (`BRIDGE_ANNOTATOR_RATE`, per hour), per labelled
pair, beside the LLM cost in the cost view (`bridge run --dry-run`, bridge_assets.orchestration.costs).

Minutes come from the time every vote records (bridge_assets.human.votes: served -> answered,
idle time capped). Every vote on the dataset counts, attention checks and known-answer items
included: people spent that time to get the labels. A vote without a time (imported, or cast
before times were recorded) counts at the median of the timed ones. The cost per labelled pair
divides it by the escalated pairs people decided; the forecast prices the votes the open pairs
still need at the median.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from bridge_assets.human.labels import tallies_sql
from bridge_assets.human.tables import REQUIRED_VOTES
from bridge_assets.lake.store import one_row, table_exists


@dataclass(frozen=True)
class Rate:
    per_hour: float
    currency: str = "USD"

    def price(self, minutes: float) -> float:
        return minutes / 60 * self.per_hour

    def __str__(self) -> str:
        return f"{self.per_hour:g} {self.currency}/hour"


def annotator_rate() -> Rate | None:
    """The rate in force (BRIDGE_ANNOTATOR_RATE); None when unset."""
    from bridge_assets.settings import env

    rate = env.annotator_rate
    return Rate(*rate) if rate is not None else None


@dataclass(frozen=True)
class PeopleCost:
    dataset: str
    votes: int                    # every vote on the dataset (checks and known-answer items too)
    timed_votes: int
    timed_seconds: float          # the timed votes' seconds, summed
    median_seconds: float | None  # of a timed vote
    labelled_pairs: int           # escalated pairs people decided
    open_pairs: int               # escalated pairs still short of votes (or tied)
    votes_needed: int             # the votes the open pairs need at least
    rate: Rate | None = None

    @property
    def minutes(self) -> float:
        """People's minutes on the dataset: the timed votes, the others at the median."""
        untimed = (self.votes - self.timed_votes) * (self.median_seconds or 0.0)
        return (self.timed_seconds + untimed) / 60

    @property
    def cost(self) -> float | None:
        return self.rate.price(self.minutes) if self.rate else None

    @property
    def cost_per_labelled_pair(self) -> float | None:
        return self.cost / self.labelled_pairs if self.cost is not None and self.labelled_pairs else None

    @property
    def minutes_to_finish(self) -> float | None:
        """The open pairs' missing votes at the median time of a vote (None: nothing timed)."""
        return None if self.median_seconds is None else self.votes_needed * self.median_seconds / 60

    @property
    def cost_to_finish(self) -> float | None:
        minutes = self.minutes_to_finish
        return self.rate.price(minutes) if self.rate and minutes is not None else None


def people_cost(con: duckdb.DuckDBPyConnection, dataset: str, rate: Rate | None = None) -> PeopleCost:
    """`dataset`'s people cost from `con`, which holds human_votes (the votes store, or a
    snapshot with its votes copied) and, once the debate ran, debate_labels."""
    votes, timed, seconds, median = one_row(con, """
        select count(*), count(seconds), coalesce(sum(seconds), 0), median(seconds)
        from human_votes where dataset = ?""", [dataset])
    labelled = open_pairs = needed = 0
    if table_exists(con, "debate_labels"):
        labelled, open_pairs, needed = one_row(con, f"""
            with tallies as ({tallies_sql(con)})
            select count(*) filter (where decided), count(*) filter (where not decided),
                   coalesce(sum(greatest($required - votes, 1)) filter (where not decided), 0)
            from tallies""", {"dataset": dataset, "required_votes": REQUIRED_VOTES,
                              "required": REQUIRED_VOTES})
    return PeopleCost(dataset, votes, timed, float(seconds), median, labelled, open_pairs, int(needed), rate)


def _money(amount: float | None, rate: Rate | None) -> str:
    return "-" if amount is None or rate is None else f"{amount:.2f} {rate.currency}"


def describe(people: PeopleCost, llm_per_pair: str | None = None) -> list[str]:
    """The cost view's lines for people, with the LLM's cost per pair beside when given."""
    rate = people.rate
    head = (f"People (votes store; BRIDGE_ANNOTATOR_RATE = {rate}):" if rate else
            "People (set BRIDGE_ANNOTATOR_RATE, e.g. 30 or '30 EUR' an hour, to price their time):")
    lines = [head]
    median = "-" if people.median_seconds is None else f"{people.median_seconds:.1f} s"
    lines.append(f"  so far: {people.votes:,} vote(s) ({people.timed_votes:,} timed, median {median}): "
                 f"{people.minutes:.1f} min, {_money(people.cost, rate)}; {people.labelled_pairs:,} "
                 f"pair(s) labelled by people: {_money(people.cost_per_labelled_pair, rate)} per labelled pair")
    if people.open_pairs:
        to_finish = ("no timed vote yet to forecast from" if people.minutes_to_finish is None else
                     f"about {people.minutes_to_finish:.1f} min, {_money(people.cost_to_finish, rate)} "
                     "at the median")
        lines.append(f"  to finish: {people.open_pairs:,} escalated pair(s) need at least "
                     f"{people.votes_needed:,} more vote(s): {to_finish}")
    if llm_per_pair:
        lines.append(f"  beside the LLM: {llm_per_pair}")
    return lines
