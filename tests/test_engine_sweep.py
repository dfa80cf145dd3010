"""The sweep side of the in-process engine: plateau stopping, sensitivity weights, the resumable parallel grid,
DDS's feature extractor, and the sweep report (``simulations.sweep_report``)."""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from flmarket_flwr.app.task import embed_inputs
from simulations import engine as engine_module
from simulations.baselines.selectors import select_clients
from simulations.engine import EngineConfig, _plateau_delta, load_federation, run_engine, select
from simulations.sweep_report import build_sweep_report, in_training_lines, split_primary

SMALL = EngineConfig(dataset="digits", test_per_class=30, distribution="d4", seed=0, num_selected=4, local_steps=3)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


# --- plateau stopping ----------------------------------------------------------------------------------------------
def test_run_stops_at_the_first_round_where_the_plateau_criterion_holds() -> None:
    cfg = replace(SMALL, rounds=40, min_rounds=6, final_window=3, plateau_tolerance=0.02)
    result = run_engine(cfg)
    accuracies = np.array([r["accuracy"] for r in result["rounds"][1:]])
    stopped = accuracies.size
    assert result["engine"]["rounds_run"] == stopped
    if stopped < cfg.rounds:  # stopped early: the criterion holds there and at no earlier round from min_rounds
        assert result["engine"]["plateau_reached"]
        assert abs(_plateau_delta(accuracies, 3)) <= 0.02
    for earlier in range(cfg.min_rounds, stopped):
        assert abs(_plateau_delta(accuracies[:earlier], 3)) > 0.02
    assert result["final_accuracy"] == pytest.approx(accuracies[-3:].mean())


def test_without_min_rounds_every_round_runs() -> None:
    result = run_engine(replace(SMALL, rounds=5, final_window=2))
    assert result["engine"]["rounds_run"] == 5 and len(result["rounds"]) == 6


@pytest.mark.parametrize("min_rounds", [3, 11])
def test_min_rounds_must_leave_two_windows_within_the_rounds(min_rounds: int) -> None:
    with pytest.raises(ValueError, match="min_rounds"):
        EngineConfig(rounds=10, min_rounds=min_rounds, final_window=2)


def test_plateau_delta_needs_two_windows() -> None:
    assert math.isnan(_plateau_delta(np.array([0.5, 0.6, 0.7]), 2))
    assert _plateau_delta(np.array([0.5, 0.6, 0.7, 0.9]), 2) == pytest.approx(0.25)


# --- sensitivity weights -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("weight", [0.0, 0.25, 1.0])
def test_dice_weight_reaches_the_selector(weight: float) -> None:
    cfg = replace(SMALL, selector="dice", dice_volume_weight=weight, distribution="d6", num_clients=12)
    counts = load_federation(cfg).label_counts
    expected = select_clients("dice", counts, cfg.num_selected, seed=cfg.seed, volume_weight=weight)
    assert select(cfg, load_federation(cfg))[0] == [int(p) for p in expected]


def test_dds_lambda_changes_the_selection_somewhere() -> None:
    picks = {
        weight: tuple(
            select(
                replace(SMALL, selector="dds", dds_diversity_weight=weight, seed=s),
                load_federation(replace(SMALL, seed=s)),
            )[0]
            for s in range(4)
        )
        for weight in (0.0, 5.0)
    }
    assert picks[0.0] != picks[5.0]


# --- DDS's feature extractor ---------------------------------------------------------------------------------------
def test_embedding_tells_apart_clients_with_the_same_mean_image() -> None:
    """Two clients whose mean image is identical but whose images differ (a checkerboard and its inverse against
    two grey images): the old mean-image embedding could not tell them apart; the mean of fixed nonlinear features
    does (ReLU is convex, so the mean of the features exceeds the features of the mean wherever signs differ)."""
    checker = (np.indices((8, 8)).sum(axis=0) % 2).astype(np.float64).reshape(1, 1, 8, 8)
    patterns = np.concatenate([checker, 1.0 - checker])
    grey = np.full((2, 1, 8, 8), 0.5)
    np.testing.assert_allclose(patterns.mean(axis=0), grey.mean(axis=0))
    assert np.linalg.norm(embed_inputs(patterns) - embed_inputs(grey)) > 0.1


