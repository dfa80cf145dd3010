"""The experiments' ServerApp and ClientApp: the product app plus the non-private baseline selectors.

:func:`build_client_app` is the product ClientApp with one more handler, the baselines' statistics query
(:mod:`simulations.selector_stats`): a client answers it only because its operator runs this app.
:func:`build_server_app` is the product ServerApp with RS, QBS, DICE and DDS plugged in
(:func:`select_baseline`). :mod:`simulations.run` runs both through ``flwr.simulation.run_simulation``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from flmarket_flwr import client_app, server_app
from flmarket_flwr.market import MarketConfig, MarketPhase
from flmarket_flwr.pricing import select_clients
from flmarket_flwr.task import EMBEDDING_DIM, DataConfig, num_classes
from simulations.selector_stats import ACTION_SELECTOR_STATS, answer_selector_stats, collect_selector_stats

__all__ = ["build_client_app", "build_server_app", "select_baseline"]


def build_client_app(run_config: Mapping[str, Any] | None = None) -> ClientApp:
    """The product ClientApp (see :func:`flmarket_flwr.client_app.build_client_app`) that also answers
    the baselines' ``query.selector_stats`` with its raw label counts."""
    app = client_app.build_client_app(run_config)
    app.query(ACTION_SELECTOR_STATS)(answer_selector_stats)
    return app


def build_server_app(run_config: Mapping[str, Any] | None = None) -> ServerApp:
    """The product ServerApp with the baseline selectors RS, QBS, DICE and DDS plugged in."""
    return server_app.build_server_app(run_config, select_baseline=select_baseline)


def select_baseline(grid: Grid, settings: Any, data_config: DataConfig) -> Any:
    """RS, QBS, DICE or DDS: ask every client for its raw statistics, then select ``num-selected``.

    The clients' label counts (and DDS embeddings) reach the server in clear: these baselines have no
    privacy protection, unlike FLMarket's PASS.
    """
    waiting = MarketConfig(
        budget=1.0,
        num_classes=1,
        wait_for_nodes_timeout=settings.wait_for_nodes_timeout,
        poll_interval=0.2,
    )
    started = time.perf_counter()
    nodes = MarketPhase(waiting).wait_for_nodes(grid)
    want_embedding = settings.selector == "dds"
    counts, embeddings, excluded = collect_selector_stats(
        grid,
        nodes,
        num_classes=num_classes(data_config),
        embedding_dim=EMBEDDING_DIM if want_embedding else None,
        projection_seed=settings.seed,
        timeout=settings.market_timeout,
    )
    candidates = sorted(counts)
    if len(candidates) < settings.num_selected:
        raise server_app.SelectionError(
            f"{settings.selector}: {len(candidates)} client(s) answered the statistics query, "
            f"fewer than num-selected={settings.num_selected}; excluded: {excluded}"
        )
    matrix = np.array([counts[node] for node in candidates], dtype=np.int64)
    extra: dict[str, Any] = {}
    if want_embedding:
        extra["embeddings"] = np.array([embeddings[node] for node in candidates], dtype=np.float64)
    positions = select_clients(settings.selector, matrix, settings.num_selected, seed=settings.seed, **extra)
    return server_app.Selection(
        selector=settings.selector,
        selected=[candidates[int(position)] for position in positions],
        candidates=candidates,
        label_counts={node: [int(c) for c in counts[node]] for node in candidates},
        embeddings={node: [float(v) for v in embeddings[node]] for node in candidates} if want_embedding else None,
        excluded=excluded,
        time_s=time.perf_counter() - started,
    )
