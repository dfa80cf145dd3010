"""PASS v2 at scale: per-client CPU and bytes, server CPU and peak memory, with and without dropouts.

Run: ``.venv/bin/python -m benchmarks.bench_pass_scale --quick`` (E <= 1,000) or without ``--quick`` for
E = 100, 1,000, 10,000. Every client is driven for real in this process (all four rounds, its state
round-tripped through its record as in a Flower deployment); the dropouts leave after key sharing, so the
server rebuilds their mask keys and strips their pairwise masks.
Client figures are means over the survivors. Server peak memory is tracemalloc's peak
while a deep copy of the server and of the step's incoming replies, made under tracing, runs each step. Wall time
includes that tracing. The last column, "all-pairs client s", is a reference, not a protocol run: the CPU time of
one client deriving its pairwise masks with all E - 1 peers (per peer one X25519 exchange, the HKDF pair seed, a
ChaCha20 expansion of C words, added with its sign), built from :mod:`flmarket_flwr.pass_protocol.primitives` as
PASS v2's client builds its k masks. It is the masking cost of an all-pairs protocol (as PASS v1 was; removed), linear
in E per client and so quadratic over the federation, against PASS v2's k = O(log E) masks per client.
E = 10,000 drives all 10,000 clients (about 12 ms of CPU each: a few minutes per case on one core).
"""

from __future__ import annotations

import argparse
import copy
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from flmarket_flwr.pass_protocol import PassClient, PassServer
from flmarket_flwr.pass_protocol.primitives import (
    derive_pair_seed,
    exchange_shared_secret,
    expand_seed,
    pairwise_sign,
    parse_public_key,
    validate_counts,
)


@dataclass
class Figures:
    """Measured figures of one PASS v2 session."""

    degree: int = 0
    client_cpu: list[float] = field(default_factory=list)
    client_bytes: list[int] = field(default_factory=list)
    server_cpu: float = 0.0
    server_peak: int = 0
    wall: float = 0.0
    survivors: list[int] = field(default_factory=list)
    trace_memory: bool = True

    def per_survivor(self, values: list[float] | list[int]) -> float:
        """Mean over the clients that ran all four rounds."""
        return float(np.mean([values[u - 1] for u in self.survivors]))


def record_bytes(record: dict[str, Any]) -> int:
    """Wire size of a record: bytes by length, ints as 8 bytes."""

    def size(value: Any) -> int:
        if isinstance(value, bytes):
            return len(value)
        if isinstance(value, list):
            return 8 * len(value) if value and isinstance(value[0], int) else sum(size(v) for v in value)
        return 8

    return sum(size(v) for v in record.values())


