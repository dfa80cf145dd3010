"""Gather a sweep's ``result.json`` files into the paper's comparisons: tables, plots, counts.

Usage::

    python -m simulations.report results/multirun/<sweep> [more sweep folders] --out results/digits

Writes to ``--out``:

- ``REPORT.md``: the final-accuracy table (rows: distributions; columns: selectors; one block per
  cohort size; mean ± std over seeds; the best mean of each row in bold), the number of settings where
  FLMarket is best (overall and on d4-d6) against the paper's 77% / 81%, FLMarket's mean accuracy gain
  over each pre-training baseline, the class distribution of the clients FLMarket and DICE select (the
  paper's Table 2 analogue), and FLMarket vs S-FedAvg accuracy and wall time;
- ``final_accuracy.csv``: one row per (setting, selector) with mean, std and number of seeds;
- ``accuracy_vs_round_*.png`` and ``loss_vs_round_*.png``: mean curves per selector, one panel per
  distribution, one figure per cohort size.

A folder of in-process engine runs (``simulations/digits_xl_sweep.sh``) gets the statistics report of
:mod:`simulations.sweep_report` instead: paired tests, win shares with intervals, sensitivity, budget mode.

Runs are compared only within one *setting*: same dataset, number of clients, cohort size,
distribution and server-side validation split (``val-per-class``, which changes the training pool).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from simulations.record import IMBALANCED, PRE_TRAINING_SELECTORS, SELECTOR_LABELS, cohort
from simulations.sweep_report import build_sweep_report, is_engine_sweep

Grouped = dict["Setting", dict[str, list[dict[str, Any]]]]


@dataclass(frozen=True, order=True)
class Setting:
    """One cell of the comparison: which data, how many clients, how many selected."""

    dataset: str
    num_clients: int
    num_selected: int
    val_per_class: int
    distribution: str

    @property
    def block(self) -> tuple[str, int, int, int]:
        """The table block the setting belongs to (everything but the distribution)."""
        return (self.dataset, self.num_clients, self.num_selected, self.val_per_class)


def load_results(folders: Iterable[Path]) -> list[dict[str, Any]]:
    """Every ``result.json`` under the given folders (a job that failed has none).

    Raises
    ------
    FileNotFoundError
        If a folder does not exist or holds no ``result.json`` at all.
    """
    results: list[dict[str, Any]] = []
    for folder in folders:
        if not folder.is_dir():
            raise FileNotFoundError(f"sweep folder {folder} does not exist")
        found = sorted(folder.rglob("result.json"))
        if not found:
            raise FileNotFoundError(f"no result.json under {folder}: is it a simulations.run output folder?")
        for path in found:
            record = json.loads(path.read_text(encoding="utf-8"))
            record["_path"] = str(path)
            results.append(record)
    return results


def _setting(record: dict[str, Any]) -> Setting:
    val_per_class = int(record.get("run_config", {}).get("val-per-class", 0))
    return Setting(
        record["dataset"],
        int(record["num_clients"]),
        int(record["num_selected"]),
        val_per_class,
        record["distribution"],
    )


def group_by_setting(results: Sequence[dict[str, Any]]) -> Grouped:
    """``{setting: {selector: [records over seeds]}}``."""
    grouped: Grouped = defaultdict(lambda: defaultdict(list))
    for record in results:
        grouped[_setting(record)][record["selector"]].append(record)
    return grouped


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    array = np.asarray(values, dtype=float)
    return float(array.mean()), float(array.std(ddof=1)) if array.size > 1 else 0.0


def final_accuracy(records: Sequence[dict[str, Any]]) -> tuple[float, float, int]:
    """Mean and sample std of the final accuracy over seeds, and the number of seeds."""
    mean, std = _mean_std([r["final_accuracy"] for r in records])
    return mean, std, len(records)


def best_selector(cells: dict[str, list[dict[str, Any]]], selectors: Sequence[str]) -> str | None:
    """The selector with the highest mean final accuracy (ties: first in `selectors`)."""
    present = [s for s in selectors if s in cells]
    if not present:
        return None
    return max(present, key=lambda s: (final_accuracy(cells[s])[0], -present.index(s)))


def _complete(cells: dict[str, list[dict[str, Any]]]) -> bool:
    return all(s in cells for s in PRE_TRAINING_SELECTORS)


def win_counts(grouped: Grouped) -> dict[str, tuple[int, int]]:
    """Settings where FLMarket has the best mean, overall and on d4-d6: ``{scope: (wins, settings)}``."""
    counts = {"all": [0, 0], "d4-d6": [0, 0]}
    for setting, cells in grouped.items():
        if not _complete(cells):
            continue
        won = best_selector(cells, PRE_TRAINING_SELECTORS) == "flmarket"
        scopes = ["all"] + (["d4-d6"] if setting.distribution in IMBALANCED else [])
        for scope in scopes:
            counts[scope][0] += int(won)
            counts[scope][1] += 1
    return {scope: (wins, total) for scope, (wins, total) in counts.items()}


def mean_gains(grouped: Grouped) -> dict[str, float]:
    """FLMarket's mean final accuracy minus each baseline's, averaged over the complete settings."""
    gains: dict[str, list[float]] = defaultdict(list)
    for cells in grouped.values():
        if not _complete(cells):
            continue
        reference = final_accuracy(cells["flmarket"])[0]
        for selector in PRE_TRAINING_SELECTORS[1:]:
            gains[selector].append(reference - final_accuracy(cells[selector])[0])
    return {selector: float(np.mean(values)) for selector, values in gains.items()}


def _fmt(mean: float, std: float) -> str:
    return f"{100 * mean:.1f} ± {100 * std:.1f}"


def _blocks(grouped: Grouped) -> dict[tuple[str, int, int, int], list[Setting]]:
    blocks: dict[tuple[str, int, int, int], list[Setting]] = defaultdict(list)
    for setting in sorted(grouped):
        blocks[setting.block].append(setting)
    return blocks


def _block_records(grouped: Grouped, settings: Sequence[Setting]) -> list[dict[str, Any]]:
    return [r for s in settings for records in grouped[s].values() for r in records]


def accuracy_table(grouped: Grouped) -> list[str]:
    """Markdown blocks, one per (dataset, clients, cohort size); best mean per row in bold.

    The columns are the pre-training selectors the block has runs of: a sweep of two selectors gets a
    two-column table (win counts and gains still need all five).
    """
    lines: list[str] = []
    for (dataset, num_clients, num_selected, _), settings in _blocks(grouped).items():
        selectors = [s for s in PRE_TRAINING_SELECTORS if any(s in grouped[setting] for setting in settings)]
        if not selectors:
            continue
        size = cohort(num_selected, num_clients, _block_records(grouped, settings))
        lines += [f"**{dataset}, {size} clients** (final accuracy %, mean ± std over seeds)", ""]
        lines.append("| distribution | " + " | ".join(SELECTOR_LABELS[s] for s in selectors) + " | seeds |")
        lines.append("|---" * (len(selectors) + 2) + "|")
        for setting in settings:
            cells = grouped[setting]
            best = best_selector(cells, selectors) if len(selectors) > 1 else None
            row = []
            for selector in selectors:
                if selector not in cells:
                    row.append("—")
                    continue
                text = _fmt(*final_accuracy(cells[selector])[:2])
                row.append(f"**{text}**" if selector == best else text)
            seeds = sorted({len(cells[s]) for s in selectors if s in cells})
            lines.append(f"| {setting.distribution} | " + " | ".join(row) + f" | {'/'.join(map(str, seeds))} |")
        lines.append("")
    return lines


def class_distribution_table(grouped: Grouped, selectors: Sequence[str] = ("flmarket", "dice")) -> list[str]:
    """Per-class totals of the selected clients (first seed), next to the pool's: the Table 2 analogue."""
    lines: list[str] = []
    for setting in sorted(grouped, key=lambda s: (s.block, s.distribution)):
        cells = grouped[setting]
        if setting.distribution not in IMBALANCED or not all(s in cells for s in selectors):
            continue
        first = {s: min(cells[s], key=lambda r: r["seed"]) for s in selectors}
        pool = first[selectors[0]]["pool_class_totals"]
        num_classes = len(pool)
        size = cohort(setting.num_selected, setting.num_clients, _block_records(grouped, [setting]))
        seed = first[selectors[0]]["seed"]
        lines += [f"**{setting.dataset}, {setting.distribution}, {size}, seed {seed}**", ""]
        lines.append("| | " + " | ".join(f"c{c}" for c in range(num_classes)) + " | total | classes covered |")
        lines.append("|---" * (num_classes + 3) + "|")
        lines.append("| pool | " + " | ".join(str(v) for v in pool) + f" | {sum(pool)} | {sum(v > 0 for v in pool)} |")
        for selector in selectors:
            totals = first[selector]["selected_class_totals"] or [0] * num_classes
            accuracy = first[selector]["final_accuracy"]
            lines.append(
                f"| {SELECTOR_LABELS[selector]} (acc {100 * accuracy:.1f}%) | "
                + " | ".join(str(v) for v in totals)
                + f" | {sum(totals)} | {sum(v > 0 for v in totals)} |"
            )
        lines.append("")
    return lines


