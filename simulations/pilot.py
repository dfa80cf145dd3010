"""The pilot's tables: headroom (all clients against a random k-subset, paired by partition) and the market's picks.

A pilot asks whether a setting can separate selectors before a grid is run: training on all clients must beat a
random ``k``-subset by a clear margin on the same partition. :func:`headroom_rows` pairs, within each setting
(Dirichlet concentration, local steps, rounds, distribution), the RS run at ``k = E`` (every client) with the RS
runs at smaller ``k`` of the same seed, for two endpoints: the final accuracy (mean of the last rounds) and the
mean accuracy over all rounds (:func:`simulations.engine.auc_accuracy`). :func:`partitions_for` turns a paired sd
into the partitions a paired t-test needs. :func:`market_rows` reads, from the recorded partitions alone (no
training), whom FLMarket's auction buys under volume and equal bids against the baselines, and
:func:`budget_rows` how many it buys, and how much of the budget it pays, at a budget fixed as a fraction of the
total bid.

``python -m simulations.pilot <raw folders...> --out <folder>`` writes ``pilot.md`` and ``pilot.csv``.
"""

from __future__ import annotations

import argparse
import csv
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy import integrate
from scipy import stats as scipy_stats

from flmarket_flwr.pricing import auction_order, run_auction
from flmarket_flwr.pricing.score import alpha as score_alpha
from simulations.baselines.selectors import flmarket_scores, select_clients
from simulations.engine import EngineConfig, auc_accuracy, auction_budget, bids_for
from simulations.stats import Record, records_from_dirs

__all__ = [
    "ENDPOINTS",
    "HeadroomRow",
    "budget_rows",
    "endpoint",
    "headroom_rows",
    "market_rows",
    "paired_t_power",
    "partitions_for",
    "partitions_of",
    "setting_key",
]

ENDPOINTS = ("final", "auc")
"""``final``: the record's final accuracy (mean of its last ``final_window`` rounds); ``auc``: mean over all rounds."""

SETTING_FIELDS = ("alpha", "local_steps", "rounds", "distribution")
"""The engine config fields that, with the data set and the clients, name a pilot setting."""


@dataclass(frozen=True)
class HeadroomRow:  # pylint: disable=too-many-instance-attributes
    """All clients minus a random ``k``-subset in one setting, for one endpoint, in accuracy points.

    Attributes
    ----------
    setting : dict
        :data:`SETTING_FIELDS` and their values.
    num_selected, num_clients : int
        ``k`` and ``E``.
    endpoint : str
        One of :data:`ENDPOINTS`.
    partitions : int
        Seeds with both runs (the pairs).
    all_mean, subset_mean : float
        Mean accuracy (%) of all clients and of the random subset over those seeds.
    mean, sd, low, high : float
        Mean, sample sd, minimum and maximum of the paired differences.
    at_least_5 : int
        Pairs whose difference is at least 5 points.
    premise_alpha : tuple of float
        The least and largest ``alpha = N_s / (E C)`` over the row's partitions (one value per distribution: the
        class sizes are fixed by the schedule).
    """

    setting: dict[str, Any]
    num_selected: int
    num_clients: int
    endpoint: str
    partitions: int
    all_mean: float
    subset_mean: float
    mean: float
    sd: float
    low: float
    high: float
    at_least_5: int
    premise_alpha: tuple[float, float]


def _config(record: Record) -> Mapping[str, Any]:
    return record["engine"]["config"]


def setting_key(record: Record) -> tuple[Any, ...]:
    """The setting of a pilot record: data set, clients and :data:`SETTING_FIELDS`."""
    config = _config(record)
    return (config["dataset"], config["num_clients"], *(config[name] for name in SETTING_FIELDS))


def endpoint(record: Record, name: str) -> float:
    """One endpoint of a run, in accuracy points (NaN for a diverged run).

    Raises
    ------
    ValueError
        An endpoint not in :data:`ENDPOINTS`.
    """
    if name not in ENDPOINTS:
        raise ValueError(f"endpoint must be one of {ENDPOINTS}, got {name!r}")
    if record["engine"].get("diverged"):
        return math.nan
    if name == "final":
        return 100.0 * float(record["final_accuracy"])
    return 100.0 * auc_accuracy([r["accuracy"] for r in record["rounds"][1:]])


