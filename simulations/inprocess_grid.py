"""A test harness, not part of the plugin: an in-process ``Grid`` that runs a real ``ClientApp`` per node (no Ray,
no SuperLink).

:class:`InProcessGrid` delivers every message the way Flower's runtimes do (Flower's wire format both ways,
a freshly deserialised ``Context`` per message, an exception as an error reply), only synchronously and in
one process. The experiments engine, the benchmarks and the tests run on it; the code that plays the ServerApp
runs inside :func:`serverapp_identity`, as Flower's ServerApp runtime would set it up. The grid itself leaves
Flower's process-wide state alone.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from uuid import uuid4

import numpy as np
from flwr.app import Context, Error, Message, RecordDict, UserConfig
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.common.typing import Scalar
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from flmarket_flwr.market.buyer.grid_view import reply_filter
from flmarket_flwr.market.node.bidding import BidPolicy
from flmarket_flwr.market.node.client import register_market_handlers
from flmarket_flwr.market.wire.records import context_from_bytes, context_to_bytes, deflate_message, inflate_message
from flmarket_flwr.pass_protocol import IdentityDirectory, generate_identity, save_identity_key

__all__ = [
    "DEFAULT_RUN_ID",
    "InProcessGrid",
    "ReplyHook",
    "market_client_app",
    "secure_profile_setup",
    "serverapp_identity",
    "wire_roundtrip",
]

DEFAULT_RUN_ID = 1
"""The run id of an :class:`InProcessGrid` and of :func:`serverapp_identity` unless given."""

ReplyHook = Callable[[Message, Message], Message | None]
"""``(instruction as delivered, reply) -> reply to return, or None to drop it (a timeout)``."""


@contextmanager
def serverapp_identity(run_id: int = DEFAULT_RUN_ID) -> Iterator[None]:
    """Run the block as the ServerApp of run ``run_id``, then put back Flower's task identity as it was.

    Flower's ``Message(content, dst_node_id, message_type)`` stamps an instruction with the run, node and task of
    the process that builds it (``flwr.supercore.task_identity.TaskIdentity``, which Flower's ServerApp runtimes
    set before the app starts). Code that plays the ServerApp over an :class:`InProcessGrid` (a market phase, a
    strategy) runs inside this block; the grid itself never writes that process-wide state.

    Parameters
    ----------
    run_id : int (default: :data:`DEFAULT_RUN_ID`)
        The run the instructions belong to: the grid's (``grid.run.run_id``).
    """
    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)  # pylint: disable=protected-access
    TaskIdentity.task_id = 1
    TaskIdentity.run_id = run_id
    TaskIdentity.node_id = SUPERLINK_NODE_ID
    try:
        yield
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved  # pylint: disable=protected-access


def market_client_app(
    label_counts: Mapping[int, np.ndarray],
    bid_policy: BidPolicy | None = None,
) -> ClientApp:
    """A ``ClientApp`` with only the market handlers, serving fixed label counts per node id.

    Parameters
    ----------
    label_counts : Mapping[int, numpy.ndarray]
        Node id -> that node's per-class label counts.
    bid_policy : BidPolicy, optional
        Passed to :func:`~flmarket_flwr.market.node.client.register_market_handlers`.

    Returns
    -------
    ClientApp
        The app; add ``train``/``evaluate`` handlers to it as usual.
    """
    app = ClientApp()
    register_market_handlers(app, lambda context: label_counts[context.node_id], bid_policy)
    return app


def secure_profile_setup(
    folder: Path, nodes: Sequence[int], directory_keys: Mapping[int, bytes] | None = None
) -> tuple[dict[int, dict[str, Scalar]], IdentityDirectory]:
    """Each node's node config in the secure profile, and the honest directory of their identity keys.

    Each node gets its own PEM identity key in ``folder``, the directory file ``folder/directory.json`` and the honest
    directory's digest as its pin; the file holds ``directory_keys`` when given (a directory the buyer wrote, which
    the nodes then refuse). A node's ledger goes under ``$FLMARKET_HOME``, as the profile's default.
    """
    publics = {}
    for node in nodes:
        private, public = generate_identity()
        save_identity_key(private, folder / f"node-{node}.pem")
        publics[node] = public
    directory = IdentityDirectory(dict(directory_keys) if directory_keys is not None else publics)
    (folder / "directory.json").write_text(directory.to_json())
    honest = IdentityDirectory(publics)
    configs: dict[int, dict[str, Scalar]] = {
        node: {
            "market-security": "malicious",
            "identity-key": str(folder / f"node-{node}.pem"),
            "identity-directory": str(folder / "directory.json"),
            "identity-directory-digest": honest.digest().hex(),
        }
        for node in nodes
    }
    return configs, honest


def wire_roundtrip(message: Message) -> tuple[Message, bytes]:
    """Serialise a message as Flower does on the wire and read it back.

    Parameters
    ----------
    message : Message
        Any message (content or error).

    Returns
    -------
    tuple[Message, bytes]
        The deserialised copy (same ``message_id``) and the serialised bytes of the
        message and all its records.
    """
    # Flower's object tree, each object deflated once (Flower's grids compute each id once, too).
    contents = deflate_message(message)
    raw = b"".join(contents.values())
    copy = inflate_message(next(reversed(contents)), contents)
    copy.metadata.__dict__["_message_id"] = message.metadata.message_id
    return copy, raw


class InProcessGrid(Grid):
    """A ``Grid`` whose nodes run a real ``ClientApp`` in this process.

    Parameters
    ----------
    client_app : ClientApp or Callable[[], ClientApp]
        The ``ClientApp`` every node runs, or a factory called for every message (a
        fresh ``ClientApp`` per message, as when deployment loads the app in a new process).
    node_ids : Sequence[int]
        Ids of the nodes (all connected at first; see :attr:`connected`).
    node_configs : Mapping[int, UserConfig], optional
        Per-node ``node_config``; defaults to Flower simulation's
        ``{"partition-id": i, "num-partitions": n}`` with ``i`` the node's position.
    run_config : UserConfig, optional
        The run config every node sees.
    run_id : int (default: :data:`DEFAULT_RUN_ID`)
        Run id of the grid's ``Run`` and of the nodes' contexts.
    reply_hook : ReplyHook, optional
        Called with each (instruction, reply); returns the reply to deliver or ``None``.
    shuffle_seed : int or None (default: 0)
        Seed of the shuffling of each batch of replies; ``None`` keeps sending order.

    Notes
    -----
    :class:`InProcessGrid` delivers every message the way Flower's runtimes do, only synchronously
    and in one process:

    * each message crosses Flower's own wire format (the object-tree ``deflate``/``inflate`` used by
      the SuperLink), in both directions, so only what a ``RecordDict`` can really carry arrives;
    * each node keeps its ``Context`` as serialised protobuf bytes and gets a freshly deserialised
      ``Context`` for every message (deployment runs each message in a fresh process, so state that
      is not in ``context.state`` is lost, exactly as there); the bytes are those of Flower's
      ``context_to_proto``, made and read by :mod:`flmarket_flwr.market.wire.records` without Flower's
      per-item overhead;
    * a ``ClientApp`` exception becomes an error reply (``ErrorCode.CLIENT_APP_RAISED_EXCEPTION``)
      and the node's context is not updated, as in Flower's simulation and deployment runtimes.

    Test hooks: ``reply_hook(instruction, reply)`` may replace a reply or drop it (return ``None``:
    the server sees a timeout); :attr:`InProcessGrid.received_wire` holds the serialised bytes of
    every reply the server received, for privacy checks; replies come back in shuffled order.

    The grid never writes Flower's process-wide ``TaskIdentity``: the code that plays the ServerApp builds its
    messages inside :func:`serverapp_identity`.
    """

    def __init__(  # pylint: disable=too-many-arguments
        self,
        client_app: ClientApp | Callable[[], ClientApp],
        node_ids: Sequence[int],
        *,
        node_configs: Mapping[int, UserConfig] | None = None,
        run_config: UserConfig | None = None,
        run_id: int = DEFAULT_RUN_ID,
        reply_hook: ReplyHook | None = None,
        shuffle_seed: int | None = 0,
    ) -> None:
        if len(set(node_ids)) != len(node_ids):
            raise ValueError("node ids must be unique")
        self._app = client_app
        self.node_ids = [int(node) for node in node_ids]
        self.connected: list[int] = list(self.node_ids)
        self.reply_hook = reply_hook
        self._rng = random.Random(shuffle_seed) if shuffle_seed is not None else None
        self._run = Run.create_empty(run_id)
        self._contexts: dict[int, bytes] = {}
        for position, node in enumerate(self.node_ids):
            config: UserConfig = (
                dict(node_configs[node])
                if node_configs is not None
                else {
                    "partition-id": position,
                    "num-partitions": len(self.node_ids),
                }
            )
            context = Context(run_id, node, config, RecordDict(), dict(run_config or {}))
            self._contexts[node] = context_to_bytes(context)
        self._replies: dict[str, Message] = {}
        self.sent: list[Message] = []
        self.received: list[Message] = []
        self.received_wire: list[bytes] = []

    # --- Grid API ------------------------------------------------------------------------------
    def set_run(self, run: Run) -> None:
        """Set the run."""
        self._run = run

    @property
    def run(self) -> Run:
        """Run information."""
        return self._run

    def create_message(  # pylint: disable=too-many-arguments,R0917
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        """Create a message (as Flower's grids do, without sending it)."""
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> list[int]:
        """Ids of the connected nodes."""
        return list(self.connected)

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        """Deliver each message to its node's ``ClientApp`` and return the new message ids.

        The nodes compute their replies here, as real nodes do while the server waits, so that pulling the
        replies takes no time (a server's deadline then bounds the wait, not the clients' work).
        """
        ids = []
        for message in messages:
            if message.metadata.dst_node_id not in self._contexts:
                raise ValueError(f"unknown destination node {message.metadata.dst_node_id}")
            if message.metadata.reply_to_message_id or message.metadata.ttl <= 0:
                raise ValueError(f"invalid instruction message: {message}")
            message.metadata.__dict__["_message_id"] = str(uuid4())
            self.sent.append(message)
            delivered, _ = wire_roundtrip(message)
            self._accept(message.metadata.message_id, delivered)
            ids.append(message.metadata.message_id)
        return ids

    def _accept(self, message_id: str, delivered: Message) -> None:
        """Run the node's ``ClientApp`` on a message as it arrives and keep its reply for the next pull."""
        reply = self._deliver(delivered)
        if reply is not None:
            self._replies[message_id] = reply

    def pull_messages(  # type: ignore[override]  # Flower 1.43's signature, which also takes 1.42's calls
        self,
        reply_to_message_ids: Iterable[str] | None = None,
        *,
        message_ids: Iterable[str] | None = None,
    ) -> list[Message]:
        """Return the replies to the given messages not pulled yet; with no ids, every reply not pulled yet.

        Both of Flower's signatures: ``pull_messages(ids)``, ``pull_messages(reply_to_message_ids=ids)`` and
        ``pull_messages(message_ids=ids)`` (:func:`~flmarket_flwr.market.buyer.grid_view.reply_filter`).
        """
        wanted = reply_filter(reply_to_message_ids, message_ids)
        replies = []
        for message_id in list(self._replies) if wanted is None else wanted:
            reply = self._replies.pop(message_id, None)
            if reply is not None:
                replies.append(self._receive(reply))
        if self._rng is not None:
            self._rng.shuffle(replies)
        return replies

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        """Push the messages and pull every reply (dropped replies are simply missing)."""
        return self.pull_messages(self.push_messages(messages))

    # --- Node side -----------------------------------------------------------------------------
    def context(self, node_id: int) -> Context:
        """A fresh copy of the node's persisted ``Context``."""
        return context_from_bytes(self._contexts[node_id])

    def _deliver(self, message: Message) -> Message | None:
        node = message.metadata.dst_node_id
        context = self.context(node)
        app = self._app if isinstance(self._app, ClientApp) else self._app()
        try:
            reply = app(message, context)
        except Exception as ex:  # pylint: disable=broad-exception-caught
            reason = str(type(ex)) + ":<'" + str(ex) + "'>"
            reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=message)
        else:
            self._contexts[node] = context_to_bytes(context)
        reply.metadata.__dict__["_message_id"] = str(uuid4())
        if self.reply_hook is not None:
            return self.reply_hook(message, reply)
        return reply

    def _receive(self, reply: Message) -> Message:
        received, raw = wire_roundtrip(reply)
        self.received.append(received)
        self.received_wire.append(raw)
        return received
