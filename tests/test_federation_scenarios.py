"""A federation that changes as its users meet it: one budget per run, newcomers bought by later markets, exclusion
that never messages, the edge cases of the lists, spent privacy budgets and rounds that aggregate nothing."""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from adversary import ChangingAfterRound, CountingQueries
from flwr.app import Array, ArrayRecord, ConfigRecord, MessageType
from flwr.serverapp.strategy import FedAvg
from hypothesis import given, settings, target
from hypothesis import strategies as st
from test_grid_view import NUM_CLASSES, make_counts, training_app
from test_market_relaunch import market, secure_grid

from flmarket_flwr.app.results import selection_of
from flmarket_flwr.market import FLMarket, MarketConfig, MarketError, MarketPhase
from flmarket_flwr.market.buyer.membership import plan_membership
from flmarket_flwr.market.buyer.relaunch import Commitment, RelaunchPolicy, budget_left
from flmarket_flwr.pricing import run_auction
from simulations.inprocess_grid import InProcessGrid

INITIAL = ArrayRecord({"w": Array(np.zeros(3))})
TRAIN = ConfigRecord({"lr": 0.1})

pytestmark = pytest.mark.usefixtures("ledger_home")  # tests/conftest.py: the nodes' ledgers, per test


def messages_per_node(grid: InProcessGrid, start: int = 0) -> Counter[int]:
    """How many messages of any kind each node was sent (from the ``start``-th message on)."""
    return Counter(int(message.metadata.dst_node_id) for message in grid.sent[start:])


def run_total(strategy: FLMarket) -> float:
    return math.fsum(strategy.settled_across_markets().values())


# --- 1. One budget for the run -----------------------------------------------------------------------
@pytest.mark.parametrize("settle_on_delivery", [False, True])
def test_several_relaunches_share_one_run_budget(tmp_path: Path, settle_on_delivery: bool) -> None:
    """Secure profile, a market before every round: each re-launch's auction gets what the earlier markets left,
    and the run's total payment stays within the one budget. A winner of the first market never replies: on
    delivery it is settled pro rata (nothing), and the next market gets the difference."""
    grid, _, directory = secure_grid(tmp_path, 7, total_epsilon=6.0, **{"market-min-roster-change": 1})
    quiet: set[int] = set()
    grid.reply_hook = lambda message, reply: None if message.metadata.dst_node_id in quiet else reply

    class Quieting(FedAvg):
        def configure_train(self, server_round, arrays, config, grid_view):  # type: ignore[no-untyped-def]
            quiet.add(strategy.markets[0].outcome.winners[0])  # silent from round 1 on
            return super().configure_train(server_round, arrays, config, grid_view)

    budget = 12.0
    strategy = FLMarket(
        Quieting(fraction_evaluate=0.0),
        market_config=market(directory, budget=budget, timeout=1.0),
        relaunch=RelaunchPolicy(every_rounds=1),
        settle_on_delivery=settle_on_delivery,
        absent_timeout=None,
    )
    strategy.start(grid=grid, initial_arrays=INITIAL, num_rounds=4, train_config=TRAIN, timeout=2.0)

    ran = [entry for entry in strategy.markets if entry.delivery is not None]
    assert len(ran) >= 3, [entry.outcome.reason for entry in strategy.markets]
    for entry in strategy.markets[1:]:  # each re-launch's auction: the run's budget less what was committed
        if entry.delivery is not None:
            assert entry.outcome.budget == pytest.approx(budget - entry.committed_before, rel=1e-12)
    committed = 0.0
    for entry in strategy.markets:
        assert entry.committed_before == pytest.approx(committed, rel=1e-12, abs=1e-12)
        if entry.delivery is not None:
            settled = entry.delivery.settle(entry.outcome.payments, on_delivery=settle_on_delivery)
            committed += math.fsum(settled.values())
    assert run_total(strategy) == pytest.approx(committed) and run_total(strategy) <= budget * (1 + 1e-12)
    awarded = math.fsum(entry.outcome.total_payment for entry in ran)
    first = strategy.markets[0]
    quiet_award = first.outcome.payments[first.outcome.winners[0]]
    if settle_on_delivery:  # the quiet winner was asked once in market 1 and never delivered: paid nothing
        assert first.delivery.records[first.outcome.winners[0]].delivered == 0
        assert strategy.markets[1].committed_before == pytest.approx(first.outcome.total_payment - quiet_award)
    else:
        assert awarded == pytest.approx(run_total(strategy))
    assert awarded > budget / 2  # more than one market spent: the budget was shared, not renewed
    _, files = selection_of(strategy)
    record = json.loads(json.dumps(files["market.json"], default=str))
    assert record["run_budget"] == budget and record["run_total_settled"] <= budget * (1 + 1e-12)


