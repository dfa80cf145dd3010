"""The in-process engine against the Flower path: same data, same selection, same one-round model.

The Flower side runs the app's real ``ClientApp`` (``build_client_app``) on an ``InProcessGrid`` (no Ray):
FLMarket's selection is the real ``MarketPhase`` (PASS, client-side scores and bids, auction) and one
FedAvg round is Flower's own ``FedAvg.start`` on the ``WinnersGrid`` of the selected nodes, the way the
ServerApp trains. Tolerance of the one-round comparison: weights within 1e-5 (float32 summation order of
the replies) and test accuracy within 0.01.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from flmarket_flwr.app.task import (
    DataConfig,
    all_label_counts,
    data_embedding,
    load_partition,
    train,
)
from flmarket_flwr.market import MarketConfig, MarketPhase, WinnersGrid
from simulations.apps import build_client_app
from simulations.baselines.selectors import select_clients
from simulations.config import app_config_defaults
from simulations.engine import (
    EngineConfig,
    _fedavg_rounds,
    _protocol,
    _Training,
    bids_for,
    fedavg,
    load_federation,
    run_engine,
    select,
)
from simulations.inprocess_grid import InProcessGrid
from simulations.run_config import split_run_config

NODE_BASE = 7_000
WEIGHT_ATOL = 1e-5
ACCURACY_TOL = 0.01

SETTINGS = [
    EngineConfig(dataset="digits", test_per_class=30, distribution="d4", seed=0, num_selected=5),
    EngineConfig(dataset="digits", test_per_class=30, distribution="d6", seed=2, num_selected=10),
]


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _flower_config(cfg: EngineConfig) -> dict:
    """The job's run config of ``cfg`` (the app's keys and the experiments' own)."""
    run_config = app_config_defaults()
    run_config.update(
        {
            "dataset": cfg.dataset,
            "num-clients": cfg.num_clients,
            "distribution": cfg.distribution,
            "seed": cfg.seed,
            "test-per-class": cfg.test_per_class,
            "val-per-class": cfg.val_per_class,
            "selector": cfg.selector,
            "num-selected": cfg.num_selected,
            "device": "cpu",
            "torch-threads": 1,
            "cost-low": cfg.cost_low,
            "cost-high": cfg.cost_high,
            "bid-markup": cfg.bid_markup,
            "local-epochs": cfg.local_epochs,
            "batch-size": cfg.batch_size,
            "learning-rate": cfg.learning_rate,
            "momentum": cfg.momentum,
        }
    )
    return run_config


def _data_config(cfg: EngineConfig) -> DataConfig:
    """The Flower app's data config of ``cfg``'s job (its validation split the experiments' key)."""
    app, own = split_run_config(_flower_config(cfg))
    return DataConfig.from_run_config(app, val_per_class=own.val_per_class)


def _grid(cfg: EngineConfig) -> InProcessGrid:
    """The experiments' ClientApp on ``cfg``'s job; the nodes' context holds the app's keys."""
    nodes = [NODE_BASE + e for e in range(cfg.num_clients)]  # partition-id = position
    app, _ = split_run_config(_flower_config(cfg))
    return InProcessGrid(build_client_app(_flower_config(cfg)), nodes, run_config=app)


@pytest.mark.parametrize("cfg", SETTINGS)
def test_engine_data_is_the_apps_data(cfg: EngineConfig) -> None:
    federation = load_federation(cfg)
    data_config = _data_config(cfg)
    assert np.array_equal(federation.label_counts, all_label_counts(data_config))
    for partition_id in (0, cfg.num_clients - 1):
        images, labels = load_partition(partition_id, data_config)
        assert torch.equal(federation.client_data[partition_id][0], images)
        assert torch.equal(federation.client_data[partition_id][1], labels)


