"""Who delivered what: a winner that fails training is recorded as such, and payment on delivery settles it."""

from __future__ import annotations

import pytest
from flwr.app import MessageType
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg
from test_strategy import INITIAL, market_grid, receivers, wrapped

from flmarket_flwr.market import FLMarket
from simulations.inprocess_grid import InProcessGrid


def drop_train_replies_of(grid: InProcessGrid, node: int) -> None:
    """The winner ``node`` never returns an update (its train replies are lost: the server sees a timeout)."""

    def hook(instruction, reply):  # type: ignore[no-untyped-def]
        if instruction.metadata.dst_node_id == node and instruction.metadata.message_type == MessageType.TRAIN:
            return None
        return reply

    grid.reply_hook = hook


def run(strategy_of, settle_on_delivery: bool, wrapped_by_dp: bool) -> tuple[FLMarket, int]:
    grid = market_grid(num_nodes=6)
    market = wrapped(FedAvg(fraction_evaluate=0.0), num_winners=3)
    market.settle_on_delivery = settle_on_delivery
    # The market decides the winners before training: fail the first winner's training, whichever it is.
    original = market.winners_grid

    def fail_first_winner(view_grid):  # type: ignore[no-untyped-def]
        view = original(view_grid)
        drop_train_replies_of(grid, view.node_ids[0])
        return view

    market.winners_grid = fail_first_winner  # type: ignore[method-assign]
    strategy = DifferentialPrivacyServerSideFixedClipping(market, 0.1, 10.0, 3) if wrapped_by_dp else market
    strategy.start(grid=grid, initial_arrays=INITIAL, num_rounds=3)
    assert market.market_outcome is not None
    failed = market.market_outcome.winners[0]
    assert receivers(grid, MessageType.TRAIN).count(failed) == 3
    return market, failed


@pytest.mark.parametrize("wrapped_by_dp", [False, True], ids=["FLMarket outermost", "inside a DP wrapper"])
def test_a_winner_that_never_delivers_is_recorded_and_not_paid_on_delivery(wrapped_by_dp: bool) -> None:
    market, failed = run(wrapped, settle_on_delivery=True, wrapped_by_dp=wrapped_by_dp)
    report = market.delivery_report()
    assert report["settle_on_delivery"] is True
    record = report["winners"][str(failed)]
    assert record["asked"] == 3 and record["delivered"] == 0
    assert [reason.split(":")[0] for reason in record["failures"]] == ["round 1", "round 2", "round 3"]
    assert record["award"] > 0 and record["settled"] == 0.0
    for node in market.market_outcome.winners[1:]:
        other = report["winners"][str(node)]
        assert other["delivered"] == other["asked"] == 3 and other["failures"] == []
        assert other["settled"] == other["award"] == market.market_outcome.payments[node]
    assert report["total_settled"] == pytest.approx(market.market_outcome.total_payment - record["award"])


def test_paying_at_selection_still_records_who_failed() -> None:
    market, failed = run(wrapped, settle_on_delivery=False, wrapped_by_dp=False)
    record = market.delivery_report()["winners"][str(failed)]
    assert record["delivered"] == 0 and len(record["failures"]) == 3
    assert record["settled"] == record["award"] > 0


def test_the_report_needs_a_market_and_the_setting_a_bool() -> None:
    with pytest.raises(RuntimeError, match="has not run"):
        wrapped(FedAvg()).delivery_report()
    with pytest.raises(TypeError, match="settle_on_delivery"):
        FLMarket(FedAvg(), budget=1.0, num_classes=2, settle_on_delivery="yes")  # type: ignore[arg-type]
