"""The Flower side of FLMarket: the market phase over the Message API, client handlers, winners-only grid.

Server (inside ``@app.main()``)::

    strategy = FLMarket(FedAvg(), budget=600.0, num_classes=10)
    result = strategy.start(grid=grid, initial_arrays=arrays, num_rounds=10)

Client::

    register_market_handlers(client_app, label_counts, CostBasedBid(0.01))  # a Message-API ClientApp
    ClientApp(client_fn=client_fn, mods=[market_mod(label_counts)])  # a ClientApp built with a client_fn

Inside, the buyer's modules (:mod:`.buyer`) and the node's (:mod:`.node`) never import each other; they meet at
:mod:`.wire`, what both read (``docs/layout.md``). This module is the public API over the three.
"""

from flmarket_flwr.market.buyer.config import MarketConfig, MarketOutcome
from flmarket_flwr.market.buyer.delivery import DeliveryLedger, DeliveryRecord
from flmarket_flwr.market.buyer.errors import MarketError
from flmarket_flwr.market.buyer.grid_view import NoWinnerConnectedError, WinnersGrid
from flmarket_flwr.market.buyer.relaunch import RelaunchPolicy
from flmarket_flwr.market.buyer.server import MarketPhase
from flmarket_flwr.market.buyer.strategy import FLMarket
from flmarket_flwr.market.node.bidding import (
    DEFAULT_COST_PER_SAMPLE,
    BidPolicy,
    BucketedCostBid,
    CostBasedBid,
    NoBidError,
    SimulatedCostBid,
    simulated_cost_per_sample,
)
from flmarket_flwr.market.node.client import MarketAward, read_award, register_market_handlers
from flmarket_flwr.market.node.labels import label_counts
from flmarket_flwr.market.node.mod import market_mod
from flmarket_flwr.market.wire.ledger import ReleaseLedger, RosterHistory, plan_roster

__all__ = [
    "DEFAULT_COST_PER_SAMPLE",
    "BidPolicy",
    "BucketedCostBid",
    "CostBasedBid",
    "DeliveryLedger",
    "DeliveryRecord",
    "FLMarket",
    "MarketAward",
    "MarketConfig",
    "MarketError",
    "MarketOutcome",
    "MarketPhase",
    "NoBidError",
    "NoWinnerConnectedError",
    "RelaunchPolicy",
    "ReleaseLedger",
    "RosterHistory",
    "SimulatedCostBid",
    "WinnersGrid",
    "label_counts",
    "market_mod",
    "plan_roster",
    "read_award",
    "register_market_handlers",
    "simulated_cost_per_sample",
]
