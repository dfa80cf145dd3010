"""What a buyer reads off a grid's records (simulations.buyer): spend against R and time to accuracy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulations.buyer import CENSORED, TimeTo, median_rounds, rank_differences, spend, time_to
from simulations.engine import EngineConfig, run_engine


def _record(accuracies: list[float], cpu: bool = True) -> dict:
    rounds = [{"round": 0, "accuracy": 0.1}]
    for i, value in enumerate(accuracies, start=1):
        entry = {"round": i, "accuracy": value, "round_time_s": 1.0, "eval_time_s": 0.5}
        if cpu:
            entry["cpu_s"] = 2.0
        rounds.append(entry)
    return {"rounds": rounds}


def test_time_to_is_the_first_round_at_or_above_the_accuracy_and_the_seconds_through_it() -> None:
    found = time_to(_record([0.3, 0.59, 0.6, 0.2, 0.7]), 0.6)
    assert found == TimeTo(3.0, 6.0, True) and found.reached
    wall = time_to(_record([0.3, 0.59, 0.6], cpu=False), 0.6)
    assert wall == TimeTo(3.0, 4.5, False)
    never = time_to(_record([0.3, math.nan, 0.5]), 0.6)
    assert never.rounds == CENSORED and not never.reached and never.seconds == 6.0
    assert time_to(_record([0.1, 0.2]), 0.1).rounds == 1.0  # round 0, the initial model, does not count
    with pytest.raises(ValueError, match=r"accuracy must lie in \(0, 1\]"):
        time_to(_record([0.5]), 60.0)


@given(st.lists(st.one_of(st.integers(1, 30).map(float), st.just(CENSORED)), min_size=1, max_size=15))
@settings(max_examples=200, deadline=None)
def test_median_rounds_is_the_median_with_censored_runs_last(rounds: list[float]) -> None:
    times = [TimeTo(r, 0.0, True) for r in rounds]
    found = median_rounds(times)
    upper_middle = sorted(rounds)[len(rounds) // 2]
    if math.isinf(upper_middle):  # the median is not determined within the rounds run
        assert math.isinf(found)
    else:
        assert found == float(np.median(rounds))


def test_a_censored_run_ranks_after_every_run_that_reached_the_accuracy() -> None:
    mine = {("d4", 0): TimeTo(5.0, 0, True), ("d4", 1): TimeTo(CENSORED, 0, True), ("d4", 2): TimeTo(CENSORED, 0, True)}
    theirs = {
        ("d4", 0): TimeTo(CENSORED, 0, True),
        ("d4", 1): TimeTo(20.0, 0, True),
        ("d4", 2): TimeTo(CENSORED, 0, True),
    }
    assert rank_differences(mine, theirs) == [5.0 - 21.0, 21.0 - 20.0, 0.0]


def test_spend_reads_each_rule_and_prices_a_cohort_at_its_bids() -> None:
    cfg = EngineConfig(
        dataset="digits",
        test_per_class=30,
        distribution="d6",
        seed=3,
        num_selected=0,
        budget_fraction=0.2,
        rounds=1,
        local_steps=1,
        final_window=1,
    )
    flmarket = run_engine(cfg)
    cohort = run_engine(EngineConfig(**{**cfg.__dict__, "selector": "qbs"}))
    budget = run_engine(EngineConfig(**{**cfg.__dict__, "selector": "qbs", "baseline_match": "budget"}))
    mine = spend([flmarket])
    assert mine.rule == "critical payments" and mine.paid_share[0] <= 1.0 and mine.over_budget == 0
    bids = 1.2 * np.asarray(cohort["all_label_counts"]).sum(axis=1)
    priced = spend([cohort])
    assert priced.rule == "cohort at its bids"
    assert priced.paid_share[0] == pytest.approx(
        bids[cohort["selected_partitions"]].sum() / flmarket["market"]["budget"]
    )
    held = spend([budget])
    assert held.rule == "pay-as-bid" and held.paid_share[0] <= 1.0
    with pytest.raises(ValueError, match="more than one rule"):
        spend([cohort, budget])
