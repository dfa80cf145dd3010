"""Restrict any Flower strategy to the market's winners with a ``Grid`` view.

Usage::

    outcome = MarketPhase(config).run(grid)
    result = strategy.start(grid=WinnersGrid(grid, outcome.winners, seed=42), initial_arrays=arrays)

:class:`WinnersGrid` shows a Message-API strategy the winners only and refuses any message to another
node, so the strategy runs unchanged; its docstring gives the seeded sampling, the reply order and the
strategy settings to keep ``<= len(outcome.winners)``.
"""

from __future__ import annotations

import functools
import inspect
import random
import time
from collections.abc import Callable, Iterable
from typing import Any

import flwr
import numpy as np
from flwr.app import Message, RecordDict
from flwr.proto.node_pb2 import NodeInfo  # pylint: disable=E0611
from flwr.serverapp import Grid
from flwr.supercore.run import Run

__all__ = ["NoWinnerConnectedError", "WinnersGrid"]


class NoWinnerConnectedError(RuntimeError):
    """No winner has been connected for longer than the view's ``absent_timeout``."""


class WinnersGrid(Grid):
    """A ``Grid`` view that exposes, and lets messages reach, the given nodes only.

    Parameters
    ----------
    grid : Grid
        The underlying grid (the one passed to the ``ServerApp``'s main function).
    node_ids : Iterable[int]
        The nodes to expose, e.g. ``MarketOutcome.winners`` (order kept, duplicates dropped).
    seed : int, optional
        If given, node sampling by the strategy becomes reproducible (see the module
        docstring: the module-level ``random`` generator is reseeded on each
        ``get_node_ids()`` call).
    absent_timeout : float or None (default: 600.0)
        Seconds that ``get_node_ids()`` may go on finding no winner connected before it raises
        :class:`NoWinnerConnectedError` (a strategy would otherwise wait forever for nodes);
        ``None``: never raise.
    on_exchange : Callable[[list[Message], list[Message]], None], optional
        Called after every ``send_and_receive`` with the messages sent and the replies received
        (FLMarket records the winners' deliveries with it).

    Raises
    ------
    ValueError
        If ``node_ids`` is empty, or ``absent_timeout`` is negative.
    TypeError
        If a node id is not an int.

    Notes
    -----
    Seeded sampling
        Flower's strategies sample with ``random.sample`` on Python's module-level generator
        (``flwr.serverapp.strategy.strategy_utils.sample_nodes``), which no argument seeds. With
        ``seed=...``, every ``get_node_ids()`` call of the view reseeds that module-level generator
        from a private stream started at ``seed``, just before the strategy draws its sample from
        the returned list: the cohorts of every round are then a function of ``seed`` alone, whatever
        else consumed randomness in between. This touches the global ``random`` state (and only it;
        numpy and torch generators are left alone). With ``seed=None`` (default) nothing is reseeded.

    Reply order
        ``send_and_receive`` returns the replies in the view's node order (the order given at
        construction, e.g. the auction's), not in arrival order. A strategy sums the replies' arrays
        in the order it gets them, and a floating-point sum depends on that order: arrival order (or
        node-id order: Flower's simulation draws node ids at random each run) would make the global
        model differ in its last bits from run to run, and the accuracy with it.

    Strategy settings
        A strategy waits, forever, until ``min_available_nodes`` (and ``min_train_nodes`` /
        ``min_evaluate_nodes``) nodes are visible. Through this view only winners are visible: keep
        those settings ``<= len(outcome.winners)``. If every winner leaves, no setting can be met:
        the view then raises :class:`NoWinnerConnectedError` from ``get_node_ids()`` once no winner
        has been connected for ``absent_timeout`` seconds, so the strategy stops instead of waiting
        forever.
    """

    def __init__(
        self,
        grid: Grid,
        node_ids: Iterable[int],
        *,
        seed: int | None = None,
        absent_timeout: float | None = 600.0,
        on_exchange: Callable[[list[Message], list[Message]], None] | None = None,
    ) -> None:
        winners = _unique_node_ids(node_ids)
        if not winners:
            raise ValueError("WinnersGrid needs at least one node id: no client won the market")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
        self._grid = grid
        self._node_ids = winners
        self._allowed = frozenset(winners)
        self._rng = random.Random(seed) if seed is not None else None
        if absent_timeout is not None and (
            isinstance(absent_timeout, bool) or not isinstance(absent_timeout, (int, float)) or absent_timeout < 0
        ):
            raise ValueError(f"absent_timeout must be a number >= 0 or None, got {absent_timeout!r}")
        self._absent_timeout = absent_timeout
        self._absent_since: float | None = None
        self._on_exchange = on_exchange

    # --- The view ------------------------------------------------------------------------------
    @property
    def node_ids(self) -> tuple[int, ...]:
        """All nodes of the view (connected or not), in the order given."""
        return self._node_ids

    @property
    def grid(self) -> Grid:
        """The underlying grid."""
        return self._grid

    def drop(self, node_ids: Iterable[int]) -> None:
        """Take ``node_ids`` out of the view: from now on they are neither listed nor sent any message.

        Raises
        ------
        ValueError
            If a node is not in the view, or none would be left (nothing sent would be allowed).
        """
        dropped = set(_unique_node_ids(list(node_ids)))
        outside = sorted(dropped - self._allowed)
        if outside:
            raise ValueError(f"node(s) {outside} are not in this WinnersGrid (nodes: {sorted(self._allowed)})")
        left = tuple(node for node in self._node_ids if node not in dropped)
        if not left:
            raise ValueError("dropping every node of the WinnersGrid leaves nothing to train")
        self._node_ids, self._allowed = left, frozenset(left)

    def get_node_ids(self) -> list[int]:
        """Return the view's nodes that the underlying grid reports as connected.

        The order is the one given at construction. When the view is seeded, the
        module-level ``random`` generator is reseeded before returning.

        Raises
        ------
        NoWinnerConnectedError
            If no winner has been connected, at any call, for more than ``absent_timeout`` s.
        """
        connected = set(self._grid.get_node_ids())
        visible = [node for node in self._node_ids if node in connected]
        self._check_absence(visible)
        if self._rng is not None:
            random.seed(self._rng.getrandbits(64))
        return visible

    def _check_absence(self, visible: list[int]) -> None:
        """Raise once no winner has been seen connected for more than ``absent_timeout`` s."""
        if visible or self._absent_timeout is None:
            self._absent_since = None
            return
        now = time.monotonic()
        if self._absent_since is None:
            self._absent_since = now
        elif now - self._absent_since > self._absent_timeout:
            raise NoWinnerConnectedError(
                f"none of the {len(self._node_ids)} winner(s) has been connected for "
                f"{now - self._absent_since:.1f} s (absent_timeout {self._absent_timeout:g} s): "
                "training cannot go on"
            )

    def get_nodes(self) -> list[NodeInfo]:
        """Return the underlying grid's ``NodeInfo`` of the view's nodes."""
        return [info for info in self._grid.get_nodes() if info.node_id in self._allowed]

    # --- Guarded sending -----------------------------------------------------------------------
    def create_message(  # pylint: disable=too-many-arguments,R0917
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        """Build a message to a node of the view with ``Message(...)``, as Flower's own grids do.

        ``Grid`` declares this method abstract, so the view has it; Flower deprecates it in favour of the
        ``Message`` constructor, and the view does not forward it (which would log Flower's deprecation notice).

        Raises
        ------
        ValueError
            If ``dst_node_id`` is not a node of the view.
        """
        self._check_destination(dst_node_id)
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Push messages, all of them to nodes of the view, or none at all.

        Raises
        ------
        ValueError
            If any message is addressed to a node outside the view (nothing is sent).
        """
        batch = self._checked(messages)
        return self._grid.push_messages(batch)

    def pull_messages(  # type: ignore[override]  # Flower 1.43's signature, which also takes 1.42's calls
        self,
        reply_to_message_ids: Iterable[str] | None = None,
        *,
        message_ids: Iterable[str] | None = None,
    ) -> Iterable[Message]:
        """Pull replies through the underlying grid; replies from nodes outside the view are not shown.

        Takes both of Flower's signatures: ``pull_messages(ids)`` (Flower 1.41, 1.42: ``message_ids``) and
        ``pull_messages(reply_to_message_ids=ids)`` or ``pull_messages(message_ids=ids)`` (Flower 1.43). With
        neither, every reply waiting (Flower 1.43's unfiltered pull, which the underlying grid must offer).

        Raises
        ------
        TypeError
            If both ``reply_to_message_ids`` and ``message_ids`` are given, or neither while the underlying
            grid's ``pull_messages`` needs message ids.
        """
        wanted = reply_filter(reply_to_message_ids, message_ids)
        pull: Callable[..., Iterable[Message]] = self._grid.pull_messages
        if wanted is not None:
            replies = pull(wanted)  # positional: message_ids (1.41, 1.42) and reply_to_message_ids (1.43) alike
        elif _pulls_unfiltered(type(self._grid)):
            replies = pull()
        else:
            raise TypeError(
                f"{type(self._grid).__name__}.pull_messages needs message ids (an unfiltered pull is Flower "
                f"1.43's; this is flwr {flwr.__version__}): pass the ids that push_messages returned"
            )
        return [reply for reply in replies if reply.metadata.src_node_id in self._allowed]

    def send_and_receive(
        self,
        messages: Iterable[Message],
        *,
        timeout: float | None = None,
    ) -> Iterable[Message]:
        """Send messages (all to nodes of the view, or none at all) and wait for the replies.

        The replies come back in the view's node order (see the notes of :class:`WinnersGrid`), a list.

        Raises
        ------
        ValueError
            If any message is addressed to a node outside the view (nothing is sent).
        """
        batch = self._checked(messages)
        replies = list(self._grid.send_and_receive(batch, timeout=timeout))
        if self._on_exchange is not None:
            self._on_exchange(batch, replies)
        position = {node: index for index, node in enumerate(self._node_ids)}
        return sorted(replies, key=lambda reply: position.get(reply.metadata.src_node_id, len(position)))

    # --- Delegated -----------------------------------------------------------------------------
    def set_run(self, run: Run) -> None:
        """Set the run of the underlying grid."""
        self._grid.set_run(run)

    @property
    def run(self) -> Run:
        """Run information of the underlying grid."""
        return self._grid.run

    def __getattr__(self, name: str) -> Any:
        """Delegate any other attribute (e.g. ``close``) to the underlying grid."""
        grid = self.__dict__.get("_grid")
        if grid is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(grid, name)

    def __repr__(self) -> str:
        """Return a short description of the view."""
        seeded = "seeded" if self._rng is not None else "unseeded"
        return f"WinnersGrid({type(self._grid).__name__}, node_ids={list(self._node_ids)}, {seeded})"

    # --- Helpers -------------------------------------------------------------------------------
    def _checked(self, messages: Iterable[Message]) -> list[Message]:
        """Materialise ``messages`` as a list and check every destination first."""
        batch = list(messages)
        for message in batch:
            self._check_destination(message.metadata.dst_node_id)
        return batch

    def _check_destination(self, node_id: int) -> None:
        if node_id not in self._allowed:
            raise ValueError(
                f"node {node_id} is not in this WinnersGrid (nodes: {sorted(self._allowed)}); "
                f"refusing to send it a message"
            )


def reply_filter(reply_to_message_ids: Iterable[str] | None, message_ids: Iterable[str] | None) -> list[str] | None:
    """The ids whose replies a ``Grid.pull_messages`` call asks for, from either of Flower's signatures.

    Parameters
    ----------
    reply_to_message_ids : Iterable[str] or None
        Flower 1.43's name, and the positional argument of every release (``message_ids`` before 1.43).
    message_ids : Iterable[str] or None
        Flower 1.43's keyword alias of ``reply_to_message_ids``.

    Returns
    -------
    list[str] or None
        The ids, or ``None`` for no filter (every reply waiting).

    Raises
    ------
    TypeError
        If both are given, or the ids are a single string.
    """
    if reply_to_message_ids is not None and message_ids is not None:
        raise TypeError("pull_messages takes reply_to_message_ids or message_ids (its alias), not both")
    ids = reply_to_message_ids if reply_to_message_ids is not None else message_ids
    if ids is None:
        return None
    if isinstance(ids, str):
        raise TypeError(f"pull_messages takes an iterable of message ids, got the single string {ids!r}")
    return list(ids)


@functools.cache
def _pulls_unfiltered(grid_type: type[Grid]) -> bool:
    """Whether ``grid_type.pull_messages`` can be called with no ids (Flower 1.43's signature; read once per type)."""
    parameters = list(inspect.signature(grid_type.pull_messages).parameters.values())[1:]  # after self
    return all(
        p.default is not inspect.Parameter.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters
    )


def _unique_node_ids(node_ids: Iterable[int]) -> tuple[int, ...]:
    """Node ids as plain ints, first occurrence kept."""
    seen: dict[int, None] = {}
    for node in node_ids:
        if isinstance(node, bool) or not isinstance(node, (int, np.integer)):
            raise TypeError(f"node ids must be ints, got {type(node).__name__}")
        seen.setdefault(int(node), None)
    return tuple(seen)