class _Market:
    """A market of a simulated run: its awards and each node's train record."""

    def __init__(self, payments: dict[int, float]) -> None:
        self.payments = payments
        self.asked = dict.fromkeys(payments, 0)
        self.delivered = dict.fromkeys(payments, 0)

    def settled(self, on_delivery: bool) -> float:
        share = {n: self.delivered[n] / self.asked[n] if self.asked[n] else 1.0 for n in self.payments}
        return math.fsum(p * (share[n] if on_delivery else 1.0) for n, p in self.payments.items())


@settings(max_examples=300, deadline=None)
@given(data=st.data(), run_budget=st.floats(1.0, 1e4), on_delivery=st.booleans(), joins=st.booleans())
def test_no_sequence_of_markets_settles_more_than_the_run_budget(
    data: st.DataObject, run_budget: float, on_delivery: bool, joins: bool
) -> None:
    """Markets bought with :func:`budget_left`'s rule (the real auction on what is left, included payments first),
    joining or replacing the cohort, failing at random, their winners delivering any pattern of rounds (a share
    that falls and rises again): what the run settles in the end is within the one budget."""
    markets: list[_Market] = []
    in_force: list[_Market] = []
    for _ in range(data.draw(st.integers(1, 6), label="markets")):
        commitments = [
            Commitment(math.fsum(m.payments.values()), m.settled(on_delivery), any(m is f for f in in_force))
            for m in markets
        ]
        left, _ = budget_left(run_budget, commitments, keep_in_force=joins)
        if left > 1e-9 * run_budget and data.draw(st.booleans(), label="market runs"):
            included = data.draw(st.one_of(st.just(0.95), st.floats(0.0, 0.95)), label="included share") * left
            bidders = data.draw(st.lists(st.tuples(st.floats(0.01, 1.0), st.floats(0.01, 1e4)), min_size=1,
                                         max_size=8), label="score, bid")  # fmt: skip
            auction = run_auction([u for u, _ in bidders], [b for _, b in bidders], left - included)
            payments = {len(markets) * 100 + int(i): float(auction.payments[i]) for i in auction.winners}
            payments[len(markets) * 100 + 99] = included  # an included node
            market = _Market(payments)
            markets.append(market)
            in_force = [*in_force, market] if joins else [market]
        for _ in range(data.draw(st.integers(0, 4), label="rounds")):
            for market in in_force:  # a market's cohort delivers a round, or loses it
                delivered = data.draw(st.booleans(), label="delivered")
                for node in market.payments:
                    market.asked[node] += 1
                    market.delivered[node] += delivered
    total = math.fsum(market.settled(on_delivery) for market in markets)
    target(total / run_budget)  # steer the search toward runs that spend the most
    assert total <= run_budget * (1 + 1e-9)


