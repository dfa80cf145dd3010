"""A client whose own label-count callback raises is reported as that, with the exception's type and
message, by the client's error reply and by the server's error: not as a key problem of PASS."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Context
from flwr.clientapp import ClientApp

from flmarket_flwr.market import CostBasedBid, MarketConfig, MarketError, MarketPhase, register_market_handlers
from simulations.inprocess_grid import InProcessGrid

C = 4
NODES = [11, 22, 33, 44, 55]


def load_data(partition_id: int, num_partitions: int, batch_size: int) -> np.ndarray:
    return np.arange(C) + partition_id


def app_with_callback(broken: set[int]) -> ClientApp:
    """Nodes in ``broken`` call ``load_data`` as Flower's older quickstart did: one argument short."""

    def get_label_counts(context: Context) -> np.ndarray:
        partition = int(context.node_config["partition-id"])
        if context.node_id in broken:
            return load_data(partition, int(context.node_config["num-partitions"]))  # type: ignore[call-arg]
        return load_data(partition, int(context.node_config["num-partitions"]), 32) + 5

    app = ClientApp()
    register_market_handlers(app, get_label_counts, CostBasedBid(0.1))
    return app


def market(**overrides: object) -> MarketPhase:
    values: dict[str, object] = {
        "budget": 50.0,
        "num_classes": C,
        "poll_interval": 0.001,
        "timeout": 2.0,
        "timeout_per_node": 0.0,
    }
    return MarketPhase(MarketConfig(**{**values, **overrides}))  # type: ignore[arg-type]


def test_every_callback_failing_names_the_callback_and_its_exception() -> None:
    grid = InProcessGrid(app_with_callback(set(NODES)), NODES)
    with pytest.raises(MarketError) as raised:
        market().run(grid)
    message = str(raised.value)
    assert message.startswith(f"the label-count callback failed on 5 client(s) {NODES}: get_label_counts raised ")
    assert "TypeError: load_data() missing 1 required positional argument: 'batch_size'" in message
    assert "advertised valid keys" in message  # the symptom comes after the cause


def test_one_failing_callback_excludes_that_client_with_its_reason() -> None:
    grid = InProcessGrid(app_with_callback({33}), NODES)
    outcome = market().run(grid)
    assert 33 not in outcome.pass_participants and set(outcome.excluded) == {33}
    reason = outcome.excluded[33]
    assert reason.startswith("market_advertise: error reply")
    assert reason.endswith(
        "flmarket: market_advertise: get_label_counts raised TypeError: "
        "load_data() missing 1 required positional argument: 'batch_size'"
    )


def test_other_refusals_stay_generic_and_other_failures_are_not_blamed_on_the_callback() -> None:
    wrong_shape = ClientApp()
    register_market_handlers(wrong_shape, lambda context: np.ones(C + 1, dtype=np.int64), CostBasedBid(0.1))
    with pytest.raises(MarketError) as raised:
        market().run(InProcessGrid(wrong_shape, NODES))
    assert "label-count callback" not in str(raised.value)
    assert str(raised.value).startswith("PASS stopped: only 0 clients advertised valid keys")
