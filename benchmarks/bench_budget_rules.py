"""What the buyer's money buys under each budget rule: the paper's ``"half"`` against the whole-budget ``"whole"``.

Run: ``.venv/bin/python -m benchmarks.bench_budget_rules`` (``--markets N`` random markets, ``--grid`` an archived
grid's ``raw.tar.gz``, read in place).

Side by side on the same markets, per rule: the share of ``R`` paid (mean and range) and the winners (mean). The
random markets are seeded (5-50 clients, exponential scores, bids around the score, ``R`` a uniform share of the
total bid in [0.1, 0.9]); the archived grid's FLMarket records give the scores, bids and budgets its auctions ran
with, re-run here under both rules (no training). Figures that do not move with the machine: no timing.
"""

from __future__ import annotations

import argparse
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from flmarket_flwr.pricing import BUDGET_RULES, run_auction

Market = tuple[np.ndarray, np.ndarray, float]


def random_markets(count: int, seed: int = 49) -> Iterator[Market]:
    """``count`` seeded random markets: scores, bids and a budget each."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        size = int(rng.integers(5, 51))
        scores = rng.exponential(1.0, size)
        bids = scores * rng.uniform(0.5, 1.5, size)
        yield scores, bids, float(rng.uniform(0.1, 0.9) * bids.sum())


def grid_markets(archive: Path) -> Iterator[tuple[str, Market]]:
    """Every FLMarket auction recorded in a grid archive, with its bid policy folder (``volume``, ``equal``)."""
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            if not (member.isfile() and member.name.endswith("result.json") and "selector=flmarket" in member.name):
                continue
            handle = tar.extractfile(member)
            assert handle is not None
            market = json.load(handle)["market"]
            folder = Path(member.name).parts[1]
            yield folder, (np.array(market["scores"]), np.array(market["bids"]), float(market["budget"]))


def compare(markets: list[Market]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per rule: the share of ``R`` paid and the winners, market by market."""
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for rule in BUDGET_RULES:
        results = [run_auction(scores, bids, budget, budget_rule=rule) for scores, bids, budget in markets]
        shares = np.array([r.total_payment / budget for r, (_, _, budget) in zip(results, markets, strict=True)])
        out[rule] = shares, np.array([r.winners.size for r in results])
    return out


def print_comparison(name: str, markets: list[Market]) -> None:
    """One line per rule, and the ratios whole / half."""
    table = compare(markets)
    for rule, (shares, winners) in table.items():
        print(
            f"{name:>22} | {rule:>5} | {len(markets):5d} markets | paid / R mean {shares.mean():.3f} "
            f"(range {shares.min():.3f}-{shares.max():.6f}) | winners mean {winners.mean():.1f} "
            f"(range {winners.min()}-{winners.max()})"
        )
    (half_paid, half_won), (whole_paid, whole_won) = table["half"], table["whole"]
    print(
        f"{name:>22} | whole / half: paid {whole_paid.mean() / half_paid.mean():.2f}x, "
        f"winners {whole_won.mean() / half_won.mean():.2f}x"
    )


def main(argv: list[str] | None = None) -> None:
    """Print the comparison on random markets and, if given, on an archived grid's auctions."""
    parser = argparse.ArgumentParser(description="What the budget buys under each budget rule.")
    parser.add_argument("--markets", type=int, default=3000, help="random markets (seeded)")
    parser.add_argument("--grid", type=Path, help="a grid's raw.tar.gz (results/<grid>/raw.tar.gz)")
    args = parser.parse_args(argv)
    if args.markets < 1:
        parser.error(f"--markets must be >= 1, got {args.markets}")
    print_comparison("random markets", list(random_markets(args.markets)))
    if args.grid is not None:
        if not args.grid.is_file():
            parser.error(f"--grid {args.grid}: no such archive")
        by_folder: dict[str, list[Market]] = {}
        for folder, market in grid_markets(args.grid):
            by_folder.setdefault(folder, []).append(market)
        for folder, markets in sorted(by_folder.items()):
            print_comparison(f"{args.grid.parent.name}/{folder}", markets)


if __name__ == "__main__":
    main()
