"""``market.json`` while the run is under way: written before the market starts, rewritten at each market step.

Flower can end a ServerApp at any moment (a lost heartbeat, ``flwr stop``) without our code running again: the
file then says how far the market got. When the market ends it holds the market's outcome, which the run's final
record (:func:`flmarket_flwr.app.results.save_results`) replaces at the end.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from flwr.app import Message, RecordDict
from flwr.proto.node_pb2 import NodeInfo  # pylint: disable=E0611
from flwr.serverapp import Grid
from flwr.supercore.run import Run

from flmarket_flwr.market import MarketOutcome
from flmarket_flwr.market.wire.messages import ACTIONS, message_type

__all__ = ["MarketProgress", "ProgressGrid"]

MARKET_TYPES = frozenset(message_type(action) for action in ACTIONS)
"""The message types of the market's steps (``query.market_advertise``, ...)."""
UNFINISHED = (
    "the market had not finished when this file was last written: if the run is over, Flower ended the ServerApp "
    "first (a lost heartbeat, `flwr stop`; `flwr ls` shows the run's status, the SuperLink's log why)"
)


class MarketProgress:
    """The run's ``market.json`` until the market's outcome is known.

    Parameters
    ----------
    path : Path
        The file (``<run dir>/market.json``).
    budget : float
        The market's budget, recorded from the start.
    outcome : Callable[[], MarketOutcome | None]
        Returns the market's outcome once there is one (``lambda: strategy.market_outcome``).
    """

    def __init__(self, path: Path, budget: float, outcome: Callable[[], MarketOutcome | None]) -> None:
        self.path, self.budget, self._outcome = path, budget, outcome
        self.steps: list[dict[str, Any]] = []
        self.done = False
        self._started = time.monotonic()

    def begin(self) -> None:
        """Write the file before anything that Flower can end: the market has not begun."""
        self._write({"status": "running", "step": "waiting for nodes", "reason": UNFINISHED})

    def saw(self, types: Iterable[str]) -> None:
        """Messages of ``types`` are going out: a new market step is logged and written; the first message that is
        not the market's means that the market is over, and its outcome is written."""
        if self.done:
            return
        for kind in types:
            if kind in MARKET_TYPES:
                step = kind.split(".", 1)[1]
                if not self.steps or self.steps[-1]["step"] != step:
                    self.steps.append({"step": step, "at_s": round(time.monotonic() - self._started, 3)})
                    self._write({"status": "running", "step": step, "reason": UNFINISHED})
            elif (outcome := self._outcome()) is not None:
                self.finish(outcome)
                return

    def finish(self, outcome: MarketOutcome) -> None:
        """Write the market's outcome (with the steps seen); later messages change nothing."""
        self.done = True
        self._write(outcome.to_dict(), keep_budget=False)

    def interrupted(self, err: BaseException) -> None:
        """The ServerApp stops before the market's outcome: Flower ends it (``KeyboardInterrupt``, ``SystemExit``), or
        an error that is not the market's own."""
        if self.done:
            return
        step = self.steps[-1]["step"] if self.steps else "waiting for nodes"
        reason = f"the ServerApp stopped during {step} ({type(err).__name__}: {err or 'no message'})"
        self._write({"status": "ended", "step": step, "reason": reason})

    def _write(self, record: dict[str, Any], keep_budget: bool = True) -> None:
        content = {**record, **({"budget": self.budget} if keep_budget else {}), "steps": list(self.steps)}
        partial = self.path.with_suffix(".json.partial")
        partial.write_text(json.dumps(content, indent=2, default=str) + "\n", encoding="utf-8")
        partial.replace(self.path)  # never a half-written file, whenever the process is ended


class ProgressGrid(Grid):
    """A ``Grid`` that passes everything to ``grid`` and tells ``on_send`` the message types of what goes out."""

    def __init__(self, grid: Grid, on_send: Callable[[list[str]], None]) -> None:
        self._grid, self._on_send = grid, on_send

    def set_run(self, run: Run) -> None:
        """Set the run of the underlying grid."""
        self._grid.set_run(run)

    @property
    def run(self) -> Run:
        """Run information of the underlying grid."""
        return self._grid.run

    def create_message(  # pylint: disable=too-many-arguments,R0917
        self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str, ttl: float | None = None
    ) -> Message:
        """Build the message with ``Message(...)``, as Flower's own grids do (the method is deprecated)."""
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        """The underlying grid's node ids."""
        return self._grid.get_node_ids()

    def get_nodes(self) -> Iterable[NodeInfo]:
        """The underlying grid's nodes."""
        return self._grid.get_nodes()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Report the messages' types, then push them."""
        batch = list(messages)
        self._on_send([message.metadata.message_type for message in batch])
        return self._grid.push_messages(batch)

    def pull_messages(self, *args: Any, **kwargs: Any) -> Iterable[Message]:
        """Pull through the underlying grid, with whichever of Flower's signatures the caller uses."""
        return self._grid.pull_messages(*args, **kwargs)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        """Report the messages' types, then send them and wait for the replies."""
        batch = list(messages)
        self._on_send([message.metadata.message_type for message in batch])
        return self._grid.send_and_receive(batch, timeout=timeout)

    def __getattr__(self, name: str) -> Any:
        """Delegate any other attribute (e.g. ``close``) to the underlying grid."""
        grid = self.__dict__.get("_grid")
        if grid is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(grid, name)