def _premise_alpha(record: Record) -> float:
    counts = np.asarray(record["pool_class_totals"], dtype=np.int64)
    return float(score_alpha(counts, int(record["num_clients"])))


def headroom_rows(records: Sequence[Record], pool_distributions: bool = False) -> list[HeadroomRow]:
    """All clients (RS at ``k = E``) minus RS at each smaller ``k``, paired by partition, per setting and endpoint.

    The unit of pairing is the partition, (distribution, seed). ``pool_distributions`` pools the distributions of
    a setting into one row (its ``distribution`` then names them, e.g. ``d4+d5+d6``).

    Raises
    ------
    ValueError
        A record of another selector (the pilot runs RS only), or two runs of one (setting, k, partition).
    """
    Unit = tuple[str, int]
    runs: dict[tuple[Any, ...], dict[int, dict[Unit, Record]]] = defaultdict(lambda: defaultdict(dict))
    for record in records:
        if record["selector"] != "rs":
            raise ValueError(f"the pilot pairs RS runs only, got selector {record['selector']!r}")
        key = setting_key(record)
        unit = (str(key[-1]), int(record["seed"]))
        by_unit = runs[key[:-1] if pool_distributions else key][int(record["num_selected"])]
        if unit in by_unit:
            raise ValueError(f"two runs of {key}, k={record['num_selected']}, seed={record['seed']}")
        by_unit[unit] = record
    rows = []
    for key in sorted(runs, key=str):
        num_clients = int(key[1])
        everyone = runs[key].get(num_clients, {})
        for k in sorted(size for size in runs[key] if size < num_clients):
            units = sorted(set(everyone) & set(runs[key][k]))
            if not units:
                continue
            full_key = (*key, "+".join(sorted({d for d, _ in units}))) if pool_distributions else key
            for name in ENDPOINTS:
                rows.append(_row(full_key, k, name, [everyone[u] for u in units], [runs[key][k][u] for u in units]))
    return rows


def _row(key: tuple[Any, ...], k: int, name: str, everyone: list[Record], subset: list[Record]) -> HeadroomRow:
    all_values = np.array([endpoint(r, name) for r in everyone])
    subset_values = np.array([endpoint(r, name) for r in subset])
    differences = all_values - subset_values
    differences = differences[np.isfinite(differences)]
    alphas = [_premise_alpha(r) for r in everyone]
    return HeadroomRow(
        setting=dict(zip(SETTING_FIELDS, key[2:], strict=True)),
        num_selected=k,
        num_clients=int(key[1]),
        endpoint=name,
        partitions=int(differences.size),
        all_mean=float(np.nanmean(all_values)),
        subset_mean=float(np.nanmean(subset_values)),
        mean=float(differences.mean()) if differences.size else math.nan,
        sd=float(differences.std(ddof=1)) if differences.size > 1 else math.nan,
        low=float(differences.min()) if differences.size else math.nan,
        high=float(differences.max()) if differences.size else math.nan,
        at_least_5=int(np.count_nonzero(differences >= 5.0)),
        premise_alpha=(min(alphas), max(alphas)),
    )


def paired_t_power(partitions: int, effect: float, sd: float, level: float = 0.05) -> float:
    """Power of the two-sided paired t-test at ``level`` with ``partitions`` pairs, true mean ``effect``, sd ``sd``.

    The noncentral t probability of rejecting, integrated over the chi-square of the sample variance
    (``scipy.stats.nct`` returns NaN for large noncentralities; this does not).
    """
    df = partitions - 1
    critical = float(scipy_stats.t.ppf(1 - level / 2, df))
    shift = effect / sd * math.sqrt(partitions)

    def rejecting(v: float) -> float:
        scale = critical * math.sqrt(v / df)
        tails = scipy_stats.norm.sf(scale - shift) + scipy_stats.norm.cdf(-scale - shift)
        return float(scipy_stats.chi2.pdf(v, df) * tails)

    low, high = scipy_stats.chi2.ppf([1e-12, 1 - 1e-12], df)  # where all but 2e-12 of the variance's mass lies
    return float(integrate.quad(rejecting, low, high, limit=200)[0])


