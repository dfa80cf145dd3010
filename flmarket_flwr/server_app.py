"""ServerApp of the FLMarket Flower app: client selection, then FedAvg over the selected clients.

Flow of :func:`main`:

1. **Selection** (``selector`` key; every selector ends in a list of node ids):

   * ``"flmarket"`` (default) -- the market: :class:`~flmarket_flwr.market.MarketPhase`
     runs PASS (secure sum of the clients' label counts: the server never sees a
     client's own counts), collects every client's score and bid and runs the
     truthful, budget-feasible reverse auction (``budget`` key) or, with
     ``num-selected > 0``, picks a fixed-size cohort.
   * ``"rs"``, ``"qbs"``, ``"dice"``, ``"dds"`` -- the paper's pre-training baselines.
     One Flower message round (``query.selector_stats``) asks every client for its
     **raw** label counts (and, for DDS, a 16-number embedding of its inputs,
     :func:`~flmarket_flwr.task.data_embedding`): these baselines have no privacy
     protection, unlike FLMarket's PASS. Then
     :func:`~flmarket_flwr.pricing.select_clients` picks ``num-selected`` of them.
   * ``"sfedavg"`` -- the in-training baseline: no pre-training selection; every
     client stays available and :class:`~flmarket_flwr.strategies.SFedAvg` samples
     ``num-selected`` of them each round by their Shapley-valued relevance, measured
     on the server's validation split (``val-per-class`` must be > 0).

2. **Training.** For the pre-training selectors, a standard
   ``flwr.serverapp.strategy.FedAvg`` runs on :class:`~flmarket_flwr.market.WinnersGrid`,
   a view of the Grid that only shows the selected nodes: no other node ever receives
   a train or evaluate message. The model is ``model`` (``digits_cnn`` by default).
   The global model is evaluated on the server's held-out test set before training
   and after every round.
3. **Results.** ``selection.json`` (selector, candidates, selected node ids and, for
   the baselines, the label counts they saw), ``market.json`` (FLMarket: auction
   outcome), ``sfedavg.json`` (S-FedAvg: per-round samples and Shapley values),
   ``history.json`` and ``history.csv`` (per-round accuracy, loss and wall times) and
   ``final_model.pt`` are written to ``<results-dir>/<run-name>``, and a summary is
   logged.

:func:`build_server_app` builds a ``ServerApp`` with a fixed run config laid over
Flower's (used by :mod:`simulations.run` through ``flwr.simulation.run_simulation``,
which takes no run config); ``app`` is the one ``flwr run`` loads.
"""


import csv
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg, Result, Strategy

from flmarket_flwr.market import (
    MarketConfig,
    MarketError,
    MarketOutcome,
    MarketPhase,
    WinnersGrid,
)
from flmarket_flwr.models import set_arrays
from flmarket_flwr.task import (
    DataConfig,
    build_task_model,
    configure_torch_threads,
    evaluate,
    load_test_set,
    load_validation_set,
    num_classes,
    resolve_device,
)

__all__ = [
    "BASELINE_SELECTORS",
    "SELECTORS",
    "Selection",
    "SelectionError",
    "ServerSettings",
    "app",
    "build_server_app",
    "main",
]

BASELINE_SELECTORS = ("rs", "qbs", "dice", "dds")
"""Pre-training baselines: they see the clients' raw label counts (no privacy)."""
SELECTORS = ("flmarket", *BASELINE_SELECTORS, "sfedavg")
"""Values of the ``selector`` key."""


class SelectionError(RuntimeError):
    """A baseline selector cannot select (too few clients answered, bad settings)."""


