"""Significance of FLMarket's comparison with the baselines, with the partition as the unit of pairing.

A *setting* is everything but the selector, the bid policy and the seed (data set, distribution, clients,
cohort size, schedule). A *pair* is one setting and one seed run by two arms (FLMarket under one bid policy and
a baseline, say) on the same partition and initial model. A *unit* is what fixes the partition: data set,
clients, distribution, schedule, alpha, validation split and seed. The cohort sizes of one unit share its
partition, so their pairs are not independent: every comparison here averages the paired differences within
each unit first and tests the unit means.

* :func:`paired_comparison` -- the mean paired difference over units with its Student-t interval, and the
  two-sided Wilcoxon signed-rank test of the unit means (scipy); diverged runs are left out and counted;
* :func:`holm_family` -- Holm's correction over every comparison of a report together;
* :func:`win_share` -- in how many settings an arm has the highest mean, ties shared, with the Wilson score
  interval over the settings, against the chance level ``1 / arms``.

``python -m simulations.stats <result dirs...>`` prints them as Markdown.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats as scipy_stats

__all__ = [
    "PairedComparison",
    "WinShare",
    "accuracy",
    "arms_by_policy",
    "bid_policy_of",
    "holm",
    "holm_family",
    "paired_comparison",
    "records_from_dirs",
    "report",
    "setting_matrices",
    "setting_of",
    "t_interval",
    "top_shares",
    "unit_comparison",
    "unit_of",
    "unit_means",
    "wilcoxon_p",
    "wilson_interval",
    "win_share",
]

SETTING_KEYS = ("dataset", "distribution", "num_clients", "num_selected", "schedule")
"""Fields of a record that, with the seed, identify a pair."""

PARTITION_KEYS = ("dataset", "num_clients", "distribution", "schedule", "alpha", "val_per_class")
"""Fields of a record that, with the seed, fix the partition: the unit of pairing."""

Record = Mapping[str, Any]


@dataclass(frozen=True)
class PairedComparison:
    """``reference`` minus ``baseline`` over the units of a group of settings.

    Attributes
    ----------
    reference, baseline : str
        The two arms compared (reference minus baseline).
    group : str
        The settings the comparison pools (a label for reports).
    units : int
        Partitions (unit of pairing) with at least one complete pair.
    pairs : int
        Complete (setting, seed) pairs behind them: both runs finished with a finite final accuracy.
    excluded_diverged : int
        Pairs left out because one of the two runs has no finite final accuracy (it diverged, or its market
        bought nobody).
    mean_difference, ci_low, ci_high : float
        Mean over units of the per-unit mean difference, as fractions, and its Student-t interval
        (unadjusted; NaN with fewer than two units).
    median_difference : float
        Median of the per-unit mean differences.
    wins, ties, losses : int
        Units where the reference is higher, equal (within the tolerance), lower.
    statistic, p_value : float
        Two-sided Wilcoxon signed-rank test of the unit means (NaN with fewer than two units: no test).
    p_holm : float
        Holm-adjusted p-value within the family it was adjusted in (:func:`holm_family`); NaN until then.
    """

    reference: str
    baseline: str
    group: str
    units: int
    pairs: int
    excluded_diverged: int
    mean_difference: float
    ci_low: float
    ci_high: float
    median_difference: float
    wins: int
    ties: int
    losses: int
    statistic: float
    p_value: float
    p_holm: float = math.nan


@dataclass(frozen=True)
class WinShare:
    """Settings where one arm has the highest mean.

    Attributes
    ----------
    settings : int
        Settings with at least one seed complete for every arm.
    wins, ties, losses : int
        Settings where the reference is alone on top, shares the top, is not on top.
    win_share : float
        ``(wins + sum over ties of 1/k) / settings``.
    ci_low, ci_high : float
        Wilson score interval of ``win_share`` over the settings, treated as independent trials.
    chance : float
        ``1 / number of arms``: the share expected if the arms were exchangeable.
    arms : tuple of str
        The arms compared.
    """

    settings: int
    wins: int
    ties: int
    losses: int
    win_share: float
    ci_low: float
    ci_high: float
    chance: float
    arms: tuple[str, ...]


def _field(record: Record, key: str) -> Any:
    """A top-level field of a record, else the engine's config field of that name."""
    value = record.get(key)
    return value if value is not None else (record.get("engine") or {}).get("config", {}).get(key)