def partitions_for(sd: float, effect: float = 3.0, power: float = 0.8, level: float = 0.05) -> int:
    """The fewest partitions for which a two-sided paired t-test at ``level`` detects ``effect`` with ``power``.

    Exact power (:func:`paired_t_power`); at least 3 partitions (with 2 the test has one degree of freedom).

    Raises
    ------
    ValueError
        A non-positive or non-finite ``sd`` or ``effect``, or ``power`` / ``level`` outside ``(0, 1)``.
    """
    if not (math.isfinite(sd) and sd > 0 and math.isfinite(effect) and effect > 0):
        raise ValueError(f"sd and effect must be finite and > 0, got sd={sd}, effect={effect}")
    if not (0 < power < 1 and 0 < level < 1):
        raise ValueError(f"power and level must lie in (0, 1), got power={power}, level={level}")
    normal = (scipy_stats.norm.ppf(1 - level / 2) + scipy_stats.norm.ppf(power)) * sd / effect
    n = max(3, math.ceil(normal**2))  # the z-test's size: the t-test never needs fewer
    while paired_t_power(n, effect, sd, level) < power:
        n += 1
    return n


# --- the market's picks -----------------------------------------------------------------------------------------------
def _partitions(records: Sequence[Record]) -> dict[tuple[Any, ...], np.ndarray]:
    """Each distinct (setting, seed)'s label counts ``(E, C)``, from the records (one per partition)."""
    found: dict[tuple[Any, ...], np.ndarray] = {}
    for record in records:
        config = _config(record)
        key = (config["dataset"], config["num_clients"], config["alpha"], config["distribution"], int(record["seed"]))
        found.setdefault(key, np.asarray(record["all_label_counts"], dtype=np.int64))
    return found


def market_rows(records: Sequence[Record], num_selected: int = 5) -> list[dict[str, Any]]:
    """Whom FLMarket buys at ``num_selected`` (the cohort's least budget) under volume and equal bids, per partition.

    For each recorded partition: the data volume of FLMarket's winners under each bid policy and of QBS's, DICE's
    and RS's picks; the rank (1 = largest) of the winners' volumes among all clients; and the Spearman correlation
    over clients of the volume ``N_e`` with the score ``u_e`` and with the score per bid ``u_e / b_e`` (Algorithm
    1's ranking) under volume bids. No training: selection only.
    """
    rows = []
    for (dataset, num_clients, dirichlet, distribution, seed), counts in sorted(_partitions(records).items(), key=str):
        volumes = counts.sum(axis=1)
        scores = flmarket_scores(counts)
        ranks = np.argsort(np.argsort(-volumes, kind="stable"), kind="stable") + 1
        row: dict[str, Any] = {
            "dataset": dataset,
            "clients": num_clients,
            "dirichlet": dirichlet,
            "distribution": distribution,
            "seed": seed,
            "k": num_selected,
        }
        for policy in ("volume", "constant"):
            cfg = EngineConfig(bid_policy=policy, seed=seed, num_selected=num_selected)  # the cohort's least budget
            bids = bids_for(cfg, counts)
            auction = run_auction(scores, bids, auction_budget(cfg, scores, bids), num_winners=num_selected)
            row[f"flmarket_{policy}_volume"] = int(volumes[auction.winners].sum())
            row[f"flmarket_{policy}_ranks"] = sorted(int(r) for r in ranks[auction.winners])
            if policy == "volume":
                row["order_volume_ranks"] = [int(r) for r in ranks[auction_order(scores, bids)][:num_selected]]
                row["spearman_volume_score"] = float(scipy_stats.spearmanr(volumes, scores).statistic)
                row["spearman_volume_score_per_bid"] = float(scipy_stats.spearmanr(volumes, scores / bids).statistic)
        for selector in ("qbs", "dice", "rs"):
            picked = select_clients(selector, counts, num_selected, seed=seed)
            row[f"{selector}_volume"] = int(volumes[picked].sum())
        rows.append(row)
    return rows