def test_a_relaunch_with_nothing_left_to_spend_is_skipped_before_any_message(tmp_path: Path) -> None:
    """The included node's fixed payment is paid again by each market that replaces the cohort: once what is left
    of the run's budget cannot cover it, the re-launch is skipped with that reason and no node hears of it."""
    grid, counts, directory = secure_grid(tmp_path, 7, total_epsilon=6.0)
    nodes = sorted(counts)
    counting = CountingQueries(grid, fraction_evaluate=0.0)
    queries_before = counting.queries_before
    strategy = FLMarket(
        counting,
        market_config=market(directory, budget=10.0, include={nodes[0]: 4.0}),
        relaunch=RelaunchPolicy(every_rounds=1),
    )
    strategy.start(grid=grid, initial_arrays=INITIAL, num_rounds=4, train_config=TRAIN)

    assert strategy.markets[0].outcome.status == "succeeded"
    skipped = [entry for entry in strategy.markets if entry.outcome.status == "skipped"]
    assert skipped, [entry.outcome.total_payment for entry in strategy.markets]
    for entry in skipped:
        assert "leaves no budget for the auction" in entry.outcome.reason and "committed" in entry.outcome.reason
        before, after = queries_before.get(entry.first_round - 1, 0), queries_before[entry.first_round]
        ran_before = any(e.first_round == entry.first_round - 1 and e.delivery for e in strategy.markets)
        assert ran_before or after == before  # a skipped market sent nothing
    assert run_total(strategy) <= 10.0 * (1 + 1e-12)


# --- 2. market.json: why each market ran, what it released, why it stopped ------------------------------
def test_market_json_keeps_the_trigger_and_the_release_of_a_market_that_failed_after_pass() -> None:
    """A market whose bidders turn thin after PASS: its record says why it ran (trigger), that a sum was
    released (and whose), and why it stopped."""
    counts = make_counts(9, seed=2)
    nodes = sorted(counts)
    grid = InProcessGrid(training_app(counts), nodes)
    grid.connected = nodes[:5]
    silent: set[int] = set()

    def hook(message, reply):  # type: ignore[no-untyped-def]
        if message.metadata.message_type == "query.market_bid" and message.metadata.dst_node_id in silent:
            return None
        return reply

    grid.reply_hook = hook

    def join() -> None:
        grid.connected = nodes  # four newcomers, three of which will not bid
        silent.update(nodes[5:8])

    strategy = FLMarket(
        ChangingAfterRound(1, join, fraction_evaluate=0.0),
        market_config=market(num_winners=2, timeout=0.5),
        relaunch=RelaunchPolicy(churn_fraction=0.5),
    )
    strategy.start(grid=grid, initial_arrays=INITIAL, num_rounds=2, train_config=TRAIN)

    report = strategy.markets_report()
    assert [entry["trigger"] for entry in report][0] == "the first market"
    assert "4 node(s) joined" in report[1]["trigger"]
    assert report[1]["status"] == "failed" and "thin market" in report[1]["reason"]
    assert report[1]["released"] == nodes[5:] and report[1]["pass_participants"] == nodes[5:]
    assert len(report[1]["global_counts"]) == NUM_CLASSES
    assert report[0]["status"] == "succeeded" and report[0]["reason"] == ""
    assert report[0]["released"] == nodes[:5]
    # What was bid on the released sum before the market stopped: the one newcomer that bid, as market.json says.
    assert set(report[1]["bids"]) == set(report[1]["scores"]) == {nodes[8]} and report[1]["bids"][nodes[8]] > 0
    assert report[1]["payments"] == {} and report[1]["winners"] == []
    _, files = selection_of(strategy)
    written = json.loads(json.dumps(files["market.json"], default=str))["markets"][1]
    assert list(written["bids"]) == [str(nodes[8])] and written["pass_participants"] == nodes[5:]


def test_a_market_that_stops_after_its_unmask_request_records_the_sum_as_released() -> None:
    """Too many withhold their unmask shares: the sum may already be out (some shares were sent), so the failed
    market's record names every node of the session as a PASS participant, and no bid was asked."""
    counts = make_counts(5, seed=12)
    nodes = sorted(counts)
    withholding = set(nodes[:3])

    def hook(message, reply):  # type: ignore[no-untyped-def]
        unmask = message.metadata.message_type == "query.market_unmask"
        return None if unmask and message.metadata.dst_node_id in withholding else reply

    grid = InProcessGrid(training_app(counts), nodes, reply_hook=hook)
    phase = MarketPhase(market(timeout=0.5))
    with pytest.raises(MarketError, match="unmask") as caught:
        phase.run(grid)
    outcome = caught.value.outcome
    assert outcome is not None and outcome.status == "failed"
    assert outcome.pass_participants == phase.released == nodes
    assert outcome.bids == {} and outcome.scores == {}


