"""Every selector through the app's own ServerApp and ClientApp (in-process Grid, no Ray).

* the pre-training baselines (RS, QBS, DICE, DDS) get the clients' raw label counts (and
  DDS embeddings) in one ``query.selector_stats`` round, select exactly what
  :func:`~simulations.baselines.selectors.select_clients` selects on those counts, and only the
  selected nodes ever receive a train or evaluate message;
* FLMarket never sends that query (the server learns the counts only through PASS);
* S-FedAvg trains at most ``num-selected`` nodes per round and needs a validation split;
* the product app knows neither ``selector`` nor ``val-per-class`` (the experiments' keys) and refuses them.
"""

import json
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict

from flmarket_flwr.app import client_app, server_app
from flmarket_flwr.app.task import EMBEDDING_DIM, DataConfig, all_label_counts, data_embedding
from simulations import apps
from simulations.baselines.selectors import select_clients
from simulations.inprocess_grid import InProcessGrid
from simulations.run_config import split_run_config

PROJECT = Path(__file__).resolve().parents[1]
NODE_IDS = [101, 202, 303, 404, 505, 606]


def app_config(**overrides: object) -> dict:
    """``[tool.flwr.app.config]`` with ``overrides`` (``_`` for ``-`` in keys; the experiments' keys too: a job's
    run config)."""
    with (PROJECT / "pyproject.toml").open("rb") as file:
        config = tomllib.load(file)["tool"]["flwr"]["app"]["config"]
    config.update({key.replace("_", "-"): value for key, value in overrides.items()})
    return config


def run_app(tmp_path: Path, selector: str, **overrides: object) -> tuple[InProcessGrid, Path]:
    """Run the experiments' ServerApp and ClientApp on a job's run config, on 6 in-process nodes (their context
    holds the app's keys)."""
    settings: dict[str, object] = {
        "selector": selector,
        "distribution": "d3",
        "num_server_rounds": 2,
        "local_epochs": 1,
        "fraction_evaluate": 1.0,
        "results_dir": str(tmp_path / "results"),
        "run_name": selector,
    }
    run_config = app_config(**{**settings, **overrides})
    app, _ = split_run_config(run_config)
    grid = InProcessGrid(apps.build_client_app(run_config), NODE_IDS, run_config=app, run_id=5)
    apps.build_server_app(run_config)(grid, Context(5, 0, {}, RecordDict(), app))
    return grid, tmp_path / "results" / selector


def receivers(grid: InProcessGrid, message_type: str) -> set[int]:
    """Nodes that were sent a message of this type."""
    return {m.metadata.dst_node_id for m in grid.sent if m.metadata.message_type == message_type}


@pytest.mark.parametrize("selector", ["rs", "qbs", "dice", "dds"])
def test_baseline_trains_only_its_selection(tmp_path: Path, selector: str) -> None:
    """Raw counts in, select_clients' choice out, and only the chosen nodes train."""
    grid, run_dir = run_app(tmp_path, selector, num_selected=2, seed=3)
    selection = json.loads((run_dir / "selection.json").read_text())
    selected = selection["selected"]
    assert len(selected) == 2 and len(set(selected)) == 2
    assert receivers(grid, "train") == set(selected)
    assert receivers(grid, "evaluate") == set(selected)
    assert receivers(grid, "query.selector_stats") == set(NODE_IDS)
    assert not any(m.metadata.message_type.startswith("query.market") for m in grid.sent)

    # The server saw each node's true label counts (node i holds partition i here) ...
    truth = all_label_counts(DataConfig(num_clients=len(NODE_IDS), distribution="d3", seed=3))
    seen = np.array([selection["label_counts"][str(node)] for node in NODE_IDS])
    np.testing.assert_array_equal(seen, truth)
    # ... and selected exactly what the selector picks on them, the candidates ordered by their
    # counts (not by node id, which Flower's simulation draws at random each run).
    order = sorted(range(len(NODE_IDS)), key=lambda i: (truth[i].tolist(), NODE_IDS[i]))
    extra = {}
    if selector == "dds":
        extra["embeddings"] = np.array([selection["embeddings"][str(NODE_IDS[i])] for i in order])
        assert extra["embeddings"].shape == (len(NODE_IDS), EMBEDDING_DIM)
    positions = select_clients(selector, truth[order], 2, seed=3, **extra)
    assert selected == [NODE_IDS[order[int(p)]] for p in positions]

    history = json.loads((run_dir / "history.json").read_text())
    assert history["selector"] == selector and history["selected"] == selected
    assert [row["round"] for row in history["rounds"]] == [0, 1, 2]
    assert not (run_dir / "market.json").exists()


