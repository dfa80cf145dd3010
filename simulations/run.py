"""Run FLMarket experiments: one Flower simulation per Hydra job.

One experiment (the defaults of ``conf/config.yaml``: digits, d4, FLMarket, 20 clients)::

    python -m simulations.run
    python -m simulations.run selector=dds num_selected=10 distribution=d6 seed=1

A sweep (Hydra's ``-m``; jobs run one after the other in this process)::

    python -m simulations.run -m distribution=d1,d2,d3,d4,d5,d6 \\
        selector=flmarket,rs,qbs,dice,dds num_selected=5,10,15 seed=0,1,2

Each job

1. maps its config to the job's run config (:func:`simulations.config.to_run_config`: the app's keys and the
   experiments' ``selector`` and ``val-per-class``),
   with ``results-dir`` / ``run-name`` pointing at the job's Hydra output folder;
2. runs the experiments' ``ServerApp`` and ``ClientApp`` (:mod:`simulations.apps`: the
   product app plus the non-private baseline selectors, built with that run config, since
   ``run_simulation`` takes none) through ``flwr.simulation.run_simulation`` with
   ``num_supernodes = federation.num_clients`` and one Ray actor per ``sim.client_num_cpus``
   CPUs; Flower starts and stops Ray for every job (its supported life cycle);
3. writes, in the job folder: the app's own outputs (``selection.json``,
   ``market.json`` for FLMarket, ``sfedavg.json`` for S-FedAvg, ``history.json``,
   ``history.csv``), ``flower.log`` (Flower's log of the run) and ``result.json``: the
   job's config, accuracy and loss per round, wall times, and the selected clients
   with their partition ids and label counts (for the paper's Table 2: the class
   distribution of the selected clients). The label counts there come from the
   harness's own copy of the partition, joined with the clients' train-message audit
   (node id -> partition id); for FLMarket the server itself never learns them.

A progress line per finished job goes to stderr (:mod:`simulations.progress`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

# Before Flower and Ray are imported: no telemetry or usage-stats calls (no network here).
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

import warnings  # noqa: E402

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from simulations.config import to_run_config  # noqa: E402

__all__ = ["main", "run_experiment", "simulate_in_process", "summarize"]

LOG = logging.getLogger(__name__)

# Console noise of every job that says nothing about the job: alembic's plugin set-up at
# INFO (Hydra sets the root logger to INFO) and Ray's accelerator-variable tip.
logging.getLogger("alembic").setLevel(logging.WARNING)
warnings.filterwarnings("ignore", message="Tip: In future versions of Ray", category=FutureWarning)


def _backend_config(sim: DictConfig) -> dict[str, Any]:
    """``run_simulation``'s ``backend_config``: actor resources and ``ray.init`` arguments.

    Raises
    ------
    ValueError
        If ``sim.ray_num_cpus`` is set while ``RAY_ADDRESS`` names an existing Ray cluster: Ray refuses
        ``num_cpus`` when it connects to a cluster, whose CPUs are those its nodes were started with.
    """
    init_args: dict[str, Any] = {
        "logging_level": "INFO" if sim.verbose else "WARNING",
        "log_to_driver": bool(sim.verbose),
    }
    if sim.ray_num_cpus is not None:
        if os.environ.get("RAY_ADDRESS"):
            raise ValueError(
                f"sim.ray_num_cpus={sim.ray_num_cpus} cannot apply: RAY_ADDRESS={os.environ['RAY_ADDRESS']} "
                "runs the simulation on an existing Ray cluster, whose CPUs are set where its nodes start "
                "(ray start --num-cpus=N). Drop sim.ray_num_cpus (or set sim.ray_num_cpus=null), or unset "
                "RAY_ADDRESS to run on a Ray instance of this machine"
            )
        init_args["num_cpus"] = int(sim.ray_num_cpus)
    return {
        "client_resources": {
            "num_cpus": float(sim.client_num_cpus),
            "num_gpus": float(sim.client_num_gpus),
        },
        "init_args": init_args,
    }


class _DropRepeatedNotices(logging.Filter):
    """Keep the console free of warnings that every job repeats and that say nothing new.

    Flower's deprecation notice of ``run_simulation`` (the Python entry point this module
    uses; ``flwr run`` has no way to keep Ray warm between runs) and FedAvg's notice that
    ``fraction_evaluate=0`` skips federated evaluation (the server evaluates centrally).
    Both stay in ``flower.log``.
    """

    NOTICES = ("run_simulation", "FEATURE UPDATE", "Federated evaluation will be skipped")

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(notice in message for notice in self.NOTICES)


@contextmanager
def _flower_logging(job_dir: Path, verbose: bool) -> Iterator[None]:
    """During a job: Flower's full log to ``<job>/flower.log``, only warnings on the console."""
    from flwr.supercore.logger import FLOWER_LOGGER  # pylint: disable=import-outside-toplevel

    logger = FLOWER_LOGGER  # Importing it installs Flower's console handler.
    file_handler = logging.FileHandler(job_dir / "flower.log", encoding="utf-8")
    file_handler.setLevel(logging.DEBUG if verbose else logging.INFO)
    file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    consoles = [
        h for h in logger.handlers if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
    ]
    saved = [(h, h.level) for h in consoles]
    noise = _DropRepeatedNotices()
    for handler in consoles:
        handler.setLevel(logging.INFO if verbose else logging.WARNING)
        handler.addFilter(noise)
    propagate = logger.propagate
    logger.propagate = False  # Hydra's root handlers would print everything a second time.
    logger.addHandler(file_handler)
    try:
        yield
    finally:
        logger.removeHandler(file_handler)
        file_handler.close()
        logger.propagate = propagate
        for handler, level in saved:
            handler.setLevel(level)
            handler.removeFilter(noise)