# Selection parity: the engine's FLMarket is the product's rule, so it must pick what the real market phase picks
# (PASS, the app's ClientApps' own scores and bids) in every mode the bugs of issue 20 hid in: a cohort cap at the
# least budget that buys it, the budget alone, a budget that binds below the cap, and clients that score zero.
PARITY = {
    "cap, cohort budget": EngineConfig(dataset="digits", test_per_class=30, distribution="d4", num_selected=5),
    "cap, d6": EngineConfig(dataset="digits", test_per_class=30, distribution="d6", seed=2, num_selected=10),
    "budget alone": EngineConfig(dataset="digits", test_per_class=30, seed=1, num_selected=0, budget=40.0),
    "binding budget under a cap": EngineConfig(
        dataset="digits", test_per_class=30, distribution="d2", num_selected=10, budget=25.0, cohort_budget=False
    ),
    "every score zero": EngineConfig(
        dataset="digits", test_per_class=30, distribution="d6", num_clients=60, num_selected=5
    ),
    "digits_xl": EngineConfig(dataset="digits_xl", test_per_class=20, distribution="d5", num_selected=5),
}


def _market_phase_winners(cfg: EngineConfig, budget: float) -> list[int]:
    market = MarketConfig(
        budget=budget, num_classes=10, num_winners=cfg.num_selected or None, expected_nodes=cfg.num_clients
    )
    return [node - NODE_BASE for node in MarketPhase(market).run(_grid(cfg)).winners]


@pytest.mark.parametrize("cfg", list(PARITY.values()), ids=list(PARITY))
def test_flmarket_selects_what_the_market_phase_selects(cfg: EngineConfig) -> None:
    engine_cfg = replace(cfg, bid_policy="random")  # the app's bids: per-client simulated costs
    federation = load_federation(engine_cfg)
    selected, market = select(engine_cfg, federation)
    assert _market_phase_winners(cfg, market["budget"]) == selected
    assert market["bids"] == pytest.approx(bids_for(engine_cfg, federation.label_counts).tolist())
    assert market["total_payment"] <= market["budget"] and market["within_budget"]
    scores = np.asarray(market["scores"])
    assert all(scores[e] > 0 for e in selected)
    if cfg.num_selected:
        assert len(selected) <= cfg.num_selected


def test_the_parity_settings_cover_what_they_claim() -> None:
    """Each parity setting is in the regime its name says, so the parity test cannot pass vacuously."""
    outcomes = {}
    for name, cfg in PARITY.items():
        engine_cfg = replace(cfg, bid_policy="random")
        outcomes[name] = select(engine_cfg, load_federation(engine_cfg))
    assert len(outcomes["cap, cohort budget"][0]) == 5
    assert len(outcomes["cap, d6"][0]) == 10
    assert 0 < len(outcomes["budget alone"][0]) < 20
    assert 0 < len(outcomes["binding budget under a cap"][0]) < 10
    assert outcomes["every score zero"][0] == []
    assert not any(outcomes["every score zero"][1]["scores"])
    assert len(outcomes["digits_xl"][0]) == 5


@pytest.mark.parametrize("selector", ["rs", "qbs", "dice", "dds"])
def test_baselines_select_what_the_server_selects(selector: str) -> None:
    cfg = replace(SETTINGS[1], selector=selector)
    data_config = _data_config(cfg)
    extra = {}
    if selector == "dds":
        extra["embeddings"] = np.stack([data_embedding(e, data_config, seed=cfg.seed) for e in range(cfg.num_clients)])
    expected = select_clients(selector, all_label_counts(data_config), cfg.num_selected, seed=cfg.seed, **extra)
    assert select(cfg, load_federation(cfg))[0] == [int(p) for p in expected]


