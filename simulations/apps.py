"""The experiments' ServerApp and ClientApp: the product app plus the paper's baselines.

:func:`build_client_app` is the product ClientApp with one more handler, the baselines' statistics query
(:mod:`simulations.selector_stats`): a client answers it only because its operator runs this app.
:func:`build_server_app` is the product ServerApp running the job's ``selector``: FLMarket (the app's own), a
pre-training baseline RS, QBS, DICE, DDS (:class:`PreTrainingSelection`) or the in-training S-FedAvg in its place.
Both take a job's run config (:data:`~simulations.run_config.EXPERIMENT_SCHEMA`) and hand the app its own keys,
with ``val-per-class`` as the data config's validation split. :mod:`simulations.run` runs both through
``flwr.simulation.run_simulation``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from functools import partial
from logging import INFO
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Result, Strategy
from flwr.supercore import log

from flmarket_flwr.app import client_app, server_app
from flmarket_flwr.app.models import set_arrays
from flmarket_flwr.app.server_app import ServerSettings
from flmarket_flwr.app.task import (
    EMBEDDING_DIM,
    DataConfig,
    build_task_model,
    evaluate,
    load_validation_set,
    num_classes,
    resolve_device,
)
from flmarket_flwr.market import WinnersGrid
from flmarket_flwr.market.buyer.strategy import start_on_nodes
from flmarket_flwr.nodes import connected_nodes
from simulations.baselines import SFedAvg
from simulations.baselines.selectors import select_clients
from simulations.run_config import split_run_config
from simulations.selector_stats import ACTION_SELECTOR_STATS, answer_selector_stats, collect_selector_stats

__all__ = [
    "BASELINES",
    "PreTrainingSelection",
    "build_client_app",
    "build_server_app",
    "make_validation_fn",
    "strategy_of",
]

BASELINES = ("rs", "qbs", "dice", "dds")
"""Pre-training baselines: they select on the clients' raw label counts (no privacy)."""


def build_client_app(run_config: Mapping[str, Any] | None = None) -> ClientApp:
    """The product ClientApp on the job's training pool (``val-per-class`` held out) that also answers the
    baselines' ``query.selector_stats`` with its raw counts; ``run_config``: the job's (the app gets its keys)."""
    app_config, own = split_run_config(run_config or {})
    app = client_app.build_client_app(app_config or None, own.val_per_class)
    app.query(ACTION_SELECTOR_STATS)(client_app.with_split(answer_selector_stats, own.val_per_class))
    return app


def build_server_app(run_config: Mapping[str, Any] | None = None) -> ServerApp:
    """The product ServerApp running the job's ``selector`` (:func:`strategy_of`) with ``val-per-class`` as its
    validation split; ``run_config``: the job's (the app gets its own keys, and refuses any other, here already).
    """
    app_config, own = split_run_config(run_config or {})
    strategy = strategy_of(own.selector, ServerSettings.from_run_config(app_config).num_selected)
    return server_app.build_server_app(app_config, strategy, own.val_per_class)


def strategy_of(selector: str, num_selected: int) -> server_app.StrategyFactory | None:
    """The strategy the app runs in place of the market for ``selector`` (``None``: ``flmarket``, the app's own).

    Raises
    ------
    ValueError
        For an unknown selector, or a baseline with ``num-selected`` 0 (the budget mode is the engine's).
    """
    if selector == "flmarket":
        return None
    if num_selected < 1:
        raise ValueError(f"run-config key num-selected: must be > 0 for selector={selector!r}")
    if selector == "sfedavg":
        return RecordedSFedAvg.factory
    if selector not in BASELINES:
        raise ValueError(f"run-config key selector={selector!r}: must be flmarket, sfedavg or one of {list(BASELINES)}")
    return partial(PreTrainingSelection.factory, selector=selector)


