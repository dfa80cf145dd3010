"""The market phase over real Flower messages, against real ClientApps, in one process.

Every test drives ``MarketPhase.run`` over an ``InProcessGrid``: messages cross Flower's wire
format, each node's ``Context`` is rebuilt from protobuf bytes for every message (fresh-process
semantics), and replies come back shuffled.
"""

from __future__ import annotations

import json
import logging
import time

import numpy as np
import pytest

from flmarket_flwr.market import (
    CostBasedBid,
    MarketConfig,
    MarketError,
    MarketOutcome,
    MarketPhase,
    SimulatedCostBid,
    read_award,
    simulated_cost_per_sample,
)
from flmarket_flwr.market.wire.award import SignedAward
from flmarket_flwr.market.wire.messages import RECORD_KEY
from flmarket_flwr.pricing import cohort_budget, run_auction, score
from simulations.inprocess_grid import InProcessGrid, market_client_app

NUM_CLASSES = 10


def make_counts(num_nodes: int, seed: int = 0, num_classes: int = NUM_CLASSES) -> dict[int, np.ndarray]:
    """Label counts of ``num_nodes`` nodes with large random node ids (like Flower's)."""
    rng = np.random.default_rng(seed)
    node_ids = sorted({int(n) for n in rng.integers(1, 2**62, size=num_nodes)})
    assert len(node_ids) == num_nodes
    return {node: rng.integers(1, 60, size=num_classes) for node in node_ids}


def config(**overrides: object) -> MarketConfig:
    values: dict[object, object] = {"budget": 100.0, "num_classes": NUM_CLASSES, "poll_interval": 0.001}
    values.update(overrides)
    return MarketConfig(**values)  # type: ignore[arg-type]


def true_scores_and_bids(counts: dict[int, np.ndarray], policy, grid: InProcessGrid):
    """Every client's true score and bid, computed here from its counts (node ids ascending)."""
    nodes = sorted(counts)
    total = np.sum([counts[n] for n in nodes], axis=0)
    scores = [score(counts[n], total, len(nodes)) for n in nodes]
    bids = [policy(counts[n], s, grid.context(n)) for n, s in zip(nodes, scores, strict=True)]
    return total, scores, bids


def expected_auction(counts: dict[int, np.ndarray], policy, grid: InProcessGrid, cfg: MarketConfig):
    """Winners and payments of the product's one rule on the clients' true scores and bids."""
    nodes = sorted(counts)
    total, scores, bids = true_scores_and_bids(counts, policy, grid)
    result = run_auction(scores, bids, cfg.budget, num_winners=cfg.num_winners)
    winners = [nodes[i] for i in result.winners]
    payments = {node: float(result.payments[i]) for i, node in enumerate(nodes)}
    return total, scores, bids, winners, payments


@pytest.mark.parametrize("num_nodes, budget", [(3, 10.0), (8, 50.0), (20, 300.0), (20, 5.0)])
def test_outcome_equals_auction_on_true_scores_and_bids(num_nodes: int, budget: float) -> None:
    counts = make_counts(num_nodes, seed=num_nodes)
    policy = CostBasedBid(cost_per_sample=0.05, markup=0.2)
    grid = InProcessGrid(market_client_app(counts, policy), list(counts))
    cfg = config(budget=budget)

    outcome = MarketPhase(cfg).run(grid)

    total, scores, bids, winners, payments = expected_auction(counts, policy, grid, cfg)
    assert outcome.global_counts == [int(c) for c in total]
    assert outcome.participants == sorted(counts)
    assert outcome.pass_participants == sorted(counts)
    assert outcome.scores == dict(zip(sorted(counts), scores, strict=True))
    assert outcome.bids == dict(zip(sorted(counts), bids, strict=True))
    assert outcome.winners == winners
    assert outcome.payments == payments
    assert outcome.total_payment == pytest.approx(sum(payments.values()))
    assert outcome.total_payment <= budget * (1 + 1e-12)
    assert outcome.within_budget
    assert outcome.excluded == {}
    assert sorted(outcome.audited) == sorted(outcome.winners)
    assert outcome.award_acknowledged == sorted(counts)
    for winner in outcome.winners:
        assert outcome.payments[winner] >= outcome.bids[winner]
    assert set(outcome.timings) == {"wait_for_nodes", "pass", "bid", "auction", "award", "total"}


