"""The report of an in-process engine sweep (``simulations/digits_xl_sweep.sh``): who wins, by how much, how surely.

:func:`build_sweep_report` reads every ``result.json`` under the sweep folder and writes ``REPORT.md``,
``comparison.csv`` and the plots to ``--out``. The *primary* comparison is the runs at the default bid policy
(``volume``) and the default weights of our DICE and DDS reconstructions; the other runs are sensitivity
analyses, compared seed by seed with the primary runs of the same setting. Runs of the in-training comparison
(S-FedAvg, and the FLMarket runs beside it: a validation split taken out, the real market phase timed, or another
model) form their own section (:func:`in_training_lines`). Statistics come from
:mod:`simulations.stats` (paired Wilcoxon, Holm, win shares with a bootstrap interval). Diverged runs are
counted and left out of every mean and every pair, never averaged in.

``python -m simulations.report <sweep folder> --out <folder>`` dispatches here when the folder holds engine
runs.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from flmarket_flwr.pricing.selectors import DDS_DIVERSITY_WEIGHT, DICE_VOLUME_WEIGHT
from simulations import stats
from simulations.report import IMBALANCED
from simulations.report import PRE_TRAINING_SELECTORS as SELECTORS
from simulations.report import SELECTOR_LABELS as LABELS

__all__ = ["build_sweep_report", "budget_mode_cohorts", "in_training_lines", "is_engine_sweep", "split_primary"]

BUDGET_FRACTIONS = (0.25, 0.5)
"""Budgets of the budget-mode auctions, as fractions of the sum of all bids."""

Record = Mapping[str, Any]


def _config(record: Record) -> Mapping[str, Any]:
    return (record.get("engine") or {}).get("config", {})


def is_engine_sweep(records: Sequence[Record]) -> bool:
    """Whether the records come from the in-process engine (they carry its protocol)."""
    return bool(records) and all("engine" in record for record in records)


def _variant(record: Record) -> str | None:
    """``None`` for a primary run, else the name of the sensitivity variant it belongs to."""
    config = _config(record)
    if config.get("bid_policy", "volume") != "volume":
        return f"flmarket, {config['bid_policy']} bids"
    if record["selector"] == "dice" and config.get("dice_volume_weight", DICE_VOLUME_WEIGHT) != DICE_VOLUME_WEIGHT:
        return f"dice, weight {config['dice_volume_weight']}"
    if record["selector"] == "dds" and config.get("dds_diversity_weight", DDS_DIVERSITY_WEIGHT) != DDS_DIVERSITY_WEIGHT:
        return f"dds, lambda {config['dds_diversity_weight']}"
    return None


def _in_training_comparison(record: Record) -> bool:
    """Whether a run belongs to the comparison with S-FedAvg rather than with the pre-training selectors."""
    config = _config(record)
    return (
        record["selector"] == "sfedavg"
        or int(config.get("val_per_class", 0)) > 0
        or config.get("market", "direct") != "direct"
        or record.get("model", "digits_cnn") != "digits_cnn"
    )


def split_primary(records: Sequence[Record]) -> tuple[list[Record], dict[str, list[Record]]]:
    """The primary runs, and the sensitivity runs by variant name (runs of the S-FedAvg comparison left out)."""
    primary: list[Record] = []
    variants: dict[str, list[Record]] = defaultdict(list)
    for record in records:
        if _in_training_comparison(record):
            continue
        name = _variant(record)
        if name is None:
            primary.append(record)
        else:
            variants[name].append(record)
    return primary, dict(variants)


def _finite(record: Record) -> bool:
    return not (record.get("engine") or {}).get("diverged") and math.isfinite(float(record["final_accuracy"]))


def _by_setting(records: Sequence[Record]) -> dict[tuple[int, int, str], dict[str, dict[int, Record]]]:
    """``(num_clients, num_selected, distribution) -> selector -> seed -> record``."""
    table: dict[tuple[int, int, str], dict[str, dict[int, Record]]] = defaultdict(lambda: defaultdict(dict))
    for record in records:
        key = (int(record["num_clients"]), int(record["num_selected"]), str(record["distribution"]))
        table[key][str(record["selector"])][int(record["seed"])] = record
    return table


def _mean_std(runs: Mapping[int, Record]) -> tuple[float, float, int]:
    values = np.array([float(r["final_accuracy"]) for r in runs.values() if _finite(r)])
    if values.size == 0:
        return math.nan, math.nan, 0
    return float(values.mean()), float(values.std()), int(values.size)


def protocol_lines(records: Sequence[Record]) -> list[str]:
    """How the runs ended: rounds run, plateau reached, diverged, collapsed; time per run."""
    engines = [record["engine"] for record in records]
    rounds = np.array([e["rounds_run"] for e in engines])
    plateau = sum(bool(e["plateau_reached"]) for e in engines)
    diverged = sum(bool(e["diverged"]) for e in engines)
    collapsed = sum(bool(e["collapsed"]) for e in engines)
    config = _config(records[0])
    wall = defaultdict(list)
    for record in records:
        wall[(int(record["num_clients"]), int(record["num_selected"]))].append(float(record["timings"]["job_wall_s"]))
    times = ", ".join(f"{k} of {e} {np.mean(v):.1f} s" for (e, k), v in sorted(wall.items()))
    return [
        f"- Protocol: {config['local_steps']} local SGD steps per round (batch {config['batch_size']}, "
        f"lr {config['learning_rate']}, momentum {config['momentum']}, "
        f"gradient norm clipped at {config['clip_norm']}); "
        f"a run stops at the first round from {config['min_rounds']} on where the mean accuracy of the last "
        f"{config['final_window']} rounds is within {config['plateau_tolerance']} of the {config['final_window']} "
        f"before (at most {config['rounds']} rounds); "
        f"final accuracy = mean of the last {config['final_window']} rounds.",
        f"- Rounds run: median {np.median(rounds):.0f} (min {rounds.min()}, max {rounds.max()}); plateau reached in "
        f"{plateau} of {len(records)} runs; **{diverged} diverged**, {collapsed} collapsed "
        "(counted, never averaged in).",
        f"- Engine time per run (one torch thread, two runs at once on 2 cores): {times}; "
        f"{sum(sum(v) for v in wall.values()) / 3600:.2f} CPU hours in all.",
    ]


def _setting_tests(cells: Mapping[str, Mapping[int, Record]]) -> dict[str, tuple[float, float, int]]:
    """FLMarket minus each baseline over the setting's paired seeds: ``(mean diff, Holm p, pairs)``."""
    records = [r for runs in cells.values() for r in runs.values()]
    tests = stats.paired_tests(records, "flmarket")
    return {t.baseline: (t.mean_difference, t.p_holm, t.pairs) for t in tests}


