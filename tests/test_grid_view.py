"""WinnersGrid: a Grid view that lets any Message-API strategy reach the market's winners only."""

from __future__ import annotations

import random

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAdagrad, FedAvg, FedProx

from flmarket_flwr.market import CostBasedBid, MarketConfig, MarketPhase, WinnersGrid, read_award
from simulations.inprocess_grid import InProcessGrid, market_client_app

NUM_CLASSES = 4


def make_counts(num_nodes: int, seed: int = 0) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {500 + 3 * i: rng.integers(1, 30, size=NUM_CLASSES) for i in range(num_nodes)}


def training_app(counts: dict[int, np.ndarray]):
    """Market handlers plus a numpy 'model': train adds the node's sample count to the weights."""
    app = market_client_app(counts, CostBasedBid(0.02))

    @app.train()
    def train(message: Message, context: Context) -> Message:
        weights = message.content["arrays"]["w"].numpy()
        num_examples = int(counts[context.node_id].sum())
        award = read_award(context)
        content = RecordDict(
            {
                "arrays": ArrayRecord({"w": Array(weights + num_examples)}),
                "metrics": MetricRecord({"num-examples": num_examples, "won": float(award is not None and award.won)}),
            }
        )
        return Message(content, reply_to=message)

    @app.evaluate()
    def evaluate(message: Message, context: Context) -> Message:
        num_examples = int(counts[context.node_id].sum())
        content = RecordDict({"metrics": MetricRecord({"num-examples": num_examples, "loss": 1.0})})
        return Message(content, reply_to=message)

    return app


def plain_grid(num_nodes: int = 6) -> tuple[InProcessGrid, dict[int, np.ndarray]]:
    counts = make_counts(num_nodes)
    return InProcessGrid(training_app(counts), list(counts)), counts


def message_to(node: int, message_type: str = MessageType.EVALUATE) -> Message:
    return Message(RecordDict({"metrics": MetricRecord({"x": 1.0})}), dst_node_id=node, message_type=message_type)


# --- The view ------------------------------------------------------------------------------------
def test_only_winners_are_visible_in_the_given_order() -> None:
    grid, counts = plain_grid()
    nodes = sorted(counts)
    view = WinnersGrid(grid, [nodes[3], nodes[1], nodes[3], np.int64(nodes[4])])

    assert isinstance(view, Grid)
    assert view.get_node_ids() == [nodes[3], nodes[1], nodes[4]]
    assert view.node_ids == (nodes[3], nodes[1], nodes[4])
    assert sorted(info.node_id for info in view.get_nodes()) == sorted([nodes[1], nodes[3], nodes[4]])


def test_disconnected_winners_are_not_visible() -> None:
    grid, counts = plain_grid()
    nodes = sorted(counts)
    view = WinnersGrid(grid, nodes[:3])
    grid.connected = [nodes[0], nodes[2], nodes[5]]

    assert view.get_node_ids() == [nodes[0], nodes[2]]


def test_sending_to_a_non_winner_raises_and_sends_nothing() -> None:
    grid, counts = plain_grid()
    nodes = sorted(counts)
    view = WinnersGrid(grid, nodes[:2])

    with pytest.raises(ValueError, match=f"node {nodes[4]} is not in this WinnersGrid"):
        view.send_and_receive([message_to(nodes[0]), message_to(nodes[4])], timeout=1.0)
    with pytest.raises(ValueError, match="not in this WinnersGrid"):
        view.push_messages(m for m in [message_to(nodes[5])])
    with pytest.raises(ValueError, match="not in this WinnersGrid"):
        view.create_message(RecordDict(), MessageType.TRAIN, nodes[3], "1")
    assert grid.sent == []


def test_messages_to_winners_go_through() -> None:
    grid, counts = plain_grid()
    nodes = sorted(counts)
    view = WinnersGrid(grid, nodes[:2])

    replies = list(view.send_and_receive((message_to(node) for node in nodes[:2]), timeout=1.0))
    assert sorted(reply.metadata.src_node_id for reply in replies) == nodes[:2]

    ids = list(view.push_messages([message_to(nodes[1])]))
    assert [reply.metadata.src_node_id for reply in view.pull_messages(ids)] == [nodes[1]]
    created = view.create_message(RecordDict(), MessageType.QUERY, nodes[0], "g")
    assert created.metadata.dst_node_id == nodes[0]


