"""FLMarket, the strategy that wraps a strategy: the market, then the inner strategy on the winners only."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, MessageType
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
    FedAdam,
    FedAvg,
    FedProx,
    Result,
)
from test_grid_view import NUM_CLASSES, make_counts, training_app

from flmarket_flwr.market import FLMarket, MarketConfig, MarketError, WinnersGrid
from simulations.inprocess_grid import InProcessGrid

INITIAL = ArrayRecord({"w": Array(np.zeros(3))})


def market_grid(num_nodes: int = 6, seed: int = 3) -> InProcessGrid:
    """An in-process grid of ClientApps with the market handlers and a trivial train handler."""
    return InProcessGrid(training_app(make_counts(num_nodes, seed=seed)), list(make_counts(num_nodes, seed=seed)))


def receivers(grid: InProcessGrid, message_type: str) -> list[int]:
    """Destinations of every message of this type, in sending order."""
    return [m.metadata.dst_node_id for m in grid.sent if m.metadata.message_type == message_type]


def wrapped(inner, **market: object) -> FLMarket:
    """``FLMarket(inner)`` with a quick market (no waiting between node polls; a budget every bid fits in)."""
    config = MarketConfig(
        **{
            "budget": 1000.0,
            "num_classes": NUM_CLASSES,
            "poll_interval": 0.001,
            "wait_for_nodes_timeout": 0.0,
            **market,
        }
    )
    return FLMarket(inner, market_config=config, seed=0)


@pytest.mark.parametrize(
    "inner",
    [
        lambda: FedAvg(fraction_evaluate=1.0),
        lambda: FedProx(proximal_mu=0.1, fraction_evaluate=1.0),
        lambda: FedAdam(fraction_evaluate=1.0),
    ],
    ids=["FedAvg", "FedProx", "FedAdam"],
)
def test_inner_strategy_trains_the_winners_only(inner) -> None:
    grid = market_grid()
    strategy = wrapped(inner(), num_winners=3)
    result = strategy.start(grid=grid, initial_arrays=INITIAL, num_rounds=2, train_config=ConfigRecord({"lr": 0.1}))

    winners = strategy.market_outcome.winners
    assert len(winners) == 3
    assert sorted(receivers(grid, MessageType.TRAIN)) == sorted(winners * 2)
    assert set(receivers(grid, MessageType.EVALUATE)) == set(winners)
    assert result.train_metrics_clientapp[2]["won"] == pytest.approx(1.0)
    assert not np.allclose(result.arrays["w"].numpy(), 0.0)


def test_min_nodes_are_capped_during_start_and_restored() -> None:
    inner = FedAvg(min_train_nodes=5, min_evaluate_nodes=5, min_available_nodes=5)
    grid = market_grid()
    strategy = wrapped(inner, num_winners=2)
    strategy.start(grid=grid, initial_arrays=INITIAL, num_rounds=1)
    assert len(set(receivers(grid, MessageType.TRAIN))) == 2
    assert (inner.min_train_nodes, inner.min_evaluate_nodes, inner.min_available_nodes) == (5, 5, 5)


def test_one_winner_trains() -> None:
    grid = market_grid()
    strategy = wrapped(FedAvg(), num_winners=1)
    result = strategy.start(grid=grid, initial_arrays=INITIAL, num_rounds=2)
    assert receivers(grid, MessageType.TRAIN) == strategy.market_outcome.winners * 2
    assert 2 in result.train_metrics_clientapp


def test_all_winners() -> None:
    grid = market_grid()
    strategy = wrapped(FedAvg(fraction_evaluate=0.0), budget=1e9)
    strategy.start(grid=grid, initial_arrays=INITIAL, num_rounds=1)
    assert sorted(strategy.market_outcome.winners) == sorted(grid.node_ids)
    assert sorted(receivers(grid, MessageType.TRAIN)) == sorted(grid.node_ids)


def test_zero_winners_returns_an_empty_result(caplog: pytest.LogCaptureFixture) -> None:
    grid = market_grid()
    strategy = wrapped(FedAvg(), budget=1e-9)
    with pytest.raises(MarketError, match="no client won the auction"):
        strategy.start(grid=grid, initial_arrays=INITIAL, num_rounds=3)
    assert strategy.market_outcome is not None and strategy.market_outcome.winners == []
    assert not receivers(grid, MessageType.TRAIN)


def test_too_few_clients_is_a_market_error() -> None:
    grid = market_grid(num_nodes=2)
    with pytest.raises(MarketError, match="at least 3"):
        wrapped(FedAvg()).start(grid=grid, initial_arrays=INITIAL, num_rounds=1)
    assert not receivers(grid, MessageType.TRAIN)


def test_delegates_every_other_method() -> None:
    inner = FedAvg()
    strategy = FLMarket(inner, budget=10.0, num_classes=NUM_CLASSES)
    assert strategy.market_config.budget == 10.0
    grid = market_grid()
    messages = list(strategy.configure_train(1, INITIAL, ConfigRecord(), grid))
    assert {m.metadata.message_type for m in messages} == {MessageType.TRAIN}
    assert strategy.aggregate_evaluate(1, []) is None
    strategy.summary()


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="budget and num_classes"):
        FLMarket(FedAvg(), budget=1.0)
    with pytest.raises(ValueError, match="not both"):
        FLMarket(FedAvg(), budget=1.0, market_config=MarketConfig(budget=1.0, num_classes=2))
    with pytest.raises(TypeError):
        FLMarket(object(), budget=1.0, num_classes=2)  # type: ignore[arg-type]


def test_replies_are_aggregated_in_the_winners_order() -> None:
    """The same market and seeds give bit-identical models whatever order the replies arrive in."""
    arrays = []
    for shuffle_seed in (0, 1, 2):
        counts = make_counts(6, seed=3)
        grid = InProcessGrid(training_app(counts), list(counts), shuffle_seed=shuffle_seed)
        strategy = wrapped(FedAvg(), num_winners=4)
        result = strategy.start(grid=grid, initial_arrays=ArrayRecord({"w": Array(np.full(3, 0.1))}), num_rounds=2)
        arrays.append(result.arrays["w"].numpy().tobytes())
    assert arrays[0] == arrays[1] == arrays[2]


# --- Composition with Flower's own wrapper strategies ------------------------------------------------------------
def dp_server_side(inner, winners: int):
    return DifferentialPrivacyServerSideFixedClipping(
        inner, noise_multiplier=0.1, clipping_norm=10.0, num_sampled_clients=winners
    )


def dp_client_side(inner, winners: int):
    return DifferentialPrivacyClientSideFixedClipping(
        inner, noise_multiplier=0.1, clipping_norm=10.0, num_sampled_clients=winners
    )


@pytest.mark.parametrize("dp_wrapper", [dp_server_side, dp_client_side], ids=["server-side", "client-side"])
@pytest.mark.parametrize("market_inside", [True, False], ids=["DP(FLMarket(FedAvg))", "FLMarket(DP(FedAvg))"])
def test_the_market_runs_once_and_only_winners_train_in_any_nesting_order(dp_wrapper, market_inside: bool) -> None:
    """Issue 20: a DP wrapper outside FLMarket once skipped the market and trained every node."""
    grid = market_grid(num_nodes=6)
    inner = FedAvg(fraction_train=1.0, fraction_evaluate=1.0)
    if market_inside:
        market = wrapped(inner, num_winners=3)
        strategy = dp_wrapper(market, winners=3)
    else:
        market = wrapped(dp_wrapper(inner, winners=3), num_winners=3)
        strategy = market

    result = strategy.start(grid=grid, initial_arrays=INITIAL, num_rounds=2)

    outcome = market.market_outcome
    assert outcome is not None and len(outcome.winners) == 3
    advertised = receivers(grid, "query.market_advertise")
    assert sorted(advertised) == sorted(grid.node_ids), "the market (PASS) ran exactly once"
    assert len(receivers(grid, "query.market_award")) == len(grid.node_ids)
    trained, evaluated = receivers(grid, MessageType.TRAIN), receivers(grid, MessageType.EVALUATE)
    assert set(trained) == set(outcome.winners) and len(trained) == 2 * 3
    assert set(evaluated) == set(outcome.winners)
    assert len(result.train_metrics_clientapp) == 2


def test_a_wrapped_market_with_no_winner_fails_before_any_training() -> None:
    grid = market_grid()
    strategy = dp_server_side(wrapped(FedAvg(), budget=1e-9), winners=3)
    with pytest.raises(MarketError, match="no client won the auction"):
        strategy.start(grid=grid, initial_arrays=INITIAL, num_rounds=2)
    assert not receivers(grid, MessageType.TRAIN)


# --- Flower's newer Strategy.start keywords ---------------------------------------------------------------------
class RecordingStrategy(FedAvg):
    """A strategy whose ``start`` takes Flower 1.43's ``should_stop`` and a later release's keyword; it records them."""

    def __init__(self) -> None:
        super().__init__()
        self.got: dict[str, object] = {}

    def start(  # type: ignore[override]
        self, grid, initial_arrays, num_rounds=3, timeout=3600, train_config=None, evaluate_config=None,
        evaluate_fn=None, should_stop=None, later_knob=None,
    ) -> Result:  # fmt: skip
        self.got = {"grid": grid, "num_rounds": num_rounds, "should_stop": should_stop, "later_knob": later_knob}
        return Result(arrays=initial_arrays)


class OpenEndedStrategy(FedAvg):
    """A strategy whose ``start`` takes any keyword (``**kwargs``); it records them."""

    def __init__(self) -> None:
        super().__init__()
        self.got: dict[str, object] = {}

    def start(self, grid, initial_arrays, **kwargs) -> Result:  # type: ignore[override]
        self.got = kwargs
        return Result(arrays=initial_arrays)


class Flower142Strategy(FedAvg):
    """FedAvg with Flower 1.41/1.42's ``start``, which has no ``should_stop``."""

    def start(  # type: ignore[override]
        self, grid, initial_arrays, num_rounds=3, timeout=3600, train_config=None, evaluate_config=None,
        evaluate_fn=None,
    ) -> Result:  # fmt: skip
        return super().start(grid, initial_arrays, num_rounds, timeout, train_config, evaluate_config, evaluate_fn)


