"""Include and exclude: nodes that train outside the auction for a fixed payment, and nodes never invited."""

from __future__ import annotations

import math

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.app import ConfigRecord, MessageType
from flwr.serverapp.strategy import FedAvg
from hypothesis import given, settings
from hypothesis import strategies as st
from test_market_phase import make_counts, true_scores_and_bids
from test_strategy import INITIAL, market_grid, receivers, wrapped

from flmarket_flwr.app.run_config import check_run_config, membership_of
from flmarket_flwr.market import CostBasedBid, FLMarket, MarketConfig, MarketError, MarketPhase, read_award
from flmarket_flwr.market.buyer.membership import auction_budget, parse_node_ids, plan_membership
from flmarket_flwr.market.wire.award import (
    Award,
    AwardError,
    AwardTerms,
    SignedAward,
    build_award,
    check_award,
    sign_award,
)
from flmarket_flwr.pricing import run_auction
from simulations.inprocess_grid import InProcessGrid, market_client_app

NUM_CLASSES = 10
KEY = Ed25519PrivateKey.generate()


def config(**overrides: object) -> MarketConfig:
    values: dict[str, object] = {"budget": 100.0, "num_classes": NUM_CLASSES, "poll_interval": 0.001}
    values.update(overrides)
    return MarketConfig(**values)  # type: ignore[arg-type]


# --- Bad input: a clear error naming the key ---------------------------------------------------
def test_run_config_lists_are_parsed_and_bad_entries_name_the_key() -> None:
    assert parse_node_ids("market-include", "") == ()
    assert parse_node_ids("market-include", " 12, 345 ") == (12, 345)
    assert membership_of("12, 345", 7.5, "9") == ({12: 7.5, 345: 7.5}, (9,))
    assert membership_of("12, tag:partner", 2.0, "tag:rival") == ({12: 2.0, "partner": 2.0}, ("rival",))
    with pytest.raises(ValueError, match=r"market-exclude=.*'x' is neither a node id nor tag:<label>"):
        membership_of("", 0.0, "1, x")
    with pytest.raises(ValueError, match=r"market-include=.*'tag:' is neither"):
        membership_of("tag:", 0.0, "")
    with pytest.raises(ValueError, match="market-include=.*3 is listed twice"):
        membership_of("3, 3", 0.0, "")
    with pytest.raises(ValueError, match="run-config key market-include="):
        check_run_config({"market-include": "12; 13"})
    with pytest.raises(ValueError, match="run-config key market-include-payment="):
        check_run_config({"market-include-payment": -1.0})
    assert check_run_config({"market-include": "12", "market-exclude": "13"})["market-include"] == "12"


def test_a_node_in_both_lists_is_refused_naming_both_keys() -> None:
    with pytest.raises(ValueError, match=r"\[5\] are in both include \(run config market-include\) and "):
        config(include={5: 1.0, 6: 1.0}, exclude=(5,))
    with pytest.raises(ValueError, match=r"\['p'\] are in both include"):
        config(include={"p": 1.0}, exclude=("p",))


@pytest.mark.parametrize("payments", [{1: 50.0, 2: 50.0}, {1: 100.0}, {1: 70.0, 2: 40.0}])
def test_an_include_set_that_exhausts_the_budget_is_refused(payments: dict[int, float]) -> None:
    with pytest.raises(ValueError, match=r"include \(run config market-include\).*leaves no budget for the auction"):
        config(include=payments)


@pytest.mark.parametrize("payment", [-1.0, math.inf, math.nan])
def test_a_bad_fixed_payment_is_refused(payment: float) -> None:
    with pytest.raises(ValueError, match="market-include-payment"):
        config(include={1: payment})


def test_an_unknown_node_in_either_list_is_a_market_error_naming_the_key() -> None:
    counts = make_counts(6, seed=1)
    nodes = sorted(counts)
    for cfg, key in ((config(include={12345: 1.0}), "market-include"), (config(exclude=(12345,)), "market-exclude")):
        grid = InProcessGrid(market_client_app(counts), nodes)
        with pytest.raises(MarketError, match=rf"{key}\): node\(s\) \[12345\] are not connected"):
            MarketPhase(cfg).run(grid)
        assert grid.sent == []  # refused before any market message


def test_too_few_nodes_left_for_the_auction_is_a_market_error() -> None:
    counts = make_counts(4, seed=2)
    nodes = sorted(counts)
    grid = InProcessGrid(market_client_app(counts), nodes)
    with pytest.raises(MarketError, match="left for the auction after market-include and market-exclude"):
        MarketPhase(config(include={nodes[0]: 1.0}, exclude=(nodes[1],))).run(grid)