def test_embedding_is_fixed_order_free_and_empty_safe() -> None:
    images = np.random.default_rng(0).random((7, 1, 8, 8))
    np.testing.assert_array_equal(embed_inputs(images, seed=3), embed_inputs(images, seed=3))
    np.testing.assert_allclose(embed_inputs(images[::-1], seed=3), embed_inputs(images, seed=3))
    assert not np.allclose(embed_inputs(images, seed=3), embed_inputs(images, seed=4))
    np.testing.assert_array_equal(embed_inputs(images[:0]), np.zeros(16))


# --- the resumable grid --------------------------------------------------------------------------------------------
GRID = [
    "--dataset",
    "digits",
    "--test-per-class",
    "30",
    "--distribution",
    "d4",
    "--num-clients",
    "8",
    "--num-selected",
    "3",
    "--selector",
    "rs",
    "qbs",
    "--seed",
    "0",
    "1",
    "--rounds",
    "2",
    "--local-steps",
    "2",
    "--final-window",
    "1",
]


def test_grid_runs_on_workers_writes_every_job_and_resumes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Four jobs as Ray tasks on a local Ray of two CPUs; the sweep says where its results went."""
    engine_module.main(["--out", str(tmp_path), "--workers", "2", *GRID])
    assert f"results in {tmp_path.resolve()}" in capsys.readouterr().out
    jobs = sorted(p.parent.name for p in tmp_path.rglob("result.json"))
    assert jobs == sorted(
        f"seed={s}_distribution=d4_num_selected=3_selector={sel}" for s in (0, 1) for sel in ("rs", "qbs")
    )
    assert not list(tmp_path.rglob("*.partial"))
    first = json.loads((tmp_path / jobs[0] / "result.json").read_text())
    assert first["engine"]["rounds_run"] == 2
    assert first["sweep"] == {"runs_at_once": 2, "cpus": os.cpu_count(), "ray_cluster": False}  # for the report
    capsys.readouterr()
    engine_module.main(["--out", str(tmp_path), "--workers", "2", *GRID])
    assert "4 jobs, 4 finished before, 0 to run" in capsys.readouterr().out


def test_grid_reruns_only_the_missing_job(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    engine_module.main(["--out", str(tmp_path), *GRID])
    victim = next(tmp_path.rglob("result.json"))
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("result.json") if p != victim}
    victim.unlink()
    capsys.readouterr()
    engine_module.main(["--out", str(tmp_path), *GRID])
    assert "1 to run" in capsys.readouterr().out and victim.is_file()
    assert all(p.stat().st_mtime_ns == mtime for p, mtime in before.items())


# --- the sweep report ----------------------------------------------------------------------------------------------
SELECTORS = ("flmarket", "rs", "qbs", "dice", "dds")


def _record(selector: str, distribution: str, seed: int, accuracy: float, **engine: object) -> dict:
    config = {
        "bid_policy": "volume",
        "dice_volume_weight": 0.5,
        "dds_diversity_weight": 1.0,
        "local_steps": 20,
        "batch_size": 32,
        "learning_rate": 0.05,
        "momentum": 0.9,
        "clip_norm": 5.0,
        "min_rounds": 30,
        "rounds": 100,
        "final_window": 10,
        "plateau_tolerance": 0.01,
        "schedule": "geometric",
    }
    config.update({k: v for k, v in engine.items() if k in config})
    diverged = bool(engine.get("diverged", False))
    return {
        "selector": selector,
        "dataset": "digits_xl",
        "distribution": distribution,
        "num_clients": 20,
        "num_selected": 10,
        "seed": seed,
        "final_accuracy": math.nan if diverged else accuracy,
        "rounds": [{"accuracy": 0.1}] + [{"accuracy": accuracy}] * 30,
        "pool_class_totals": [100] * 10,
        "selected_class_totals": [50] * 10,
        "timings": {"job_wall_s": 10.0},
        "engine": {
            "config": config,
            "rounds_run": 30,
            "plateau_reached": True,
            "diverged": diverged,
            "collapsed": False,
        },
    }


def _records() -> list[dict]:
    records = []
    for seed in range(6):
        for distribution in ("d4", "d6"):
            for rank, selector in enumerate(SELECTORS):
                records.append(_record(selector, distribution, seed, 0.9 - 0.01 * rank + 0.001 * seed))
    records.append(_record("dice", "d4", 0, 0.5, dice_volume_weight=0.25))
    records.append(_record("flmarket", "d4", 0, 0.7, bid_policy="random"))
    records.append(_record("flmarket", "d4", 1, 0.95, bid_policy="constant"))
    records[1] = _record("rs", "d4", 0, 0.0, diverged=True)
    return records


def test_split_primary_keeps_both_bid_policies_and_separates_the_sensitivity_runs() -> None:
    records = _records()
    records.append(_record("rs", "d6", 1, 0.3, bid_policy="constant"))
    primary, variants = split_primary(records)
    assert len(primary) == 61 and set(variants) == {"dice, weight 0.25", "flmarket, random bids"}
    assert sum(r["selector"] == "flmarket" and r["engine"]["config"]["bid_policy"] == "constant" for r in primary) == 1
    # the baseline run repeated under another bid policy is the same run: the volume copy is kept
    (rs,) = [r for r in primary if r["selector"] == "rs" and r["distribution"] == "d6" and r["seed"] == 1]
    assert rs["final_accuracy"] == pytest.approx(0.9 - 0.01 + 0.001)


def test_sweep_report_counts_divergence_and_tests_the_pairs(tmp_path: Path) -> None:
    nobody = _record("flmarket", "d6", 9, 0.0)
    nobody["final_accuracy"], nobody["engine"]["bought_nobody"] = None, True
    report = build_sweep_report([*_records(), nobody], tmp_path).read_text()
    assert "**1 diverged**" in report and "**1 bought nobody**" in report
    # FLMarket (volume bids) is best in every setting and every seed; 12 units of one cohort size each (11 for RS).
    assert "20 clients, d4-d6, volume bids: FLMarket best in **2 of 2** settings" in report
    assert (
        "| 20 clients, d4-d6 | volume | RS | 11 | 11 |" in report
        and "| 20 clients, d4-d6 | volume | QBS | 12 | 12 |" in report
    )
    assert "all settings" not in report  # no d1-d3 runs: "all settings" would repeat d4-d6
    # equal bids side by side: their own row in the setting table, their own comparisons and win share
    assert "| d4 | constant | **95.0 ± 0.0** |" in report
    assert "| 20 clients, d4-d6 | constant | FLMarket (volume bids) | 1 | 1 |" in report
    assert "20 clients, d4-d6, constant bids: FLMarket best in **1 of 1** settings" in report
    assert "The paper never states its bids" in report
    assert "| dice, weight 0.25 | 1 | 1 |" in report and "| flmarket, random bids | 1 | 1 |" in report
    rows = (tmp_path / "comparison.csv").read_text().splitlines()
    assert rows[0] == (
        "num_clients,num_selected,distribution,bid_policy,selector,seeds,mean_accuracy,std_accuracy,flmarket_minus,"
        "ci_low,ci_high"
    )
    assert len(rows) == 1 + 2 * 5 + 5  # volume at d4 and d6, constant at d4
    assert "20,10,d6,volume,rs,6," in "\n".join(rows) and "20,10,d4,constant,rs,1," in "\n".join(rows)
    assert (tmp_path / "win_share.png").is_file() and (tmp_path / "accuracy_vs_round_c20_k10.png").is_file()


def test_sweep_report_pairs_by_partition_and_holds_one_holm_family(tmp_path: Path) -> None:
    records = []
    for seed in range(6):
        for distribution in ("d1", "d4"):
            for k in (5, 10, 15):
                for rank, selector in enumerate(SELECTORS):
                    record = _record(selector, distribution, seed, 0.9 - 0.01 * rank + 0.001 * seed + 0.002 * k)
                    record["num_selected"] = k
                    if selector == "flmarket":
                        record["selected_class_totals"] = [25] * 9 + [5]  # 230 samples against DICE's 500
                    records.append(record)
    report = build_sweep_report(records, tmp_path).read_text()
    # the three cohort sizes of a (distribution, seed) share a partition: 12 units behind 36 pairs
    assert "| 20 clients, all settings | volume | RS | 12 | 36 | +1.00 [+1.00, +1.00] |" in report
    assert "| 20 clients, d1-d3 | volume | RS | 6 | 18 |" in report
    pooled = [line for line in report.splitlines() if line.startswith("| 20 clients, ")]
    assert len(pooled) == 12 and "(12 tests: the pooled comparisons" in report  # 3 groups x 4 baselines, one family
    # Table 2 analogue: volume bought relative to DICE's and the smallest class's share
    assert "- 20 clients, volume bids (36 pairs): FLMarket bought **0.46** of DICE's volume (0.46-0.46)" in report
    assert "smallest class share 0.022 (DICE 0.100)" in report


def _in_training_record(selector: str, distribution: str, seed: int, accuracy: float, server_s: float) -> dict:
    record = _record(selector, distribution, seed, accuracy, local_steps=20)
    record["engine"]["config"].update(val_per_class=10, market="protocol")
    record["model"], record["num_selected"] = "digits_cnn", 5
    market_s = 1.0 if selector == "flmarket" else 0.0
    record["timings"] = {
        "job_wall_s": server_s,
        "server_app_s": server_s,
        "selection_s": market_s,
        "training_s": server_s - market_s,
        "valuation_s": 2.0 if selector == "sfedavg" else 0.0,
    }
    clients = [0, 1, 2, 3, 4] if selector == "flmarket" else list(range(20))
    record["trained_partitions_per_round"] = {"1": clients[:5], "2": clients[5:10] or clients[:5]}
    return record


def test_sfedavg_runs_get_their_own_section_and_stay_out_of_the_primary(tmp_path: Path) -> None:
    comparison = [
        _in_training_record(selector, "d4", seed, accuracy + 0.001 * seed, server_s)
        for seed in range(4)
        for selector, accuracy, server_s in (("flmarket", 0.90, 10.0), ("sfedavg", 0.92, 30.0))
    ]
    primary, variants = split_primary(_records() + comparison)
    assert len(primary) == 61 and set(variants) == {"dice, weight 0.25", "flmarket, random bids"}
    section = in_training_lines(comparison)
    row = next(line for line in section if line.startswith("| digits_xl, digits_cnn | d4, 5 of 20 | 4 |"))
    assert "| 90.2 ± 0.1 | 92.2 ± 0.1 | +2.0 [+2.0, +2.0] |" in row
    assert "| 10.0 (1.00 + 9.0) | 30.0 (2.0) | 3.00x |" in row and row.endswith("| 5 / 10 |")
    assert any(
        "4 pairs: S-FedAvg minus FLMarket +2.00 points (S-FedAvg ahead in 4, behind in 0, 4 units, Wilcoxon p 0.12, "
        "Holm 0.125)" in line  # 4 units: the smallest Wilcoxon p is 0.125
        for line in section
    )
    report = build_sweep_report(_records() + comparison, tmp_path).read_text()
    assert "## FLMarket against S-FedAvg" in report and "8 more in the comparison with S-FedAvg" in report
    assert "20 clients, d4-d6, volume bids: FLMarket best in **2 of 2** settings" in report  # primary unchanged


def test_grid_rejects_a_worker_count_below_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        engine_module.main(["--out", str(tmp_path), "--workers", "0", *GRID])
    assert "--workers must be >= 1, got 0" in capsys.readouterr().err
    assert not list(tmp_path.rglob("result.json"))


def test_boolean_options_take_true_or_false(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A boolean engine option is parsed, not cast: "false" is False, and a typo is an error naming it."""
    with pytest.raises(SystemExit):
        engine_module.main(["--out", str(tmp_path), "--cohort-budget", "maybe", *GRID])
    assert "expected true or false, got 'maybe'" in capsys.readouterr().err
    assert engine_module._parse_bool("False") is False and engine_module._parse_bool("TRUE") is True
