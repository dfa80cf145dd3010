"""Tests of the paired statistics: hand-computed small cases, scipy as an independent check, and properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as scipy_stats

from simulations.stats import (
    arms_by_policy,
    holm,
    holm_family,
    paired_comparison,
    report,
    t_interval,
    unit_comparison,
    unit_means,
    wilson_interval,
    win_share,
)


def _record(
    selector: str,
    distribution: str,
    seed: int,
    accuracy: float,
    *,
    num_selected: int = 10,
    bid_policy: str = "volume",
    diverged: bool = False,
) -> dict:
    return {
        "selector": selector,
        "dataset": "digits_xl",
        "distribution": distribution,
        "num_clients": 20,
        "num_selected": num_selected,
        "seed": seed,
        "final_accuracy": math.nan if diverged else accuracy,
        "engine": {
            "diverged": diverged,
            "config": {"schedule": "geometric", "alpha": 0.5, "val_per_class": 0, "bid_policy": bid_policy},
        },
    }


# --- Holm ----------------------------------------------------------------------------------------------------------


def test_holm_matches_the_definition() -> None:
    # sorted 0.01, 0.03, 0.04, 0.2 scaled by 4, 3, 2, 1: 0.04, 0.09, 0.08 -> 0.09 (monotone), 0.2
    np.testing.assert_allclose(holm([0.01, 0.04, 0.03, 0.2]), [0.04, 0.09, 0.09, 0.2])
    np.testing.assert_allclose(holm([0.5, 0.6]), [1.0, 1.0])


def test_holm_leaves_missing_tests_out_of_the_family() -> None:
    adjusted = holm([0.01, math.nan, 0.04])
    assert math.isnan(adjusted[1])
    np.testing.assert_allclose(adjusted[[0, 2]], [0.02, 0.04])  # m = 2, not 3
    assert np.isnan(holm([math.nan])).all() and holm([]).size == 0


@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=30))
def test_holm_never_lowers_a_p_value_and_keeps_the_order(p_values: list[float]) -> None:
    adjusted = holm(p_values)
    p = np.asarray(p_values)
    assert np.all(adjusted >= p - 1e-15) and np.all(adjusted <= 1.0)
    assert np.all(adjusted <= np.minimum(p * len(p), 1.0) + 1e-15)  # never worse than Bonferroni
    order = np.argsort(p, kind="stable")
    assert np.all(np.diff(adjusted[order]) >= -1e-15)


# --- intervals -----------------------------------------------------------------------------------------------------


def test_t_interval_by_hand_and_against_scipy() -> None:
    values = [0.02, 0.0, 0.05]
    # mean 0.023333, sd 0.025166, se 0.014530, t(0.975, 2) = 4.302653: half-width 0.062516
    low, high = t_interval(values)
    assert (low, high) == pytest.approx((-0.039183, 0.085849), abs=2e-6)
    reference = scipy_stats.ttest_1samp(values, 0.0).confidence_interval(0.95)
    assert (low, high) == pytest.approx((reference.low, reference.high))
    assert all(math.isnan(v) for v in t_interval([0.1]))


def test_wilson_interval_by_hand_and_against_scipy() -> None:
    # 5 of 18: centre (0.27778 + 0.10671) / 1.21341 = 0.31686, half-width 0.23282 / 1.21341 = 0.19187
    low, high = wilson_interval(5, 18)
    assert (low, high) == pytest.approx((0.12499, 0.50873), abs=1e-5)
    for successes, trials in ((5, 18), (0, 9), (9, 9), (3, 9), (44, 57)):
        reference = scipy_stats.binomtest(successes, trials).proportion_ci(0.95, method="wilson")
        assert wilson_interval(successes, trials) == pytest.approx((reference.low, reference.high))


def test_wilson_interval_is_not_degenerate_where_the_seed_bootstrap_was() -> None:
    # The digits_xl report's percentile bootstrap gave 3 of 9 as 0.33 with CI 0.00-0.33: the estimate on the edge.
    low, high = wilson_interval(3, 9)
    assert low < 1 / 3 - 0.1 and high > 1 / 3 + 0.2
    with pytest.raises(ValueError, match="successes"):
        wilson_interval(10, 9)
    assert all(math.isnan(v) for v in wilson_interval(0, 0))


@given(st.integers(1, 200), st.floats(0.0, 1.0), st.sampled_from([0.8, 0.9, 0.95, 0.99]))
def test_wilson_interval_holds_the_share_inside_with_positive_width(
    trials: int, fraction: float, confidence: float
) -> None:
    successes = fraction * trials  # fractional successes: ties shared 1/k
    low, high = wilson_interval(successes, trials, confidence)
    share = successes / trials
    assert 0.0 <= low <= share <= high <= 1.0 and high - low > 0.0
    if 1e-9 < share < 1 - 1e-9:
        assert low < share < high


# --- the unit of pairing ---------------------------------------------------------------------------------------------


def test_unit_means_average_within_each_unit() -> None:
    assert unit_means(["a", "a", "b"], [1.0, 3.0, 5.0]) == {"a": 2.0, "b": 5.0}
    with pytest.raises(ValueError, match="2 units for 3 values"):
        unit_means(["a", "b"], [1.0, 2.0, 3.0])


def test_unit_comparison_by_hand() -> None:
    # unit means: a (0.01 + 0.03) / 2 = 0.02, b 0.0, c 0.05
    result = unit_comparison(["a", "a", "b", "b", "c", "c"], [0.01, 0.03, -0.01, 0.01, 0.04, 0.06])
    assert (result.units, result.pairs, result.wins, result.ties, result.losses) == (3, 6, 2, 1, 0)
    assert result.mean_difference == pytest.approx(0.07 / 3) and result.median_difference == pytest.approx(0.02)
    assert (result.ci_low, result.ci_high) == pytest.approx((-0.039183, 0.085849), abs=2e-6)
    # Wilcoxon drops the zero: two positive ranks, exact two-sided p = 2 * (1/4)
    assert result.p_value == pytest.approx(0.5) and result.statistic == 0.0
    assert math.isnan(result.p_holm)


def test_a_single_unit_is_no_test() -> None:
    result = unit_comparison(["a", "a", "a"], [0.01, 0.02, 0.03])
    assert result.units == 1 and math.isnan(result.p_value) and math.isnan(result.ci_low)


def _three_cohorts(gain: float, noise: float, distributions: int = 3, seeds: int = 5) -> list[dict]:
    """FLMarket and RS at 5, 10 and 15 selected on one partition per (distribution, seed)."""
    rng = np.random.default_rng(1)
    records = []
    for d in range(distributions):
        for seed in range(seeds):
            shift = rng.normal(0, noise)  # the partition's effect, shared by the three cohort sizes
            for k in (5, 10, 15):
                base = 0.8 + 0.01 * k / 5
                records.append(_record("flmarket", f"d{d}", seed, base + gain + shift, num_selected=k))
                records.append(_record("rs", f"d{d}", seed, base, num_selected=k))
    return records


def _arms(records: list[dict], selector: str) -> list[dict]:
    return [r for r in records if r["selector"] == selector]


def test_cohort_sizes_sharing_a_partition_count_once() -> None:
    records = _three_cohorts(gain=0.003, noise=0.01)
    result = paired_comparison(_arms(records, "flmarket"), _arms(records, "rs"), baseline="rs")
    assert (result.units, result.pairs) == (15, 45)
    flm = {(r["distribution"], r["seed"], r["num_selected"]): r["final_accuracy"] for r in _arms(records, "flmarket")}
    per_unit = [
        np.mean([flm[(f"d{d}", s, k)] - (0.8 + 0.01 * k / 5) for k in (5, 10, 15)]) for d in range(3) for s in range(5)
    ]
    assert result.p_value == pytest.approx(scipy_stats.wilcoxon(per_unit).pvalue)
    assert result.mean_difference == pytest.approx(np.mean(per_unit))
    # Treating the 45 pairs as independent would claim more evidence than the 15 partitions hold.
    pseudo = [
        flm[(r["distribution"], r["seed"], r["num_selected"])] - r["final_accuracy"] for r in _arms(records, "rs")
    ]
    assert scipy_stats.wilcoxon(pseudo).pvalue < result.p_value


def test_a_real_gain_is_significant_and_no_gain_is_not() -> None:
    records = _three_cohorts(gain=0.05, noise=0.01)
    gain = paired_comparison(_arms(records, "flmarket"), _arms(records, "rs"))
    assert gain.p_value < 1e-3 and gain.wins == 15 and gain.ci_low > 0.0
    assert gain.mean_difference == pytest.approx(0.05, abs=0.01)
    level = _three_cohorts(gain=0.0, noise=0.01)
    none = paired_comparison(_arms(level, "flmarket"), _arms(level, "rs"))
    assert none.p_value > 0.05 and none.ci_low < 0.0 < none.ci_high


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.floats(-0.2, 0.2, allow_nan=False), min_size=2, max_size=12),
    st.integers(1, 4),
    st.randoms(use_true_random=False),
)
def test_replicating_pairs_within_units_changes_nothing(differences: list[float], copies: int, random) -> None:
    units = list(range(len(differences)))
    once = unit_comparison(units, differences)
    pairs = [(u, d) for u, d in zip(units, differences, strict=True) for _ in range(copies)]
    random.shuffle(pairs)
    replicated = unit_comparison([u for u, _ in pairs], [d for _, d in pairs])
    assert replicated.units == once.units and replicated.pairs == copies * once.pairs
    for field in ("mean_difference", "median_difference", "p_value", "ci_low", "ci_high"):
        a, b = getattr(once, field), getattr(replicated, field)
        assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, abs=1e-12)


def test_diverged_pairs_are_counted_not_averaged() -> None:
    records = _three_cohorts(gain=0.05, noise=0.01)
    records.append(_record("flmarket", "d9", 0, 0.0, diverged=True))
    records.append(_record("rs", "d9", 0, 0.8))
    result = paired_comparison(_arms(records, "flmarket"), _arms(records, "rs"))
    assert result.pairs == 45 and result.excluded_diverged == 1 and result.units == 15


def test_another_bid_policy_pairs_with_the_same_baseline_runs() -> None:
    records = _three_cohorts(gain=0.0, noise=0.0)
    constant = [
        _record("flmarket", r["distribution"], r["seed"], r["final_accuracy"] + 0.01, bid_policy="constant")
        for r in _arms(records, "flmarket")
        if r["num_selected"] == 10
    ]
    by_policy = arms_by_policy(records + constant)
    assert set(by_policy) == {"constant", "volume"} and len(by_policy["constant"]["flmarket"]) == 15
    result = paired_comparison(by_policy["constant"]["flmarket"], by_policy["constant"]["rs"])
    assert (result.units, result.pairs) == (15, 15) and result.mean_difference == pytest.approx(0.01)


def test_holm_family_adjusts_every_comparison_together() -> None:
    records = _three_cohorts(gain=0.05, noise=0.01)
    one = paired_comparison(_arms(records, "flmarket"), _arms(records, "rs"), group="g1")
    family = holm_family([one, one, one])
    assert [c.p_holm for c in family] == pytest.approx([min(1.0, 3 * one.p_value)] * 3)
    assert family[0].group == "g1" and family[0].p_value == one.p_value


# --- win share -----------------------------------------------------------------------------------------------------


def _settings(winners: list[str]) -> dict[str, list[dict]]:
    """One setting per entry, won by that arm by 1 point; 3 seeds each."""
    arms: dict[str, list[dict]] = {"flmarket": [], "rs": [], "qbs": []}
    for index, winner in enumerate(winners):
        for seed in range(3):
            for arm in arms:
                accuracy = 0.8 + (0.01 if arm == winner else 0.0) + 0.001 * seed
                arms[arm].append(_record(arm, f"d{index}", seed, accuracy))
    return arms


def test_win_share_counts_settings_and_gives_a_wilson_interval() -> None:
    wins = win_share(_settings(["flmarket", "rs", "qbs"]))
    assert (wins.settings, wins.wins, wins.ties, wins.losses) == (3, 1, 0, 2)
    assert wins.win_share == pytest.approx(1 / 3) and wins.chance == pytest.approx(1 / 3)
    assert (wins.ci_low, wins.ci_high) == pytest.approx(wilson_interval(1, 3))
    assert wins.ci_low < wins.win_share < wins.ci_high


def test_ties_share_the_top() -> None:
    arms = _settings(["none", "flmarket"])  # setting 0: a three-way tie
    wins = win_share(arms)
    assert (wins.wins, wins.ties, wins.losses) == (1, 1, 0)
    assert wins.win_share == pytest.approx((1 + 1 / 3) / 2)


def test_win_share_uses_only_seeds_every_arm_finished() -> None:
    arms = _settings(["rs"])
    arms["flmarket"].append(_record("flmarket", "d0", 7, 0.99))  # a seed the others did not run
    arms["rs"][0] = _record("rs", "d0", 0, 0.0, diverged=True)  # and one RS did not finish
    wins = win_share(arms)
    assert wins.settings == 1 and wins.losses == 1  # RS still best on seeds 1-2
    with pytest.raises(ValueError, match="no 'dds'"):
        win_share(arms, "dds")


def test_report_renders_both_policies_and_one_family() -> None:
    records = _three_cohorts(gain=0.05, noise=0.01)
    records += [
        _record(
            "flmarket",
            r["distribution"],
            r["seed"],
            r["final_accuracy"],
            num_selected=r["num_selected"],
            bid_policy="constant",
        )
        for r in _arms(records, "flmarket")
    ]
    text = report(records)
    assert "Holm over all 2 tests together" in text
    assert (
        "| flmarket (volume bids) | rs | 15 | 45 | 0 |" in text
        and "| flmarket (constant bids) | rs | 15 | 45 |" in text
    )
    assert "flmarket (constant bids) best in 9 of 9 settings" in text and "95% Wilson interval" in text
