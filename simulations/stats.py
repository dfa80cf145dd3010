"""Significance of FLMarket's comparison with the baselines, over paired seeds.

A *setting* is everything but the selector and the seed (data set, distribution, clients, cohort size,
schedule, bid policy); a *pair* is one setting and one seed, run with FLMarket and with a baseline on
the same partition and initial model. From ``result.json`` records (:func:`records_from_dirs`):

* :func:`paired_tests` -- for each baseline, the paired Wilcoxon signed-rank test (scipy) of FLMarket's
  final accuracy against the baseline's over all complete pairs, with Holm's correction over the
  baselines; diverged runs are left out of the pairs and counted (``excluded_diverged``);
* :func:`win_counts` -- in how many settings FLMarket has the highest seed-mean accuracy, ties shared
  (a tie among ``k`` best counts ``1/k``), with a bootstrap CI that resamples seeds within each setting,
  against the chance level ``1 / (number of selectors)``.

``python -m simulations.stats <result dirs...>`` prints both as Markdown.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats as scipy_stats

__all__ = [
    "PairedTest",
    "WinCounts",
    "holm",
    "means_table",
    "paired_tests",
    "records_from_dirs",
    "setting_of",
    "wilcoxon_p",
    "win_counts",
]

SETTING_KEYS = ("dataset", "distribution", "num_clients", "num_selected", "schedule", "bid_policy")
"""Fields of a record that, with the seed, identify a pair."""


@dataclass(frozen=True)
class PairedTest:
    """FLMarket against one baseline over the complete pairs.

    Attributes
    ----------
    baseline : str
        The baseline's name.
    pairs : int
        Complete pairs (both runs finished with a finite final accuracy).
    excluded_diverged : int
        Pairs left out because one of the two runs diverged.
    mean_difference, median_difference : float
        FLMarket minus baseline, accuracy points as fractions.
    wins, ties, losses : int
        Pairs where FLMarket is higher, equal (within ``tie_tolerance``), lower.
    statistic, p_value, p_holm : float
        Wilcoxon statistic, its two-sided p-value, and the Holm-adjusted p-value.
    """

    baseline: str
    pairs: int
    excluded_diverged: int
    mean_difference: float
    median_difference: float
    wins: int
    ties: int
    losses: int
    statistic: float
    p_value: float
    p_holm: float


@dataclass(frozen=True)
class WinCounts:
    """Settings where FLMarket is best.

    Attributes
    ----------
    settings : int
        Settings with at least one seed complete for every selector.
    wins, ties, losses : int
        Settings where FLMarket is alone on top, shares the top, is not on top.
    win_share : float
        ``(wins + sum over ties of 1/k) / settings``.
    ci_low, ci_high : float
        Bootstrap percentile interval of ``win_share`` (seeds resampled within each setting).
    chance : float
        ``1 / number of selectors``: the share expected if all selectors were exchangeable.
    selectors : tuple of str
        The selectors compared.
    """

    settings: int
    wins: int
    ties: int
    losses: int
    win_share: float
    ci_low: float
    ci_high: float
    chance: float
    selectors: tuple[str, ...]


def setting_of(record: Mapping[str, Any]) -> tuple[Any, ...]:
    """The setting of a ``result.json`` record (engine fields read from ``engine.config`` when present)."""
    engine = (record.get("engine") or {}).get("config", {})
    return tuple(record.get(key, engine.get(key)) for key in SETTING_KEYS)


def _accuracy(record: Mapping[str, Any]) -> float:
    """Final accuracy, NaN for a diverged run."""
    if (record.get("engine") or {}).get("diverged"):
        return math.nan
    value = record.get("final_accuracy")
    return math.nan if value is None else float(value)


def records_from_dirs(folders: Iterable[str | Path]) -> list[dict[str, Any]]:
    """Every ``result.json`` under the given folders."""
    return [
        json.loads(path.read_text(encoding="utf-8"))
        for folder in folders
        for path in sorted(Path(folder).rglob("result.json"))
    ]


def _table(records: Iterable[Mapping[str, Any]]) -> dict[tuple[Any, ...], dict[int, dict[str, float]]]:
    """``setting -> seed -> selector -> final accuracy`` (NaN: diverged)."""
    table: dict[tuple[Any, ...], dict[int, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for record in records:
        table[setting_of(record)][int(record["seed"])][str(record["selector"])] = _accuracy(record)
    return table


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values (same order as given)."""
    p = np.asarray(p_values, dtype=np.float64)
    order = np.argsort(p, kind="stable")
    scaled = (p.size - np.arange(p.size)) * p[order]
    adjusted = np.minimum(np.maximum.accumulate(scaled), 1.0)
    result = np.empty_like(p)
    result[order] = adjusted
    return result