# --- 3. Exclusion means never messaged ---------------------------------------------------------------------
def test_a_node_excluded_by_id_is_sent_no_message_even_when_a_list_names_a_tag() -> None:
    counts = make_counts(8, seed=5)
    nodes = sorted(counts)
    configs = {node: {"market-tag": "rival" if node == nodes[1] else ""} for node in nodes}
    grid = InProcessGrid(training_app(counts), nodes, node_configs=configs)
    strategy = FLMarket(
        FedAvg(fraction_evaluate=0.0),
        market_config=market(num_winners=2, exclude=(nodes[0], "rival")),
    )
    strategy.start(grid=grid, initial_arrays=INITIAL, num_rounds=2, train_config=TRAIN)

    per_node = messages_per_node(grid)
    assert per_node[nodes[0]] == 0  # by id: nothing, not even the tags query
    tags_only = Counter(
        int(m.metadata.dst_node_id) for m in grid.sent if m.metadata.message_type != "query.market_tags"
    )
    assert per_node[nodes[1]] == 1 and tags_only[nodes[1]] == 0  # by tag: the one query that learns its tag
    assert all(per_node[node] > 1 for node in nodes[2:])
    assert set(strategy.cohort) <= set(nodes[2:])


# --- 4. Edge cases: one rule for ids and tags --------------------------------------------------------------
@pytest.mark.parametrize("include", [{"5": 1.0}, {" 12 ": 1.0}])
def test_a_digit_string_member_is_refused_at_construction(include: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="is a str of digits, read as a tag"):
        MarketConfig(budget=10.0, num_classes=3, include=include)
    with pytest.raises(ValueError, match="is a str of digits"):
        MarketConfig(budget=10.0, num_classes=3, exclude=("7",))


def test_an_include_tag_whose_payment_exhausts_the_budget_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="leaves no budget for the auction"):
        MarketConfig(budget=10.0, num_classes=3, include={"partner": 10.0})
    with pytest.raises(ValueError, match="leaves no budget for the auction"):
        FLMarket(FedAvg(), budget=10.0, num_classes=3, include={"partner": 6.0, 3: 5.0})


def test_unknown_ids_and_tags_are_one_rule_an_error_at_the_first_market_skipped_in_a_relaunch() -> None:
    tags = {1: "partner", 2: "", 3: ""}
    for include, exclude, named in (({}, [9], r"\[9\]"), ({}, ["gone"], r"\['gone'\]"), ({9: 1.0}, [], r"\[9\]"),
                                    ({"gone": 1.0}, [], r"\['gone'\]")):  # fmt: skip
        with pytest.raises(ValueError, match=named):
            plan_membership([1, 2, 3], include, exclude, 10.0, tags)
        plan = plan_membership([1, 2, 3], include, exclude, 10.0, tags, strict=False)
        assert plan.unmatched == [*include, *exclude] and plan.invited == [1, 2, 3]
    counts = make_counts(5, seed=1)
    grid = InProcessGrid(training_app(counts), sorted(counts))
    with pytest.raises(MarketError, match=r"market-exclude\): no connected node declares the tag\(s\) \['gone'\]"):
        MarketPhase(market(exclude=("gone",))).run(grid)
    assert [m.metadata.message_type for m in grid.sent] == ["query.market_tags"] * 5  # nothing released


