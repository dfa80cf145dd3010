"""ServerApp of the FLMarket Flower app: market phase, then FedAvg over the winners.

Flow of :func:`main`:

1. **Market.** :class:`~flmarket_flwr.market.MarketPhase` runs PASS (secure sum of
   the clients' label counts), collects every client's score and bid and runs the
   truthful, budget-feasible reverse auction (``budget`` key) or, with
   ``num-selected > 0``, picks a fixed-size cohort.
2. **Training.** A standard ``flwr.serverapp.strategy.FedAvg`` runs on
   :class:`~flmarket_flwr.market.WinnersGrid`, a view of the Grid that only shows
   the winners: no other node ever receives a train or evaluate message.
   The global model is evaluated on the server's held-out, class-balanced test
   set before training and after every round.
3. **Results.** ``market.json`` (auction outcome), ``history.json`` and
   ``history.csv`` (per-round accuracy, loss and wall times) and
   ``final_model.pt`` are written to ``<results-dir>/<run-name>``, and a summary
   is logged.
"""


import csv
import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg, Result

from flmarket_flwr.market import (
    MarketConfig,
    MarketError,
    MarketOutcome,
    MarketPhase,
    WinnersGrid,
)
from flmarket_flwr.models import build_model, set_arrays
from flmarket_flwr.task import (
    DataConfig,
    configure_torch_threads,
    evaluate,
    load_test_set,
    num_classes,
    resolve_device,
)

app = ServerApp()


