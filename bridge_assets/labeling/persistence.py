"""Debate persistence: what becomes of a debate's agreement when its agents keep debating
(`bridge label-eval --method dream --persistence R`; the DREAM paper's Table 9 and its rounds
ablation).

The pipeline's debate stops at the first round whose agents agree. In persistence mode
(`run_debate(..., persistence=R)`) every pair is debated to round R whatever its agents say (a
failed turn still ends it), and its turns give two tables:

- **survival**, per round r: the pairs debating and agreeing, those whose agents agree for the
  first time (`reached`: the consensus the debate would stop at), and of those how many still
  agree on the same answer in every round from r to s (`held[s]`, each later round s); the
  others broke at their first round without that agreement, because the agents all moved to
  the other answer (`reversed`), disagree (`split`), or a turn failed (`lost`). `survived` is
  `held[R]`: the consensus holds to the last round.
- **flips**, per round r >= 2 and opening stance: the turns whose answer differs from the same
  agent's answer in round r-1, relevant -> irrelevant (yes -> no) and irrelevant -> relevant,
  among all turns and among those of pairs whose agents had already agreed (a consensus
  being undone).

`from_ledger`: the round's turns the LLM call ledger answered (an earlier run's calls, e.g.
the rounds a stopping debate already asked), when the caller knows. Yes/no debates only: a
grade has no flip direction.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from bridge_assets.labeling.debate_turns import Turn

STANCES = ("relevant", "irrelevant")
SPLIT = "split"  # a round whose agents answered but disagree


@dataclass(frozen=True)
class SurvivalRow:
    """Round r of the survival table (see the module docstring)."""

    round: int
    debating: int                 # pairs with turns in this round
    failed: int                   # of those, with a turn that failed
    agreeing: int                 # every agent gives the same answer
    reached: int                  # agreeing for the first time
    reached_relevant: int         # of those, on "yes"
    held: dict[int, int]          # later round s -> reached pairs agreeing on the same answer r..s
    reversed: int                 # broke: every agent gave the other answer
    split: int                    # broke: the agents disagree
    lost: int                     # broke: a turn failed (the pair's debate ended)
    turns: int                    # turns asked in this round
    from_ledger: int | None       # of those, answered by the call ledger (None: not known)

    @property
    def survived(self) -> int | None:
        """Reached pairs that agree on the same answer to the last round (None in the last)."""
        return self.held[max(self.held)] if self.held else None

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "survived": self.survived,
                "survival_rate": None if self.survived is None or not self.reached
                else self.survived / self.reached}


@dataclass(frozen=True)
class FlipRow:
    """Round r, one opening stance, of the flip table (see the module docstring)."""

    round: int
    stance: str
    turns: int                          # answered turns whose agent answered round r-1 too
    to_irrelevant: int                  # yes -> no
    to_relevant: int                    # no -> yes
    after_consensus_turns: int          # of `turns`, in pairs whose agents had agreed before r
    after_consensus_to_irrelevant: int
    after_consensus_to_relevant: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DebatePersistence:
    rounds: int
    pairs: int
    survival: list[SurvivalRow]
    flips: list[FlipRow]

    def as_dict(self) -> dict[str, Any]:
        return {"rounds": self.rounds, "pairs": self.pairs,
                "survival": [row.as_dict() for row in self.survival],
                "flips": [row.as_dict() for row in self.flips]}


def round_answer(turns: Sequence[Turn]) -> str | None:
    """A round's answer on one pair: the agents' common answer, SPLIT when they disagree, None
    when a turn failed or the pair has no turns in the round."""
    if not turns or any(t.response is None for t in turns):
        return None
    answers = {t.response for t in turns}
    return answers.pop() if len(answers) == 1 else SPLIT


def debate_persistence(turns: Sequence[Turn], rounds: int,
                       from_ledger: Mapping[str, bool] | None = None) -> DebatePersistence:
    """The survival and flip tables of a debate's `turns` (every round, the continued ones
    included: `DebateOutcome.all_turns()`) over rounds 1..`rounds`. `from_ledger`: call key ->
    whether the ledger answered it."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    grades = {t.response for t in turns if t.response is not None} - {"yes", "no"}
    if grades:
        raise ValueError(f"persistence counts yes/no answers; these turns answer {sorted(grades)} "
                         "(a graded debate)")
    by_pair: dict[tuple[str, str], dict[int, list[Turn]]] = defaultdict(lambda: defaultdict(list))
    for turn in turns:
        by_pair[(turn.query_id, turn.doc_id)][turn.round].append(turn)
    answers = {pair: {r: round_answer(rounds_[r]) for r in range(1, rounds + 1)}
               for pair, rounds_ in by_pair.items()}
    first_agreed = {pair: next((r for r in range(1, rounds + 1) if a[r] in ("yes", "no")), None)
                    for pair, a in answers.items()}
    survival = []
    for r in range(1, rounds + 1):
        asked = [t for t in turns if t.round == r]
        debating = [pair for pair in by_pair if by_pair[pair].get(r)]
        reached = [pair for pair in debating if first_agreed[pair] == r]
        held = {s: 0 for s in range(r + 1, rounds + 1)}
        broke = {"reversed": 0, "split": 0, "lost": 0}
        for pair in reached:
            agreed = answers[pair][r]
            for s in range(r + 1, rounds + 1):
                answer = answers[pair][s]
                if answer != agreed:
                    broke["lost" if answer is None else "split" if answer == SPLIT else "reversed"] += 1
                    break
                held[s] += 1
        survival.append(SurvivalRow(
            round=r, debating=len(debating),
            failed=sum(1 for pair in debating if answers[pair][r] is None),
            agreeing=sum(1 for pair in debating if answers[pair][r] in ("yes", "no")),
            reached=len(reached), reached_relevant=sum(1 for p in reached if answers[p][r] == "yes"),
            held=held, **broke, turns=len(asked),
            from_ledger=None if from_ledger is None
            else sum(1 for t in asked if from_ledger.get(t.call_key, False))))
    return DebatePersistence(rounds, len(by_pair), survival, _flips(by_pair, first_agreed, rounds))


