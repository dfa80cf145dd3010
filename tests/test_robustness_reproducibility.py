"""Reproducibility: the same seed gives the same winners, payments and final accuracy, twice in a row.

The whole app (``server_app.main`` with the real ``client_app.app``: PASS with fresh random keys
and sessions, scores, bids, auction, then FedAvg with torch training) runs twice on an in-process
grid with the same run config. PASS's keys and session ids are random on every run, yet they cancel
exactly, so everything downstream must be identical: the global counts, the winners, the payments,
every round's accuracy and loss, and the final model's weights, bit for bit. A third run with
another seed must differ in its data split (the check is not vacuous).
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import torch
from flwr.app import Context, RecordDict

from flmarket_flwr.app import client_app, server_app
from simulations.inprocess_grid import InProcessGrid

PROJECT = Path(__file__).resolve().parents[1]
NODE_IDS = [11, 22, 33, 44, 55, 66]


def run_config(tmp_path: Path, name: str, **overrides: object) -> dict:
    with (PROJECT / "pyproject.toml").open("rb") as file:
        config = tomllib.load(file)["tool"]["flwr"]["app"]["config"]
    config.update(
        {
            "distribution": "d4",
            "budget": 2500.0,
            "num-server-rounds": 2,
            "local-epochs": 1,
            "fraction-evaluate": 0.0,
            "results-dir": str(tmp_path),
            "run-name": name,
            "torch-threads": 1,
        }
    )
    config.update({key.replace("_", "-"): value for key, value in overrides.items()})
    return config


def run_app(tmp_path: Path, name: str, **overrides: object) -> dict:
    config = run_config(tmp_path, name, **overrides)
    grid = InProcessGrid(client_app.app, NODE_IDS, run_config=config, run_id=5)
    server_app.main(grid, Context(5, 0, {}, RecordDict(), config))
    run_dir = tmp_path / name
    history = json.loads((run_dir / "history.json").read_text())
    return {
        "market": json.loads((run_dir / "market.json").read_text()),
        "rounds": [(row["round"], row["accuracy"], row["loss"]) for row in history["rounds"]],
        "model": torch.load(run_dir / "final_model.pt", weights_only=True),
        "sessions": {
            m.content["flmarket"]["session"] for m in grid.sent if m.metadata.message_type.endswith("market_keys")
        },
    }


def test_same_seed_same_market_and_same_final_accuracy(tmp_path: Path) -> None:
    first = run_app(tmp_path, "first", seed=3)
    second = run_app(tmp_path, "second", seed=3)

    assert first["sessions"].isdisjoint(second["sessions"]), "PASS must use fresh sessions on every run"
    for key in ("winners", "participants", "global_counts", "scores", "bids", "payments", "total_payment"):
        assert first["market"][key] == second["market"][key], key
    assert first["market"]["winners"], "the instance must have winners"
    assert first["rounds"] == second["rounds"]
    assert len(first["rounds"]) == 3  # round 0 (initial model) and two FedAvg rounds
    assert first["model"].keys() == second["model"].keys()
    for name, tensor in first["model"].items():
        assert torch.equal(tensor, second["model"][name]), name

    other = run_app(tmp_path, "other-seed", seed=4)
    assert other["market"]["global_counts"] != first["market"]["global_counts"] or (
        other["market"]["scores"] != first["market"]["scores"]
    ), "another seed must change the data split"


@pytest.mark.parametrize("shuffle_seed", [None, 1])
def test_reply_order_does_not_change_the_app_outcome(tmp_path: Path, shuffle_seed: int | None) -> None:
    """Replies arrive in any order in Flower: the market (matched by message id) does not care."""
    config = run_config(tmp_path, f"order-{shuffle_seed}", seed=3, num_server_rounds=1)
    grid = InProcessGrid(client_app.app, NODE_IDS, run_config=config, run_id=5, shuffle_seed=shuffle_seed)
    server_app.main(grid, Context(5, 0, {}, RecordDict(), config))
    reference = run_app(tmp_path, f"order-reference-{shuffle_seed}", seed=3, num_server_rounds=1)
    market = json.loads((tmp_path / f"order-{shuffle_seed}" / "market.json").read_text())
    for key in ("winners", "global_counts", "payments"):
        assert market[key] == reference["market"][key], key
