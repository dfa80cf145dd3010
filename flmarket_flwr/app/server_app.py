"""ServerApp of the FLMarket Flower app: the market, then FedAvg on the winners, then the results.

:func:`main` checks the whole run config first (a bad key or value stops the run at once, naming the
key), then runs ``FLMarket(FedAvg(...))`` (:class:`~flmarket_flwr.market.FLMarket`) with a server-side
evaluation of the global model every round, and writes the results
(:mod:`flmarket_flwr.app.results`). The app's last line says ``FLMarket run succeeded: results in <dir>`` or
``FLMarket run FAILED: <reason>`` (with ``traceback in <dir>/error.log`` once the results folder exists); Flower
then prints only its short report of the one-line error.

The experiments (:mod:`simulations.apps`) run their baseline selectors through :func:`build_server_app`'s
``strategy`` (a :data:`StrategyFactory`) in place of the market; this app itself runs FLMarket only.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import asdict
from logging import ERROR, INFO
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg, Result, Strategy
from flwr.supercore import log

from flmarket_flwr.app.market_progress import MarketProgress, ProgressGrid
from flmarket_flwr.app.results import CentralEvaluation, make_run_dir, save_results
from flmarket_flwr.app.run_config import (
    check_run_config,
    count_or_auto,
    market_noise,
    membership_of,
    neighbours_of,
    relaunch_of,
    settings_from,
    train_message_config,
)
from flmarket_flwr.app.settings_fields import ServerFields
from flmarket_flwr.app.task import (
    DataConfig,
    build_task_model,
    configure_torch_threads,
    load_test_set,
    num_classes,
    resolve_device,
)
from flmarket_flwr.market import FLMarket, MarketConfig, MarketError, MarketPhase, RosterHistory
from flmarket_flwr.pass_protocol import IdentityDirectory, load_identity_key

__all__ = [
    "ServerSettings",
    "StrategyFactory",
    "app",
    "build_server_app",
    "data_config_of",
    "fedavg",
    "main",
    "market_config_of",
    "run",
]


class ServerSettings(ServerFields):
    """The run config as the ServerApp reads it, typed: a field per key of
    :data:`~flmarket_flwr.app.run_config.APP_KEYS` read by the data config, the server or both apps (``-`` there for
    ``_`` here), with the schema's defaults."""

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> ServerSettings:
        """Check the whole run config (:func:`~flmarket_flwr.app.run_config.check_run_config`); keep the server's keys.

        Raises
        ------
        ValueError
            Naming the key, the bad value and what to do, for the first problem found (an unknown key too).
        """
        return settings_from(cls, check_run_config(run_config))


def data_config_of(run_config: Mapping[str, Any], val_per_class: int = 0) -> DataConfig:
    """Check the data keys of the run config; the number of clients is the federation's (num-partitions).

    ``val_per_class`` is the server-side validation split (:class:`~flmarket_flwr.app.task.DataConfig`; ``0`` in
    the app)."""
    try:
        return DataConfig.from_run_config(run_config, val_per_class=val_per_class)
    except (TypeError, ValueError) as err:
        raise ValueError(f"run-config: {err}") from None


StrategyFactory = Callable[[ServerSettings, DataConfig, int], Strategy]
"""Experiments hook: ``(settings, data config, number of nodes) -> strategy`` that selects in place of the market.

The strategy must offer ``selection_record() -> dict`` and ``result_files() -> dict`` (see
:func:`flmarket_flwr.app.results.save_results`)."""


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


def run(grid: Grid, context: Context, strategy: StrategyFactory | None = None, val_per_class: int = 0) -> Path:
    """:func:`main`, or with ``strategy`` (the experiments' selector) in place of the market; returns the results
    folder. ``val_per_class``: the data config's validation split (:func:`data_config_of`).

    Any failure is logged as one ``FLMarket run FAILED: <reason>`` line, its full traceback written to
    ``<run dir>/error.log`` (once the folder exists, which the line then names), and re-raised without its
    traceback (Flower records the run as failed and prints the one-line error, not our frames).
    """
    made: list[Path] = []
    try:
        run_dir = _run(grid, context, strategy, val_per_class, made)
    except Exception as err:
        where = ""
        if made:
            (made[0] / "error.log").write_text("".join(traceback.format_exception(err)), encoding="utf-8")
            where = f" (traceback in {made[0] / 'error.log'})"
        log(ERROR, "FLMarket run FAILED: %s%s", err, where)
        raise err.with_traceback(None) from None
    log(INFO, "FLMarket run succeeded: results in %s", run_dir)
    return run_dir


