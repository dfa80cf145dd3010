"""What the secure profile costs: the default profile, the secure profile and Flower's SecAgg+, side by side.

Run: ``.venv/bin/python -m benchmarks.bench_profiles`` (E = 100 and 1,000, C = 10); ``--sizes`` to choose;
``--secure-whole-max`` the largest E at which the secure profile runs whole (default 100: on the complete
graph its cost grows with E per client, see below).

What runs
---------
Every client holds ``C`` label counts in ``[0, 1000)`` and bids; each row is one whole market phase or one
aggregation, through the same measuring in-process grid as ``bench_secagg`` (:class:`MeasuredGrid`: every
message crosses Flower's wire format, every node's ``Context`` is rebuilt from protobuf for every message).

* **default**: ``MarketPhase(MarketConfig(budget, C)).run(grid)``, nodes without node config: PASS on the
  Harary graph of degree ``neighbourhood_size(E)``, the bids, the auction, the signed award and its endorse
  round, the winners' opening.
* **secure**: the same call with ``MarketConfig(..., security="malicious")`` (complete graph, Skellam noise
  announced by the buyer) and every node in ``market-security=malicious``: its own Ed25519 identity key (PEM
  file), one directory of all ``E`` identity keys pinned by its digest, the complete graph, split tolerance 2,
  noise within the profile's budget, and the profile's release ledger (a folder per node under a temporary
  ``FLMARKET_HOME``: its file I/O is counted in the client's CPU).
* **SecAgg+**: Flower's ``SecAggPlusWorkflow`` summing the counts at ``k = neighbourhood_size(E)``
  (``bench_secagg.run_secagg``: whole at E <= ``--secagg-whole-max``; above, ``drive_one_secagg_client``: one
  real client through its four stages, server CPU extrapolated; see ``bench_secagg``'s docstring).
  SecAgg+ is an aggregation only (no bids, auction or award) and runs on its sparse graph, the secure profile
  on the complete one.

Above ``--secure-whole-max`` the secure profile is not run: on the complete graph every client deals to and
checks all ``E - 1`` others, so the federation's work grows as ``E^2`` (E = 1,000 is about 100 times E = 100,
with ``E (E - 1)`` share ciphertexts in one process). The ratio table then says so; ``benchmarks/RESULTS.md``
section 1 gives the secure profile whole at E = 300 (``--sizes 300 --secure-whole-max 300``).

Client CPU: ``time.process_time`` around each ClientApp call, summed per client, mean over clients. Server
CPU: the process's CPU over the run minus all clients' CPU. Bytes: serialised replies sent per client.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
from flwr.app import UserConfig
from flwr.clientapp import ClientApp

from benchmarks.bench_secagg import (
    MeasuredGrid,
    PeakRss,
    Row,
    _row,
    drive_one_secagg_client,
    make_counts,
    node_ids,
    run_secagg,
)
from flmarket_flwr.app.client_app import node_settings_of
from flmarket_flwr.market import MarketConfig, MarketPhase, register_market_handlers
from flmarket_flwr.market.node.bidding import CostBasedBid
from flmarket_flwr.pass_protocol import IdentityDirectory, generate_identity, save_identity_key
from simulations.inprocess_grid import InProcessGrid, serverapp_identity

SIZES = (100, 1_000)
NUM_CLASSES = 10
BUDGET = 1_000.0
TARGET_RATIO = 10  # the secure profile at least 10x below SecAgg+'s client CPU
SECAGG_COMPLETE = "SecAgg+ complete"  # SecAgg+ on the secure profile's graph (k = E - 1), one client driven


def secure_node_configs(nodes: list[int], folder: Path) -> tuple[dict[int, UserConfig], IdentityDirectory]:
    """Node configs of the secure profile: an identity key per node and one directory of all, pinned by digest;
    and the directory, which the buyer holds too."""
    publics = {}
    for node in nodes:
        private, public = generate_identity()
        save_identity_key(private, folder / f"{node}.pem")
        publics[node] = public
    directory = IdentityDirectory(publics)
    (folder / "directory.json").write_text(directory.to_json())
    digest = directory.digest().hex()
    configs: dict[int, UserConfig] = {
        node: {
            "market-security": "malicious",
            "identity-key": str(folder / f"{node}.pem"),
            "identity-directory": str(folder / "directory.json"),
            "identity-directory-digest": digest,
        }
        for node in nodes
    }
    return configs, directory


def profile_client_app(label_counts: dict[int, np.ndarray]) -> ClientApp:
    """The market handlers as ``client_app.build_client_app`` registers them (the node config's settings with the
    run config's noise), serving fixed counts and bids of 0.01 per sample: a node without node config is in the
    default profile."""
    app = ClientApp()
    register_market_handlers(
        app, lambda context: label_counts[context.node_id], CostBasedBid(0.01), settings=node_settings_of
    )
    return app


def run_market(counts: np.ndarray, profile: str) -> Row:
    """One whole market phase in ``profile`` ("default" or "secure") over the rows of ``counts``."""
    num_clients, num_classes = counts.shape
    nodes = node_ids(num_clients)
    app = profile_client_app(dict(zip(nodes, counts, strict=True)))
    with tempfile.TemporaryDirectory() as folder:
        secure = profile == "secure"
        os.environ["FLMARKET_HOME"] = str(Path(folder) / "home")
        grid, directory = MeasuredGrid(app, nodes), None
        if secure:  # MeasuredGrid takes no node configs: its contexts are rebuilt as InProcessGrid builds them
            configs, directory = secure_node_configs(nodes, Path(folder))
            grid = _with_node_configs(grid, app, nodes, configs)
        config = MarketConfig(
            budget=BUDGET,
            num_classes=num_classes,
            timeout=3600.0,
            poll_interval=0.001,
            security="malicious" if secure else "semi-honest",
            directory=directory,
        )
        with PeakRss() as rss:
            cpu, wall = time.process_time(), time.perf_counter()
            outcome = MarketPhase(config).run(grid)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert outcome.pass_participants == nodes, "a node left PASS: the figures would not be of E clients"
    row = _row(profile, grid, wall, cpu, np.asarray(outcome.global_counts), counts.sum(axis=0), rss)
    row.how = f"whole market phase, {len(outcome.winners)} winners"
    if secure:
        row.degree, row.threshold = num_clients - 1, 0
    return row


def _with_node_configs(
    grid: MeasuredGrid, app: ClientApp, nodes: list[int], configs: dict[int, UserConfig]
) -> MeasuredGrid:
    built = InProcessGrid(app, nodes, node_configs=configs, shuffle_seed=None)
    grid._contexts = built._contexts  # pylint: disable=protected-access
    return grid


def print_rows(rows: list[Row]) -> None:
    columns = ("E", "C", "profile", "how", "wall", "client CPU mean (max)", "server CPU", "bytes sent per client")
    print("| " + " | ".join((*columns, "max error", "load")) + " |")
    print("|---:|---:|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r.num_clients:,} | {r.num_classes} | {r.protocol} | {r.how} | {r.wall_s:.3g} s "
            f"| {r.client_cpu_mean_s * 1e3:.3g} ms ({r.client_cpu_max_s * 1e3:.3g} ms) | {r.server_cpu_s:.3g} s "
            f"| {r.client_bytes_mean / 1e3:.3g} kB | {r.max_error:.3g} | {r.load:.1f} |"
        )


def print_ratios(rows: list[Row]) -> None:
    print(
        "\n| E | secure/default client CPU | server CPU | bytes | SecAgg+/secure client CPU | target >= 10x "
        "| SecAgg+ on the complete graph/secure |"
    )
    print("|---:|---:|---:|---:|---:|---|---:|")
    for num_clients in sorted({r.num_clients for r in rows}):
        by = {r.protocol: r for r in rows if r.num_clients == num_clients}
        default, secure, secagg = by.get("default"), by.get("secure"), by.get("SecAgg+")
        if default is None or secure is None or secagg is None:
            print(f"| {num_clients:,} | (not every profile measured) | | | | | |")
            continue
        ratio = secagg.client_cpu_mean_s / secure.client_cpu_mean_s
        complete = by.get(SECAGG_COMPLETE)
        same_graph = f"{complete.client_cpu_mean_s / secure.client_cpu_mean_s:.1f}x" if complete else "-"
        print(
            f"| {num_clients:,} | {secure.client_cpu_mean_s / default.client_cpu_mean_s:.1f}x "
            f"| {secure.server_cpu_s / default.server_cpu_s:.1f}x "
            f"| {secure.client_bytes_mean / default.client_bytes_mean:.1f}x | {ratio:.1f}x "
            f"| {'met' if ratio >= TARGET_RATIO else 'NOT met'} | {same_graph} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="*", default=list(SIZES), help="numbers of clients E")
    parser.add_argument("--classes", type=int, default=NUM_CLASSES, help="number of classes C")
    parser.add_argument("--secure-whole-max", type=int, default=100, help="largest E for the secure profile")
    parser.add_argument("--secagg-whole-max", type=int, default=100, help="largest E at which SecAgg+ runs whole")
    parser.add_argument("--json", help="also write every row to this JSON file")
    args = parser.parse_args()
    logging.getLogger("flwr").setLevel(logging.WARNING)
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
        f"load average at start {os.getloadavg()[0]:.2f}\n",
        flush=True,
    )
    rows: list[Row] = []
    for num_clients in args.sizes:
        counts = make_counts(num_clients, args.classes)
        with serverapp_identity():  # this process plays the ServerApp of every grid's run (their default run id)
            rows.append(run_market(counts, "default"))
            if num_clients <= args.secure_whole_max:
                rows.append(run_market(counts, "secure"))
            if num_clients <= args.secagg_whole_max:
                rows.append(run_secagg(counts))
            else:
                rows.extend(drive_one_secagg_client(num_clients, {args.classes: counts[0]}))
            for row in drive_one_secagg_client(num_clients, {args.classes: counts[0]}, degree=num_clients - 1):
                row.protocol = SECAGG_COMPLETE
                rows.append(row)
        print(f"  ... E={num_clients} done, load {os.getloadavg()[0]:.1f}", flush=True)
    print()
    print_rows(rows)
    print_ratios(rows)
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
