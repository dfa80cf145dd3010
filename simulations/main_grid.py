"""A grid's pre-registered analysis (simulations/PILOT.md section 6, or the PREREG.md beside its raw/), as Markdown.

Arms: a run's arm is its selector, FLMarket under the whole-budget rule (``auction_budget_rule="whole"``) an arm of
its own (:func:`arm_of`); ``raw/<policy>`` and ``raw/<policy>-whole`` are read together (:func:`runs_by_policy`).
The lead arm (:func:`lead_arm`) is the whole-budget rule where the grid ran it, else the paper's rule.
Primary: ``auc`` (mean test accuracy over rounds 1-30, in points), the lead arm minus RS and minus DICE under the
volume and the equal (constant) bid policies, paired by partition (distribution, seed), pooled over d4-d6: the
mean difference with its 95% t-interval, the two-sided paired t-test, Holm over the four; Wilcoxon beside it.
Where both rules ran, the whole-budget rule minus the paper's under each policy, Holm over the two
(:func:`rule_lines`). Secondary and descriptive: QBS and DDS, the ``final`` endpoint, each distribution alone, the
headroom (all the clients minus each arm), paid / R and the winners' share of the pool, the time to accuracy. Then,
from the recorded auctions alone (no re-run): why FLMarket buys the smallest clients under volume bids
(:func:`bidders`, :func:`small_clients`, :func:`volume_elasticity`), what each arm buys (:func:`bought`, the paper's
Table 2 analogue), the deviations from the paper read from the records' configs (:func:`deviation_lines`) and what of
its headline reproduces (:func:`reproduce_lines`). A contrast that does not reject is "not detected at this size".

The header reads the grid's registration from the grid itself (:func:`registration`: its seeds, distributions and
partitions) and its seeds from the records (:func:`grid_status`): the pre-registered test only when every registered
partition finished in every primary arm, an interim look otherwise, and exploratory for a grid on other seeds, of
another federation size than the main grid's :data:`REGISTERED_CLIENTS`, or with no registration.

``python -m simulations.main_grid results/fashion_mnist_main/raw --out results/fashion_mnist_main``
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import stats as scipy_stats

from flmarket_flwr.app.data.partition import LINEAR_MIN_KEEP_RATIO
from simulations.buyer import PAPER_ROUNDS_TO_60, TimeTo, median_rounds, median_seconds, rank_differences, spend
from simulations.buyer import time_to as time_to_accuracy
from simulations.pilot import endpoint, partitions_for
from simulations.stats import Record, holm, records_from_dirs, t_interval, top_shares, wilcoxon_p

PRIMARY_BASELINES = ("rs", "dice")
SECONDARY_BASELINES = ("qbs", "dds")
POLICIES = {"volume": "volume", "equal": "constant"}
"""The grid's folders under ``raw/`` and the bid policy each was run with; ``raw/<folder>-whole`` holds the same
policy's FLMarket runs under the whole-budget rule (read with them: a record's arm comes from its config)."""
WHOLE_SUFFIX = "-whole"
FLMARKET, FLMARKET_WHOLE = "flmarket", "flmarket" + WHOLE_SUFFIX
"""FLMarket's arms: the paper's rule (Algorithm 1, ``budget_rule="half"``) and the whole-budget rule."""
ARMS = (FLMARKET, FLMARKET_WHOLE, *PRIMARY_BASELINES, *SECONDARY_BASELINES)
"""Every arm a grid may run, in the order of the report's tables."""
REGISTERED_CLIENTS = 20
"""The federation size of the main grid's pre-registration (simulations/PILOT.md section 6)."""
PILOT = Path(__file__).resolve().parent / "PILOT.md"
"""The main grid's pre-registration (its section 6), for a cohort-matched grid without a PREREG.md of its own."""
COHORT_SCRIPT = "bash simulations/fashion_mnist_main.sh"
"""The script of the cohort-matched grids (the main grid, and at other federation sizes with ``CLIENTS``)."""
DATASET_NAMES = {"fashion_mnist": "Fashion-MNIST", "mnist": "MNIST", "digits": "Digits", "cifar10": "CIFAR-10"}
PAPER_COHORTS = {20: "5/10/15", 100: "25/50/75"}
"""The paper's cohort sizes k by federation size (sections 5.1 and Appendix, 100 clients)."""


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
    arm: str = FLMARKET


def unit(record: Record) -> tuple[str, int]:
    """The partition of a run: (distribution, seed)."""
    return str(record["distribution"]), int(record["seed"])


def budget_rule(record: Record) -> str:
    """The auction's budget rule of a run: the engine config's ``auction_budget_rule``, else the market's
    ``budget_rule``; ``half`` (Algorithm 1) for records from before the rule was a setting."""
    config = record.get("engine", {}).get("config", {})
    return str(config.get("auction_budget_rule", record.get("market", {}).get("budget_rule", "half")))


def arm_of(record: Record) -> str:
    """A run's arm: its selector, FLMarket under the whole-budget rule being an arm of its own
    (:data:`FLMARKET_WHOLE`)."""
    selector = str(record["selector"])
    return FLMARKET_WHOLE if selector == FLMARKET and budget_rule(record) == "whole" else selector


def is_flmarket(arm: str) -> bool:
    """Whether an arm is FLMarket's (under either budget rule)."""
    return arm in (FLMARKET, FLMARKET_WHOLE)


def arm_label(arm: str) -> str:
    """An arm's name in prose and table heads: ``FLMarket``, ``FLMarket (whole)``, or the baseline in capitals."""
    return {FLMARKET: "FLMarket", FLMARKET_WHOLE: "FLMarket (whole)"}.get(arm, arm.upper())


def arms_run(runs: Mapping[str, Sequence[Record]]) -> set[str]:
    """The arms with at least one run under a bid policy of the grid."""
    return {arm_of(r) for folder in POLICIES for r in runs.get(folder, [])}


def lead_arm(runs: Mapping[str, Sequence[Record]]) -> str:
    """The FLMarket arm the primary contrasts are of: the whole-budget rule where the grid ran it (the budget-rule
    grid's pre-registration), else the paper's rule."""
    return FLMARKET_WHOLE if FLMARKET_WHOLE in arms_run(runs) else FLMARKET


def auction_arm(runs: Mapping[str, Sequence[Record]]) -> str:
    """The FLMarket arm whose auctions the bidder analysis reads: the paper's rule where the grid ran it (the
    section explains Algorithm 1; both rules rank the bidders alike), else the lead arm."""
    return FLMARKET if FLMARKET in arms_run(runs) else lead_arm(runs)


def arm_values(records: Sequence[Record], arm: str, name: str) -> dict[tuple[str, int], float]:
    """``{partition: endpoint}`` for one arm's runs (:func:`arm_of`; diverged runs left out)."""
    values = {unit(r): endpoint(r, name) for r in records if arm_of(r) == arm}
    return {key: value for key, value in values.items() if not math.isnan(value)}


def contrast(
    mine: Mapping[tuple[str, int], float],
    theirs: Mapping[tuple[str, int], float],
    policy: str,
    baseline: str,
    name: str,
    arm: str = FLMARKET,
) -> Contrast:
    """The paired contrast ``arm`` minus ``baseline`` over the partitions in both: mean, t-interval, paired t-test,
    Wilcoxon."""
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
        arm=arm,
    )


def federation_size(runs: Mapping[str, Sequence[Record]]) -> int:
    """The grid's number of clients ``E``, read from its records.

    Raises
    ------
    ValueError
        No records, or records of more than one federation size (two grids in one folder).
    """
    sizes = sorted({int(r["num_clients"]) for records in runs.values() for r in records})
    if len(sizes) != 1:
        raise ValueError(f"expected the runs of one federation size, found num_clients {sizes or 'in no record'}")
    return sizes[0]


def grid_match(runs: Mapping[str, Sequence[Record]]) -> str:
    """How the grid's baselines were matched to FLMarket: ``cohort`` (as many clients) or ``budget`` (the same R).

    Raises
    ------
    ValueError
        Baselines of both matches in one grid.
    """
    every = [r for folder in POLICIES for r in runs.get(folder, [])]
    baselines = [r for r in every if r["selector"] != FLMARKET] or every  # FLMarket's config, before any baseline ran
    found = {str(r["engine"].get("config", {}).get("baseline_match", "cohort")) for r in baselines}
    if len(found) > 1:
        raise ValueError(f"expected the baselines of one match, found {sorted(found)} (two grids in one folder)")
    return found.pop() if found else "cohort"