def test_one_round_matches_flowers_fedavg_through_the_train_handler() -> None:
    from flwr.app import ArrayRecord, ConfigRecord
    from flwr.serverapp.strategy import FedAvg

    from flmarket_flwr.app.models import build_model
    from flmarket_flwr.app.task import evaluate

    cfg = replace(
        SETTINGS[0], selector="qbs", local_steps=0, local_epochs=2, rounds=1, batch_size=16, learning_rate=0.1
    )
    federation = load_federation(cfg)
    selected, _ = select(cfg, federation)
    engine = _fedavg_rounds(cfg, federation, selected)

    torch.manual_seed(cfg.seed)
    model = build_model("digits_cnn", num_classes=10)
    strategy = FedAvg(
        fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=1, min_evaluate_nodes=0, min_available_nodes=1
    )
    result = strategy.start(
        grid=WinnersGrid(_grid(cfg), [NODE_BASE + p for p in selected], seed=cfg.seed),
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=1,
        train_config=ConfigRecord(
            {
                "local-epochs": cfg.local_epochs,
                "batch-size": cfg.batch_size,
                "learning-rate": cfg.learning_rate,
                "momentum": cfg.momentum,
            }
        ),
    )
    flower_state = result.arrays.to_torch_state_dict()
    assert engine.final_state is not None
    for key, value in flower_state.items():
        np.testing.assert_allclose(engine.final_state[key], value.numpy(), atol=WEIGHT_ATOL, rtol=0)
    model.load_state_dict(flower_state)
    _, flower_accuracy = evaluate(model, federation.test_data, torch.device("cpu"))
    assert abs(engine.rounds[-1]["accuracy"] - flower_accuracy) <= ACCURACY_TOL


def test_fedavg_weights_by_samples() -> None:
    states = [{"w": np.array([1.0], np.float32)}, {"w": np.array([4.0], np.float32)}]
    assert fedavg(states, [3.0, 1.0])["w"] == pytest.approx([1.75])


def test_train_with_steps_runs_exactly_the_steps_and_clips() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    x, y = torch.randn(10, 4) * 100, torch.randint(0, 3, (10,))
    before = model.weight.detach().clone()
    loss = train(
        model,
        (x, y),
        0,
        lr=1.0,
        device=torch.device("cpu"),
        batch_size=4,
        momentum=0.0,
        seed=1,
        steps=7,
        clip_norm=1e-3,
    )
    assert math.isfinite(loss)
    assert (model.weight.detach() - before).norm() <= 7 * 1e-3 + 1e-6


def test_protocol_flags_divergence_and_plateau() -> None:
    cfg = EngineConfig(final_window=2, plateau_tolerance=0.01, collapse_drop=0.3)
    flat = _Training(rounds=[{"accuracy": a} for a in (0.1, 0.5, 0.8, 0.8, 0.8, 0.8)])
    summary = _protocol(cfg, flat)
    assert summary["final_accuracy"] == pytest.approx(0.8) and summary["plateau_reached"]
    diverged = _protocol(cfg, _Training(rounds=[{"accuracy": a} for a in (0.1, 0.5, math.nan)], diverged_at=2))
    assert diverged["diverged"] and math.isnan(diverged["final_accuracy"])
    collapsed = _protocol(cfg, _Training(rounds=[{"accuracy": a} for a in (0.1, 0.9, 0.9, 0.1, 0.1)]))
    assert collapsed["collapsed"] and not collapsed["diverged"]


def test_run_engine_result_has_run_py_shape() -> None:
    cfg = replace(SETTINGS[0], rounds=3, local_steps=2, final_window=2)
    result = run_engine(cfg)
    expected = {
        "selector",
        "dataset",
        "model",
        "distribution",
        "num_clients",
        "num_selected",
        "seed",
        "final_accuracy",
        "best_accuracy",
        "final_loss",
        "rounds",
        "selected_nodes",
        "selected_partitions",
        "selected_label_counts",
        "selected_class_totals",
        "pool_class_totals",
        "all_label_counts",
        "trained_partitions_per_round",
        "timings",
        "run_config",
        "market",
    }
    assert expected <= set(result) and len(result["rounds"]) == 4
    assert set(result["timings"]) == {"job_wall_s", "selection_s", "training_s", "server_app_s", "overhead_s"}
    again = run_engine(cfg)
    assert [r["accuracy"] for r in again["rounds"]] == [r["accuracy"] for r in result["rounds"]]


def test_run_job_inprocess_takes_a_hydra_job_config() -> None:
    from hydra import compose, initialize_config_dir

    from simulations.config import CONF_DIR
    from simulations.engine import run_job_inprocess

    overrides = [
        "engine=inprocess",
        "selector=dice",
        "num_selected=4",
        "num_server_rounds=2",
        "sim.engine.local_steps=2",
        "sim.engine.final_window=1",
        "sim.engine.bid_policy=constant",
        "sim.engine.min_rounds=0",
    ]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    result = run_job_inprocess(cfg)
    assert result["selector"] == "dice" and len(result["selected_partitions"]) == 4
    assert result["run_config"]["num-selected"] == 4 and result["engine"]["config"]["bid_policy"] == "constant"
    assert result["final_accuracy"] == result["rounds"][-1]["accuracy"]


