"""One client's CPU in the sparse secure mode of PASS against Flower's SecAgg+ at the same degree and against the
complete graph, all with identity keys (issue 40).

Run: ``.venv/bin/python -m benchmarks.bench_pass_sparse_secure --sizes 1000 10000 --complete-sizes 100 300 1000
--runs 3``. Each run measures, in this order, at each of ``--sizes`` the sparse secure mode and then one SecAgg+
client at the sparse mode's ``(k, t)``, and the complete graph (what the secure profile runs today: a directory, the
consistency round, split tolerance 2) at each of ``--complete-sizes``; runs alternate so that load drifts hit all
alike. ``--no-secagg`` leaves SecAgg+ out; ``--complete-sizes`` with no value, the complete graph.

Sparse secure: ``c = ceil(5 % E)`` colluders over a floor of ``E``, dropout 5 %, 2 re-runs, ``2^-40``: the finder's
``(k, t)``. Every client advertises and draws through the real client, and the real server checks every draw; the
measured clients (``--clients``, spread over the roster) then run share keys, masked input, the consistency round and
unmask for the view "everyone survived". CPU is ``time.process_time`` around the measured client's own six calls, its
state round-tripped through its record between them as in a deployment, averaged over the measured clients.

What the measured client receives from its peers is made by the benchmark, not by running every peer's rounds: each
in-neighbour's ciphertext to it (sealed under their channel secret and signed, as a peer's share keys would), its
out-neighbours' signatures on the survivor set, and its dealers' signed masked-with lists. The client checks them as
it would any (signatures on a valid ciphertext are not checked, as in a deployment). The complete graph is measured
the same way, with :class:`~flmarket_flwr.pass_protocol.PassClient`.

SecAgg+: ONE real client of Flower's ``secaggplus_mod`` through its four stages in a roster of E, with ``k`` real
neighbours, by :func:`benchmarks.bench_secagg.drive_one_secagg_client` (see that module's docstring; the same driver
as ``bench_profiles``' SecAgg+ rows). ``num_shares = k + 1`` (Flower counts the client itself, so it has exactly ``k``
neighbours) and ``reconstruction_threshold = t``, the sparse mode's own ``t`` (Flower's counts among the ``k + 1``
holders, the sparse mode's among ``k``); ``--secagg-threshold half``: ``t = k // 2 + 1`` instead, ``bench_secagg``'s
(SecAgg+'s Shamir sharing costs less at a lower ``t``). Its CPU is that one client's, the ratio SecAgg+/sparse is
printed per run.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import math
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from benchmarks.bench_secagg import drive_one_secagg_client
from flmarket_flwr.pass_protocol import IdentityDirectory, PassClient, PassServer
from flmarket_flwr.pass_protocol.channel import seal
from flmarket_flwr.pass_protocol.encoding import indices_to_bitmap, pair_digest
from flmarket_flwr.pass_protocol.graph import roster_digest, share_threshold
from flmarket_flwr.pass_protocol.identity import public_key_of, sign_share_ciphertext, sign_survivor_set
from flmarket_flwr.pass_protocol.messages import (
    ConsistencyRequest,
    MaskRequest,
    SparseMaskRequest,
    SparseUnmaskRequest,
    UnmaskRequest,
)
from flmarket_flwr.pass_protocol.primitives import exchange_shared_secret, parse_public_key
from flmarket_flwr.pass_protocol.shamir import random_scalar, scalar_to_bytes
from flmarket_flwr.pass_protocol.sparse_client import SparseSecureClient
from flmarket_flwr.pass_protocol.sparse_secure import (
    DEFAULT_MARKETS,
    SessionBinding,
    SparseSecureSettings,
    pack_indices,
)
from flmarket_flwr.pass_protocol.sparse_server import SparseSecureServer
from simulations.inprocess_grid import serverapp_identity

RUN_ID, SESSION, BOUND = 1, b"bench-sparse-secure", 1000
COLLUDER_SHARE, DROPOUT, RERUNS = 0.05, 0.05, 2
TARGET_RATIO = 10  # issue 40: the sparse secure client at least 10x below SecAgg+ at the same degree


def identity(node: int) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"bench identity %d" % node).digest())


class Meter:
    """The measured clients' records and CPU seconds."""

    def __init__(self, make: Callable[[dict[str, Any]], Any]) -> None:
        self.make = make
        self.states: dict[int, dict[str, Any]] = {}
        self.cpu: dict[int, float] = {}

    def call(self, index: int, method: str, *args: Any, measured: bool = True, **kwargs: Any) -> dict[str, Any]:
        start = time.process_time()
        client = self.make(self.states.get(index, {}))
        reply = getattr(client, method)(*args, **kwargs).to_record()
        self.states[index] = client.to_record()
        if measured:
            self.cpu[index] = self.cpu.get(index, 0.0) + time.process_time() - start
        return reply