def _simulate(run_config: dict[str, Any], num_clients: int, sim: DictConfig) -> None:
    """One simulation of the experiments' app with this run config over ``num_clients`` SuperNodes."""
    from simulations.apps import build_client_app, build_server_app  # pylint: disable=import-outside-toplevel

    simulate_in_process(
        build_server_app(run_config),
        build_client_app(run_config),
        num_supernodes=num_clients,
        backend_config=_backend_config(sim),
        pull_interval=sim.grid_pull_interval,
        verbose=bool(sim.verbose),
    )


def simulate_in_process(
    server_app: Any,
    client_app: Any,
    *,
    num_supernodes: int,
    backend_config: dict[str, Any],
    pull_interval: float | None = None,
    verbose: bool = False,
) -> None:
    """Run a ``ServerApp`` and a ``ClientApp`` on Flower's Ray simulation, in this process.

    The one call of ``flwr.simulation.run_simulation`` in the experiments and the tests (the benchmarks time that
    call itself). Flower deprecates it (since 1.28) in favour of ``flwr run``, which is kept out of reach here on
    purpose: ``flwr run`` runs an app's FAB, whose ``ServerApp`` and ``ClientApp`` are named in ``pyproject.toml``
    and configured by its run config only, through a SuperLink and a simulation process per run. The experiments'
    baselines (:mod:`simulations.apps`) and the tests' own apps are Python objects built per job, and a sweep's
    jobs share this process. When Flower removes ``run_simulation``, this function is the place to change.

    Parameters
    ----------
    server_app : flwr.serverapp.ServerApp
        The server side.
    client_app : flwr.clientapp.ClientApp
        The client side, one per simulated SuperNode.
    num_supernodes : int
        Number of simulated SuperNodes.
    backend_config : dict[str, Any]
        ``run_simulation``'s: ``client_resources`` and ``init_args`` (``ray.init``).
    pull_interval : float or None (default: None)
        Seconds between the Grid's polls for replies (:func:`_with_pull_interval`); ``None``: Flower's.
    verbose : bool (default: False)
        Flower's DEBUG logging.
    """
    from flwr.simulation import run_simulation  # pylint: disable=import-outside-toplevel

    run_simulation(
        server_app=_with_pull_interval(server_app, pull_interval),
        client_app=client_app,
        num_supernodes=num_supernodes,
        backend_config=backend_config,
        verbose_logging=verbose,
    )


