"""Pricing at scale: the auction against a direct transcription of Algorithm 1, and the score.

Run: ``.venv/bin/python -m benchmarks.bench_pricing`` (add ``--quick`` for a short run).

For each market size the fast auction and, where it finishes in reasonable time, the direct
transcription run on the same instance; the script checks that winners agree exactly and payments to
1e-9 relative, and prints both wall times and their ratio. The score is timed on ``(E, 100)`` count
matrices with counts in the millions, and on ``(E, 10)`` with counts in the thousands (the ``ln(m!)`` table); with
``--score-baseline FILE`` beside another implementation of it (a module with a ``score`` function, e.g. the score
before it was portable: ``git show 5daf122:flmarket_flwr/pricing/score.py > /tmp/score_blas.py``), the two
alternating over three runs, with their largest relative difference.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import ParamSpec, TypeVar

import numpy as np

from flmarket_flwr.pricing import run_auction, score

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from auction_reference import reference_auction  # noqa: E402  (test oracle, not product code)

_Params = ParamSpec("_Params")
_Result = TypeVar("_Result")


def _best_of(
    repeats: int, function: Callable[_Params, _Result], *args: _Params.args, **kwargs: _Params.kwargs
) -> tuple[float, _Result]:
    """Smallest wall time over `repeats` (at least 1) calls, and the last result."""
    start = time.perf_counter()
    result = function(*args, **kwargs)
    best = time.perf_counter() - start
    for _ in range(repeats - 1):
        start = time.perf_counter()
        result = function(*args, **kwargs)
        best = min(best, time.perf_counter() - start)
    return best, result


def _market(size: int, seed: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Scores, bids and a budget that makes about 5% of the bidders win."""
    rng = np.random.default_rng(seed)
    scores = rng.exponential(1.0, size)
    bids = rng.uniform(0.5, 1.5, size)
    return scores, bids, 0.1 * size


def bench_auction(sizes: list[int], reference_limit: int) -> None:
    print(f"{'bidders':>10} {'winners':>8} {'fast (s)':>10} {'direct (s)':>11} {'speed-up':>9}  agree")
    fast_times: dict[int, float] = {}
    for size in sizes:
        scores, bids, budget = _market(size, seed=size)
        fast_time, result = _best_of(3, run_auction, scores, bids, budget)
        fast_times[size] = fast_time
        line = f"{size:>10,} {result.winners.size:>8,} {fast_time:>10.4f}"
        if size <= reference_limit:
            direct_time, (winners, payments) = _best_of(1, reference_auction, scores.tolist(), bids.tolist(), budget)
            agree = result.winners.tolist() == winners and np.allclose(result.payments, payments, rtol=1e-9, atol=0)
            line += f" {direct_time:>11.3f} {direct_time / fast_time:>8.0f}x  {'yes' if agree else 'NO'}"
            if not agree:
                raise SystemExit(f"fast auction and transcription disagree at {size} bidders")
        else:
            why = "--quick" if size <= 100_000 else "O(winners x bidders): about 48,000 x 10^6 steps, days here"
            line += f" {'(skipped)':>11} {'':>9}  ({why})"
        print(line, flush=True)
    if 100_000 in fast_times:
        verdict = "met" if fast_times[100_000] < 1.0 else "NOT met"
        print(f"\ntarget: 100,000 bidders in under 1 s: {fast_times[100_000]:.3f} s ({verdict})")


def _load_score(path: str) -> Callable[..., object]:
    """The ``score`` function of the module in ``path``."""
    spec = importlib.util.spec_from_file_location("score_baseline", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load a module from {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.score


def bench_score(sizes: list[int], baseline: str | None) -> None:
    other = _load_score(baseline) if baseline else None
    header = f"\n{'clients':>10} {'classes':>8} {'counts below':>13} {'score (s)':>18}"
    print(header + (f" {'baseline (s)':>18} {'max rel diff':>13}" if other else ""))
    for size in sizes:
        for num_classes, high in ((100, 3_000_000), (10, 3_000)):
            rng = np.random.default_rng(size)
            counts = rng.integers(0, high, size=(size, num_classes))
            arguments = (counts, counts.sum(axis=0), size)
            ours, theirs = [], []
            for _ in range(3):  # alternating, so that a change of load hits both
                elapsed, result = _best_of(3, score, *arguments)
                ours.append(elapsed)
                if other is not None:
                    elapsed, reference = _best_of(3, other, *arguments)
                    theirs.append(elapsed)
            line = f"{size:>10,} {num_classes:>8} {high:>13,} {min(ours):>8.4f}-{max(ours):.4f}"
            if other is not None:
                expected = np.asarray(reference)
                difference = float(np.max(np.abs(np.asarray(result) - expected) / np.abs(expected)))
                line += f" {min(theirs):>8.4f}-{max(theirs):.4f} {difference:>13.1e}"
            print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, reference up to 10,000 bidders")
    parser.add_argument("--score-baseline", metavar="FILE", help="a module whose score function to time beside ours")
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.python_implementation()} "
        f"{platform.python_version()}, numpy {np.__version__}; load average at start {os.getloadavg()[0]:.2f}\n"
    )
    if args.quick:
        bench_auction([1_000, 10_000, 100_000], reference_limit=10_000)
        bench_score([10_000, 100_000], args.score_baseline)
    else:
        bench_auction([1_000, 10_000, 100_000, 1_000_000], reference_limit=100_000)
        bench_score([10_000, 100_000], args.score_baseline)


if __name__ == "__main__":
    main()
