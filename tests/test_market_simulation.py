"""The market phase and WinnersGrid under Flower's real simulation runtime (Ray).

About 15 s, Ray start-up dominating. The rest of the market's tests drive real ClientApps through
``InProcessGrid`` without Ray; this one checks the same code (the four PASS v2 rounds, bid, audit and
award) against the real ``InMemoryGrid`` and Ray backend (nodes absent when ``main`` starts, message
ids set by the grid, contexts kept by the runtime).
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from flmarket_flwr.market import (
    MarketConfig,
    MarketOutcome,
    MarketPhase,
    SimulatedCostBid,
    WinnersGrid,
    read_award,
    register_market_handlers,
)

NUM_CLASSES = 10
NUM_NODES = 6


def counts_of(partition_id: int) -> np.ndarray:
    return np.random.default_rng(partition_id).integers(0, 50, NUM_CLASSES)


def test_market_then_fedavg_in_a_ray_simulation() -> None:
    from simulations.run import simulate_in_process

    client = ClientApp()
    register_market_handlers(
        client,
        lambda context: counts_of(int(context.node_config["partition-id"])),
        SimulatedCostBid(seed=1, low=0.01, high=0.05),
    )

    @client.train()
    def train(message: Message, context: Context) -> Message:
        award = read_award(context)
        weights = message.content["arrays"]["w"].numpy()
        metrics = MetricRecord({"num-examples": 10, "won": float(award is not None and award.won)})
        return Message(
            RecordDict({"arrays": ArrayRecord({"w": Array(weights + 1)}), "metrics": metrics}), reply_to=message
        )

    @client.evaluate()
    def evaluate(message: Message, context: Context) -> Message:
        return Message(RecordDict({"metrics": MetricRecord({"num-examples": 10, "loss": 0.5})}), reply_to=message)

    results: dict[str, object] = {}
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        config = MarketConfig(budget=60.0, num_classes=NUM_CLASSES, expected_nodes=NUM_NODES, timeout=60)
        outcome = MarketPhase(config).run(grid)
        results["outcome"] = outcome
        if outcome.winners:
            strategy = FedAvg(min_available_nodes=len(outcome.winners), min_train_nodes=1, min_evaluate_nodes=1)
            results["fl"] = strategy.start(
                grid=WinnersGrid(grid, outcome.winners, seed=0),
                initial_arrays=ArrayRecord({"w": Array(np.zeros(2))}),
                num_rounds=2,
            )

    simulate_in_process(
        server,
        client,
        num_supernodes=NUM_NODES,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}, "init_args": {"num_cpus": 2}},
    )

    outcome = results["outcome"]
    assert isinstance(outcome, MarketOutcome)
    expected = np.sum([counts_of(p) for p in range(NUM_NODES)], axis=0)
    assert outcome.global_counts == expected.tolist()
    assert len(outcome.pass_participants) == NUM_NODES
    assert outcome.excluded == {}
    assert outcome.winners and outcome.total_payment <= 60.0
    assert sorted(outcome.audited) == sorted(outcome.winners)  # each winner opened its PASS commitment
    assert outcome.award_acknowledged == outcome.pass_participants  # every node told, PASS state wiped
    fl = results["fl"]
    for round_number in (1, 2):
        assert fl.train_metrics_clientapp[round_number]["won"] == pytest.approx(1.0)  # type: ignore[attr-defined]
