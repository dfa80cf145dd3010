"""A client that lies about its bid cannot raise its utility: truthfulness through the Flower messages.

``test_auction.py`` proves the property on the pure auction function. Here every bid is placed by
a real ClientApp's bid policy, travels in a ``market_bid`` reply, goes through the server's
market phase, and the client learns whether it won and its payment from its ``market_award``
message (read back from its own ``context.state`` with :func:`read_award`). A client's utility is
``payment - true cost`` if it won, ``0`` otherwise; its true cost is its per-sample cost times its
number of samples. For each client, bidding its true cost is compared with many lies (shading
and inflating its bid by factors, and bidding just across its critical value). Every winner
passes its audit (its score is the true one), payments are capped at the budget and a bid above
the budget cannot win: none of that may make a lie pay.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Context
from hypothesis import given, settings
from hypothesis import strategies as st

from flmarket_flwr.market import MarketConfig, MarketPhase, read_award
from simulations.inprocess_grid import InProcessGrid, market_client_app

NUM_CLASSES = 6
FACTORS = (0.01, 0.3, 0.7, 0.9, 0.99, 1.01, 1.1, 1.5, 3.0, 50.0)


def make_market(num_nodes: int, seed: int) -> tuple[dict[int, np.ndarray], dict[int, float]]:
    """Label counts and true costs (per-sample cost drawn per node, times the node's volume)."""
    rng = np.random.default_rng(seed)
    counts = {300 + 7 * i: rng.integers(0, 60, size=NUM_CLASSES) + 1 for i in range(num_nodes)}
    costs = {node: float(rng.uniform(0.02, 0.2) * counts[node].sum()) for node in counts}
    return counts, costs


class Bids:
    """Bid policy of every node: its true cost, except ``lies`` (node -> bid actually placed)."""

    def __init__(self, costs: dict[int, float], lies: dict[int, float] | None = None) -> None:
        self.costs = costs
        self.lies = lies or {}

    def __call__(self, label_counts: np.ndarray, score: float, context: Context) -> float:
        return self.lies.get(context.node_id, self.costs[context.node_id])


def utilities(counts, costs, lies, **config) -> tuple[dict[int, float], dict[int, tuple[bool, float]], object]:
    """Run the market through Flower messages; each node's utility from its own award message."""
    grid = InProcessGrid(market_client_app(counts, Bids(costs, lies)), list(counts))
    outcome = MarketPhase(MarketConfig(num_classes=NUM_CLASSES, poll_interval=0.001, **config)).run(grid)
    awards = {}
    for node in counts:
        award = read_award(grid.context(node))
        assert award is not None, f"node {node} got no award message"
        awards[node] = (award.won, award.payment)
    utility = {node: (pay - costs[node]) if won else 0.0 for node, (won, pay) in awards.items()}
    return utility, awards, outcome


def assert_no_profitable_lie(counts, costs, node: int, bids: list[float], **config) -> int:
    honest, honest_awards, _ = utilities(counts, costs, {}, **config)
    scale = max(costs.values())
    for bid in bids:
        lying, awards, outcome = utilities(counts, costs, {node: bid}, **config)
        assert outcome.bids[node] == bid, "the lie must be what the server received"
        assert lying[node] <= honest[node] + 1e-9 * scale, (
            f"node {node}: bidding {bid:.6g} instead of its cost {costs[node]:.6g} raised its utility "
            f"from {honest[node]:.6g} to {lying[node]:.6g}"
        )
        won, payment = awards[node]
        if won and honest_awards[node][0]:
            # A winner's payment does not depend on its own bid (it is the critical value).
            assert payment == pytest.approx(honest_awards[node][1], rel=1e-9)
    return len(bids)


def lies_for(node: int, costs: dict[int, float], honest_awards: dict[int, tuple[bool, float]]) -> list[float]:
    bids = [costs[node] * f for f in FACTORS]
    won, payment = honest_awards[node]
    if won:  # just below and just above its critical value
        bids += [payment * (1 - 1e-6), payment * (1 + 1e-6)]
    return bids


@pytest.mark.parametrize(
    "config",
    [{"budget": 40.0}, {"budget": 400.0}, {"budget": 60.0, "num_winners": 3}],
    ids=["tight-budget", "loose-budget", "fixed-cohort"],
)
def test_no_client_gains_by_lying_about_its_bid(config: dict) -> None:
    counts, costs = make_market(7, seed=len(config) * 10 + int(config["budget"]))
    _, honest_awards, honest_outcome = utilities(counts, costs, {}, **config)
    winners = set(honest_outcome.winners)
    assert winners and winners != set(counts), "the instance must have winners and losers"
    for node, (won, payment) in honest_awards.items():
        assert won == (node in winners)
        assert payment >= costs[node] if won else payment == 0.0  # individually rational
        assert payment <= config["budget"]
    assert sorted(honest_outcome.audited) == sorted(winners)
    tried = 0
    for node in counts:
        tried += assert_no_profitable_lie(counts, costs, node, lies_for(node, costs, honest_awards), **config)
    assert tried >= 7 * len(FACTORS)


@settings(max_examples=6, deadline=None, derandomize=True, database=None)
@given(
    seed=st.integers(0, 10_000),
    num_nodes=st.integers(4, 9),
    budget=st.floats(5.0, 500.0),
    liar_position=st.integers(0, 8),
    factor=st.floats(0.05, 20.0),
)
def test_random_markets_random_lie(seed: int, num_nodes: int, budget: float, liar_position: int, factor: float) -> None:
    counts, costs = make_market(num_nodes, seed)
    liar = sorted(counts)[liar_position % num_nodes]
    assert_no_profitable_lie(counts, costs, liar, [costs[liar] * factor], budget=budget)
