"""FLMarket is transparent (the wrapped strategy's own attributes and methods reach it through the wrapper) and takes
Flower's legacy servers: a legacy workflow it wraps and runs on the winners; a legacy strategy it refuses, saying
what to do."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.client import NumPyClient
from flwr.clientapp import ClientApp
from flwr.common import ndarrays_to_parameters
from flwr.server import LegacyContext, ServerConfig
from flwr.server.strategy import DifferentialPrivacyServerSideFixedClipping as LegacyServerSideDP
from flwr.server.strategy import FedAvg as LegacyFedAvg
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
from flwr.serverapp import Grid
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg
from test_grid_view import NUM_CLASSES, make_counts
from test_strategy import INITIAL, market_grid, receivers, wrapped

from flmarket_flwr.market import CostBasedBid, FLMarket, MarketError, RelaunchPolicy, market_mod
from simulations.inprocess_grid import InProcessGrid


class CustomFedAvg(FedAvg):
    """A strategy with methods and attributes of its own, as Flower's advanced-pytorch example has."""

    def set_save_path(self, path: str) -> None:
        """Set where results go (an attribute only this strategy has)."""
        self.save_path = path

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid):
        """Tag each round's config with where results go."""
        config["save-path"] = self.save_path
        return super().configure_train(server_round, arrays, config, grid)


# --- Transparent ---------------------------------------------------------------------------------
def test_the_wrapped_strategys_own_methods_and_attributes_reach_it_through_flmarket() -> None:
    inner = CustomFedAvg(fraction_evaluate=1.0)
    strategy = wrapped(inner, num_winners=2)
    strategy.set_save_path("/results/run-1")  # the advanced example's call, on the wrapper
    assert inner.save_path == "/results/run-1" and strategy.save_path == "/results/run-1"
    assert strategy.fraction_evaluate == 1.0

    grid = market_grid()
    strategy.start(grid=grid, initial_arrays=INITIAL, num_rounds=1)
    train = [m for m in grid.sent if m.metadata.message_type == MessageType.TRAIN]
    assert sorted(m.metadata.dst_node_id for m in train) == sorted(strategy.market_outcome.winners)
    assert {m.content["config"]["save-path"] for m in train} == {"/results/run-1"}


def test_setting_a_wrapped_attribute_sets_it_on_the_wrapped_strategy_and_flmarkets_own_stay_its_own() -> None:
    inner = FedAvg(fraction_train=1.0)
    strategy = wrapped(inner)
    strategy.fraction_train = 0.5
    assert inner.fraction_train == 0.5 and "fraction_train" not in vars(strategy)
    strategy.seed = 7  # FLMarket's own
    assert strategy.seed == 7 and not hasattr(inner, "seed")
    strategy.note = "mine"  # neither has it: the wrapper's, as for any object
    assert vars(strategy)["note"] == "mine" and not hasattr(inner, "note")


def test_a_missing_attribute_and_private_names_raise_attribute_error_naming_both() -> None:
    strategy = wrapped(FedAvg())
    with pytest.raises(AttributeError, match="neither 'FLMarket' nor the 'FedAvg' it wraps has an attribute 'nope'"):
        _ = strategy.nope
    with pytest.raises(AttributeError):
        _ = strategy._private_of_the_inner  # private names are each object's own
    assert not hasattr(strategy, "_inplace")  # FedAvg's private attribute is not forwarded


def test_flmarket_pickles_and_copies_without_recursing() -> None:
    strategy = wrapped(CustomFedAvg())
    strategy.set_save_path("/results")
    for clone in (pickle.loads(pickle.dumps(strategy)), copy.deepcopy(strategy), copy.copy(strategy)):
        assert isinstance(clone, FLMarket) and clone.save_path == "/results"
        assert clone.market_config == strategy.market_config
    bare = FLMarket.__new__(FLMarket)  # before __init__ (as unpickling starts): nothing to forward to
    with pytest.raises(AttributeError):
        _ = bare.fraction_train
    bare.anything = 1  # and setting works as for any object
    assert vars(bare) == {"anything": 1}


def test_min_node_counts_are_capped_where_they_live_through_nested_wrappers() -> None:
    inner = FedAvg(min_train_nodes=5, min_evaluate_nodes=5, min_available_nodes=5)
    market = wrapped(inner, num_winners=2)
    outer = DifferentialPrivacyServerSideFixedClipping(market, 0.1, 10.0, num_sampled_clients=2)
    grid = market_grid()
    outer.start(grid=grid, initial_arrays=INITIAL, num_rounds=1)
    assert len(set(receivers(grid, MessageType.TRAIN))) == 2
    assert (inner.min_train_nodes, inner.min_evaluate_nodes, inner.min_available_nodes) == (5, 5, 5)
    assert not {"min_train_nodes", "min_evaluate_nodes", "min_available_nodes"} & set(vars(market))