def budget_rows(
    partitions: Mapping[tuple[Any, ...], np.ndarray], fractions: Sequence[float], num_selected: int = 0
) -> list[dict[str, Any]]:
    """FLMarket's auction at ``R = fraction x total bid`` on each partition, summarised per (setting, policy, f).

    ``partitions`` maps ``(setting..., seed)`` to label counts; the seeds of one setting are summarised together:
    winners (median, min, max), paid / R (mean, min, max) and the winners' share of the pool's volume (mean).
    ``num_selected > 0`` caps the cohort (the cohort-capped mode). Selection only, through the engine's own
    :func:`~simulations.engine.auction_budget` and :func:`~simulations.engine.bids_for`.
    """
    grouped: dict[tuple[Any, ...], list[tuple[int, np.ndarray]]] = defaultdict(list)
    for key, counts in partitions.items():
        grouped[key[:-1]].append((int(key[-1]), counts))
    rows = []
    for setting in sorted(grouped, key=str):
        for policy in ("volume", "constant"):
            for fraction in fractions:
                cfg = EngineConfig(bid_policy=policy, budget_fraction=fraction, num_selected=num_selected)
                winners, paid, share = [], [], []
                for seed, counts in grouped[setting]:
                    scores, bids = flmarket_scores(counts), bids_for(replace(cfg, seed=seed), counts)
                    budget = auction_budget(cfg, scores, bids)
                    auction = run_auction(scores, bids, budget, num_winners=num_selected or None)
                    winners.append(auction.winners.size)
                    paid.append(auction.total_payment / budget)
                    share.append(counts[auction.winners].sum() / counts.sum())
                rows.append(
                    {"setting": setting, "policy": policy, "fraction": fraction, "partitions": len(winners),
                     "winners_median": float(np.median(winners)), "winners_min": min(winners),
                     "winners_max": max(winners), "paid_mean": float(np.mean(paid)), "paid_min": min(paid),
                     "paid_max": max(paid), "volume_share": float(np.mean(share))}
                )  # fmt: skip
    return rows


def partitions_of(records: Sequence[Record], seeds: Sequence[int]) -> dict[tuple[Any, ...], np.ndarray]:
    """The label counts of every (data set, clients, Dirichlet, distribution) of ``records`` at ``seeds``.

    Computed with the app's own loader (:func:`flmarket_flwr.app.task.all_label_counts`): no training needed.
    """
    from flmarket_flwr.app import task  # pylint: disable=import-outside-toplevel
    from simulations.engine import data_config  # pylint: disable=import-outside-toplevel

    found: dict[tuple[Any, ...], np.ndarray] = {}
    for record in records:
        config = _config(record)
        setting = (config["dataset"], config["num_clients"], config["alpha"], config["distribution"])
        for seed in seeds:
            if (*setting, seed) not in found:
                engine_cfg = EngineConfig(**{**dict(config), "seed": seed})
                found[(*setting, seed)] = np.asarray(task.all_label_counts(data_config(engine_cfg)))
    return found


def budget_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The budget table in Markdown."""
    lines = [
        "| Dirichlet | distribution | bids | R / total bid | partitions | winners: median (range) "
        "| paid / R: mean (range) | winners' share of the pool's volume |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        _, _, dirichlet, distribution = row["setting"]
        lines.append(
            f"| {dirichlet:g} | {distribution} | {'equal' if row['policy'] == 'constant' else 'volume'} "
            f"| {row['fraction']:g} | {row['partitions']} | {row['winners_median']:g} ({row['winners_min']} to "
            f"{row['winners_max']}) | {row['paid_mean']:.2f} ({row['paid_min']:.2f} to {row['paid_max']:.2f}) "
            f"| {row['volume_share']:.2f} |"
        )
    return lines


# --- output -----------------------------------------------------------------------------------------------------------
def _f(value: float, digits: int = 1) -> str:
    return "nan" if not math.isfinite(value) else f"{value:+.{digits}f}" if digits == 1 else f"{value:.{digits}f}"


def _alpha(bounds: tuple[float, float]) -> str:
    low, high = bounds
    return f"{low:.0f}" if round(low) == round(high) else f"{low:.0f}-{high:.0f}"


def headroom_lines(rows: Sequence[HeadroomRow], effect: float = 3.0) -> list[str]:
    """The headroom table in Markdown (differences in accuracy points; partitions for ``effect`` at 80% power)."""
    lines = [
        "| Dirichlet | local steps | rounds | distribution | alpha | k of E | endpoint | partitions | all clients % "
        f"| random k % | all - random: mean | sd | range | pairs >= 5 | partitions for {effect:g} points |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        s = row.setting
        needed = partitions_for(row.sd, effect) if math.isfinite(row.sd) and row.sd > 0 else "-"
        lines.append(
            f"| {s['alpha']:g} | {s['local_steps']} | {s['rounds']} | {s['distribution']} "
            f"| {_alpha(row.premise_alpha)} "
            f"| {row.num_selected} of {row.num_clients} | {row.endpoint} | {row.partitions} | {row.all_mean:.1f} "
            f"| {row.subset_mean:.1f} | **{_f(row.mean)}** | {_f(row.sd, 2)} | {_f(row.low)} to {_f(row.high)} "
            f"| {row.at_least_5} | {needed} |"
        )
    return lines


def market_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The market's picks in Markdown: the volume bought by each selector and the volume ranks of the winners."""
    lines = [
        "| Dirichlet | distribution | seed | FLMarket volume bids: volume (ranks) "
        "| FLMarket equal bids: volume (ranks) | QBS | DICE | RS | Spearman(N, u) | Spearman(N, u/b), volume bids |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['dirichlet']:g} | {row['distribution']} | {row['seed']} "
            f"| {row['flmarket_volume_volume']:,} ({', '.join(map(str, row['flmarket_volume_ranks']))}) "
            f"| {row['flmarket_constant_volume']:,} ({', '.join(map(str, row['flmarket_constant_ranks']))}) "
            f"| {row['qbs_volume']:,} | {row['dice_volume']:,} | {row['rs_volume']:,} "
            f"| {row['spearman_volume_score']:+.2f} | {row['spearman_volume_score_per_bid']:+.2f} |"
        )
    return lines


