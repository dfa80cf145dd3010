"""The main grid's pre-registered analysis (simulations/PILOT.md section 6), as Markdown.

Primary: ``auc`` (mean test accuracy over rounds 1-30, in points), FLMarket minus RS and minus DICE under the
volume and the equal (constant) bid policies, paired by partition (distribution, seed), pooled over d4-d6: the
mean difference with its 95% t-interval, the two-sided paired t-test, Holm over the four; Wilcoxon beside it.
Secondary and descriptive: QBS and DDS, the ``final`` endpoint, each distribution alone, the headroom (all 20
clients minus each arm), paid / R and the winners' share of the pool.

``python -m simulations.main_grid results/fashion_mnist_main/raw --out results/fashion_mnist_main``
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import stats as scipy_stats

from simulations.pilot import endpoint
from simulations.stats import Record, holm, records_from_dirs, t_interval, wilcoxon_p

PRIMARY_BASELINES = ("rs", "dice")
SECONDARY_BASELINES = ("qbs", "dds")
POLICIES = {"volume": "volume", "equal": "constant"}
"""The grid's folders under ``raw/`` and the bid policy each was run with."""
PARTITIONS_REGISTERED = 54


@dataclass(frozen=True)
class Contrast:  # pylint: disable=too-many-instance-attributes
    """FLMarket minus one arm over the partitions both finished, in points."""

    policy: str
    baseline: str
    endpoint: str
    partitions: int
    mean: float
    ci_low: float
    ci_high: float
    sd: float
    p_t: float
    p_wilcoxon: float
    wins: int


def unit(record: Record) -> tuple[str, int]:
    """The partition of a run: (distribution, seed)."""
    return str(record["distribution"]), int(record["seed"])


def arm_values(records: Sequence[Record], selector: str, name: str) -> dict[tuple[str, int], float]:
    """``{partition: endpoint}`` for one selector's runs (diverged runs left out)."""
    values = {unit(r): endpoint(r, name) for r in records if r["selector"] == selector}
    return {key: value for key, value in values.items() if not math.isnan(value)}


def contrast(
    mine: Mapping[tuple[str, int], float],
    theirs: Mapping[tuple[str, int], float],
    policy: str,
    baseline: str,
    name: str,
) -> Contrast:
    """The paired contrast over the partitions in both: mean, t-interval, paired t-test, Wilcoxon."""
    shared = sorted(set(mine) & set(theirs))
    differences = np.array([mine[key] - theirs[key] for key in shared], dtype=np.float64)
    enough = differences.size >= 2 and float(differences.std(ddof=1)) > 1e-9  # else no t-test: no variance
    low, high = t_interval(differences) if differences.size >= 2 else (math.nan, math.nan)
    return Contrast(
        policy=policy,
        baseline=baseline,
        endpoint=name,
        partitions=int(differences.size),
        mean=float(differences.mean()) if differences.size else math.nan,
        ci_low=low,
        ci_high=high,
        sd=float(differences.std(ddof=1)) if differences.size >= 2 else math.nan,
        p_t=float(scipy_stats.ttest_1samp(differences, 0.0).pvalue) if enough else math.nan,
        p_wilcoxon=wilcoxon_p(differences.tolist()) if differences.size >= 2 else math.nan,
        wins=int((differences > 0).sum()),
    )


def runs_by_policy(raw: Path) -> dict[str, Sequence[Record]]:
    """Every finished run of the grid, by bid policy folder (``volume``, ``equal``) and ``all``."""
    return {name: records_from_dirs([raw / name]) for name in (*POLICIES, "all") if (raw / name).is_dir()}


def contrasts(runs: Mapping[str, Sequence[Record]], name: str, baselines: Sequence[str]) -> list[Contrast]:
    """FLMarket against each baseline under each policy, pooled over the distributions."""
    out: list[Contrast] = []
    for folder in POLICIES:
        records = runs.get(folder, [])
        mine = arm_values(records, "flmarket", name)
        out.extend(contrast(mine, arm_values(records, b, name), folder, b, name) for b in baselines)
    return out


def _f(value: float, digits: int = 2) -> str:
    return "-" if math.isnan(value) else f"{value:+.{digits}f}"


def _p(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3g}"


def contrast_lines(rows: Sequence[Contrast], adjusted: Sequence[float] | None = None) -> list[str]:
    """A Markdown table of contrasts (with Holm's p when given)."""
    head = "| bids | FLMarket vs | partitions | mean diff [95% t-CI] | sd | FLMarket ahead | p (t) | p (Holm) "
    lines = [head + "| p (Wilcoxon) |", "|---|---|---:|---|---:|---:|---:|---:|---:|"]
    for i, c in enumerate(rows):
        holm_p = _p(adjusted[i]) if adjusted is not None else "-"
        lines.append(
            f"| {c.policy} | {c.baseline} | {c.partitions} | {_f(c.mean)} [{_f(c.ci_low)}, {_f(c.ci_high)}] "
            f"| {c.sd:.2f} | {c.wins} of {c.partitions} | {_p(c.p_t)} | {holm_p} | {_p(c.p_wilcoxon)} |"
        )
    return lines