def _wilcoxon(differences: np.ndarray) -> tuple[float, float]:
    """Two-sided Wilcoxon signed-rank test; ``(nan, 1.0)`` when every difference is zero or none exist."""
    if differences.size == 0 or np.all(differences == 0):
        return math.nan, 1.0
    outcome = scipy_stats.wilcoxon(differences, zero_method="wilcox", alternative="two-sided")
    return float(outcome.statistic), float(outcome.pvalue)


def wilcoxon_p(differences: Sequence[float]) -> float:
    """Two-sided Wilcoxon signed-rank p-value of paired differences (1.0 when all are zero or none exist)."""
    return _wilcoxon(np.asarray(differences, dtype=np.float64))[1]


def paired_tests(
    records: Iterable[Mapping[str, Any]], reference: str = "flmarket", tie_tolerance: float = 1e-9
) -> list[PairedTest]:
    """Paired Wilcoxon tests of ``reference`` against every other selector, Holm-corrected.

    Parameters
    ----------
    records : iterable of mapping
        ``result.json`` records.
    reference : str, default "flmarket"
        The selector compared with all others.
    tie_tolerance : float, default 1e-9
        Differences this small count as ties in the win/tie/loss counts (the test drops zeros).

    Returns
    -------
    list of PairedTest
        One per baseline, sorted by name.
    """
    table = _table(records)
    baselines = sorted({s for seeds in table.values() for runs in seeds.values() for s in runs} - {reference})
    partial = []
    for baseline in baselines:
        differences, excluded = [], 0
        for seeds in table.values():
            for runs in seeds.values():
                if reference not in runs or baseline not in runs:
                    continue
                mine, theirs = runs[reference], runs[baseline]
                if math.isnan(mine) or math.isnan(theirs):
                    excluded += 1
                    continue
                differences.append(mine - theirs)
        array = np.asarray(differences, dtype=np.float64)
        statistic, p_value = _wilcoxon(array)
        partial.append((baseline, array, excluded, statistic, p_value))
    adjusted = holm([item[4] for item in partial]) if partial else np.empty(0)
    return [
        PairedTest(
            baseline=baseline,
            pairs=int(array.size),
            excluded_diverged=excluded,
            mean_difference=float(array.mean()) if array.size else math.nan,
            median_difference=float(np.median(array)) if array.size else math.nan,
            wins=int((array > tie_tolerance).sum()),
            ties=int((np.abs(array) <= tie_tolerance).sum()),
            losses=int((array < -tie_tolerance).sum()),
            statistic=statistic,
            p_value=p_value,
            p_holm=float(p_holm),
        )
        for (baseline, array, excluded, statistic, p_value), p_holm in zip(partial, adjusted, strict=True)
    ]


def _setting_matrices(records: Iterable[Mapping[str, Any]], selectors: Sequence[str]) -> list[np.ndarray]:
    """Per setting, the ``(seeds, selectors)`` accuracies of the seeds complete for every selector."""
    matrices = []
    for seeds in _table(records).values():
        rows = [
            [runs[s] for s in selectors]
            for runs in seeds.values()
            if all(s in runs and not math.isnan(runs[s]) for s in selectors)
        ]
        if rows:
            matrices.append(np.asarray(rows, dtype=np.float64))
    return matrices


def _shares(means: np.ndarray, reference_column: int, tolerance: float) -> np.ndarray:
    """Per setting (rows of ``means``), the reference's share of the top: 1, 1/k on a k-way tie, or 0."""
    best = means.max(axis=1, keepdims=True)
    on_top = means >= best - tolerance
    return np.where(on_top[:, reference_column], 1.0 / on_top.sum(axis=1), 0.0)