def sealed(
    states: dict[int, dict[str, Any]], dealer: int, holder: int, holder_cipher_key: bytes, node: int
) -> tuple[bytes, bytes, bytes]:
    """The ciphertext, digest and signature ``dealer``'s share keys would send ``holder`` (fresh random shares)."""
    cipher_key = X25519PrivateKey.from_private_bytes(states[dealer]["cipher_private_key"])
    secret = exchange_shared_secret(cipher_key, parse_public_key(holder_cipher_key, holder), holder)
    both = scalar_to_bytes(random_scalar()) + scalar_to_bytes(random_scalar())
    ciphertext, digest = seal(secret, SESSION, dealer, holder, both), pair_digest(SESSION, dealer, holder, both)
    roster = states[dealer]["roster"]
    signature = sign_share_ciphertext(
        identity(node), dealer, holder, ciphertext, digest, run_id=RUN_ID, session=SESSION, roster=roster
    )
    return ciphertext, digest, signature


def survivor_signature(node: int, survivors: bytes, roster: bytes) -> bytes:
    """``node``'s signature on the survivor set "everyone survived" (none dropped), as its consistency round sends."""
    return sign_survivor_set(
        identity(node), survivors, b"", run_id=RUN_ID, session=SESSION, roster=roster, participants=survivors
    )


def federation(size: int, measured: int) -> tuple[list[int], IdentityDirectory, set[int]]:
    """The roster ``1 .. E``, the directory of their identity keys and the ``measured`` clients spread over it."""
    nodes = list(range(1, size + 1))
    directory = IdentityDirectory({n: public_key_of(identity(n)) for n in nodes})
    return nodes, directory, {int(i) for i in np.linspace(1, size, measured, dtype=int)}


def advertise_all(
    server: PassServer | SparseSecureServer,
    meter: Meter,
    nodes: list[int],
    targets: set[int],
    num_classes: int,
    **options: Any,
) -> dict[int, dict[str, Any]]:
    """Every node's advertisement through the real client (its CPU counted for the ``targets``), with its own counts
    in ``[0, BOUND)`` and ``options`` (the mode's settings) passed to ``advertise``."""
    counts = np.random.default_rng(0).integers(0, BOUND, size=(len(nodes), num_classes))
    return {
        i: meter.call(
            i,
            "advertise",
            r.to_record(),
            counts[i - 1],
            identity_key=identity(i),
            run_id=RUN_ID,
            measured=i in targets,
            **options,
        )
        for i, r in server.advertise_requests(nodes).items()
    }