# pylint: disable=too-many-instance-attributes
@dataclass(frozen=True)
class ServerSettings:
    """Server-side keys of the run config (see ``[tool.flwr.app.config]``).

    Attributes
    ----------
    selector : str
        ``"flmarket"``, ``"rs"``, ``"qbs"``, ``"dice"``, ``"dds"`` or ``"sfedavg"``.
    model : str
        Model name for :func:`flmarket_flwr.models.build_model`.
    budget : float
        Budget ``R`` of the reverse auction.
    num_selected : int
        FLMarket: ``0`` budget-driven auction, ``> 0`` fixed cohort of that many
        clients. Baselines: the cohort size (must be ``> 0``). S-FedAvg: clients
        sampled per round (must be ``> 0``).
    num_server_rounds : int
        Number of FedAvg rounds.
    local_epochs : int
        Local epochs per round (sent to the clients).
    batch_size : int
        Client mini-batch size (sent to the clients).
    learning_rate : float
        Client SGD learning rate (sent to the clients).
    momentum : float
        Client SGD momentum (sent to the clients).
    fraction_train : float
        Fraction of the selected clients sampled for training each round (not used
        by S-FedAvg, which samples ``num_selected``).
    fraction_evaluate : float
        Fraction of the selected clients sampled for federated evaluation each round
        (``0.0`` disables it; the server always evaluates centrally).
    seed : int
        Seed of the initial model, of the random selector and of the sampling.
    device : str
        Device of the server-side evaluation (``"auto"``, ``"cpu"``, ``"cuda"``).
    results_dir : str
        Folder under which each run writes its own sub-folder.
    run_name : str
        Name of the run's sub-folder; empty: ``<timestamp>_run-<run_id>``.
    market_timeout : float
        Seconds the market phase (or the baselines' statistics query) waits for the
        replies of one step.
    wait_for_nodes_timeout : float
        Seconds to wait for ``num-clients`` nodes to connect.
    max_pass_attempts : int
        Bound on the PASS re-runs after client drop-outs.
    min_market_clients : int
        Fewest clients the market accepts (PASS needs at least 3).
    round_timeout : float
        Seconds FedAvg waits for the replies of one round.
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
    max_pass_attempts: int = 3
    min_market_clients: int = 3
    round_timeout: float = 600.0

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> "ServerSettings":
        """Read the settings from a run config (missing keys keep their default).

        Config keys are the attribute names with ``-`` instead of ``_``.
        """
        values: dict[str, Any] = {}
        for name, default in asdict(cls()).items():
            key = name.replace("_", "-")
            if key in run_config:
                values[name] = type(default)(run_config[key])
        if "selector" in values:
            values["selector"] = values["selector"].strip().lower()
        settings = cls(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        """Raise ``ValueError`` on values that cannot work."""
        if self.selector not in SELECTORS:
            raise ValueError(f"selector must be one of {list(SELECTORS)}, got {self.selector!r}")
        if self.num_server_rounds < 1:
            raise ValueError("num-server-rounds must be >= 1")
        if self.num_selected < 0:
            raise ValueError("num-selected must be >= 0 (0 = budget-driven auction)")
        if self.selector != "flmarket" and self.num_selected < 1:
            raise ValueError(
                f"selector {self.selector!r} needs num-selected > 0 (the number of clients "
                f"to select); only 'flmarket' has a budget-driven mode (num-selected=0)"
            )
        if self.budget <= 0:
            raise ValueError("budget must be > 0")
        if not 0.0 < self.fraction_train <= 1.0:
            raise ValueError("fraction-train must be in (0, 1]")
        if not 0.0 <= self.fraction_evaluate <= 1.0:
            raise ValueError("fraction-evaluate must be in [0, 1]")


@dataclass
class Selection:
    """Outcome of the selection step, whatever the selector.

    Attributes
    ----------
    selector : str
        The selector that ran.
    selected : list[int]
        Node ids selected for training, in selection order (S-FedAvg: every candidate;
        the strategy samples among them each round).
    candidates : list[int]
        Node ids the selector chose from, ascending.
    label_counts : dict[int, list[int]] or None
        Baselines only: each candidate's label counts, as the selector saw them (in
        clear). ``None`` for FLMarket (the server only learns their sum, through PASS)
        and S-FedAvg.
    embeddings : dict[int, list[float]] or None
        DDS only: each candidate's data embedding.
    outcome : MarketOutcome or None
        FLMarket only: the market's outcome.
    excluded : dict[int, str]
        Candidates left out, with the reason.
    time_s : float
        Wall time of the selection step (waiting for the nodes included).
    """

    selector: str
    selected: list[int]
    candidates: list[int]
    label_counts: dict[int, list[int]] | None = None
    embeddings: dict[int, list[float]] | None = None
    outcome: MarketOutcome | None = None
    excluded: dict[int, str] = field(default_factory=dict)
    time_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (node-id keys as strings)."""
        return {
            "selector": self.selector,
            "selected": [int(node) for node in self.selected],
            "candidates": [int(node) for node in self.candidates],
            "label_counts": None
            if self.label_counts is None
            else {str(node): counts for node, counts in self.label_counts.items()},
            "embeddings": None
            if self.embeddings is None
            else {str(node): values for node, values in self.embeddings.items()},
            "excluded": {str(node): reason for node, reason in self.excluded.items()},
            "time_s": self.time_s,
        }