class OldSignatureGrid(InProcessGrid):
    """A grid with Flower 1.41/1.42's ``pull_messages(message_ids)``, recording what it was asked for."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.pulled: list[list[str]] = []

    def pull_messages(self, message_ids):  # type: ignore[no-untyped-def, override]
        self.pulled.append(list(message_ids))
        return super().pull_messages(message_ids)

    def create_message(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("deprecated Grid.create_message forwarded")


def old_signature_grid() -> tuple[OldSignatureGrid, list[int]]:
    counts = make_counts(6)
    return OldSignatureGrid(training_app(counts), list(counts)), sorted(counts)


def new_signature_grid() -> tuple[InProcessGrid, list[int]]:
    """``InProcessGrid``, whose ``pull_messages`` has Flower 1.43's signature."""
    grid, counts = plain_grid()
    return grid, sorted(counts)


@pytest.mark.parametrize(
    "pull",
    [
        lambda view, ids: view.pull_messages(ids),  # Flower 1.41, 1.42
        lambda view, ids: view.pull_messages(reply_to_message_ids=ids),  # Flower 1.43
        lambda view, ids: view.pull_messages(message_ids=ids),  # Flower 1.43's alias
    ],
    ids=["positional", "reply_to_message_ids", "message_ids"],
)
@pytest.mark.parametrize("make_grid", [old_signature_grid, new_signature_grid], ids=["grid-1.42", "grid-1.43"])
def test_pull_messages_takes_both_flower_signatures_on_either_grid(pull, make_grid) -> None:
    grid, nodes = make_grid()
    view = WinnersGrid(grid, nodes[:2])
    ids = list(view.push_messages([message_to(nodes[0]), message_to(nodes[1])]))

    replies = list(pull(view, iter(ids)))

    assert sorted(reply.metadata.src_node_id for reply in replies) == nodes[:2]
    assert sorted(reply.metadata.reply_to_message_id for reply in replies) == sorted(ids)
    if isinstance(grid, OldSignatureGrid):
        assert grid.pulled == [ids]  # passed on positionally, the one way both signatures take


def test_pull_messages_refuses_both_names_and_a_bare_string() -> None:
    grid, counts = plain_grid()
    view = WinnersGrid(grid, sorted(counts)[:2])
    with pytest.raises(TypeError, match="not both"):
        view.pull_messages(["a"], message_ids=["a"])
    with pytest.raises(TypeError, match="single string"):
        view.pull_messages("abc")


def test_an_unfiltered_pull_shows_the_views_replies_only() -> None:
    grid, counts = plain_grid()
    nodes = sorted(counts)
    view = WinnersGrid(grid, nodes[:2])
    grid.push_messages([message_to(nodes[4])])  # a non-winner's reply waits in the underlying grid
    view.push_messages([message_to(nodes[1])])

    assert [reply.metadata.src_node_id for reply in view.pull_messages()] == [nodes[1]]


def test_an_unfiltered_pull_through_an_old_grid_is_refused_by_name() -> None:
    grid, nodes = old_signature_grid()
    view = WinnersGrid(grid, nodes[:2])
    with pytest.raises(TypeError, match="OldSignatureGrid.pull_messages needs message ids"):
        view.pull_messages()
    assert grid.pulled == []


def test_create_message_builds_the_message_itself_without_flowers_deprecated_call() -> None:
    grid, nodes = old_signature_grid()
    view = WinnersGrid(grid, nodes[:2])

    message = view.create_message(RecordDict({"m": MetricRecord({"x": 1.0})}), MessageType.TRAIN, nodes[1], "7", 30.0)

    assert (message.metadata.dst_node_id, message.metadata.message_type) == (nodes[1], MessageType.TRAIN)
    assert (message.metadata.group_id, message.metadata.ttl) == ("7", 30.0)
    assert message.content["m"]["x"] == 1.0
    with pytest.raises(ValueError, match="not in this WinnersGrid"):
        view.create_message(RecordDict(), MessageType.TRAIN, nodes[3], "7")


def test_everything_else_delegates() -> None:
    grid, counts = plain_grid()
    view = WinnersGrid(grid, sorted(counts)[:2])

    assert view.run is grid.run
    run = grid.run
    view.set_run(run)
    assert grid.run is run
    assert view.grid is grid
    assert view.context(sorted(counts)[0]).node_id == sorted(counts)[0]  # an InProcessGrid method
    with pytest.raises(AttributeError):
        view.no_such_attribute  # noqa: B018


