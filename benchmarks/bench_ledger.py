"""What the release ledger costs: markets refused under churn, and the time of one check-and-record.

Run: ``.venv/bin/python -m benchmarks.bench_ledger`` (add ``--quick`` for a short run).

The ledger never changes a released ``N_s`` (PASS stays exact), so the selection of a released market is the
one without the ledger; its cost is availability. Part 1 simulates ``R`` consecutive markets over ``E``
clients, each present in a run with probability ``q``, every client keeping a ledger: at the mask step each
member checks the roster ``U1`` and the refusers stay out; the survivors ``U3`` check again at unmask; the sum
is released when ``|U3| >= 3`` and every survivor keeps ``t = (|U3| - 1) // 2 + 1`` releasing peers (complete
graph); the releasing members record ``U3``. It prints the share of markets released, and the share of the
clients present that the released sums held, without and with the buyer's :func:`plan_roster` (which picks a
roster that no ledger refuses, leaving some clients out instead). Part 2 times
:meth:`ReleaseLedger.record_release` on a real file with ``H`` earlier records of ``E`` members each.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass

import numpy as np

from flmarket_flwr.market.wire.ledger import ReleaseLedger, isolates_a_small_group, plan_roster
from simulations.baselines.selectors import select_flmarket


@dataclass
class Cost:
    """What the ledger cost over one sequence of markets (means over the released markets)."""

    released: float  # share of the markets that released a sum
    present_in_sum: float  # share of the clients present that the released sum held
    proportion_error: float  # L1 distance of N_s / |N_s| from that over all present clients
    winners_kept: float  # share of the winners without the ledger that win with it
    volume_kept: float  # winners' data volume with the ledger / without


def federation(num_clients: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Counts ``(E, 10)``: 5,000 per class split over the clients by Dirichlet(0.5); cost-based bids (markup 0.2)."""
    rng = np.random.default_rng(10_000 + seed)
    counts = np.stack([rng.multinomial(5000, rng.dirichlet(np.full(num_clients, 0.5))) for _ in range(10)], axis=1)
    bids = rng.uniform(0.5, 1.5, num_clients) * np.maximum(counts.sum(axis=1), 1) * 1.2
    return counts, bids


def selection(counts: np.ndarray, bids: np.ndarray, members: list[int]) -> set[int]:
    """FLMarket's winners (cohort cap E/4, least budget that buys it) among ``members``."""
    chosen = select_flmarket(counts[members], max(1, len(members) // 4), bids=bids[members])
    return {members[int(i)] for i in chosen}


def simulate(num_clients: int, presence: float, runs: int, min_change: int, seed: int, *, planned: bool) -> Cost:
    """``runs`` consecutive markets over one federation whose clients all keep a ledger."""
    rng = np.random.default_rng(seed)
    counts, bids = federation(num_clients, seed)
    history: list[list[frozenset[str]]] = [[] for _ in range(num_clients)]
    buyer: list[list[int]] = []

    def refuses(client: int, members: frozenset[str]) -> bool:
        return any(isolates_a_small_group(p, members, min_change) for p in history[client] if p != members)

    rows = []
    for _ in range(runs):
        present = [c for c in range(num_clients) if rng.random() < presence]
        roster = plan_roster(present, buyer, min_change) if planned else present
        u1 = frozenset(map(str, roster))
        survivors = [c for c in roster if not refuses(c, u1)]
        u3 = frozenset(map(str, survivors))
        if len(survivors) < 3:
            continue
        releasing = {c for c in survivors if not refuses(c, u3)}
        threshold = (len(survivors) - 1) // 2 + 1
        if not all(len(releasing - {u}) >= threshold for u in survivors):
            continue
        buyer.append(survivors)
        for c in releasing:
            history[c].append(u3)
        full, kept = counts[present].sum(axis=0), counts[survivors].sum(axis=0)
        before, after = selection(counts, bids, present), selection(counts, bids, survivors)
        volume = counts.sum(axis=1)
        rows.append(
            (
                len(survivors) / len(present),
                float(np.abs(kept / kept.sum() - full / full.sum()).sum()),
                len(before & after) / len(before),
                volume[list(after)].sum() / volume[list(before)].sum(),
            )
        )
    if not rows:
        return Cost(0.0, 0.0, float("nan"), 0.0, 0.0)
    means = np.mean(rows, axis=0)
    return Cost(len(rows) / runs, *map(float, means))


def time_record(num_members: int, history: int, repeats: int) -> float:
    """Median seconds of one ``record_release`` with ``history`` earlier records (disjoint from the new one)."""
    with tempfile.TemporaryDirectory() as folder:
        ledger = ReleaseLedger(folder)
        for run in range(history):
            ledger.record_release(run, b"h%d" % run, [b"m%d" % (run * num_members + i) for i in range(num_members)])
        times = []
        for k in range(repeats):
            members = [b"new%d-%d" % (k, i) for i in range(num_members)]
            start = time.perf_counter()
            ledger.record_release(10**6 + k, b"n%d" % k, members)
            times.append(time.perf_counter() - start)
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    seeds, runs = (3, 20) if args.quick else (5, 30)
    print(f"## What the ledger costs over {runs} consecutive markets (mean over {seeds} seeds)")
    print(
        "\nReleased: share of the markets that released a sum. In sum: share of the present clients in it. "
        "N_s error: L1 distance of the class proportions from those over all present clients. Winners kept: "
        "share of the no-ledger winners (FLMarket, cohort E/4) that still win. Volume: winners' data, with / "
        "without.\n"
    )
    print("| E | q | d | buyer | released | in sum | N_s error | winners kept | volume |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for num_clients in (20, 100):
        for presence in (1.0, 0.99, 0.95, 0.9, 0.8):
            for min_change in (2, 3, 5):
                for planned in (False, True):
                    costs = [
                        simulate(num_clients, presence, runs, min_change, s, planned=planned) for s in range(seeds)
                    ]
                    released = [c for c in costs if c.released > 0]

                    def mean(field: str, among: list[Cost] = released) -> float:
                        return float(np.mean([getattr(c, field) for c in among])) if among else float("nan")

                    print(
                        f"| {num_clients} | {presence} | {min_change} | {'plan_roster' if planned else 'all present'} "
                        f"| {mean('released', costs):.0%} | {mean('present_in_sum'):.0%} "
                        f"| {mean('proportion_error'):.3f} | {mean('winners_kept'):.0%} | {mean('volume_kept'):.2f} |"
                    )
    print("\n## Time of one check-and-record (median)")
    print("| E members | earlier records | ms |")
    print("| --- | --- | --- |")
    for num_members in (20, 100):
        for history in (0, 10, 100) if args.quick else (0, 10, 100, 300):
            print(f"| {num_members} | {history} | {1000 * time_record(num_members, history, 5):.2f} |")


if __name__ == "__main__":
    main()
