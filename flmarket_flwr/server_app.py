"""ServerApp of the FLMarket Flower app: the market, then FedAvg on the winners, then the results.

:func:`main` checks the whole run config first (a bad key or value stops the run at once, naming the
key), then runs ``FLMarket(FedAvg(...))`` (:class:`~flmarket_flwr.market.FLMarket`) with a server-side
evaluation of the global model every round, and writes the results
(:mod:`flmarket_flwr.app_results`). The last line of every run says ``FLMarket run succeeded: results
in <dir>`` or ``FLMarket run FAILED: <reason>``.

The experiments (:mod:`simulations.apps`) plug their baseline selectors in through
:func:`build_server_app`'s ``strategies``; this app itself runs ``selector="flmarket"`` only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from logging import ERROR, INFO
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg, Result, Strategy

from flmarket_flwr.app_results import CentralEvaluation, make_run_dir, save_results
from flmarket_flwr.data.partition import DISTRIBUTIONS
from flmarket_flwr.market import FLMarket, MarketConfig, MarketError, MarketPhase
from flmarket_flwr.nodes import connected_nodes
from flmarket_flwr.pass_protocol import IdentityDirectory
from flmarket_flwr.task import (
    DataConfig,
    build_task_model,
    configure_torch_threads,
    load_test_set,
    num_classes,
    resolve_device,
)

__all__ = ["ServerSettings", "StrategyFactory", "app", "build_server_app", "data_config_of", "fedavg", "main", "run"]

CLIENT_KEYS = {"cost-low": 0.5, "cost-high": 1.5, "bid-markup": 0.2, "torch-threads": 1, "train-log-dir": ""}
"""Run-config keys only the ClientApp reads (checked here too, so that a bad value fails once)."""
DATA_KEYS = ("dataset", "data-root", "distribution", "schedule", "alpha", "test-per-class", "val-per-class")
NODE_PROBE_S = 2.0
"""Seconds to find out how many SuperNodes the federation has before failing fast on too few."""


# pylint: disable=too-many-instance-attributes
@dataclass(frozen=True)
class ServerSettings:
    """The ServerApp's keys of the run config (``[tool.flwr.app.config]``; ``-`` there for ``_`` here).

    ``selector`` (``"flmarket"``); ``model``; the market's ``budget``, ``num_selected`` (0: the budget
    decides; n > 0: at most n winners, within the budget), ``market_timeout``, ``wait_for_nodes_timeout``,
    ``min_market_clients``, ``neighbours`` (PASS graph: ``"auto"``, ``"all"`` or a degree k), ``audit_winners``,
    ``identity_directory`` (path of the buyer's directory of client identity keys; "" for none),
    ``settle_on_delivery`` (pay each winner pro rata to the rounds it delivered, not in full at selection);
    FedAvg's ``num_server_rounds``, ``fraction_train``,
    ``fraction_evaluate``, ``round_timeout`` and the clients' ``local_epochs``, ``batch_size``,
    ``learning_rate``, ``momentum``; ``seed`` (initial model, sampling); ``device`` of the server-side
    evaluation; ``results_dir`` and ``run_name`` (empty: ``<time>_run-<id>``).
    """

    selector: str = "flmarket"
    model: str = "digits_cnn"
    budget: float = 600.0
    num_selected: int = 0
    num_server_rounds: int = 15
    local_epochs: int = 3
    batch_size: int = 8
    learning_rate: float = 0.1
    momentum: float = 0.5
    fraction_train: float = 1.0
    fraction_evaluate: float = 0.0
    seed: int = 0
    device: str = "auto"
    results_dir: str = "results/runs"
    run_name: str = ""
    market_timeout: float = 60.0
    wait_for_nodes_timeout: float = 120.0
    min_market_clients: int = 3
    neighbours: str = "auto"
    audit_winners: bool = True
    identity_directory: str = ""
    settle_on_delivery: bool = False
    round_timeout: float = 600.0

    @classmethod
    def from_run_config(
        cls, run_config: Mapping[str, Any], selectors: tuple[str, ...] = ("flmarket",)
    ) -> ServerSettings:
        """Check the server and client keys of the run config (:func:`data_config_of` the data keys).

        Raises
        ------
        ValueError
            Naming the key, the bad value and what to do, for the first problem found.
        """
        known = {field.name.replace("_", "-"): field for field in fields(cls)}
        unknown = sorted(set(run_config) - set(known) - set(CLIENT_KEYS) - set(DATA_KEYS) - {"seed"})
        if unknown:
            raise ValueError(f"unknown run-config key(s) {unknown}: see [tool.flwr.app.config] in pyproject.toml")
        values = {
            field.name: _typed(key, run_config[key], field.default) for key, field in known.items() if key in run_config
        }
        client = {key: _typed(key, run_config.get(key, default), default) for key, default in CLIENT_KEYS.items()}
        settings = cls(**values)
        settings.validate(selectors, client)
        return settings

    def validate(self, selectors: tuple[str, ...], client: Mapping[str, Any]) -> None:
        """Raise ``ValueError`` naming the first key whose value cannot work."""
        checks = [
            (
                self.selector in selectors,
                "selector",
                (
                    f"one of {list(selectors)}; the baselines rs, qbs, dice, dds "
                    f"and sfedavg run through `python -m simulations.run selector={self.selector}` only"
                ),
            ),
            (self.budget > 0, "budget", "> 0"),
            (self.num_selected >= 0, "num-selected", ">= 0 (0: the budget decides)"),
            (self.selector == "flmarket" or self.num_selected > 0, "num-selected", "> 0 for a baseline"),
            (self.num_server_rounds >= 1, "num-server-rounds", ">= 1"),
            (0.0 < self.fraction_train <= 1.0, "fraction-train", "in (0, 1]"),
            (0.0 <= self.fraction_evaluate <= 1.0, "fraction-evaluate", "in [0, 1]"),
            (self.min_market_clients >= 3, "min-market-clients", ">= 3 (PASS with 2 reveals a client's counts)"),
            (
                self.neighbours in ("auto", "all") or (self.neighbours.isdigit() and int(self.neighbours) >= 2),
                "neighbours",
                "'auto', 'all' or a degree k >= 2 (as a string)",
            ),
            (self.local_epochs >= 1 and self.batch_size >= 1, "local-epochs/batch-size", ">= 1"),
            (self.learning_rate > 0, "learning-rate", "> 0"),
            (0 < client["cost-low"] < client["cost-high"], "cost-low/cost-high", "0 < cost-low < cost-high"),
            (client["bid-markup"] >= 0, "bid-markup", ">= 0"),
            (client["torch-threads"] >= 0, "torch-threads", ">= 0"),
        ]
        for ok, key, expected in checks:
            if not ok:
                raise ValueError(f"run-config key {key}: must be {expected}; fix it with --run-config")


def _typed(key: str, value: Any, default: Any) -> Any:
    """``value`` as the type of ``default`` (an int for a float key is fine), or a ``ValueError`` naming the key."""
    kind = type(default)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, kind) or isinstance(value, bool) != isinstance(default, bool):
        raise ValueError(f"run-config key {key}={value!r}: must be a {kind.__name__}, like {default!r}")
    return value.strip() if isinstance(value, str) else value


def data_config_of(run_config: Mapping[str, Any]) -> DataConfig:
    """Check the data keys of the run config; the number of clients is the federation's (num-partitions)."""
    distribution = str(run_config.get("distribution", "d4")).lower()
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"run-config key distribution={distribution!r}: must be one of {list(DISTRIBUTIONS)}")
    if float(run_config.get("alpha", 0.5)) <= 0:
        raise ValueError("run-config key alpha: the Dirichlet concentration must be > 0")
    try:
        return DataConfig.from_run_config({key: run_config[key] for key in (*DATA_KEYS, "seed") if key in run_config})
    except (TypeError, ValueError) as err:
        raise ValueError(f"run-config: {err}") from None


