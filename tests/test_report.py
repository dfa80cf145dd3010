"""The sweep report: tables, best-per-row marking, win counts, gains, Table 2 analogue, plots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulations.report import build_report, group_by_setting, load_results, main, mean_gains, win_counts

# Final accuracy per (distribution, selector): FLMarket wins on d4 and d5, DICE on d1.
ACCURACY = {
    "d1": {"flmarket": 0.80, "rs": 0.70, "qbs": 0.75, "dice": 0.85, "dds": 0.60},
    "d4": {"flmarket": 0.90, "rs": 0.50, "qbs": 0.60, "dice": 0.70, "dds": 0.40},
    "d5": {"flmarket": 0.70, "rs": 0.40, "qbs": 0.50, "dice": 0.60, "dds": 0.30},
}


def _write_result(folder: Path, distribution: str, selector: str, seed: int, accuracy: float) -> None:
    job = folder / f"{distribution}_{selector}_{seed}"
    job.mkdir(parents=True)
    counts = [[5, 0, 1], [0, 4, 0], [2, 2, 2]]
    record = {
        "selector": selector,
        "dataset": "digits",
        "distribution": distribution,
        "num_clients": 3,
        "num_selected": 2,
        "seed": seed,
        "final_accuracy": accuracy,
        "rounds": [
            {"round": 0, "accuracy": 0.1, "loss": 2.3},
            {"round": 1, "accuracy": accuracy, "loss": 1.0 - accuracy},
        ],
        "selected_class_totals": [5, 4, 1] if selector == "flmarket" else [7, 2, 3],
        "pool_class_totals": [7, 6, 3],
        "all_label_counts": counts,
        "timings": {"server_app_s": 10.0 if selector != "sfedavg" else 31.0},
    }
    (job / "result.json").write_text(json.dumps(record))


@pytest.fixture()
def sweep(tmp_path: Path) -> Path:
    folder = tmp_path / "sweep"
    for distribution, cells in ACCURACY.items():
        for selector, accuracy in cells.items():
            for seed, shift in ((0, -0.01), (1, 0.01)):
                _write_result(folder, distribution, selector, seed, accuracy + shift)
    _write_result(folder, "d4", "sfedavg", 0, 0.88)
    return folder


def test_win_counts_and_gains_follow_the_means(sweep: Path) -> None:
    grouped = group_by_setting(load_results([sweep]))
    assert win_counts(grouped) == {"all": (2, 3), "d4-d6": (2, 2)}
    gains = mean_gains(grouped)
    assert gains["rs"] == pytest.approx(((0.80 - 0.70) + (0.90 - 0.50) + (0.70 - 0.40)) / 3)
    assert gains["dice"] == pytest.approx(((0.80 - 0.85) + (0.90 - 0.70) + (0.70 - 0.60)) / 3)


def test_report_marks_the_best_of_each_row_and_writes_plots(sweep: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    report = build_report(load_results([sweep]), out, command="python -m simulations.run -m ...").read_text()
    assert "**2 of 3** settings (67%" in report
    assert "| d1 | 80.0 ± 1.4 | 70.0 ± 1.4 | 75.0 ± 1.4 | **85.0 ± 1.4** | 60.0 ± 1.4 | 2 |" in report
    assert "| d4 | **90.0 ± 1.4** |" in report
    assert "| pool | 7 | 6 | 3 | 16 | 3 |" in report  # Table 2 analogue
    assert "| FLMarket (acc " in report and "| DICE (acc " in report
    assert "| d4, 2 of 3 | 90.0 ± 1.4 | 88.0 ± 0.0 | 10.0 ± 0.0 | 31.0 ± 0.0 | 3.10x |" in report
    for metric in ("accuracy", "loss"):
        assert (out / f"{metric}_vs_round_digits_c3_k2.png").stat().st_size > 1000
    rows = (out / "final_accuracy.csv").read_text().splitlines()
    assert rows[0].startswith("dataset,num_clients,num_selected,val_per_class,distribution,selector")
    assert len(rows) == 1 + 15 + 1


def test_missing_or_empty_sweep_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_results([tmp_path / "nowhere"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no result.json"):
        main([str(tmp_path / "empty")])