def test_invalid_construction() -> None:
    grid, _ = plain_grid()
    with pytest.raises(ValueError, match="at least one node"):
        WinnersGrid(grid, [])
    with pytest.raises(TypeError):
        WinnersGrid(grid, ["1"])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        WinnersGrid(grid, [1], seed=1.5)  # type: ignore[arg-type]


# --- Seeding -------------------------------------------------------------------------------------
def test_unseeded_view_leaves_global_random_untouched() -> None:
    grid, counts = plain_grid()
    view = WinnersGrid(grid, sorted(counts))
    state = random.getstate()
    view.get_node_ids()
    assert random.getstate() == state


def sampled_cohorts(seed: int | None, global_seed: int, rounds: int = 6) -> list[list[int]]:
    grid, counts = plain_grid(10)
    view = WinnersGrid(grid, sorted(counts)[:8], seed=seed)
    strategy = FedAvg(fraction_train=0.25, fraction_evaluate=0.0, min_train_nodes=2, min_available_nodes=2)
    random.seed(global_seed)  # whatever the global state, a seeded view decides
    strategy.start(grid=view, initial_arrays=ArrayRecord({"w": Array(np.zeros(3))}), num_rounds=rounds)
    sent = [message.metadata.dst_node_id for message in grid.sent]
    assert len(sent) == 2 * rounds  # FedAvg sets no group id: one cohort is two consecutive messages
    return [sent[i : i + 2] for i in range(0, len(sent), 2)]


def test_seeded_view_makes_strategy_sampling_reproducible() -> None:
    first = sampled_cohorts(seed=7, global_seed=1)
    second = sampled_cohorts(seed=7, global_seed=2)
    other = sampled_cohorts(seed=8, global_seed=1)

    assert all(len(set(cohort)) == 2 for cohort in first)
    assert first == second
    assert first != other
    # Control: without a seed, the cohorts follow the global generator.
    assert sampled_cohorts(seed=None, global_seed=1) != sampled_cohorts(seed=None, global_seed=2)


# --- Strategies on winners -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "strategy",
    [
        FedAvg(fraction_train=0.5, min_train_nodes=2, min_evaluate_nodes=2, min_available_nodes=2),
        FedProx(proximal_mu=0.1, min_train_nodes=2, min_evaluate_nodes=2, min_available_nodes=2),
        FedAdagrad(min_train_nodes=2, min_evaluate_nodes=2, min_available_nodes=2),
    ],
    ids=["FedAvg", "FedProx", "FedAdagrad"],
)
def test_a_real_strategy_after_the_market_only_reaches_winners(strategy) -> None:
    counts = make_counts(9, seed=3)
    grid = InProcessGrid(training_app(counts), list(counts))
    outcome = MarketPhase(MarketConfig(budget=1000.0, num_classes=NUM_CLASSES, num_winners=4, poll_interval=0.001)).run(
        grid
    )
    assert len(outcome.winners) == 4
    market_messages = len(grid.sent)

    result = strategy.start(
        grid=WinnersGrid(grid, outcome.winners, seed=0),
        initial_arrays=ArrayRecord({"w": Array(np.zeros(3))}),
        num_rounds=3,
        train_config=ConfigRecord({"lr": 0.1}),
    )

    fl_messages = grid.sent[market_messages:]
    train = [m for m in fl_messages if m.metadata.message_type == MessageType.TRAIN]
    evaluate = [m for m in fl_messages if m.metadata.message_type == MessageType.EVALUATE]
    assert train and evaluate
    assert {m.metadata.dst_node_id for m in fl_messages} <= set(outcome.winners)
    if strategy.fraction_train == 1.0:
        assert sorted(m.metadata.dst_node_id for m in train) == sorted(outcome.winners * 3)
    else:
        assert len(train) == 3 * 2
    # Every node that trained knew it had won (its award is in its own context.state).
    for round_number in (1, 2, 3):
        metrics = result.train_metrics_clientapp[round_number]
        assert metrics["won"] == pytest.approx(1.0)
    assert not np.allclose(result.arrays["w"].numpy(), 0.0)
