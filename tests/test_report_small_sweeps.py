"""The reports of a small sweep (Flower runs and engine runs): a final-accuracy table for the selectors that ran,
a win-share plot with bars, no link to a plot that was not written, and cohort sizes that say what the budget
selected (not "0 of 20") in tables and plot titles."""

from __future__ import annotations

import json
import re
from pathlib import Path

import matplotlib.axes
import matplotlib.figure
import pytest

from simulations.record import cohort
from simulations.report import build_report, load_results
from simulations.sweep_report import build_sweep_report


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


# --- engine sweeps (simulations.sweep_report) --------------------------------------------------------------------
def _engine_record(
    selector: str, distribution: str, seed: int, accuracy: float, num_selected: int = 10, bid_policy: str = "volume"
) -> dict:
    config = {
        "bid_policy": bid_policy,
        "local_steps": 20,
        "batch_size": 32,
        "learning_rate": 0.05,
        "momentum": 0.9,
        "clip_norm": 5.0,
        "min_rounds": 30,
        "rounds": 100,
        "final_window": 10,
        "plateau_tolerance": 0.01,
    }
    selected = num_selected or 6 + seed
    return {
        "selector": selector,
        "dataset": "digits_xl",
        "model": "digits_cnn",
        "distribution": distribution,
        "num_clients": 20,
        "num_selected": num_selected,
        "seed": seed,
        "final_accuracy": accuracy,
        "rounds": [{"accuracy": 0.1}] + [{"accuracy": accuracy}] * 30,
        "selected_nodes": list(range(selected)),
        "pool_class_totals": [100] * 10,
        "selected_class_totals": [50] * 10,
        "timings": {"job_wall_s": 10.0},
        "engine": {"config": config, "rounds_run": 30, "plateau_reached": True, "diverged": False, "collapsed": False},
    }


def _sweep_titles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    titles: list[str] = []
    original = matplotlib.figure.Figure.suptitle

    def recording_suptitle(self, text, *args, **kwargs):  # type: ignore[no-untyped-def]
        titles.append(text)
        return original(self, text, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "suptitle", recording_suptitle)
    return titles


