"""What distributed DP on ``N_s`` costs: the error of ``N_s``, the change in scores, the change in the winners.

Run: ``.venv/bin/python -m benchmarks.bench_dp`` (``--quick`` for a short run; ``--datasets digits`` to skip
Fashion-MNIST, which needs Debian's ``dataset-fashion-mnist``; ``--noise-seed k`` for another set of noise draws
over the same partitions, 0 being the default).

For each data set, global distribution and seed it partitions the training labels over ``E = 20`` clients
as the app does (:func:`~flmarket_flwr.app.data.make_partition`), scores every client against the exact ``N_s``
and bids its simulated cost (``cost x N_e x 1.2``, as the app's ``SimulatedCostBid``), and takes the
auction's winners three ways: a cohort cap of 5 and of 10 with an ample budget (the paper's 5 / 10 of 20:
the head of the ``u / b`` order), and no cap with a budget ``R`` of 30% of all the bids (the budget rule
``b_e <= R/2 u_e / U(S + e)`` then decides how many win, and it depends on the scores' scale). Then,
``draws`` times per epsilon, it adds the noise of :class:`~flmarket_flwr.pass_protocol.SkellamNoise`
(``delta = 1e-6``, ``honest_fraction = 1/2``, every client honest: each adds ``target / 10``, so ``N_s``
carries twice the target variance, as deployed), clips ``N_s`` at 0, rescores with ``exact_global=False``
and reruns the auction on the same bids.

Printed per (data set, distribution, epsilon): the noise's standard deviation per class; the relative error
of ``N_s`` per class (mean over classes, and the worst class's mean); the mean relative change of a client's
score; for each selection the mean Jaccard index of the winners with the noiseless winners and the share of
draws that select exactly the same set; with the budget, the mean absolute change in the number of winners.
The sum of the noise over the clients is drawn as one Skellam (the law of the sum of the clients'
independent Skellams). First, per epsilon, the accounting (``dp-accounting``'s conversion of the Skellam RDP
curve): the target variance, the epsilon of the whole sum with every client honest, the composition over 2, 3
and 10 releases, and the time of one calibration.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence

import numpy as np

from flmarket_flwr.app.data import load_dataset, make_partition
from flmarket_flwr.market.node.bidding import cost_based_bid, simulated_cost_per_sample
from flmarket_flwr.pass_protocol import SkellamNoise
from flmarket_flwr.pass_protocol.noise import skellam_epsilon, skellam_variance_for
from flmarket_flwr.pricing import run_auction, score

CAPS: tuple[int | None, ...] = (5, 10, None)
"""Cohort caps; ``None``: no cap, a budget of 30% of all the bids decides (the budget term then binds)."""


def federation(dataset: str, distribution: str, seed: int, clients: int) -> tuple[np.ndarray, np.ndarray]:
    """``(E, C)`` label counts of the app's partition and the clients' cost-based bids."""
    labels = load_dataset(dataset, seed=seed).train_labels
    counts = make_partition(labels, clients, distribution=distribution, seed=seed).label_counts
    bids = np.array([cost_based_bid(c, simulated_cost_per_sample(e, seed=seed), 0.2) for e, c in enumerate(counts)])
    return np.asarray(counts, dtype=np.int64), bids


def winners(scores: np.ndarray, bids: np.ndarray, cap: int | None) -> frozenset[int]:
    """The auction's winners: with a cap, a budget that never binds; without, a budget of 30% of the bids."""
    budget = 1e12 if cap is not None else 0.3 * float(bids.sum())
    return frozenset(int(w) for w in run_auction(scores, bids, budget, num_winners=cap).winners)


def jaccard(a: frozenset[int], b: frozenset[int]) -> float:
    return len(a & b) / len(a | b) if a | b else 1.0


def accounting(epsilon: float, clients: int) -> str:
    """One line: target variance, the epsilon of the sum as deployed, compositions, the calibration's time."""
    start = time.perf_counter()
    target = skellam_variance_for.__wrapped__(epsilon, 1e-6)  # uncached: the time of one calibration
    elapsed = time.perf_counter() - start
    deployed = clients * SkellamNoise(epsilon, 1e-6).client_variance(clients)
    composed = " / ".join(f"{skellam_epsilon(target, 1e-6, k):.2f}" for k in (2, 3, 10))
    return (
        f"eps {epsilon:g}: target variance {target:.2f} (sd {math.sqrt(target):.2f}); the sum as deployed "
        f"(variance {deployed:.2f}) is eps {skellam_epsilon(deployed, 1e-6):.2f}; 2 / 3 / 10 releases: {composed}; "
        f"calibration {elapsed * 1e3:.0f} ms"
    )