def test_a_cohort_cap_selects_num_winners_when_the_budget_buys_them() -> None:
    counts = make_counts(10, seed=3)
    policy = CostBasedBid(0.1)
    grid = InProcessGrid(market_client_app(counts, policy), list(counts))
    _, scores, bids = true_scores_and_bids(counts, policy, grid)
    cfg = config(budget=cohort_budget(scores, bids, 4), num_winners=4)

    outcome = MarketPhase(cfg).run(grid)

    _, _, _, winners, payments = expected_auction(counts, policy, grid, cfg)
    assert len(outcome.winners) == 4
    assert outcome.winners == winners
    assert outcome.payments == payments
    assert outcome.num_winners == 4
    assert outcome.total_payment <= cfg.budget and outcome.within_budget


def test_a_cohort_cap_keeps_the_total_payment_within_a_binding_budget() -> None:
    """Issue 20: a cohort of every node at a budget below the bids' sum once paid 657 of 600; now the total binds."""
    counts = make_counts(5, seed=3)
    policy = CostBasedBid(0.1)
    grid = InProcessGrid(market_client_app(counts, policy), list(counts))
    _, _, bids = true_scores_and_bids(counts, policy, grid)
    budget = 0.9 * sum(bids)
    cfg = config(budget=budget, num_winners=5)

    outcome = MarketPhase(cfg).run(grid)

    assert 0 < len(outcome.winners) < 5
    assert outcome.total_payment <= budget
    assert outcome.within_budget
    assert all(outcome.payments[w] >= outcome.bids[w] for w in outcome.winners)
    _, _, _, winners, payments = expected_auction(counts, policy, grid, cfg)
    assert outcome.winners == winners and outcome.payments == payments


def test_a_cohort_larger_than_the_connected_nodes_is_an_error_naming_the_key() -> None:
    counts = make_counts(5, seed=3)
    grid = InProcessGrid(market_client_app(counts), list(counts))
    with pytest.raises(MarketError, match="num-selected"):
        MarketPhase(config(num_winners=50)).run(grid)
    assert not [m for m in grid.sent if m.metadata.message_type.endswith("market_advertise")], "stopped before PASS"


def test_bids_above_the_budget_lose_and_move_no_payment() -> None:
    counts = make_counts(8, seed=21)
    nodes = sorted(counts)
    greedy = nodes[3]

    def policy(label_counts, client_score, context):  # type: ignore[no-untyped-def]
        return 1e6 if context.node_id == greedy else 0.05 * float(label_counts.sum())

    grid = InProcessGrid(market_client_app(counts, policy), nodes)
    cfg = config(budget=40.0)
    outcome = MarketPhase(cfg).run(grid)

    assert greedy in outcome.participants and outcome.bids[greedy] == 1e6
    assert greedy not in outcome.winners and outcome.payments[greedy] == 0.0
    assert greedy not in outcome.excluded
    others = [n for n in nodes if n != greedy]
    result = run_auction([outcome.scores[n] for n in others], [outcome.bids[n] for n in others], cfg.budget)
    assert outcome.winners == [others[i] for i in result.winners]
    assert [outcome.payments[n] for n in others] == [float(p) for p in result.payments]
    assert read_award(grid.context(greedy)).won is False


def test_all_zero_global_counts_are_a_clear_error() -> None:
    counts = {node: np.zeros(NUM_CLASSES, dtype=np.int64) for node in make_counts(4, seed=22)}
    grid = InProcessGrid(market_client_app(counts), list(counts))

    with pytest.raises(MarketError, match="no client holds data"):
        MarketPhase(config()).run(grid)
    assert not [m for m in grid.sent if m.metadata.message_type.endswith("market_bid")]
    for node in counts:  # told the market closed, PASS state wiped
        state = grid.context(node).state.config_records[RECORD_KEY]
        assert {k for k in state if k.startswith("pass/")} <= {"pass/session", "pass/stage", "pass/unmask_requested"}


