"""The in-process grid is a test harness outside the plugin: it runs a market as Flower's runtimes would, and
leaves Flower's process-wide task identity to the code that plays the ServerApp (:func:`serverapp_identity`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity

from flmarket_flwr.market import CostBasedBid, MarketConfig, MarketPhase
from simulations.inprocess_grid import DEFAULT_RUN_ID, InProcessGrid, market_client_app, serverapp_identity

PACKAGE = Path(__file__).resolve().parents[1] / "flmarket_flwr"


def _identity() -> tuple[int, int, int]:
    return TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id


def test_a_market_through_the_grid_leaves_flowers_task_identity_as_it_was() -> None:
    """The test plays the ServerApp of run 1 (conftest); grids of other runs, built and run, change nothing."""
    before = _identity()
    assert before == (1, DEFAULT_RUN_ID, SUPERLINK_NODE_ID)
    rng = np.random.default_rng(0)
    counts = {node: rng.integers(1, 60, size=4) for node in (11, 22, 33, 44, 55)}
    app = market_client_app(counts, CostBasedBid(0.05))
    outcome = MarketPhase(MarketConfig(budget=100.0, num_classes=4, poll_interval=0.001)).run(
        InProcessGrid(app, list(counts))
    )
    assert outcome.winners and _identity() == before
    InProcessGrid(app, list(counts), run_id=42)
    assert _identity() == before


def test_serverapp_identity_sets_the_run_for_its_block_and_puts_back_what_was_there() -> None:
    outer = _identity()
    with serverapp_identity(42):
        assert _identity() == (1, 42, SUPERLINK_NODE_ID)
        with serverapp_identity(7):
            assert TaskIdentity.run_id == 7
        assert TaskIdentity.run_id == 42
    assert _identity() == outer


def test_no_module_of_the_package_touches_flowers_task_identity() -> None:
    """A process's identity is its runtime's to set (Flower's, or a test harness's), never the plugin's or the app's."""
    found = [path.name for path in sorted(PACKAGE.rglob("*.py")) if "TaskIdentity" in path.read_text(encoding="utf-8")]
    assert not found