def accuracy_lines(primary: Sequence[Record]) -> tuple[list[str], list[list[Any]]]:
    """Per cohort size: mean final accuracy per distribution and selector, and FLMarket's paired tests."""
    table = _by_setting(primary)
    lines: list[str] = []
    rows: list[list[Any]] = []
    for num_clients, num_selected in sorted({key[:2] for key in table}):
        keys = sorted(key for key in table if key[:2] == (num_clients, num_selected))
        header = " | ".join(LABELS[s] for s in SELECTORS)
        tests = " | ".join(f"vs {LABELS[s]}" for s in SELECTORS[1:])
        lines += [
            f"**{num_selected} of {num_clients} clients**: final accuracy %, mean ± std over seeds (best in bold); "
            "FLMarket minus each baseline over the paired seeds, points, with the Holm-adjusted Wilcoxon p.",
            "",
            f"| distribution | {header} | seeds | {tests} |",
            "|---" * (len(SELECTORS) * 2 + 1) + "|",
        ]
        for key in keys:
            cells = table[key]
            means = {s: _mean_std(cells.get(s, {})) for s in SELECTORS}
            best = max((m[0] for m in means.values() if not math.isnan(m[0])), default=math.nan)
            texts = []
            for selector in SELECTORS:
                mean, std, count = means[selector]
                text = "-" if count == 0 else f"{100 * mean:.1f} ± {100 * std:.1f}"
                texts.append(f"**{text}**" if count and mean == best else text)
            seeds = min(len(cells.get(s, {})) for s in SELECTORS)
            tested = _setting_tests(cells)
            diffs = []
            for selector in SELECTORS[1:]:
                diff, p_holm, pairs = tested.get(selector, (math.nan, math.nan, 0))
                diffs.append("-" if pairs == 0 else f"{100 * diff:+.1f} (p {p_holm:.2g})")
                rows.append([num_clients, num_selected, key[2], selector, *means[selector], diff, p_holm, pairs])
            rows.append([num_clients, num_selected, key[2], "flmarket", *means["flmarket"], "", "", ""])
            lines.append(f"| {key[2]} | " + " | ".join(texts) + f" | {seeds} | " + " | ".join(diffs) + " |")
        lines.append("")
    return lines, rows