def test_without_audits_no_counts_are_opened() -> None:
    counts = make_counts(7, seed=23)
    grid = InProcessGrid(market_client_app(counts, CostBasedBid(0.05)), list(counts))

    outcome = MarketPhase(config(audit_winners=False, budget=40.0)).run(grid)

    assert outcome.winners and outcome.audited == []
    assert not [m for m in grid.sent if m.metadata.message_type.endswith("market_audit")]


def test_heterogeneous_simulated_costs_reach_the_auction() -> None:
    counts = make_counts(6, seed=4)
    policy = SimulatedCostBid(seed=7, low=0.5, high=2.0, markup=0.0)
    grid = InProcessGrid(market_client_app(counts, policy), list(counts))

    outcome = MarketPhase(config()).run(grid)

    for position, node in enumerate(sorted(counts)):
        cost = simulated_cost_per_sample(position, seed=7, low=0.5, high=2.0)
        assert outcome.bids[node] == pytest.approx(cost * counts[node].sum())
    assert len(set(outcome.bids[n] / counts[n].sum() for n in counts)) == len(counts)


def test_reply_order_does_not_change_the_outcome() -> None:
    counts = make_counts(9, seed=5)
    outcomes = []
    for shuffle_seed in (None, 1, 2):
        grid = InProcessGrid(market_client_app(counts), list(counts), shuffle_seed=shuffle_seed)
        outcomes.append(MarketPhase(config()).run(grid))
    for outcome in outcomes[1:]:
        assert outcome.winners == outcomes[0].winners
        assert outcome.payments == outcomes[0].payments
        assert outcome.global_counts == outcomes[0].global_counts


def test_awards_are_recorded_in_client_state_and_pass_keys_purged() -> None:
    counts = make_counts(7, seed=6)
    grid = InProcessGrid(market_client_app(counts, CostBasedBid(0.05)), list(counts))

    outcome = MarketPhase(config(budget=40.0)).run(grid)

    assert outcome.winners
    for node in counts:
        context = grid.context(node)
        award = read_award(context)
        assert award is not None
        assert award.won == (node in outcome.winners)
        assert award.payment == outcome.payments[node]
        assert award.score == outcome.scores[node]
        assert award.bid == outcome.bids[node]
        assert award.award is not None and award.signature is not None and award.buyer_key is not None
        assert SignedAward(award.award, award.signature).digest == outcome.award_digest  # the receipt verifies
        assert (
            SignedAward(award.award, award.signature).verify(award.buyer_key).payments.get(node, 0.0) == award.payment
        )  # the head lists the winners
        state = context.state.config_records[RECORD_KEY]
        assert {key for key in state if key.startswith("pass/")} <= {
            "pass/session",
            "pass/stage",
            "pass/unmask_requested",
        }
        public = (state.get("pass/session"), award.buyer_key)  # the buyer's public key is kept with the receipt
        for value in state.values():  # no key material survives the award
            assert not (isinstance(value, bytes) and len(value) == 32 and value not in public)


def test_a_budget_too_small_for_anyone_gives_no_winners_but_completes() -> None:
    counts = make_counts(5, seed=13)
    grid = InProcessGrid(market_client_app(counts, CostBasedBid(10.0)), list(counts))

    outcome = MarketPhase(config(budget=1.0)).run(grid)

    assert outcome.winners == []
    assert outcome.total_payment == 0.0
    assert all(read_award(grid.context(node)).won is False for node in counts)


def test_outcome_to_dict_and_save_json(tmp_path) -> None:
    counts = make_counts(5, seed=8)
    grid = InProcessGrid(market_client_app(counts), list(counts))
    outcome = MarketPhase(config()).run(grid)

    path = outcome.save_json(tmp_path / "out" / "market.json")
    loaded = json.loads(path.read_text())

    assert loaded["winners"] == outcome.winners
    assert loaded["global_counts"] == outcome.global_counts
    assert {int(k): v for k, v in loaded["payments"].items()} == outcome.payments
    assert loaded["budget"] == 100.0
    assert loaded["audited"] == outcome.audited and sorted(loaded["audited"]) == sorted(outcome.winners)
    assert loaded["pass_participants"] == outcome.pass_participants
    assert outcome.to_dict()["scores"] == outcome.scores
    assert isinstance(outcome, MarketOutcome)