def headroom_lines(runs: Mapping[str, Sequence[Record]]) -> list[str]:
    """All 20 clients minus each arm (auc, points): the room each selector had."""
    everyone = arm_values(runs.get("all", []), "rs", "auc")
    lines = ["| bids | arm | partitions | all 20 clients minus arm, mean [95% t-CI] |", "|---|---|---:|---|"]
    for folder in POLICIES:
        for arm in ("flmarket", *PRIMARY_BASELINES, *SECONDARY_BASELINES):
            values = arm_values(runs.get(folder, []), arm, "auc")
            shared = sorted(set(values) & set(everyone))
            gaps = np.array([everyone[key] - values[key] for key in shared], dtype=np.float64)
            low, high = t_interval(gaps) if gaps.size >= 2 else (math.nan, math.nan)
            mean = float(gaps.mean()) if gaps.size else math.nan
            lines.append(f"| {folder} | {arm} | {gaps.size} | {_f(mean)} [{_f(low)}, {_f(high)}] |")
    return lines


def market_lines(runs: Mapping[str, Sequence[Record]]) -> list[str]:
    """FLMarket's winners, paid / R and the winners' share of the pool's samples, per policy."""
    lines = ["| bids | runs | winners (median, range) | paid / R (mean, range) | winners' share of samples |"]
    lines.append("|---|---:|---|---|---:|")
    for folder in POLICIES:
        rows = [r for r in runs.get(folder, []) if r["selector"] == "flmarket"]
        if not rows:
            continue
        winners = [len(r["selected_partitions"]) for r in rows]
        paid = [r["market"]["total_payment"] / r["market"]["budget"] for r in rows]
        share = [np.asarray(r["selected_class_totals"]).sum() / np.asarray(r["pool_class_totals"]).sum() for r in rows]
        lines.append(
            f"| {folder} | {len(rows)} | {np.median(winners):.0f} ({min(winners)}-{max(winners)}) "
            f"| {np.mean(paid):.3f} ({min(paid):.3f}-{max(paid):.3f}) | {np.mean(share):.3f} |"
        )
    return lines


def report(raw: Path, command: str) -> str:
    """The Markdown report of the grid under ``raw``."""
    runs = runs_by_policy(raw)
    primary = contrasts(runs, "auc", PRIMARY_BASELINES)
    adjusted = list(holm([c.p_t for c in primary])) if all(not math.isnan(c.p_t) for c in primary) else None
    done = min((c.partitions for c in primary), default=0)
    per_distribution: dict[str, list[Contrast]] = defaultdict(list)
    for distribution in ("d4", "d5", "d6"):
        only = {k: [r for r in v if r["distribution"] == distribution] for k, v in runs.items()}
        per_distribution[distribution] = contrasts(only, "auc", PRIMARY_BASELINES)
    status = (
        f"**All {PARTITIONS_REGISTERED} pre-registered partitions finished: the primary test below is the "
        "pre-registered one.**"
        if done >= PARTITIONS_REGISTERED
        else f"**Interim: {done} of the {PARTITIONS_REGISTERED} pre-registered partitions finished in every primary "
        "arm. The pre-registered test is the one at 54; the p-values below are an unplanned interim look and "
        "decide nothing.**"
    )
    lines = [
        "# Fashion-MNIST main grid: FLMarket against the baselines where selection can matter",
        "",
        "Regenerate (after `tar -xzf results/fashion_mnist_main/raw.tar.gz -C results/fashion_mnist_main`): "
        f"`{command}`. Protocol: `simulations/PILOT.md` section 6 (Dirichlet 0.1, d4-d6, 20 clients, "
        "budget mode, 30 rounds, 10 local steps). Grid: `bash simulations/fashion_mnist_main.sh`.",
        "",
        status,
        "",
        "## Primary: auc (mean accuracy over rounds 1-30, points), pooled over d4-d6",
        "",
        *contrast_lines(primary, adjusted),
        "",
        "## Secondary (descriptive): QBS and DDS; the final endpoint",
        "",
        *contrast_lines(contrasts(runs, "auc", SECONDARY_BASELINES)),
        "",
        *contrast_lines(contrasts(runs, "final", (*PRIMARY_BASELINES, *SECONDARY_BASELINES))),
        "",
        "## Each distribution alone (auc, descriptive)",
        "",
    ]
    for distribution, rows in per_distribution.items():
        lines += [f"### {distribution}", "", *contrast_lines(rows), ""]
    lines += ["## Headroom: all 20 clients minus each arm (auc)", "", *headroom_lines(runs), ""]
    lines += ["## What FLMarket bought", "", *market_lines(runs), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Write ``REPORT.md`` for the grid's raw folder."""
    parser = argparse.ArgumentParser(description="The main grid's pre-registered analysis.")
    parser.add_argument("raw", type=Path, help="the grid's raw folder (volume/, equal/, all/)")
    parser.add_argument("--out", type=Path, help="folder for REPORT.md (default: print)")
    args = parser.parse_args(argv)
    text = report(args.raw, "python -m simulations.main_grid " + " ".join(sys.argv[1:] if argv is None else argv))
    if args.out is None:
        print(text)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "REPORT.md").write_text(text + "\n", encoding="utf-8")
    print(f"wrote {args.out / 'REPORT.md'}")


if __name__ == "__main__":
    main()