def sparse_client_cpu(
    size: int, num_classes: int, measured: int, markets: int = DEFAULT_MARKETS
) -> tuple[int, int, float]:
    """``(k, t, mean CPU seconds of one client's six calls)`` in the sparse secure mode at ``E = size``, the degrees
    sized for ``markets`` markets of ``RERUNS + 1`` placements (the node's default: its life's)."""
    nodes, directory, targets = federation(size, measured)
    settings = SparseSecureSettings.of(
        colluders=math.ceil(COLLUDER_SHARE * size), roster_floor=size, dropout=DROPOUT, reruns=RERUNS, markets=markets
    )
    server = SparseSecureServer(SESSION, num_classes, BOUND, settings=settings, directory=directory, run_id=RUN_ID)
    meter = Meter(SparseSecureClient)
    adverts = advertise_all(server, meter, nodes, targets, num_classes, settings=settings)
    advertised = dict(meter.states)  # the peers' keys, for the ciphertexts they would send
    draw_requests = server.receive_advertisements(adverts)
    draws = {}
    for i, request in draw_requests.items():
        draws[i] = meter.call(i, "draw", request.to_record(), identity(i), measured=i in targets)
        if i not in targets:
            del meter.states[i]  # its record holds the roster's node ids: kept for the measured clients only
    share_requests = server.receive_draws(draws)
    graph, ins = server.state.graph, server.state.in_graph
    participants = sorted(server.state.adverts)
    survivors = indices_to_bitmap(participants)
    binding = SessionBinding(RUN_ID, SESSION, server.state.roster, roster_digest(SESSION, participants))
    view = ConsistencyRequest(survivors, b"")
    for u in sorted(targets):
        meter.call(u, "share_keys", share_requests[u].to_record(), directory, identity(u))
        mine = advertised[u]["cipher_public_key"]
        rows = [sealed(advertised, v, u, mine, v) for v in ins[u]]
        around = sorted(set(graph[u]) | set(ins[u]))
        sent = [[row[i] for row in rows] for i in range(3)]  # ciphertexts, digests, signatures
        inbox = SparseMaskRequest(list(ins[u]), sent[0], sent[1], sent[2], around)
        meter.call(u, "mask_input", inbox.to_record(), identity(u))
        meter.call(u, "sign_survivors", view.to_record(), identity(u))
        signatures = [survivor_signature(v, survivors, server.state.roster) for v in graph[u]]
        lists = {v: sorted(set(graph[v]) | set(ins[v])) for v in ins[u]}
        unmask = SparseUnmaskRequest(
            survivors,
            b"",
            list(graph[u]),
            signatures,
            list(ins[u]),
            [pack_indices(lists[v]) for v in ins[u]],
            [binding.sign_masked_with(identity(v), v, lists[v]) for v in ins[u]],
        )
        reply = meter.call(u, "unmask", unmask.to_record())
        assert len(reply["survivor_indices"]) == len(ins[u])  # every dealer's self-mask share: the honest case
    parameters = server.parameters
    assert parameters is not None
    return parameters.degree, parameters.threshold, float(np.mean([meter.cpu[u] for u in targets]))


def complete_client_cpu(size: int, num_classes: int, measured: int) -> tuple[int, int, float]:
    """``(k, t, mean CPU seconds)`` of one client's five calls on the complete graph with identity keys (the secure
    profile's PASS: a directory, the consistency round, split tolerance 2)."""
    nodes, directory, targets = federation(size, measured)
    server = PassServer(SESSION, num_classes, BOUND, degree=size - 1, directory=directory, run_id=RUN_ID)
    meter = Meter(PassClient)
    adverts = advertise_all(server, meter, nodes, targets, num_classes, complete_graph=True, split_tolerance=2)
    share_requests = server.receive_advertisements(adverts)
    advertised = {i: dict(s) for i, s in meter.states.items()}
    survivors = indices_to_bitmap(nodes)
    view = ConsistencyRequest(survivors, b"")
    signatures = {v: survivor_signature(v, survivors, server.state.roster) for v in nodes}
    for u in sorted(targets):
        meter.call(u, "share_keys", share_requests[u].to_record(), directory, identity(u))
        mine = advertised[u]["cipher_public_key"]
        senders = [v for v in nodes if v != u]
        rows = [sealed(advertised, v, u, mine, v) for v in senders]
        sent = [[row[i] for row in rows] for i in range(3)]  # ciphertexts, digests, signatures
        inbox = MaskRequest(senders, sent[0], sent[1], sent[2])
        meter.call(u, "mask_input", inbox.to_record())
        meter.call(u, "sign_survivors", view.to_record(), identity(u))
        unmask_request = UnmaskRequest.of(nodes, [], senders, [signatures[v] for v in senders])
        meter.call(u, "unmask", unmask_request.to_record())
    return server.degree, server.threshold, float(np.mean([meter.cpu[u] for u in targets]))


