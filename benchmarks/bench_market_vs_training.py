"""The market phase against training, and Flower's simulation against the bare training compute.

Run: ``.venv/bin/python -m benchmarks.bench_market_vs_training`` (about 2 min on 2 cores;
``--clients 20`` for one size only; ``--market-only`` for the in-process market phase alone, seconds;
``--secure`` adds the in-process market in the secure profile, the cost of each re-launch).

For 20 and 100 clients, the app's own ``ServerApp`` (``server_app.main``) and ``ClientApp``
(``build_client_app``) run through ``flwr.simulation.run_simulation`` (Ray, one actor per CPU,
``torch-threads = 1``, Flower's defaults otherwise, including its 0.1 s reply-polling interval)
for 3 FedAvg rounds. The app's defaults hold (digits, Dirichlet 0.5, ``digits_cnn``, 3 local
epochs, batch 8) except: a cohort of half the clients at a budget that does not bind (both sizes
train the same share),
and distribution d1 (on d4, the ~600 images left give ``alpha = N_s / (E C) <= 1`` at 100
clients: every score is 0 and the market selects nobody).

* **market phase** (PASS v2's four rounds, scores and bids, auction, awards, as timed by
  ``MarketPhase``): the app's own, from its ``history.json`` (cold: on first contact Ray starts its
  actors, which import Flower and the app and load the data; a PASS v2 client takes part in one
  session per run, so there is no second, warm market phase in the same simulation); and the same
  phase on in-process grids (same ClientApp, no Ray, no polling interval): a first grid (cold:
  loads the data set and computes the partitions), then a fresh grid of fresh nodes (warm caches):
  the protocol's own cost;
* **one FedAvg round**: the app's ``round_time_s`` (sending the model, every winner's local
  training, the replies and the aggregation; the server-side evaluation is not in it), round 1
  (cold: the actors import torch) and the mean of the later rounds (warm);
* **bare compute**: the winners' local training run here directly with
  :func:`flmarket_flwr.app.task.train` (same partitions, model, epochs, batch size, learning rate and
  seeds, one thread, after one untimed warm-up), summed; the ideal round on ``W`` workers is the
  longest-first schedule of those times. Flower's overhead per round = warm round - that ideal.
  The clients' own timing of their training inside the ClientApp (train-audit files, warm
  rounds) is shown beside it.

The number of clients is the federation's (``num_supernodes`` of ``run_simulation``; each node's
``num-partitions``), never a run-config key.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # imported where used at run time: the flmarket_flwr imports load Flower
    from flmarket_flwr.market import MarketConfig

WARM_RUNS = 3


def app_config(num_clients: int, results: Path, rounds: int) -> dict:
    from flmarket_flwr.app.run_config import DEFAULTS  # pylint: disable=import-outside-toplevel

    config: dict = dict(DEFAULTS)
    config.update(
        {
            "distribution": "d1",
            "num-selected": num_clients // 2,
            "budget": 1e6,  # large enough that the cohort cap, not the budget, decides: half the clients train
            "num-server-rounds": rounds,
            "fraction-evaluate": 0.0,
            "results-dir": str(results),
            "run-name": f"clients-{num_clients}",
            "train-log-dir": str(results / f"train-log-{num_clients}"),
            "torch-threads": 1,
            "device": "cpu",
        }
    )
    return config


def market_config(config: dict, num_clients: int) -> MarketConfig:
    """The market settings the app derives from ``config`` (budget, classes, cohort) for ``num_clients`` nodes."""
    from flmarket_flwr.app.server_app import ServerSettings, market_config_of  # pylint: disable=import-outside-toplevel
    from flmarket_flwr.app.task import DataConfig  # pylint: disable=import-outside-toplevel

    data_config = DataConfig.from_run_config(config, {"num-partitions": num_clients})
    app_market = market_config_of(ServerSettings.from_run_config(config), data_config, run_id=0)
    return dataclasses.replace(app_market, expected_nodes=num_clients, poll_interval=0.2)


def run_in_simulation(config: dict, num_clients: int, workers: int) -> float:
    """The app (``server_app.main`` and ``build_client_app``) in ``run_simulation`` over ``num_clients`` nodes.

    Returns the whole call's seconds; the app writes its market and round timings to its ``history.json``.
    """
    from flwr.app import Context  # pylint: disable=import-outside-toplevel
    from flwr.serverapp import Grid, ServerApp  # pylint: disable=import-outside-toplevel
    from flwr.simulation import run_simulation  # pylint: disable=import-outside-toplevel

    from flmarket_flwr.app import server_app  # pylint: disable=import-outside-toplevel
    from flmarket_flwr.app.client_app import build_client_app  # pylint: disable=import-outside-toplevel

    server = ServerApp()

    @server.main()
    def _main(grid: Grid, context: Context) -> None:
        merged = Context(
            run_id=context.run_id,
            node_id=context.node_id,
            node_config=context.node_config,
            state=context.state,
            run_config={**context.run_config, **config},
        )
        server_app.main(grid, merged)

    started = time.perf_counter()
    run_simulation(
        server_app=server,
        client_app=build_client_app(config),
        num_supernodes=num_clients,
        backend_config={"client_resources": {"num_cpus": max(1, (os.cpu_count() or 1) // workers), "num_gpus": 0.0}},
    )
    return time.perf_counter() - started


def secure_nodes(nodes: list[int], folder: Path) -> tuple[dict[int, dict], Path]:
    """Node configs of ``nodes`` in the secure profile (``bench_profiles.secure_node_configs``: fresh identity keys,
    one directory pinned by its digest), with ``partition-id`` and ``num-partitions``.

    Returns the node configs and the directory file's path, the buyer's ``identity-directory``. The nodes keep
    their ledgers under ``FLMARKET_HOME``.
    """
    from benchmarks.bench_profiles import secure_node_configs  # pylint: disable=import-outside-toplevel

    folder.mkdir(parents=True, exist_ok=True)
    configs, _ = secure_node_configs(nodes, folder)
    partitions = {"num-partitions": len(nodes)}
    return {
        node: {"partition-id": position, **partitions, **configs[node]} for position, node in enumerate(nodes)
    }, folder / "directory.json"


def market_in_process(
    config: dict, num_clients: int, secure: bool = False
) -> tuple[dict[str, float], dict[str, float]]:
    """The same market phase over in-process grids (no Ray): cold (first grid), then warm (fresh grids).

    A PASS v2 client takes part in one session per run, so each warm run needs fresh nodes. The warm figure
    is the fastest of ``WARM_RUNS`` (wall time on a shared machine only grows with the load); each run also
    records its process CPU (``"cpu"``), which the load hardly changes. ``secure``: buyer and nodes in the
    secure profile (:func:`secure_nodes`; the key generation is not timed), which is what each re-launch of
    the market costs (a re-launch needs the profile's privacy budget).
    """
    from flmarket_flwr.app.client_app import build_client_app  # pylint: disable=import-outside-toplevel
    from flmarket_flwr.market import MarketPhase  # pylint: disable=import-outside-toplevel
    from simulations.inprocess_grid import InProcessGrid, serverapp_identity  # pylint: disable=import-outside-toplevel

    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-secure-") as tmp:
        previous_home = os.environ.get("FLMARKET_HOME")
        os.environ["FLMARKET_HOME"] = str(Path(tmp) / "home")  # the nodes' ledgers, thrown away afterwards
        try:
            for run in range(1 + WARM_RUNS):  # cold: loads the data set and computes the partitions; then warm
                nodes = [1_000 + 4_000 * run + 17 * i for i in range(num_clients)]
                run_config, node_configs = dict(config), None
                if secure:
                    node_configs, directory = secure_nodes(nodes, Path(tmp) / f"run-{run}")
                    run_config |= {"market-security": "malicious", "identity-directory": str(directory)}
                market = market_config(run_config, num_clients)
                grid = InProcessGrid(build_client_app(config), nodes, node_configs=node_configs, run_config=config)
                started = time.process_time()
                with serverapp_identity(grid.run.run_id):
                    timings = dict(MarketPhase(market).run(grid).timings)
                timings["cpu"] = time.process_time() - started
                runs.append(timings)
        finally:
            if previous_home is None:
                os.environ.pop("FLMARKET_HOME", None)
            else:
                os.environ["FLMARKET_HOME"] = previous_home
    return runs[0], min(runs[1:], key=lambda timings: timings["total"])


def bare_training(config: dict, partitions: list[int], num_clients: int) -> dict[int, float]:
    """Each partition's local training of round 1, run here directly (no Flower), in seconds."""
    import torch  # pylint: disable=import-outside-toplevel

    from flmarket_flwr.app.server_app import ServerSettings  # pylint: disable=import-outside-toplevel
    from flmarket_flwr.app.task import (  # pylint: disable=import-outside-toplevel
        DataConfig,
        build_task_model,
        configure_torch_threads,
        load_partition,
        train,
        training_seed,
    )

    configure_torch_threads(1)
    data_config = DataConfig.from_run_config(config, {"num-partitions": num_clients})
    settings = ServerSettings.from_run_config(config)
    times = {}
    for partition in [partitions[0], *partitions]:  # the first, untimed, warms torch and the data caches up
        model = build_task_model(settings.model, data_config)
        data = load_partition(partition, data_config)
        started = time.perf_counter()
        train(
            model,
            data,
            epochs=settings.local_epochs,
            lr=settings.learning_rate,
            device=torch.device("cpu"),
            batch_size=settings.batch_size,
            momentum=settings.momentum,
            seed=training_seed(data_config.seed, partition, 1),
        )
        times[partition] = time.perf_counter() - started
    return times


def makespan(durations: list[float], workers: int) -> float:
    """Longest-processing-time-first schedule of ``durations`` on ``workers`` machines."""
    loads = [0.0] * workers
    for duration in sorted(durations, reverse=True):
        loads[loads.index(min(loads))] += duration
    return max(loads)


def measure(num_clients: int, rounds: int, workers: int, results: Path, secure: bool = False) -> dict:
    config = app_config(num_clients, results, rounds)
    total = run_in_simulation(config, num_clients, workers)
    run_dir = results / config["run-name"]
    history = json.loads((run_dir / "history.json").read_text())
    market = history["timings"]["market"]
    audits = [json.loads(p.read_text()) for p in (results / f"train-log-{num_clients}").rglob("*.json")]
    round_times = [row["round_time_s"] for row in history["rounds"] if row["round"] >= 1]
    first_round = sorted((a for a in audits if a["server_round"] == 1), key=lambda a: a["partition_id"])
    if not first_round:
        raise SystemExit(f"{num_clients} clients: the market selected nobody, nothing trained")
    bare = bare_training(config, [a["partition_id"] for a in first_round], num_clients)
    later = [a for a in audits if a["server_round"] >= 2]
    in_client_warm = sum(a["train_time_s"] for a in later) / max(1, len({a["server_round"] for a in later}))
    steps = ("pass", "bid", "auction", "award")
    in_process_cold, in_process_warm = market_in_process(config, num_clients)
    secure_warm = market_in_process(config, num_clients, secure=True)[1] if secure else None
    return {
        "market_in_process_secure": secure_warm,
        "in_client_train_round1_s": sum(a["train_time_s"] for a in first_round),
        "in_client_train_warm_s": in_client_warm,
        "clients": num_clients,
        "winners": len(first_round),
        "run_simulation_s": total,
        "market_sim": {step: market.get(step, float("nan")) for step in (*steps, "wait_for_nodes", "total")},
        "market_sim_phase_s": sum(market.get(step, 0.0) for step in steps),
        "market_in_process_cold": in_process_cold,
        "market_in_process": in_process_warm,
        "round_times_s": round_times,
        "final_accuracy": history["rounds"][-1]["accuracy"],
        "bare_train_s": list(bare.values()),
        "ideal_round_s": makespan(list(bare.values()), workers),
    }


def report(rows: list[dict], workers: int) -> None:
    steps = ("pass", "bid", "auction", "award")
    print(
        "Market phase, seconds: in Flower's simulation (cold, first contact) / in process, cold / in process, "
        "warm (no Ray)\n"
    )
    print("| clients | PASS | scores and bids | auction | awards | market phase |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        runs = (r["market_sim"], r["market_in_process_cold"], r["market_in_process"])
        cells = [" / ".join(f"{run[s]:.3f}" for run in runs) for s in steps]
        phases = " / ".join(f"{sum(run[s] for s in steps):.3f}" for run in runs)
        print(f"| {r['clients']} | " + " | ".join(cells) + f" | {phases} |")
    print("\nMarket phase vs one FedAvg round (simulation)\n")
    print(
        "| clients | winners | market phase (simulation, cold) | FedAvg round 1 (cold) | later rounds (mean, warm) "
        "| warm market in process: wall (CPU) | warm market / warm round: wall (CPU) | final accuracy |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        warm = float(np.mean(r["round_times_s"][1:])) if len(r["round_times_s"]) > 1 else r["round_times_s"][0]
        print(
            f"| {r['clients']} | {r['winners']} "
            f"| {r['market_sim_phase_s']:.2f} s "
            f"| {r['round_times_s'][0]:.2f} s | {warm:.2f} s "
            f"| {sum(r['market_in_process'][s] for s in steps):.2f} s ({r['market_in_process']['cpu']:.2f} s) "
            f"| {sum(r['market_in_process'][s] for s in steps) / warm:.2f}x "
            f"({r['market_in_process']['cpu'] / warm:.2f}x) "
            f"| {r['final_accuracy']:.3f} |"
        )
    print(f"\nFlower's simulation round vs the bare local training of the same winners ({workers} workers)\n")
    print(
        "| clients | winners | bare training, sum | in-ClientApp training, sum (warm rounds) | ideal round on "
        f"{workers} workers | warm round | Flower overhead per round | round / ideal |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        warm = float(np.mean(r["round_times_s"][1:])) if len(r["round_times_s"]) > 1 else r["round_times_s"][0]
        print(
            f"| {r['clients']} | {r['winners']} | {sum(r['bare_train_s']):.2f} s | {r['in_client_train_warm_s']:.2f} s "
            f"| {r['ideal_round_s']:.2f} s | {warm:.2f} s | {warm - r['ideal_round_s']:.2f} s "
            f"| {warm / r['ideal_round_s']:.2f}x |"
        )
    if all(r["market_in_process_secure"] is not None for r in rows):
        print("\nA re-launch is one market: the warm market in process, default and secure profile, vs a warm round\n")
        print(
            "| clients | warm FedAvg round | market, default: wall (CPU) | market, secure profile: wall (CPU) "
            "| secure market / warm round: wall (CPU) |"
        )
        print("|---:|---:|---:|---:|---:|")
        for r in rows:
            warm = float(np.mean(r["round_times_s"][1:])) if len(r["round_times_s"]) > 1 else r["round_times_s"][0]
            default, secure = r["market_in_process"], r["market_in_process_secure"]
            print(
                f"| {r['clients']} | {warm:.2f} s | {default['total']:.2f} s ({default['cpu']:.2f} s) "
                f"| {secure['total']:.2f} s ({secure['cpu']:.2f} s) "
                f"| {secure['total'] / warm:.2f}x ({secure['cpu'] / warm:.2f}x) |"
            )
    calls = ", ".join(f"{r['clients']} clients {r['run_simulation_s']:.1f} s" for r in rows)
    print(f"\nWhole run_simulation call: {calls}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=[20, 100])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="Ray actors (1 CPU each)")
    parser.add_argument("--json", help="also write the raw figures to this JSON file")
    parser.add_argument(
        "--market-only",
        action="store_true",
        help="only the in-process market phase (cold, then the best of 3 warm runs): no simulation, no training",
    )
    parser.add_argument(
        "--secure",
        action="store_true",
        help="also the in-process market in the secure profile (what each re-launch costs), after the default one",
    )
    args = parser.parse_args()
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    logging.getLogger("flwr").setLevel(logging.WARNING)
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
        f"load average at start {os.getloadavg()[0]:.2f}\n"
    )
    if args.market_only:
        with tempfile.TemporaryDirectory(prefix="bench-market-") as tmp:
            rows = []
            for n, secure in [(n, secure) for n in args.clients for secure in (False, True)[: 1 + args.secure]]:
                cold, warm = market_in_process(app_config(n, Path(tmp), args.rounds), n, secure=secure)
                rows.append({"clients": n, "secure": secure, "market_in_process_cold": cold, "market_in_process": warm})
                print(
                    f"| {n} | {'secure' if secure else 'default'} "
                    f"| cold {cold['total']:.3f} s ({cold['cpu']:.3f} s CPU) "
                    f"| warm {warm['total']:.3f} s ({warm['cpu']:.3f} s CPU) | load {os.getloadavg()[0]:.1f} |",
                    flush=True,
                )
    else:
        with tempfile.TemporaryDirectory(prefix="bench-market-") as tmp:
            rows = [measure(n, args.rounds, args.workers, Path(tmp), args.secure) for n in args.clients]
        report(rows, args.workers)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
