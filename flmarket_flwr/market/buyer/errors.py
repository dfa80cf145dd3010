"""The market phase's error, shared by the server steps and the PASS rounds."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flmarket_flwr.market.buyer.config import MarketOutcome

__all__ = ["MarketError"]


class MarketError(RuntimeError):
    """The market phase cannot complete (too few clients, PASS unrecoverable, bounds failed, no bids).

    Attributes
    ----------
    outcome : MarketOutcome or None
        The failed market's record (status ``"failed"``, the reason, who was excluded at which step and why),
        attached by :meth:`~flmarket_flwr.market.MarketPhase.run`; ``None`` where it was not run.
    """

    outcome: MarketOutcome | None = None