def measure(  # pylint: disable=too-many-arguments
    dataset: str, distribution: str, epsilon: float, seeds: int, draws: int, clients: int, noise_seed: int = 0
) -> dict[str, float]:
    """Mean figures over ``seeds`` partitions and ``draws`` noise draws each (``noise_seed`` picks the draws)."""
    noise = SkellamNoise(epsilon, 1e-6)
    total_variance = clients * noise.client_variance(clients)
    rel_errors, worst, score_change = [], [], []
    agree: dict[int | None, list[float]] = {cap: [] for cap in CAPS}
    same: dict[int | None, list[float]] = {cap: [] for cap in CAPS}
    sizes: list[int] = []
    for seed in range(seeds):
        counts, bids = federation(dataset, distribution, seed, clients)
        exact = counts.sum(axis=0)
        clean = np.asarray(score(counts, exact, clients), dtype=float)
        clean_winners = {cap: winners(clean, bids, cap) for cap in CAPS}
        rng = np.random.default_rng(1_000 + seed + 10_000 * noise_seed)
        for _ in range(draws):
            half = total_variance / 2.0
            noisy = exact + rng.poisson(half, exact.size) - rng.poisson(half, exact.size)
            noisy = np.maximum(noisy, 0)
            error = np.abs(noisy - exact) / np.maximum(exact, 1)
            rel_errors.append(float(error.mean()))
            worst.append(error)
            scores = np.asarray(score(counts, noisy, clients, exact_global=False), dtype=float)
            positive = clean > 0
            score_change.append(float(np.mean(np.abs(scores[positive] - clean[positive]) / clean[positive])))
            for cap in CAPS:
                chosen = winners(scores, bids, cap)
                agree[cap].append(jaccard(chosen, clean_winners[cap]))
                same[cap].append(float(chosen == clean_winners[cap]))
                if cap is None:
                    sizes.append(len(chosen) - len(clean_winners[cap]))
    row = {
        "sd": math.sqrt(total_variance),
        "ns_rel_error": float(np.mean(rel_errors)),
        "ns_worst_class": float(np.max(np.mean(worst, axis=0))),
        "score_change": float(np.mean(score_change)),
        "size_change": float(np.mean(np.abs(sizes))),
    }
    for cap in CAPS:
        row[f"jaccard_{cap}"] = float(np.mean(agree[cap]))
        row[f"same_{cap}"] = float(np.mean(same[cap]))
    return row


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=["digits", "fashion_mnist"])
    parser.add_argument("--distributions", nargs="+", default=["d1", "d4", "d6"])
    parser.add_argument("--epsilons", nargs="+", type=float, default=[0.5, 1.0, 2.0, 4.0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--draws", type=int, default=40)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--noise-seed", type=int, default=0, help="another set of noise draws (0: the default)")
    parser.add_argument("--quick", action="store_true", help="2 seeds, 10 draws")
    args = parser.parse_args(argv)
    seeds, draws = (2, 10) if args.quick else (args.seeds, args.draws)
    header = (
        f"{'data':<14}{'dist':<5}{'eps':>5}{'sd':>6}{'N_s err':>9}{'worst c':>9}{'score d':>9}"
        + "".join(f"{'J@' + str(c or 'R'):>7}{'same@' + str(c or 'R'):>8}" for c in CAPS)
        + f"{'|d n@R|':>8}"
    )
    print(f"E = {args.clients}, delta = 1e-6, honest_fraction = 1/2, {seeds} seeds x {draws} noise draws")
    start = time.perf_counter()
    skellam_epsilon(30.0, 1e-6)  # the first conversion imports dp-accounting
    print(f"first conversion (imports dp-accounting): {time.perf_counter() - start:.2f} s")
    for epsilon in args.epsilons:
        print(accounting(epsilon, args.clients))
    print(header)
    for dataset in args.datasets:
        for distribution in args.distributions:
            for epsilon in args.epsilons:
                row = measure(dataset, distribution, epsilon, seeds, draws, args.clients, args.noise_seed)
                print(
                    f"{dataset:<14}{distribution:<5}{epsilon:>5g}{row['sd']:>6.1f}{row['ns_rel_error']:>9.2%}"
                    f"{row['ns_worst_class']:>9.2%}{row['score_change']:>9.2%}"
                    + "".join(f"{row[f'jaccard_{c}']:>7.3f}{row[f'same_{c}']:>8.2f}" for c in CAPS)
                    + f"{row['size_change']:>8.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