def pooled_groups(primary: Sequence[Record]) -> dict[str, list[Record]]:
    """All settings, d1-d3 and d4-d6, per federation size (and over both sizes when there are several)."""
    sizes = sorted({int(r["num_clients"]) for r in primary})
    groups: dict[str, list[Record]] = {}
    for size in [*sizes, None] if len(sizes) > 1 else sizes:
        members = [r for r in primary if size is None or int(r["num_clients"]) == size]
        prefix = "both sizes" if size is None else f"{size} clients"
        groups[f"{prefix}, all settings"] = members
        groups[f"{prefix}, d1-d3"] = [r for r in members if r["distribution"] not in IMBALANCED]
        groups[f"{prefix}, d4-d6"] = [r for r in members if r["distribution"] in IMBALANCED]
    return groups


def pooled_lines(primary: Sequence[Record]) -> list[str]:
    """Pooled paired tests and win shares for all settings, d1-d3 and d4-d6 (:func:`pooled_groups`)."""
    groups = pooled_groups(primary)
    lines = [
        "| settings | baseline | pairs | mean diff | median diff | W/T/L | p | p (Holm) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    win_lines = []
    for name, records in groups.items():
        if not records:
            continue
        for test in stats.paired_tests(records, "flmarket"):
            lines.append(
                f"| {name} | {LABELS[test.baseline]} | {test.pairs} | {100 * test.mean_difference:+.2f} | "
                f"{100 * test.median_difference:+.2f} | {test.wins}/{test.ties}/{test.losses} | {test.p_value:.3g} | "
                f"{test.p_holm:.3g} |"
            )
        wins = stats.win_counts(records, "flmarket")
        win_lines.append(
            f"- {name}: FLMarket best in **{wins.wins} of {wins.settings}** settings, tied for best in {wins.ties}; "
            f"win share {wins.win_share:.2f} (95% bootstrap CI {wins.ci_low:.2f}-{wins.ci_high:.2f}; chance "
            f"{wins.chance:.2f} with {len(wins.selectors)} selectors)."
        )
    return lines + [""] + win_lines + [""]


def sensitivity_lines(primary: Sequence[Record], variants: Mapping[str, Sequence[Record]]) -> list[str]:
    """Each sensitivity variant against the primary run of its selector and against FLMarket, seed by seed."""
    if not variants:
        return []
    primary_table = _by_setting(primary)
    lines = [
        "| variant | settings | pairs | variant mean % | primary mean % | variant minus primary | "
        "FLMarket (volume bids) minus variant | p (Wilcoxon) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, records in sorted(variants.items()):
        selector = str(records[0]["selector"])
        mine, theirs, reference = [], [], []
        for record in records:
            key = (int(record["num_clients"]), int(record["num_selected"]), str(record["distribution"]))
            seed = int(record["seed"])
            base = primary_table.get(key, {}).get(selector, {}).get(seed)
            market = primary_table.get(key, {}).get("flmarket", {}).get(seed)
            if base is None or market is None or not all(_finite(r) for r in (record, base, market)):
                continue
            mine.append(float(record["final_accuracy"]))
            theirs.append(float(base["final_accuracy"]))
            reference.append(float(market["final_accuracy"]))
        if not mine:
            continue
        variant, base_values, market_values = np.array(mine), np.array(theirs), np.array(reference)
        p_value = stats.wilcoxon_p(market_values - variant)
        settings = len({(r["num_selected"], r["distribution"]) for r in records})
        lines.append(
            f"| {name} | {settings} | {variant.size} | {100 * variant.mean():.1f} | {100 * base_values.mean():.1f} | "
            f"{100 * (variant - base_values).mean():+.2f} | {100 * (market_values - variant).mean():+.2f} | "
            f"{p_value:.3g} |"
        )
    return lines + [""]


def _run_time(record: Record) -> float:
    """The whole ServerApp's time: selection (FLMarket's market phase) and training (S-FedAvg's valuation in it)."""
    return float(record["timings"]["server_app_s"])


def _clients_trained(record: Record) -> int:
    return len({e for clients in record["trained_partitions_per_round"].values() for e in clients})


def in_training_lines(records: Sequence[Record]) -> list[str]:
    """FLMarket (real market phase, then FedAvg on its winners) against S-FedAvg, setting by setting and pooled.

    Accuracy: mean ± std over seeds and the paired difference (S-FedAvg minus FLMarket) with its Wilcoxon p.
    Time: the ServerApp's whole time per run (:func:`_run_time`), its parts, the time per round, and the ratio
    S-FedAvg / FLMarket over the paired seeds.
    """
    runs = [r for r in records if _in_training_comparison(r) and r["selector"] in ("flmarket", "sfedavg")]
    table: dict[tuple[str, str, int, int, str], dict[str, dict[int, Record]]] = defaultdict(lambda: defaultdict(dict))
    for record in runs:
        key = (
            str(record["dataset"]),
            str(record["model"]),
            int(record["num_clients"]),
            int(record["num_selected"]),
            str(record["distribution"]),
        )
        table[key][str(record["selector"])][int(record["seed"])] = record
    lines = [
        "| data, model | setting | seeds | FLMarket % | S-FedAvg % | S-FedAvg minus FLMarket (p) | rounds F / S | "
        "FLMarket s (market + training) | S-FedAvg s (of it valuation) | time S / F | per round S / F | "
        "clients trained F / S |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    pooled: dict[str, list[tuple[Record, Record]]] = defaultdict(list)
    for key in sorted(table):
        cells = table[key]
        seeds = sorted(set(cells.get("flmarket", {})) & set(cells.get("sfedavg", {})))
        pairs = [(cells["flmarket"][s], cells["sfedavg"][s]) for s in seeds]
        pairs = [(f, g) for f, g in pairs if _finite(f) and _finite(g)]
        if not pairs:
            continue
        pooled[f"{key[0]}, {key[1]}"].extend(pairs)
        flm = np.array([float(f["final_accuracy"]) for f, _ in pairs])
        sfa = np.array([float(g["final_accuracy"]) for _, g in pairs])
        flm_time = np.array([_run_time(f) for f, _ in pairs])
        sfa_time = np.array([_run_time(g) for _, g in pairs])
        market = np.mean([float(f["timings"]["selection_s"]) for f, _ in pairs])
        valuation = np.mean([float(g["timings"].get("valuation_s", 0.0)) for _, g in pairs])
        rounds_f = np.mean([f["engine"]["rounds_run"] for f, _ in pairs])
        rounds_s = np.mean([g["engine"]["rounds_run"] for _, g in pairs])
        per_round = np.mean(
            [
                (float(g["timings"]["training_s"]) / g["engine"]["rounds_run"])
                / (float(f["timings"]["training_s"]) / f["engine"]["rounds_run"])
                for f, g in pairs
            ]
        )
        p_value = stats.wilcoxon_p(sfa - flm) if len(pairs) > 1 else math.nan
        lines.append(
            f"| {key[0]}, {key[1]} | {key[4]}, {key[3]} of {key[2]} | {len(pairs)} | "
            f"{100 * flm.mean():.1f} ± {100 * flm.std():.1f} | {100 * sfa.mean():.1f} ± {100 * sfa.std():.1f} | "
            f"{100 * (sfa - flm).mean():+.1f} (p {p_value:.2g}) | {rounds_f:.0f} / {rounds_s:.0f} | "
            f"{flm_time.mean():.1f} ({market:.2f} + {flm_time.mean() - market:.1f}) | "
            f"{sfa_time.mean():.1f} ({valuation:.1f}) | {np.mean(sfa_time / flm_time):.2f}x | {per_round:.2f}x | "
            f"{np.mean([_clients_trained(f) for f, _ in pairs]):.0f} / "
            f"{np.mean([_clients_trained(g) for _, g in pairs]):.0f} |"
        )
    lines.append("")
    for name, pairs in pooled.items():
        difference = np.array([float(g["final_accuracy"]) - float(f["final_accuracy"]) for f, g in pairs])
        ratio = np.array([_run_time(g) / _run_time(f) for f, g in pairs])
        p_text = f", Wilcoxon p {stats.wilcoxon_p(difference.tolist()):.2g}" if difference.size > 1 else ""
        lines.append(
            f"- {name}, {len(pairs)} pairs: S-FedAvg minus FLMarket {100 * difference.mean():+.2f} points "
            f"(S-FedAvg ahead in {int((difference > 0).sum())}, behind in {int((difference < 0).sum())}{p_text}); "
            f"S-FedAvg's run takes {ratio.mean():.2f}x FLMarket's (median {np.median(ratio):.2f}x)."
        )
    return lines + [""]


def budget_mode_cohorts(
    num_clients: int, distributions: Sequence[str], seeds: Sequence[int], **engine_options: Any
) -> list[tuple[str, float, float, int, int, float]]:
    """FLMarket's budget-driven auction on each setting: the cohort it buys at each budget fraction.

    Returns ``(distribution, fraction, mean cohort, min, max, mean paid share of the budget)`` rows.
    """
    from simulations.engine import EngineConfig, bids_for, load_federation, select  # pylint: disable=import-outside-toplevel

    rows = []
    for distribution in distributions:
        for fraction in BUDGET_FRACTIONS:
            sizes, paid = [], []
            for seed in seeds:
                cfg = EngineConfig(
                    num_clients=num_clients, distribution=distribution, seed=seed, num_selected=0, **engine_options
                )
                federation = load_federation(cfg)
                budget = fraction * float(bids_for(cfg, federation.label_counts).sum())
                winners, market = select(replace(cfg, budget=budget), federation)
                sizes.append(len(winners))
                paid.append(market["total_payment"] / budget)
            rows.append((distribution, fraction, float(np.mean(sizes)), min(sizes), max(sizes), float(np.mean(paid))))
    return rows


def table2_lines(primary: Sequence[Record], num_selected: int = 10, distribution: str = "d6") -> list[str]:
    """Per-class totals of the selected clients, mean over seeds (the paper's Table 2 in our regime)."""
    table = _by_setting(primary)
    key = next((k for k in sorted(table) if k[1] == num_selected and k[2] == distribution), None)
    if key is None:
        return []
    cells = table[key]
    pool = np.mean([r["pool_class_totals"] for runs in cells.values() for r in runs.values()], axis=0)
    classes = len(pool)
    lines = [
        f"{num_selected} of {key[0]} clients at {distribution}, mean over {len(cells['flmarket'])} seeds "
        "(the paper's Table 2 gives FLMarket's and DICE's column sums on CIFAR-10 at D6).",
        "",
        "| selector | " + " | ".join(str(c) for c in range(classes)) + " | total | smallest class share |",
        "|---" * (classes + 3) + "|",
        "| pool | " + " | ".join(f"{v:.0f}" for v in pool) + f" | {pool.sum():.0f} | {pool.min() / pool.max():.2f} |",
    ]
    for selector in SELECTORS:
        runs = cells.get(selector, {})
        if not runs:
            continue
        totals = np.mean([r["selected_class_totals"] for r in runs.values()], axis=0)
        lines.append(
            f"| {LABELS[selector]} | "
            + " | ".join(f"{v:.0f}" for v in totals)
            + f" | {totals.sum():.0f} | {totals.min() / max(totals.max(), 1):.2f} |"
        )
    return lines + [""]


def plot_curves(
    primary: Sequence[Record], out: Path, selectors: Sequence[str] = SELECTORS, prefix: str = "accuracy_vs_round"
) -> list[Path]:
    """Mean test accuracy per round and selector, one panel per distribution, one figure per cohort size."""
    import matplotlib  # pylint: disable=import-outside-toplevel

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    table = _by_setting(primary)
    paths = []
    for num_clients, num_selected in sorted({key[:2] for key in table}):
        keys = sorted(key for key in table if key[:2] == (num_clients, num_selected))
        figure, axes = plt.subplots(1, len(keys), figsize=(3.0 * len(keys), 3.0), squeeze=False, sharey=True)
        for axis, key in zip(axes[0], keys, strict=True):
            for selector in selectors:
                curves = [
                    [step["accuracy"] for step in r["rounds"][1:]]
                    for r in table[key].get(selector, {}).values()
                    if _finite(r)
                ]
                if not curves:
                    continue
                length = max(len(c) for c in curves)
                window = int(_config(primary[0])["final_window"])
                # A run that stopped at its plateau holds its final-window mean from then on.
                padded = np.array([c + [float(np.mean(c[-window:]))] * (length - len(c)) for c in curves])
                axis.plot(np.arange(1, length + 1), padded.mean(axis=0), label=LABELS[selector], linewidth=1)
            axis.set_title(f"{key[2]}", fontsize=9)
            axis.set_xlabel("round", fontsize=8)
            axis.set_ylim(0.5, 1.0)
        axes[0][0].set_ylabel("test accuracy", fontsize=8)
        axes[0][-1].legend(fontsize=7, loc="lower right")
        figure.suptitle(f"{num_selected} of {num_clients} clients: mean over seeds", fontsize=9)
        figure.tight_layout()
        path = out / f"{prefix}_c{num_clients}_k{num_selected}.png"
        figure.savefig(path, dpi=110)
        plt.close(figure)
        paths.append(path)
    return paths


def plot_wins(primary: Sequence[Record], out: Path) -> Path:
    """FLMarket's win share with its bootstrap interval per group of settings, against chance."""
    import matplotlib  # pylint: disable=import-outside-toplevel

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    groups = {"all": list(primary)}
    for k in sorted({int(r["num_selected"]) for r in primary}):
        groups[f"{k} selected"] = [r for r in primary if int(r["num_selected"]) == k]
    groups["d1-d3"] = [r for r in primary if r["distribution"] not in IMBALANCED]
    groups["d4-d6"] = [r for r in primary if r["distribution"] in IMBALANCED]
    names, shares, lows, highs, chance = [], [], [], [], 0.2
    for name, records in groups.items():
        if not records:
            continue
        wins = stats.win_counts(records, "flmarket")
        names.append(f"{name}\n({wins.settings})")
        shares.append(wins.win_share)
        lows.append(wins.win_share - wins.ci_low)
        highs.append(wins.ci_high - wins.win_share)
        chance = wins.chance
    figure, axis = plt.subplots(figsize=(6.5, 3.0))
    axis.bar(names, shares, yerr=[lows, highs], capsize=4, color="tab:blue", alpha=0.8)
    axis.axhline(chance, color="grey", linestyle="--", label=f"chance ({chance:.2f})")
    axis.axhline(0.77, color="tab:red", linestyle=":", label="paper (44 of 57)")
    axis.set_ylabel("FLMarket's win share", fontsize=8)
    axis.set_ylim(0, 1)
    axis.tick_params(labelsize=7)
    axis.legend(fontsize=7)
    figure.tight_layout()
    path = out / "win_share.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _protocol_summary(records: Sequence[Record]) -> list[str]:
    """One phrase per model: its local steps and how its runs ended."""
    phrases = []
    for model in sorted({str(r["model"]) for r in records}):
        runs = [r for r in records if str(r["model"]) == model]
        config = _config(runs[0])
        stop = (
            f"plateau stop from round {config['min_rounds']}, at most {config['rounds']}"
            if config["min_rounds"]
            else f"{config['rounds']} rounds"
        )
        phrases.append(
            f"{model}: {config['local_steps']} local steps per round, {stop}, final accuracy the mean of the last "
            f"{config['final_window']} rounds ({len(runs)} runs, "
            f"{sum(bool(r['engine']['diverged']) for r in runs)} diverged)"
        )
    return phrases


def _in_training_curves(records: Sequence[Record], out: Path) -> list[Path]:
    """Accuracy curves of FLMarket and S-FedAvg, one figure per (model, cohort size)."""
    paths = []
    for model in sorted({str(r["model"]) for r in records}):
        runs = [r for r in records if str(r["model"]) == model]
        paths += plot_curves(runs, out, selectors=("flmarket", "sfedavg"), prefix=f"sfedavg_{model}")
    return paths


def write_csv(rows: Sequence[Sequence[Any]], path: Path) -> None:
    """One row per (setting, selector): mean, std, seeds, FLMarket minus it, Holm p, pairs."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            [
                "num_clients",
                "num_selected",
                "distribution",
                "selector",
                "mean_accuracy",
                "std_accuracy",
                "seeds",
                "flmarket_minus",
                "p_holm",
                "pairs",
            ]
        )
        for row in rows:
            writer.writerow([f"{v:.4f}" if isinstance(v, float) and math.isfinite(v) else v for v in row])


def build_sweep_report(records: Sequence[Record], out: Path, command: str | None = None) -> Path:
    """Write ``REPORT.md``, ``comparison.csv`` and the plots of an engine sweep to ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    primary, variants = split_primary(records)
    in_training = [r for r in records if _in_training_comparison(r)]
    records = [r for r in records if not _in_training_comparison(r)]
    dataset = primary[0]["dataset"] if primary else records[0]["dataset"]
    lines = [f"# {dataset}: FLMarket against the pre-training selectors (in-process engine)", ""]
    if command:
        lines += ["Regenerate with:", "", "```bash", command, "```", ""]
    seeds = sorted({int(r["seed"]) for r in primary})
    lines += [
        f"{len(records)} runs ({len(primary)} primary, seeds {seeds[0]}-{seeds[-1]}); "
        f"{len(in_training)} more in the comparison with S-FedAvg.",
        "",
    ]
    lines += protocol_lines(records) + [""]
    lines += ["## Final accuracy by setting", ""]
    table, rows = accuracy_lines(primary)
    lines += table
    lines += [
        "With 5 paired seeds the smallest two-sided Wilcoxon p is 0.0625: no single 5-seed setting can reach 5%; "
        "the pooled tests below are where the power is.",
        "",
        "## Pooled over settings",
        "",
        "Paired Wilcoxon over every (setting, seed) pair, Holm-corrected over the four baselines within each group; "
        "win shares count the settings where FLMarket's seed mean is the highest (a k-way tie counts 1/k), with a "
        "bootstrap interval over seeds; the paper: best in 44 of 57 settings (77%), 22 of 27 on D4-D6 (81%).",
        "",
    ]
    lines += pooled_lines(primary)
    lines += [f"![win share]({plot_wins(primary, out).name})", ""]
    table2 = table2_lines(primary)
    if table2:
        lines += ["## Class distribution of the selected clients (Table 2 analogue)", ""] + table2
    sensitivity = sensitivity_lines(primary, variants)
    if sensitivity:
        lines += [
            "## Sensitivity: bid policy, DICE's weight, DDS's lambda",
            "",
            "Seed by seed against the primary runs of the same setting (FLMarket with volume bids, DICE weight "
            f"{DICE_VOLUME_WEIGHT}, DDS lambda {DDS_DIVERSITY_WEIGHT}).",
            "",
        ] + sensitivity
    num_clients = sorted({int(r["num_clients"]) for r in primary})
    distributions = sorted({str(r["distribution"]) for r in primary})
    lines += [
        "## Budget-mode auction: the cohort a budget buys",
        "",
        "FLMarket's auction without a fixed cohort size, volume bids, budget R a fraction of the sum of all bids; "
        f"mean (min-max) cohort over seeds {seeds[0]}-{seeds[-1]}, and the share of R paid.",
        "",
        "| clients | distribution | R / sum of bids | cohort | paid / R |",
        "|---|---|---|---|---|",
    ]
    for clients in num_clients:
        for distribution, fraction, mean, low, high, paid in budget_mode_cohorts(clients, distributions, seeds):
            lines.append(f"| {clients} | {distribution} | {fraction:.2f} | {mean:.1f} ({low}-{high}) | {paid:.2f} |")
    if in_training:
        lines += [
            "",
            "## FLMarket against S-FedAvg (in-training selection)",
            "",
            "Both sides take the same validation split (10 per class) out of the training pool, so both train on the "
            "same client data. FLMarket runs its real market phase (PASS, the clients' scores and bids, the auction, "
            "over an in-process Grid: no network latency), then FedAvg on its winners; S-FedAvg samples its clients "
            "every round and values their updates on the validation split (10 Monte-Carlo permutations). Time is the "
            "ServerApp's whole time per run, measured in the engine (no Flower message layer on either side); "
            "protocol: " + "; ".join(_protocol_summary(in_training)) + ".",
            "",
        ] + in_training_lines(in_training)
        lines += [f"![{p.stem}]({p.name})" for p in _in_training_curves(in_training, out)]
    lines += ["", "## Premise: the learning curve flattens at a few hundred per class", ""]
    lines += ["![premise](premise.png)", "", "## Accuracy curves", ""]
    lines += [f"![{path.stem}]({path.name})" for path in plot_curves(primary, out)]
    write_csv(rows, out / "comparison.csv")
    report = out / "REPORT.md"
    report.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return report
