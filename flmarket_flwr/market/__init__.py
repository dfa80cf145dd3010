"""The Flower side of FLMarket: the market phase over the Message API, client handlers, winners-only grid.

Server (inside ``@app.main()``)::

    outcome = MarketPhase(MarketConfig(budget=100.0, num_classes=10)).run(grid)
    strategy.start(grid=WinnersGrid(grid, outcome.winners, seed=0), initial_arrays=arrays)

Client::

    register_market_handlers(client_app, get_label_counts=label_counts, bid_policy=CostBasedBid(0.01))
"""

from flmarket_flwr.market.bidding import (
    DEFAULT_COST_PER_SAMPLE,
    BidPolicy,
    CostBasedBid,
    NoBidError,
    SimulatedCostBid,
    simulated_cost_per_sample,
)
from flmarket_flwr.market.client import MarketAward, read_award, register_market_handlers
from flmarket_flwr.market.grid_view import NoWinnerConnectedError, WinnersGrid
from flmarket_flwr.market.messages import (
    ACTION_AWARD,
    ACTION_BID,
    ACTION_KEYS,
    ACTION_MASK,
    ACTIONS,
    RECORD_KEY,
    message_type,
)
from flmarket_flwr.market.server import MarketConfig, MarketError, MarketOutcome, MarketPhase, PassResult
from flmarket_flwr.market.strategy import FLMarket

__all__ = [
    "ACTIONS",
    "ACTION_AWARD",
    "ACTION_BID",
    "ACTION_KEYS",
    "ACTION_MASK",
    "DEFAULT_COST_PER_SAMPLE",
    "RECORD_KEY",
    "BidPolicy",
    "CostBasedBid",
    "FLMarket",
    "MarketAward",
    "MarketConfig",
    "MarketError",
    "MarketOutcome",
    "MarketPhase",
    "NoBidError",
    "NoWinnerConnectedError",
    "PassResult",
    "SimulatedCostBid",
    "WinnersGrid",
    "message_type",
    "read_award",
    "register_market_handlers",
    "simulated_cost_per_sample",
]