def _bars(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of bars of every ``Axes.bar`` call from now on."""
    counts: list[int] = []
    original = matplotlib.axes.Axes.bar

    def recording_bar(self, x, *args, **kwargs):  # type: ignore[no-untyped-def]
        counts.append(len(x))
        return original(self, x, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "bar", recording_bar)
    return counts


def _links(report: str) -> list[str]:
    return re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report)


def test_a_two_selector_engine_sweep_shows_what_ran(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    records = [
        _engine_record(selector, distribution, seed, accuracy)
        for seed in (0, 1)
        for distribution in ("d1", "d4")
        for selector, accuracy in (("flmarket", 0.90 + 0.01 * seed), ("rs", 0.80))
    ]
    bars = _bars(monkeypatch)
    out = tmp_path / "report"
    report = build_sweep_report(records, out).read_text()

    section = report.split("## Final accuracy by setting", 1)[1].split("\n## ", 1)[0]
    assert "| distribution | FLMarket's bids | FLMarket | RS | seeds | vs RS |" in section
    assert "| d4 | volume | **90.5 ± 0.5** | 80.0 ± 0.0 | 2 | +10.5" in section
    assert "QBS" not in section and "| - |" not in section
    assert "win share" in report and "FLMarket best in **1 of 1** settings" in report
    assert bars and sum(bars) > 0, "win_share.png has no bars"
    for link in _links(report):
        assert (out / link).is_file(), f"REPORT.md links {link}, which was not written"
    assert "premise.png" not in _links(report) and "python -m simulations.premise" in report


def test_an_engine_sweep_links_the_premise_plot_it_finds(tmp_path: Path) -> None:
    records = [_engine_record(s, "d4", 0, a) for s, a in (("flmarket", 0.9), ("rs", 0.8))]
    out = tmp_path / "report"
    out.mkdir()
    (out / "premise.png").write_bytes(b"png")
    assert "![premise](premise.png)" in build_sweep_report(records, out).read_text()


def test_a_budget_mode_engine_sweep_is_titled_by_what_the_budget_bought(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = [
        _engine_record(selector, "d4", seed, accuracy, num_selected=0)
        for seed in (0, 1)
        for selector, accuracy in (("flmarket", 0.9), ("rs", 0.85))
    ]
    titles = _sweep_titles(monkeypatch)
    report = build_sweep_report(records, tmp_path / "report").read_text()
    assert "**6-7 of 20 (by budget) clients**" in report
    assert titles and all("6-7 of 20 (by budget) clients" in title for title in titles), titles
    assert not re.search(r"(?<![\d-])0 of 20", report)
    assert not any(re.search(r"(?<![\d-])0 of 20", title) for title in titles)


def test_an_engine_sweep_of_flmarket_alone_has_its_table_and_no_empty_plot(tmp_path: Path) -> None:
    records = [_engine_record("flmarket", "d4", seed, 0.9 + 0.01 * seed) for seed in (0, 1)]
    out = tmp_path / "report"
    report = build_sweep_report(records, out).read_text()
    assert "| distribution | FLMarket's bids | FLMarket | seeds |" in report
    assert "| d4 | volume | **90.5 ± 0.5** | 2 |" in report
    assert "No baseline ran beside FLMarket: no win share." in report and not (out / "win_share.png").exists()
    for link in _links(report):
        assert (out / link).is_file(), f"REPORT.md links {link}, which was not written"


def _tables(report: str) -> list[tuple[str, str]]:
    """Every markdown table's header row and the delimiter row under it."""
    lines = report.splitlines()
    return [(lines[i - 1], line) for i, line in enumerate(lines) if i and line.startswith("|---")]


def _cells(row: str) -> int:
    return row.strip().count("|") - 1


def test_an_engine_sweep_whose_second_bid_policy_ran_on_some_settings_only_renders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shape of digits_xl: volume bids everywhere, constant bids at d4 and 10 of 20 only, so some groups of the
    win-share plot (5 selected, d1-d3) have no FLMarket run under constant bids (it once failed with KeyError)."""
    baselines = (("rs", 0.80), ("qbs", 0.82), ("dice", 0.85), ("dds", 0.84))
    records = [
        _engine_record(selector, distribution, seed, accuracy + 0.001 * seed, num_selected=k)
        for k in (5, 10)
        for distribution in ("d1", "d4")
        for seed in (0, 1, 2)
        for selector, accuracy in (("flmarket", 0.90), *baselines)
    ]
    records += [_engine_record("flmarket", "d4", seed, 0.83, bid_policy="constant") for seed in (0, 1, 2)]
    bars = _bars(monkeypatch)
    out = tmp_path / "report"
    report = build_sweep_report(records, out).read_text()

    assert "| d4 | constant | 83.0 ± 0.0 |" in report
    assert "| d1 | constant |" not in report
    assert "- 20 clients, d4-d6, constant bids: FLMarket best in **0 of 1** settings" in report
    assert (out / "win_share.png").is_file()
    # volume bids: a bar in each of the five groups (all, 5 selected, 10 selected, d1-d3, d4-d6); constant bids:
    # only the groups that hold its one setting (all, 10 selected, d4-d6)
    assert bars == [5, 3], bars
    for link in _links(report):
        assert (out / link).is_file(), f"REPORT.md links {link}, which was not written"


@pytest.mark.parametrize("selectors", [("flmarket",), ("flmarket", "rs"), ("flmarket", "rs", "qbs", "dice", "dds")])
def test_every_table_of_an_engine_sweep_has_a_delimiter_row_as_wide_as_its_header(
    tmp_path: Path, selectors: tuple[str, ...]
) -> None:
    records = [_engine_record(s, "d4", seed, 0.8 + 0.01 * seed) for s in selectors for seed in (0, 1)]
    report = build_sweep_report(records, tmp_path / "report").read_text()
    tables = _tables(report)
    assert tables
    for header, delimiter in tables:
        assert _cells(header) == _cells(delimiter), f"{header!r} over {delimiter!r}"


def _recorded(monkeypatch: pytest.MonkeyPatch, method: str) -> list[tuple]:
    """The positional arguments of every ``Axes.<method>`` call from now on."""
    calls: list[tuple] = []
    original = getattr(matplotlib.axes.Axes, method)

    def recording(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(args)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, method, recording)
    return calls


def test_a_one_selector_engine_sweep_says_it_compares_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 44: a one-selector sweep's plot compared nothing without saying so."""
    titles = _sweep_titles(monkeypatch)
    alone = build_sweep_report([_engine_record("flmarket", "d4", s, 0.9) for s in (0, 1)], tmp_path / "a").read_text()
    assert "**Only FLMarket (volume bids) ran in this sweep: there is nothing to compare it with.**" in alone
    assert titles and all(title.endswith("FLMarket (volume bids) alone, nothing to compare") for title in titles)

    titles.clear()
    records = [_engine_record(s, "d4", seed, a) for seed in (0, 1) for s, a in (("flmarket", 0.9), ("rs", 0.8))]
    both = build_sweep_report(records, tmp_path / "b").read_text()
    assert "nothing to compare" not in both and not any("nothing to compare" in title for title in titles)


def test_the_engine_sweeps_curves_start_at_round_0_and_the_axis_holds_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 44: the y axis started at 0.5 and the curves at round 1, cutting the first rounds off."""
    plots, limits = _recorded(monkeypatch, "plot"), _recorded(monkeypatch, "set_ylim")
    records = [_engine_record(s, "d4", seed, a) for seed in (0, 1) for s, a in (("flmarket", 0.9), ("rs", 0.8))]
    for record in records:  # round 0 at 0.1, round 1 at 0.3, then the final accuracy
        record["rounds"][1] = {"accuracy": 0.3}
    build_sweep_report(records, tmp_path / "report")

    curves = [(list(x), list(y)) for x, y, *_ in plots if len(x) == 31]
    assert len(curves) == 2 and all(x[0] == 0 and y[:2] == pytest.approx([0.1, 0.3]) for x, y in curves)
    (low, high), *_ = [args for args in limits if len(args) == 2]
    assert low <= 0.1 and high == 1.0


def test_the_engine_time_says_how_the_runs_ran_as_recorded(tmp_path: Path) -> None:
    """Issue 44: "two runs at once on 2 cores" was fixed text; it comes from the records now."""
    records = [_engine_record(s, "d4", 0, a) for s, a in (("flmarket", 0.9), ("rs", 0.8))]
    old = build_sweep_report(records, tmp_path / "old").read_text()
    assert "(torch threads not recorded; runs at once not recorded for 2 of 2 runs)" in old
    for record in records:
        record["engine"]["config"]["torch_threads"] = 1
        record["sweep"] = {"runs_at_once": 3, "cpus": 16, "ray_cluster": False}
    new = build_sweep_report(records, tmp_path / "new").read_text()
    assert "- Engine time per run (1 torch thread; 3 runs at once on 16 cores): " in new
    records[1]["sweep"] = {"runs_at_once": 8, "cpus": 0, "ray_cluster": True}
    mixed = build_sweep_report(records, tmp_path / "mixed").read_text()
    assert "(1 torch thread; 3 runs at once on 16 cores; 8 runs at once on a Ray cluster)" in mixed
