"""The whole market phase at scale, in one process: PASS v2, scores and bids, auction, awards, step by step.

Run: ``.venv/bin/python -m benchmarks.bench_market_scale --sizes 1000 3000 10000`` (default E = 10,000
alone: about 4.5 min of CPU on this machine, 8 min of wall time under load 6 to 8, most of it the
10,000 ClientApps run one after the other). ``--secure-colluders 0.05``: the secure profile instead, buyer and
nodes stating ``c = ceil(0.05 E)`` colluders (node config ``market-security=malicious``, each node its own identity
key file and the pinned directory, a release ledger; the buyer ``security="malicious"``, ``pass_colluders=c``), so
that PASS runs in the sparse secure mode where the finder's degree is below ``E - 1``; ``--runs 3`` repeats the
sizes, alternating.

``E`` real ClientApps with the market handlers (:func:`simulations.inprocess_grid.market_client_app`,
``C`` label counts each, drawn in ``[0, 200)``, bids from :class:`~flmarket_flwr.market.CostBasedBid`)
behind an in-process grid, and ``MarketPhase(...).run(grid)`` over them, with the product's defaults
(``neighbours = "auto"``: PASS v2 on the Harary graph of degree ``neighbourhood_size(E)``, the winners'
audit on). Every message crosses Flower's wire format and every node's ``Context`` is kept as serialised
protobuf between messages (as :class:`~simulations.inprocess_grid.InProcessGrid` does; unlike that test
grid, the one here keeps no copy of a message once delivered, as a server does not).

Figures:

* per step: the wall seconds ``MarketOutcome.timings`` gives (every client and the server one after
  another in this process: in a deployment the clients run in parallel), and per message type the
  clients' CPU (``time.process_time`` around each ClientApp call, context load and save included), their
  mean per client and the bytes of the serialised messages each way;
* server CPU: the process CPU of the whole phase minus all clients' CPU (transport included);
* peak RSS: the process's high-water mark (``VmHWM``, reset through ``/proc/self/clear_refs`` just
  before the phase) and its rise over the RSS before it. Server, the ``E`` clients' stored contexts
  and the transport share the process: an upper bound for the server;
* the load average (``os.getloadavg``) at the start and at the end of each size;
* the X25519 floor (issue 20): the CPU that the ``2 k`` X25519 exchanges of each of the ``E`` clients
  (two per neighbour) take on their own, timed in the same run right after the phase (a sample of
  ``FLOOR_SAMPLE`` exchanges, scaled to ``2 k E``), and the phase's process CPU over it.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from uuid import uuid4

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from flwr.app import Message

from flmarket_flwr.market import CostBasedBid, MarketConfig, MarketPhase
from flmarket_flwr.pass_protocol.encoding import PassError
from flmarket_flwr.pass_protocol.graph import neighbourhood_size
from simulations.inprocess_grid import (
    InProcessGrid,
    market_client_app,
    secure_profile_setup,
    serverapp_identity,
    wire_roundtrip,
)

MAX_COUNT = 200
FLOOR_SAMPLE = 20_000
STEPS = ("wait_for_nodes", "pass", "bid", "auction", "award", "total")


def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def _reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


class ScaleGrid(InProcessGrid):
    """In-process grid that keeps no copies and counts client CPU and bytes per message type."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cpu: dict[str, float] = defaultdict(float)
        self.messages: dict[str, int] = defaultdict(int)
        self.bytes_in: dict[str, int] = defaultdict(int)
        self.bytes_out: dict[str, int] = defaultdict(int)

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        ids = []
        for message in messages:
            if message.metadata.dst_node_id not in self._contexts:
                raise ValueError(f"unknown destination node {message.metadata.dst_node_id}")
            message.metadata.__dict__["_message_id"] = str(uuid4())
            copy, raw = wire_roundtrip(message)
            self.bytes_in[message.metadata.message_type] += len(raw)
            self._accept(message.metadata.message_id, copy)
            ids.append(message.metadata.message_id)
        return ids

    def _deliver(self, message: Message) -> Message | None:
        kind = message.metadata.message_type
        started = time.process_time()
        reply = super()._deliver(message)
        self.cpu[kind] += time.process_time() - started
        self.messages[kind] += 1
        return reply

    def _receive(self, reply: Message) -> Message:
        received, raw = wire_roundtrip(reply)
        self.bytes_out[reply.metadata.message_type] += len(raw)
        return received