def _with_pull_interval(inner: Any, pull_interval: float | None) -> Any:
    """A ``ServerApp`` that runs ``inner`` after setting the Grid's reply-polling interval.

    Flower's in-memory simulation Grid polls for replies every ``pull_interval`` seconds
    (0.1 by default); every message round of a run (4 for the market, 1 for a baseline's
    statistics, 1 per training round) pays up to that much on top of the work. A
    shorter interval (``sim.grid_pull_interval``) only costs a little CPU in the
    ServerApp thread while it waits. ``None`` leaves Flower's value.
    """
    from flwr.serverapp import ServerApp  # pylint: disable=import-outside-toplevel

    if pull_interval is None:
        return inner
    server = ServerApp()

    @server.main()
    def _main(grid: Any, context: Any) -> None:
        if hasattr(grid, "pull_interval"):
            grid.pull_interval = float(pull_interval)
        inner(grid, context)

    return server


def run_experiment(cfg: DictConfig, job_dir: Path) -> dict[str, Any]:
    """Run one experiment (one Flower simulation) and write its results to ``job_dir``.

    Parameters
    ----------
    cfg : DictConfig
        The job's composed config (``conf/config.yaml`` plus overrides).
    job_dir : Path
        The job's output folder (Hydra's ``runtime.output_dir``).

    Returns
    -------
    dict
        ``final_accuracy``, ``best_accuracy``, ``wall_s`` and ``result`` (the path of
        ``result.json``).
    """
    started = time.perf_counter()
    job_dir = job_dir.resolve()
    job_dir.mkdir(parents=True, exist_ok=True)
    run_config = to_run_config(cfg)
    run_config.update(
        {
            "results-dir": str(job_dir.parent),
            "run-name": job_dir.name,
            "train-log-dir": str(job_dir / "train-log"),
        }
    )
    (job_dir / "run_config.json").write_text(json.dumps(run_config, indent=2), encoding="utf-8")
    try:
        with _flower_logging(job_dir, bool(cfg.sim.verbose)):
            _simulate(run_config, int(cfg.federation.num_clients), cfg.sim)
    except BaseException:
        (job_dir / "error.txt").write_text(traceback.format_exc(), encoding="utf-8")
        raise
    wall = time.perf_counter() - started
    result = summarize(job_dir, run_config, wall_s=wall, num_clients=int(cfg.federation.num_clients))
    result["job"] = _job_info(cfg)
    (job_dir / "result.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
    if not cfg.sim.keep_model:
        (job_dir / "final_model.pt").unlink(missing_ok=True)
    shutil.rmtree(job_dir / "train-log", ignore_errors=True)
    return {
        "final_accuracy": result["final_accuracy"],
        "best_accuracy": result["best_accuracy"],
        "wall_s": wall,
        "result": str(job_dir / "result.json"),
    }


def _job_info(cfg: DictConfig) -> dict[str, Any]:
    """Hydra's view of the job (overrides, index), when run under Hydra."""
    try:
        hydra_cfg = HydraConfig.get()
    except ValueError:
        return {}
    return {
        # HydraConfig.get() is typed as the HydraConf dataclass but is a DictConfig at run time.
        "num": OmegaConf.select(cast(DictConfig, hydra_cfg), "job.num"),
        "overrides": list(hydra_cfg.overrides.task),
        "output_dir": hydra_cfg.runtime.output_dir,
    }


def _train_log(job_dir: Path) -> list[dict[str, Any]]:
    """The ClientApps' train-message audit records of this job."""
    return [
        json.loads(path.read_text(encoding="utf-8"))
        for path in sorted((job_dir / "train-log").glob("run-*/train-*.json"))
    ]


def summarize(job_dir: Path, run_config: dict[str, Any], wall_s: float, num_clients: int) -> dict[str, Any]:
    """Collect a finished job's outputs into one JSON-ready ``result`` record.

    Parameters
    ----------
    job_dir : Path
        Folder with the app's ``history.json`` and ``selection.json`` and the
        ``train-log`` audit.
    run_config : dict
        The run config the job ran with.
    wall_s : float
        Wall time of the whole job (Ray and actor start included).
    num_clients : int
        Number of SuperNodes (clients) of the job.

    Returns
    -------
    dict
        See the module docstring.
    """
    # pylint: disable=import-outside-toplevel
    from flmarket_flwr.app.task import DataConfig, all_label_counts
    from simulations.record import job_record
    from simulations.run_config import split_run_config

    history = json.loads((job_dir / "history.json").read_text(encoding="utf-8"))
    selection = json.loads((job_dir / "selection.json").read_text(encoding="utf-8"))
    app_config, own = split_run_config(run_config)
    data_config = DataConfig.from_run_config(app_config, {"num-partitions": num_clients}, own.val_per_class)
    counts = all_label_counts(data_config)
    log_records = _train_log(job_dir)
    partition_of = {int(r["node_id"]): int(r["partition_id"]) for r in log_records}
    trained_per_round: dict[int, list[int]] = {}
    for record in log_records:
        trained_per_round.setdefault(int(record["server_round"]), []).append(int(record["partition_id"]))

    selector = history["selector"]
    selected_nodes = [int(n) for n in (history["winners"] if selector == "sfedavg" else selection["selected"])]
    rounds = history["rounds"]
    accuracies = [float(r["accuracy"]) for r in rounds]
    timings = history["timings"]
    server_app_s = float(timings.get("total_s", math.nan))
    result = job_record(
        run_config=run_config,
        identity={
            "selector": selector,
            **{key: run_config[key] for key in ("dataset", "model", "distribution", "seed")},
            "num_clients": num_clients,
            "num_selected": run_config["num-selected"],
        },
        rounds=[
            {
                "round": int(r["round"]),
                "accuracy": float(r["accuracy"]),
                "loss": float(r["loss"]),
                "train_loss": r["train_loss"],
                "round_time_s": float(r["round_time_s"]),
                "eval_time_s": float(r["eval_time_s"]),
            }
            for r in rounds
        ],
        final_accuracy=accuracies[-1] if accuracies else math.nan,
        best_accuracy=max(accuracies) if accuracies else math.nan,
        selected_nodes=selected_nodes,
        selected_partitions=[partition_of.get(node) for node in selected_nodes],
        label_counts=counts,
        trained_per_round=trained_per_round,
        timings={
            "job_wall_s": wall_s,
            "selection_s": float(timings.get("selection_s", math.nan)),
            "training_s": float(timings.get("fedavg_total_s", math.nan)),
            "server_app_s": server_app_s,
            "overhead_s": wall_s - server_app_s,
        },
    )
    if selector == "flmarket" and (job_dir / "market.json").is_file():
        market = json.loads((job_dir / "market.json").read_text(encoding="utf-8"))
        result["market"] = {key: market[key] for key in ("total_payment", "budget", "within_budget")}
    return result


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> dict[str, Any]:
    """Hydra entry point: one job = one experiment, through Flower (``engine=flower``) or in process."""
    job_dir = Path(HydraConfig.get().runtime.output_dir)
    if OmegaConf.select(cfg, "sim.engine.name", default="flower") == "inprocess":
        from simulations.engine import run_job_inprocess  # pylint: disable=import-outside-toplevel

        job_dir.mkdir(parents=True, exist_ok=True)
        result = run_job_inprocess(cfg)
        result["job"] = _job_info(cfg)
        (job_dir / "result.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
        return {
            "final_accuracy": result["final_accuracy"],
            "best_accuracy": result["best_accuracy"],
            "wall_s": result["timings"]["job_wall_s"],
            "result": str(job_dir / "result.json"),
        }
    return run_experiment(cfg, job_dir)


if __name__ == "__main__":
    main()  # pylint: disable=no-value-for-parameter