def test_flmarket_keeps_counts_private(tmp_path: Path) -> None:
    """FLMarket selects through PASS and the auction: no raw-count query, no counts recorded."""
    grid, run_dir = run_app(tmp_path, "flmarket", num_selected=3, budget=1e6)  # a budget that buys the cohort
    assert not receivers(grid, "query.selector_stats")
    assert receivers(grid, "query.market_advertise") == set(NODE_IDS)
    selection = json.loads((run_dir / "selection.json").read_text())
    market = json.loads((run_dir / "market.json").read_text())
    assert selection["selected"] == market["winners"] and len(market["winners"]) == 3
    assert selection["label_counts"] is None
    assert receivers(grid, "train") == set(market["winners"])
    # Who delivered what: every winner trained both rounds and is owed its award (paid at selection).
    delivery = market["delivery"]
    assert sorted(map(int, delivery["winners"])) == sorted(market["winners"]) == sorted(selection["delivered"])
    assert all(r["asked"] == r["delivered"] == 2 and r["settled"] == r["award"] for r in delivery["winners"].values())
    # No reply on the wire carries a client's label counts in clear.
    for raw in grid.received_wire:
        assert b"label-counts" not in raw


def test_sfedavg_samples_num_selected_per_round(tmp_path: Path) -> None:
    """S-FedAvg: every node is a candidate, at most num-selected train in each round."""
    grid, run_dir = run_app(tmp_path, "sfedavg", num_selected=2, val_per_class=5, num_server_rounds=3)
    report = json.loads((run_dir / "sfedavg.json").read_text())
    assert [r["server_round"] for r in report["rounds"]] == [1, 2, 3]
    train_messages = [m for m in grid.sent if m.metadata.message_type == "train"]
    assert len(train_messages) == 3 * 2
    for record in report["rounds"]:
        assert len(record["sampled"]) == 2 and set(record["sampled"]) <= set(NODE_IDS)
    selection = json.loads((run_dir / "selection.json").read_text())
    assert selection["candidates"] == sorted(NODE_IDS)
    assert set(selection["sampled_per_round"]) == {"1", "2", "3"}
    assert not receivers(grid, "query.selector_stats")


def test_sfedavg_needs_a_validation_split(tmp_path: Path) -> None:
    """Without val-per-class, S-FedAvg refuses to start, with a clear reason."""
    with pytest.raises(ValueError, match="val-per-class"):
        run_app(tmp_path, "sfedavg", num_selected=2)


@pytest.mark.parametrize("selector", ["rs", "qbs", "dice", "dds", "sfedavg"])
def test_selectors_other_than_flmarket_need_num_selected(selector: str) -> None:
    """Only FLMarket has a budget-driven mode; the others need a cohort size (refused before any run)."""
    with pytest.raises(ValueError, match="num-selected: must be > 0"):
        apps.strategy_of(selector, 0)
    with pytest.raises(ValueError, match="num-selected: must be > 0"):
        apps.build_server_app({"selector": selector, "num-selected": 0})
    assert apps.strategy_of(selector, 1) is not None and apps.strategy_of("flmarket", 0) is None
    with pytest.raises(ValueError, match="run-config key selector='nope': must be"):
        apps.build_server_app({"selector": "nope"})
    with pytest.raises(ValueError, match="run-config key selector='nope': must be"):
        apps.strategy_of("nope", 1)