def setting_of(record: Record) -> tuple[Any, ...]:
    """The setting of a ``result.json`` record (:data:`SETTING_KEYS`)."""
    return tuple(_field(record, key) for key in SETTING_KEYS)


def unit_of(record: Record) -> tuple[Any, ...]:
    """The unit of pairing of a record: its partition (:data:`PARTITION_KEYS`) and seed."""
    return (*(_field(record, key) for key in PARTITION_KEYS), int(record["seed"]))


def bid_policy_of(record: Record) -> str:
    """The bid policy a run was configured with (``volume`` when the record does not say)."""
    return str(_field(record, "bid_policy") or "volume")


def accuracy(record: Record) -> float:
    """Final accuracy, NaN for a diverged run (or one without a final accuracy: a market that bought nobody)."""
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


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values (same order as given); NaN entries are no test and stay NaN."""
    p = np.asarray(p_values, dtype=np.float64)
    result = np.full_like(p, math.nan)
    tested = np.flatnonzero(~np.isnan(p))
    order = tested[np.argsort(p[tested], kind="stable")]
    scaled = (order.size - np.arange(order.size)) * p[order]
    result[order] = np.minimum(np.maximum.accumulate(scaled), 1.0) if order.size else scaled
    return result


def holm_family(comparisons: Sequence[PairedComparison]) -> list[PairedComparison]:
    """The comparisons with ``p_holm`` set by Holm's correction over all of them together (one family)."""
    adjusted = holm([c.p_value for c in comparisons])
    return [replace(c, p_holm=float(p)) for c, p in zip(comparisons, adjusted, strict=True)]


def _wilcoxon(differences: np.ndarray) -> tuple[float, float]:
    """Two-sided Wilcoxon signed-rank test; ``(nan, 1.0)`` when every difference is zero or none exist."""
    if differences.size == 0 or np.all(differences == 0):
        return math.nan, 1.0
    outcome = scipy_stats.wilcoxon(differences, zero_method="wilcox", alternative="two-sided")
    return float(outcome.statistic), float(outcome.pvalue)


def wilcoxon_p(differences: Sequence[float]) -> float:
    """Two-sided Wilcoxon signed-rank p-value of paired differences (1.0 when all are zero or none exist)."""
    return _wilcoxon(np.asarray(differences, dtype=np.float64))[1]


def t_interval(values: Sequence[float] | np.ndarray, confidence: float = 0.95) -> tuple[float, float]:
    """Student-t interval of the mean of ``values`` (NaN with fewer than two values)."""
    array = np.asarray(values, dtype=np.float64)
    if array.size < 2:
        return math.nan, math.nan
    half = scipy_stats.t.ppf(0.5 + confidence / 2.0, array.size - 1) * array.std(ddof=1) / math.sqrt(array.size)
    return float(array.mean() - half), float(array.mean() + half)