@dataclass
class RoundRecord:
    """One row of the training history (round 0 is the initial model)."""

    round: int
    accuracy: float
    loss: float
    train_loss: float | None
    round_time_s: float
    eval_time_s: float
    elapsed_s: float


class CentralEvaluation:
    """Server-side evaluation of the global model, with per-round wall times.

    Used as the ``evaluate_fn`` of ``Strategy.start``, which calls it before the
    first round and after every round. The time between the end of one call and
    the start of the next is the wall time of the federated part of a round
    (sending the model, local training, aggregation, federated evaluation, and for
    S-FedAvg the Shapley valuation).

    Parameters
    ----------
    model : torch.nn.Module
        A model of the trained architecture (its weights are overwritten).
    test_data : tuple[torch.Tensor, torch.Tensor]
        The held-out test set.
    device : torch.device
        Device to evaluate on.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        test_data: tuple[torch.Tensor, torch.Tensor],
        device: torch.device,
    ) -> None:
        self.model = model
        self.test_data = test_data
        self.device = device
        self.records: list[RoundRecord] = []
        self._t_start = time.perf_counter()
        self._t_last_end = self._t_start

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord:
        """Evaluate ``arrays`` on the test set and record the round's times."""
        t_begin = time.perf_counter()
        set_arrays(self.model, arrays)
        loss, accuracy = evaluate(self.model, self.test_data, self.device)
        t_end = time.perf_counter()
        self.records.append(
            RoundRecord(
                round=server_round,
                accuracy=accuracy,
                loss=loss,
                train_loss=None,
                round_time_s=0.0 if server_round == 0 else t_begin - self._t_last_end,
                eval_time_s=t_end - t_begin,
                elapsed_s=t_end - self._t_start,
            )
        )
        self._t_last_end = t_end
        return MetricRecord({"accuracy": accuracy, "loss": loss})


app = ServerApp()