# --- Legacy servers ------------------------------------------------------------------------------
def test_a_legacy_strategy_is_refused_with_what_to_do() -> None:
    with pytest.raises(TypeError, match=r"FedAvg is a legacy Flower strategy.*FLMarket\(workflow, budget=") as err:
        FLMarket(LegacyFedAvg(), budget=100.0, num_classes=3)
    assert "flwr.serverapp.strategy.FedAvg" in str(err.value)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (FedAvg, "got the class FedAvg: write FedAvg"),
        (SecAggPlusWorkflow(num_shares=3, reconstruction_threshold=2), "SecAggPlusWorkflow is a fit workflow"),
        (42, "a flwr Strategy .* or a legacy workflow, got int"),
    ],
    ids=["a class", "a fit workflow", "not callable"],
)
def test_what_is_neither_a_strategy_nor_a_workflow_is_refused_by_name(given: Any, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        FLMarket(given, budget=100.0, num_classes=3)


def test_a_workflow_market_refuses_relaunch_pay_on_delivery_and_start() -> None:
    workflow = DefaultWorkflow()
    with pytest.raises(TypeError, match="relaunch needs a Message-API strategy"):
        FLMarket(workflow, budget=100.0, num_classes=3, relaunch=RelaunchPolicy(every_rounds=2))
    with pytest.raises(TypeError, match="settle_on_delivery counts train rounds"):
        FLMarket(workflow, budget=100.0, num_classes=3, settle_on_delivery=True)
    market = FLMarket(workflow, budget=100.0, num_classes=3)
    grid = market_grid()
    with pytest.raises(TypeError, match=r"wraps the legacy workflow DefaultWorkflow: run it as one, market\(grid"):
        market.start(grid=grid, initial_arrays=INITIAL)
    assert not grid.sent  # refused before any market
    assert market.fit_workflow is workflow.fit_workflow  # the workflow's attributes, through the wrapper
    with pytest.raises(TypeError, match="wraps the strategy FedAvg: run it with strategy.start"):
        wrapped(FedAvg())(grid, Context(1, 0, {}, RecordDict(), {}))


class NumpyClient(NumPyClient):
    """A legacy client: its update adds its sample count to the weights."""

    def __init__(self, samples: int) -> None:
        self.samples = samples

    def fit(self, parameters, config):
        return [parameters[0] + self.samples], self.samples, {}

    def evaluate(self, parameters, config):
        return 1.0, self.samples, {}


def legacy_grid(num_nodes: int = 6) -> InProcessGrid:
    """Nodes running a legacy ``client_fn`` app with the market as a mod."""
    counts = make_counts(num_nodes, seed=3)
    app = ClientApp(
        client_fn=lambda context: NumpyClient(int(counts[context.node_id].sum())).to_client(),
        mods=[market_mod(lambda context: counts[context.node_id], CostBasedBid(0.02))],
    )
    return InProcessGrid(app, list(counts))


def legacy_fedavg(**settings: Any) -> LegacyFedAvg:
    """A legacy ``FedAvg`` with initial parameters (the workflow asks no client for them)."""
    return LegacyFedAvg(initial_parameters=ndarrays_to_parameters([np.zeros(3)]), **settings)


def legacy_context(strategy: Any, rounds: int = 2) -> LegacyContext:
    return LegacyContext(Context(1, 0, {}, RecordDict(), {}), config=ServerConfig(num_rounds=rounds), strategy=strategy)


def market_of(workflow: Any, **settings: Any) -> FLMarket:
    market = wrapped(FedAvg(), **settings)  # the quick market's settings, then the workflow in the strategy's place
    return FLMarket(workflow, market_config=market.market_config, seed=0)


def test_a_legacy_workflow_trains_the_winners_only_with_its_strategys_minimums_capped() -> None:
    strategy = legacy_fedavg(
        fraction_fit=1.0, fraction_evaluate=1.0, min_fit_clients=5, min_evaluate_clients=5, min_available_clients=5
    )
    grid = legacy_grid()
    market = market_of(DefaultWorkflow(), num_winners=3)
    market(grid, legacy_context(strategy))

    winners = market.market_outcome.winners
    assert len(winners) == 3
    assert set(receivers(grid, MessageType.TRAIN)) == set(winners)
    assert len(receivers(grid, MessageType.TRAIN)) == 2 * 3
    assert set(receivers(grid, MessageType.EVALUATE)) == set(winners)
    assert (strategy.min_fit_clients, strategy.min_evaluate_clients, strategy.min_available_clients) == (5, 5, 5)
    assert {int(node) for node in market.delivery_report()["winners"]} == set(winners)


def test_a_dp_wrapper_sized_for_another_cohort_is_warned_about_and_sizing_it_from_the_winners_runs_one_market(
    caplog: pytest.LogCaptureFixture,
) -> None:
    grid = legacy_grid()
    market = market_of(DefaultWorkflow(), num_winners=3)
    dp = LegacyServerSideDP(legacy_fedavg(fraction_fit=1.0, fraction_evaluate=0.0), 0.1, 10.0, num_sampled_clients=5)
    market(grid, legacy_context(dp, rounds=1))
    assert "adds noise for num_sampled_clients=5, but 3 of the cohort's 3 node(s) train each round" in caplog.text

    caplog.clear()  # sized for what the strategy samples of the cohort each round: 2 of the 4 winners
    market = market_of(DefaultWorkflow(), num_winners=4)
    dp = LegacyServerSideDP(legacy_fedavg(fraction_fit=0.5, fraction_evaluate=0.0), 0.1, 10.0, num_sampled_clients=2)
    market(legacy_grid(), legacy_context(dp, rounds=1))
    assert len(market.market_outcome.winners) == 4
    assert "num_sampled_clients=" not in caplog.text and "differs from the number of sampled clients" not in caplog.text

    caplog.clear()
    grid = legacy_grid()
    market = market_of(DefaultWorkflow(), num_winners=3)
    view = market.winners_grid(grid)  # the market first, to size the wrapper for its cohort
    dp = LegacyServerSideDP(
        legacy_fedavg(fraction_fit=1.0, fraction_evaluate=0.0), 0.1, 10.0, num_sampled_clients=len(view.node_ids)
    )
    adverts = receivers(grid, "query.market_advertise")
    market(grid, legacy_context(dp, rounds=1))
    assert receivers(grid, "query.market_advertise") == adverts  # not run again
    assert set(receivers(grid, MessageType.TRAIN)) == set(view.node_ids)
    assert "num_sampled_clients=" not in caplog.text and "differs from the number of sampled clients" not in caplog.text


def test_a_market_called_as_a_fit_workflow_inside_a_round_says_to_wrap_the_outer_workflow() -> None:
    grid = legacy_grid()
    inner = market_of(lambda grid, context: None)
    workflow = DefaultWorkflow(fit_workflow=inner)
    with pytest.raises(TypeError, match="called inside a running workflow"):
        workflow(grid, legacy_context(legacy_fedavg()))
    assert not receivers(grid, "query.market_advertise")


# --- The mod -------------------------------------------------------------------------------------
def test_the_mod_answers_the_market_and_passes_everything_else_to_the_app() -> None:
    seen: list[str] = []

    def spy(message: Message, context: Context, call_next):
        seen.append(message.metadata.message_type)
        return call_next(message, context)

    counts = make_counts(5, seed=1)
    for mods in (
        [market_mod(lambda context: counts[context.node_id]), spy],
        [spy, market_mod(lambda context: counts[context.node_id])],
    ):
        seen.clear()
        app = ClientApp(client_fn=lambda context: NumpyClient(3).to_client(), mods=mods)
        grid = InProcessGrid(app, list(counts))
        market = market_of(DefaultWorkflow(), num_winners=2)
        market(grid, legacy_context(legacy_fedavg(fraction_fit=1.0, fraction_evaluate=0.0), rounds=1))
        assert len(market.market_outcome.winners) == 2
        after = [kind for kind in seen if kind.startswith("query.market_")]
        assert (after != []) == (mods[0] is spy)  # an inner mod never sees the market's messages
        assert seen.count(MessageType.TRAIN) == 2  # the app's own messages pass through


def test_register_market_handlers_on_a_client_fn_app_points_at_the_mod() -> None:
    from flmarket_flwr.market import register_market_handlers

    app = ClientApp(client_fn=lambda context: NumpyClient(1).to_client())
    with pytest.raises(ValueError, match=r"built with a client_fn.*mods=\[market_mod\(label_counts"):
        register_market_handlers(app, lambda context: np.ones(NUM_CLASSES, dtype=np.int64))


@pytest.mark.parametrize("kind", ["Message-API app with the mod", "client_fn app without it"])
def test_a_node_without_market_handlers_is_excluded_with_what_to_do(kind: str) -> None:
    counts = make_counts(4, seed=2)
    if kind == "client_fn app without it":
        app = ClientApp(client_fn=lambda context: NumpyClient(1).to_client())
    else:  # Flower runs a decorator app's mods around its registered functions only: the market never reaches it
        app = ClientApp(mods=[market_mod(lambda context: counts[context.node_id])])
        app.train()(lambda message, context: message)
    strategy = wrapped(FedAvg())
    with pytest.raises(MarketError):
        strategy.start(grid=InProcessGrid(app, list(counts)), initial_arrays=INITIAL)
    reasons = strategy.market_outcome.excluded
    assert sorted(reasons) == sorted(counts)
    hint = "the node's ClientApp has no market handlers: register_market_handlers(app"
    assert all(hint in reason for reason in reasons.values())
