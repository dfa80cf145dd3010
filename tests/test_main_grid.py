"""The main grid's pre-registered analysis (simulations.main_grid) on a small results folder in the engine's shape."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as scipy_stats

from simulations import main_grid
from simulations.stats import holm

SELECTORS = ("flmarket", "rs", "dice", "qbs", "dds")


def _write(folder: Path, selector: str, distribution: str, seed: int, accuracy: float, diverged: bool = False) -> None:
    run = folder / f"seed={seed}_distribution={distribution}_num_selected=0_selector={selector}"
    run.mkdir(parents=True, exist_ok=True)
    record = {
        "selector": selector,
        "distribution": distribution,
        "seed": seed,
        "final_accuracy": accuracy,
        "rounds": [{"accuracy": 0.1}] + [{"accuracy": accuracy}] * 30,
        "engine": {"diverged": diverged, "config": {}},
        "market": {"total_payment": 40.0, "budget": 100.0},
        "selected_partitions": [0, 3, 7],
        "selected_class_totals": [10, 20],
        "pool_class_totals": [100, 100],
    }
    (run / "result.json").write_text(json.dumps(record), encoding="utf-8")


def _grid(tmp_path: Path, accuracy: dict[tuple[str, str, str, int], float]) -> Path:
    raw = tmp_path / "raw"
    for (folder, selector, distribution, seed), value in accuracy.items():
        _write(raw / folder, selector, distribution, seed, value)
    return raw


def test_the_primary_contrast_is_the_paired_t_test_over_partitions_with_holm_over_four(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    accuracy = {
        (folder, selector, d, seed): float(rng.uniform(0.4, 0.9))
        for folder in ("volume", "equal")
        for selector in SELECTORS
        for d in ("d4", "d5", "d6")
        for seed in range(3)
    }
    accuracy.update({("all", "rs", d, seed): 0.95 for d in ("d4", "d5", "d6") for seed in range(3)})
    raw = _grid(tmp_path, accuracy)
    runs = main_grid.runs_by_policy(raw)
    primary = main_grid.contrasts(runs, "auc", main_grid.PRIMARY_BASELINES)
    assert [(c.policy, c.baseline) for c in primary] == [
        ("volume", "rs"),
        ("volume", "dice"),
        ("equal", "rs"),
        ("equal", "dice"),
    ]
    partitions = [(d, s) for d in ("d4", "d5", "d6") for s in range(3)]
    for c in primary:
        mine = np.array([100 * accuracy[(c.policy, "flmarket", *p)] for p in partitions])
        theirs = np.array([100 * accuracy[(c.policy, c.baseline, *p)] for p in partitions])
        assert c.partitions == 9
        assert c.mean == pytest.approx(float((mine - theirs).mean()))
        assert c.p_t == pytest.approx(float(scipy_stats.ttest_rel(mine, theirs).pvalue))
    text = main_grid.report(raw, "python -m simulations.main_grid raw")
    assert "Interim: 9 of the 54" in text
    adjusted = holm([c.p_t for c in primary])
    assert f"{adjusted[0]:.3g}" in text.split("## Secondary")[0]
    # The headroom: everyone at 95% minus each arm.
    gap = 95.0 - np.mean([100 * accuracy[("volume", "flmarket", *p)] for p in partitions])
    assert f"| volume | flmarket | 9 | {gap:+.2f}" in text


def test_a_diverged_run_leaves_its_partition_out_of_that_contrast_only(tmp_path: Path) -> None:
    accuracy = {
        ("volume", selector, "d4", seed): 0.5 + 0.01 * seed + (0.05 if selector == "flmarket" else 0.0)
        for selector in SELECTORS
        for seed in range(4)
    }
    raw = _grid(tmp_path, accuracy)
    _write(raw / "volume", "rs", "d4", 0, 0.5, diverged=True)
    runs = main_grid.runs_by_policy(raw)
    contrasts = main_grid.contrasts(runs, "auc", main_grid.PRIMARY_BASELINES)
    by_baseline = {c.baseline: c for c in contrasts if c.policy == "volume"}
    assert by_baseline["rs"].partitions == 3 and by_baseline["dice"].partitions == 4
    assert by_baseline["dice"].mean == pytest.approx(5.0)
    assert math.isnan(by_baseline["dice"].p_t)  # a constant difference: no variance, no t-test


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-20, 20, allow_nan=False), min_size=3, max_size=12))
def test_the_contrast_agrees_with_scipy_on_any_differences(differences: list[float]) -> None:
    mine = {("d4", i): 50.0 + d for i, d in enumerate(differences)}
    theirs = {("d4", i): 50.0 for i in range(len(differences))}
    c = main_grid.contrast(mine, theirs, "volume", "rs", "auc")
    values = np.array([mine[k] - theirs[k] for k in sorted(mine)])
    assert c.partitions == len(differences)
    assert c.mean == pytest.approx(values.mean(), abs=1e-9)
    if values.std(ddof=1) > 1e-9:
        assert c.p_t == pytest.approx(float(scipy_stats.ttest_1samp(values, 0.0).pvalue), rel=1e-6)