StrategyFactory = Callable[[ServerSettings, DataConfig, int], Strategy]
"""Experiments hook: ``(settings, data config, number of nodes) -> strategy`` for one more ``selector``.

The strategy must offer ``selection_record() -> dict`` and ``result_files() -> dict`` (see
:func:`flmarket_flwr.app_results.save_results`)."""


def fedavg(settings: ServerSettings) -> FedAvg:
    """The FedAvg that trains the selected clients (``min_*_nodes`` are capped at the winners by FLMarket)."""
    return FedAvg(
        fraction_train=settings.fraction_train,
        fraction_evaluate=settings.fraction_evaluate,
        min_train_nodes=1,
        min_evaluate_nodes=1 if settings.fraction_evaluate > 0 else 0,
        min_available_nodes=1,
    )


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the market, train FedAvg on the winners, and save the results."""
    run(grid, context)


def run(grid: Grid, context: Context, strategies: Mapping[str, StrategyFactory] | None = None) -> Path:
    """:func:`main` with the experiments' extra selectors; returns the results folder.

    Any failure is logged as one ``FLMarket run FAILED: <reason>`` line and re-raised (Flower then
    records the run as failed).
    """
    try:
        run_dir = _run(grid, context, dict(strategies or {}))
    except Exception as err:
        log(ERROR, "FLMarket run FAILED: %s", err)
        raise
    log(INFO, "FLMarket run succeeded: results in %s", run_dir)
    return run_dir


def _run(grid: Grid, context: Context, strategies: dict[str, StrategyFactory]) -> Path:
    """Check the config, select and train, then save the results."""
    started = time.perf_counter()
    settings = ServerSettings.from_run_config(context.run_config, ("flmarket", *strategies))
    data_config = data_config_of(context.run_config)
    configure_torch_threads(int(context.run_config.get("torch-threads", 1)))
    torch.manual_seed(settings.seed)
    model = build_task_model(settings.model, data_config)
    evaluation = CentralEvaluation(
        build_task_model(settings.model, data_config), load_test_set(data_config), resolve_device(settings.device)
    )
    run_dir = make_run_dir(settings.results_dir, settings.run_name, context.run_id)
    num_nodes = _count_nodes(grid, settings)
    if settings.selector == "flmarket":
        market = _market_config(settings, data_config, num_nodes, context.run_id)
        strategy: Strategy = FLMarket(
            fedavg(settings), market_config=market, seed=settings.seed, settle_on_delivery=settings.settle_on_delivery
        )
    else:
        strategy = strategies[settings.selector](settings, data_config, num_nodes)
    try:
        result = _start(strategy, grid, settings, model, evaluation)
    except MarketError:
        if isinstance(strategy, FLMarket) and strategy.market_outcome is not None:
            strategy.market_outcome.save_json(run_dir / "market.json")  # what the market saw: why nobody won
        raise
    save_results(
        run_dir,
        strategy=strategy,
        result=result,
        evaluation=evaluation,
        config={"settings": asdict(settings), "data": asdict(data_config)},
        total_s=time.perf_counter() - started,
    )
    return run_dir


def _start(
    strategy: Strategy, grid: Grid, settings: ServerSettings, model: torch.nn.Module, evaluation: CentralEvaluation
) -> Result:
    """Start the strategy with the run's initial model, rounds, train config and server-side evaluation."""
    return strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=settings.num_server_rounds,
        timeout=settings.round_timeout,
        train_config=ConfigRecord(
            {
                "local-epochs": settings.local_epochs,
                "batch-size": settings.batch_size,
                "learning-rate": settings.learning_rate,
                "momentum": settings.momentum,
            }
        ),
        evaluate_config=ConfigRecord(),
        evaluate_fn=evaluation,
    )


