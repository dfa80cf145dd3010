"""``market.json`` says what happened, market by market: each market's own status and reason (one that bought
nobody is not "succeeded"), the scores and bids a failed market received, top-level fields that say which market
they summarise beside the run's totals and the buyer's own lists, and delivery failures in the run's rounds."""

from __future__ import annotations

import json

import pytest
from adversary import ChangingAfterRound
from flwr.app import MessageType
from test_grid_view import make_counts, training_app
from test_market_relaunch import INITIAL, TRAIN, market

from flmarket_flwr.app.results import selection_of
from flmarket_flwr.market import FLMarket, MarketError, MarketPhase
from flmarket_flwr.market.buyer.relaunch import RelaunchPolicy
from flmarket_flwr.market.wire.messages import ACTION_BID, ACTION_ENDORSE
from simulations.inprocess_grid import InProcessGrid

pytestmark = pytest.mark.usefixtures("ledger_home")  # tests/conftest.py: the nodes' ledgers, per test


def written(strategy: FLMarket) -> dict:
    """``market.json`` as the app writes it (JSON: node ids become strings)."""
    _, files = selection_of(strategy)
    return json.loads(json.dumps(files["market.json"], default=str))


def test_three_markets_one_bought_a_cohort_one_bought_nobody_one_failed() -> None:
    """Market 1 buys; four newcomers' market 2 bids but no winner endorses its award (it buys nobody); four more
    newcomers' market 3 turns thin at the bids. Each says so, with its reason, and what it received."""
    counts = make_counts(14, seed=5)
    nodes = sorted(counts)
    first, second, third, outsider = nodes[:5], nodes[5:9], nodes[9:13], nodes[13]
    grid = InProcessGrid(training_app(counts), nodes)
    grid.connected = [*first, outsider]
    mute_endorse, mute_bid = set(second), set(third[:3])

    def hook(message, reply):  # type: ignore[no-untyped-def]
        kind, node = message.metadata.message_type, message.metadata.dst_node_id
        if (kind == f"query.{ACTION_ENDORSE}" and node in mute_endorse) or (
            kind == f"query.{ACTION_BID}" and node in mute_bid
        ):
            return None
        return reply

    grid.reply_hook = hook

    def join(group: list[int]) -> None:
        grid.connected = [*grid.connected, *group]

    class TwoJoins(ChangingAfterRound):
        def aggregate_train(self, server_round, replies):  # type: ignore[no-untyped-def]
            if server_round == 2:
                join(third)
            return super().aggregate_train(server_round, replies)

    strategy = FLMarket(
        TwoJoins(1, lambda: join(second), fraction_evaluate=0.0),
        market_config=market(budget=60.0, num_winners=2, timeout=0.5, exclude=(outsider,)),
        relaunch=RelaunchPolicy(churn_fraction=0.3),
    )
    strategy.start(grid=grid, initial_arrays=INITIAL, num_rounds=3, train_config=TRAIN)

    record = written(strategy)
    markets = record["markets"]
    assert [(m["market"], m["before_round"], m["status"]) for m in markets] == [
        (1, 1, "succeeded"),
        (2, 2, "failed"),
        (3, 3, "failed"),
    ]
    assert markets[0]["reason"] == "" and markets[0]["in_force"] and markets[0]["winners"]
    bought_nobody = markets[1]
    assert bought_nobody["reason"].startswith("no client won the auction") and "did not hold" in bought_nobody["reason"]
    assert bought_nobody["winners"] == [] and not bought_nobody["in_force"] and bought_nobody["delivery"] is None
    assert sorted(int(node) for node in bought_nobody["bids"]) == second  # every bid it received, winners' included
    assert sorted(int(node) for node in bought_nobody["scores"]) == second
    assert all(bought_nobody["excluded"][str(node)].startswith(ACTION_ENDORSE) for node in second)
    thin = markets[2]
    assert "thin market" in thin["reason"] and [int(node) for node in thin["bids"]] == [third[3]]
    # The top level: which market it summarises, and the run's totals and lists.
    assert record["market"] == 1 and record["summarises"].startswith("market 1 of 3")
    assert record["status"] == "succeeded" and record["winners"] == markets[0]["winners"]
    run = record["run"]
    assert (run["markets"], run["succeeded"], run["failed"], run["skipped"]) == (3, 1, 2, 0)
    assert run["in_force"] == [1] and run["cohort"] == strategy.cohort == markets[0]["winners"]
    assert run["exclude"] == [str(outsider)] and run["include"] == {} and run["allow"] == []
    assert run["total_awarded"] == pytest.approx(markets[0]["total_payment"])


def test_the_first_market_buying_nobody_is_a_failed_market_with_its_bids() -> None:
    counts = make_counts(5, seed=6)
    grid = InProcessGrid(training_app(counts), sorted(counts))
    strategy = FLMarket(ChangingAfterRound(99, lambda: None), market_config=market(budget=1e-3))
    with pytest.raises(MarketError, match="no client won the auction") as caught:
        strategy.start(grid=grid, initial_arrays=INITIAL, num_rounds=1, train_config=TRAIN)
    outcome = caught.value.outcome
    assert outcome is not None and outcome is strategy.market_outcome
    assert outcome.status == "failed" and outcome.reason.startswith("no client won the auction")
    assert sorted(outcome.bids) == sorted(counts) and all(bid > 0 for bid in outcome.bids.values())
    assert [entry.outcome.status for entry in strategy.markets] == ["failed"]


def test_a_later_markets_delivery_failures_name_the_runs_round() -> None:
    """Newcomers bought before round 3; one misses round 4: its record says round 4 (its market's second)."""
    counts = make_counts(9, seed=4)
    nodes = sorted(counts)
    grid = InProcessGrid(training_app(counts), nodes)
    grid.connected = nodes[:6]
    lost: set[int] = set()

    def hook(message, reply):  # type: ignore[no-untyped-def]
        return (
            None
            if message.metadata.message_type == MessageType.TRAIN and message.metadata.dst_node_id in lost
            else reply
        )

    grid.reply_hook = hook

    def join() -> None:
        grid.connected = nodes

    class LosesOne(ChangingAfterRound):
        def aggregate_train(self, server_round, replies):  # type: ignore[no-untyped-def]
            if server_round == 3:
                lost.add(strategy.markets[1].outcome.winners[0])
            return super().aggregate_train(server_round, replies)

    strategy = FLMarket(
        LosesOne(2, join, fraction_evaluate=0.0),
        market_config=market(budget=40.0, num_winners=2, timeout=0.5),
        relaunch=RelaunchPolicy(churn_fraction=0.3),
    )
    strategy.start(grid=grid, initial_arrays=INITIAL, num_rounds=4, train_config=TRAIN)
    newcomer = strategy.markets[1].outcome.winners[0]
    delivery = written(strategy)["markets"][1]["delivery"]["winners"][str(newcomer)]
    assert delivery["asked"] == 2 and delivery["delivered"] == 1
    assert delivery["failures"] == ["round 4: no reply within the round's timeout"]


def test_excluding_every_node_by_tag_names_the_exclude_list() -> None:
    counts = make_counts(5, seed=1)
    nodes = sorted(counts)
    configs = {node: {"market-tag": "rival"} for node in nodes}
    grid = InProcessGrid(training_app(counts), nodes, node_configs=configs)
    with pytest.raises(MarketError, match=r"5 node\(s\) left out by the exclude list .*\['rival'\]\): \[") as caught:
        MarketPhase(market(exclude=("rival",))).run(grid)
    assert "excluded so far" not in str(caught.value) and "{}" not in str(caught.value)
