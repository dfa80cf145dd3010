"""The market without Flower: PASS, scores, bids and the auction over a partitioned data set.

Run ``python -m flmarket_flwr.app.demo`` (see ``--help``). Using the library's public API the way a non-Flower
integration would, it partitions the bundled digits data over ``E`` clients, sums their label counts with
PASS, has each client score itself and bid its cost, and runs the reverse auction (details: ``run_demo``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import numpy as np

from flmarket_flwr.app.data import DISTRIBUTIONS, load_digits_arrays, make_partition, train_test_split_balanced
from flmarket_flwr.market.node.bidding import cost_based_bid, simulated_cost_per_sample
from flmarket_flwr.pass_protocol import PassClient, PassServer
from flmarket_flwr.pricing import AuctionResult, run_auction, score


def secure_global_counts(label_counts: np.ndarray, session: bytes, count_bound: int = 10**9) -> np.ndarray:
    """Run one PASS v2 session among all clients, in this process, and return the global counts.

    Every message and every client state crosses its record form (``to_record`` / ``from_record``),
    as it would between processes; no client drops out.

    Parameters
    ----------
    label_counts : np.ndarray
        ``(E, C)`` per-client counts; row ``e`` stays with client ``e``.
    session : bytes
        Session identifier bound into every key, share and mask.
    count_bound : int (default: 10**9)
        Declared maximum of any client's count of any class.

    Returns
    -------
    np.ndarray
        The global per-class counts, ``(C,)``.

    Raises
    ------
    flmarket_flwr.pass_protocol.PassError
        Fewer than 3 clients, or a count above ``count_bound``.
    """
    counts = np.asarray(label_counts)
    server = PassServer(session, counts.shape[1], count_bound)
    requests = server.advertise_requests(list(range(counts.shape[0])))  # node id = row
    states = {index: PassClient().to_record() for index in requests}

    def answer(requests: dict[int, Any], method: str) -> dict[int, Any]:
        """Each client answers its request from its stored state, and stores its new state."""
        replies = {}
        for index, request in requests.items():
            client = PassClient.from_record(states[index])
            own = (counts[server.node_of[index]],) if method == "advertise" else ()
            replies[index] = getattr(client, method)(request.to_record(), *own).to_record()
            states[index] = client.to_record()
        return replies

    shares = server.receive_advertisements(answer(requests, "advertise"))
    masks = server.receive_shares(answer(shares, "share_keys"))
    unmasks = server.receive_masked(answer(masks, "mask_input"))
    server.receive_unmask(answer(unmasks, "unmask"))
    return server.finish()


def run_demo(
    num_clients: int, distribution: str, budget: float, seed: int, markup: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, AuctionResult]:
    """Partition, aggregate, score, bid and auction; return every intermediate result.

    Notes
    -----
    Run ``python -m flmarket_flwr.app.demo`` (see ``--help``). Every step uses the library's public API
    the way a non-Flower integration would:

    1. partition the bundled digits data over ``E`` clients (global distribution ``dN``, Dirichlet);
    2. PASS v2 (:class:`~flmarket_flwr.pass_protocol.PassClient` and
       :class:`~flmarket_flwr.pass_protocol.PassServer`, driven in this process): each client double-masks its
       label counts (a self-mask and pairwise X25519/ChaCha20 masks with its graph neighbours, both secrets
       Shamir-shared), and the server unmasks the exact global counts, never a client's own;
    3. each client scores itself from its own counts, the global counts and ``E``, and bids its cost
       (a per-sample cost drawn per client, times its data volume, plus a markup);
    4. the reverse auction (:func:`~flmarket_flwr.pricing.run_auction`, the rule the market phase applies)
       selects winners within the budget and pays each its critical value.
    """
    _, labels = load_digits_arrays()
    train_indices, _ = train_test_split_balanced(labels, seed=seed)
    partition = make_partition(labels[train_indices], num_clients, distribution=distribution, seed=seed)
    global_counts = secure_global_counts(partition.label_counts, session=f"demo-{seed}".encode())
    scores = np.array([score(counts, global_counts, num_clients) for counts in partition.label_counts])
    bids = np.array(
        [
            cost_based_bid(counts, simulated_cost_per_sample(client, seed=seed), markup)
            for client, counts in enumerate(partition.label_counts)
        ]
    )
    # The product's one selection rule, as the market phase applies it.
    return partition.label_counts, global_counts, scores, bids, run_auction(scores, bids, budget)


def _print_report(
    label_counts: np.ndarray, global_counts: np.ndarray, scores: np.ndarray, bids: np.ndarray, result: AuctionResult
) -> None:
    exact = np.array_equal(global_counts, label_counts.sum(axis=0))
    print(f"global counts (via PASS): {global_counts.tolist()}  (exact: {exact})")
    print(f"{'client':>6} {'samples':>7} {'score':>9} {'bid':>8} {'u/b':>7} {'won':>4} {'payment':>8}")
    for client in result.order:
        won = "yes" if client in result.winners else ""
        payment = f"{result.payments[client]:8.2f}" if won else ""
        print(
            f"{client:>6} {label_counts[client].sum():>7} {scores[client]:>9.2f} {bids[client]:>8.2f} "
            f"{scores[client] / bids[client]:>7.3f} {won:>4} {payment}"
        )
    print(f"winners: {result.winners.tolist()}  total payment {result.total_payment:.2f} of budget {result.budget:.2f}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-clients", type=int, default=20)
    parser.add_argument("--distribution", choices=DISTRIBUTIONS, default="d4")
    parser.add_argument("--budget", type=float, default=300.0)
    parser.add_argument("--markup", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.num_clients < 3:
        parser.error("--num-clients must be at least 3: PASS with fewer clients would reveal their counts")
    _print_report(*run_demo(args.num_clients, args.distribution, args.budget, args.seed, args.markup))


if __name__ == "__main__":
    main()