def _flips(by_pair: Mapping[tuple[str, str], Mapping[int, list[Turn]]],
           first_agreed: Mapping[tuple[str, str], int | None], rounds: int) -> list[FlipRow]:
    counts: dict[tuple[int, str], dict[str, int]] = {
        (r, stance): defaultdict(int) for r in range(2, rounds + 1) for stance in STANCES}
    for pair, pair_rounds in by_pair.items():
        for r in range(2, rounds + 1):
            before = {t.agent: t.response for t in pair_rounds.get(r - 1, ()) if t.response is not None}
            agreed_before = first_agreed[pair] is not None and first_agreed[pair] < r  # type: ignore[operator]
            for turn in pair_rounds.get(r, ()):
                if turn.stance not in STANCES or turn.response is None or turn.agent not in before:
                    continue
                row = counts[(r, turn.stance)]
                change = (before[turn.agent], turn.response)
                for prefix in ("", "after_consensus_") if agreed_before else ("",):
                    row[f"{prefix}turns"] += 1
                    row[f"{prefix}to_irrelevant"] += change == ("yes", "no")
                    row[f"{prefix}to_relevant"] += change == ("no", "yes")
    return [FlipRow(round=r, stance=stance, **{key: row[key] for key in (
                "turns", "to_irrelevant", "to_relevant", "after_consensus_turns",
                "after_consensus_to_irrelevant", "after_consensus_to_relevant")})
            for (r, stance), row in counts.items()]


def format_persistence(table: DebatePersistence, indent: str = "") -> str:
    """The two tables as plain text (what `bridge label-eval --persistence R` prints)."""
    later = list(range(2, table.rounds + 1))
    head = (f"{'round':>5}{'debating':>10}{'agreeing':>10}{'reached':>9}{'(yes)':>7}"
            + "".join(f"{f'held@{s}':>9}" for s in later)
            + f"{'survived':>10}{'reversed':>10}{'split':>7}{'lost':>6}{'turns':>7}{'ledger':>8}")
    lines = [f"{indent}consensus survival ({table.pairs} pairs debated to round {table.rounds} "
             "whatever they agreed; `reached`: first agreement at that round)", indent + head]
    for row in table.survival:
        survived = "-" if row.survived is None or not row.reached else \
            f"{row.survived} ({100 * row.survived / row.reached:.0f}%)"
        lines.append(indent + f"{row.round:>5}{row.debating:>10}{row.agreeing:>10}{row.reached:>9}"
                     f"{row.reached_relevant:>7}"
                     + "".join(f"{row.held[s] if s in row.held else '-':>9}" for s in later)
                     + f"{survived:>10}{row.reversed:>10}{row.split:>7}{row.lost:>6}{row.turns:>7}"
                     f"{'-' if row.from_ledger is None else row.from_ledger:>8}")
    lines += [f"{indent}flips by opening stance (rel->irr: yes -> no; after consensus: in pairs "
              "already agreed)",
              indent + f"{'round':>5}  {'stance':<11}{'turns':>6}{'rel->irr':>10}{'irr->rel':>10}"
              f"{'| after consensus: turns':>25}{'rel->irr':>10}{'irr->rel':>10}"]
    for flip in table.flips:
        lines.append(indent + f"{flip.round:>5}  {flip.stance:<11}{flip.turns:>6}{flip.to_irrelevant:>10}"
                     f"{flip.to_relevant:>10}{flip.after_consensus_turns:>25}"
                     f"{flip.after_consensus_to_irrelevant:>10}{flip.after_consensus_to_relevant:>10}")
    return "\n".join(lines)
