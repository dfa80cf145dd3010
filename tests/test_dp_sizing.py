"""docs/usage.md's Flower DP wrapper sized from the market (issue 44, item 6): the block as written builds the
wrapper for the market's cohort, every round trains that cohort and the noise is sized for it; a wrapper sized up
front for a cap the budget does not reach is not."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, MessageType
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg
from test_grid_view import NUM_CLASSES, make_counts, training_app

from flmarket_flwr.market import FLMarket, MarketConfig
from simulations.inprocess_grid import InProcessGrid

PROJECT = Path(__file__).resolve().parents[1]
NOISE_MULTIPLIER, CLIPPING_NORM = 1.0, 10.0  # the documented block's


def documented_block() -> str:
    text = (PROJECT / "docs" / "usage.md").read_text(encoding="utf-8")
    section = text.split("**Flower's DP wrappers: `num_sampled_clients` from the market.**", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, flags=re.S)
    assert block is not None and "num_sampled_clients=len(view.node_ids)" in block.group(1)
    return block.group(1)


def grid_of(num_nodes: int = 6) -> InProcessGrid:
    counts = make_counts(num_nodes, seed=3)
    return InProcessGrid(training_app(counts), list(counts))


def noise_logged(text: str) -> list[float]:
    return [float(value) for value in re.findall(r"central DP noise with ([\d.]+) stdev added", text)]


@pytest.mark.parametrize("budget", [8.0, 3.0], ids=["three-win", "one-wins"])
def test_the_documented_block_sizes_the_dp_wrapper_to_the_markets_cohort(
    budget: float, caplog: pytest.LogCaptureFixture
) -> None:
    """Budget 8 buys 3 of the six, budget 3 one: the cohort's size is the market's to decide (with one, FedAvg's own
    minimum of two nodes inside the wrapper is capped too, or it would wait for ever)."""
    grid = grid_of()
    namespace = {
        "grid": grid,
        "budget": budget,
        "num_classes": NUM_CLASSES,
        "initial_arrays": ArrayRecord({"w": Array(np.zeros(3))}),
        "num_rounds": 2,
    }
    with caplog.at_level(logging.INFO, logger="flwr"):
        exec(documented_block(), namespace)  # noqa: S102  (the documentation's own code)

    cohort = list(namespace["view"].node_ids)
    assert len(cohort) == {8.0: 3, 3.0: 1}[budget], cohort
    assert namespace["dp"].num_sampled_clients == len(cohort)
    trained = [m.metadata.dst_node_id for m in grid.sent if m.metadata.message_type == MessageType.TRAIN]
    assert sorted(trained) == sorted(cohort * 2), "each round trains the whole cohort, and nobody else"
    assert noise_logged(caplog.text) == [pytest.approx(NOISE_MULTIPLIER * CLIPPING_NORM / len(cohort), abs=1e-4)] * 2
    assert "differs from the number of sampled clients" not in caplog.text


def test_a_wrapper_sized_for_a_cap_the_budget_does_not_reach_gets_the_wrong_size(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cap = 5
    dp = DifferentialPrivacyServerSideFixedClipping(
        FedAvg(fraction_train=1.0), NOISE_MULTIPLIER, CLIPPING_NORM, num_sampled_clients=cap
    )
    market = FLMarket(dp, market_config=MarketConfig(budget=8.0, num_classes=NUM_CLASSES, num_winners=cap))
    with caplog.at_level(logging.INFO, logger="flwr"):
        market.start(grid=grid_of(), initial_arrays=ArrayRecord({"w": Array(np.zeros(3))}), num_rounds=1)

    assert market.market_outcome is not None
    cohort = market.market_outcome.cohort
    assert len(cohort) == 3 < cap
    assert noise_logged(caplog.text) == [pytest.approx(NOISE_MULTIPLIER * CLIPPING_NORM / cap, abs=1e-4)]
    assert f"parameters ({len(cohort)}) differs from the number of sampled clients ({cap})" in caplog.text
