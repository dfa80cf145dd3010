"""One PASS v2 client's CPU at a given E, without driving the whole federation (issue 21: client work vs E).

Run: ``.venv/bin/python -m benchmarks.bench_pass_client --sizes 1000 10000``. Every client advertises and the
real server builds the share-keys requests for all ``E``; then only the measured clients and their ``k``
neighbours share keys, and each measured client masks and unmasks for the view "everyone survived" (the
view a session without dropouts gives it). CPU is ``time.process_time`` around the measured client's own
four calls, its state round-tripped through its record between them as in a deployment, summed over the
four rounds and averaged over ``--clients`` clients spread over the roster. No consistency round (no
directory), as ``bench_pass_scale``.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np

from flmarket_flwr.pass_protocol import PassClient, PassServer
from flmarket_flwr.pass_protocol.messages import MaskRequest, UnmaskRequest


def _timed(states: dict[int, dict], index: int, call: Any, cpu: dict[int, float]) -> Any:
    """Run ``call(client)`` on client ``index`` from its record; add its CPU time to ``cpu[index]``."""
    start = time.process_time()
    client = PassClient.from_record(states[index])
    reply = call(client).to_record()
    states[index] = client.to_record()
    cpu[index] = cpu.get(index, 0.0) + time.process_time() - start
    return reply


def client_cpu(
    num_clients: int, num_classes: int, measured: int, seed: int = 0, complete: bool = False
) -> tuple[int, float]:
    """``(k, mean CPU seconds of one client's four rounds)`` over ``measured`` clients at ``E = num_clients``.

    ``complete``: on the complete graph (``k = E - 1``, what a node with ``pass-complete-graph`` requires).
    """
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 1000, size=(num_clients, num_classes))
    server = PassServer(b"bench-client", num_classes, 1000, degree=num_clients - 1 if complete else None)
    requests = server.advertise_requests(list(range(num_clients)))
    states: dict[int, dict] = {i: {} for i in requests}
    cpu: dict[int, float] = {}
    adverts = {
        i: _timed(states, i, lambda c, r=r, i=i: c.advertise(r.to_record(), counts[i - 1]), cpu)
        for i, r in requests.items()
    }
    share_requests = server.receive_advertisements(adverts)
    targets = [int(i) for i in np.linspace(1, num_clients, measured, dtype=int)]
    sharing = sorted(set(targets) | {v for u in targets for v in server.graph[u]})
    replies = {u: _timed(states, u, lambda c, u=u: c.share_keys(share_requests[u].to_record()), cpu) for u in sharing}
    everyone = UnmaskRequest.of(sorted(server.graph), []).to_record()
    for u in targets:
        inbox = MaskRequest([], [], [])
        for v in server.graph[u]:
            position = replies[v]["receivers"].index(u)
            inbox.senders.append(v)
            inbox.ciphertexts.append(replies[v]["ciphertexts"][position])
            inbox.share_digests.append(replies[v]["share_digests"][position])
        _timed(states, u, lambda c, inbox=inbox: c.mask_input(inbox.to_record()), cpu)
        _timed(states, u, lambda c: c.unmask(everyone), cpu)
    return server.degree, float(np.mean([cpu[u] for u in targets]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[1000, 10_000], help="numbers of clients E")
    parser.add_argument("--classes", type=int, default=10, help="number of classes C")
    parser.add_argument("--clients", type=int, default=20, help="measured clients per E")
    parser.add_argument("--complete", action="store_true", help="on the complete graph (k = E - 1)")
    args = parser.parse_args()
    print(f"load average at start {os.getloadavg()[0]:.2f}")
    print(f"{'E':>7} {'C':>5} {'k':>3} {'client CPU ms':>14}")
    for size in args.sizes:
        k, seconds = client_cpu(size, args.classes, args.clients, complete=args.complete)
        print(f"{size:>7} {args.classes:>5} {k:>3} {1e3 * seconds:>14.2f}")
    print(f"load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
