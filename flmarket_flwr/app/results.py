"""What the app's ServerApp records: server-side evaluation per round, the results folder, the end-of-run summary.

Files written to ``<results-dir>/<run-name>/``: ``selection.json``, ``market.json`` (FLMarket),
``history.json``, ``history.csv``, ``final_model.pt``, and any file an experiments strategy adds.
"""

from __future__ import annotations

import csv
import json
import math
import time
from dataclasses import asdict, dataclass
from datetime import datetime
from logging import INFO
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, MetricRecord
from flwr.serverapp.strategy import Result, Strategy
from flwr.supercore import log

from flmarket_flwr.app.models import set_arrays
from flmarket_flwr.app.task import evaluate
from flmarket_flwr.market import FLMarket

__all__ = ["CentralEvaluation", "RoundRecord", "make_run_dir", "save_results", "selection_of"]


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
    """Server-side evaluation of the global model on the held-out test set, with per-round wall times.

    The ``evaluate_fn`` of ``Strategy.start``: called before the first round and after every round. The
    time between two calls is the wall time of the federated part of a round.

    Parameters
    ----------
    model : torch.nn.Module
        A model of the trained architecture (its weights are overwritten).
    test_data : tuple[torch.Tensor, torch.Tensor]
        The held-out test set.
    device : torch.device
        Device to evaluate on.
    """

    def __init__(self, model: torch.nn.Module, test_data: tuple[torch.Tensor, torch.Tensor], device: torch.device):
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


def make_run_dir(results_dir: str, run_name: str, run_id: int) -> Path:
    """Create and return ``<results-dir>/<run-name>``, absolute.

    A relative ``results-dir`` is resolved against the home directory of the user running the
    ServerApp (``~``): the ServerApp's working directory is wherever the SuperLink was started.
    """
    root = Path(results_dir).expanduser()
    if not root.is_absolute():
        log(INFO, "results-dir %r is relative: resolved against the home directory %s", results_dir, Path.home())
        root = Path.home() / root
    name = run_name or f"{datetime.now().strftime('%Y%m%d-%H%M%S')}_run-{run_id}"
    run_dir = (root / name).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def selection_of(strategy: Strategy) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(selection.json content, extra files)`` of the strategy that ran.

    :class:`~flmarket_flwr.market.FLMarket`: the run's summary (``run``, see
    :meth:`~flmarket_flwr.market.FLMarket.run_report`), the outcome of the last market that bought a cohort at the top
    level (``market`` says which; ``summarises`` says so in words), every market of the run with its own status and
    reason (``markets``, see :meth:`~flmarket_flwr.market.FLMarket.markets_report`), what each node is owed over the
    run (``settled``), the run's budget and its total (``market.json``); ``selected`` is the cohort in force at the
    end. Any other strategy (the experiments') says itself, through ``selection_record()`` and ``result_files()``.
    """
    if not isinstance(strategy, FLMarket):
        return strategy.selection_record(), strategy.result_files()  # type: ignore[attr-defined]
    outcome = strategy.market_outcome
    assert outcome is not None
    selection = {
        "selector": "flmarket",
        "selected": strategy.cohort,
        "candidates": list(outcome.participants),
        "label_counts": None,  # the server never sees them: PASS gives their sum only
        "excluded": {str(node): reason for node, reason in outcome.excluded.items()},
        "time_s": float(outcome.timings.get("total", 0.0)),
        "timings": dict(outcome.timings),
    }
    delivery = strategy.delivery_report()
    selection["delivered"] = [int(node) for node, record in delivery["winners"].items() if record["delivered"] > 0]
    settled = {str(node): owed for node, owed in strategy.settled_across_markets().items()}
    position = next(i for i, entry in enumerate(strategy.markets, 1) if entry.outcome is outcome)
    record = {
        "run": strategy.run_report(),
        "market": position,
        "summarises": f"market {position} of {len(strategy.markets)}: the last market that bought a cohort (every "
        "market, with its own status and reason, is under 'markets'; the run's totals under 'run')",
        **outcome.to_dict(),
        "delivery": delivery,
        "markets": strategy.markets_report(),
        "settled": settled,
        "run_budget": strategy.market_config.budget,
        "run_total_settled": math.fsum(strategy.settled_across_markets().values()),
        "dropped": {str(node): reason for node, reason in strategy.dropped.items()},
    }
    return selection, {"market.json": record}


# pylint: disable=too-many-arguments
def save_results(
    run_dir: Path,
    *,
    strategy: Strategy,
    result: Result,
    evaluation: CentralEvaluation,
    config: dict[str, Any],
    total_s: float,
) -> list[RoundRecord]:
    """Write the run's files and log its summary; return the per-round records.

    Parameters
    ----------
    run_dir : Path
        The run's folder.
    strategy : Strategy
        The strategy that ran (see :func:`selection_of`).
    result : Result
        What the strategy returned (empty when nobody trained).
    evaluation : CentralEvaluation
        The server-side evaluation, with its records.
    config : dict
        Settings to record in ``history.json``.
    total_s : float
        Wall time of the whole ServerApp.
    """
    selection, files = selection_of(strategy)
    records = list(evaluation.records)
    for record in records:
        metrics = result.train_metrics_clientapp.get(record.round)
        if metrics is not None and "train_loss" in metrics:
            record.train_loss = float(metrics["train_loss"])  # type: ignore[arg-type]
    if len(result.arrays) > 0:
        torch.save(result.arrays.to_torch_state_dict(), run_dir / "final_model.pt")
    for name, content in {"selection.json": selection, **files}.items():
        (run_dir / name).write_text(json.dumps(content, indent=2, default=str) + "\n", encoding="utf-8")
    timings = {
        "selection_s": float(selection.get("time_s", 0.0)),
        "fedavg_total_s": sum(r.round_time_s + r.eval_time_s for r in records),
        "total_s": total_s,
    }
    history = {
        "selector": selection["selector"],
        "settings": config,
        "selected": list(selection["selected"]),
        "winners": list(selection.get("trained", selection["selected"])),
        "timings": {**timings, "market": dict(selection.get("timings", {}))},
        "final_accuracy": records[-1].accuracy if records else math.nan,
        "rounds": [asdict(record) for record in records],
    }
    (run_dir / "history.json").write_text(json.dumps(history, indent=2, default=str), encoding="utf-8")
    with (run_dir / "history.csv").open("w", newline="", encoding="utf-8") as file:
        writer = csv.DictWriter(file, fieldnames=list(RoundRecord.__annotations__))
        writer.writeheader()
        for record in records:
            writer.writerow(asdict(record))
    _log_summary(selection, records, timings)
    return records


def _log_summary(selection: dict[str, Any], records: list[RoundRecord], timings: dict[str, float]) -> None:
    """Log a readable end-of-run summary."""
    log(INFO, "")
    log(INFO, "FLMarket summary (selector %r)", selection["selector"])
    selected = selection["selected"]
    log(
        INFO,
        "\t├── selected %d of %d: %s",
        len(selected),
        len(selection["candidates"]),
        ", ".join(str(node) for node in selected) or "none",
    )
    log(INFO, "\t├── selection: %.2fs", timings["selection_s"])
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
    log(INFO, "\t└── training total: %.2fs", timings["fedavg_total_s"])