def secagg_client_cpu(size: int, num_classes: int, degree: int, threshold: int) -> float:
    """CPU seconds of ONE real Flower SecAgg+ client (``secaggplus_mod`` through its four stages, driven by
    :func:`~benchmarks.bench_secagg.drive_one_secagg_client`) with ``degree`` neighbours in a roster of E:
    ``num_shares = degree + 1`` (Flower counts the client itself) and ``reconstruction_threshold = threshold``."""
    counts = np.random.default_rng(0).integers(0, BOUND, size=num_classes)
    with serverapp_identity():  # this process plays the ServerApp of the driver's grid (its default run id)
        (row,) = drive_one_secagg_client(size, {num_classes: counts}, degree=degree, threshold=threshold)
    return row.client_cpu_mean_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[1000, 10_000], help="E, sparse secure mode")
    parser.add_argument("--complete-sizes", type=int, nargs="*", default=[100, 300, 1000], help="E, complete graph")
    parser.add_argument("--classes", type=int, default=10, help="number of classes C")
    parser.add_argument("--clients", type=int, default=10, help="measured clients per E")
    parser.add_argument("--runs", type=int, default=1, help="alternating runs")
    parser.add_argument("--no-secagg", action="store_true", help="leave out SecAgg+ at the sparse mode's (k, t)")
    parser.add_argument(
        "--markets",
        type=int,
        default=DEFAULT_MARKETS,
        help="markets of a node's life the degrees are sized for (pass-markets; 1: one market's three placements)",
    )
    parser.add_argument(
        "--secagg-threshold",
        choices=("same", "half"),
        default="same",
        help="SecAgg+'s t: the sparse mode's (default) or k // 2 + 1, bench_secagg's",
    )
    args = parser.parse_args()
    logging.getLogger("flwr").setLevel(logging.WARNING)
    print(f"{os.cpu_count()} CPUs, load average at start {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(
        f"{'run':>3} {'mode':>13} {'E':>7} {'k':>5} {'t':>5} {'client CPU ms':>14} {'SecAgg+/sparse':>15} {'load':>5}"
    )
    ratios: dict[int, list[float]] = {}
    for run in range(1, args.runs + 1):
        for size in args.sizes:  # sparse then SecAgg+ at its (k, t), one after the other: load hits both alike
            k, t, sparse = sparse_client_cpu(size, args.classes, args.clients, args.markets)
            print(
                f"{run:>3} {'sparse secure':>13} {size:>7} {k:>5} {t:>5} {1e3 * sparse:>14.2f} {'':>15} "
                f"{os.getloadavg()[0]:>5.1f}",
                flush=True,
            )
            if not args.no_secagg:
                t = t if args.secagg_threshold == "same" else share_threshold(k)
                secagg = secagg_client_cpu(size, args.classes, k, t)
                ratios.setdefault(size, []).append(secagg / sparse)
                print(
                    f"{run:>3} {'SecAgg+':>13} {size:>7} {k:>5} {t:>5} {1e3 * secagg:>14.2f} "
                    f"{secagg / sparse:>14.1f}x {os.getloadavg()[0]:>5.1f}",
                    flush=True,
                )
        for size in args.complete_sizes:
            k, t, seconds = complete_client_cpu(size, args.classes, args.clients)
            print(
                f"{run:>3} {'complete':>13} {size:>7} {k:>5} {t:>5} {1e3 * seconds:>14.2f} {'':>15} "
                f"{os.getloadavg()[0]:>5.1f}",
                flush=True,
            )
    for size, values in ratios.items():
        verdict = "met" if min(values) >= TARGET_RATIO else "NOT met"
        print(
            f"E = {size}: SecAgg+/sparse {min(values):.1f}x-{max(values):.1f}x over {len(values)} runs, "
            f"target >= {TARGET_RATIO}x {verdict}"
        )
    print(f"load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