def _run(grid: Grid, context: Context, factory: StrategyFactory | None, val_per_class: int, made: list[Path]) -> Path:
    """Check the config, select and train, then save the results (the results folder appended to ``made`` as soon
    as it exists)."""
    started = time.perf_counter()
    settings = ServerSettings.from_run_config(context.run_config)
    data_config = data_config_of(context.run_config, val_per_class)
    configure_torch_threads(settings.torch_threads)
    torch.manual_seed(settings.seed)
    model = build_task_model(settings.model, data_config)
    evaluation = CentralEvaluation(
        build_task_model(settings.model, data_config), load_test_set(data_config), resolve_device(settings.device)
    )
    run_dir = make_run_dir(settings.results_dir, settings.run_name, context.run_id)
    made.append(run_dir)
    market = market_config_of(settings, data_config, context.run_id)
    if factory is None:  # the market phase waits for the nodes
        relaunch = relaunch_of(
            settings.market_relaunch_every,
            settings.market_relaunch_churn,
            settings.market_relaunch_min_cohort,
            settings.market_relaunch_share,
        )
        strategy: Strategy = FLMarket(
            fedavg(settings),
            market_config=market,
            seed=settings.seed,
            settle_on_delivery=settings.settle_on_delivery,
            relaunch=relaunch,
        )
    else:  # a baseline: the one wait, by the market's rule (enough nodes for the run, then settled)
        nodes = MarketPhase(market).wait_for_nodes(grid)
        strategy = factory(settings, data_config, len(nodes))
    progress = None
    if isinstance(strategy, FLMarket):  # market.json from now on, in case Flower ends the ServerApp
        market_strategy = strategy
        progress = MarketProgress(run_dir / "market.json", settings.budget, lambda: market_strategy.market_outcome)
        progress.begin()
        grid = ProgressGrid(grid, progress.saw)
    try:
        result = _start(strategy, grid, settings, model, evaluation)
    except MarketError:
        if progress is not None and isinstance(strategy, FLMarket) and strategy.market_outcome is not None:
            progress.finish(strategy.market_outcome)  # what the market saw: why nobody won
        raise
    except BaseException as err:  # Flower ending the ServerApp (SIGINT, exit): say where the market was
        if progress is not None:
            progress.interrupted(err)
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
        train_config=ConfigRecord(train_message_config(settings)),
        evaluate_config=ConfigRecord(),
        evaluate_fn=evaluation,
    )


def market_config_of(settings: ServerSettings, data_config: DataConfig, run_id: int) -> MarketConfig:
    """The market phase's settings for this run."""
    include, exclude = membership_of(settings.market_include, settings.market_include_payment, settings.market_exclude)
    return MarketConfig(
        include=include,
        exclude=exclude,
        budget=settings.budget,
        num_classes=num_classes(data_config),
        num_winners=settings.num_selected or None,
        budget_rule=settings.auction_budget_rule,
        min_clients=settings.min_market_clients,
        neighbours=neighbours_of(settings.neighbours),
        pass_reruns=count_or_auto(settings.pass_reruns),
        pass_colluders=count_or_auto(settings.pass_colluders),
        audit_winners=settings.audit_winners,
        security=settings.market_security.lower().replace("_", "-"),
        directory=IdentityDirectory.from_json(Path(settings.identity_directory))
        if settings.identity_directory
        else None,
        roster_history=RosterHistory(settings.roster_history) if settings.roster_history else None,
        buyer_key=load_identity_key(settings.buyer_key) if settings.buyer_key else None,
        timeout=settings.market_timeout,
        timeout_per_node=settings.market_timeout_per_node,
        min_participation=settings.market_min_participation,
        wait_for_nodes_timeout=settings.wait_for_nodes_timeout,
        session_label=f"flmarket-run-{run_id}",
        noise=market_noise(settings.pass_dp_epsilon, settings.pass_dp_delta, settings.pass_dp_honest_fraction),
    )


def build_server_app(
    run_config: Mapping[str, Any] | None = None, strategy: StrategyFactory | None = None, val_per_class: int = 0
) -> ServerApp:
    """A ``ServerApp`` running :func:`run` with ``run_config`` laid over Flower's, and another selector.

    ``flwr.simulation.run_simulation`` (Flower 1.41) takes no run config: :mod:`simulations` passes
    each job's config (and its baseline selector) this way.

    Parameters
    ----------
    run_config : Mapping[str, Any], optional
        Run-config keys and values; they win over the context's.
    strategy : StrategyFactory, optional
        The strategy that selects and trains in place of the market (``None``: FLMarket).
    val_per_class : int (default: 0)
        The data config's server-side validation split.

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
        run(
            grid,
            Context(context.run_id, context.node_id, context.node_config, context.state, config),
            strategy,
            val_per_class,
        )

    return server