def win_counts(
    records: Iterable[Mapping[str, Any]],
    reference: str = "flmarket",
    *,
    tie_tolerance: float = 1e-9,
    resamples: int = 2_000,
    confidence: float = 0.95,
    seed: int = 0,
) -> WinCounts:
    """Settings in which ``reference`` has the highest seed-mean final accuracy, with a bootstrap CI.

    Parameters
    ----------
    records : iterable of mapping
        ``result.json`` records.
    reference : str, default "flmarket"
        The selector whose wins are counted.
    tie_tolerance : float, default 1e-9
        Seed means within this of the best share the top.
    resamples : int, default 2000
        Bootstrap resamples (seeds drawn with replacement within each setting, the same rows for every
        selector, so the pairing is kept).
    confidence : float, default 0.95
        Level of the percentile interval.
    seed : int, default 0
        Seed of the bootstrap.
    """
    records = list(records)
    selectors = tuple(sorted({str(r["selector"]) for r in records}))
    if reference not in selectors:
        raise ValueError(f"no {reference!r} runs among the records")
    column = selectors.index(reference)
    matrices = _setting_matrices(records, selectors)
    if not matrices:
        raise ValueError("no setting has a seed complete for every selector")
    means = np.stack([m.mean(axis=0) for m in matrices])
    shares = _shares(means, column, tie_tolerance)
    rng = np.random.default_rng(seed)
    boot = np.empty(resamples)
    for index in range(resamples):
        resampled = np.stack([m[rng.integers(0, len(m), len(m))].mean(axis=0) for m in matrices])
        boot[index] = _shares(resampled, column, tie_tolerance).mean()
    tail = (1.0 - confidence) / 2.0
    return WinCounts(
        settings=len(matrices),
        wins=int((shares == 1.0).sum()),
        ties=int(((shares > 0) & (shares < 1.0)).sum()),
        losses=int((shares == 0).sum()),
        win_share=float(shares.mean()),
        ci_low=float(np.quantile(boot, tail)),
        ci_high=float(np.quantile(boot, 1.0 - tail)),
        chance=1.0 / len(selectors),
        selectors=selectors,
    )


def means_table(records: Sequence[Mapping[str, Any]]) -> str:
    """Markdown: per setting, each selector's mean final accuracy (std, finished seeds, diverged seeds)."""
    table = _table(records)
    selectors = sorted({str(r["selector"]) for r in records})
    lines = ["| setting | " + " | ".join(selectors) + " |", "|---" * (len(selectors) + 1) + "|"]
    for setting in sorted(table, key=str):
        cells = []
        for selector in selectors:
            values = np.array([runs[selector] for runs in table[setting].values() if selector in runs])
            finite = values[~np.isnan(values)]
            diverged = int(np.isnan(values).sum())
            text = f"{100 * finite.mean():.1f} ± {100 * finite.std():.1f} (n={finite.size})" if finite.size else "-"
            cells.append(text + (f", {diverged} diverged" if diverged else ""))
        name = " ".join(str(value) for value in setting if value is not None)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(records: Sequence[Mapping[str, Any]], reference: str = "flmarket") -> str:
    """Markdown: mean accuracies per setting, the paired tests and the win counts."""
    lines = [
        means_table(records),
        "",
        f"| {reference} vs | pairs | diverged (excluded) | mean diff | median diff | W/T/L | p | p (Holm) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for test in paired_tests(records, reference):
        lines.append(
            f"| {test.baseline} | {test.pairs} | {test.excluded_diverged} | {100 * test.mean_difference:+.2f} | "
            f"{100 * test.median_difference:+.2f} | {test.wins}/{test.ties}/{test.losses} | {test.p_value:.3g} | "
            f"{test.p_holm:.3g} |"
        )
    wins = win_counts(records, reference)
    summary = (
        f"{reference} best in {wins.wins} of {wins.settings} settings, tied for best in {wins.ties}: win share "
        f"{wins.win_share:.2f} (95% bootstrap CI {wins.ci_low:.2f}-{wins.ci_high:.2f}; chance {wins.chance:.2f}, "
        f"{len(wins.selectors)} selectors)."
    )
    lines += ["", summary]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Print the report for the ``result.json`` files under the given folders."""
    parser = argparse.ArgumentParser(description="Paired significance of FLMarket vs the baselines.")
    parser.add_argument("folders", nargs="+")
    parser.add_argument("--reference", default="flmarket")
    args = parser.parse_args(argv)
    print(report(records_from_dirs(args.folders), args.reference))


if __name__ == "__main__":
    main()
