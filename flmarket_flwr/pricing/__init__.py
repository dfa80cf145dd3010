"""Pricing: the data value score and the truthful, budget-feasible reverse auction.

Pure numpy: nothing here imports Flower, so the mathematics can be read and tested alone.
"""

from flmarket_flwr.pricing.auction import BUDGET_RULES, AuctionResult, auction_order, cohort_budget, run_auction
from flmarket_flwr.pricing.score import alpha, phi, score, theta

__all__ = [
    "BUDGET_RULES",
    "AuctionResult",
    "alpha",
    "auction_order",
    "cohort_budget",
    "phi",
    "run_auction",
    "score",
    "theta",
]
