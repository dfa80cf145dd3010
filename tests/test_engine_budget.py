"""The engine's fixed-budget market mode and its round-budget endpoint.

``budget_fraction`` fixes the auction's budget at a fraction of the total bid before selection; a baseline with
``num_selected=0`` in that mode takes as many clients as FLMarket's auction buys on the same partition (the
matched cohort); ``auc_accuracy`` is the mean accuracy over the rounds run.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flmarket_flwr.pricing import run_auction
from simulations.baselines.selectors import flmarket_scores, select_clients, select_within_budget
from simulations.engine import (
    EngineConfig,
    _protocol,
    _Training,
    auc_accuracy,
    auction_budget,
    bids_for,
    load_federation,
    run_engine,
    select,
)

BUDGET_MODE = EngineConfig(
    dataset="digits", test_per_class=30, distribution="d6", seed=3, num_selected=0, budget_fraction=0.2
)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.mark.parametrize("bid_policy", ["volume", "constant"])
@given(fraction=st.floats(min_value=0.01, max_value=2.0))
@settings(max_examples=40, deadline=None)
def test_budget_fraction_fixes_r_at_that_share_of_the_total_bid(bid_policy: str, fraction: float) -> None:
    cfg = replace(BUDGET_MODE, bid_policy=bid_policy, budget_fraction=fraction, num_selected=5)
    counts = load_federation(cfg).label_counts
    bids = bids_for(cfg, counts)
    budget = auction_budget(cfg, flmarket_scores(counts), bids)
    assert budget == pytest.approx(fraction * bids.sum())  # the cohort's least budget is not used
    positions, market = select(cfg, load_federation(cfg))
    assert market["budget"] == pytest.approx(budget) and market["total_payment"] <= budget * (1 + 1e-12)
    assert len(positions) <= 5


@pytest.mark.parametrize("selector", ["rs", "qbs", "dice", "dds"])
@pytest.mark.parametrize("bid_policy", ["volume", "constant"])
def test_a_baseline_in_budget_mode_takes_as_many_clients_as_flmarket_buys(selector: str, bid_policy: str) -> None:
    cfg = replace(BUDGET_MODE, bid_policy=bid_policy)
    federation = load_federation(cfg)
    winners, market = select(cfg, federation)
    chosen, matched = select(replace(cfg, selector=selector), federation)
    assert len(chosen) == len(winners) == matched["matched_cohort"] >= 1
    assert matched["budget"] == pytest.approx(market["budget"])
    fixed, _ = select(replace(cfg, selector=selector, num_selected=len(winners)), federation)
    assert chosen == fixed  # the same selector, told the count


def test_a_baseline_matched_to_an_auction_that_buys_nobody_buys_nobody() -> None:
    cfg = replace(BUDGET_MODE, budget_fraction=1e-9, selector="rs")
    counts = load_federation(cfg).label_counts
    bids = bids_for(cfg, counts)
    assert not run_auction(
        flmarket_scores(counts), bids, auction_budget(cfg, flmarket_scores(counts), bids)
    ).winners.size
    chosen, matched = select(cfg, load_federation(cfg))
    assert chosen == [] and matched["matched_cohort"] == 0


def test_budget_mode_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="budget_fraction"):
        EngineConfig(budget_fraction=-0.1)
    with pytest.raises(ValueError, match="budget_fraction"):
        EngineConfig(budget_fraction=math.inf)
    with pytest.raises(ValueError, match="num_selected >= 1, or num_selected=0 with budget_fraction"):
        EngineConfig(selector="rs", num_selected=0)
    with pytest.raises(ValueError, match="num-selected=-1"):
        EngineConfig(num_selected=-1)


def test_a_matched_baseline_run_records_the_match() -> None:
    cfg = replace(BUDGET_MODE, selector="qbs", rounds=2, local_steps=1, final_window=1)
    result = run_engine(cfg)
    matched = result["engine"]["matched"]
    assert len(result["selected_partitions"]) == matched["matched_cohort"] and "market" not in result


def test_auc_accuracy_is_the_mean_over_the_rounds_run() -> None:
    assert auc_accuracy([0.2, 0.4, 0.9]) == pytest.approx(0.5)
    assert math.isnan(auc_accuracy([])) and math.isnan(auc_accuracy([0.5, math.nan]))
    cfg = EngineConfig(final_window=2)
    rounds = [{"accuracy": a} for a in (0.1, 0.2, 0.4, 0.6, 0.8)]  # round 0 (the initial model) first
    summary = _protocol(cfg, _Training(rounds=rounds))
    assert summary["auc_accuracy"] == pytest.approx(0.5) and summary["final_accuracy"] == pytest.approx(0.7)
    diverged = _protocol(cfg, _Training(rounds=[{"accuracy": 0.3}, {"accuracy": math.nan}], diverged_at=2))
    assert math.isnan(diverged["auc_accuracy"])


def test_a_fixed_round_budget_run_records_its_auc() -> None:
    cfg = replace(BUDGET_MODE, selector="rs", num_selected=3, rounds=3, local_steps=1, final_window=1)
    result = run_engine(cfg)
    accuracies = [r["accuracy"] for r in result["rounds"][1:]]
    assert result["engine"]["auc_accuracy"] == pytest.approx(np.mean(accuracies))


# --- budget-matched baselines (issue 43: the buyer's question at equal money) ---------------------------------------
@st.composite
def _market(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, float, int]:
    clients = draw(st.integers(min_value=1, max_value=12))
    counts = np.array(
        draw(st.lists(st.lists(st.integers(0, 300), min_size=4, max_size=4), min_size=clients, max_size=clients))
    )
    bids = np.array(draw(st.lists(st.floats(0.1, 500.0), min_size=clients, max_size=clients)))
    budget = draw(st.floats(0.05, 1.2)) * float(bids.sum())
    return counts, bids, budget, draw(st.integers(0, 1000))


@pytest.mark.parametrize("selector", ["rs", "qbs", "dice", "dds"])
@given(market=_market())
@settings(max_examples=150, deadline=None)
def test_a_budget_matched_baseline_spends_at_most_r_and_leaves_nothing_affordable(
    selector: str, market: tuple[np.ndarray, np.ndarray, float, int]
) -> None:
    counts, bids, budget, seed = market
    bought = select_within_budget(selector, counts, bids, budget, seed=seed)
    assert len(set(bought.tolist())) == bought.size  # nobody bought twice
    spent = float(bids[bought].sum())
    assert spent <= budget * (1 + 1e-12)
    left_out = np.setdiff1d(np.arange(counts.shape[0]), bought)
    assert np.all(bids[left_out] > budget - spent - 1e-9 * budget)  # no client left out that the rest would pay for


@pytest.mark.parametrize("selector", ["rs", "qbs", "dice", "dds"])
@given(market=_market())
@settings(max_examples=60, deadline=None)
def test_with_money_for_everyone_a_baseline_buys_in_its_own_order(
    selector: str, market: tuple[np.ndarray, np.ndarray, float, int]
) -> None:
    counts, bids, _, seed = market
    bought = select_within_budget(selector, counts, bids, float(bids.sum()) * 1.01, seed=seed)
    assert bought.tolist() == select_clients(selector, counts, counts.shape[0], seed=seed).tolist()


def test_a_budget_matched_baseline_skips_a_client_it_cannot_pay_and_buys_the_next() -> None:
    counts = np.array([[100, 100], [90, 90], [5, 5], [4, 4]])  # QBS's order: 0, 1, 2, 3
    bids = np.array([200.0, 50.0, 10.0, 8.0])
    assert select_within_budget("qbs", counts, bids, 65.0).tolist() == [1, 2]  # 0 too dear; 3 no longer fits


def test_the_budget_rule_refuses_flmarket_and_bad_input() -> None:
    counts, bids = np.array([[1, 2], [3, 4]]), np.array([1.0, 2.0])
    with pytest.raises(ValueError, match="FLMarket buys by its own auction"):
        select_within_budget("flmarket", counts, bids, 1.0)
    with pytest.raises(ValueError, match="unknown selector"):
        select_within_budget("nope", counts, bids, 1.0)
    with pytest.raises(ValueError, match=r"bids must have shape \(2,\)"):
        select_within_budget("rs", counts, np.array([1.0]), 1.0)
    with pytest.raises(ValueError, match="bids must be finite and > 0"):
        select_within_budget("rs", counts, np.array([1.0, 0.0]), 1.0)
    with pytest.raises(ValueError, match="budget must be finite and > 0"):
        select_within_budget("rs", counts, bids, math.nan)
    with pytest.raises(ValueError, match="baseline_match must be one of"):
        EngineConfig(baseline_match="money")
    with pytest.raises(ValueError, match="set num_selected=0"):
        EngineConfig(selector="rs", num_selected=3, baseline_match="budget")


@pytest.mark.parametrize("selector", ["rs", "qbs", "dice", "dds"])
@pytest.mark.parametrize("bid_policy", ["volume", "constant"])
def test_in_the_engine_every_arm_spends_at_most_the_same_r(selector: str, bid_policy: str) -> None:
    cfg = replace(BUDGET_MODE, bid_policy=bid_policy, baseline_match="budget")
    federation = load_federation(cfg)
    _, market = select(cfg, federation)
    chosen, matched = select(replace(cfg, selector=selector), federation)
    bids = bids_for(cfg, federation.label_counts)
    assert matched["match"] == "budget" and matched["payment_rule"] == "pay-as-bid"
    assert matched["budget"] == pytest.approx(market["budget"])
    assert matched["paid"] == pytest.approx(bids[chosen].sum()) and matched["paid"] <= matched["budget"]
    assert market["total_payment"] <= market["budget"] * (1 + 1e-12)
    assert chosen  # R = 0.2 x the total bid pays for someone


@pytest.mark.parametrize("bid_policy", ["volume", "constant"])
def test_the_engine_runs_the_budget_rule_it_is_given_and_records_it(bid_policy: str) -> None:
    """``auction_budget_rule`` (run config ``auction-budget-rule``) reaches the engine's auction and its record; the
    budget-matched baselines and the cohort match follow the same rule's auction."""
    federation = load_federation(BUDGET_MODE)
    outcome = {}
    for rule in ("half", "whole"):
        cfg = replace(BUDGET_MODE, bid_policy=bid_policy, auction_budget_rule=rule)
        positions, market = select(cfg, federation)
        counts = federation.label_counts
        expected = run_auction(flmarket_scores(counts), bids_for(cfg, counts), market["budget"], budget_rule=rule)
        assert positions == [int(p) for p in expected.winners]
        assert market["budget_rule"] == rule and market["paid_share"] == pytest.approx(
            expected.total_payment / market["budget"]
        )
        matched = select(replace(cfg, selector="rs"), federation)[1]
        assert matched["matched_cohort"] == len(positions)
        outcome[rule] = market
    assert outcome["half"]["paid_share"] <= 0.5 < outcome["whole"]["paid_share"]