def server_step(figures: Figures, server: PassServer, method: str, *args: Any) -> Any:
    """Run one server step: peak memory on a traced deep copy, CPU time on the real object."""
    if figures.trace_memory:
        tracemalloc.start()
        clone, clone_args = copy.deepcopy((server, args))
        getattr(clone, method)(*clone_args)
        figures.server_peak = max(figures.server_peak, tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        del clone, clone_args
    start = time.process_time()
    result = getattr(server, method)(*args)
    figures.server_cpu += time.process_time() - start
    return result


def client_round(
    figures: Figures, states: dict[int, dict], requests: dict[int, Any], call: Callable[[PassClient, Any], Any]
) -> dict[int, dict]:
    """One round over every client that got a request; client CPU and bytes accumulate per client."""
    replies = {}
    for index, request in requests.items():
        record = request.to_record()
        start = time.process_time()
        client = PassClient.from_record(states[index])
        reply = call(client, record).to_record()
        states[index] = client.to_record()
        figures.client_cpu[index - 1] += time.process_time() - start
        figures.client_bytes[index - 1] += record_bytes(record) + record_bytes(reply)
        replies[index] = reply
    return replies


def run_session(num_clients: int, num_classes: int, dropouts: int, *, seed: int = 0, memory: bool = True) -> Figures:
    """One PASS v2 session with ``dropouts`` clients leaving after key sharing."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 1000, size=(num_clients, num_classes))
    figures = Figures(client_cpu=[0.0] * num_clients, client_bytes=[0] * num_clients, trace_memory=memory)
    wall = time.perf_counter()
    server = PassServer(b"bench", num_classes, 1000)
    requests = server_step(figures, server, "advertise_requests", list(range(num_clients)))
    states: dict[int, dict] = {i: {} for i in requests}
    replies = client_round(figures, states, requests, lambda c, r: c.advertise(r, counts[c_index(r)]))
    requests = server_step(figures, server, "receive_advertisements", replies)
    figures.degree = server.degree
    replies = client_round(figures, states, requests, lambda c, r: c.share_keys(r))
    requests = server_step(figures, server, "receive_shares", replies)
    gone = set(rng.choice(np.arange(1, num_clients + 1), dropouts, replace=False).tolist())
    requests = {i: r for i, r in requests.items() if i not in gone}
    replies = client_round(figures, states, requests, lambda c, r: c.mask_input(r))
    requests = server_step(figures, server, "receive_masked", replies)
    replies = client_round(figures, states, requests, lambda c, r: c.unmask(r))
    server_step(figures, server, "receive_unmask", replies)
    total = server_step(figures, server, "finish")
    expected = counts[[u - 1 for u in server.survivors]].sum(axis=0)
    assert (total == expected).all(), "PASS v2 sum mismatch"
    figures.wall = time.perf_counter() - wall
    figures.survivors = list(server.survivors)
    return figures


def c_index(record: dict[str, Any]) -> int:
    """Row of the counts matrix for an advertise request record."""
    return record["index"] - 1


def all_pairs_client_seconds(num_clients: int, num_classes: int, *, session: bytes = b"bench") -> float:
    """CPU time of one client masking its counts with all ``E - 1`` peers: the all-pairs reference.

    Per peer, as PASS v2's client does for each of its ``k`` neighbours: parse the peer's X25519 public key,
    one exchange, the HKDF pair seed bound to the session and the pair, a ChaCha20 expansion of ``C`` words,
    added with the pair's sign in ``Z_2^64``. The peers' key pairs are made before the clock starts.
    """
    own = num_clients // 2  # peers on both sides: both signs of the pairwise mask occur
    peer_keys = {i: X25519PrivateKey.generate().public_key().public_bytes_raw() for i in range(num_clients) if i != own}
    private_key = X25519PrivateKey.generate()
    counts = np.arange(num_classes)
    start = time.process_time()
    masked = validate_counts(counts).copy()
    for peer, peer_key in peer_keys.items():
        secret = exchange_shared_secret(private_key, parse_public_key(peer_key, peer), peer)
        mask = expand_seed(derive_pair_seed(secret, session, own, peer), num_classes)
        if pairwise_sign(own, peer) > 0:
            masked += mask
        else:
            masked -= mask
    elapsed = time.process_time() - start
    assert masked.shape == (num_classes,)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="E <= 1,000 only")
    parser.add_argument("--sizes", type=int, nargs="*", help="override the numbers of clients E")
    parser.add_argument("--classes", type=int, nargs="*", default=[10, 1000], help="numbers of classes C")
    parser.add_argument("--no-dropouts", action="store_true", help="skip the one-dropout and 10%% cases")
    parser.add_argument("--no-memory", action="store_true", help="skip the traced server copy (faster)")
    args = parser.parse_args()
    sizes = args.sizes or ([100, 1000] if args.quick else [100, 1000, 10_000])
    header = (
        f"{'E':>6} {'C':>5} {'dropped':>8} {'k':>3} {'client CPU s':>13} {'client KiB':>11} "
        f"{'server CPU s':>13} {'server peak MiB':>16} {'wall s':>7} {'all-pairs client s':>19}"
    )
    print(header)
    print("-" * len(header))
    for num_clients in sizes:
        for num_classes in args.classes:
            all_pairs = all_pairs_client_seconds(num_clients, num_classes)
            with_dropouts = num_classes == min(args.classes) and not args.no_dropouts
            for dropouts in (0, 1, num_clients // 10) if with_dropouts else (0,):
                f = run_session(num_clients, num_classes, dropouts, memory=not args.no_memory)
                print(
                    f"{num_clients:>6} {num_classes:>5} {dropouts:>8} {f.degree:>3} "
                    f"{f.per_survivor(f.client_cpu):>13.4f} {f.per_survivor(f.client_bytes) / 1024:>11.1f} "
                    f"{f.server_cpu:>13.3f} {f.server_peak / 2**20:>16.1f} {f.wall:>7.1f} {all_pairs:>19.4f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