def runs_by_policy(raw: Path) -> dict[str, Sequence[Record]]:
    """Every finished run of the grid, by bid policy (``volume``, ``equal``) and ``all``: a policy's runs are those
    of ``raw/<policy>`` and ``raw/<policy>-whole`` together."""
    out: dict[str, Sequence[Record]] = {}
    for name in (*POLICIES, "all"):
        folders = [folder for folder in (raw / name, raw / f"{name}{WHOLE_SUFFIX}") if folder.is_dir()]
        if folders:
            out[name] = records_from_dirs(folders)
    return out


def contrasts(
    runs: Mapping[str, Sequence[Record]], name: str, baselines: Sequence[str], arm: str = FLMARKET
) -> list[Contrast]:
    """``arm`` (FLMarket under the paper's rule by default) against each baseline under each policy, pooled over the
    distributions.

    A policy or an arm the grid has no finished runs of is left out (no contrast over zero partitions).
    """
    out: list[Contrast] = []
    for folder in POLICIES:
        records = runs.get(folder, [])
        mine = arm_values(records, arm, name)
        rows = (contrast(mine, arm_values(records, b, name), folder, b, name, arm) for b in baselines if b != arm)
        out.extend(row for row in rows if row.partitions)
    return out


def _f(value: float, digits: int = 2) -> str:
    return "-" if math.isnan(value) else f"{value:+.{digits}f}"


def _p(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3g}"


def contrast_lines(
    rows: Sequence[Contrast], adjusted: Sequence[float] | None = None, arm: str | None = None
) -> list[str]:
    """A Markdown table of contrasts of one arm (the rows', else ``arm``, else FLMarket), with Holm's p when given.

    Raises
    ------
    ValueError
        Rows of more than one arm.
    """
    arms = {c.arm for c in rows}
    if len(arms) > 1:
        raise ValueError(f"one table holds the contrasts of one arm, got {sorted(arms)}")
    mine = arm_label(arms.pop() if arms else arm or FLMARKET)
    head = f"| bids | {mine} vs | partitions | mean diff [95% t-CI] | sd | {mine} ahead | p (t) | p (Holm) "
    lines = [head + "| p (Wilcoxon) |", "|---|---|---:|---|---:|---:|---:|---:|---:|"]
    for i, c in enumerate(rows):
        holm_p = _p(adjusted[i]) if adjusted is not None else "-"
        lines.append(
            f"| {c.policy} | {c.baseline} | {c.partitions} | {_f(c.mean)} [{_f(c.ci_low)}, {_f(c.ci_high)}] "
            f"| {_seconds(c.sd, 2)} | {c.wins} of {c.partitions} | {_p(c.p_t)} | {holm_p} | {_p(c.p_wilcoxon)} |"
        )
    return lines


def headroom_lines(runs: Mapping[str, Sequence[Record]]) -> list[str]:
    """All the clients minus each arm (auc, points): the room each selector had."""
    everyone = arm_values(runs.get("all", []), "rs", "auc")
    clients = federation_size(runs)
    lines = [f"| bids | arm | partitions | all {clients} clients minus arm, mean [95% t-CI] |", "|---|---|---:|---|"]
    for folder in POLICIES:
        for arm in ARMS:
            values = arm_values(runs.get(folder, []), arm, "auc")
            shared = sorted(set(values) & set(everyone))
            if not shared:
                continue  # an arm the grid did not run
            gaps = np.array([everyone[key] - values[key] for key in shared], dtype=np.float64)
            low, high = t_interval(gaps) if gaps.size >= 2 else (math.nan, math.nan)
            mean = float(gaps.mean()) if gaps.size else math.nan
            lines.append(f"| {folder} | {arm} | {gaps.size} | {_f(mean)} [{_f(low)}, {_f(high)}] |")
    return lines


def market_lines(runs: Mapping[str, Sequence[Record]]) -> list[str]:
    """Each FLMarket arm's winners, paid / R and the winners' share of the pool's samples, per policy."""
    lines = ["| bids | arm | runs | winners: median (range) | paid / R: mean (range) | winners' share of samples |"]
    lines.append("|---|---|---:|---|---|---:|")
    for folder in POLICIES:
        for arm in (FLMARKET, FLMARKET_WHOLE):
            rows = [r for r in runs.get(folder, []) if arm_of(r) == arm]
            if not rows:
                continue
            winners = [len(r["selected_partitions"]) for r in rows]
            paid = [r["market"]["total_payment"] / r["market"]["budget"] for r in rows]
            share = [
                np.asarray(r["selected_class_totals"]).sum() / np.asarray(r["pool_class_totals"]).sum() for r in rows
            ]
            lines.append(
                f"| {folder} | {arm} | {len(rows)} | {_spread(winners)} "
                f"| {np.mean(paid):.3f} ({min(paid):.3f} to {max(paid):.3f}) | {np.mean(share):.3f} |"
            )
    return lines


# --- the small clients under volume bids ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bidder:
    """One client of one FLMarket auction: its volume ``N_e``, score ``u_e``, bid ``b_e`` and whether it won."""

    distribution: str
    seed: int
    size: int
    score: float
    bid: float
    won: bool

    @property
    def score_per_bid(self) -> float:
        """``u_e / b_e``: Algorithm 1's ranking key."""
        return self.score / self.bid


def bidders(records: Sequence[Record], arm: str = FLMARKET) -> list[Bidder]:
    """Every bidder of every auction of one FLMarket arm in ``records``, from the recorded scores, bids and label
    counts (one arm: the two budget rules auction the same partition, with different winners).

    Raises
    ------
    ValueError
        A FLMarket record without the auction's ``market.scores`` / ``market.bids`` or with lengths that do not
        match its ``all_label_counts``.
    """
    out: list[Bidder] = []
    for record in records:
        if arm_of(record) != arm:
            continue
        market = record.get("market", {})
        if "scores" not in market or "bids" not in market:
            raise ValueError(f"FLMarket record {unit(record)} has no market.scores / market.bids")
        sizes = np.asarray(record["all_label_counts"], dtype=np.int64).sum(axis=1)
        scores, bids = np.asarray(market["scores"], dtype=float), np.asarray(market["bids"], dtype=float)
        if not sizes.size == scores.size == bids.size:
            raise ValueError(
                f"FLMarket record {unit(record)}: {sizes.size} clients, {scores.size} scores, {bids.size} bids"
            )
        won = set(int(p) for p in record["selected_partitions"])
        distribution, seed = unit(record)
        out.extend(
            Bidder(distribution, seed, int(n), float(u), float(b), e in won)
            for e, (n, u, b) in enumerate(zip(sizes, scores, bids, strict=True))
        )
    return out


def volume_elasticity(sizes: Sequence[float], scores: Sequence[float]) -> float:
    """The least-squares slope of ``ln u`` on ``ln N`` over clients with ``u, N > 0`` (NaN with fewer than 2).

    A slope below 1 is a score sub-linear in volume: then ``u / N`` falls as ``N`` grows.
    """
    n, u = np.asarray(sizes, dtype=float), np.asarray(scores, dtype=float)
    keep = (n > 0) & (u > 0)
    if np.unique(n[keep]).size < 2:
        return math.nan
    return float(np.polyfit(np.log(n[keep]), np.log(u[keep]), 1)[0])


def _by_partition(rows: Sequence[Bidder]) -> dict[tuple[str, int], list[Bidder]]:
    grouped: dict[tuple[str, int], list[Bidder]] = defaultdict(list)
    for row in rows:
        grouped[(row.distribution, row.seed)].append(row)
    return dict(sorted(grouped.items()))


def _count(value: float, fmt: str = ",.0f") -> str:
    """A count, or a median of counts, in ``fmt``; a whole-number format keeps a median's half (5.5, not 6)."""
    if fmt.endswith(".0f") and not float(value).is_integer():
        return f"{value:{fmt[:-3]}.1f}"
    return f"{value:{fmt}}"


def _spread(values: Sequence[float], fmt: str = ",.0f") -> str:
    """``median (min to max)``, or ``-`` for no values; the median of whole numbers keeps its half (:func:`_count`)."""
    if not len(values):
        return "-"
    if all(float(v).is_integer() for v in values):
        return f"{_count(float(np.median(values)), fmt)} ({_count(min(values), fmt)} to {_count(max(values), fmt)})"
    return f"{np.median(values):{fmt}} ({min(values):{fmt}} to {max(values):{fmt}})"