def _count_nodes(grid: Grid, settings: ServerSettings) -> int:
    """How many SuperNodes are connected, once their number settles; 0 if none yet (a deployment starting).

    Fails fast, with the fix, when some nodes are connected but fewer than PASS needs (Flower's default
    simulation federation has 2).
    """
    probe = MarketConfig(
        budget=1.0,
        num_classes=1,
        min_clients=settings.min_market_clients,
        wait_for_nodes_timeout=min(NODE_PROBE_S, settings.wait_for_nodes_timeout),
        poll_interval=0.5,
    )
    try:
        return len(MarketPhase(probe).wait_for_nodes(grid))
    except MarketError:
        if not connected_nodes(grid):
            return 0
        raise


def _market_config(settings: ServerSettings, data_config: DataConfig, num_nodes: int, run_id: int) -> MarketConfig:
    """The market phase's settings for this run."""
    return MarketConfig(
        budget=settings.budget,
        num_classes=num_classes(data_config),
        num_winners=settings.num_selected or None,
        min_clients=settings.min_market_clients,
        neighbours=int(settings.neighbours) if settings.neighbours.isdigit() else settings.neighbours,
        audit_winners=settings.audit_winners,
        directory=IdentityDirectory.from_json(Path(settings.identity_directory))
        if settings.identity_directory
        else None,
        timeout=settings.market_timeout,
        wait_for_nodes_timeout=settings.wait_for_nodes_timeout,
        expected_nodes=num_nodes if num_nodes >= settings.min_market_clients else None,
        session_label=f"flmarket-run-{run_id}",
    )


def build_server_app(
    run_config: Mapping[str, Any] | None = None, strategies: Mapping[str, StrategyFactory] | None = None
) -> ServerApp:
    """A ``ServerApp`` running :func:`run` with ``run_config`` laid over Flower's, and extra selectors.

    ``flwr.simulation.run_simulation`` (Flower 1.41) takes no run config: :mod:`simulations` passes
    each job's config (and its baseline selectors) this way.

    Parameters
    ----------
    run_config : Mapping[str, Any], optional
        Run-config keys and values; they win over the context's.
    strategies : Mapping[str, StrategyFactory], optional
        Extra ``selector`` values and the strategy each runs.

    Returns
    -------
    ServerApp
        A new app.
    """
    overlay = dict(run_config or {})
    server = ServerApp()

    @server.main()
    def _main(grid: Grid, context: Context) -> None:
        config = {**context.run_config, **overlay}
        run(grid, Context(context.run_id, context.node_id, context.node_config, context.state, config), strategies)

    return server