def stop_after_round_2(server_round: int, result: Result) -> bool:
    return server_round >= 2


def test_should_stop_and_later_keywords_reach_the_wrapped_start() -> None:
    inner = RecordingStrategy()
    strategy = wrapped(inner, num_winners=2)
    strategy.start(market_grid(), INITIAL, 4, should_stop=stop_after_round_2, later_knob=7)

    assert inner.got["should_stop"] is stop_after_round_2
    assert inner.got["later_knob"] == 7 and inner.got["num_rounds"] == 4
    assert isinstance(inner.got["grid"], WinnersGrid) and len(inner.got["grid"].node_ids) == 2


def test_a_start_that_takes_any_keyword_gets_them_all() -> None:
    inner = OpenEndedStrategy()
    wrapped(inner, num_winners=2).start(grid=market_grid(), initial_arrays=INITIAL, should_stop=None, later_knob=1)
    assert inner.got["should_stop"] is None and inner.got["later_knob"] == 1


@pytest.mark.parametrize(
    "keywords", [{"should_stop": stop_after_round_2}, {"later_knob": 3}], ids=["should_stop", "later_knob"]
)
def test_a_keyword_the_wrapped_start_lacks_is_refused_before_the_market_runs(keywords) -> None:
    grid = market_grid()
    name = next(iter(keywords))
    with pytest.raises(TypeError, match=f"Flower142Strategy.start\\(\\) takes no {name} in the installed Flower"):
        wrapped(Flower142Strategy(), num_winners=2).start(grid=grid, initial_arrays=INITIAL, **keywords)
    assert grid.sent == []  # no PASS round was started for a start that could not happen


