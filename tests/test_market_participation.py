"""A thin market says so, a round's deadline grows with the nodes it addresses, and a failed market leaves its
record (``MarketOutcome`` with status "failed", the reason and every exclusion), down to the app's market.json."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from adversary import honest_grid, make_counts, market_config
from flwr.app import Context, Message, RecordDict
from flwr.serverapp.strategy import FedAvg
from test_app_simulation import app_run_config

from flmarket_flwr.app import client_app, server_app
from flmarket_flwr.market import FLMarket, MarketConfig, MarketError, MarketPhase
from simulations.inprocess_grid import InProcessGrid


def dropping(nodes: set[int], message_type: str):
    """A reply hook that drops the replies of ``nodes`` to ``message_type`` (a timeout)."""

    def hook(instruction: Message, reply: Message) -> Message | None:
        if instruction.metadata.dst_node_id in nodes and instruction.metadata.message_type == message_type:
            return None
        return reply

    return hook


def test_a_market_that_lost_most_invited_nodes_at_advertise_fails_naming_who_and_why() -> None:
    """At N = 30 most nodes were timed out at advertise and the run still 'succeeded' with 4 bidders."""
    counts = make_counts(10, seed=3)
    silent = set(sorted(counts)[:6])
    grid = honest_grid(counts, reply_hook=dropping(silent, "query.market_advertise"))
    with pytest.raises(MarketError, match="thin market: only 4 of the 10 invited") as caught:
        MarketPhase(market_config(timeout=0.2)).run(grid)
    outcome = caught.value.outcome
    assert outcome is not None and outcome.status == "failed"
    assert outcome.invited == sorted(counts) and outcome.winners == [] and outcome.total_payment == 0.0
    assert set(outcome.excluded) == silent
    assert all(reason.startswith("market_advertise: no reply within") for reason in outcome.excluded.values())
    assert "6 at market_advertise" in outcome.reason
    assert outcome.to_dict()["status"] == "failed" and outcome.to_dict()["reason"] == outcome.reason


def test_a_lower_participation_floor_lets_the_same_market_through_and_the_summary_counts_exclusions(
    caplog: pytest.LogCaptureFixture,
) -> None:
    counts = make_counts(10, seed=3)
    silent = set(sorted(counts)[:6])
    grid = honest_grid(counts, reply_hook=dropping(silent, "query.market_advertise"))
    with caplog.at_level(logging.INFO, logger="flwr"):
        outcome = MarketPhase(market_config(timeout=0.2, min_participation=0.4)).run(grid)
    assert outcome.status == "succeeded" and sorted(outcome.participants) == sorted(set(counts) - silent)
    assert "(10 invited, 6 excluded: 6 at market_advertise)" in caplog.text


def test_every_failure_after_pass_leaves_its_record_too() -> None:
    counts = make_counts(8, seed=5)
    liars = set(sorted(counts)[:5])
    grid = honest_grid(counts, reply_hook=dropping(liars, "query.market_bid"))
    with pytest.raises(MarketError, match="thin market") as caught:
        MarketPhase(market_config(timeout=0.2)).run(grid)
    outcome = caught.value.outcome
    assert outcome is not None and set(outcome.excluded) == liars
    assert {"wait_for_nodes", "pass", "bid", "total"} <= set(outcome.timings)


@pytest.mark.parametrize(("fraction", "message"), [(0.0, "min_participation"), (1.5, "min_participation")])
def test_the_participation_floor_is_checked(fraction: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MarketConfig(budget=1.0, num_classes=2, min_participation=fraction)


def test_a_rounds_deadline_grows_with_the_nodes_it_addresses(caplog: pytest.LogCaptureFixture) -> None:
    config = MarketConfig(budget=1.0, num_classes=2, timeout=60.0, timeout_per_node=1.0)
    assert config.step_timeout(10) == 70.0 and config.step_timeout(30) == 90.0 and config.step_timeout(50) == 110.0
    counts = make_counts(5, seed=1)
    silent = sorted(counts)[0]
    grid = honest_grid(counts, reply_hook=dropping({silent}, "query.market_advertise"))
    outcome = MarketPhase(market_config(timeout=0.1, timeout_per_node=0.05)).run(grid)
    assert outcome.excluded[silent] == "market_advertise: no reply within 0.35 s"  # 0.1 + 5 x 0.05


def test_flmarket_keeps_the_failed_markets_record() -> None:
    counts = make_counts(7, seed=2)
    silent = set(sorted(counts)[:4])
    grid = honest_grid(counts, reply_hook=dropping(silent, "query.market_advertise"))
    strategy = FLMarket(FedAvg(), market_config=market_config(timeout=0.2))
    with pytest.raises(MarketError, match="thin market"):
        strategy.winners_grid(grid)
    assert strategy.market_outcome is not None and strategy.market_outcome.status == "failed"
    assert set(strategy.market_outcome.excluded) == silent


def test_the_app_writes_market_json_for_a_market_that_failed(tmp_path: Path) -> None:
    """Issue: 'When PASS aborts, no market.json is written (the exclusion reasons exist only in the log)'."""
    run_config = app_run_config(
        num_server_rounds=1, results_dir=str(tmp_path), run_name="thin", market_timeout=0.5, market_timeout_per_node=0.0
    )
    nodes = [11, 22, 33, 44, 55]
    grid = InProcessGrid(
        client_app.app, nodes, run_config=run_config, reply_hook=dropping({11, 22, 33}, "query.market_advertise")
    )
    with pytest.raises(MarketError, match="PASS stopped"):  # two nodes left: PASS itself aborts
        server_app.main(grid, Context(4, 0, {}, RecordDict(), run_config))
    market = json.loads((tmp_path / "thin" / "market.json").read_text())
    assert market["status"] == "failed" and "PASS stopped" in market["reason"]
    assert set(market["excluded"]) == {"11", "22", "33"} and market["invited"] == nodes
    assert market["winners"] == [] and market["total_payment"] == 0.0