# --- The auction over the rest is the plain auction with R' --------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    budget=st.floats(1.0, 1e4),
    shares=st.lists(st.floats(0.0, 1.0), min_size=0, max_size=4),
    bidders=st.lists(st.tuples(st.floats(0.01, 1.0), st.floats(0.01, 500.0)), min_size=1, max_size=12),
    cap=st.integers(0, 5),
)
def test_payments_stay_within_r_and_the_auction_over_the_rest_is_run_auction_with_r_prime(
    budget: float, shares: list[float], bidders: list[tuple[float, float]], cap: int
) -> None:
    included = {10_000 + i: budget * share / (len(shares) + 1) for i, share in enumerate(shares)}
    r_prime = auction_budget(budget, included.values())
    bids = {node: pair for node, pair in enumerate(bidders)}
    terms = AwardTerms(r_prime, cap, KEY.public_key().public_bytes_raw())

    survivors = list(enumerate(sorted(bids), start=1))
    award, tree = build_award(1, b"s", b"t", terms, survivors, bids, included)

    plain = run_auction(
        [s for s, _ in bidders], [b for _, b in bidders], r_prime, num_winners=min(cap, len(bids)) or None
    )
    assert award.winners == tuple(int(i) for i in plain.winners)
    listed = [award.payments.get(node, 0.0) for node in bids]  # the award lists the auction's decisive head
    assert listed == pytest.approx(plain.payments.tolist(), rel=1e-12, abs=1e-12)
    assert dict(award.included) == included
    assert math.fsum([*award.payments.values(), *included.values()]) <= budget * (1 + 1e-12)
    decoded = SignedAward(*_signed(award)).verify(terms.buyer_key)
    assert decoded == award
    for rank, (index, node) in enumerate(survivors):
        score, bid = bids[node]
        check_award(decoded, run_id=1, session=b"s", transcript=b"t", terms=terms, survivors=len(survivors),
                    rank=rank, index=index, node_id=node, score=score, bid=bid, proof=tree.proof(node))  # fmt: skip


def _signed(award: Award) -> tuple[bytes, bytes]:
    signed = sign_award(award, KEY)
    return signed.encoded, signed.signature


def test_an_award_that_lists_a_bidder_as_included_or_a_negative_payment_is_refused() -> None:
    terms = AwardTerms(10.0, 0, KEY.public_key().public_bytes_raw())
    with pytest.raises(AwardError, match="no bidders"):
        build_award(1, b"s", b"t", terms, [(1, 1), (2, 2)], {1: (0.5, 1.0), 2: (0.5, 1.0)}, {2: 1.0})
    with pytest.raises(AwardError, match="finite and >= 0"):
        build_award(1, b"s", b"t", terms, [(1, 1)], {1: (0.5, 1.0)}, {3: -1.0})


# --- The market phase and the strategy ------------------------------------------------------------
def test_included_nodes_skip_the_market_excluded_nodes_are_never_contacted_and_r_prime_binds() -> None:
    counts = make_counts(8, seed=4)
    nodes = sorted(counts)
    included, excluded = {nodes[0]: 12.5, nodes[1]: 7.5}, (nodes[2],)
    policy = CostBasedBid(cost_per_sample=0.05, markup=0.2)
    grid = InProcessGrid(market_client_app(counts, policy), nodes)
    cfg = config(budget=60.0, include=included, exclude=excluded)

    outcome = MarketPhase(cfg).run(grid)

    contacted = {message.metadata.dst_node_id for message in grid.sent}
    assert contacted.isdisjoint([*included, *excluded])
    rest = nodes[3:]
    assert outcome.invited == rest and outcome.pass_participants == rest
    # The auction over the rest is run_auction with R' = 60 - 20, on the sum of the rest's counts.
    rest_counts = {node: counts[node] for node in rest}
    _, scores, bids = true_scores_and_bids(rest_counts, policy, grid)
    plain = run_auction(scores, bids, 40.0)
    assert outcome.winners == [rest[int(i)] for i in plain.winners]
    assert outcome.included == included
    assert outcome.payments == pytest.approx(
        {**{node: float(plain.payments[i]) for i, node in enumerate(rest)}, **included}
    )
    assert outcome.total_payment <= 60.0 and outcome.within_budget
    assert outcome.cohort == sorted(included) + outcome.winners
    assert outcome.to_dict()["included"] == included
    # Every bidder holds the signed award, which records the included nodes and their payments.
    held = read_award(grid.context(rest[0]))
    assert held is not None and held.award is not None and held.signature is not None and held.buyer_key is not None
    recorded = SignedAward(held.award, held.signature).verify(held.buyer_key)
    assert dict(recorded.included) == included and recorded.terms.budget == pytest.approx(40.0)


