"""The main grid's pre-registered analysis (simulations.main_grid) on a small results folder in the engine's shape."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as scipy_stats

from simulations import main_grid, pilot
from simulations.stats import holm

SELECTORS = ("flmarket", "rs", "dice", "qbs", "dds")


RECORDED = {"dataset": "fashion_mnist", "alpha": 0.1, "local_steps": 10, "rounds": 30}
"""The protocol every engine record's config states (the report's header reads it)."""

SIZES = [10, 20, 40, 80, 160, 320, 640, 1280]
"""The clients' volumes in the synthetic auctions: the score is ``10 sqrt(N)`` (sub-linear), bids follow the policy."""


def _write(
    folder: Path,
    selector: str,
    distribution: str,
    seed: int,
    accuracy: float,
    diverged: bool = False,
    **overrides: object,
) -> None:
    run = folder / f"seed={seed}_distribution={distribution}_num_selected=0_selector={selector}"
    run.mkdir(parents=True, exist_ok=True)
    equal = folder.name.startswith("equal")  # raw/equal and raw/equal-whole
    bids = [1.0] * len(SIZES) if equal else [1.2 * n for n in SIZES]
    record = {
        "selector": selector,
        "distribution": distribution,
        "seed": seed,
        "num_clients": len(SIZES),
        "final_accuracy": accuracy,
        "rounds": [{"accuracy": 0.1}] + [{"accuracy": accuracy, "round_time_s": 0.2}] * 30,
        "engine": {
            "diverged": diverged,
            "config": {
                **RECORDED,
                "learning_rate": 0.05,
                "market": "direct",
                "bid_policy": "constant" if equal else "volume",
            },
            "matched": {"budget": 100.0},
        },
        "market": {
            "total_payment": 40.0,
            "budget": 100.0,
            "scores": [10.0 * math.sqrt(n) for n in SIZES],
            "bids": bids,
        },
        "timings": {"job_wall_s": 10.0},
        "all_label_counts": [[n // 2, n - n // 2] for n in SIZES],
        "selected_partitions": [0, 1] if not equal else [6, 7],
        "selected_class_totals": [10, 20],
        "pool_class_totals": [100, 100],
    }
    record.update(overrides)
    (run / "result.json").write_text(json.dumps(record), encoding="utf-8")


def _grid(tmp_path: Path, accuracy: dict[tuple[str, str, str, int], float], clients: int = 20) -> Path:
    """The runs of ``accuracy`` in a federation of ``clients`` (the pre-registered grid's 20 by default)."""
    raw = tmp_path / "raw"
    for (folder, selector, distribution, seed), value in accuracy.items():
        _write(raw / folder, selector, distribution, seed, value, num_clients=clients)
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


def _market_grid(tmp_path: Path, flmarket: float, others: float, seeds: int = 4) -> Path:
    """Every arm under both policies and all clients on d4-d6, FLMarket at ``flmarket`` and the rest at ``others``
    (plus a small per-seed wobble so the paired tests have variance)."""
    raw = tmp_path / "raw"
    for d in ("d4", "d5", "d6"):
        for seed in range(seeds):
            wobble = 0.002 * ((seed * 7 + len(d)) % 5)
            for folder in ("volume", "equal"):
                for selector in SELECTORS:
                    mine = flmarket + wobble if selector == "flmarket" else others - wobble
                    _write(raw / folder, selector, d, seed, mine)
            _write(raw / "all", "rs", d, seed, 0.9, selected_partitions=list(range(len(SIZES))))
    return raw


def test_the_auction_ranks_the_smallest_first_when_the_score_is_sub_linear_and_bids_are_linear(
    tmp_path: Path,
) -> None:
    raw = _market_grid(tmp_path, 0.6, 0.5, seeds=2)
    runs = main_grid.runs_by_policy(raw)
    volume = main_grid.bidders(runs["volume"])
    assert len(volume) == 6 * len(SIZES)  # six auctions, FLMarket's only
    assert [b.size for b in volume if b.won][:2] == [10, 20]
    by_policy = {s.policy: s for s in main_grid.small_client_stats(runs)}
    # u = 10 sqrt(N): slope 1/2 in log-log; with b = 1.2 N the score per bid falls strictly with N.
    assert by_policy["volume"].elasticity == pytest.approx([0.5] * 6)
    assert by_policy["volume"].spearman_per_bid == pytest.approx(-1.0)
    assert by_policy["volume"].spearman_score == pytest.approx(1.0)
    assert by_policy["volume"].smallest_half == 1.0
    # Equal bids rank by the score alone: the largest clients won.
    assert by_policy["equal"].spearman_per_bid == pytest.approx(1.0)
    assert by_policy["equal"].smallest_half == 0.0
    reading = "\n".join(main_grid.small_client_reading(list(by_policy.values())))
    assert "is sub-linear" in reading and "**holds**" in reading
    table = "\n".join(main_grid.bidder_lines(runs))
    assert "| volume | winners | 12 | 15 (10 to 20) |" in table  # the two smallest of each auction
    assert "| equal | winners | 12 | 960 (640 to 1,280) |" in table


def test_a_score_proportional_to_volume_is_not_called_sub_linear(tmp_path: Path) -> None:
    raw = _market_grid(tmp_path, 0.6, 0.5, seeds=1)
    for path in raw.glob("*/*selector=flmarket/result.json"):
        record = json.loads(path.read_text(encoding="utf-8"))
        record["market"]["scores"] = [3.0 * n for n in SIZES]
        path.write_text(json.dumps(record), encoding="utf-8")
    stats = main_grid.small_client_stats(main_grid.runs_by_policy(raw))
    assert stats[0].elasticity == pytest.approx([1.0] * 3)
    reading = "\n".join(main_grid.small_client_reading(stats))
    assert "not sub-linear" in reading and "**does not hold**" in reading


@settings(max_examples=40, deadline=None)
@given(
    st.floats(0.05, 2.0),
    st.floats(0.1, 100.0),
    st.lists(st.integers(1, 100_000), min_size=2, max_size=20, unique=True),
)
def test_the_volume_elasticity_of_a_power_law_is_its_exponent(power: float, scale: float, sizes: list[int]) -> None:
    scores = [scale * n**power for n in sizes]
    assert main_grid.volume_elasticity(sizes, scores) == pytest.approx(power, abs=1e-6)


def test_a_flmarket_record_without_its_auction_is_named(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    _write(raw / "volume", "flmarket", "d4", 3, 0.5, market={"total_payment": 1.0, "budget": 2.0})
    with pytest.raises(ValueError, match=r"\('d4', 3\) has no market.scores"):
        main_grid.bidders(main_grid.runs_by_policy(raw)["volume"])


def test_what_an_arm_buys_counts_the_rarest_class_and_the_classes_absent(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    _write(raw / "volume", "dice", "d4", 0, 0.5, selected_class_totals=[10, 0], pool_class_totals=[100, 50])
    _write(raw / "volume", "dice", "d4", 1, 0.5, selected_class_totals=[30, 10], pool_class_totals=[100, 50])
    (row,) = main_grid.bought(main_grid.runs_by_policy(raw))
    assert (row.policy, row.arm, row.runs) == ("volume", "dice", 2)
    assert row.pool_share == pytest.approx((10 / 150 + 40 / 150) / 2)
    assert row.rarest_share == pytest.approx((0 / 50 + 10 / 50) / 2)
    assert row.smallest_class == pytest.approx((0.0 + 10 / 40) / 2)
    assert row.absent == 0.5 and row.auc == pytest.approx(50.0)


def test_the_deviations_are_read_from_the_records_and_the_100_client_cost_is_estimated(tmp_path: Path) -> None:
    raw = _market_grid(tmp_path, 0.6, 0.5, seeds=1)
    runs = main_grid.runs_by_policy(raw)
    text = "\n".join(main_grid.deviation_lines(runs))
    assert "| 30 rounds, fixed" in text and "lr 0.05" in text and "`market` = direct" in text
    # Each run: 10 s of wall time, 30 rounds of 0.2 s training; at 100 of 8 clients training scales by 12.5.
    records = [r for records in runs.values() for r in records]
    measured, estimated = main_grid.compute_estimate(records) or (0.0, 0.0)
    assert measured == pytest.approx(10.0 * len(records))
    assert estimated == pytest.approx(len(records) * (10.0 + (100 / len(SIZES) - 1) * 6.0))
    _write(raw / "volume", "rs", "d4", 0, 0.5, timings={}, engine={"config": {"market": "protocol"}})
    runs = main_grid.runs_by_policy(raw)
    text = "\n".join(main_grid.deviation_lines(runs))
    assert "unmeasured" in text and "`market` = direct, protocol" in text


@pytest.mark.parametrize(
    ("flmarket", "verdict"),
    [(0.7, "reproduces in direction and size"), (0.55, "reproduces in direction, not in size"),
     (0.4, "does not reproduce")],
)  # fmt: skip
def test_what_reproduces_follows_the_contrasts(tmp_path: Path, flmarket: float, verdict: str) -> None:
    raw = _market_grid(tmp_path, flmarket, 0.5)
    text = main_grid.report(raw, "python -m simulations.main_grid raw")
    reading = text.split("## What reproduces of the paper's headline")[1]
    assert f"**Volume bids: the headline {verdict}.**" in reading
    assert f"**Equal bids: the headline {verdict}.**" in reading
    top = 12 if flmarket > 0.5 else 0
    assert f"highest auc of the five arms in {top} of 12 partitions" in reading


def test_the_report_is_byte_reproducible_and_has_every_section(tmp_path: Path) -> None:
    raw = _market_grid(tmp_path, 0.6, 0.5, seeds=2)
    out = tmp_path / "out"
    main_grid.main([str(raw), "--out", str(out)])
    text = (out / "REPORT.md").read_text(encoding="utf-8")
    main_grid.main([str(raw), "--out", str(out)])
    assert (out / "REPORT.md").read_text(encoding="utf-8") == text
    for heading in (
        "## Why FLMarket buys the smallest clients under volume bids",
        "## What each arm buys (the paper's Table 2 analogue)",
        "## Deviations from the paper",
        "## What reproduces of the paper's headline",
    ):
        assert heading in text


def _every_arm(seeds: int) -> dict[tuple[str, str, str, int], float]:
    rng = np.random.default_rng(1)
    accuracy = {
        (folder, selector, d, seed): float(rng.uniform(0.4, 0.9))
        for folder in ("volume", "equal")
        for selector in SELECTORS
        for d in ("d4", "d5", "d6")
        for seed in range(seeds)
    }
    accuracy.update({("all", "rs", d, seed): 0.95 for d in ("d4", "d5", "d6") for seed in range(seeds)})
    return accuracy


def test_a_grid_of_another_size_is_reported_as_secondary_and_exploratory_in_its_first_lines(tmp_path: Path) -> None:
    raw = _grid(tmp_path / "results" / "fashion_mnist_c100", _every_arm(3), clients=100)
    text = main_grid.report(raw, "python -m simulations.main_grid raw")
    title, _, status, _, regenerate = text.splitlines()[:5]
    assert title == "# Fashion-MNIST 100-client grid: secondary, exploratory, not pre-registered"
    assert status.startswith("**Secondary and exploratory, not pre-registered.** The pre-registered grid is the 20-")
    assert "on 9 partitions finished in every primary arm" in status and "decide nothing" in status
    runs = main_grid.runs_by_policy(raw)
    sds = [c.sd for c in main_grid.contrasts(runs, "auc", main_grid.PRIMARY_BASELINES)]
    needed = sorted(pilot.partitions_for(sd) for sd in sds)
    assert f"would need {needed[0]} to {needed[-1]} partitions to detect 3 points at 80% power" in status
    assert f"tar -xzf {raw.parent.as_posix()}/raw.tar.gz -C {raw.parent.as_posix()}" in regenerate
    assert "100 clients" in regenerate and "`CLIENTS=100 bash simulations/fashion_mnist_main.sh 0 2`" in regenerate
    # No trace of the 20-client grid's framing: neither its status nor its size where the grid's own belongs.
    assert "pre-registered partitions finished" not in text and "Interim" not in text
    assert "## Headroom: all 100 clients minus each arm (auc)" in text
    assert "| bids | arm | partitions | all 100 clients minus arm" in text
    assert "| clients | 20 and 100 | 100: secondary, exploratory, not pre-registered (9 partitions;" in text
    assert "| budget and cohort | k of 100 fixed (25/50/75)" in text
    assert "this grid pairs 9 partitions" in text
    assert "* This 100-client grid is secondary and exploratory, not pre-registered" in text


def test_the_registered_grid_keeps_its_framing_and_its_100_client_estimate(tmp_path: Path) -> None:
    raw = _grid(tmp_path, _every_arm(2))
    text = main_grid.report(raw, "python -m simulations.main_grid raw")
    assert text.startswith("# Fashion-MNIST main grid: FLMarket against the baselines where selection can matter\n")
    assert "**Interim: 6 of the 54 pre-registered partitions" in text
    assert "Grid: `bash simulations/fashion_mnist_main.sh`." in text
    assert "| clients | 20 and 100 | 20; the 100-client grid was not run:" in text
    assert "| budget and cohort | k of 20 fixed (5/10/15)" in text
    assert "secondary and exploratory" not in text and "would need" not in text


def test_runs_of_two_federation_sizes_in_one_folder_are_refused(tmp_path: Path) -> None:
    raw = _grid(tmp_path, {("volume", "rs", "d4", 0): 0.5})
    _write(raw / "volume", "flmarket", "d4", 0, 0.5, num_clients=100)
    with pytest.raises(ValueError, match=r"one federation size, found num_clients \[20, 100\]"):
        main_grid.report(raw, "python -m simulations.main_grid raw")


GRID_SCRIPT = Path(__file__).resolve().parents[1] / "simulations" / "fashion_mnist_main.sh"


def _grid_calls(
    tmp_path: Path, clients: str | None, *seeds: str, script: Path | None = None
) -> tuple[int, list[str], str]:
    """Run a grid script (the main grid's by default) with a stand-in ``python`` that records its arguments:
    (status, engine calls, stderr)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text('#!/bin/sh\necho "$@" >> "$CALLS"\n', encoding="utf-8")
    (bin_dir / "python").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "CALLS": str(tmp_path / "calls")}
    env.pop("CLIENTS", None)
    if clients is not None:
        env["CLIENTS"] = clients
    done = subprocess.run(
        ["bash", str(script or GRID_SCRIPT), *seeds], cwd=tmp_path, env=env, capture_output=True, text=True, check=False
    )
    calls = (tmp_path / "calls").read_text(encoding="utf-8").splitlines() if (tmp_path / "calls").exists() else []
    return done.returncode, calls, done.stderr


def test_the_grid_script_defaults_to_the_registered_20_client_grid(tmp_path: Path) -> None:
    status, calls, _ = _grid_calls(tmp_path, None, "0", "2")
    assert status == 0 and len(calls) == 6  # two seed chunks (0-1, 2), three runs each
    assert all("--num-clients 20 --alpha 0.1 --rounds 30" in call for call in calls)
    assert calls[0].endswith("--out results/fashion_mnist_main/raw/volume --bid-policy volume --budget-fraction 0.15 "
                              "--num-selected 0 --selector flmarket rs dice qbs dds --seed 0 1")  # fmt: skip
    assert calls[2].endswith("--out results/fashion_mnist_main/raw/all --num-selected 20 --selector rs --seed 0 1")
    assert calls[5].endswith("--seed 2")


def test_the_grid_script_takes_the_number_of_clients_and_its_own_results_folder(tmp_path: Path) -> None:
    status, calls, _ = _grid_calls(tmp_path, "100", "0", "2")
    assert status == 0 and len(calls) == 6
    assert all("--num-clients 100 --alpha 0.1 --rounds 30" in call for call in calls)
    assert all("--out results/fashion_mnist_c100/raw/" in call for call in calls)
    assert "--bid-policy constant --budget-fraction 0.7 --num-selected 0" in calls[1]
    assert calls[2].endswith("--out results/fashion_mnist_c100/raw/all --num-selected 100 --selector rs --seed 0 1")
    assert (tmp_path / "results" / "fashion_mnist_c100" / "raw").is_dir()
    assert not (tmp_path / "results" / "fashion_mnist_main").exists()


@pytest.mark.parametrize("clients", ["0", "ten", "-5", "020"])
def test_the_grid_script_refuses_a_bad_number_of_clients(tmp_path: Path, clients: str) -> None:
    status, calls, stderr = _grid_calls(tmp_path, clients, "0", "0")
    assert status == 2 and not calls
    assert f"CLIENTS must be a positive integer, got '{clients}'" in stderr


@pytest.mark.parametrize(
    ("arms", "with_all"),
    [(("flmarket", "rs", "dice"), True), (("flmarket", "rs"), False), (("flmarket", "dice", "qbs"), False)],
)
def test_a_grid_with_a_subset_of_the_arms_is_reported_without_the_missing_ones(
    tmp_path: Path, arms: tuple[str, ...], with_all: bool
) -> None:
    # Issue 43: a grid without QBS/DDS stopped with a ZeroDivisionError (top_counts found no partition with all five).
    rng = np.random.default_rng(2)
    accuracy = {
        (folder, selector, d, seed): float(rng.uniform(0.4, 0.9))
        for folder in ("volume", "equal")
        for selector in arms
        for d in ("d4", "d5", "d6")
        for seed in range(3)
    }
    if with_all:
        accuracy.update({("all", "rs", d, seed): 0.95 for d in ("d4", "d5", "d6") for seed in range(3)})
    raw = _grid(tmp_path, accuracy)
    text = main_grid.report(raw, "python -m simulations.main_grid raw")
    missing = [arm for arm in SELECTORS if arm not in arms]
    tables = [line for line in text.splitlines() if line.startswith(("| volume |", "| equal |"))]
    for arm in missing:
        assert not any(f"| {arm} |" in line for line in tables), arm
        assert f"{arm.upper()} (" not in text.split("## What reproduces of the paper's headline")[1]
    assert "nan" not in text
    assert ("## Headroom" in text) == with_all
    runs = main_grid.runs_by_policy(raw)
    primary = main_grid.contrasts(runs, "auc", main_grid.PRIMARY_BASELINES)
    assert {c.baseline for c in primary} == set(arms) & set(main_grid.PRIMARY_BASELINES)
    words = {2: "two", 3: "three"}[len(arms)]
    assert f"highest auc of the {words} arms in" in text and f"chance {1 / len(arms):.0%}" in text
    # FLMarket's top share is computed over the arms that ran, exactly.
    values = {arm: main_grid.arm_values(runs["volume"], arm, "auc") for arm in arms}
    keys = sorted(values["flmarket"])
    top = sum(values["flmarket"][k] >= max(values[a][k] for a in arms) for k in keys)
    assert f"arms in {top} of {len(keys)} partitions" in text.split("* **Volume bids: the headline")[1]


def test_a_grid_with_flmarket_alone_has_no_contrast_and_no_division(tmp_path: Path) -> None:
    raw = _grid(tmp_path, {(f, "flmarket", "d4", s): 0.6 for f in ("volume", "equal") for s in range(3)})
    text = main_grid.report(raw, "python -m simulations.main_grid raw")
    assert "highest auc of the" not in text and "nan" not in text


PROJECT = Path(__file__).resolve().parents[1]


def _prereg(raw: Path, grid: str) -> None:
    """The committed PREREG.md of ``grid`` beside ``raw`` (where the report reads the registration)."""
    raw.mkdir(parents=True, exist_ok=True)
    shutil.copy(PROJECT / "results" / grid / "PREREG.md", raw.parent / "PREREG.md")


def _budget_grid(tmp_path: Path, seeds: int, first: int = 30, prereg: str | None = "fashion_mnist_budget") -> Path:
    """The equal-money grid's arms on ``seeds`` seeds from ``first``, with the PREREG.md of ``prereg`` beside it."""
    raw = tmp_path / "results" / "fashion_mnist_budget" / "raw"
    if prereg is not None:
        _prereg(raw, prereg)
    rng = np.random.default_rng(3)
    for folder in ("volume", "equal"):
        for selector in SELECTORS:
            for d in ("d4", "d5", "d6"):
                for seed in range(first, first + seeds):
                    value = float(rng.uniform(0.4, 0.9))
                    config = {**RECORDED, "market": "direct", "baseline_match": "budget", "bid_policy": "volume"}
                    engine = {"diverged": False, "config": config}
                    if selector != "flmarket":
                        engine["matched"] = {
                            "match": "budget",
                            "payment_rule": "pay-as-bid",
                            "budget": 100.0,
                            "paid": 90.0 + seed - first,
                        }
                    curve = [{"accuracy": 0.1}] + [
                        {"accuracy": value * min(1.0, r / 10), "round_time_s": 0.2, "cpu_s": 0.3} for r in range(1, 31)
                    ]
                    _write(raw / folder, selector, d, seed, value, engine=engine, rounds=curve, num_clients=20)
    return raw


def test_a_budget_matched_grid_reports_against_its_own_pre_registration(tmp_path: Path) -> None:
    raw = _budget_grid(tmp_path, seeds=2)
    text = main_grid.report(raw, "python -m simulations.main_grid raw")
    title, _, protocol, _, status = text.splitlines()[:5]
    assert title == "# Fashion-MNIST budget-matched grid: what the same money buys"
    assert f"`{raw.parent.as_posix()}/PREREG.md`" in protocol and "pay-as-bid" in protocol
    assert "on seeds 30-31;" in protocol and "Grid: `bash simulations/fashion_mnist_budget.sh`." in protocol
    assert status.startswith("**Interim: 6 of the 30 pre-registered partitions finished in every primary arm.")
    assert "needs all 30" in status and "decide nothing" in status
    assert "| volume | rs | 6 | pay-as-bid | 2 (2 to 2) | 0.91 (0.90 to 0.91) | 0 of 6 |" in text
    assert "| volume | flmarket | 6 | critical payments |" in text
    assert "each baseline buys in its own order within the same R at the same bids" in text
    assert f"Pre-registered as secondary ({raw.parent.as_posix()}/PREREG.md)." in text
    assert "| CPU s to 0.6: median of those reaching |" in text
    assert "## Headroom" not in text  # the budget-matched grid does not re-run the all-clients arm


def test_a_folder_with_both_matches_is_refused(tmp_path: Path) -> None:
    raw = _budget_grid(tmp_path, seeds=1)
    _write(raw / "volume", "rs", "d4", 99, 0.5, num_clients=20)  # a cohort-matched run among budget-matched ones
    with pytest.raises(ValueError, match="expected the baselines of one match"):
        main_grid.report(raw, "x")


def test_the_time_to_accuracy_table_gives_the_paper_s_ratios_beside_ours(tmp_path: Path) -> None:
    raw = _budget_grid(tmp_path, seeds=1)
    text = main_grid.report(raw, "x")
    assert "| 4.23 (550 / 130) |" in text and "| 1.31 (170 / 130) |" in text
    runs = main_grid.runs_by_policy(raw)
    times = [main_grid.time_to_accuracy(r, 0.6) for r in runs["volume"] if r["selector"] == "rs"]
    reached = sum(t.reached for t in times)
    assert any(line.startswith(f"| volume | rs | 3 | {reached} |") for line in text.splitlines())


def test_a_partition_counts_as_finished_only_when_every_primary_arm_of_both_policies_is_in(tmp_path: Path) -> None:
    raw = _budget_grid(tmp_path, seeds=2)
    for run in (raw / "equal").glob("seed=31_distribution=d4_*selector=dice"):
        (run / "result.json").unlink()  # one arm of one partition still to come under equal bids
    text = main_grid.report(raw, "x")
    assert "**Interim: 5 of the 30 pre-registered partitions finished in every primary arm." in text
    for run in (raw / "equal").iterdir():
        for file in run.glob("result.json"):
            file.unlink()  # the equal-bid half of the grid not started yet
    text = main_grid.report(raw, "x")
    assert "**Interim: 0 of the 30 pre-registered partitions finished in every primary arm." in text
    assert "| nan" not in text and " nan |" not in text


def test_the_budget_grid_script_runs_the_registered_seeds_one_at_a_time_budget_matched(tmp_path: Path) -> None:
    script = GRID_SCRIPT.parent / "fashion_mnist_budget.sh"
    status, calls, _ = _grid_calls(tmp_path, None, script=script)
    assert status == 0 and len(calls) == 20  # seeds 30-39, both policies each
    assert all("--num-clients 20 --alpha 0.1 --rounds 30" in call and "--torch-threads 1" in call for call in calls)
    assert all("--num-selected 0 --baseline-match budget" in call for call in calls)
    assert calls[0].endswith("--out results/fashion_mnist_budget/raw/volume --bid-policy volume --budget-fraction 0.15 "
                             "--selector flmarket rs dice qbs dds --seed 30")  # fmt: skip
    assert calls[1].endswith("--out results/fashion_mnist_budget/raw/equal --bid-policy constant --budget-fraction 0.7 "
                             "--selector flmarket rs dice qbs dds --seed 30")  # fmt: skip
    assert calls[-1].endswith("--seed 39")
    (tmp_path / "resume").mkdir()
    status, calls, _ = _grid_calls(tmp_path / "resume", None, "33", "34", script=script)
    assert status == 0 and [call.rsplit(" ", 1)[1] for call in calls] == ["33", "33", "34", "34"]


RULE_ARMS = ("flmarket", "flmarket-whole", "rs", "dice")
"""The budget-rule grid's arms (results/fashion_mnist_budget_rule/PREREG.md)."""


def _rule_grid(
    tmp_path: Path, seeds: range, prereg: str | None = "fashion_mnist_budget_rule", winners: int = 2
) -> tuple[Path, dict[tuple[str, str, str, int], float]]:
    """The budget-rule grid: FLMarket (the paper's rule), RS and DICE under raw/<policy>, FLMarket under the
    whole-budget rule under raw/<policy>-whole, on ``seeds`` of d4-d6; its accuracies by (policy, arm, d, seed)."""
    raw = tmp_path / "results" / "fashion_mnist_budget_rule" / "raw"
    if prereg is not None:
        _prereg(raw, prereg)
    rng = np.random.default_rng(4)
    accuracy: dict[tuple[str, str, str, int], float] = {}
    for policy in ("volume", "equal"):
        for arm in RULE_ARMS:
            for d in ("d4", "d5", "d6"):
                for seed in seeds:
                    value = accuracy[(policy, arm, d, seed)] = float(rng.uniform(0.4, 0.9))
                    rule = "whole" if arm == "flmarket-whole" else "half"
                    config = {**RECORDED, "market": "direct", "baseline_match": "budget", "bid_policy": "volume"}
                    engine: dict[str, object] = {"diverged": False, "config": config}
                    market: dict[str, object] = {"scores": [10.0 * math.sqrt(n) for n in SIZES]}
                    if arm.startswith("flmarket"):
                        config["auction_budget_rule"] = rule
                        paid = 95.0 if rule == "whole" else 45.0
                        bids = [1.0] * len(SIZES) if policy == "equal" else [1.2 * n for n in SIZES]
                        market.update(
                            total_payment=paid, budget=100.0, budget_rule=rule, paid_share=paid / 100, bids=bids
                        )
                    else:
                        engine["matched"] = {
                            "match": "budget",
                            "payment_rule": "pay-as-bid",
                            "budget": 100.0,
                            "paid": 97.0,
                        }
                    curve = [{"accuracy": 0.1}] + [
                        {"accuracy": value * min(1.0, r / 10), "round_time_s": 0.2, "cpu_s": 0.3} for r in range(1, 31)
                    ]
                    folder = raw / (f"{policy}-whole" if rule == "whole" and arm != "rs" and arm != "dice" else policy)
                    selector = "flmarket" if arm.startswith("flmarket") else arm
                    _write(folder, selector, d, seed, value, engine=engine, market=market, rounds=curve,
                           num_clients=20, selected_partitions=list(range(winners)))  # fmt: skip
    return raw, accuracy


def test_a_record_s_arm_is_its_selector_and_its_budget_rule() -> None:
    record = {"selector": "flmarket", "engine": {"config": {"auction_budget_rule": "whole"}}, "market": {}}
    assert main_grid.arm_of(record) == "flmarket-whole"
    # A record from before the rule was a setting is the paper's rule; the market's field stands in for the config's.
    assert main_grid.arm_of({"selector": "flmarket", "engine": {"config": {}}, "market": {}}) == "flmarket"
    assert (
        main_grid.arm_of({"selector": "flmarket", "engine": {}, "market": {"budget_rule": "whole"}}) == "flmarket-whole"
    )
    assert main_grid.arm_of({"selector": "rs", "engine": {"config": {"auction_budget_rule": "whole"}}}) == "rs"


def test_a_budget_rule_grid_tests_the_whole_budget_rule_against_rs_and_dice_with_holm_over_four(
    tmp_path: Path,
) -> None:
    raw, accuracy = _rule_grid(tmp_path, range(200, 202))
    runs = main_grid.runs_by_policy(raw)
    assert len(runs["volume"]) == len(runs["equal"]) == 4 * 6  # raw/<policy> and raw/<policy>-whole together
    assert main_grid.lead_arm(runs) == "flmarket-whole"
    text = main_grid.report(raw, "python -m simulations.main_grid raw")
    partitions = [(d, s) for d in ("d4", "d5", "d6") for s in (200, 201)]

    def paired(policy: str, mine: str, theirs: str) -> float:
        a = np.array([100 * accuracy[(policy, mine, *p)] for p in partitions])
        b = np.array([100 * accuracy[(policy, theirs, *p)] for p in partitions])
        return float(scipy_stats.ttest_rel(a, b).pvalue)

    # The primary family: the whole-budget rule minus RS and minus DICE under each policy, Holm over the four.
    order = [("volume", "rs"), ("volume", "dice"), ("equal", "rs"), ("equal", "dice")]
    primary = main_grid.contrasts(runs, "auc", main_grid.PRIMARY_BASELINES, "flmarket-whole")
    assert [(c.policy, c.baseline, c.arm) for c in primary] == [(p, b, "flmarket-whole") for p, b in order]
    p_values = [paired(p, "flmarket-whole", b) for p, b in order]
    assert [c.p_t for c in primary] == pytest.approx(p_values)
    section = text.split("## Primary")[1].split("## ")[0]
    assert "| bids | FLMarket (whole) vs |" in section and "| FLMarket (whole) ahead |" in section
    for (policy, baseline), p_holm in zip(order, holm(p_values), strict=True):
        assert any(line.startswith(f"| {policy} | {baseline} | 6 |") and f"| {p_holm:.3g} |" in line
                   for line in section.splitlines()), (policy, baseline)  # fmt: skip
    assert "| flmarket |" not in section  # the paper's rule is not in the primary family
    # The secondary pre-registered family: the two rules, Holm over the two.
    rules = text.split("## Secondary: the two budget rules")[1].split("## ")[0]
    assert "Holm over the two" in rules.splitlines()[0]
    two = [paired(p, "flmarket-whole", "flmarket") for p in ("volume", "equal")]
    for policy, p_holm in zip(("volume", "equal"), holm(two), strict=True):
        assert any(line.startswith(f"| {policy} | flmarket | 6 |") and f"| {p_holm:.3g} |" in line
                   for line in rules.splitlines()), policy  # fmt: skip
    # Every table of arms shows both FLMarket arms.
    for policy in ("volume", "equal"):
        assert f"| {policy} | flmarket | 6 | critical payments | 2 (2 to 2) | 0.45 (0.45 to 0.45) | 0 of 6 |" in text
        assert (
            f"| {policy} | flmarket-whole | 6 | critical payments | 2 (2 to 2) | 0.95 (0.95 to 0.95) | 0 of 6 |" in text
        )
        assert f"| {policy} | flmarket-whole | 6 | 2 (2 to 2) | 0.950 (0.950 to 0.950) |" in text  # what it bought
        assert sum(line.startswith(f"| {policy} | flmarket-whole | 6 |") for line in text.splitlines()) == 4
    # Time to 0.6: the whole-budget rule against RS and DICE; the paper's ratios beside the lead arm and baselines.
    assert "| bids | FLMarket (whole) vs | partitions | FLMarket (whole) reaches 0.6 in fewer rounds |" in text
    assert "rounds: arm / FLMarket (whole)" in text
    assert "Pre-registered as secondary (" in text and "fashion_mnist_budget_rule/PREREG.md)." in text
    # The header: the grid's own title, registration, seeds and script.
    title, _, protocol, _, status = text.splitlines()[:5]
    assert title == "# Fashion-MNIST budget-rule grid: what the same money buys under each of FLMarket's budget rules"
    assert "on seeds 200-201;" in protocol and "Grid: `bash simulations/fashion_mnist_budget_rule.sh`." in protocol
    assert status.startswith("**Interim: 6 of the 30 pre-registered partitions finished in every primary arm. The "
                             "registration is seeds 200-209 on d4, d5, d6;")  # fmt: skip
    # The paper's headline is read on the paper's rule; the deviation names the whole-budget rule.
    assert "read on FLMarket under the paper's rule" in text
    assert "The auctions are those under the paper's rule;" in text
    assert len(main_grid.bidders(runs["volume"])) == 6 * len(SIZES)  # one arm's auctions, not both rules' at once
    assert "| auction budget rule | Algorithm 1 admits" in text and "`auction_budget_rule` = half, whole" in text


def test_the_header_says_all_registered_partitions_only_when_every_primary_arm_has_every_one(tmp_path: Path) -> None:
    raw, _ = _rule_grid(tmp_path, range(200, 210))
    text = main_grid.report(raw, "x")
    assert "**All 30 pre-registered partitions finished: the primary test below is the pre-registered one.**" in text
    assert "on seeds 200-209;" in text
    # The paper's rule is a secondary arm: its runs are not needed for the primary test to be the registered one.
    for run in (raw / "equal").glob("seed=209_distribution=d6_*selector=flmarket"):
        shutil.rmtree(run)
    assert "**All 30 pre-registered partitions finished" in main_grid.report(raw, "x")
    for run in (raw / "equal-whole").glob("seed=209_distribution=d6_*"):
        shutil.rmtree(run)  # one primary arm of one registered partition still to come
    text = main_grid.report(raw, "x")
    assert "**Interim: 29 of the 30 pre-registered partitions finished in every primary arm." in text
    assert "All 30 pre-registered" not in text


@pytest.mark.parametrize(
    ("grid", "prereg", "first"),
    [("rule", "fashion_mnist_budget_rule", 30), ("budget", "fashion_mnist_budget", 200), ("budget", None, 30)],
)
def test_a_grid_on_other_seeds_than_its_registration_or_with_none_is_not_called_pre_registered(
    tmp_path: Path, grid: str, prereg: str | None, first: int
) -> None:
    if grid == "rule":
        raw, _ = _rule_grid(tmp_path, range(first, first + 2), prereg=prereg)
    else:
        raw = _budget_grid(tmp_path, seeds=2, first=first, prereg=prereg)
    text = main_grid.report(raw, "x")
    status = text.splitlines()[4]
    if prereg is None:
        assert status.startswith("**Exploratory, not pre-registered** (no PREREG.md beside its raw/ folder)")
        assert "Protocol: not pre-registered (" in text
    else:
        registered = "200-209" if grid == "rule" else "30-39"
        assert status.startswith("**Not the pre-registered grid: exploratory.**")
        assert (
            f"is seeds {registered} on d4, d5, d6 (30 partitions); this grid ran seeds {first}-{first + 1} on d4-d6"
            in status
        )
    assert "decide nothing" in status and "would need" in status
    assert "pre-registered partitions finished" not in text and "Interim" not in text
    assert "Descriptive: not pre-registered for this grid." in text and "Pre-registered as secondary" not in text


def test_a_pre_registration_the_report_cannot_read_is_named(tmp_path: Path) -> None:
    raw = _budget_grid(tmp_path, seeds=1)
    prereg = raw.parent / "PREREG.md"
    prereg.write_text("**Seeds: 30-39** on each of d4, d5: **30 partitions**\n", encoding="utf-8")
    with pytest.raises(ValueError, match="registers 30 partitions, but seeds 30-39 on d4, d5 are 20"):
        main_grid.report(raw, "x")
    prereg.write_text("# A pre-registration without its seeds\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"PREREG.md has no '\*\*Seeds: A-B\*\* on each of"):
        main_grid.report(raw, "x")


def test_a_median_of_counts_keeps_its_half(tmp_path: Path) -> None:
    assert main_grid._spread([5, 6]) == "5.5 (5 to 6)"
    assert main_grid._spread([1_062, 2_063]) == "1,562.5 (1,062 to 2,063)"
    assert main_grid._spread([5, 6, 7]) == "6 (5 to 7)"
    assert main_grid._spread([0.25, 0.5], ".2f") == "0.38 (0.25 to 0.50)"  # not counts: the format as given
    raw = _budget_grid(tmp_path, seeds=2)
    for path in raw.glob("volume/*selector=rs/result.json"):
        record = json.loads(path.read_text(encoding="utf-8"))
        record["selected_partitions"] = list(range(5 if record["distribution"] in ("d4", "d5") and record["seed"] == 30
                                                   else 6 if record["seed"] == 31 else 5))  # fmt: skip
        path.write_text(json.dumps(record), encoding="utf-8")
    for path in raw.glob("volume/*selector=flmarket/result.json"):
        record = json.loads(path.read_text(encoding="utf-8"))
        record["selected_partitions"] = list(range(5 + record["seed"] - 30))  # three runs of 5, three of 6
        path.write_text(json.dumps(record), encoding="utf-8")
    text = main_grid.report(raw, "x")
    assert "| volume | rs | 6 | pay-as-bid | 5.5 (5 to 6) |" in text  # what it spent
    assert "| volume | rs | 6 | 5.5 |" in text  # what it bought
    assert "| volume | flmarket | 6 | 5.5 (5 to 6) |" in text  # what FLMarket bought


def test_a_contrast_that_does_not_reject_is_not_detected_at_this_size_never_level(tmp_path: Path) -> None:
    null = main_grid.contrast({("d4", i): 50.0 + (-1) ** i for i in range(6)}, {("d4", i): 50.0 for i in range(6)},
                              "volume", "rs", "auc")  # fmt: skip
    assert main_grid._side(null, 0.5) == main_grid._side(null, math.nan) == "not detected at this size"
    texts = [
        main_grid.report(_rule_grid(tmp_path / "rule", range(200, 202))[0], "x"),
        main_grid.report(_budget_grid(tmp_path / "budget", seeds=2), "x"),
        main_grid.report(_grid(tmp_path / "main", _every_arm(2)), "x"),
        main_grid.report(_grid(tmp_path / "c100", _every_arm(2), clients=100), "x"),
    ]
    for text in texts:
        assert "level" not in text.lower()
        assert "not detected at this size" in text.split("## What reproduces of the paper's headline")[1]
    assert "a difference is not detected at this size" in texts[0].split("## Secondary: the two budget rules")[1]
