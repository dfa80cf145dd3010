"""Tools for the adversarial and federation tests: a server that sends whatever it likes to the real client
handlers, and wrapped strategies that change the federation between rounds or note what it was sent."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Message
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg

from flmarket_flwr.market import CostBasedBid, MarketConfig, MarketPhase, register_market_handlers
from flmarket_flwr.market.node.bidding import BidPolicy
from flmarket_flwr.market.node.node_config import NodeSettings
from flmarket_flwr.market.wire.messages import ACTION_BID, ACTIONS, KEY_SCORE, RECORD_KEY, make_content, message_type
from flmarket_flwr.pass_protocol import IdentityDirectory, PassServer, generate_identity
from simulations.inprocess_grid import InProcessGrid, market_client_app

NUM_CLASSES = 10
SECRET_KEYS = (
    "cipher_private_key",
    "mask_private_key",
    "self_seed",
    "channel_secrets",
    "pair_seeds",
    "held_shares",
    "nonce",
    "counts",
)


def make_counts(num_nodes: int, seed: int = 0, high: int = 200) -> dict[int, np.ndarray]:
    """Distinct, random label counts for ``num_nodes`` nodes with Flower-like node ids."""
    rng = np.random.default_rng(seed)
    return {1000 + 17 * i: rng.integers(1, high, size=NUM_CLASSES) for i in range(num_nodes)}


def honest_grid(counts: Mapping[int, np.ndarray], **grid_options: Any) -> InProcessGrid:
    """An in-process grid whose nodes run the real market handlers with a cost-based bid."""
    return InProcessGrid(market_client_app(counts, CostBasedBid(0.01)), list(counts), **grid_options)


def lying_client_app(counts: Mapping[int, np.ndarray], liar: int, claimed_score: float, policy: BidPolicy) -> ClientApp:
    """The real handlers, but ``liar`` sends ``claimed_score`` as its score and keeps it as the score it sent (a
    client running modified code): it endorses the award that lists that score, and only its audit can catch it."""
    honest = market_client_app(counts, policy)
    app = ClientApp()

    def handle(message: Message, context: Any) -> Message:
        reply = honest(message, context)
        if (
            context.node_id == liar
            and message.metadata.message_type == message_type(ACTION_BID)
            and not reply.has_error()
        ):
            reply.content.config_records[RECORD_KEY][KEY_SCORE] = claimed_score
            context.state.config_records[RECORD_KEY][KEY_SCORE] = claimed_score
        return reply

    for action in ACTIONS:
        app.query(action)(handle)
    return app


def signed_app(counts: Mapping[int, np.ndarray]) -> tuple[ClientApp, IdentityDirectory]:
    """A ``ClientApp`` whose nodes hold Ed25519 identity keys and the directory of all of them (secure set-up)."""
    app, directory, _ = signed_setup(counts)
    return app, directory


def signed_setup(counts: Mapping[int, np.ndarray]) -> tuple[ClientApp, IdentityDirectory, dict[int, Any]]:
    """:func:`signed_app`, and each node's identity private key (for tests that play a signing liar)."""
    identities = {node: generate_identity() for node in counts}
    directory = IdentityDirectory({node: public for node, (_, public) in identities.items()})
    app = ClientApp()
    register_market_handlers(
        app,
        lambda context: counts[context.node_id],
        CostBasedBid(0.01),
        settings=lambda context: NodeSettings(identity_key=identities[context.node_id][0], directory=directory),
    )
    return app, directory, {node: private for node, (private, _) in identities.items()}


def market_config(**overrides: Any) -> MarketConfig:
    values: dict[str, Any] = {
        "budget": 100.0,
        "num_classes": NUM_CLASSES,
        "poll_interval": 0.001,
        "timeout": 5.0,
        "timeout_per_node": 0.0,
    }
    values.update(overrides)
    return MarketConfig(**values)


