"""PASS v2 cost: one client's four rounds, and the server's, in one full session without dropouts.

Run: ``.venv/bin/python -m benchmarks.bench_pass`` (``--quick`` for the smallest sizes only).

For E participants and C classes, runs one session of :class:`PassClient` / :class:`PassServer` in this
process (every message and client state through its record form) and prints the graph degree ``k``, the
mean wall time of one client's rounds (advertise, share keys, masked input, unmask: about ``k`` X25519
exchanges, Shamir shares and ChaCha20 expansions of ``C`` words) and the server's total (routing, the
``k``-regular graph, Shamir reconstruction of every self-mask seed, ``E`` PRG expansions).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from flmarket_flwr.pass_protocol import PassClient, PassServer

_Result = TypeVar("_Result")


def run_session(num_clients: int, num_classes: int, seed: int = 0) -> tuple[int, float, float]:
    """One session; return ``(degree, mean seconds of one client's rounds, seconds of the server)``."""
    counts = np.random.default_rng(seed).integers(0, 1000, size=(num_clients, num_classes))
    server_time = 0.0
    client_time = 0.0
    started = time.perf_counter()
    server = PassServer(b"bench", num_classes, 1000)
    requests = server.advertise_requests(list(range(num_clients)))
    server_time += time.perf_counter() - started
    states = {index: PassClient().to_record() for index in requests}

    def answer(requests: Mapping[int, Any], method: str) -> dict[int, dict[str, Any]]:
        nonlocal client_time
        replies = {}
        for index, request in requests.items():
            started = time.perf_counter()
            client = PassClient.from_record(states[index])
            own = (counts[index - 1],) if method == "advertise" else ()
            replies[index] = getattr(client, method)(request.to_record(), *own).to_record()
            states[index] = client.to_record()
            client_time += time.perf_counter() - started
        return replies

    def serve(step: Callable[[Any], _Result], replies: Mapping[int, dict[str, Any]] | None) -> _Result:
        nonlocal server_time
        started = time.perf_counter()
        result = step(replies)
        server_time += time.perf_counter() - started
        return result

    shares = serve(server.receive_advertisements, answer(requests, "advertise"))
    masks = serve(server.receive_shares, answer(shares, "share_keys"))
    unmasks = serve(server.receive_masked, answer(masks, "mask_input"))
    serve(server.receive_unmask, answer(unmasks, "unmask"))
    total = serve(lambda _: server.finish(), None)
    assert np.array_equal(total, counts.sum(axis=0)), "PASS did not return the exact sum"
    return server.degree, client_time / num_clients, server_time


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="E = 10 only")
    args = parser.parse_args(argv)
    sizes = (10,) if args.quick else (10, 100, 500)
    print(f"{'E':>5} {'C':>7} {'k':>4} {'one client, 4 rounds (s)':>25} {'server, 4 rounds (s)':>21}")
    for num_clients in sizes:
        for num_classes in (10, 10_000):
            degree, client_time, server_time = run_session(num_clients, num_classes)
            print(
                f"{num_clients:>5} {num_classes:>7} {degree:>4} {client_time:>25.4f} {server_time:>21.4f}", flush=True
            )


if __name__ == "__main__":
    main()
