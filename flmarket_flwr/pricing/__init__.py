"""Pricing: the data value score, the truthful, budget-feasible reverse auction, and the
pre-training client selectors (FLMarket and the RS, QBS, DICE, DDS baselines).

Pure numpy: nothing here imports Flower, so the mathematics can be read and tested alone.
"""

from flmarket_flwr.pricing.auction import AuctionResult, auction_order, cohort_budget, run_auction
from flmarket_flwr.pricing.score import alpha, phi, score, theta
from flmarket_flwr.pricing.selectors import (
    DDS_DIVERSITY_WEIGHT,
    DICE_VOLUME_WEIGHT,
    SELECTORS,
    dds_homogeneity,
    dice_quality,
    flmarket_scores,
    select_clients,
    select_dds,
    select_dice,
    select_flmarket,
    select_qbs,
    select_rs,
)

__all__ = [
    "AuctionResult",
    "alpha",
    "auction_order",
    "cohort_budget",
    "phi",
    "run_auction",
    "score",
    "theta",
    # Pre-training client selectors.
    "DDS_DIVERSITY_WEIGHT",
    "DICE_VOLUME_WEIGHT",
    "SELECTORS",
    "dds_homogeneity",
    "dice_quality",
    "flmarket_scores",
    "select_clients",
    "select_dds",
    "select_dice",
    "select_flmarket",
    "select_qbs",
    "select_rs",
]
