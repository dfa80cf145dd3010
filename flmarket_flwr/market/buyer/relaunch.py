"""When to run the market again inside one Flower run, and with how much of the run's budget.

:class:`RelaunchPolicy` says whether a re-launch is due before a round, and why (every N rounds, on churn, on a
shrunken cohort, on request); ``FLMarket`` asks it before every train round once the first market has run.
:func:`budget_left` is the one rule for what a re-launch's auction may spend. Pure: no Flower.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Final

__all__ = ["RELAUNCH_METRIC", "Commitment", "RelaunchPolicy", "budget_left"]

RELAUNCH_METRIC: Final = "market-relaunch"
"""A wrapped strategy asks for a re-launch by returning this key, non-zero, in its aggregated train metrics."""


@dataclass(frozen=True)
class RelaunchPolicy:
    """When ``FLMarket`` runs the market again between rounds (every criterion at ``0`` is off).

    Parameters
    ----------
    every_rounds : int (default: 0)
        Re-launch every this many rounds after the last market (attempted or run).
    churn_fraction : float (default: 0.0)
        Re-launch when the nodes that joined or left since the last market are more than this fraction of the
        nodes connected then.
    min_cohort : int (default: 0)
        Re-launch when fewer than this many of the cohort (winners and included nodes) are connected.
    market_share : float (default: 1.0)
        The most any one market's auction may spend, as a share of the run's budget ``R``, in ``(0, 1]``: each
        market gets ``min(market_share * R, what is left of R)``. At ``1.0`` the first market may spend all of
        ``R`` (under the whole-budget rule it spends close to all of it, leaving little for re-launches); at
        ``0.5`` the first market buys with half of ``R`` (a smaller first cohort: fewer winners, each paid the same
        price per unit of score as the auction at that budget sets) and keeps the rest for later markets.

    A wrapped strategy may also ask (:data:`RELAUNCH_METRIC`, or ``FLMarket.request_market``), whatever the
    criteria. Each re-launch is another PASS release of the global counts: nodes join it only with a release
    ledger and a privacy budget (the secure profile), which composes the releases' noise.
    """

    every_rounds: int = 0
    churn_fraction: float = 0.0
    min_cohort: int = 0
    market_share: float = 1.0

    def __post_init__(self) -> None:
        """Check each criterion; a ``ValueError`` names the field (the app's run-config schema names its key)."""
        for name in ("every_rounds", "min_cohort"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0 (0: off), got {value!r}")
        churn = self.churn_fraction
        if isinstance(churn, bool) or not isinstance(churn, (int, float)) or not 0 <= churn < math.inf:
            raise ValueError(f"churn_fraction must be a finite number >= 0 (0: off), got {churn!r}")
        share = self.market_share
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
            raise ValueError(f"market_share must be a number in (0, 1], got {share!r}")

    def market_budget(self, run_budget: float, left: float) -> float:
        """What one market's auction may spend: ``min(market_share * run_budget, left)``."""
        return min(self.market_share * run_budget, left)

    @property
    def enabled(self) -> bool:
        """Whether any criterion is on."""
        return bool(self.every_rounds or self.churn_fraction or self.min_cohort)

    def reason(
        self,
        *,
        rounds_since: int,
        connected: Collection[int],
        at_last_market: Collection[int],
        cohort: Sequence[int],
        requested: str = "",
    ) -> str:
        """Why a re-launch is due before this round (``""``: it is not).

        Parameters
        ----------
        rounds_since : int
            Train rounds since the last market (attempted or run).
        connected : Collection[int]
            The nodes connected now.
        at_last_market : Collection[int]
            The nodes connected at the last market.
        cohort : Sequence[int]
            The nodes the last market selected (winners and included nodes).
        requested : str
            Why the wrapped strategy asked for one (``""``: it did not).
        """
        if requested:
            return f"requested: {requested}"
        if self.every_rounds and rounds_since >= self.every_rounds:
            return f"{rounds_since} rounds since the last market (market-relaunch-every {self.every_rounds})"
        now, before = set(connected), set(at_last_market)
        changed = len(now ^ before)
        if self.churn_fraction and changed > self.churn_fraction * max(len(before), 1):
            return (
                f"{len(now - before)} node(s) joined and {len(before - now)} left of {len(before)} "
                f"(market-relaunch-churn {self.churn_fraction:g})"
            )
        present = len(set(cohort) & now)
        if self.min_cohort and present < self.min_cohort:
            return f"{present} of the cohort connected (market-relaunch-min-cohort {self.min_cohort})"
        return ""


@dataclass(frozen=True)
class Commitment:
    """What one market of the run owes.

    Parameters
    ----------
    awarded : float
        The sum of its payments (winners and included nodes), as awarded.
    settled : float
        What they are settled at now (:meth:`~flmarket_flwr.market.DeliveryLedger.settle`: the awards, or on
        delivery their delivered share), at most ``awarded``.
    in_force : bool
        Whether its cohort still trains.
    """

    awarded: float
    settled: float
    in_force: bool


def budget_left(run_budget: float, markets: Iterable[Commitment], *, keep_in_force: bool) -> tuple[float, float]:
    """What a re-launch's auction may spend of ``run_budget``, and what the earlier markets are committed to.

    A market whose cohort no longer trains owes what it is settled at. A market in force owes its whole award when
    it goes on training beside the new one (``keep_in_force``: the newcomers' market of the default profile), and
    what it is settled at now when the new market replaces it (if the new market fails, it goes on training, but
    the new one then pays nothing, and its whole award fitted what was left when it was bought). Either way the
    run's settled total never exceeds ``run_budget`` when every market's auction keeps within what it was given.

    Returns
    -------
    tuple[float, float]
        ``(left, committed)``, ``left = run_budget - committed`` (may be ``<= 0``: nothing to spend).
    """
    owed = [market.awarded if keep_in_force and market.in_force else market.settled for market in markets]
    committed = math.fsum(owed)
    return float(run_budget) - committed, committed