def wilson_interval(successes: float, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a proportion ``successes / trials`` (fractional successes allowed: shared ties).

    Unlike a percentile bootstrap of a share of argmaxes, it contains the estimate strictly inside whenever
    ``0 < successes < trials``, and it has positive width for every ``trials >= 1``.
    """
    if trials < 1:
        return math.nan, math.nan
    if not 0.0 <= successes <= trials:
        raise ValueError(f"successes must lie in [0, {trials}], got {successes}")
    z = float(scipy_stats.norm.ppf(0.5 + confidence / 2.0))
    share, z2 = successes / trials, z * z / trials
    centre = (share + z2 / 2.0) / (1.0 + z2)
    half = z * math.sqrt(share * (1.0 - share) / trials + z2 / (4.0 * trials)) / (1.0 + z2)
    # Exactly 0 and 1 at the extremes, and the share inside: true of the formula, kept so against rounding.
    low = 0.0 if successes == 0 else min(share, max(0.0, centre - half))
    high = 1.0 if successes == trials else max(share, min(1.0, centre + half))
    return low, high


def unit_means(units: Sequence[Hashable], values: Sequence[float]) -> dict[Hashable, float]:
    """The mean of ``values`` within each unit, in order of first appearance."""
    if len(units) != len(values):
        raise ValueError(f"{len(units)} units for {len(values)} values")
    members: dict[Hashable, list[float]] = defaultdict(list)
    for unit, value in zip(units, values, strict=True):
        members[unit].append(float(value))
    return {unit: float(np.mean(items)) for unit, items in members.items()}


def unit_comparison(
    units: Sequence[Hashable],
    differences: Sequence[float],
    *,
    reference: str = "reference",
    baseline: str = "baseline",
    group: str = "",
    excluded_diverged: int = 0,
    tie_tolerance: float = 1e-9,
    confidence: float = 0.95,
) -> PairedComparison:
    """Average the paired differences within each unit, then test and summarise the unit means.

    Parameters
    ----------
    units : sequence of hashable
        The unit of each pair (:func:`unit_of`).
    differences : sequence of float
        Reference minus baseline for each pair.
    reference, baseline, group : str
        Labels carried into the result.
    excluded_diverged : int, default 0
        Pairs already left out for divergence (reported, not used).
    tie_tolerance : float, default 1e-9
        Unit means this close to zero count as ties.
    confidence : float, default 0.95
        Level of the t-interval of the mean.
    """
    means = np.array(list(unit_means(units, differences).values()), dtype=np.float64)
    statistic, p_value = _wilcoxon(means) if means.size >= 2 else (math.nan, math.nan)
    low, high = t_interval(means, confidence)
    return PairedComparison(
        reference=reference,
        baseline=baseline,
        group=group,
        units=int(means.size),
        pairs=len(differences),
        excluded_diverged=excluded_diverged,
        mean_difference=float(means.mean()) if means.size else math.nan,
        ci_low=low,
        ci_high=high,
        median_difference=float(np.median(means)) if means.size else math.nan,
        wins=int((means > tie_tolerance).sum()),
        ties=int((np.abs(means) <= tie_tolerance).sum()),
        losses=int((means < -tie_tolerance).sum()),
        statistic=statistic,
        p_value=p_value,
    )


def paired_comparison(
    reference_runs: Iterable[Record],
    baseline_runs: Iterable[Record],
    *,
    reference: str = "flmarket",
    baseline: str = "baseline",
    group: str = "",
    tie_tolerance: float = 1e-9,
    confidence: float = 0.95,
) -> PairedComparison:
    """One arm against another over the pairs they share, the unit of pairing being the partition.

    A pair is a run of each arm at the same setting and seed (:func:`setting_of`, :func:`unit_of`); its
    difference is reference minus baseline. The differences are averaged within each unit
    (:func:`unit_comparison`), so the cohort sizes that share a partition count once.
    """
    theirs = {(setting_of(r), unit_of(r)): accuracy(r) for r in baseline_runs}
    units, differences, excluded = [], [], 0
    for record in reference_runs:
        key = (setting_of(record), unit_of(record))
        if key not in theirs:
            continue
        mine, other = accuracy(record), theirs[key]
        if math.isnan(mine) or math.isnan(other):
            excluded += 1
            continue
        units.append(key[1])
        differences.append(mine - other)
    return unit_comparison(
        units,
        differences,
        reference=reference,
        baseline=baseline,
        group=group,
        excluded_diverged=excluded,
        tie_tolerance=tie_tolerance,
        confidence=confidence,
    )


def setting_matrices(arms: Mapping[str, Iterable[Record]]) -> dict[tuple[Any, ...], np.ndarray]:
    """Per setting, the ``(seeds, arms)`` final accuracies of the seeds that every arm finished."""
    table: dict[tuple[Any, ...], dict[int, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for name, runs in arms.items():
        for record in runs:
            table[setting_of(record)][int(record["seed"])][name] = accuracy(record)
    matrices = {}
    for setting, seeds in table.items():
        rows = [
            [runs[name] for name in arms]
            for _, runs in sorted(seeds.items())
            if all(name in runs and not math.isnan(runs[name]) for name in arms)
        ]
        if rows:
            matrices[setting] = np.asarray(rows, dtype=np.float64)
    return matrices


def top_shares(means: np.ndarray, column: int, tolerance: float = 1e-9) -> np.ndarray:
    """Per row of ``means`` (settings x arms), the share of the top held by ``column``: 1, 1/k on a k-way tie, 0."""
    best = means.max(axis=1, keepdims=True)
    on_top = means >= best - tolerance
    return np.where(on_top[:, column], 1.0 / on_top.sum(axis=1), 0.0)


def win_share(
    arms: Mapping[str, Iterable[Record]],
    reference: str = "flmarket",
    *,
    tie_tolerance: float = 1e-9,
    confidence: float = 0.95,
) -> WinShare:
    """Settings in which ``reference`` has the highest seed-mean final accuracy, with a Wilson interval.

    Parameters
    ----------
    arms : mapping of str to records
        The runs of each arm; a setting counts when at least one seed is finished by every arm, and the
        means are over those seeds.
    reference : str, default "flmarket"
        The arm whose wins are counted.
    tie_tolerance : float, default 1e-9
        Seed means within this of the best share the top.
    confidence : float, default 0.95
        Level of the Wilson score interval.
    """
    names = tuple(arms)
    if reference not in names:
        raise ValueError(f"no {reference!r} among the arms {names}")
    matrices = setting_matrices(arms)
    if not matrices:
        raise ValueError("no setting has a seed finished by every arm")
    means = np.stack([m.mean(axis=0) for m in matrices.values()])
    shares = top_shares(means, names.index(reference), tie_tolerance)
    low, high = wilson_interval(float(shares.sum()), len(shares), confidence)
    return WinShare(
        settings=len(shares),
        wins=int((shares == 1.0).sum()),
        ties=int(((shares > 0) & (shares < 1.0)).sum()),
        losses=int((shares == 0).sum()),
        win_share=float(shares.mean()),
        ci_low=low,
        ci_high=high,
        chance=1.0 / len(names),
        arms=names,
    )


def arms_by_policy(records: Iterable[Record], reference: str = "flmarket") -> dict[str, dict[str, list[Record]]]:
    """Per bid policy of the reference's runs: the reference's runs under it and every baseline's runs."""
    records = list(records)
    baselines: dict[str, list[Record]] = defaultdict(list)
    policies: dict[str, list[Record]] = defaultdict(list)
    for record in records:
        if record["selector"] == reference:
            policies[bid_policy_of(record)].append(record)
        else:
            baselines[str(record["selector"])].append(record)
    return {
        policy: {reference: runs, **{name: baselines[name] for name in sorted(baselines)}}
        for policy, runs in sorted(policies.items())
    }


def report(records: Sequence[Record], reference: str = "flmarket") -> str:
    """Markdown: per bid policy, the paired comparisons (Holm over all together) and the win share."""
    by_policy = arms_by_policy(records, reference)
    comparisons = holm_family(
        [
            paired_comparison(arms[reference], runs, reference=f"{reference} ({policy} bids)", baseline=name)
            for policy, arms in by_policy.items()
            for name, runs in arms.items()
            if name != reference
        ]
    )
    tested = sum(1 for c in comparisons if not math.isnan(c.p_value))
    lines = [
        "Unit of pairing: the partition (data set, clients, distribution, schedule, seed); the paired differences "
        "of the cohort sizes that share it are averaged first. Test: two-sided Wilcoxon signed-rank of the unit "
        f"means; mean difference with its 95% t-interval; Holm over all {tested} "
        "tests together.",
        "",
        "| arm | vs | units | pairs | diverged (excluded) | mean diff [95% CI] | median diff | W/T/L | p | p (Holm) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in comparisons:
        lines.append(
            f"| {c.reference} | {c.baseline} | {c.units} | {c.pairs} | {c.excluded_diverged} | "
            f"{100 * c.mean_difference:+.2f} [{100 * c.ci_low:+.2f}, {100 * c.ci_high:+.2f}] | "
            f"{100 * c.median_difference:+.2f} | {c.wins}/{c.ties}/{c.losses} | {c.p_value:.3g} | {c.p_holm:.3g} |"
        )
    lines.append("")
    for policy, arms in by_policy.items():
        wins = win_share(arms, reference)
        lines.append(
            f"- {reference} ({policy} bids) best in {wins.wins} of {wins.settings} settings, tied for best in "
            f"{wins.ties}: win share {wins.win_share:.2f} (95% Wilson interval {wins.ci_low:.2f}-{wins.ci_high:.2f}; "
            f"chance {wins.chance:.2f}, {len(wins.arms)} arms)."
        )
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