def test_flmarket_trains_the_included_nodes_with_the_winners() -> None:
    grid = market_grid(num_nodes=7)
    nodes = sorted(grid.node_ids)
    strategy = wrapped(FedAvg(fraction_evaluate=0.0), include={nodes[0]: 5.0}, exclude=[nodes[1]], num_winners=2)
    strategy.start(grid=grid, initial_arrays=INITIAL, num_rounds=2, train_config=ConfigRecord({"lr": 0.1}))

    outcome = strategy.market_outcome
    assert outcome is not None and len(outcome.winners) == 2
    assert sorted(receivers(grid, MessageType.TRAIN)) == sorted([nodes[0], *outcome.winners] * 2)
    assert nodes[1] not in {message.metadata.dst_node_id for message in grid.sent}
    report = strategy.delivery_report()
    assert report["winners"][str(nodes[0])]["award"] == pytest.approx(5.0)


def test_flmarket_takes_include_and_exclude_as_arguments() -> None:
    strategy = FLMarket(FedAvg(), budget=10.0, num_classes=3, include={4: 1.0}, exclude=[5])
    assert strategy.market_config.include == {4: 1.0} and strategy.market_config.exclude == (5,)
    with pytest.raises(ValueError, match="in both"):
        FLMarket(FedAvg(), budget=10.0, num_classes=3, include={4: 1.0}, exclude=[4])
    assert np.isclose(auction_budget(10.0, [1.0, 2.0]), 7.0)
    plan = plan_membership([1, 2, 3, 4, 5], {2: 1.0}, [4], 10.0)
    assert (plan.included, plan.invited, plan.excluded) == ({2: 1.0}, [1, 3, 5], [4])


# --- By tag: the node's declared market-tag ----------------------------------------------------------
def test_tags_are_resolved_against_the_connected_nodes_declarations() -> None:
    tags = {1: "partner", 2: "partner", 3: "rival", 4: "", 5: ""}
    plan = plan_membership([1, 2, 3, 4, 5], {"partner": 2.0, 1: 3.0}, ["rival"], 10.0, tags)
    assert (plan.included, plan.invited, plan.excluded) == ({1: 3.0, 2: 2.0}, [4, 5], [3])  # the id's payment wins
    with pytest.raises(ValueError, match=r"market-include\): no connected node declares the tag\(s\) \['gone'\]"):
        plan_membership([1, 2, 3], {"gone": 1.0}, [], 10.0, tags)
    with pytest.raises(ValueError, match=r"node\(s\) \[3\] are both included and excluded"):
        plan_membership([1, 2, 3], {3: 1.0}, ["rival"], 10.0, tags)
    with pytest.raises(ValueError, match="leaves no budget"):
        plan_membership([1, 2, 3], {"partner": 5.0}, [], 10.0, tags)


def test_a_market_includes_and_excludes_by_tag_and_a_node_silent_at_the_tags_step_is_left_out() -> None:
    counts = make_counts(9, seed=6)
    nodes = sorted(counts)
    declared = {nodes[0]: "partner", nodes[1]: "rival", nodes[2]: "rival"}
    silent = nodes[3]
    configs = {node: {"market-tag": declared.get(node, "")} for node in nodes}

    def hook(message, reply):  # type: ignore[no-untyped-def]
        return None if message.metadata.dst_node_id == silent else reply

    grid = InProcessGrid(market_client_app(counts), nodes, node_configs=configs, reply_hook=hook)
    outcome = MarketPhase(config(include={"partner": 4.0}, exclude=("rival",), timeout=0.5)).run(grid)

    assert outcome.included == {nodes[0]: 4.0}
    assert outcome.invited == nodes[4:] and outcome.excluded[silent].startswith("market_tags: no reply")
    asked = {m.metadata.dst_node_id for m in grid.sent if m.metadata.message_type == "query.market_tags"}
    assert asked == set(nodes)
    others = {m.metadata.dst_node_id for m in grid.sent if m.metadata.message_type != "query.market_tags"}
    assert others == set(nodes[4:])  # the included, the rivals and the silent node get nothing else