def _spearman(x: Sequence[float], y: Sequence[float]) -> float:
    if len(x) < 3 or np.ptp(np.asarray(x, dtype=float)) == 0 or np.ptp(np.asarray(y, dtype=float)) == 0:
        return math.nan
    return float(scipy_stats.spearmanr(x, y).statistic)


@dataclass(frozen=True)
class SmallClients:  # pylint: disable=too-many-instance-attributes
    """Whom FLMarket's auction buys under one bid policy, and why: the rank statistics over its bidders.

    Attributes
    ----------
    policy : str
        The grid's folder (``volume``, ``equal``).
    partitions, bidders : int
        Auctions and bidders in them.
    spearman_per_bid, spearman_score : float
        Spearman's correlation of the volume ``N_e`` with ``u_e / b_e`` and with ``u_e``, pooled over all bidders.
    per_partition_per_bid : list of float
        The first correlation within each auction.
    elasticity : list of float
        :func:`volume_elasticity` within each auction.
    smallest_half : float
        Share of the winners in the smaller half of their auction's clients by volume.
    """

    policy: str
    partitions: int
    bidders: int
    spearman_per_bid: float
    spearman_score: float
    per_partition_per_bid: list[float]
    elasticity: list[float]
    smallest_half: float


def small_clients(policy: str, rows: Sequence[Bidder]) -> SmallClients:
    """The rank statistics of :class:`SmallClients` over the bidders of one policy."""
    auctions = _by_partition(rows)
    in_small_half: list[bool] = []
    for group in auctions.values():
        order = sorted(range(len(group)), key=lambda i: (group[i].size, i))  # ascending volume
        small = set(order[: len(group) // 2])
        in_small_half.extend(i in small for i, b in enumerate(group) if b.won)
    return SmallClients(
        policy=policy,
        partitions=len(auctions),
        bidders=len(rows),
        spearman_per_bid=_spearman([b.size for b in rows], [b.score_per_bid for b in rows]),
        spearman_score=_spearman([b.size for b in rows], [b.score for b in rows]),
        per_partition_per_bid=[_spearman([b.size for b in g], [b.score_per_bid for b in g]) for g in auctions.values()],
        elasticity=[volume_elasticity([b.size for b in g], [b.score for b in g]) for g in auctions.values()],
        smallest_half=float(np.mean(in_small_half)) if in_small_half else math.nan,
    )


def bidder_lines(runs: Mapping[str, Sequence[Record]]) -> list[str]:
    """Winners against losers under each bid policy: volume, score, bid and score per bid, median (range)."""
    lines = [
        "| bids | group | bidders | samples N_e | score u_e | bid b_e | score per bid u_e / b_e |",
        "|---|---|---:|---|---|---|---|",
    ]
    arm = auction_arm(runs)
    for folder in POLICIES:
        rows = bidders(runs.get(folder, []), arm)
        for name, won in (("winners", True), ("losers", False)):
            group = [b for b in rows if b.won == won]
            lines.append(
                f"| {folder} | {name} | {len(group)} | {_spread([b.size for b in group])} "
                f"| {_spread([b.score for b in group])} | {_spread([b.bid for b in group], ',.1f')} "
                f"| {_spread([b.score_per_bid for b in group], '.4g')} |"
            )
    return lines


def small_client_stats(runs: Mapping[str, Sequence[Record]]) -> list[SmallClients]:
    """:func:`small_clients` for each policy with FLMarket runs (of :func:`auction_arm`)."""
    out = []
    arm = auction_arm(runs)
    for folder in POLICIES:
        rows = bidders(runs.get(folder, []), arm)
        if rows:
            out.append(small_clients(folder, rows))
    return out


def rank_lines(stats: Sequence[SmallClients]) -> list[str]:
    """The rank correlations with volume and the winners in the smaller half, per policy."""
    lines = [
        "| bids | auctions | bidders | Spearman(N_e, u_e / b_e), all bidders | the same within an auction: median "
        "(range) | Spearman(N_e, u_e), all bidders | winners in the smaller half of their auction |",
        "|---|---:|---:|---:|---|---:|---:|",
    ]
    for s in stats:
        lines.append(
            f"| {s.policy} | {s.partitions} | {s.bidders} | {_f(s.spearman_per_bid)} "
            f"| {_spread(s.per_partition_per_bid, '+.2f')} | {_f(s.spearman_score)} | {s.smallest_half:.0%} |"
        )
    return lines


def small_client_reading(stats: Sequence[SmallClients]) -> list[str]:
    """The section's reading, from the computed statistics: is the score sub-linear, and what the ranking does."""
    if not stats:
        return ["No FLMarket runs with recorded scores and bids."]
    slopes = [v for v in stats[0].elasticity if not math.isnan(v)]
    below = sum(v < 1 for v in slopes)
    median = float(np.median(slopes)) if slopes else math.nan
    sub_linear = bool(slopes) and median < 1
    lines = [
        f"* **The score is {'sub-linear' if sub_linear else 'not sub-linear'} in the client's volume.** Within each "
        f"auction, the least-squares slope of ln u_e on ln N_e is {_spread(slopes, '.2f')} over {len(slopes)} "
        f"partitions (below 1 in {below}); 1 would be a score proportional to volume. The same partitions are "
        "auctioned under both policies (the partition depends on the seed, not on the bids), so this is one "
        "statistic for both.",
    ]
    for s in stats:
        direction = "falls" if s.spearman_per_bid < 0 else "rises" if s.spearman_per_bid > 0 else "does not vary"
        lines.append(
            f"* **{s.policy.capitalize()} bids**: score per bid {direction} with volume (Spearman "
            f"{_f(s.spearman_per_bid)} over all {s.bidders} bidders; the score itself: {_f(s.spearman_score)}); "
            f"{s.smallest_half:.0%} of the winners are in the smaller half of their auction's clients."
        )
    lines.append(
        "* **The hypothesis** (a score sub-linear in N_e divided by a bid linear in N_e ranks the smallest clients "
        "first) "
        + (
            "**holds**: with volume bids, u_e / b_e is u_e / N_e up to one shared factor, and it falls with N_e."
            if sub_linear and any(s.policy == "volume" and s.spearman_per_bid < 0 for s in stats)
            else "**does not hold** on these runs."
        )
    )
    return lines


PAPER_MECHANISM = (
    "**Does the paper's mechanism imply it?** Yes, once bids are proportional to volume. Algorithm 1 sorts the "
    "clients by score per bid and admits them in that order while `b_e <= R/2 u_e / U(S + e)` (paper, section 3.3, "
    "*Winner Selection*; BRIEF.md section 2). The score (paper, section 3.2, *Score Function*, Eq. (1)-(2)) is "
    "`u_e = sum_c theta_c phi(n_e^c)` with `phi(x) = sum_{t<=x} -ln(min(t/alpha, 1))`: each further sample of a "
    "class adds `ln(alpha/t)`, less than the one before, and nothing beyond `alpha = N_s/(E C)` -- the diminishing "
    "value of volume the paper builds in on purpose (its Observation 1). A concave score over a linear bid is a "
    "falling score per bid, so the auction reaches for the smallest clients first. The paper does not state its "
    "bid policy (BRIEF.md section 3); its section 5.2 (*The Data Distribution of Selected Clients*) reports that "
    'FLMarket "chooses clients with lower data quantities" than DICE, in the same direction as here but mildly '
    "(its Table 2 set holds 0.887 of DICE's volume). Equal bids rank by the score alone, which rises with volume."
)


@dataclass(frozen=True)
class Bought:  # pylint: disable=too-many-instance-attributes
    """What one arm trained on under one policy, over its runs (the paper's Table 2 analogue).

    Attributes
    ----------
    policy, arm : str
        The grid's folder and the selector (``all``/``rs`` is every client).
    runs : int
        Its runs.
    clients : float
        Median clients trained.
    volumes : list of float
        Samples bought, per run.
    pool_share, rarest_share : float
        Mean share of the pool's samples, and of the pool's rarest class, that the arm bought.
    smallest_class : float
        Mean share of the bought data held by its smallest class (``0.1`` balanced over 10 classes; ``0`` when a
        class is missing); NaN when nothing was bought.
    absent : float
        Mean number of classes absent from the bought data.
    auc : float
        Mean ``auc`` over the arm's runs that did not diverge.
    """

    policy: str
    arm: str
    runs: int
    clients: float
    volumes: list[float]
    pool_share: float
    rarest_share: float
    smallest_class: float
    absent: float
    auc: float


def bought(runs: Mapping[str, Sequence[Record]]) -> list[Bought]:
    """:class:`Bought` for each arm under each policy, then every client (``all``) once."""
    out = []
    for folder, arm in [(folder, arm) for folder in POLICIES for arm in ARMS] + [("all", "rs")]:
        rows = [r for r in runs.get(folder, []) if arm_of(r) == arm]
        if not rows:
            continue
        counts = [np.asarray(r["selected_class_totals"], dtype=float) for r in rows]
        pools = [np.asarray(r["pool_class_totals"], dtype=float) for r in rows]
        smallest = [b.min() / b.sum() for b in counts if b.sum() > 0]
        auc = list(arm_values(rows, arm, "auc").values())
        out.append(
            Bought(
                policy=folder,
                arm=arm,
                runs=len(rows),
                clients=float(np.median([len(r["selected_partitions"]) for r in rows])),
                volumes=[float(b.sum()) for b in counts],
                pool_share=float(np.mean([b.sum() / p.sum() for b, p in zip(counts, pools, strict=True)])),
                rarest_share=float(
                    np.mean([b[int(np.argmin(p))] / p.min() for b, p in zip(counts, pools, strict=True)])
                ),
                smallest_class=float(np.mean(smallest)) if smallest else math.nan,
                absent=float(np.mean([(b == 0).sum() for b in counts])),
                auc=float(np.mean(auc)) if auc else math.nan,
            )
        )
    return out


def bought_lines(rows: Sequence[Bought]) -> list[str]:
    """The Table 2 analogue in Markdown."""
    lines = [
        "| bids | arm | runs | clients: median | samples bought: median (range) | share of the pool's samples "
        "| share of the pool's rarest class | smallest class in the bought data | classes absent: mean | auc: mean |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for b in rows:
        everyone = b.policy == "all"
        lines.append(
            f"| {'-' if everyone else b.policy} | {'all clients' if everyone else b.arm} | {b.runs} "
            f"| {_count(b.clients)} | {_spread(b.volumes)} | {b.pool_share:.3f} | {b.rarest_share:.3f} "
            f"| {b.smallest_class:.1%} | {b.absent:.2f} | {b.auc:.2f} |"
        )
    return lines


def bought_reading(rows: Sequence[Bought]) -> list[str]:
    """What each bid policy buys with each FLMarket arm, against the best other (not FLMarket) arm and all clients,
    from the table."""
    everyone = next((b for b in rows if b.policy == "all"), None)
    lines = []
    for folder in POLICIES:
        others = [b for b in rows if b.policy == folder and not is_flmarket(b.arm) and not math.isnan(b.auc)]
        for mine in (b for b in rows if b.policy == folder and is_flmarket(b.arm)):
            if not others:
                continue
            best = max(others, key=lambda b: b.auc)
            tail = f"; all clients {everyone.auc:.2f}" if everyone is not None else ""
            lines.append(
                f"* **{folder.capitalize()} bids**: {arm_label(mine.arm)} buys {mine.pool_share:.1%} of the pool's "
                f"samples but {mine.rarest_share:.1%} of its rarest class ({mine.rarest_share / mine.pool_share:.1f} "
                f"times its share of the samples; {best.arm.upper()}: {best.rarest_share / best.pool_share:.1f}), "
                f"with {mine.absent:.2f} classes absent on average; mean auc {mine.auc:.2f} against the best other "
                f"arm's {best.auc:.2f} ({best.arm.upper()}){tail}."
            )
    return lines


# --- deviations from the paper ---------------------------------------------------------------------------------------
def config_values(records: Sequence[Record], key: str) -> str:
    """The distinct values of one engine config field over ``records``, as text (``not recorded`` if none)."""
    found = sorted({str(r["engine"]["config"][key]) for r in records if key in r["engine"].get("config", {})})
    return ", ".join(found) if found else "not recorded"


def compute_estimate(records: Sequence[Record], clients: int = 100) -> tuple[float, float] | None:
    """The recorded wall time of ``records`` and an estimate of the same grid at ``clients`` clients, in seconds.

    With a fixed number of local steps, a round's training time grows with the cohort, and the cohort with the
    federation (``k`` of ``E`` as a share, as the paper's 25/50/75 of 100): each run's recorded training time
    (the sum of its ``round_time_s``) is scaled by ``clients / num_clients``; evaluation and set-up are kept.
    ``None`` when a record lacks its ``timings``.
    """
    measured = estimated = 0.0
    for record in records:
        wall = record.get("timings", {}).get("job_wall_s")
        if wall is None:
            return None
        training = sum(float(r.get("round_time_s") or 0.0) for r in record["rounds"])
        measured += float(wall)
        estimated += float(wall) + (clients / int(record["num_clients"]) - 1.0) * training
    return measured, estimated


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h"


def deviation_lines(runs: Mapping[str, Sequence[Record]], prereg: str | None = None) -> list[str]:
    """Each deviation from the paper's protocol, what the grid did (read from its records) and why; ``prereg`` names
    the grid's pre-registration where it has one of its own."""
    every = [r for records in runs.values() for r in records]
    policy_fractions = "; ".join(
        f"{folder} bids `budget_fraction` {config_values(runs.get(folder, []), 'budget_fraction')}"
        for folder in POLICIES
    )
    distributions = sorted({str(r["distribution"]) for r in every})
    pools = {
        d: np.asarray(next(r["pool_class_totals"] for r in every if r["distribution"] == d), dtype=int)
        for d in distributions
    }
    schedule = config_values(every, "schedule")
    keep = ", ".join(f"{d} {LINEAR_MIN_KEEP_RATIO[d]:g}" for d in distributions if d in LINEAR_MIN_KEEP_RATIO)
    totals = "; ".join(f"{d}: {p.max():,} down to {p.min():,} per class" for d, p in pools.items())
    partitions = len({unit(r) for r in every})
    clients = federation_size(runs)
    estimate = compute_estimate(every)
    if estimate is None:
        cost = "its compute is unmeasured here (the records lack timings)."
    elif clients != REGISTERED_CLIENTS:
        cost = (
            f"its {len(every)} runs took {_hours(estimate[0])} of recorded job wall time (selection, training and "
            "evaluation; not process start-up), one job at a time at the lowest CPU priority on a 2-core machine "
            "shared with other work."
        )
    else:
        measured, at_100 = estimate
        cost = (
            f"this grid's {len(every)} runs took {_hours(measured)} of recorded job wall time (selection, "
            f"training and evaluation; not process start-up), one job at a time on a "
            f"2-core machine shared with other work; the same design at 100 clients (cohorts five times larger, "
            f"training time scaled with them, evaluation kept) is estimated at {_hours(at_100)} for {partitions} "
            f"partitions, {_hours(at_100 * 9 / max(partitions, 1))} for 3 seeds on d4-d6 (9 partitions)."
        )
    market = config_values(every, "market")
    where = "above" if runs.get("all") else "of the main grid's report, results/fashion_mnist_main/REPORT.md"
    return [
        "| | the paper | this grid (from its records) | why |",
        "|---|---|---|---|",
        f"| training length | 600 rounds, fixed (section 5.1) | {config_values(every, 'rounds')} rounds, fixed; "
        f"primary endpoint `auc` = mean test accuracy over rounds 1-30; `final` = mean of the last "
        f"{config_values(every, 'final_window')} | 2 cores; the pilot (`simulations/PILOT.md` sections 2-3) found "
        f"that the plateau hid the selectors and that a fixed budget leaves room (the headroom table {where}): like "
        "the paper's 600 rounds of a data-hungry model, it measures learning speed |",
        f"| optimiser | initial learning rate 0.003 (CIFAR-10, DEAP), 0.001 (CINIC-10); optimiser and local work "
        f"not stated (section 5.1) | SGD, lr {config_values(every, 'learning_rate')}, momentum "
        f"{config_values(every, 'momentum')}, batch {config_values(every, 'batch_size')}, gradient norm clipped at "
        f"{config_values(every, 'clip_norm')} | the pilot's protocol: a small CNN that learns within 30 rounds |",
        f"| local work | not stated | {config_values(every, 'local_steps')} SGD steps per round for every selected "
        "client whatever its size (a client with fewer samples than steps x batch passes over its data more than "
        "once; FedAvg still weights by sample count) | equal compute per client; the pilot found 5 steps changed "
        "the headroom by little (PILOT.md section 2) |",
        f"| secure aggregation | PASS before scoring (section 4) | `market` = {market}: the grid sums the clients' "
        "label counts in the clear; PASS returns exactly that sum (integers mod 2^64, `tests/test_pass_protocol.py`) "
        'and `market="protocol"` picks the same winners (`tests/test_engine.py`), so scores, winners and '
        "payments are those PASS would give | PASS changes who learns the counts, not the counts: no effect on "
        "selection or accuracy |",
        "| DICE, DDS | the authors' methods | reconstructions from their papers (no public code; "
        "`simulations/baselines/selectors.py`), DICE volume weight "
        f"{config_values(every, 'dice_volume_weight')}, DDS diversity weight "
        f"{config_values(every, 'dds_diversity_weight')} | no code to run |",
        f"| data and model | CIFAR-10, CINIC-10 (ResNet-56), DEAP (3-layer CNN) | {config_values(every, 'dataset')}, "
        f"`{config_values(every, 'model')}` | no CIFAR/CINIC on these machines; 2 cores |",
        (
            f"| clients | 20 and 100 | {clients}; the 100-client grid was not run: {cost} | 2 cores |"
            if clients == REGISTERED_CLIENTS
            else f"| clients | 20 and 100 | {clients}: secondary, exploratory, not pre-registered ({partitions} "
            f"partitions; the pre-registered grid is the {REGISTERED_CLIENTS}-client one); {cost} | 2 cores |"
        ),
        f"| partition | Dirichlet 0.5 over clients (section 5.1) | Dirichlet "
        f"{config_values(every, 'alpha')} | the pilot's headroom: at 0.5 all 20 clients were no better than the "
        "best 15 |",
        f"| global distribution | D1-D6 by pruning (Table 2: rarest four classes 40/30/20/10% of the balanced size) "
        f"| `{schedule}` schedule: class of rank r keeps 1 - (1 - rho) r / 9 of its samples, rho = {keep}; the "
        f"pools: {totals} | the paper's Table 2 tail |",
        f"| budget and cohort | k of {clients} fixed ({PAPER_COHORTS.get(clients, 'not run')}); R and the bid policy "
        "not stated | the budget mode: "
        f"R = f x total bid, fixed before selection ({policy_fractions}), no cohort cap; "
        + (
            "each baseline buys in its own order within the same R at the same bids, each client paid its bid "
            f"(pay-as-bid) | the buyer's question at equal money{f' ({prereg})' if prereg else ''}; both bid "
            "policies co-primary |"
            if grid_match(runs) == "budget"
            else "each baseline takes as many clients as FLMarket buys on the same partition | a budget that decides "
            "the cohort (PILOT.md section 4); both bid policies co-primary |"
        ),
        *rule_deviation(every),
    ]


def rule_deviation(records: Sequence[Record]) -> list[str]:
    """The auction's budget rule as a deviation row, where any FLMarket run of ``records`` used the whole budget."""
    rules = sorted({budget_rule(r) for r in records if r["selector"] == FLMARKET})
    if "whole" not in rules:
        return []
    return [
        "| auction budget rule | Algorithm 1 admits client e while b_e <= R/2 u_e / U(S + e): its payments add up "
        f"to at most R/2 (section 3.3) | `auction_budget_rule` = {', '.join(rules)}: the whole-budget rule walks the "
        "same ranking at R, each winner paid one price per unit of score, p* u_e, in total at most R "
        "(`docs/mechanism.md`) | FLMarket's value is additive (U(S) = sum of u_e), for which the walk at the whole "
        "budget is still truthful, individually rational and within R; the paper's rule spent half of R |"
    ]


# --- what reproduces --------------------------------------------------------------------------------------------------
PAPER_HEADLINE = (22, 27, 10.0)
"""The paper's section 5.2: FLMarket highest in 22 of 27 D4-D6 settings; section 1: more than 10% over baselines."""


def top_counts(records: Sequence[Record], arm: str = FLMARKET) -> tuple[float, int, float, int, int]:
    """``arm``'s share of the top ``auc`` over the partitions every arm of the comparison finished (ties shared), the
    partitions, in how many distributions its mean ``auc`` is the highest, of how many, and the number of arms.

    The arms are ``arm`` and the baselines of :data:`ARMS` with runs in ``records`` (an arm the grid did not run is
    left out; the other FLMarket arm is no baseline of the paper's headline)."""
    values = {name: arm_values(records, name, "auc") for name in ARMS if name == arm or not is_flmarket(name)}
    arms = [name for name in values if values[name]]
    shared = sorted(set.intersection(*(set(values[name]) for name in arms))) if arm in arms else []
    if not shared or len(arms) < 2:
        return 0.0, 0, 0, 0, len(arms)
    matrix = np.array([[values[name][key] for name in [arm, *(a for a in arms if a != arm)]] for key in shared])
    wins = float(top_shares(matrix, 0).sum())
    distributions = sorted({key[0] for key in shared})
    by_d = np.array([matrix[[k[0] == d for k in shared]].mean(axis=0) for d in distributions])
    return wins, len(shared), float(top_shares(by_d, 0).sum()), len(distributions), len(arms)


_COUNT_WORDS = {2: "two", 3: "three", 4: "four", 5: "five"}
UNDETECTED = "not detected at this size"
"""The reading of a contrast that does not reject (or whose interval covers 0): never "level" or "equal"."""


def _side(c: Contrast, p: float) -> str:
    """``ahead``, ``behind`` or :data:`UNDETECTED`: by Holm's p where the contrast is in a tested family (``p`` not
    NaN), by the 95% interval otherwise."""
    significant = p < 0.05 if not math.isnan(p) else (c.ci_low > 0 or c.ci_high < 0)
    if not significant:
        return UNDETECTED
    return "ahead" if c.mean > 0 else "behind"


def _sides_text(subject: str, sides: Mapping[str, Sequence[str]]) -> str:
    """``subject is ahead of A; behind B; its difference from C is not detected at this size``."""
    said = "; ".join(f"{word} {', '.join(sides[side])}" for side, word in (("ahead", "ahead of"), ("behind", "behind"))
                     if sides.get(side))  # fmt: skip
    null = list(sides.get(UNDETECTED, []))
    if not null:
        return f"{subject} is {said}"
    differences = f"difference{'s' if len(null) > 1 else ''} from {', '.join(null)}"
    verb = "are" if len(null) > 1 else "is"
    if said:
        return f"{subject} is {said}; its {differences} {verb} {UNDETECTED}"
    return f"{subject}'s {differences} {verb} {UNDETECTED}"


def reproduce_lines(
    runs: Mapping[str, Sequence[Record]], primary: Sequence[Contrast], adjusted: Sequence[float] | None
) -> list[str]:
    """What of the paper's headline reproduces under each bid policy, from the computed contrasts.

    The headline is the paper's mechanism's: it is read on FLMarket under the paper's rule (:func:`auction_arm`);
    where that arm is the primary one, RS and DICE are read by Holm's p over the primary family, else by the 95%
    interval, as QBS and DDS always are."""
    wins_paper, settings_paper, margin_paper = PAPER_HEADLINE
    arm = auction_arm(runs)
    tested = bool(primary) and primary[0].arm == arm
    if not tested:
        primary, adjusted = contrasts(runs, "auc", PRIMARY_BASELINES, arm), None
    secondary = contrasts(runs, "auc", SECONDARY_BASELINES, arm)
    holm_p = dict(zip([(c.policy, c.baseline) for c in primary], adjusted or [math.nan] * len(primary), strict=True))
    lines = []
    for folder in POLICIES:
        rows = [c for c in (*primary, *secondary) if c.policy == folder and c.partitions]
        if not rows:
            continue
        sides: dict[str, list[str]] = defaultdict(list)
        for c in rows:
            sides[_side(c, holm_p.get((c.policy, c.baseline), math.nan))].append(f"{c.baseline.upper()} ({_f(c.mean)})")
        margin = float(np.mean([c.mean for c in rows]))
        wins, partitions, best, distributions, arms = top_counts(runs.get(folder, []), arm)
        if not sides["behind"] and len(sides["ahead"]) == len(rows):
            verdict = "reproduces in direction" + (" and size" if margin >= margin_paper else ", not in size")
        elif sides["ahead"]:
            verdict = "reproduces in part"
        else:
            verdict = "does not reproduce"
        primary_count = _COUNT_WORDS.get(len(holm_p), str(len(holm_p)))
        how = (
            f"RS and DICE by Holm's p over the primary {primary_count}, QBS and DDS by the 95% interval"
            if tested and adjusted is not None
            else "each by its 95% interval"
        )
        highest = (
            f"It has the highest auc of the {_COUNT_WORDS.get(arms, str(arms))} arms in {wins:g} of {partitions} "
            f"partitions ({wins / partitions:.0%}; chance {1 / arms:.0%}) and the highest mean in {best:g} of "
            f"{distributions} distributions (the paper: highest in {wins_paper} of {settings_paper} D4-D6 settings, "
            f"{wins_paper / settings_paper:.0%}); "
            if partitions
            else ""
        )
        lines.append(
            f"* **{folder.capitalize()} bids: the headline {verdict}.** {_sides_text(arm_label(arm), sides)}"
            f" (mean auc difference in points; {how}). {highest}"
            f"{'its' if highest else 'Its'} mean margin over the {_COUNT_WORDS.get(len(rows), str(len(rows)))} "
            f"baselines is {margin:+.1f} points (the paper: more than {margin_paper:g}%)."
        )
    if arm != lead_arm(runs):
        lines.append(
            f"* The headline is the paper's mechanism's, so it is read on FLMarket under the paper's rule; the "
            f"whole-budget rule ({arm_label(lead_arm(runs))}) is this product's, and its contrasts are the primary "
            "ones above."
        )
    partitions = len({unit(r) for records in runs.values() for r in records})
    lines.append(
        "* The measures differ: the paper reports one run per setting at the end of 600 rounds; this grid pairs "
        f"{partitions} partitions at mean accuracy over 30 rounds, so its 'highest' counts partitions, not settings."
    )
    clients = federation_size(runs)
    if clients != REGISTERED_CLIENTS:
        lines.append(
            f"* This {clients}-client grid is secondary and exploratory, not pre-registered: these readings describe "
            f"its {partitions} partitions and confirm nothing; the pre-registered answer is the "
            f"{REGISTERED_CLIENTS}-client grid's."
        )
    return lines


def power_sentence(primary: Sequence[Contrast], effect: float = 3.0) -> str:
    """The partitions a paired t-test would need to detect ``effect`` points at 80% power (alpha 0.05) at each
    primary contrast's own paired sd; empty when no contrast has one."""
    sds = [c.sd for c in primary if math.isfinite(c.sd) and c.sd > 0]
    if not sds:
        return ""
    needed = [partitions_for(sd, effect) for sd in sds]
    return (
        f" At its own paired sd ({', '.join(f'{sd:.1f}' for sd in sds)} points over the primary contrasts), a "
        f"two-sided paired t-test would need {min(needed)} to {max(needed)} partitions to detect {effect:g} points "
        "at 80% power (alpha 0.05)."
    )


@dataclass(frozen=True)
class Registration:
    """A grid's pre-registration, as its document states it.

    Attributes
    ----------
    source : str
        The document, as the report names it (``results/<grid>/PREREG.md``, or the main grid's
        ``simulations/PILOT.md`` section 6).
    seeds : tuple of int
        The registered seeds, first and last (inclusive).
    distributions : tuple of str
        The registered distributions; a partition is a (distribution, seed).
    partitions : int
        The registered partitions.
    script : str or None
        The command that runs the grid, when the document names one.
    clients : int or None
        The registered federation size, where the report must check it (the main grid's 20).
    """

    source: str
    seeds: tuple[int, int]
    distributions: tuple[str, ...]
    partitions: int
    script: str | None
    clients: int | None = None

    @property
    def units(self) -> set[tuple[str, int]]:
        """The registered partitions, as (distribution, seed)."""
        first, last = self.seeds
        return {(d, seed) for d in self.distributions for seed in range(first, last + 1)}

    @property
    def is_prereg(self) -> bool:
        """Whether the grid has a PREREG.md of its own (which registers its secondary analyses too)."""
        return self.source.endswith("PREREG.md")


PREREG_SEEDS = re.compile(r"\*\*Seeds: (\d+)-(\d+)\*\* on each of ([^:]+?): \*\*(\d+) partitions\*\*")
"""A PREREG.md's registration line: ``**Seeds: A-B** on each of d4, d5, d6: **N partitions**``."""
PILOT_SEEDS = re.compile(r"\*\*Pre-registered: (\d+) partitions, \d+ seeds \((\d+)-(\d+)\) on each of ([^.*]+)\.\*\*")
"""The main grid's registration line in simulations/PILOT.md section 6."""


def _registration(  # pylint: disable=too-many-arguments
    source: str, seeds: tuple[int, int], where: str, partitions: int, script: str | None, clients: int | None = None
) -> Registration:
    """A :class:`Registration` from its document's line, checked: the seeds on the distributions are the partitions."""
    distributions = tuple(d.strip() for d in re.split(r",|\band\b", where) if d.strip())
    found = Registration(source, seeds, distributions, partitions, script, clients)
    if len(found.units) != partitions:
        raise ValueError(
            f"{source} registers {partitions} partitions, but seeds {seeds[0]}-{seeds[1]} on "
            f"{', '.join(distributions)} are {len(found.units)}"
        )
    return found


def registration(raw: Path, runs: Mapping[str, Sequence[Record]]) -> Registration | None:
    """The grid's pre-registration: the ``PREREG.md`` beside ``raw/`` (its ``**Seeds: A-B** on each of ...: **N
    partitions**`` line); for a cohort-matched grid without one, the main grid's (simulations/PILOT.md section 6, a
    :data:`REGISTERED_CLIENTS`-client federation); ``None`` for any other grid.

    Raises
    ------
    ValueError
        A PREREG.md without its registration line, or whose partitions do not add up.
    """
    prereg = raw.parent / "PREREG.md"
    if prereg.is_file():
        text = prereg.read_text(encoding="utf-8")
        found = PREREG_SEEDS.search(text)
        if found is None:
            raise ValueError(f"{prereg} has no '**Seeds: A-B** on each of ...: **N partitions**' line")
        script = re.search(r"\bbash (simulations/\S+\.sh)", text)
        return _registration(
            f"{raw.parent.as_posix()}/PREREG.md",
            (int(found[1]), int(found[2])),
            found[3],
            int(found[4]),
            script=f"bash {script[1]}" if script else None,
        )
    if grid_match(runs) != "cohort" or not PILOT.is_file():
        return None
    found = PILOT_SEEDS.search(PILOT.read_text(encoding="utf-8"))
    if found is None:
        return None
    return _registration(
        "simulations/PILOT.md section 6",
        (int(found[2]), int(found[3])),
        found[4],
        int(found[1]),
        script=COHORT_SCRIPT,
        clients=REGISTERED_CLIENTS,
    )


def finished_partitions(runs: Mapping[str, Sequence[Record]]) -> set[tuple[str, int]]:
    """The partitions with a finished run (diverged or not) of every primary arm under both bid policies: the lead
    arm (:func:`lead_arm`) and the primary baselines the grid runs (none when a policy or an arm has no run yet)."""
    arms = {lead_arm(runs)} | (arms_run(runs) & set(PRIMARY_BASELINES))
    done = [{unit(r) for r in runs.get(folder, []) if arm_of(r) == arm} for folder in POLICIES for arm in sorted(arms)]
    return set.intersection(*done) if done else set()


def _seed_text(seeds: Sequence[int]) -> str:
    """Seeds as ranges: ``200-204, 207``."""
    out: list[str] = []
    for seed in sorted(set(seeds)):
        if out and out[-1].split("-")[-1] == str(seed - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{seed}"
        else:
            out.append(str(seed))
    return ", ".join(out)


def _distribution_text(distributions: Sequence[str]) -> str:
    """``d4-d6`` for consecutive ``dN``, else the names."""
    names = sorted(set(distributions))
    numbers = [int(d[1:]) for d in names if re.fullmatch(r"d\d+", d)]
    if len(names) > 1 and len(numbers) == len(names) and numbers == list(range(numbers[0], numbers[-1] + 1)):
        return f"{names[0]}-{names[-1]}"
    return ", ".join(names)


def grid_status(registration: Registration | None, runs: Mapping[str, Sequence[Record]]) -> tuple[str, int]:
    """Where the grid stands against its registration: ``complete`` (every registered partition finished in every
    primary arm), ``interim``, ``other`` (runs of partitions or of a federation size the registration does not
    name) or ``unregistered``; and the registered partitions finished."""
    if registration is None:
        return "unregistered", 0
    every = {unit(r) for records in runs.values() for r in records}
    if not every <= registration.units or registration.clients not in (None, federation_size(runs)):
        return "other", 0
    done = finished_partitions(runs) & registration.units
    return ("complete" if done == registration.units else "interim"), len(done)


def _title(runs: Mapping[str, Sequence[Record]], rest: str) -> str:
    """``# <dataset> <rest>``, the dataset named from the records' config."""
    every = [r for records in runs.values() for r in records]
    found = config_values(every, "dataset")
    names = [] if found == "not recorded" else [DATASET_NAMES.get(name, name) for name in found.split(", ")]
    return " ".join(["#", *names, rest])


def _split(runs: Mapping[str, Sequence[Record]]) -> str:
    """``Dirichlet <alpha>, <distributions>`` from the records."""
    every = [r for records in runs.values() for r in records]
    return f"Dirichlet {config_values(every, 'alpha')}, {_distribution_text([unit(r)[0] for r in every])}"


def _training(runs: Mapping[str, Sequence[Record]]) -> str:
    """``<rounds> rounds, <local steps> local steps`` from the records."""
    every = [r for records in runs.values() for r in records]
    return f"{config_values(every, 'rounds')} rounds, {config_values(every, 'local_steps')} local steps"


def _status_line(kind: str, done: int, found: Registration | None, runs: Mapping[str, Sequence[Record]]) -> str:
    """The grid's status in bold, for :func:`grid_status`'s ``kind``."""
    every = [r for records in runs.values() for r in records]
    if found is None:
        return (
            "**Exploratory, not pre-registered** (no PREREG.md beside its raw/ folder): its p-values and Holm's "
            "adjustment are descriptive and decide nothing."
        )
    registered = f"seeds {found.seeds[0]}-{found.seeds[1]} on {', '.join(found.distributions)}"
    if kind == "other":
        ran = f"seeds {_seed_text([unit(r)[1] for r in every])} on {_distribution_text([unit(r)[0] for r in every])}"
        return (
            f"**Not the pre-registered grid: exploratory.** Its registration (`{found.source}`) is {registered} "
            f"({found.partitions} partitions); this grid ran {ran}: its p-values and Holm's adjustment are descriptive "
            "and decide nothing."
        )
    if kind == "complete":
        return (
            f"**All {found.partitions} pre-registered partitions finished: the primary test below is the "
            "pre-registered one.**"
        )
    return (
        f"**Interim: {done} of the {found.partitions} pre-registered partitions finished in every primary arm. The "
        f"registration is {registered}; the pre-registered analysis needs all {found.partitions}; the p-values below "
        "are an unplanned interim look and decide nothing.**"
    )


def header_lines(
    raw: Path, runs: Mapping[str, Sequence[Record]], command: str, primary: Sequence[Contrast]
) -> list[str]:
    """The title, the regenerate command and the grid's status against its own registration (:func:`registration`,
    :func:`grid_status`): pre-registered (complete or interim), or exploratory."""
    clients = federation_size(runs)
    found = registration(raw, runs)
    kind, done = grid_status(found, runs)
    root = raw.parent.as_posix()
    regenerate = f"Regenerate (after `tar -xzf {root}/raw.tar.gz -C {root}`): `{command}`."
    split, training = _split(runs), _training(runs)
    seeds = sorted({unit(r)[1] for records in runs.values() for r in records})
    script = f" Grid: `{found.script}`." if found is not None and found.script else ""
    tested = "" if kind in ("complete", "interim") else " " + power_sentence(primary).strip()
    if grid_match(runs) == "budget":
        whole = lead_arm(runs) == FLMARKET_WHOLE
        payments = (
            "FLMarket pays its critical payments (the paper's rule within R/2, the whole-budget rule within R)"
            if whole
            else "FLMarket pays its critical payments"
        )
        return [
            _title(runs, "budget-rule grid: what the same money buys under each of FLMarket's budget rules")
            if whole
            else _title(runs, "budget-matched grid: what the same money buys"),
            "",
            f"{regenerate} Protocol: {f'`{found.source}`' if found is not None else 'not pre-registered'} (the main "
            f"grid's setting, {clients} clients, {split}, {training}, on seeds {_seed_text(seeds)}; every arm spends "
            f"at most R: {payments}, each baseline buys in its own order within R at the same bids, pay-as-bid)."
            f"{script}",
            "",
            (_status_line(kind, done, found, runs) + tested).rstrip(),
        ]
    source = f"`{found.source}`" if found is not None and found.is_prereg else "`simulations/PILOT.md` section 6"
    protocol = f"Protocol: {source} ({split}, {clients} clients, budget mode, {training})."
    if found is not None and found.clients is not None and clients != found.clients:
        return [
            _title(runs, f"{clients}-client grid: secondary, exploratory, not pre-registered"),
            "",
            f"**Secondary and exploratory, not pre-registered.** The pre-registered grid is the "
            f"{found.clients}-client one (`results/fashion_mnist_main/REPORT.md`, {found.partitions} "
            f"partitions). This grid repeats its protocol at {clients} clients on {len(finished_partitions(runs))} "
            "partitions finished in every primary arm: its p-values and Holm's adjustment are descriptive and decide "
            "nothing." + power_sentence(primary),
            "",
            f"{regenerate} {protocol} Grid: `CLIENTS={clients} {COHORT_SCRIPT} {seeds[0]} {seeds[-1]}`.",
        ]
    return [
        _title(runs, "main grid: FLMarket against the baselines where selection can matter"),
        "",
        f"{regenerate} {protocol}{script}",
        "",
        (_status_line(kind, done, found, runs) + tested).rstrip(),
    ]


def spend_lines(runs: Mapping[str, Sequence[Record]]) -> list[str]:
    """What each arm paid against the budget ``R`` (:func:`simulations.buyer.spend`), per policy."""
    lines = [
        "| bids | arm | runs | payment | clients: median (range) | paid / R: mean (range) | over R |",
        "|---|---|---:|---|---|---|---:|",
    ]
    for folder in POLICIES:
        for arm in ARMS:
            rows = [r for r in runs.get(folder, []) if arm_of(r) == arm]
            if not rows:
                continue
            paid = spend(rows)
            lines.append(
                f"| {folder} | {arm} | {len(rows)} | {paid.rule} | {_spread(paid.clients)} "
                f"| {np.mean(paid.paid_share):.2f} ({min(paid.paid_share):.2f} to {max(paid.paid_share):.2f}) "
                f"| {paid.over_budget} of {len(rows)} |"
            )
    return lines


TIME_TO = (0.6, 0.5)
"""The accuracies of the time-to-accuracy endpoint: the paper's 0.6, and 0.5 beside it."""


def _seconds(value: float, digits: int = 1) -> str:
    """A non-negative number (seconds, an sd) or ``-`` for NaN."""
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def _rounds_text(value: float) -> str:
    return "-" if math.isnan(value) else "censored" if math.isinf(value) else f"{value:g}"


def time_lines(runs: Mapping[str, Sequence[Record]]) -> list[str]:
    """Rounds and seconds to each accuracy of :data:`TIME_TO`, per arm and policy, with the paper's ratios: each arm's
    median rounds over the lead arm's (:func:`lead_arm`) beside the paper's over its FLMarket."""
    every = [r for records in runs.values() for r in records]
    cpu = bool(every) and all(time_to_accuracy(r, TIME_TO[0]).cpu for r in every)
    unit_name = "CPU s" if cpu else "wall s (training + evaluation; these records have no CPU time)"
    lead = lead_arm(runs)
    lines = [
        f"| bids | arm | runs | reach {TIME_TO[0]:g} | rounds to {TIME_TO[0]:g}: median | {unit_name} to "
        f"{TIME_TO[0]:g}: median of those reaching | rounds: arm / {arm_label(lead)} | the paper's ratio | reach "
        f"{TIME_TO[1]:g} | rounds to {TIME_TO[1]:g}: median |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    reference = PAPER_ROUNDS_TO_60[FLMARKET]
    for folder in POLICIES:
        records = runs.get(folder, [])
        mine = median_rounds([time_to_accuracy(r, TIME_TO[0]) for r in records if arm_of(r) == lead])
        for arm in ARMS:
            rows = [r for r in records if arm_of(r) == arm]
            if not rows:
                continue
            first = [time_to_accuracy(r, TIME_TO[0]) for r in rows]
            second = [time_to_accuracy(r, TIME_TO[1]) for r in rows]
            rounds = median_rounds(first)
            ratio = rounds / mine if math.isfinite(rounds) and math.isfinite(mine) and mine > 0 else math.nan
            # The paper's ratios are over its FLMarket: beside the lead arm and the baselines it ran.
            paper = reference if arm == lead else None if is_flmarket(arm) else PAPER_ROUNDS_TO_60.get(arm)
            paper_ratio = f"{paper / reference:.2f} ({paper} / {reference})" if paper else "-"
            lines.append(
                f"| {folder} | {arm} | {len(rows)} | {sum(t.reached for t in first)} | {_rounds_text(rounds)} "
                f"| {_seconds(median_seconds(first))} | {'-' if math.isnan(ratio) else f'{ratio:.2f}'} "
                f"| {paper_ratio} "
                f"| {sum(t.reached for t in second)} | {_rounds_text(median_rounds(second))} |"
            )
    return lines


def time_test_lines(runs: Mapping[str, Sequence[Record]]) -> list[str]:
    """The lead arm (:func:`lead_arm`) against RS and DICE in rounds to :data:`TIME_TO`'s first accuracy: paired
    Wilcoxon, Holm over four."""
    lead = lead_arm(runs)
    rows = []
    for folder in POLICIES:
        records = runs.get(folder, [])

        def times(arm: str, records: Sequence[Record] = records) -> dict[tuple[str, int], TimeTo]:
            return {unit(r): time_to_accuracy(r, TIME_TO[0]) for r in records if arm_of(r) == arm}

        mine = times(lead)
        for baseline in PRIMARY_BASELINES:
            theirs = times(baseline)
            differences = rank_differences(mine, theirs)
            if mine and theirs and differences:
                faster = sum(d < 0 for d in differences)
                rows.append((folder, baseline, len(differences), faster, wilcoxon_p(differences)))
    if not rows:
        return [f"No pair of {arm_label(lead)} and RS or DICE runs on the same partitions."]
    adjusted = holm([row[4] for row in rows])
    lines = [
        f"| bids | {arm_label(lead)} vs | partitions | {arm_label(lead)} reaches {TIME_TO[0]:g} in fewer rounds "
        "| p (Wilcoxon) | p (Holm) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for (folder, baseline, partitions, faster, p_value), p_holm in zip(rows, adjusted, strict=True):
        lines.append(
            f"| {folder} | {baseline} | {partitions} | {faster} of {partitions} | {_p(p_value)} | {_p(float(p_holm))} |"
        )
    return lines


def family(rows: Sequence[Contrast]) -> list[float] | None:
    """Holm's adjusted p over one family of contrasts; ``None`` when a contrast has no t-test (no family to adjust)."""
    return list(holm([c.p_t for c in rows])) if rows and all(not math.isnan(c.p_t) for c in rows) else None


def rule_lines(runs: Mapping[str, Sequence[Record]]) -> list[str]:
    """The two budget rules against each other (the whole-budget rule minus the paper's, ``auc``, per policy, Holm over
    the two), with the reading of each; empty unless the grid ran both."""
    if lead_arm(runs) != FLMARKET_WHOLE or FLMARKET not in arms_run(runs):
        return []
    rows = contrasts(runs, "auc", (FLMARKET,), FLMARKET_WHOLE)
    adjusted = family(rows)
    lines = [
        f"## Secondary: the two budget rules, {arm_label(FLMARKET_WHOLE)} minus FLMarket under the paper's rule (auc, "
        f"Holm over the {_COUNT_WORDS.get(len(rows), str(len(rows)))})",
        "",
        *contrast_lines(rows, adjusted),
        "",
    ]
    for i, c in enumerate(rows):
        side = _side(c, adjusted[i] if adjusted is not None else math.nan)
        said = (
            f"a difference is {UNDETECTED}"
            if side == UNDETECTED
            else f"the whole-budget rule is {side} of the paper's"
            if side == "ahead"
            else "the whole-budget rule is behind the paper's"
        )
        lines.append(
            f"* **{c.policy.capitalize()} bids**: {_f(c.mean)} points [{_f(c.ci_low)}, {_f(c.ci_high)}] over "
            f"{c.partitions} partitions: {said}."
        )
    return [*lines, ""]


def report(raw: Path, command: str) -> str:
    """The Markdown report of the grid under ``raw``."""
    runs = runs_by_policy(raw)
    lead = lead_arm(runs)
    primary = contrasts(runs, "auc", PRIMARY_BASELINES, lead)
    adjusted = family(primary)
    per_distribution: dict[str, list[Contrast]] = defaultdict(list)
    for distribution in ("d4", "d5", "d6"):
        only = {k: [r for r in v if r["distribution"] == distribution] for k, v in runs.items()}
        per_distribution[distribution] = contrasts(only, "auc", PRIMARY_BASELINES, lead)
    found = registration(raw, runs)
    preregistered = found is not None and found.is_prereg and grid_status(found, runs)[0] in ("complete", "interim")
    others = [arm for arm in ARMS if arm != lead and arm in arms_run(runs)]
    secondary = contrasts(runs, "auc", SECONDARY_BASELINES, lead)
    lines = [
        *header_lines(raw, runs, command, primary),
        "",
        "## Primary: auc (mean accuracy over rounds 1-30, points), pooled over d4-d6"
        + (f": {arm_label(lead)} against RS and DICE" if lead != FLMARKET else ""),
        "",
        *contrast_lines(primary, adjusted, lead),
        "",
        *rule_lines(runs),
        f"## Secondary (descriptive): {'QBS and DDS; ' if secondary else ''}the final endpoint",
        "",
        *([*contrast_lines(secondary), ""] if secondary else []),
        *contrast_lines(contrasts(runs, "final", others, lead), arm=lead),
        "",
        "## Each distribution alone (auc, descriptive)",
        "",
    ]
    for distribution, rows in per_distribution.items():
        if rows:  # a distribution with no finished pair yet has no table
            lines += [f"### {distribution}", "", *contrast_lines(rows), ""]
    if runs.get("all"):  # a grid without the all-clients arm has no headroom to show
        clients = federation_size(runs)
        lines += [f"## Headroom: all {clients} clients minus each arm (auc)", "", *headroom_lines(runs), ""]
    lines += ["## What FLMarket bought", "", *market_lines(runs), ""]
    lines += [
        "## What each arm spent against the budget R",
        "",
        "Per run, the amount paid over R: FLMarket its critical payments; a budget-matched baseline its clients' bids "
        "(pay-as-bid); a cohort-matched baseline's cohort priced at its clients' bids (what it would cost "
        "pay-as-bid: cohort-matched arms are not held to R).",
        "",
        *spend_lines(runs),
        "",
        "## Time to accuracy",
        "",
        f"The first round at which test accuracy reaches {TIME_TO[0]:g} (the paper's threshold) and {TIME_TO[1]:g}; "
        "a run that never does in its rounds is censored (the median is `censored` when the upper middle run "
        "is). The seconds are through that "
        f"round, over the runs that reach it; the ratio is the arm's median rounds over {arm_label(lead)}'s (the "
        "paper: FLMarket about 130 rounds, RS 550, DICE 170). "
        + (
            f"Pre-registered as secondary ({found.source})."
            if preregistered and found is not None
            else "Descriptive: not pre-registered for this grid."
        ),
        "",
        *time_lines(runs),
        "",
        "Rounds to the first threshold, paired by partition (censored runs rank last, tied): two-sided Wilcoxon "
        "signed-rank, Holm over the four.",
        "",
        *time_test_lines(runs),
        "",
    ]
    stats, arms = small_client_stats(runs), bought(runs)
    lines += [
        "## Why FLMarket buys the smallest clients under volume bids",
        "",
        "Every bidder of every FLMarket auction of the grid, from the recorded scores, bids and label counts (no "
        "re-run): winners against losers, median (range)."
        + (
            " The auctions are those under the paper's rule; the whole-budget rule ranks the same bidders by the same "
            "u_e / b_e and differs only in where its walk stops."
            if {FLMARKET, FLMARKET_WHOLE} <= arms_run(runs)
            else ""
        ),
        "",
        *bidder_lines(runs),
        "",
        *rank_lines(stats),
        "",
        *small_client_reading(stats),
        "",
        PAPER_MECHANISM,
        "",
        "## What each arm buys (the paper's Table 2 analogue)",
        "",
        "Per run, then averaged over the runs: the smallest class's share of the bought data is 10% when the 10 "
        "classes are balanced and 0% when one is missing; the pool's rarest class is the schedule's most pruned.",
        "",
        *bought_lines(arms),
        "",
        *bought_reading(arms),
        "",
        "## Deviations from the paper",
        "",
        *deviation_lines(runs, found.source if preregistered and found is not None else None),
        "",
        "## What reproduces of the paper's headline",
        "",
        *reproduce_lines(runs, primary, adjusted),
        "",
    ]
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
