"""The pilot's tables (``simulations.pilot``): paired headroom, the power calculation, the market's picks."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy import stats as scipy_stats

from simulations.engine import EngineConfig, run_engine, write_result
from simulations.pilot import (
    budget_rows,
    endpoint,
    headroom_rows,
    main,
    market_rows,
    paired_t_power,
    partitions_for,
)

TINY = EngineConfig(
    dataset="digits", test_per_class=30, distribution="d6", selector="rs", rounds=2, local_steps=1, final_window=1
)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _record(k: int, seed: int, accuracies: list[float], final: float | None = None) -> dict:
    cfg = replace(TINY, num_selected=k, seed=seed, rounds=len(accuracies))
    return {
        "selector": "rs",
        "num_selected": k,
        "num_clients": 20,
        "seed": seed,
        "final_accuracy": accuracies[-1] if final is None else final,
        "rounds": [{"accuracy": 0.1}] + [{"accuracy": a} for a in accuracies],
        "pool_class_totals": [100] * 10,
        "engine": {"config": asdict(cfg), "diverged": False},
    }


def test_headroom_pairs_all_clients_with_each_subset_by_seed() -> None:
    records = [
        _record(20, 0, [0.6, 0.8]),
        _record(20, 1, [0.5, 0.7]),
        _record(20, 2, [0.5, 0.7]),  # no subset run at seed 2: not a pair
        _record(5, 0, [0.4, 0.6]),
        _record(5, 1, [0.4, 0.4]),
    ]
    rows = {row.endpoint: row for row in headroom_rows(records)}
    final, auc = rows["final"], rows["auc"]
    assert final.partitions == auc.partitions == 2 and final.num_selected == 5
    assert final.mean == pytest.approx(25.0) and final.sd == pytest.approx(np.std([20.0, 30.0], ddof=1))
    assert (final.low, final.high, final.at_least_5) == (pytest.approx(20.0), pytest.approx(30.0), 2)
    assert auc.mean == pytest.approx(np.mean([70 - 50, 60 - 40])) and final.all_mean == pytest.approx(75.0)
    assert final.premise_alpha == pytest.approx((1000 / (20 * 10),) * 2)


def test_pooled_headroom_pairs_by_distribution_and_seed() -> None:
    def on(distribution: str, record: dict) -> dict:
        config = record["engine"]["config"] | {"distribution": distribution}
        return record | {"engine": record["engine"] | {"config": config}}

    records = [
        on("d4", _record(20, 0, [0.8])),
        on("d4", _record(5, 0, [0.5])),
        on("d6", _record(20, 0, [0.7])),  # the same seed on another distribution: another partition
        on("d6", _record(5, 0, [0.6])),
    ]
    assert [row.partitions for row in headroom_rows(records)] == [1, 1, 1, 1]
    pooled = {row.endpoint: row for row in headroom_rows(records, pool_distributions=True)}
    assert pooled["final"].setting["distribution"] == "d4+d6" and pooled["final"].partitions == 2
    assert pooled["final"].mean == pytest.approx(20.0) and pooled["final"].low == pytest.approx(10.0)


def test_headroom_refuses_other_selectors_and_duplicate_runs() -> None:
    other = _record(5, 0, [0.5]) | {"selector": "qbs"}
    with pytest.raises(ValueError, match="RS runs only"):
        headroom_rows([other])
    with pytest.raises(ValueError, match="two runs"):
        headroom_rows([_record(5, 0, [0.5]), _record(5, 0, [0.6])])
    with pytest.raises(ValueError, match="endpoint must be one of"):
        endpoint(_record(5, 0, [0.5]), "best")


def test_a_diverged_run_leaves_its_pair_out() -> None:
    diverged = _record(5, 1, [math.nan]) | {"engine": _record(5, 1, [0.5])["engine"] | {"diverged": True}}
    rows = headroom_rows([_record(20, 0, [0.8]), _record(20, 1, [0.8]), _record(5, 0, [0.5]), diverged])
    assert all(row.partitions == 1 for row in rows)


@pytest.mark.parametrize(("sd", "expected"), [(3.0, 10), (6.0, 34)])
def test_partitions_for_matches_the_textbook_paired_t_sizes(sd: float, expected: int) -> None:
    # Cohen's d = 1 needs 10 pairs and d = 0.5 needs 34 at 80% power, two-sided 0.05 (paired t, exact).
    assert partitions_for(sd, effect=3.0) == expected


@given(sd=st.floats(min_value=0.3, max_value=20.0))
@settings(max_examples=50, deadline=None)
def test_partitions_for_is_the_least_n_with_the_power(sd: float) -> None:
    n = partitions_for(sd)
    assert paired_t_power(n, 3.0, sd) >= 0.8 and (n == 3 or paired_t_power(n - 1, 3.0, sd) < 0.8)


@given(n=st.integers(min_value=3, max_value=60), sd=st.floats(min_value=1.0, max_value=20.0))
@settings(max_examples=50, deadline=None)
def test_paired_t_power_is_the_noncentral_t_tail(n: int, sd: float) -> None:
    critical = scipy_stats.t.ppf(0.975, n - 1)
    shift = 3.0 / sd * math.sqrt(n)
    expected = scipy_stats.nct.sf(critical, n - 1, shift) + scipy_stats.nct.cdf(-critical, n - 1, shift)
    assume(math.isfinite(expected))  # scipy's nct gives NaN for large noncentralities: the reason for the integral
    assert paired_t_power(n, 3.0, sd) == pytest.approx(expected, abs=1e-6)


def test_partitions_for_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="sd and effect"):
        partitions_for(0.0)
    with pytest.raises(ValueError, match="power and level"):
        partitions_for(1.0, power=1.0)


def test_market_and_budget_tables_use_the_engines_auction() -> None:
    counts = np.array([[50, 0, 5], [3, 2, 1], [10, 40, 30], [0, 1, 0], [20, 20, 20]])
    record = {
        "all_label_counts": counts.tolist(),
        "seed": 0,
        "engine": {"config": asdict(replace(TINY, num_clients=5))},
    }
    [row] = market_rows([record], num_selected=2)
    assert row["flmarket_volume_volume"] < row["flmarket_constant_volume"]  # volume bids: score per sample
    assert row["qbs_volume"] == 60 + 80 and row["spearman_volume_score_per_bid"] < 0
    rows = budget_rows({("digits", 5, 0.5, "d6", 0): counts}, [0.3, 1.0])
    assert [r["fraction"] for r in rows] == [0.3, 1.0, 0.3, 1.0]
    assert all(0 <= r["paid_max"] <= 1 and r["winners_max"] <= 5 for r in rows)


def test_one_command_regenerates_the_tables_from_result_files(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    for seed in (0, 1):
        for k in (3, 20):
            cfg = replace(TINY, seed=seed, num_selected=k, num_clients=20)
            write_result(raw / f"seed={seed}_k={k}", run_engine(cfg))
    main([str(raw), "--out", str(tmp_path / "out"), "--market-k", "3", "--budget-seeds", "2"])
    text = (tmp_path / "out" / "pilot.md").read_text(encoding="utf-8")
    assert "| 3 of 20 | final | 2 |" in text and "| 3 of 20 | auc | 2 |" in text
    with (tmp_path / "out" / "pilot.csv").open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert [r["endpoint"] for r in rows] == ["final", "auc"] and rows[0]["partitions"] == "2"
    records = [json.loads(p.read_text()) for p in raw.rglob("result.json")]
    expected = np.mean(
        [
            100 * (a["final_accuracy"] - b["final_accuracy"])
            for a in records
            for b in records
            if a["seed"] == b["seed"] and a["num_selected"] == 20 and b["num_selected"] == 3
        ]
    )
    assert float(rows[0]["mean"]) == pytest.approx(expected, abs=0.01)