class PreTrainingSelection(Strategy):
    """A pre-training baseline (RS, QBS, DICE, DDS), then the wrapped strategy on its selection only.

    Like :class:`~flmarket_flwr.market.FLMarket`, but the selection reads every client's raw label counts
    (and, for DDS, an input embedding) through ``query.selector_stats``.

    Parameters
    ----------
    strategy : Strategy
        The strategy to run on the selected clients.
    settings : ServerSettings
        ``num_selected``, ``seed``, ``market_timeout``.
    num_classes : int
        Length of the label-count vectors.
    selector : str
        The baseline: one of :data:`BASELINES`.
    """

    def __init__(self, strategy: Strategy, settings: ServerSettings, num_classes: int, selector: str) -> None:
        super().__init__()
        if selector not in BASELINES:
            raise ValueError(f"selector {selector!r}: a pre-training baseline is one of {list(BASELINES)}")
        self.strategy = strategy
        self.settings = settings
        self.num_classes = num_classes
        self.selector = selector
        self.record: dict[str, Any] = {}

    @classmethod
    def factory(
        cls, settings: ServerSettings, data_config: DataConfig, num_nodes: int, *, selector: str
    ) -> PreTrainingSelection:
        """:data:`~flmarket_flwr.app.server_app.StrategyFactory` for the baselines (``selector`` bound): FedAvg on
        the selection."""
        del num_nodes
        return cls(server_app.fedavg(settings), settings, num_classes(data_config), selector)

    def start(self, grid: Grid, initial_arrays: ArrayRecord, **start_args: Any) -> Result:  # type: ignore[override]
        """Select ``num_selected`` clients on their raw statistics, then start the wrapped strategy on them."""
        started = time.perf_counter()
        selected = self.select(grid)
        self.record["time_s"] = time.perf_counter() - started
        log(
            INFO,
            "Selector %r: %d of %d selected: %s",
            self.selector,
            len(selected),
            len(self.record["candidates"]),
            selected,
        )
        view = WinnersGrid(grid, selected, seed=self.settings.seed)
        return start_on_nodes(self.strategy, view, initial_arrays=initial_arrays, **start_args)

    def select(self, grid: Grid) -> list[int]:
        """Ask every node for its statistics and run the selector; record what it saw."""
        settings = self.settings
        nodes = connected_nodes(grid)  # the ServerApp waited for them (server_app.run)
        want_embedding = self.selector == "dds"
        counts, embeddings, excluded = collect_selector_stats(
            grid,
            nodes,
            num_classes=self.num_classes,
            embedding_dim=EMBEDDING_DIM if want_embedding else None,
            projection_seed=settings.seed,
            timeout=settings.market_timeout,
        )
        if len(counts) < settings.num_selected:
            raise RuntimeError(
                f"{self.selector}: {len(counts)} client(s) answered the statistics query, "
                f"fewer than num-selected={settings.num_selected}; excluded: {excluded}"
            )
        # Order the candidates by their data, not by node id: simulation node ids are random per run.
        candidates = sorted(counts, key=lambda node: (counts[node].tolist(), node))
        extra: dict[str, Any] = {}
        if want_embedding:
            extra["embeddings"] = np.array([embeddings[node] for node in candidates], dtype=np.float64)
        matrix = np.array([counts[node] for node in candidates], dtype=np.int64)
        positions = select_clients(self.selector, matrix, settings.num_selected, seed=settings.seed, **extra)
        selected = [candidates[int(position)] for position in positions]
        self.record = {
            "selector": self.selector,
            "selected": selected,
            "candidates": sorted(candidates),
            "label_counts": {str(node): counts[node].tolist() for node in candidates},
            "embeddings": {str(node): embeddings[node].tolist() for node in candidates} if want_embedding else None,
            "excluded": {str(node): reason for node, reason in excluded.items()},
        }
        return selected

    def selection_record(self) -> dict[str, Any]:
        """``selection.json``: the selection and the raw statistics it was made on."""
        return dict(self.record)

    def result_files(self) -> dict[str, Any]:
        """No extra file."""
        return {}

    def summary(self) -> None:
        """Delegate to the wrapped strategy."""
        self.strategy.summary()

    def configure_train(self, *args: Any) -> Any:
        """Delegate to the wrapped strategy."""
        return self.strategy.configure_train(*args)

    def aggregate_train(self, *args: Any) -> Any:
        """Delegate to the wrapped strategy."""
        return self.strategy.aggregate_train(*args)

    def configure_evaluate(self, *args: Any) -> Any:
        """Delegate to the wrapped strategy."""
        return self.strategy.configure_evaluate(*args)

    def aggregate_evaluate(self, *args: Any) -> Any:
        """Delegate to the wrapped strategy."""
        return self.strategy.aggregate_evaluate(*args)