# --- 5. Spent privacy budgets and empty rounds are visible --------------------------------------------
def test_relaunching_stops_with_one_line_when_the_nodes_privacy_budgets_are_spent(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    grid, _, directory = secure_grid(tmp_path, 6, total_epsilon=1.6)
    counting = CountingQueries(grid, fraction_evaluate=0.0)
    queries_before = counting.queries_before
    strategy = FLMarket(
        counting,
        market_config=market(directory, num_winners=2),
        relaunch=RelaunchPolicy(every_rounds=1),
    )
    with caplog.at_level(logging.WARNING):
        strategy.start(grid=grid, initial_arrays=INITIAL, num_rounds=6, train_config=TRAIN)

    # Two releases fit in epsilon 1.6; the third market is refused for the budget, and no later one is tried.
    assert [entry.outcome.status for entry in strategy.markets] == ["succeeded", "succeeded", "failed"]
    assert "privacy budget" in strategy.markets[2].outcome.reason or "privacy budget" in json.dumps(
        strategy.markets[2].outcome.excluded
    )
    stops = [record.getMessage() for record in caplog.records if "re-launching stops" in record.getMessage()]
    assert len(stops) == 1 and "privacy budgets of 6 of the 6 connected nodes are spent" in stops[0]
    total = sum(1 for m in grid.sent if m.metadata.message_type.startswith("query"))
    assert queries_before[4] == queries_before[5] == queries_before[6] == total  # rounds 4-6: no market message
    assert strategy.markets[1].outcome.cohort == strategy.cohort


def test_a_round_that_aggregates_no_update_logs_the_lost_nodes_and_why(caplog: pytest.LogCaptureFixture) -> None:
    counts = make_counts(6, seed=3)
    grid = InProcessGrid(training_app(counts), sorted(counts))
    grid.reply_hook = lambda message, reply: None if message.metadata.message_type == MessageType.TRAIN else reply
    strategy = FLMarket(FedAvg(fraction_evaluate=0.0), market_config=market(num_winners=2))
    with caplog.at_level(logging.WARNING):
        strategy.start(grid=grid, initial_arrays=INITIAL, num_rounds=2, train_config=TRAIN, timeout=0.5)
    lines = [r.getMessage() for r in caplog.records if "aggregated no update" in r.getMessage()]
    assert len(lines) == 2 and "train round 1 " in lines[0] and "train round 2 " in lines[1]
    for node in strategy.cohort:
        assert f"node {node}: no reply within the round's timeout" in lines[0]


# --- 6. Newcomers: the default profile's re-launch buys the nodes that have not released ------------------
def test_newcomers_are_bought_by_a_market_among_themselves_and_no_node_releases_twice() -> None:
    """Six nodes run the first market; three join after round 2 and the churn re-launch runs a market among the
    three alone (the six are sent nothing): their winners train beside the first cohort, every node released at
    most once, and the run's total stays within the budget."""
    counts = make_counts(9, seed=4)
    nodes = sorted(counts)
    grid = InProcessGrid(training_app(counts), nodes)
    grid.connected = nodes[:6]
    marks: dict[str, int] = {}

    def join() -> None:
        grid.connected = nodes
        marks["joined"] = len(grid.sent)

    budget = 40.0
    strategy = FLMarket(
        ChangingAfterRound(2, join, fraction_evaluate=0.0),
        market_config=market(budget=budget, num_winners=2),
        relaunch=RelaunchPolicy(churn_fraction=0.3),
    )
    strategy.start(grid=grid, initial_arrays=INITIAL, num_rounds=4, train_config=TRAIN)

    first, second = strategy.markets
    assert second.outcome.status == "succeeded" and second.joined and second.first_round == 3
    assert second.outcome.invited == nodes[6:] and set(second.outcome.winners) <= set(nodes[6:])
    assert second.outcome.winners  # newcomers win
    assert strategy.cohort == first.outcome.cohort + second.outcome.cohort
    market_messages = Counter(
        int(m.metadata.dst_node_id) for m in grid.sent[marks["joined"] :] if m.metadata.message_type.startswith("query")
    )
    assert set(market_messages) == set(nodes[6:])  # the six that released are sent nothing
    rosters = [node for entry in strategy.markets for s in entry.outcome.pass_sessions for node in s.roster]
    assert Counter(rosters).most_common(1)[0][1] == 1  # no node in two PASS sessions of the run
    trained = Counter(int(m.metadata.dst_node_id) for m in grid.sent if m.metadata.message_type == MessageType.TRAIN)
    assert all(trained[node] == 4 for node in first.outcome.cohort)
    assert all(trained[node] == 2 for node in second.outcome.cohort)
    assert second.committed_before == pytest.approx(first.outcome.total_payment)
    assert second.outcome.budget == pytest.approx(budget - first.outcome.total_payment)
    assert run_total(strategy) <= budget * (1 + 1e-12)
    selection, _ = selection_of(strategy)
    assert selection["selected"] == strategy.cohort


def test_a_newcomers_market_asks_only_the_newcomers_for_their_tags() -> None:
    """A list names a tag: the newcomers' market asks the newcomers for their tags and no one else (the nodes that
    released sit it out and hear nothing, not even the tags query); a node excluded by its tag hears only that query
    in each market, and the one excluded by id hears nothing all run."""
    counts = make_counts(10, seed=13)
    nodes = sorted(counts)
    rivals = [nodes[4], nodes[9]]  # one among the first six, one newcomer
    configs = {node: {"market-tag": "rival" if node in rivals else ""} for node in nodes}
    grid = InProcessGrid(training_app(counts), nodes, node_configs=configs)
    grid.connected = nodes[:6]
    marks: dict[str, int] = {}

    def join() -> None:
        grid.connected = nodes
        marks["joined"] = len(grid.sent)

    strategy = FLMarket(
        ChangingAfterRound(1, join, fraction_evaluate=0.0),
        market_config=market(num_winners=2, exclude=(nodes[5], "rival")),
        relaunch=RelaunchPolicy(churn_fraction=0.2),
    )
    strategy.start(grid=grid, initial_arrays=INITIAL, num_rounds=2, train_config=TRAIN)

    second = strategy.markets[1]
    assert second.outcome.status == "succeeded" and second.outcome.invited == nodes[6:9]
    after = Counter(
        (int(m.metadata.dst_node_id), m.metadata.message_type)
        for m in grid.sent[marks["joined"] :]
        if m.metadata.message_type.startswith("query")
    )
    assert {node for node, _ in after} == {*nodes[6:], nodes[4]}  # the newcomers, and the rival that never released
    for rival in rivals:
        assert [kind for node, kind in after if node == rival] == ["query.market_tags"]
        assert after[(rival, "query.market_tags")] == 1
    assert messages_per_node(grid)[nodes[5]] == 0


def test_too_few_newcomers_is_known_before_pass_and_nothing_is_sent() -> None:
    counts = make_counts(8, seed=6)
    nodes = sorted(counts)
    grid = InProcessGrid(training_app(counts), nodes)
    grid.connected = nodes[:6]
    marks: dict[str, int] = {}

    def join() -> None:
        grid.connected = nodes  # two newcomers: too few for a PASS of their own
        marks["joined"] = len(grid.sent)

    strategy = FLMarket(
        ChangingAfterRound(1, join, fraction_evaluate=0.0),
        market_config=market(num_winners=2),
        relaunch=RelaunchPolicy(churn_fraction=0.2),
    )
    strategy.start(grid=grid, initial_arrays=INITIAL, num_rounds=3, train_config=TRAIN)

    assert [entry.outcome.status for entry in strategy.markets] == ["succeeded", "skipped"]
    skipped = strategy.markets[1]
    assert "only 2 connected node(s) can take part" in skipped.outcome.reason
    assert skipped.released == [] and skipped.outcome.pass_sessions == []
    after = [m for m in grid.sent[marks["joined"] :] if m.metadata.message_type.startswith("query")]
    assert after == []  # the thin market released nothing and sent nothing


# --- 7. Beyond the anchors: the buyer drops a named node mid-run ------------------------------------------
@pytest.mark.parametrize("settle_on_delivery", [False, True])
def test_the_wrapped_strategy_drops_a_named_node_mid_run_and_it_keeps_what_it_delivered(
    settle_on_delivery: bool,
) -> None:
    """Flower #1756: after round 1 the wrapped strategy drops one winner. It is sent nothing from round 2 on, and
    is settled on the one round it was asked (and delivered): its whole award, either way."""
    counts = make_counts(7, seed=8)
    grid = InProcessGrid(training_app(counts), sorted(counts))

    def judge() -> None:
        strategy.drop_nodes([strategy.cohort[0]], reason="its updates diverge")

    strategy = FLMarket(
        ChangingAfterRound(1, judge, fraction_evaluate=0.0),
        market_config=market(num_winners=3),
        settle_on_delivery=settle_on_delivery,
    )
    strategy.start(grid=grid, initial_arrays=INITIAL, num_rounds=3, train_config=TRAIN)

    first = strategy.markets[0].outcome
    dropped = first.cohort[0]
    assert strategy.dropped == {dropped: "its updates diverge"} and dropped not in strategy.cohort
    trained = Counter(int(m.metadata.dst_node_id) for m in grid.sent if m.metadata.message_type == MessageType.TRAIN)
    assert trained[dropped] == 1 and all(trained[node] == 3 for node in first.cohort[1:])
    owed = strategy.settled_across_markets()
    assert owed[dropped] == pytest.approx(first.payments[dropped])  # asked once, delivered once: in full
    assert run_total(strategy) <= first.budget * (1 + 1e-12)
    _, files = selection_of(strategy)
    assert files["market.json"]["dropped"] == {str(dropped): "its updates diverge"}
    with pytest.raises(ValueError, match="not in the cohort"):
        strategy.drop_nodes([dropped])
    with pytest.raises(ValueError, match="leaves no node of the cohort"):
        strategy.drop_nodes(strategy.cohort)


def test_a_dropped_node_is_not_invited_to_a_later_market(tmp_path: Path) -> None:
    grid, counts, directory = secure_grid(tmp_path, 7, total_epsilon=6.0, **{"market-min-roster-change": 1})

    def judge() -> None:
        strategy.drop_nodes([strategy.cohort[0]])

    strategy = FLMarket(
        ChangingAfterRound(1, judge, fraction_evaluate=0.0),
        market_config=market(directory, num_winners=2),
        relaunch=RelaunchPolicy(every_rounds=2),
    )
    strategy.start(grid=grid, initial_arrays=INITIAL, num_rounds=3, train_config=TRAIN)

    (dropped,) = strategy.dropped
    second = strategy.markets[1]
    assert second.outcome.status == "succeeded" and second.first_round == 3
    assert dropped not in second.outcome.invited and dropped not in second.outcome.cohort
    to_dropped = [m.metadata.message_type for m in grid.sent if int(m.metadata.dst_node_id) == dropped]
    assert to_dropped[-1] == MessageType.TRAIN and to_dropped.count(MessageType.TRAIN) == 1  # round 1, then nothing
    assert to_dropped.count("query.market_advertise") == 1  # market 1's PASS only


# --- 7. Allow-list-only mode: only the listed nodes are ever messaged ----------------------------------------
def test_in_allow_list_only_mode_no_other_node_is_ever_messaged() -> None:
    counts = make_counts(9, seed=9)
    nodes = sorted(counts)
    configs = {node: {"market-tag": "partner" if node == nodes[1] else ""} for node in nodes}
    grid = InProcessGrid(training_app(counts), nodes, node_configs=configs)
    allowed = nodes[:6]
    strategy = FLMarket(
        FedAvg(fraction_evaluate=0.0),
        market_config=market(num_winners=2, allow=tuple(allowed), include={"partner": 1.0}, exclude=(nodes[2],)),
        relaunch=RelaunchPolicy(every_rounds=1),
    )
    strategy.start(grid=grid, initial_arrays=INITIAL, num_rounds=2, train_config=TRAIN)

    per_node = messages_per_node(grid)
    assert set(per_node) <= set(allowed) - {nodes[2]}  # neither the others nor the excluded: not even the tags query
    first = strategy.markets[0].outcome
    assert first.included == {nodes[1]: 1.0} and set(first.invited) == set(allowed) - {nodes[1], nodes[2]}


def test_an_allow_list_is_node_ids_and_holds_every_included_id() -> None:
    assert MarketConfig(budget=10.0, num_classes=3, allow=(7, 3, 7)).allow == (3, 7)
    with pytest.raises(TypeError, match="a tag is learned by asking the node"):
        MarketConfig(budget=10.0, num_classes=3, allow=("partner",))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"node\(s\) \[5\] are not on the allow list \[3, 7\]"):
        FLMarket(FedAvg(), budget=10.0, num_classes=3, include={5: 1.0}, allow=[3, 7])


