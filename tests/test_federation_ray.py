"""The re-launching market under Flower's Ray simulation: an excluded node is never messaged, each re-launch is
checked against the one run budget, and re-launching stops, with one line, once every node has released.

About 20 s, Ray start-up dominating (slow: ``tests/conftest.py``). The scenario suite on the in-process grid is
``tests/test_federation_scenarios.py``; this runs the same strategy on Flower's ``InMemoryGrid`` and Ray backend
(nodes absent when ``main`` starts, contexts kept by the runtime).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from flmarket_flwr.market import FLMarket, MarketConfig, MarketPhase, SimulatedCostBid, register_market_handlers
from flmarket_flwr.market.buyer.relaunch import RelaunchPolicy

NUM_CLASSES = 10
NUM_NODES = 6
BUDGET = 60.0


def counts_of(partition_id: int) -> np.ndarray:
    return np.random.default_rng(partition_id).integers(0, 50, NUM_CLASSES)


def test_a_relaunching_market_in_a_ray_simulation(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from simulations.run import simulate_in_process

    inbox = tmp_path / "inbox"
    inbox.mkdir()

    def counting(message: Message, context: Context, call_next):  # type: ignore[no-untyped-def]
        """Every message a node is sent, one line in its own file (Ray's workers share this machine)."""
        with (inbox / str(context.node_id)).open("a", encoding="utf-8") as file:
            file.write(message.metadata.message_type + "\n")
        return call_next(message, context)

    client = ClientApp(mods=[counting])
    register_market_handlers(
        client,
        lambda context: counts_of(int(context.node_config["partition-id"])),
        SimulatedCostBid(seed=1, low=0.01, high=0.05),
    )

    @client.train()
    def train(message: Message, context: Context) -> Message:
        weights = message.content["arrays"]["w"].numpy()
        metrics = MetricRecord({"num-examples": 10})
        return Message(
            RecordDict({"arrays": ArrayRecord({"w": Array(weights + 1)}), "metrics": metrics}), reply_to=message
        )

    results: dict[str, object] = {}
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        base = MarketConfig(budget=BUDGET, num_classes=NUM_CLASSES, expected_nodes=NUM_NODES, timeout=60)
        nodes = MarketPhase(base).wait_for_nodes(grid)
        excluded = sorted(nodes)[0]
        config = MarketConfig(
            budget=BUDGET, num_classes=NUM_CLASSES, expected_nodes=NUM_NODES, timeout=60, exclude=(excluded,)
        )
        strategy = FLMarket(FedAvg(fraction_evaluate=0.0), market_config=config, relaunch=RelaunchPolicy(1))
        strategy.start(grid=grid, initial_arrays=ArrayRecord({"w": Array(np.zeros(2))}), num_rounds=3)
        results.update(strategy=strategy, excluded=excluded, nodes=nodes)

    with caplog.at_level(logging.WARNING):
        simulate_in_process(
            server,
            client,
            num_supernodes=NUM_NODES,
            backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}, "init_args": {"num_cpus": 2}},
        )

    strategy = results["strategy"]
    assert isinstance(strategy, FLMarket)
    received = {int(path.name): Counter(path.read_text().split()) for path in inbox.iterdir()}
    assert results["excluded"] not in received  # excluded by id: not one message of any kind
    first = strategy.markets[0].outcome
    assert first.status == "succeeded" and sorted(first.pass_participants) == sorted(received)
    # The re-launch before round 2 has nobody left who may release (one release per node per run by default): it is
    # skipped before PASS, and re-launching stops with one line; nobody is sent another market message.
    assert [entry.outcome.status for entry in strategy.markets] == ["succeeded", "skipped"]
    assert "can take part" in strategy.markets[1].outcome.reason
    stops = [r.getMessage() for r in caplog.records if "re-launching stops" in r.getMessage()]
    assert len(stops) == 1 and "have released their counts once this run" in stops[0]
    for node, messages in received.items():
        assert messages["query.market_advertise"] == 1, (node, messages)
        assert messages["train"] == (3 if node in first.cohort else 0)
    assert math.fsum(strategy.settled_across_markets().values()) <= BUDGET * (1 + 1e-12)
