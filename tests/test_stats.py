"""Tests of the paired statistics on synthetic results."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from simulations.stats import holm, paired_tests, report, win_counts


def _record(selector: str, distribution: str, seed: int, accuracy: float, diverged: bool = False) -> dict:
    return {
        "selector": selector,
        "dataset": "digits_xl",
        "distribution": distribution,
        "num_clients": 20,
        "num_selected": 10,
        "seed": seed,
        "final_accuracy": math.nan if diverged else accuracy,
        "engine": {"diverged": diverged, "config": {"schedule": "geometric", "bid_policy": "volume"}},
    }


def _synthetic(gain: dict[str, float], settings: int = 6, seeds: int = 5, noise: float = 0.01) -> list[dict]:
    """FLMarket and baselines; FLMarket = baseline + gain[baseline] + noise, paired by setting and seed."""
    rng = np.random.default_rng(0)
    records = []
    for setting in range(settings):
        for seed in range(seeds):
            base = 0.7 + 0.02 * setting + rng.normal(0, 0.02)
            records.append(_record("flmarket", f"d{setting}", seed, base))
            for baseline, delta in gain.items():
                records.append(_record(baseline, f"d{setting}", seed, base - delta + rng.normal(0, noise)))
    return records


def test_holm_matches_the_definition() -> None:
    np.testing.assert_allclose(holm([0.01, 0.04, 0.03, 0.2]), [0.04, 0.09, 0.09, 0.2])
    np.testing.assert_allclose(holm([0.5, 0.6]), [1.0, 1.0])


def test_a_real_gain_is_significant_and_no_gain_is_not() -> None:
    tests = {t.baseline: t for t in paired_tests(_synthetic({"rs": 0.05, "qbs": 0.0}))}
    assert tests["rs"].pairs == 30 and tests["rs"].p_holm < 1e-4 and tests["rs"].wins == 30
    assert tests["rs"].mean_difference == pytest.approx(0.05, abs=0.01)
    assert tests["qbs"].p_value > 0.01


def test_p_value_is_scipys_wilcoxon() -> None:
    records = _synthetic({"dice": 0.003}, noise=0.01)
    flm = {(r["distribution"], r["seed"]): r["final_accuracy"] for r in records if r["selector"] == "flmarket"}
    diffs = [flm[(r["distribution"], r["seed"])] - r["final_accuracy"] for r in records if r["selector"] == "dice"]
    (test,) = paired_tests(records)
    assert test.p_value == pytest.approx(scipy_stats.wilcoxon(diffs).pvalue)
    assert test.p_holm == pytest.approx(test.p_value)


def test_diverged_runs_are_counted_not_averaged() -> None:
    records = _synthetic({"rs": 0.05})
    records.append(_record("flmarket", "d9", 0, 0.0, diverged=True))
    records.append(_record("rs", "d9", 0, 0.8))
    (test,) = paired_tests(records)
    assert test.pairs == 30 and test.excluded_diverged == 1


def test_identical_results_tie_everywhere() -> None:
    records = _synthetic({"rs": 0.0}, noise=0.0)
    (test,) = paired_tests(records)
    assert test.ties == 30 and test.p_value == 1.0
    wins = win_counts(records)
    assert wins.ties == 6 and wins.win_share == pytest.approx(0.5) and wins.chance == pytest.approx(0.5)


def test_win_counts_with_a_clear_winner_and_chance_level() -> None:
    wins = win_counts(_synthetic({"rs": 0.05, "qbs": 0.04, "dice": 0.03, "dds": 0.06}))
    assert (wins.settings, wins.wins, wins.losses) == (6, 6, 0)
    assert wins.win_share == 1.0 and wins.ci_low == 1.0 and wins.chance == pytest.approx(0.2)


def test_bootstrap_interval_brackets_the_share() -> None:
    wins = win_counts(_synthetic({"rs": 0.0, "qbs": 0.0}, noise=0.02), resamples=500)
    assert wins.ci_low <= wins.win_share <= wins.ci_high
    assert 0.0 <= wins.ci_low and wins.ci_high <= 1.0


def test_report_renders() -> None:
    records = _synthetic({"rs": 0.05})
    records.append(_record("rs", "d0", 9, 0.0, diverged=True))
    text = report(records)
    assert "| rs | 30 | 0 |" in text and "chance 0.50" in text
    assert "(n=5), 1 diverged" in text
