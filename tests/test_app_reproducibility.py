"""Same run config, same run: winners, payments and per-round accuracy, run twice in one process.

Both runs go through ``flwr.simulation.run_simulation`` (``simulations.run.simulate_in_process``: Ray, two
ClientApp actors, so replies arrive in varying order, and node ids that Flower draws at random per run). The
second run finds the process warm (imports, data caches, torch state), the first cold.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

from flmarket_flwr.app.client_app import build_client_app  # noqa: E402
from flmarket_flwr.app.server_app import build_server_app  # noqa: E402
from simulations.run import simulate_in_process  # noqa: E402

PROJECT = Path(__file__).resolve().parents[1]


def run_once(results: Path, name: str) -> tuple[dict, dict]:
    """One simulated run of the app; its market.json and history.json."""
    with (PROJECT / "pyproject.toml").open("rb") as file:
        run_config = tomllib.load(file)["tool"]["flwr"]["app"]["config"]
    run_config.update(
        {
            "distribution": "d2",
            "num-selected": 5,
            "num-server-rounds": 3,
            "local-epochs": 1,
            "results-dir": str(results),
            "run-name": name,
        }
    )
    simulate_in_process(
        build_server_app(run_config),
        build_client_app(run_config),
        num_supernodes=6,
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": 2, "log_to_driver": False, "logging_level": "WARNING"},
        },
        pull_interval=0.001,  # polling for replies every ms: they are collected in arrival order
    )
    folder = results / name
    return json.loads((folder / "market.json").read_text()), json.loads((folder / "history.json").read_text())


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="Ray simulation (Linux)")
def test_same_config_same_winners_payments_and_accuracy(tmp_path: Path) -> None:
    (market_a, history_a), (market_b, history_b) = run_once(tmp_path, "cold"), run_once(tmp_path, "warm")

    def by_score(market: dict) -> list[tuple[float, float, float, bool]]:
        """Node ids differ between runs: compare each bidder's (score, bid, payment, won)."""
        winners = {str(node) for node in market["winners"]}
        return sorted(
            (market["scores"][n], market["bids"][n], market["payments"][n], n in winners) for n in market["scores"]
        )

    assert market_a["winners"] and by_score(market_a) == by_score(market_b)
    assert market_a["total_payment"] == market_b["total_payment"]
    assert market_a["global_counts"] == market_b["global_counts"]
    rounds = [
        [(row["round"], row["accuracy"], row["loss"]) for row in history["rounds"]]
        for history in (history_a, history_b)
    ]
    assert len(rounds[0]) == 4 and rounds[0] == rounds[1]
