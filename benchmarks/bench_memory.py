"""Peak memory of the market phase with 1,000 simulated clients in one process.

Run: ``.venv/bin/python -m benchmarks.bench_memory`` (about 90 s on 2 cores; ``--clients 1000``
for one size only).

Every measurement runs in a fresh Python process: ``E`` real ClientApps (the market handlers,
:func:`simulations.inprocess_grid.market_client_app`, ``C`` = 10 classes) behind an in-process
grid, and the whole market phase (``MarketPhase.run``: PASS, scores and bids, auction, awards)
over it. Every message crosses Flower's wire format and every node's ``Context`` is kept as
serialised protobuf between messages, as :class:`~simulations.inprocess_grid.InProcessGrid`
does; unlike that test grid, the one here keeps no copy of the messages once delivered
(a server does not either).

Figures, for the market phase only (the set-up of the grid and the imports excluded):

* **peak RSS**: the process's resident-set high-water mark (``VmHWM``, reset through
  ``/proc/self/clear_refs`` just before the phase), and its rise over the RSS before the phase;
* **Python heap peak**: ``tracemalloc``'s peak of the memory Python allocated during the phase,
  measured in a second, separate run (tracing slows the run down);
* the largest batch of requests the server sends in one step (serialised bytes, measured): with
  PASS v2 each request carries what concerns the client's ``k = neighbourhood_size(E)`` neighbours
  (their keys at the share step, the ciphertexts of their shares at the mask step), so those batches
  grow as ``E * k``; the endorsement step's requests each carry the whole award (every bidder's score,
  bid and payment), so that batch grows as ``E^2``.

Everything (server, ``E`` clients, transport) shares the one process, so the figures are an
upper bound for the server alone; a client's own state is its serialised ``Context``, reported
per client.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from uuid import uuid4

import numpy as np

NUM_CLASSES = 10


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def one_run(num_clients: int, trace: bool) -> dict:
    """Set up ``num_clients`` ClientApps, run the market phase once, return its memory figures."""
    import logging  # pylint: disable=import-outside-toplevel

    from flwr.app import Message  # pylint: disable=import-outside-toplevel

    from flmarket_flwr.market import CostBasedBid, MarketConfig, MarketPhase  # pylint: disable=import-outside-toplevel
    from simulations.inprocess_grid import (  # pylint: disable=import-outside-toplevel
        InProcessGrid,
        market_client_app,
        serverapp_identity,
        wire_roundtrip,
    )

    class LeanGrid(InProcessGrid):
        """The in-process grid without its test bookkeeping (copies of every message); counts request bytes."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.batch_bytes: dict[str, int] = {}

        def push_messages(self, messages: Iterable[Message]) -> list[str]:
            ids = []
            for message in messages:
                message.metadata.__dict__["_message_id"] = str(uuid4())
                delivered, raw = wire_roundtrip(message)
                self._accept(message.metadata.message_id, delivered)
                kind = message.metadata.message_type
                self.batch_bytes[kind] = self.batch_bytes.get(kind, 0) + len(raw)
                ids.append(message.metadata.message_id)
            return ids

        def _receive(self, reply: Message) -> Message:
            return wire_roundtrip(reply)[0]

    logging.getLogger("flwr").setLevel(logging.WARNING)
    rng = np.random.default_rng(num_clients)
    counts = {10_000 + i: rng.integers(0, 200, size=NUM_CLASSES) for i in range(num_clients)}
    grid = LeanGrid(market_client_app(counts, CostBasedBid(0.05)), list(counts), shuffle_seed=None)
    config = MarketConfig(
        budget=10.0 * num_clients,
        num_classes=NUM_CLASSES,
        timeout=3600.0,
        expected_nodes=num_clients,
        poll_interval=0.001,
    )
    rss_before = _status_kib("VmRSS")
    reset = _reset_peak_rss()
    if trace:
        tracemalloc.start()
    started = time.perf_counter()
    with serverapp_identity(grid.run.run_id):
        outcome = MarketPhase(config).run(grid)
    elapsed = time.perf_counter() - started
    result = {
        "clients": num_clients,
        "trace": trace,
        "seconds": elapsed,
        "rss_before_mib": rss_before / 1024,
        "peak_rss_mib": (_status_kib("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024,
        "peak_rss_is_phase_only": reset,
        "winners": len(outcome.winners),
        "context_bytes_per_client": float(np.mean([len(raw) for raw in grid._contexts.values()])),  # noqa: SLF001
        "largest_batch_bytes": max(grid.batch_bytes.values()),
        "largest_batch_step": max(grid.batch_bytes, key=lambda kind: grid.batch_bytes[kind]),
        "masked_vectors_bytes": num_clients * NUM_CLASSES * 8,
    }
    if trace:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        result["python_heap_peak_mib"] = peak / 2**20
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=[100, 500, 1000])
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", help="also write the raw figures to this JSON file")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_run(args.one, args.trace)))
        return
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
        f"load average at start {os.getloadavg()[0]:.2f}\n"
    )
    rows = []
    for num_clients in args.clients:
        runs = {}
        for trace in (False, True):
            command = [sys.executable, "-m", "benchmarks.bench_memory", "--one", str(num_clients)]
            command += ["--trace"] if trace else []
            output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            runs[trace] = json.loads(output.strip().splitlines()[-1])
        traced = {"python_heap_peak_mib": runs[True]["python_heap_peak_mib"], "traced_seconds": runs[True]["seconds"]}
        rows.append({**runs[False], **traced})
        print(f"  ... {num_clients} clients done", flush=True)
    print(
        "\n| clients | market phase | RSS before | peak RSS during the phase | rise | Python heap peak (tracemalloc) "
        "| largest request batch (step) | per-client Context after the phase |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['clients']:,} | {r['seconds']:.1f} s | {r['rss_before_mib']:.0f} MiB | {r['peak_rss_mib']:.0f} MiB "
            f"| {r['peak_rss_mib'] - r['rss_before_mib']:.0f} MiB | {r['python_heap_peak_mib']:.0f} MiB "
            f"| {r['largest_batch_bytes'] / 2**20:.1f} MiB ({r['largest_batch_step']}) "
            f"| {r['context_bytes_per_client']:.0f} B |"
        )
    if not all(r["peak_rss_is_phase_only"] for r in rows):
        print("\n(/proc/self/clear_refs was not writable: peak RSS is the whole process's)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
