"""The award's checks on one client, at the market's scale: a winner's check of the award with and without its
bidders' signatures on the head rows (a loser does not check them), and a winner's count of the endorsements up to
the quorum against all of them.

Run: ``.venv/bin/python -m benchmarks.bench_award_checks --sizes 1000 10000 --runs 3`` (about a minute at E = 10,000).

The bids are those of ``benchmarks.bench_market_scale`` at the same E (counts in ``[0, 200)`` over 10 classes from the
same seed, scores against their sum, :class:`~flmarket_flwr.market.CostBasedBid` at 0.05 a sample, budget ``10 E``), so
the award's decisive head has the size that market's has. Every bidder signs its bid and every node endorses the award,
as in the secure profile. Timed, side by side in one run: :func:`~flmarket_flwr.market.wire.award.check_award` for a
winner with the head rows' signatures checked (``bid_signers``) and without, and for a bidder ranked after the head
(what most bidders run at the endorse step, with the keys given: a loser skips the rows); and a winner's
:func:`~flmarket_flwr.market.wire.award.count_endorsements` over every node's endorsement, stopping at the sparse
mode's quorum over the directory (``q - 1`` others) and counting all of them.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import time
from collections.abc import Callable

import numpy as np

from flmarket_flwr.market import CostBasedBid
from flmarket_flwr.market.wire.award import AwardTerms, binding_quorum, build_award, check_award, count_endorsements
from flmarket_flwr.pass_protocol import generate_identity
from flmarket_flwr.pass_protocol.identity import sign_award_endorsement, sign_bid
from flmarket_flwr.pricing import score as compute_score

MAX_COUNT = 200
CLASSES = 10
COLLUDER_SHARE = 0.05


def _timed(call: Callable[[], object], repeats: int) -> float:
    """Mean CPU seconds of ``call`` over ``repeats`` calls."""
    started = time.process_time()
    for _ in range(repeats):
        call()
    return (time.process_time() - started) / repeats


def one_size(num_clients: int, repeats: int) -> dict[str, float]:
    """Build the signed, endorsed award of ``num_clients`` bidders and time one endorser's and one winner's checks."""
    rng = np.random.default_rng(num_clients)
    nodes = [10_000 + i for i in range(num_clients)]
    counts = {node: rng.integers(0, MAX_COUNT, size=CLASSES) for node in nodes}
    global_counts = np.sum(list(counts.values()), axis=0)
    policy = CostBasedBid(0.05)
    bids = {
        node: (float(compute_score(c, global_counts, num_clients)), policy(c, 0.0, None))  # type: ignore[arg-type]
        for node, c in counts.items()
        if c.sum() > 0
    }
    keys = {node: generate_identity() for node in nodes}
    buyer, buyer_public = generate_identity()
    terms = AwardTerms(10.0 * num_clients, 0, buyer_public)
    survivors = list(enumerate(nodes, start=1))
    index = {node: i for i, node in survivors}
    session, transcript = b"s" * 16, b"t" * 32
    signatures = {
        node: sign_bid(keys[node][0], run_id=1, session=session, transcript=transcript, index=index[node], node_id=node,
                       score=s, bid=b)
        for node, (s, b) in bids.items()
    }  # fmt: skip
    award, tree = build_award(1, session, transcript, terms, survivors, bids, signatures=signatures)
    head = {bidder.node_id for bidder in award.head}
    loser = next(node for node in reversed(nodes) if node in bids and node not in head)
    winner = award.winners[0]
    signers = {node: (index[node], keys[node][1]) for node in head}

    def endorse(node: int, with_signatures: bool) -> None:
        score, bid = bids[node]
        check_award(
            award, run_id=1, session=session, transcript=transcript, terms=terms, survivors=num_clients,
            rank=index[node] - 1, index=index[node], node_id=node, score=score, bid=bid, proof=tree.proof(node),
            survivor_nodes=set(nodes), bid_signers=signers if with_signatures else None,
        )  # fmt: skip

    digest = award.digest()
    endorsements = {node: sign_award_endorsement(keys[node][0], digest) for node in nodes}
    directory = {node: public for node, (_, public) in keys.items()}
    quorum = binding_quorum(num_clients, math.ceil(COLLUDER_SHARE * num_clients))

    def audit(stop: bool) -> int:
        return count_endorsements(digest, endorsements, directory, winner, set(nodes), quorum - 1 if stop else None)

    assert audit(True) == quorum - 1 and audit(False) == num_clients - 1
    figures: dict[str, float] = {"head": len(award.head), "winners": len(award.winners), "quorum": quorum}
    for name, call in (
        ("winner, rows checked", lambda: endorse(winner, True)),
        ("winner, rows unchecked", lambda: endorse(winner, False)),
        ("loser", lambda: endorse(loser, True)),
        ("audit, to the quorum", lambda: audit(True)),
        ("audit, every endorsement", lambda: audit(False)),
    ):
        figures[name] = _timed(call, repeats)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000], help="numbers of clients E")
    parser.add_argument("--runs", type=int, default=3, help="runs of all the sizes, alternating")
    parser.add_argument("--repeats", type=int, default=3, help="calls timed per figure")
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
        f"load average at start {os.getloadavg()[0]:.2f}\n"
    )
    print(
        "| E | run | head | winners | q | a winner's endorse, rows checked | unchecked | a loser's endorse "
        "| audit to q | audit, all | load |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for run in range(1, args.runs + 1):
        for size in args.sizes:
            f = one_size(size, args.repeats)
            print(
                f"| {size:,} | {run} | {f['head']:,.0f} | {f['winners']:,.0f} | {f['quorum']:,.0f} "
                f"| {f['winner, rows checked'] * 1e3:.1f} ms | {f['winner, rows unchecked'] * 1e3:.1f} ms "
                f"| {f['loser'] * 1e3:.1f} ms "
                f"| {f['audit, to the quorum'] * 1e3:.1f} ms | {f['audit, every endorsement'] * 1e3:.1f} ms "
                f"| {os.getloadavg()[0]:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