def test_engine_config_reads_the_apps_schema() -> None:
    """The engine's run-config keys take the experiments' schema's defaults (but the sweep protocol's) and its
    checks: the app's keys' and the experiments' own."""
    from dataclasses import fields

    from flmarket_flwr.app.run_config import field_name
    from simulations.engine import ENGINE_APP_KEYS, ROUNDS_KEY, SWEEP_DEFAULTS
    from simulations.run_config import EXPERIMENT_SCHEMA

    schema = EXPERIMENT_SCHEMA.defaults

    defaults = EngineConfig()
    for key in ENGINE_APP_KEYS:
        assert getattr(defaults, field_name(key)) == SWEEP_DEFAULTS.get(key, schema[key]), key
    assert defaults.rounds == SWEEP_DEFAULTS[ROUNDS_KEY]
    assert {field_name(key) for key in ENGINE_APP_KEYS} <= {field.name for field in fields(EngineConfig)}
    bad_values = {
        "budget": -1.0,
        "alpha": 0.0,
        "neighbours": "1",
        "distribution": "d9",
        "momentum": 1.5,
        "rounds": 0,
        "selector": "nope",
        "val_per_class": -1,
    }
    for name, value in bad_values.items():
        key = ROUNDS_KEY if name == "rounds" else name.replace("_", "-")
        with pytest.raises(ValueError, match=f"run-config key {key}="):
            EngineConfig(**{name: value})
    with pytest.raises(ValueError, match="cost-low/cost-high"):
        EngineConfig(cost_low=2.0, cost_high=1.0)


def test_hydra_job_config_maps_every_app_key_and_refuses_what_the_engine_cannot_do() -> None:
    """Through the one Hydra-to-app mapping: the PASS graph reaches the engine; an unsupported key is an error."""
    from hydra import compose, initialize_config_dir

    from simulations.config import CONF_DIR
    from simulations.engine import config_from_hydra

    def job(*overrides: str) -> EngineConfig:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return config_from_hydra(compose(config_name="config", overrides=["engine=inprocess", *overrides]))

    cfg = job("neighbours=4", "audit_winners=false", "budget=250", "federation=c100", "seed=3")
    assert (cfg.neighbours, cfg.audit_winners, cfg.budget, cfg.num_clients, cfg.seed) == ("4", False, 250.0, 100, 3)
    assert cfg.rounds == 100 and cfg.local_steps == 20 and cfg.device == "cpu"
    assert job("market_timeout=5", "run_name=x").budget == 600.0  # no meaning in process: accepted
    for override in ("fraction_train=0.5", "settle_on_delivery=true", "min_market_clients=5", "pass_dp_epsilon=1.0"):
        with pytest.raises(ValueError, match="does not implement app key"):
            job(override)


# --- S-FedAvg and the market protocol in the engine ----------------------------------------------------------------
SFEDAVG = replace(
    SETTINGS[0],
    selector="sfedavg",
    num_selected=4,
    val_per_class=10,
    local_steps=0,
    local_epochs=1,
    rounds=3,
    batch_size=16,
    learning_rate=0.1,
    min_rounds=0,
    final_window=1,
)