def test_keywords_left_none_work_on_a_start_that_lacks_them() -> None:
    grid = market_grid()
    strategy = wrapped(Flower142Strategy(), num_winners=2)
    result = strategy.start(grid=grid, initial_arrays=INITIAL, num_rounds=2, should_stop=None, later_knob=None)
    assert len(result.train_metrics_clientapp) == 2
    assert set(receivers(grid, MessageType.TRAIN)) == set(strategy.market_outcome.winners)


def test_should_stop_ends_training_early_where_flower_has_it_and_is_refused_where_not() -> None:
    grid = market_grid()
    strategy = wrapped(FedAvg(fraction_evaluate=1.0), num_winners=3)
    if "should_stop" not in inspect.signature(FedAvg.start).parameters:  # Flower 1.41, 1.42
        with pytest.raises(TypeError, match="FedAvg.start\\(\\) takes no should_stop"):
            strategy.start(grid=grid, initial_arrays=INITIAL, num_rounds=5, should_stop=stop_after_round_2)
        assert grid.sent == []
        return
    result = strategy.start(grid=grid, initial_arrays=INITIAL, num_rounds=5, should_stop=stop_after_round_2)
    assert sorted(result.train_metrics_clientapp) == [1, 2]
    assert len(receivers(grid, MessageType.TRAIN)) == 2 * 3