def test_run_config_override_mod() -> None:
    """build_client_app(run_config): handlers see the overlay; the context keeps its own."""
    seen = {}
    app = client_app.build_client_app({"seed": 7, "run-name": "x"})

    @app.query("peek")
    def peek(msg: Message, context: Context) -> Message:
        seen.update(context.run_config)
        return Message(RecordDict({"x": ConfigRecord({"ok": True})}), reply_to=msg)

    grid = InProcessGrid(app, [1, 2, 3], run_config={"seed": 1, "distribution": "d2"})
    message = Message(RecordDict({"x": ConfigRecord()}), dst_node_id=1, message_type="query.peek")
    replies = grid.send_and_receive([message])
    assert not replies[0].has_error()
    assert seen["seed"] == 7 and seen["run-name"] == "x" and seen["distribution"] == "d2"
    assert grid.context(1).run_config == {"seed": 1, "distribution": "d2"}


def test_build_server_app_overlays_the_run_config(tmp_path: Path) -> None:
    """build_server_app(run_config) runs main with the overlay (run_simulation passes none): the app's keys over
    the context's, the selector in place of the market."""
    run_config = app_config(
        selector="qbs",
        num_selected=2,
        num_server_rounds=1,
        results_dir=str(tmp_path / "results"),
        run_name="overlay",
    )
    grid = InProcessGrid(apps.build_client_app(), NODE_IDS, run_config=run_config, run_id=9)
    app = apps.build_server_app(run_config)
    app(grid, Context(9, 0, {}, RecordDict(), {}))
    history = json.loads((tmp_path / "results" / "overlay" / "history.json").read_text())
    assert history["selector"] == "qbs" and len(history["selected"]) == 2


def stats_query(node: int) -> Message:
    """A baseline's statistics query to ``node``."""
    request = ConfigRecord({"want-embedding": True, "embedding-dim": EMBEDDING_DIM, "projection-seed": 0})
    return Message(RecordDict({"selector-stats": request}), dst_node_id=node, message_type="query.selector_stats")


def test_product_client_app_never_reveals_label_counts() -> None:
    """A server asking the product ClientApp for raw statistics gets an error and no counts."""
    run_config = app_config(distribution="d3")
    grid = InProcessGrid(client_app.app, NODE_IDS, run_config=run_config)
    replies = grid.send_and_receive([stats_query(node) for node in NODE_IDS])
    assert len(replies) == len(NODE_IDS) and all(reply.has_error() for reply in replies)
    truth = all_label_counts(DataConfig(num_clients=len(NODE_IDS), distribution="d3"))
    for raw in grid.received_wire:
        assert b"label-counts" not in raw and b"embedding" not in raw
        for counts in truth:
            assert np.asarray(counts, dtype=np.int64).tobytes() not in raw


def test_experiments_client_app_answers_the_statistics_query() -> None:
    """The experiments' ClientApp, which an operator runs on purpose, answers with its counts."""
    run_config = app_config(distribution="d3")
    grid = InProcessGrid(apps.build_client_app(), NODE_IDS, run_config=run_config)
    replies = grid.send_and_receive([stats_query(NODE_IDS[0])])
    assert not replies[0].has_error()
    truth = all_label_counts(DataConfig(num_clients=len(NODE_IDS), distribution="d3"))
    assert list(replies[0].content["selector-stats"]["label-counts"]) == truth[0].tolist()


@pytest.mark.parametrize(("key", "value"), [("selector", "qbs"), ("selector", "flmarket"), ("val-per-class", 10)])
def test_product_server_app_refuses_the_experiments_keys(tmp_path: Path, key: str, value: object) -> None:
    """``selector`` or ``val-per-class`` given to the product app (even ``selector='flmarket'``) fails at once, as
    an unknown key naming it, before any message."""
    run_config = {**app_config(num_selected=2, results_dir=str(tmp_path)), key: value}
    grid = InProcessGrid(client_app.app, NODE_IDS, run_config=run_config)
    started = time.monotonic()
    with pytest.raises(ValueError, match=rf"unknown run-config key\(s\) \['{key}'\]"):
        server_app.main(grid, Context(1, 0, {}, RecordDict(), run_config))
    assert not grid.sent and time.monotonic() - started < 5