def test_sfedavg_samples_and_values_as_flowers_sfedavg_strategy() -> None:
    """Engine S-FedAvg against the Flower strategy on the app's ClientApp: same samples, same Shapley values."""
    from flwr.app import ArrayRecord, ConfigRecord

    from flmarket_flwr.app.models import build_model
    from flmarket_flwr.app.task import load_validation_set
    from simulations.apps import make_validation_fn
    from simulations.baselines import SFedAvg

    cfg = SFEDAVG
    engine = run_engine(cfg)["sfedavg"]["rounds"]

    data_config = _data_config(cfg)
    validation = load_validation_set(data_config)
    federation = load_federation(cfg)
    assert federation.validation_data is not None
    assert torch.equal(federation.validation_data[0], validation[0])
    assert torch.equal(federation.validation_data[1], validation[1])
    torch.manual_seed(cfg.seed)
    model = build_model("digits_cnn", num_classes=10)
    strategy = SFedAvg(
        make_validation_fn(build_model("digits_cnn", num_classes=10), validation),
        num_train_nodes=cfg.num_selected,
        seed=cfg.seed,
        min_available_nodes=cfg.num_clients,
        fraction_evaluate=0.0,
    )
    strategy.start(
        grid=_grid(cfg),
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=cfg.rounds,
        train_config=ConfigRecord(
            {
                "local-epochs": cfg.local_epochs,
                "batch-size": cfg.batch_size,
                "learning-rate": cfg.learning_rate,
                "momentum": cfg.momentum,
            }
        ),
    )
    assert len(strategy.rounds) == len(engine) == cfg.rounds
    for flower_round, engine_round in zip(strategy.rounds, engine, strict=True):
        assert [node - NODE_BASE for node in flower_round.sampled] == engine_round["sampled"]
        flower_shapley = {str(node - NODE_BASE): value for node, value in flower_round.shapley.items()}
        assert flower_shapley.keys() == engine_round["shapley"].keys()
        for key, value in flower_shapley.items():
            assert abs(engine_round["shapley"][key] - value) <= 0.02  # accuracies on 100 images, float32 sums
        assert engine_round["coalition_evaluations"] == flower_round.coalition_evaluations


def test_sfedavg_result_records_the_per_round_cohorts_and_valuation() -> None:
    result = run_engine(SFEDAVG)
    rounds = result["sfedavg"]["rounds"]
    assert result["selected_partitions"] == list(range(SFEDAVG.num_clients))  # every client is a candidate
    assert {str(r["server_round"]): sorted(r["sampled"]) for r in rounds} == result["trained_partitions_per_round"]
    assert all(len(r["sampled"]) == SFEDAVG.num_selected for r in rounds)
    relevance = result["sfedavg"]["relevance"]
    valued = {int(e) for r in rounds for e in r["shapley"]}
    untouched = set(range(SFEDAVG.num_clients)) - valued
    assert untouched and all(relevance[str(e)] == pytest.approx(1 / SFEDAVG.num_clients) for e in untouched)
    assert result["timings"]["valuation_s"] == pytest.approx(sum(r["valuation_time_s"] for r in rounds))
    assert result["timings"]["valuation_s"] > 0


def test_sfedavg_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="val_per_class"):
        EngineConfig(selector="sfedavg", num_selected=5)
    with pytest.raises(ValueError, match="during training"):
        select(SFEDAVG, load_federation(SFEDAVG))


@pytest.mark.parametrize("bid_policy", ["volume", "constant"])
def test_market_protocol_selects_what_the_pricing_functions_select(bid_policy: str) -> None:
    cfg = replace(SETTINGS[1], bid_policy=bid_policy, market="protocol")
    federation = load_federation(cfg)
    selected, market = select(cfg, federation)
    direct, _ = select(replace(cfg, market="direct"), federation)
    assert selected == direct and market["same_winners_as_direct"]
    assert market["market_phase_s"] > 0 and market["pass_attempts"] == 1


def test_market_protocol_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="market must be one of"):
        EngineConfig(market="oracle")
    with pytest.raises(ValueError, match="bid policies"):
        EngineConfig(market="protocol", bid_policy="random")


def test_a_market_that_buys_nobody_trains_nothing_and_says_so() -> None:
    """Every score zero (60 clients at d6): FLMarket buys nobody; the job records it, final accuracy NaN."""
    cfg = replace(PARITY["every score zero"], rounds=3, final_window=1, local_steps=1)
    result = run_engine(cfg)
    assert result["selected_partitions"] == [] and result["engine"]["bought_nobody"] is True
    assert math.isnan(result["final_accuracy"]) and result["engine"]["rounds_run"] == 0
    assert [r["round"] for r in result["rounds"]] == [0]