BaselineSelection = Callable[[Grid, ServerSettings, DataConfig], Selection]
"""Experiments hook: run a pre-training baseline selector (RS, QBS, DICE, DDS) on the grid."""


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Select the clients, train FedAvg (or S-FedAvg) on them, and save the results."""
    run(grid, context)


def run(grid: Grid, context: Context, select_baseline: BaselineSelection | None = None) -> None:
    """Select the clients, train on them, and save the results.

    ``select_baseline`` runs the pre-training baselines; the product app has none (they need every
    client's raw label counts), so a baseline ``selector`` fails here, before anything is sent.
    """
    t_run = time.perf_counter()
    settings = ServerSettings.from_run_config(context.run_config)
    if settings.selector in BASELINE_SELECTORS and select_baseline is None:
        raise ValueError(
            f"selector={settings.selector!r} is an experiments baseline that reads every client's raw label "
            f"counts; this app does not run it. Run baselines through `python -m simulations.run "
            f"selector={settings.selector}`"
        )
    data_config = DataConfig.from_run_config(context.run_config)
    configure_torch_threads(int(context.run_config.get("torch-threads", 0)))
    run_dir = _make_run_dir(settings, context.run_id)
    log(INFO, "FLMarket app: selector %r, results go to %s", settings.selector, run_dir)

    # 1. Selection
    try:
        selection = _select(grid, settings, data_config, context.run_id, select_baseline)
    except (MarketError, SelectionError) as err:
        (run_dir / "error.txt").write_text(f"selection failed: {err}\n", encoding="utf-8")
        log(ERROR, "FLMarket app: %s selection failed: %s", settings.selector, err)
        raise
    if selection.outcome is not None:
        selection.outcome.save_json(run_dir / "market.json")
        _log_market(selection.outcome, selection.time_s)
    else:
        _log_selection(selection)

    # 2. Training
    result: Result | None = None
    evaluation: CentralEvaluation | None = None
    sfedavg_history: dict[str, Any] | None = None
    if len(selection.selected) == 0:
        log(WARNING, "FLMarket app: no client was selected; skipping training.")
    elif settings.selector == "sfedavg":
        evaluation, result, sfedavg_history = _train_sfedavg(grid, selection, settings, data_config)
        (run_dir / "sfedavg.json").write_text(json.dumps(sfedavg_history, indent=2), encoding="utf-8")
    else:
        evaluation, result = _train_selected(grid, selection.selected, settings, data_config)
    if result is not None:
        torch.save(result.arrays.to_torch_state_dict(), run_dir / "final_model.pt")

    # 3. Results
    records = _history(evaluation, result)
    timings = {
        "selection_s": selection.time_s,
        "fedavg_total_s": sum(r.round_time_s + r.eval_time_s for r in records),
        "total_s": time.perf_counter() - t_run,
    }
    if selection.outcome is not None:
        timings["market_phase_s"] = selection.time_s
    selection_record = selection.to_dict()
    if sfedavg_history is not None:
        selection_record["sampled_per_round"] = {
            str(record["server_round"]): record["sampled"] for record in sfedavg_history["rounds"]
        }
    (run_dir / "selection.json").write_text(json.dumps(selection_record, indent=2), encoding="utf-8")
    _save_history(run_dir, records, timings, settings, data_config, selection, sfedavg_history)
    _log_summary(run_dir, selection, records, timings)


def build_server_app(
    run_config: Mapping[str, Any] | None = None, select_baseline: BaselineSelection | None = None
) -> ServerApp:
    """Build a ``ServerApp`` running :func:`main` with ``run_config`` laid over Flower's.

    ``flwr.simulation.run_simulation`` (Flower 1.41) takes no run config: the
    ServerApp's context then has an empty one. :mod:`simulations.run` passes each
    job's config this way (and the same config to
    :func:`flmarket_flwr.client_app.build_client_app`).

    Parameters
    ----------
    run_config : Mapping[str, Any], optional
        Run-config keys and values; they win over the context's.
    select_baseline : BaselineSelection, optional
        The experiments' baseline selectors (:mod:`simulations.apps`); ``None``: FLMarket and S-FedAvg only.

    Returns
    -------
    ServerApp
        A new app.
    """
    overlay = dict(run_config or {})
    server = ServerApp()

    @server.main()
    def _main(grid: Grid, context: Context) -> None:
        run(
            grid,
            Context(
                run_id=context.run_id,
                node_id=context.node_id,
                node_config=context.node_config,
                state=context.state,
                run_config={**context.run_config, **overlay},
            ),
            select_baseline,
        )

    return server


# --- Selection ---------------------------------------------------------------------------------
def _select(
    grid: Grid,
    settings: ServerSettings,
    data_config: DataConfig,
    run_id: int,
    select_baseline: BaselineSelection | None,
) -> Selection:
    """Run the configured selector and return its :class:`Selection`."""
    started = time.perf_counter()
    if settings.selector == "flmarket":
        outcome = MarketPhase(_market_config(settings, data_config, run_id)).run(grid)
        selection = Selection(
            selector="flmarket",
            selected=list(outcome.winners),
            candidates=list(outcome.participants),
            outcome=outcome,
            excluded=dict(outcome.excluded),
        )
    elif settings.selector == "sfedavg":
        if data_config.val_per_class < 1:
            raise SelectionError(
                "S-FedAvg values clients on a server-side validation split: set "
                "val-per-class > 0 (e.g. 10), and use the same value for the runs it is "
                "compared with, so that every selector sees the same client data"
            )
        nodes = _wait_for_nodes(grid, data_config.num_clients, settings.wait_for_nodes_timeout)
        if len(nodes) < settings.num_selected:
            raise SelectionError(
                f"S-FedAvg samples num-selected={settings.num_selected} clients per round, "
                f"but only {len(nodes)} are connected"
            )
        selection = Selection(selector="sfedavg", selected=list(nodes), candidates=list(nodes))
    else:
        assert select_baseline is not None
        selection = select_baseline(grid, settings, data_config)
    selection.time_s = time.perf_counter() - started
    return selection


def _market_config(
    settings: ServerSettings, data_config: DataConfig, run_id: int
) -> MarketConfig:
    """Market phase settings for this run."""
    return MarketConfig(
        budget=settings.budget,
        num_classes=num_classes(data_config),
        num_winners=settings.num_selected or None,
        min_clients=settings.min_market_clients,
        max_pass_attempts=settings.max_pass_attempts,
        timeout=settings.market_timeout,
        wait_for_nodes_timeout=settings.wait_for_nodes_timeout,
        expected_nodes=data_config.num_clients,
        session_label=f"flmarket-run-{run_id}",
    )


def _wait_for_nodes(grid: Grid, expected: int, timeout: float, poll: float = 0.2) -> list[int]:
    """Wait (at most ``timeout`` s) for ``expected`` nodes; return those connected, ascending."""
    deadline = time.monotonic() + timeout
    nodes = sorted({int(node) for node in grid.get_node_ids()})
    while len(nodes) < expected and time.monotonic() < deadline:
        time.sleep(poll)
        nodes = sorted({int(node) for node in grid.get_node_ids()})
    if len(nodes) < expected:
        log(WARNING, "Selection: %d of %d nodes connected after %g s; going on with them",
            len(nodes), expected, timeout)
    return nodes


# --- Training ----------------------------------------------------------------------------------
def _train_config(settings: ServerSettings) -> ConfigRecord:
    """What every train message carries."""
    return ConfigRecord(
        {
            "local-epochs": settings.local_epochs,
            "batch-size": settings.batch_size,
            "learning-rate": settings.learning_rate,
            "momentum": settings.momentum,
        }
    )


def _initial_model_and_evaluation(
    settings: ServerSettings, data_config: DataConfig
) -> tuple[torch.nn.Module, CentralEvaluation]:
    """The seeded initial model and the server-side test-set evaluation."""
    torch.manual_seed(settings.seed)
    model = build_task_model(settings.model, data_config)
    evaluation = CentralEvaluation(
        model=build_task_model(settings.model, data_config),
        test_data=load_test_set(data_config),
        device=resolve_device(settings.device),
    )
    return model, evaluation


def _train_selected(
    grid: Grid,
    selected: Sequence[int],
    settings: ServerSettings,
    data_config: DataConfig,
) -> tuple[CentralEvaluation, Result]:
    """Run FedAvg on a Grid that only exposes the selected nodes."""
    selected_grid = WinnersGrid(grid, list(selected), seed=settings.seed)
    strategy = FedAvg(
        fraction_train=settings.fraction_train,
        fraction_evaluate=settings.fraction_evaluate,
        min_train_nodes=1,
        min_evaluate_nodes=1 if settings.fraction_evaluate > 0 else 0,
        # Never wait for a selected node that has gone: train whichever are there.
        min_available_nodes=1,
    )
    evaluation, result = _start(strategy, selected_grid, settings, data_config)
    return evaluation, result


def _start(
    strategy: Strategy, grid: Grid, settings: ServerSettings, data_config: DataConfig
) -> tuple[CentralEvaluation, Result]:
    """Start `strategy` from a fresh model, evaluating the global model on the server each round."""
    model, evaluation = _initial_model_and_evaluation(settings, data_config)
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=settings.num_server_rounds,
        timeout=settings.round_timeout,
        train_config=_train_config(settings),
        evaluate_config=ConfigRecord(),
        evaluate_fn=evaluation,
    )
    return evaluation, result


def _train_sfedavg(
    grid: Grid,
    selection: Selection,
    settings: ServerSettings,
    data_config: DataConfig,
) -> tuple[CentralEvaluation, Result, dict[str, Any]]:
    """Run S-FedAvg over every candidate; it samples ``num_selected`` of them per round."""
    # pylint: disable-next=import-outside-toplevel
    from flmarket_flwr.strategies import SFedAvg, make_validation_fn

    device = resolve_device(settings.device)
    validation_fn = make_validation_fn(
        build_task_model(settings.model, data_config), load_validation_set(data_config), device
    )
    strategy = SFedAvg(
        validation_fn,
        num_train_nodes=settings.num_selected,
        seed=settings.seed,
        min_available_nodes=len(selection.candidates),
        wait_for_nodes_timeout=settings.wait_for_nodes_timeout,
        fraction_evaluate=settings.fraction_evaluate,
        min_evaluate_nodes=1 if settings.fraction_evaluate > 0 else 0,
    )
    evaluation, result = _start(strategy, grid, settings, data_config)
    return evaluation, result, strategy.history()


# --- Results -----------------------------------------------------------------------------------
def _make_run_dir(settings: ServerSettings, run_id: int) -> Path:
    """Create and return ``<results-dir>/<run-name>`` (absolute)."""
    name = settings.run_name or (
        f"{datetime.now().strftime('%Y%m%d-%H%M%S')}_run-{run_id}"
    )
    run_dir = (Path(settings.results_dir).expanduser() / name).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def _history(
    evaluation: CentralEvaluation | None, result: Result | None
) -> list[RoundRecord]:
    """Per-round records, with the clients' aggregated training loss merged in."""
    if evaluation is None:
        return []
    records = list(evaluation.records)
    if result is not None:
        for record in records:
            metrics = result.train_metrics_clientapp.get(record.round)
            if metrics is not None and "train_loss" in metrics:
                record.train_loss = float(metrics["train_loss"])  # type: ignore[arg-type]
    return records