def sfedavg_table(grouped: Grouped) -> list[str]:
    """FLMarket vs S-FedAvg in the same settings: final accuracy and wall time of the ServerApp."""
    rows = []
    for setting in sorted(grouped, key=lambda s: (s.block, s.distribution)):
        cells = grouped[setting]
        if "sfedavg" not in cells or "flmarket" not in cells:
            continue
        times = {s: _mean_std([r["timings"]["server_app_s"] for r in cells[s]]) for s in ("flmarket", "sfedavg")}
        rows.append(
            (
                setting,
                final_accuracy(cells["flmarket"]),
                final_accuracy(cells["sfedavg"]),
                times["flmarket"],
                times["sfedavg"],
            )
        )
    if not rows:
        return []
    lines = [
        "| setting | FLMarket acc % | S-FedAvg acc % | FLMarket time (s) | S-FedAvg time (s) | time ratio |",
        "|---|---|---|---|---|---|",
    ]

    for setting, flm_acc, sf_acc, flm_time, sf_time in rows:
        ratio = sf_time[0] / flm_time[0] if flm_time[0] > 0 else math.nan
        size = cohort(setting.num_selected, setting.num_clients, _block_records(grouped, [setting]))
        lines.append(
            f"| {setting.distribution}, {size} | {_fmt(*flm_acc[:2])} | "
            f"{_fmt(*sf_acc[:2])} | {flm_time[0]:.1f} ± {flm_time[1]:.1f} | "
            f"{sf_time[0]:.1f} ± {sf_time[1]:.1f} | {ratio:.2f}x |"
        )
    mean_flm = float(np.mean([r[1][0] for r in rows]))
    mean_sf = float(np.mean([r[2][0] for r in rows]))
    mean_ratio = float(np.mean([r[4][0] for r in rows]) / np.mean([r[3][0] for r in rows]))
    lines += [
        "",
        f"Over these settings: FLMarket {100 * mean_flm:.1f}% vs S-FedAvg {100 * mean_sf:.1f}% mean final accuracy; "
        f"S-FedAvg takes {mean_ratio:.2f}x FLMarket's time (the paper: comparable accuracy at about 3x less time).",
        "",
    ]
    return lines