def test_nodes_that_decline_a_relaunch_are_not_asked_again_and_relaunching_stops(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A buyer that announces noise re-invites every node, but these nodes have no privacy budget: they decline the
    re-launch at its first step (releasing nothing). They are not invited again, and one line says re-launching
    stops, instead of a failed market before every round."""
    from flmarket_flwr.pass_protocol import SkellamNoise

    counts = make_counts(6, seed=3)
    grid = InProcessGrid(training_app(counts), sorted(counts))
    strategy = FLMarket(
        FedAvg(fraction_evaluate=0.0),
        market_config=market(num_winners=2, noise=SkellamNoise(1.0)),
        relaunch=RelaunchPolicy(every_rounds=1),
    )
    with caplog.at_level(logging.WARNING):
        strategy.start(grid=grid, initial_arrays=INITIAL, num_rounds=4, train_config=TRAIN)
    assert [entry.outcome.status for entry in strategy.markets] == ["succeeded", "failed"]
    assert strategy.markets[1].released == []  # declined before any sum
    advertised = Counter(
        int(m.metadata.dst_node_id) for m in grid.sent if m.metadata.message_type.endswith("advertise")
    )
    assert set(advertised.values()) == {2}  # the first market and the declined re-launch, never a third
    stops = [r.getMessage() for r in caplog.records if "re-launching stops" in r.getMessage()]
    assert len(stops) == 1


def test_a_market_too_few_accept_stops_at_the_invitation_before_any_sum_is_released() -> None:
    """Seven invited, four never answer the invitation (PASS's first round): three could still run PASS, but three
    of seven bidders would be thin. The market stops right there: no sum released, no second session."""
    counts = make_counts(7, seed=10)
    nodes = sorted(counts)
    silent = set(nodes[:4])

    def hook(message, reply):  # type: ignore[no-untyped-def]
        if message.metadata.message_type == "query.market_advertise" and message.metadata.dst_node_id in silent:
            return None
        return reply

    grid = InProcessGrid(training_app(counts), nodes, reply_hook=hook)
    with pytest.raises(MarketError, match=r"only 3 of the 7 invited nodes accepted the invitation") as caught:
        MarketPhase(market(timeout=0.5)).run(grid)
    outcome = caught.value.outcome
    assert outcome is not None and outcome.pass_participants == [] and len(outcome.pass_sessions) == 1
    sent = Counter(m.metadata.message_type for m in grid.sent)
    assert sent["query.market_advertise"] == 7 and sent["query.market_share"] == 0 and sent["query.market_unmask"] == 0


def test_a_stopped_relaunch_resumes_when_nodes_that_can_take_part_connect(caplog: pytest.LogCaptureFixture) -> None:
    counts = make_counts(9, seed=11)
    nodes = sorted(counts)
    grid = InProcessGrid(training_app(counts), nodes)
    grid.connected = nodes[:6]

    def join() -> None:
        grid.connected = nodes

    strategy = FLMarket(
        ChangingAfterRound(3, join, fraction_evaluate=0.0),
        market_config=market(num_winners=2),
        relaunch=RelaunchPolicy(every_rounds=1),
    )
    with caplog.at_level(logging.INFO):
        strategy.start(grid=grid, initial_arrays=INITIAL, num_rounds=5, train_config=TRAIN)

    ran = [(entry.first_round, entry.outcome.status) for entry in strategy.markets]
    assert ran == [(1, "succeeded"), (2, "skipped"), (4, "succeeded"), (5, "skipped")]  # rounds 3: stopped, silent
    assert strategy.markets[2].outcome.invited == nodes[6:] and strategy.markets[2].joined
    text = caplog.text
    assert text.count("re-launching stops") == 2 and text.count("re-launching resumes") == 1