def write_csv(rows: Sequence[HeadroomRow], path: Path) -> None:
    """The headroom rows as CSV, one per (setting, k, endpoint)."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow([*SETTING_FIELDS, "alpha_score", "k", "num_clients", "endpoint", "partitions", "all_mean",
                         "subset_mean", "mean", "sd", "low", "high", "at_least_5", "partitions_for_3"])  # fmt: skip
        for row in rows:
            needed = partitions_for(row.sd) if math.isfinite(row.sd) and row.sd > 0 else ""
            writer.writerow(
                [*(row.setting[name] for name in SETTING_FIELDS), _alpha(row.premise_alpha), row.num_selected,
                 row.num_clients, row.endpoint, row.partitions, f"{row.all_mean:.2f}", f"{row.subset_mean:.2f}",
                 f"{row.mean:.2f}", f"{row.sd:.2f}", f"{row.low:.2f}", f"{row.high:.2f}", row.at_least_5, needed]
            )  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    """Write ``pilot.md`` (headroom and market tables) and ``pilot.csv`` from the pilot's ``result.json`` files."""
    parser = argparse.ArgumentParser(description="The pilot's headroom and market tables.")
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--market-k", type=int, default=5, help="cohort size of the market table")
    parser.add_argument("--budget-fractions", type=float, nargs="*", default=[0.05, 0.1, 0.2, 0.3, 0.5])
    parser.add_argument("--budget-seeds", type=int, default=30, help="partitions (seeds 0..n-1) of the budget table")
    args = parser.parse_args(argv)
    records = [r for r in records_from_dirs(args.folders) if r["selector"] == "rs"]
    if not records:
        parser.error(f"no RS result.json under {[str(f) for f in args.folders]}")
    pooled = [row for row in headroom_rows(records, pool_distributions=True) if "+" in row.setting["distribution"]]
    rows = headroom_rows(records) + pooled
    partitions = partitions_of(records, range(args.budget_seeds))
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, args.out / "pilot.csv")
    text = [
        "# Pilot tables (generated by `python -m simulations.pilot`)",
        "",
        f"{len(records)} runs. Differences in accuracy points, all clients minus a random k-subset, paired by "
        "partition (distribution, seed).",
        "",
        *headroom_lines(rows),
        "",
        f"## Whom the market buys at {args.market_k} of E (selection only, the least budget that buys the cohort)",
        "",
        "Volume of the selected clients (samples); in brackets the winners' ranks by volume (1 = largest).",
        "",
        *market_lines(market_rows(records, args.market_k)),
        "",
        f"## The budget mode: R as a fraction of the total bid (selection only, seeds 0-{args.budget_seeds - 1})",
        "",
        *budget_lines(budget_rows(partitions, args.budget_fractions)),
        "",
        f"## The cohort-capped mode: the same R, at most {args.market_k} winners (selection only)",
        "",
        *budget_lines(budget_rows(partitions, args.budget_fractions, num_selected=args.market_k)),
        "",
    ]
    (args.out / "pilot.md").write_text("\n".join(text), encoding="utf-8")
    print("\n".join(text))


if __name__ == "__main__":
    main()