def x25519_seconds(exchanges: int) -> float:
    """Process CPU of ``exchanges`` X25519 exchanges, from a timed sample of at most ``FLOOR_SAMPLE`` of them."""
    sample = min(exchanges, FLOOR_SAMPLE)
    own = X25519PrivateKey.generate()
    peers = [X25519PrivateKey.generate().public_key() for _ in range(min(sample, 1000))]
    started = time.process_time()
    for i in range(sample):
        own.exchange(peers[i % len(peers)])
    return (time.process_time() - started) * exchanges / sample


def secure_setup(nodes: list[int], colluders: int, folder: Path) -> tuple[dict[int, dict[str, Any]], dict[str, Any]]:
    """Each node's node config in the secure profile stating ``colluders`` (its own key file, the pinned directory, a
    ledger under ``folder``), and the buyer's :class:`MarketConfig` fields for it."""
    os.environ["FLMARKET_HOME"] = str(folder / "home")  # the nodes' ledgers
    configs, directory = secure_profile_setup(folder, nodes)
    for config in configs.values():
        config["pass-colluders"] = colluders
    return dict(configs), {"security": "malicious", "directory": directory, "pass_colluders": colluders}


class _GraphForced(MarketConfig):
    """The secure profile's buyer with the graph forced (``--graphs sparse``): the sparse secure mode wherever the
    finder gives a degree below ``E - 1``, whatever it costs (to measure what the profile's rule avoids)."""

    def runs_sparse(self, invited: int) -> bool:
        settings = self.sparse_settings
        try:
            return settings is not None and not settings.parameters(invited).complete
        except PassError:  # no roster yet, or one below the floor: the complete graph
            return False


def one_size(num_clients: int, num_classes: int, secure_colluders: float | None = None, graph: str = "auto") -> dict:
    """Set up ``num_clients`` ClientApps, run the market phase once, return its figures (``graph``: the secure
    profile's own choice, ``"sparse"`` forced, or ``"complete"``, ``neighbours="all"``)."""
    rng = np.random.default_rng(num_clients)
    nodes = [10_000 + i for i in range(num_clients)]
    counts = {node: rng.integers(0, MAX_COUNT, size=num_classes) for node in nodes}
    with tempfile.TemporaryDirectory() as folder:
        configs, secure = None, dict[str, Any]()
        if secure_colluders is not None:
            configs, secure = secure_setup(nodes, math.ceil(secure_colluders * num_clients), Path(folder))
        grid = ScaleGrid(market_client_app(counts, CostBasedBid(0.05)), nodes, shuffle_seed=None, node_configs=configs)
        kind = _GraphForced if graph == "sparse" else MarketConfig
        if graph == "complete":
            secure["neighbours"] = "all"
        config = kind(
            budget=10.0 * num_clients,
            num_classes=num_classes,
            timeout=3600.0,
            expected_nodes=num_clients,
            poll_interval=0.001,
            **secure,
        )
        return _measured(grid, config, counts)


def _measured(grid: ScaleGrid, config: MarketConfig, counts: dict[int, np.ndarray]) -> dict:
    """Run the market phase over ``grid`` and return its figures."""
    num_clients, num_classes = len(counts), config.num_classes
    sparse, settings = config.runs_sparse(num_clients), config.sparse_settings
    if sparse and settings is not None:
        degree = settings.parameters(num_clients).degree  # each client's out-degree
    else:
        degree = num_clients - 1 if config.security == "malicious" else neighbourhood_size(num_clients)
    load_start = os.getloadavg()[0]
    rss_before = _status_mib("VmRSS")
    reset = _reset_peak_rss()
    cpu = time.process_time()
    with serverapp_identity(grid.run.run_id):
        outcome = MarketPhase(config).run(grid)
    cpu = time.process_time() - cpu
    peak = _status_mib("VmHWM") if reset else math.nan
    # the default profile's floor: 2 k exchanges a client; the secure profile's clients also check signatures and
    # proofs, and in the sparse mode agree with in-neighbours too: no floor is claimed for it
    floor = math.nan if config.security == "malicious" else x25519_seconds(2 * degree * num_clients)
    truth = np.sum(list(counts.values()), axis=0)
    error = np.abs(np.asarray(outcome.global_counts) - truth)
    assert np.all(error <= config.noise_tolerance), "N_s is not the sum of the counts (within the noise's tail)"
    assert len(outcome.pass_participants) == num_clients and not outcome.excluded, outcome.excluded
    return {
        "clients": num_clients,
        "classes": num_classes,
        "colluders": config.pass_colluders if config.security == "malicious" else 0,
        "profile": "secure, sparse"
        if sparse
        else ("secure, complete" if config.security == "malicious" else "default"),
        "degree": degree,
        "winners": len(outcome.winners),
        "timings": dict(outcome.timings),
        "client_cpu_by_type": dict(grid.cpu),
        "messages_by_type": dict(grid.messages),
        "bytes_to_clients_by_type": dict(grid.bytes_in),
        "bytes_from_clients_by_type": dict(grid.bytes_out),
        "process_cpu_s": cpu,
        "server_cpu_s": cpu - sum(grid.cpu.values()),
        "x25519_floor_s": floor,
        "rss_before_mib": rss_before,
        "peak_rss_mib": peak,
        "client_contexts_mib": sum(len(raw) for raw in grid._contexts.values()) / 2**20,  # pylint: disable=W0212
        "load_start": load_start,
        "load_end": os.getloadavg()[0],
    }