# pylint: disable=too-many-arguments,too-many-positional-arguments
def _save_history(
    run_dir: Path,
    records: list[RoundRecord],
    timings: dict[str, float],
    settings: ServerSettings,
    data_config: DataConfig,
    selection: Selection,
    sfedavg_history: dict[str, Any] | None,
) -> None:
    """Write ``history.json`` and ``history.csv``."""
    if sfedavg_history is not None:
        trained = sorted({node for record in sfedavg_history["rounds"] for node in record["sampled"]})
    else:
        trained = [int(node) for node in selection.selected]
    market_timings = dict(selection.outcome.timings) if selection.outcome is not None else {}
    payload = {
        "selector": selection.selector,
        "settings": asdict(settings),
        "data": asdict(data_config),
        "selected": [int(node) for node in selection.selected],
        "winners": trained,
        "timings": {**timings, "market": market_timings},
        "final_accuracy": records[-1].accuracy if records else math.nan,
        "rounds": [asdict(record) for record in records],
    }
    (run_dir / "history.json").write_text(
        json.dumps(payload, indent=2, default=str), encoding="utf-8"
    )
    with (run_dir / "history.csv").open("w", newline="", encoding="utf-8") as file:
        writer = csv.DictWriter(file, fieldnames=list(RoundRecord.__annotations__))
        writer.writeheader()
        for record in records:
            writer.writerow(asdict(record))


