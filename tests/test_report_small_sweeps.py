"""The sweep report on a small sweep: a final-accuracy table for the selectors that ran, and cohort sizes
that say what the budget selected (not "0 of 20") in tables and plot titles."""

from __future__ import annotations

import json
import re
from pathlib import Path

import matplotlib.figure
import pytest

from simulations.report import build_report, cohort, load_results


def _write(folder: Path, selector: str, seed: int, accuracy: float, selected: int, num_selected: int = 0) -> None:
    job = folder / f"{selector}_{seed}"
    job.mkdir(parents=True)
    record = {
        "selector": selector,
        "dataset": "digits",
        "distribution": "d4",
        "num_clients": 20,
        "num_selected": num_selected,
        "seed": seed,
        "final_accuracy": accuracy,
        "rounds": [{"round": 0, "accuracy": 0.1, "loss": 2.3}, {"round": 1, "accuracy": accuracy, "loss": 1.0}],
        "selected_nodes": list(range(selected)),
        "selected_class_totals": [1, 2],
        "pool_class_totals": [3, 4],
        "timings": {"server_app_s": 5.0},
    }
    (job / "result.json").write_text(json.dumps(record))


def test_cohort_names_the_fixed_size_or_what_the_budget_selected() -> None:
    assert cohort(5, 20, []) == "5 of 20"
    assert cohort(0, 20, [{"selected_nodes": [1] * 6}, {"selected_nodes": [1] * 10}]) == "6-10 of 20 (by budget)"
    assert cohort(0, 20, [{"selected_nodes": [1] * 7}]) == "7 of 20 (by budget)"


def test_a_budget_sweep_of_two_selectors_gets_its_table_and_true_titles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sweep = tmp_path / "sweep"
    _write(sweep, "flmarket", 0, 0.90, selected=6)
    _write(sweep, "flmarket", 1, 0.92, selected=10)
    _write(sweep, "rs", 0, 0.80, selected=8)
    titles: list[str] = []
    original = matplotlib.figure.Figure.suptitle

    def recording_suptitle(self, text, *args, **kwargs):  # type: ignore[no-untyped-def]
        titles.append(text)
        return original(self, text, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "suptitle", recording_suptitle)
    report = build_report(load_results([sweep]), tmp_path / "report").read_text()

    section = report.split("## Final accuracy", 1)[1].split("\n## ", 1)[0]
    assert "**digits, 6-10 of 20 (by budget) clients**" in section
    assert "| distribution | FLMarket | RS | seeds |" in section
    assert "| d4 | **91.0 ± 1.4** | 80.0 ± 0.0 | 1/2 |" in section
    assert titles and all("6-10 of 20 (by budget) selected" in title for title in titles), titles
    assert not any(re.search(r"(?<![\d-])0 of 20", title) for title in titles)