class SlowGrid(InProcessGrid):
    """Nodes appear only after a few polls, as in simulation where main starts first."""

    def __init__(self, *args: object, appear_after: int, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.polls = 0
        self.appear_after = appear_after

    def get_node_ids(self) -> list[int]:
        self.polls += 1
        return list(self.connected) if self.polls > self.appear_after else []


def test_waits_for_nodes_that_connect_late() -> None:
    counts = make_counts(5, seed=9)
    grid = SlowGrid(market_client_app(counts), list(counts), appear_after=3)

    outcome = MarketPhase(config(wait_for_nodes_timeout=5.0)).run(grid)

    assert grid.polls > 3
    assert outcome.pass_participants == sorted(counts)


def test_expected_nodes_waits_then_goes_on_with_those_present(caplog: pytest.LogCaptureFixture) -> None:
    counts = make_counts(5, seed=10)
    grid = InProcessGrid(market_client_app(counts), list(counts))
    grid.connected = sorted(counts)[:4]

    with caplog.at_level(logging.WARNING, logger="flwr"):
        outcome = MarketPhase(config(expected_nodes=5, wait_for_nodes_timeout=0.05)).run(grid)

    assert outcome.pass_participants == sorted(counts)[:4]
    assert "4 of 5 expected nodes" in caplog.text


def test_too_few_nodes_is_a_clear_error() -> None:
    counts = make_counts(5, seed=11)
    grid = InProcessGrid(market_client_app(counts), list(counts))
    grid.connected = sorted(counts)[:2]

    with pytest.raises(MarketError, match="only 2 node.*at least 3"):
        MarketPhase(config(wait_for_nodes_timeout=0.02)).run(grid)
    assert grid.sent == []


def test_min_clients_above_three_is_enforced() -> None:
    counts = make_counts(4, seed=12)
    grid = InProcessGrid(market_client_app(counts), list(counts))

    with pytest.raises(MarketError, match="at least 5"):
        MarketPhase(config(min_clients=5, wait_for_nodes_timeout=0.02)).run(grid)


@pytest.mark.parametrize(
    "overrides, error, match",
    [
        ({"budget": 0.0}, ValueError, "budget"),
        ({"budget": -1.0}, ValueError, "budget"),
        ({"budget": float("nan")}, ValueError, "budget"),
        ({"budget": float("inf")}, ValueError, "budget"),
        ({"budget": "10"}, TypeError, "budget"),
        ({"num_classes": 0}, ValueError, "num_classes"),
        ({"num_classes": 2.0}, TypeError, "num_classes"),
        ({"num_classes": True}, TypeError, "num_classes"),
        ({"num_winners": 0}, ValueError, "num_winners"),
        ({"min_clients": 2}, ValueError, "min_clients"),
        ({"count_bound": 0}, ValueError, "count_bound"),
        ({"count_bound": 1.5}, TypeError, "count_bound"),
        ({"neighbours": 1}, ValueError, "neighbours"),
        ({"neighbours": "some"}, TypeError, "neighbours"),
        ({"audit_winners": 1}, TypeError, "audit_winners"),
        ({"timeout": 0.0}, ValueError, "timeout"),
        ({"wait_for_nodes_timeout": -1.0}, ValueError, "wait_for_nodes_timeout"),
        ({"expected_nodes": 2}, ValueError, "expected_nodes"),
        ({"session_label": ""}, ValueError, "session_label"),
        ({"poll_interval": 0.0}, ValueError, "poll_interval"),
    ],
)
def test_config_validation(overrides: dict[str, object], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        config(**overrides)


def test_config_defaults() -> None:
    cfg = MarketConfig(budget=10.0, num_classes=3)
    assert cfg.num_winners is None
    assert cfg.min_clients == 3
    assert cfg.count_bound == 10**9
    assert cfg.neighbours == "auto"
    assert cfg.directory is None
    assert cfg.audit_winners is True
    assert cfg.timeout == 60.0
    assert cfg.wait_for_nodes_timeout == 120.0  # the app key wait-for-nodes-timeout reads this one default
    assert cfg.expected_nodes is None
    assert cfg.session_label == "flmarket"
    with pytest.raises(AttributeError):
        cfg.budget = 5.0  # type: ignore[misc]


def test_handlers_keep_no_state_outside_context_state() -> None:
    """A fresh ClientApp for every message (deployment loads the app per message) changes nothing."""
    counts = make_counts(6, seed=14)
    loaded: list[object] = []

    def fresh_app():  # type: ignore[no-untyped-def]
        app = market_client_app(counts, CostBasedBid(0.05))
        loaded.append(app)
        return app

    outcome = MarketPhase(config()).run(InProcessGrid(fresh_app, list(counts)))
    reference = MarketPhase(config()).run(InProcessGrid(market_client_app(counts, CostBasedBid(0.05)), list(counts)))

    # Four PASS rounds, the bid, the endorsement and the award for every node, and the audit of each winner.
    assert len({id(app) for app in loaded}) == len(loaded) == 7 * len(counts) + len(outcome.winners)
    assert outcome.global_counts == reference.global_counts
    assert outcome.winners == reference.winners
    assert outcome.payments == reference.payments


class GrowingGrid(InProcessGrid):
    """``get_node_ids`` reveals one more node per poll (from 3), up to ``limit`` nodes."""

    def __init__(self, *args: object, limit: int, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.visible = 3
        self.limit = limit

    def get_node_ids(self) -> list[int]:
        ids = self.connected[: self.visible]
        self.visible = min(self.visible + 1, self.limit)
        return ids


def test_without_expected_nodes_the_wait_lasts_until_the_node_set_settles() -> None:
    counts = make_counts(6, seed=15)
    grid = GrowingGrid(market_client_app(counts, CostBasedBid(0.05)), list(counts), limit=6)

    outcome = MarketPhase(config(wait_for_nodes_timeout=5.0)).run(grid)

    assert outcome.pass_participants == sorted(counts)


def test_a_node_set_that_never_settles_is_still_bounded_by_the_timeout() -> None:
    counts = make_counts(40, seed=16)
    grid = GrowingGrid(market_client_app(counts, CostBasedBid(0.05)), list(counts), limit=40)

    outcome = MarketPhase(config(wait_for_nodes_timeout=0.02, poll_interval=0.001)).run(grid)

    assert 3 <= len(outcome.pass_participants) < 40


def test_too_few_nodes_stop_the_wait_once_none_joins_and_name_the_fix(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 23: Flower's default simulated federation (2 SuperNodes) once cost a 60 s wait and 60 log lines."""
    counts = make_counts(5, seed=11)
    grid = InProcessGrid(market_client_app(counts), list(counts))
    grid.connected = sorted(counts)[:2]
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="flwr"):
        with pytest.raises(MarketError, match=r'only 2 node.*--federation-config "num-supernodes=N" with N >= 3'):
            MarketPhase(config(wait_for_nodes_timeout=60.0, stall_timeout=0.3, poll_interval=0.05)).run(grid)
    assert time.monotonic() - started < 5.0, "the wait went on although no node joined"
    assert caplog.text.count("waiting for nodes") == 1, "one progress line, not one per poll"
    assert grid.sent == []


@pytest.mark.parametrize("run_id", [2**63, 2**64 - 1], ids=["2**63", "2**64-1"])
def test_a_run_id_in_the_upper_half_of_uint64_is_a_valid_run(run_id: int) -> None:
    """Flower draws run ids from uint64: half of all runs have one >= 2**63, and every client must take part."""
    counts = make_counts(5, seed=4)
    grid = InProcessGrid(market_client_app(counts, CostBasedBid(0.05)), list(counts), run_id=run_id)
    outcome = MarketPhase(config()).run(grid)
    assert outcome.pass_participants == sorted(counts) and outcome.excluded == {}