class RecordedSFedAvg(SFedAvg):
    """S-FedAvg over every client (``num_selected`` sampled per round), with the app's records."""

    @classmethod
    def factory(cls, settings: ServerSettings, data_config: DataConfig, num_nodes: int) -> RecordedSFedAvg:
        """:data:`~flmarket_flwr.app.server_app.StrategyFactory` for ``selector="sfedavg"``."""
        if data_config.val_per_class < 1:
            raise ValueError(
                "run-config key val-per-class: S-FedAvg values clients on a server-side validation split; "
                "set it > 0 (e.g. 10), and use the same value for the runs it is compared with"
            )
        device = resolve_device(settings.device)
        validation_fn = make_validation_fn(
            build_task_model(settings.model, data_config), load_validation_set(data_config), device
        )
        strategy = cls(
            validation_fn,
            num_train_nodes=settings.num_selected,
            seed=settings.seed,
            min_available_nodes=max(num_nodes, settings.num_selected),
            wait_for_nodes_timeout=settings.wait_for_nodes_timeout,
            fraction_evaluate=settings.fraction_evaluate,
            min_evaluate_nodes=1 if settings.fraction_evaluate > 0 else 0,
        )
        return strategy

    def selection_record(self) -> dict[str, Any]:
        """``selection.json``: every node a candidate; who was sampled in each round."""
        rounds = self.history()["rounds"]
        candidates = sorted({int(node) for node in self.relevance})
        return {
            "selector": "sfedavg",
            "selected": candidates,
            "candidates": candidates,
            "label_counts": None,
            "trained": sorted({node for record in rounds for node in record["sampled"]}),
            "sampled_per_round": {str(record["server_round"]): record["sampled"] for record in rounds},
            "time_s": 0.0,
        }

    def result_files(self) -> dict[str, Any]:
        """``sfedavg.json``: per-round samples and Shapley values."""
        return {"sfedavg.json": self.history()}


def make_validation_fn(
    model: torch.nn.Module,
    data: tuple[torch.Tensor, torch.Tensor],
    device: torch.device | str = "cpu",
    batch_size: int = 512,
) -> Callable[[ArrayRecord], float]:
    """Build an S-FedAvg ``validation_fn``: the accuracy of ``arrays`` on ``data``.

    Parameters
    ----------
    model : torch.nn.Module
        A model of the trained architecture (its weights are overwritten at each call).
    data : tuple[torch.Tensor, torch.Tensor]
        The server's validation inputs and labels.
    device : torch.device or str (default: "cpu")
        Device to evaluate on.
    batch_size : int (default: 512)
        Evaluation batch size.

    Returns
    -------
    Callable[[ArrayRecord], float]
        ``arrays -> accuracy`` in ``[0, 1]``.
    """
    if int(data[1].shape[0]) == 0:
        raise ValueError("the validation set is empty")
    target = torch.device(device)

    def validation_fn(arrays: ArrayRecord) -> float:
        set_arrays(model, arrays)
        _, accuracy = evaluate(model, data, target, batch_size=batch_size)
        return float(accuracy)

    return validation_fn