def report(rows: list[dict]) -> None:
    print("Market phase by step, wall seconds (MarketOutcome.timings; all clients and the server in one process)\n")
    print(
        "| E | profile | C | k | winners | wait for nodes | PASS | scores and bids | auction | awards | total "
        "| process CPU | server CPU | server CPU / (E k) | X25519 floor | CPU / floor | peak RSS (rise) "
        "| sent to a client | load start / end |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        t = r["timings"]
        cells = " | ".join(f"{t.get(step, math.nan):.2f}" for step in STEPS)
        sent = sum(r["bytes_to_clients_by_type"].values()) / r["clients"]
        print(
            f"| {r['clients']:,} | {r['profile']}, c = {r['colluders']} | {r['classes']} | {r['degree']} "
            f"| {r['winners']:,} | {cells} "
            f"| {r['process_cpu_s']:.1f} s | {r['server_cpu_s']:.1f} s "
            f"| {r['server_cpu_s'] / (r['clients'] * r['degree']) * 1e6:.1f} us "
            f"| {r['x25519_floor_s']:.1f} s | {r['process_cpu_s'] / r['x25519_floor_s']:.2f}x "
            f"| {r['peak_rss_mib']:.0f} MiB ({r['peak_rss_mib'] - r['rss_before_mib']:+.0f} MiB) "
            f"| {sent / 1e6:.2f} MB | {r['load_start']:.1f} / {r['load_end']:.1f} |"
        )
    print("\nPer message type: clients' CPU and bytes\n")
    print(
        "| E | message | messages | client CPU, all | per client | bytes to clients, per message "
        "| bytes from clients, per message |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|")
    for r in rows:
        for kind, n in r["messages_by_type"].items():
            cpu = r["client_cpu_by_type"][kind]
            print(
                f"| {r['clients']:,} | {kind} | {n:,} | {cpu:.1f} s | {cpu / n * 1e3:.2f} ms "
                f"| {r['bytes_to_clients_by_type'].get(kind, 0) / n:,.0f} B "
                f"| {r['bytes_from_clients_by_type'].get(kind, 0) / n:,.0f} B |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000], help="numbers of clients E")
    parser.add_argument("--classes", type=int, default=10, help="number of classes C")
    parser.add_argument("--json", help="also write the raw figures to this JSON file")
    parser.add_argument(
        "--secure-colluders",
        type=float,
        nargs="+",
        help="the secure profile with this share of colluders stated (e.g. 0.05; several: each in turn)",
    )
    parser.add_argument(
        "--graphs",
        nargs="+",
        choices=("auto", "sparse", "complete"),
        default=["auto"],
        help="the secure profile's graph: its own choice (auto), the sparse mode forced, the complete graph; "
        "several: side by side at each size and share",
    )
    parser.add_argument("--runs", type=int, default=1, help="runs of all the sizes, one after the other")
    args = parser.parse_args()
    logging.getLogger("flwr").setLevel(logging.WARNING)
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"numpy {np.__version__}; load average at start {os.getloadavg()[0]:.2f}\n",
        flush=True,
    )
    rows = []
    shares = args.secure_colluders or [None]
    for _run in range(args.runs):
        for num_clients in args.sizes:
            for share in shares:
                for graph in args.graphs if share is not None else ["auto"]:
                    rows.append(one_size(num_clients, args.classes, share, graph))
                    print(
                        f"  ... E={num_clients:,} {rows[-1]['profile']}, c = {rows[-1]['colluders']}, k = "
                        f"{rows[-1]['degree']}: process CPU {rows[-1]['process_cpu_s']:.1f} s, "
                        f"{json.dumps(rows[-1]['timings'])}",
                        flush=True,
                    )
                    if args.json:
                        Path(args.json).write_text(json.dumps(rows, indent=2), encoding="utf-8")
    print()
    report(rows)


if __name__ == "__main__":
    main()