def write_csv(grouped: Grouped, path: Path) -> None:
    """One row per (setting, selector) with the mean and std final accuracy."""
    with path.open("w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(
            [
                "dataset",
                "num_clients",
                "num_selected",
                "val_per_class",
                "distribution",
                "selector",
                "mean_accuracy",
                "std_accuracy",
                "seeds",
            ]
        )
        for setting in sorted(grouped):
            for selector, records in sorted(grouped[setting].items()):
                mean, std, seeds = final_accuracy(records)
                writer.writerow(
                    [
                        setting.dataset,
                        setting.num_clients,
                        setting.num_selected,
                        setting.val_per_class,
                        setting.distribution,
                        selector,
                        f"{mean:.4f}",
                        f"{std:.4f}",
                        seeds,
                    ]
                )


def plot_curves(grouped: Grouped, out: Path) -> list[Path]:
    """Mean accuracy and loss per round, one panel per distribution, one figure per block."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []
    for (dataset, num_clients, num_selected, val_per_class), settings in _blocks(grouped).items():
        for metric in ("accuracy", "loss"):
            figure, axes = plt.subplots(
                1, len(settings), figsize=(3.2 * len(settings), 3.0), squeeze=False, sharey=True
            )
            for axis, setting in zip(axes[0], settings, strict=True):
                for selector, records in sorted(
                    grouped[setting].items(), key=lambda item: list(SELECTOR_LABELS).index(item[0])
                ):
                    length = min(len(r["rounds"]) for r in records)
                    curves = np.array([[round_[metric] for round_ in r["rounds"][:length]] for r in records])
                    axis.plot(range(length), curves.mean(axis=0), label=SELECTOR_LABELS.get(selector, selector))
                axis.set_title(setting.distribution)
                axis.set_xlabel("round")
                axis.xaxis.get_major_locator().set_params(integer=True)
            axes[0][0].set_ylabel(metric)
            labelled: dict[str, Any] = {}
            for axis in axes[0]:
                for handle, label in zip(*axis.get_legend_handles_labels(), strict=True):
                    labelled.setdefault(label, handle)
            figure.legend(labelled.values(), labelled.keys(), loc="center right", fontsize=8)
            size = cohort(num_selected, num_clients, _block_records(grouped, settings))
            figure.suptitle(f"{dataset}: {metric} vs round, {size} selected (mean over seeds)")
            figure.tight_layout(rect=(0, 0, 0.9, 1))
            suffix = f"_val{val_per_class}" if val_per_class else ""
            path = out / f"{metric}_vs_round_{dataset}_c{num_clients}_k{num_selected}{suffix}.png"
            figure.savefig(path, dpi=110)
            plt.close(figure)
            written.append(path)
    return written


def build_report(results: Sequence[dict[str, Any]], out: Path, command: str | None = None) -> Path:
    """Write REPORT.md, the CSV and the plots to `out`; return the REPORT.md path."""
    out.mkdir(parents=True, exist_ok=True)
    grouped = group_by_setting(results)
    wins = win_counts(grouped)
    gains = mean_gains(grouped)
    lines = ["# FLMarket vs pre-training selectors: results", ""]
    if command:
        lines += ["Regenerate with:", "", "```bash", command, "```", ""]
    seeds = sorted({r["seed"] for r in results})
    lines += [f"{len(results)} runs; seeds {seeds}.", ""]
    all_wins, all_total = wins["all"]
    hard_wins, hard_total = wins["d4-d6"]
    if all_total:
        lines += [
            "## Where FLMarket wins",
            "",
            f"- FLMarket has the highest mean final accuracy in **{all_wins} of {all_total}** settings "
            f"({100 * all_wins / all_total:.0f}%; the paper: 44 of 57, 77%).",
        ]
        if hard_total:
            lines.append(
                f"- On the most imbalanced distributions d4-d6: **{hard_wins} of {hard_total}** "
                f"({100 * hard_wins / hard_total:.0f}%; the paper: 22 of 27, 81%)."
            )
        gain_text = ", ".join(f"{SELECTOR_LABELS[s]} {100 * g:+.1f}" for s, g in gains.items())
        lines += [
            f"- FLMarket's mean final accuracy minus each baseline's, averaged over settings (points): {gain_text}; "
            f"over all baselines {100 * float(np.mean(list(gains.values()))):+.1f} (the paper: about +10).",
            "",
        ]
    lines += ["## Final accuracy", ""] + accuracy_table(grouped)
    table2 = class_distribution_table(grouped)
    if table2:
        lines += ["## Class distribution of the selected clients (Table 2 analogue)", ""] + table2
    sfedavg = sfedavg_table(grouped)
    if sfedavg:
        lines += [
            "## FLMarket vs S-FedAvg (in-training selection)",
            "",
            "Time is the whole ServerApp: selection (the market, or Shapley valuation every round) and training.",
            "",
        ] + sfedavg
    plots = plot_curves(grouped, out)
    lines += ["## Curves", ""] + [f"![{p.stem}]({p.name})" for p in plots]
    write_csv(grouped, out / "final_accuracy.csv")
    report = out / "REPORT.md"
    report.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return report


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweeps", nargs="+", type=Path, help="simulations.run output folders (multirun or single)")
    parser.add_argument(
        "--out", type=Path, default=Path("results/report"), help="where to write REPORT.md, CSV and plots"
    )
    parser.add_argument("--command", default=None, help="the command that regenerates the sweep, quoted in REPORT.md")
    args = parser.parse_args(argv)
    results = load_results(args.sweeps)
    if is_engine_sweep(results):  # an in-process engine sweep: the statistics report
        report = build_sweep_report(results, args.out, args.command)
    else:
        report = build_report(results, args.out, args.command)
    print(f"report written to {report}")


if __name__ == "__main__":
    main()