# pylint: disable=too-many-instance-attributes
@dataclass(frozen=True)
class ServerSettings:
    """Server-side keys of the run config (see ``[tool.flwr.app.config]``).

    Attributes
    ----------
    budget : float
        Budget ``R`` of the reverse auction.
    num_selected : int
        ``0``: budget-driven auction; ``> 0``: fixed cohort of that many clients.
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
        Fraction of the winners sampled for training each round.
    fraction_evaluate : float
        Fraction of the winners sampled for federated evaluation each round
        (``0.0`` disables it; the server always evaluates centrally).
    seed : int
        Seed of the initial model and of the winners' sampling.
    device : str
        Device of the server-side evaluation (``"auto"``, ``"cpu"``, ``"cuda"``).
    results_dir : str
        Folder under which each run writes its own sub-folder.
    run_name : str
        Name of the run's sub-folder; empty: ``<timestamp>_run-<run_id>``.
    market_timeout : float
        Seconds the market phase waits for the replies of one step.
    wait_for_nodes_timeout : float
        Seconds the market phase waits for ``num-clients`` nodes to connect.
    max_pass_attempts : int
        Bound on the PASS re-runs after client drop-outs.
    min_market_clients : int
        Fewest clients the market accepts (PASS needs at least 3).
    round_timeout : float
        Seconds FedAvg waits for the replies of one round.
    """

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
        settings = cls(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        """Raise ``ValueError`` on values that cannot work."""
        if self.num_server_rounds < 1:
            raise ValueError("num-server-rounds must be >= 1")
        if self.num_selected < 0:
            raise ValueError("num-selected must be >= 0 (0 = budget-driven auction)")
        if self.budget <= 0:
            raise ValueError("budget must be > 0")
        if not 0.0 < self.fraction_train <= 1.0:
            raise ValueError("fraction-train must be in (0, 1]")
        if not 0.0 <= self.fraction_evaluate <= 1.0:
            raise ValueError("fraction-evaluate must be in [0, 1]")


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
    (sending the model, local training, aggregation, federated evaluation).

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


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the market phase, then FedAvg over the winners, and save the results."""
    t_run = time.perf_counter()
    settings = ServerSettings.from_run_config(context.run_config)
    data_config = DataConfig.from_run_config(context.run_config)
    configure_torch_threads(int(context.run_config.get("torch-threads", 0)))
    run_dir = _make_run_dir(settings, context.run_id)
    log(INFO, "FLMarket: results go to %s", run_dir)

    # 1. Market phase
    market_config = _market_config(settings, data_config, context.run_id)
    t_market = time.perf_counter()
    try:
        outcome = MarketPhase(market_config).run(grid)
    except MarketError as err:
        (run_dir / "error.txt").write_text(f"market phase failed: {err}\n", encoding="utf-8")
        log(ERROR, "FLMarket: market phase failed: %s", err)
        raise
    market_time = time.perf_counter() - t_market
    outcome.save_json(run_dir / "market.json")
    _log_market(outcome, market_time)

    # 2. FedAvg over the winners
    result: Result | None = None
    evaluation: CentralEvaluation | None = None
    if len(outcome.winners) == 0:
        log(WARNING, "FLMarket: the auction selected no client; skipping training.")
    else:
        evaluation, result = _train_winners(grid, outcome, settings, data_config)
        torch.save(result.arrays.to_torch_state_dict(), run_dir / "final_model.pt")

    # 3. Results
    records = _history(evaluation, result)
    timings = {
        "market_phase_s": market_time,
        "fedavg_total_s": sum(r.round_time_s + r.eval_time_s for r in records),
        "total_s": time.perf_counter() - t_run,
    }
    _save_history(run_dir, records, timings, settings, data_config, outcome)
    _log_summary(run_dir, outcome, records, timings)


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


def _train_winners(
    grid: Grid,
    outcome: MarketOutcome,
    settings: ServerSettings,
    data_config: DataConfig,
) -> tuple[CentralEvaluation, Result]:
    """Run FedAvg on a Grid that only exposes the auction's winners."""
    winners_grid = WinnersGrid(grid, list(outcome.winners), seed=settings.seed)
    strategy = FedAvg(
        fraction_train=settings.fraction_train,
        fraction_evaluate=settings.fraction_evaluate,
        min_train_nodes=1,
        min_evaluate_nodes=1 if settings.fraction_evaluate > 0 else 0,
        # Never wait for a winner that has gone: train whichever winners are there.
        min_available_nodes=1,
    )
    torch.manual_seed(settings.seed)
    model = build_model(num_classes=num_classes(data_config))
    evaluation = CentralEvaluation(
        model=build_model(num_classes=num_classes(data_config)),
        test_data=load_test_set(data_config),
        device=resolve_device(settings.device),
    )
    train_config = ConfigRecord(
        {
            "local-epochs": settings.local_epochs,
            "batch-size": settings.batch_size,
            "learning-rate": settings.learning_rate,
            "momentum": settings.momentum,
        }
    )
    result = strategy.start(
        grid=winners_grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=settings.num_server_rounds,
        timeout=settings.round_timeout,
        train_config=train_config,
        evaluate_config=ConfigRecord(),
        evaluate_fn=evaluation,
    )
    return evaluation, result


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
    outcome: MarketOutcome,
) -> None:
    """Write ``history.json`` and ``history.csv``."""
    payload = {
        "settings": asdict(settings),
        "data": asdict(data_config),
        "winners": [int(node_id) for node_id in outcome.winners],
        "timings": {**timings, "market": dict(outcome.timings)},
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


def _log_summary(
    run_dir: Path,
    outcome: MarketOutcome,
    records: list[RoundRecord],
    timings: dict[str, float],
) -> None:
    """Log a readable end-of-run summary."""
    log(INFO, "")
    log(INFO, "FLMarket summary")
    log(
        INFO,
        "\t├── winners (%d of %d): %s",
        len(outcome.winners),
        len(outcome.participants),
        ", ".join(str(n) for n in outcome.winners) or "none",
    )
    log(
        INFO,
        "\t├── total payment %.2f / budget %.2f",
        float(outcome.total_payment),
        float(outcome.budget),
    )
    log(INFO, "\t├── market phase: %.2fs", timings["market_phase_s"])
    for stage, seconds in outcome.timings.items():
        log(INFO, "\t│\t├── %s: %.3fs", stage, float(seconds))
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