def test_the_experiments_clients_hold_out_the_validation_split() -> None:
    """With val-per-class, the experiments' ClientApp cuts the training pool without the server's validation split
    (as the engine and the ServerApp's S-FedAvg do), also once shipped as Ray ships it to its actors; the product
    ClientApp, which has no such key, the whole pool."""
    from ray import cloudpickle  # pylint: disable=import-outside-toplevel

    job = app_config(distribution="d3", val_per_class=5)
    app, _ = split_run_config(job)
    truth = all_label_counts(DataConfig(num_clients=len(NODE_IDS), distribution="d3", val_per_class=5))
    whole = all_label_counts(DataConfig(num_clients=len(NODE_IDS), distribution="d3"))
    assert truth.tolist() != whole.tolist()  # a smaller pool, cut again
    shipped = cloudpickle.loads(cloudpickle.dumps(apps.build_client_app(job)))
    grid = InProcessGrid(shipped, NODE_IDS, run_config=app)
    replies = grid.send_and_receive([stats_query(node) for node in NODE_IDS])
    counts = {reply.metadata.src_node_id: list(reply.content["selector-stats"]["label-counts"]) for reply in replies}
    assert counts == {node: truth[position].tolist() for position, node in enumerate(NODE_IDS)}
    product = InProcessGrid(client_app.app, NODE_IDS, run_config=job)  # the key ignored: the product has none
    assert client_app.label_counts(product.context(NODE_IDS[0])).tolist() == whole[0].tolist()


def test_data_embedding_is_a_fixed_projection() -> None:
    """The DDS embedding: deterministic, EMBEDDING_DIM numbers, the same projection for all."""
    config = DataConfig(num_clients=4, distribution="d2")
    first = data_embedding(0, config, seed=1)
    assert first.shape == (EMBEDDING_DIM,) and np.all(np.isfinite(first))
    np.testing.assert_array_equal(first, data_embedding(0, config, seed=1))
    assert not np.allclose(first, data_embedding(1, config, seed=1))
    assert not np.allclose(first, data_embedding(0, config, seed=2))


def test_a_flower_jobs_record_keeps_its_shape_with_the_experiments_keys(tmp_path: Path) -> None:
    """``simulations.run.summarize`` on a Flower job of S-FedAvg with a validation split: the record names the
    selector and carries the job's whole run config (the experiments' keys too, as the archived records do), and
    its label counts are the pool the clients trained on, the split held out."""
    from simulations.run import summarize  # pylint: disable=import-outside-toplevel

    run_dir = tmp_path / "results" / "sfedavg"
    overrides: dict[str, object] = {"num_selected": 2, "val_per_class": 5, "num_server_rounds": 1}
    overrides["train_log_dir"] = str(run_dir / "train-log")
    grid, _ = run_app(tmp_path, "sfedavg", **overrides)
    job = app_config(**{"selector": "sfedavg", "distribution": "d3", **overrides})
    record = summarize(run_dir, job, wall_s=1.0, num_clients=len(NODE_IDS))
    assert record["selector"] == "sfedavg" and record["num_selected"] == 2
    assert record["run_config"]["selector"] == "sfedavg" and record["run_config"]["val-per-class"] == 5
    pool = all_label_counts(DataConfig(num_clients=len(NODE_IDS), distribution="d3", val_per_class=5))
    assert record["all_label_counts"] == pool.tolist()
    trained = {m.metadata.dst_node_id for m in grid.sent if m.metadata.message_type == "train"}
    assert len(trained) == 2 and sorted(record["trained_partitions_per_round"]["1"]) == sorted(
        NODE_IDS.index(node) for node in trained
    )
