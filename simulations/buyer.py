"""What a buyer reads off a grid's records: what each arm spent against the budget, and the time to an accuracy.

:func:`spend` prices every arm's clients at the bids its auction saw (``engine.bids_for`` on the record's config),
:func:`time_to` is the first round at which a run reaches an accuracy and the CPU seconds to it; both read records
only (no re-run). :mod:`simulations.main_grid` writes them into its report.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from simulations.stats import Record

PAPER_ROUNDS_TO_60 = {"flmarket": 130, "rs": 550, "dice": 170}
"""The paper's rounds to 0.6 accuracy (its convergence figure): FLMarket about 130, RS 550, DICE 170."""

CENSORED = math.inf
"""The rounds of a run that never reaches the accuracy (it ranks after every run that does)."""


@dataclass(frozen=True)
class TimeTo:
    """When one run first reaches an accuracy.

    Attributes
    ----------
    rounds : float
        The first round (1-based) with test accuracy at least the threshold; :data:`CENSORED` if none.
    seconds : float
        The run's seconds through that round (through its last round when censored).
    cpu : bool
        Whether ``seconds`` are process CPU seconds (``cpu_s``) or, for records without them, wall seconds of
        training and evaluation (``round_time_s + eval_time_s``).
    """

    rounds: float
    seconds: float
    cpu: bool

    @property
    def reached(self) -> bool:
        """Whether the run reached the accuracy."""
        return math.isfinite(self.rounds)


def time_to(record: Record, accuracy: float) -> TimeTo:
    """The first round of ``record`` at which its test accuracy reaches ``accuracy`` (a share, not points).

    Raises
    ------
    ValueError
        ``accuracy`` outside ``(0, 1]``.
    """
    if not 0.0 < accuracy <= 1.0:
        raise ValueError(f"accuracy must lie in (0, 1], got {accuracy}")
    rounds = record["rounds"][1:]  # round 0 is the initial model
    cpu = bool(rounds) and all("cpu_s" in r for r in rounds)
    seconds = 0.0
    for index, entry in enumerate(rounds, start=1):
        seconds += (
            float(entry["cpu_s"])
            if cpu
            else float(entry.get("round_time_s") or 0.0) + float(entry.get("eval_time_s") or 0.0)
        )
        value = entry.get("accuracy")
        if value is not None and math.isfinite(value) and value >= accuracy:
            return TimeTo(float(index), seconds, cpu)
    return TimeTo(CENSORED, seconds, cpu)


def median_rounds(times: Sequence[TimeTo]) -> float:
    """The median rounds over runs (censored runs later than every other); ``inf`` when the median is censored."""
    values = sorted(t.rounds for t in times)
    if not values:
        return math.nan
    middle = len(values) // 2
    if len(values) % 2:
        return values[middle]
    low, high = values[middle - 1], values[middle]
    return math.inf if math.isinf(high) else (low + high) / 2


def median_seconds(times: Sequence[TimeTo]) -> float:
    """The median seconds to the accuracy over the runs that reached it (NaN if none did)."""
    reached = [t.seconds for t in times if t.reached]
    return float(np.median(reached)) if reached else math.nan


def rank_differences(mine: Mapping[tuple[str, int], TimeTo], theirs: Mapping[tuple[str, int], TimeTo]) -> list[float]:
    """Paired differences of rounds (FLMarket minus the other arm), censored runs coded one round after the last.

    The coding keeps the signed-rank test valid: a censored run is slower than every run that reached the accuracy,
    and two censored runs tie.
    """
    shared = sorted(set(mine) & set(theirs))
    horizon = 1 + max((t.rounds for t in (*mine.values(), *theirs.values()) if t.reached), default=0.0)

    def coded(t: TimeTo) -> float:
        return t.rounds if t.reached else horizon

    return [coded(mine[key]) - coded(theirs[key]) for key in shared]


@dataclass(frozen=True)
class Spend:
    """What one arm's runs paid, or would pay at the clients' bids, against the budget ``R``.

    Attributes
    ----------
    paid_share : list of float
        Per run, the amount paid over ``R``: FLMarket's critical payments; a budget-matched baseline's bids
        (pay-as-bid); a cohort-matched baseline's cohort priced at its clients' bids (what it would cost pay-as-bid).
    clients : list of int
        Clients bought per run.
    rule : str
        How the amount was paid (``critical payments``, ``pay-as-bid``, ``cohort at its bids``).
    """

    paid_share: list[float]
    clients: list[int]
    rule: str

    @property
    def over_budget(self) -> int:
        """Runs whose amount exceeds ``R``."""
        return sum(share > 1.0 + 1e-12 for share in self.paid_share)


def spend(records: Sequence[Record]) -> Spend:
    """What the runs of one arm (one selector, one policy) paid against their budget ``R``.

    Raises
    ------
    ValueError
        A run without its budget (neither ``market.budget`` nor ``engine.matched.budget``), or runs of more than one
        payment rule.
    """
    # pylint: disable=import-outside-toplevel
    from simulations.engine import EngineConfig, bids_for

    shares, clients, rules = [], [], set()
    for record in records:
        chosen = [int(p) for p in record["selected_partitions"]]
        if record["selector"] == "flmarket":
            market = record.get("market", {})
            if "budget" not in market:
                raise ValueError(f"FLMarket run seed {record['seed']} {record['distribution']} has no market.budget")
            paid, budget, rule = float(market["total_payment"]), float(market["budget"]), "critical payments"
        else:
            matched = record.get("engine", {}).get("matched", {})
            if "budget" not in matched:
                raise ValueError(f"{record['selector']} run seed {record['seed']} has no engine.matched.budget")
            budget = float(matched["budget"])
            if matched.get("match") == "budget":
                paid, rule = float(matched["paid"]), "pay-as-bid"
            else:
                bids = bids_for(EngineConfig(**record["engine"]["config"]), np.asarray(record["all_label_counts"]))
                paid, rule = float(bids[chosen].sum()), "cohort at its bids"
        shares.append(paid / budget)
        clients.append(len(chosen))
        rules.add(rule)
    if len(rules) > 1:
        raise ValueError(f"runs of one arm paid by more than one rule: {sorted(rules)}")
    return Spend(shares, clients, rules.pop() if rules else "-")