def send(grid: InProcessGrid, action: str, requests: Mapping[int, Mapping[str, Any]]) -> dict[int, Message]:
    """Send ``{node: fields}`` as ``query.<action>`` messages; return ``{node: reply}``."""
    messages = [
        Message(
            make_content(ConfigRecord(dict(fields))),
            dst_node_id=node,
            message_type=message_type(action),
            group_id="attack",
        )
        for node, fields in requests.items()
    ]
    replies = grid.send_and_receive(messages)
    node_of = {message.metadata.message_id: message.metadata.dst_node_id for message in messages}
    return {node_of[reply.metadata.reply_to_message_id]: reply for reply in replies}


def record_of(reply: Message) -> dict[str, Any]:
    """A successful reply's market record (fails the test on an error reply)."""
    assert not reply.has_error(), reply.error.reason
    return dict(reply.content.config_records[RECORD_KEY].items())


def run_pass_rounds(grid: InProcessGrid, nodes: list[int], server: PassServer, *, upto: int = 4) -> Any:
    """Drive the real clients through PASS rounds 1..``upto`` with a protocol-following server object."""
    requests: Any = server.advertise_requests(nodes)
    actions = ("market_advertise", "market_share", "market_mask", "market_unmask")
    steps = (server.receive_advertisements, server.receive_shares, server.receive_masked, server.receive_unmask)
    for action, step in list(zip(actions, steps, strict=True))[:upto]:
        replies = send(grid, action, {server.node_of[i]: request.to_record() for i, request in requests.items()})
        requests = step({server.index_of[node]: record_of(reply) for node, reply in replies.items()})
    return requests


def client_secrets(grid: InProcessGrid, node: int) -> dict[str, Any]:
    """Every secret left in a node's ``context.state`` (what a later compromise of the node would expose)."""
    state = grid.context(node).state.config_records.get(RECORD_KEY)
    if state is None:
        return {}
    return {key: value for key, value in state.items() if key.removeprefix("pass/") in SECRET_KEYS}


def run_market(counts: Mapping[int, np.ndarray], **overrides: Any) -> tuple[InProcessGrid, Any]:
    grid = honest_grid(counts)
    return grid, MarketPhase(market_config(**overrides)).run(grid)


def altering(node: int, action: str, change):
    """A reply hook that lets ``change(record)`` edit ``node``'s reply to ``query.<action>``."""

    def hook(instruction, reply):
        if (
            instruction.metadata.dst_node_id == node
            and instruction.metadata.message_type == f"query.{action}"
            and not reply.has_error()
        ):
            change(reply.content.config_records[RECORD_KEY])
        return reply

    return hook


class ChangingAfterRound(FedAvg):
    """FedAvg that calls ``change()`` once, right after aggregating train round ``after_round``: the federation
    changes (nodes join, a winner is killed, the buyer drops a node) before the next round's re-launch check.

    Parameters
    ----------
    after_round : int
        The train round after which ``change`` runs.
    change : Callable[[], None]
        What changes (it sees the test's grid and strategy through its closure).
    **fedavg : Any
        ``FedAvg``'s own arguments.
    """

    def __init__(self, after_round: int, change: Callable[[], None], **fedavg: Any) -> None:
        super().__init__(**fedavg)
        self.after_round, self.change = after_round, change

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> Any:
        """Run ``change`` after round ``after_round``, then aggregate as FedAvg does."""
        if server_round == self.after_round:
            self.change()
        return super().aggregate_train(server_round, replies)


class CountingQueries(FedAvg):
    """FedAvg that notes, before each train round, how many market queries ``grid`` had been sent so far
    (:attr:`queries_before`: round -> count): a market that was skipped sent nothing between two rounds."""

    def __init__(self, grid: InProcessGrid, **fedavg: Any) -> None:
        super().__init__(**fedavg)
        self.grid = grid
        self.queries_before: dict[int, int] = {}

    def configure_train(self, server_round: int, arrays: Any, config: Any, grid: Any) -> Any:
        """Note the count, then configure as FedAvg does."""
        self.queries_before[server_round] = sum(
            1 for message in self.grid.sent if message.metadata.message_type.startswith("query")
        )
        return super().configure_train(server_round, arrays, config, grid)