def _log_market(outcome: MarketOutcome, market_time: float) -> None:
    """Log the auction's outcome."""
    log(INFO, "")
    log(INFO, "FLMarket market phase finished in %.2fs", market_time)
    log(
        INFO,
        "\t├── %d participants, %d winners, %d excluded, %d PASS attempt(s)",
        len(outcome.participants),
        len(outcome.winners),
        len(outcome.excluded),
        outcome.pass_attempts,
    )
    for node_id in outcome.winners:
        log(
            INFO,
            "\t│\t├── node %s: score %.3f, bid %.2f, payment %.2f",
            node_id,
            float(outcome.scores.get(node_id, float("nan"))),
            float(outcome.bids.get(node_id, float("nan"))),
            float(outcome.payments.get(node_id, float("nan"))),
        )
    log(
        INFO,
        "\t└── total payment %.2f of budget %.2f",
        float(outcome.total_payment),
        float(outcome.budget),
    )


def _log_selection(selection: Selection) -> None:
    """Log a baseline's (or S-FedAvg's) selection."""
    log(INFO, "")
    log(INFO, "Selector %r finished in %.2fs", selection.selector, selection.time_s)
    if selection.selector == "sfedavg":
        log(INFO, "\t└── %d candidates; S-FedAvg samples among them every round",
            len(selection.candidates))
        return
    log(INFO, "\t├── %d candidates, %d excluded (raw label counts seen by the server)",
        len(selection.candidates), len(selection.excluded))
    for node_id in selection.selected:
        counts = (selection.label_counts or {}).get(node_id)
        log(INFO, "\t│\t├── node %s: label counts %s", node_id, counts)
    log(INFO, "\t└── %d selected", len(selection.selected))


def _log_summary(
    run_dir: Path,
    selection: Selection,
    records: list[RoundRecord],
    timings: dict[str, float],
) -> None:
    """Log a readable end-of-run summary."""
    log(INFO, "")
    log(INFO, "FLMarket summary (selector %r)", selection.selector)
    log(
        INFO,
        "\t├── selected (%d of %d): %s",
        len(selection.selected),
        len(selection.candidates),
        ", ".join(str(n) for n in selection.selected) or "none",
    )
    outcome = selection.outcome
    if outcome is not None:
        log(
            INFO,
            "\t├── total payment %.2f / budget %.2f",
            float(outcome.total_payment),
            float(outcome.budget),
        )
        log(INFO, "\t├── market phase: %.2fs", selection.time_s)
        for stage, seconds in outcome.timings.items():
            log(INFO, "\t│\t├── %s: %.3fs", stage, float(seconds))
    else:
        log(INFO, "\t├── selection: %.2fs", selection.time_s)
    for record in records:
        log(
            INFO,
            "\t├── round %2d: accuracy %.4f, loss %.4f, round %.2fs, eval %.3fs",
            record.round,
            record.accuracy,
            record.loss,
            record.round_time_s,
            record.eval_time_s,
        )
    log(INFO, "\t├── FedAvg total: %.2fs", timings["fedavg_total_s"])
    log(INFO, "\t└── results: %s", run_dir)
