"""wait_for_nodes: the bounded wait for a Grid's nodes that the market phase and S-FedAvg share."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
from flwr.serverapp import Grid

from flmarket_flwr.nodes import wait_for_nodes


class ScriptedGrid:
    """A grid whose ``get_node_ids()`` returns the next list of a script (the last one from then on)."""

    def __init__(self, script: Sequence[Sequence[Any]]) -> None:
        self.script = [list(nodes) for nodes in script]
        self.polls = 0

    def get_node_ids(self) -> list[Any]:
        nodes = self.script[min(self.polls, len(self.script) - 1)]
        self.polls += 1
        return nodes


def wait(grid: ScriptedGrid, target: int, timeout: float, **options: Any) -> list[int]:
    return wait_for_nodes(cast(Grid, grid), target, timeout, poll_interval=0.001, **options)


def test_returns_at_once_when_enough_nodes_are_connected() -> None:
    grid = ScriptedGrid([[7, 3, 5, 3]])
    assert wait(grid, 3, 60.0) == [3, 5, 7]  # ascending, duplicates gone
    assert grid.polls == 1


def test_polls_until_the_target_is_reached() -> None:
    grid = ScriptedGrid([[], [1], [1, 2], [1, 2, 3], [1, 2, 3, 4]])
    assert wait(grid, 3, 60.0) == [1, 2, 3]
    assert grid.polls == 4


def test_returns_what_is_there_at_the_deadline() -> None:
    grid = ScriptedGrid([[], [4]])
    started = time.monotonic()
    assert wait(grid, 3, 0.05) == [4]
    assert time.monotonic() - started < 5.0  # bounded, not forever
    assert wait(ScriptedGrid([[]]), 1, 0.0) == []  # timeout 0 looks once


def test_settle_waits_until_the_set_of_nodes_stops_changing() -> None:
    grid = ScriptedGrid([[1, 2], [1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 4]])
    assert wait(grid, 2, 60.0, settle=True) == [1, 2, 3, 4]
    assert grid.polls == 4
    # Without settle, the first poll with enough nodes ends the wait.
    assert wait(ScriptedGrid([[1, 2], [1, 2, 3]]), 2, 60.0) == [1, 2]


def test_settle_that_never_settles_ends_at_the_deadline() -> None:
    class Growing(ScriptedGrid):
        def get_node_ids(self) -> list[Any]:
            self.polls += 1
            return list(range(self.polls + 1))

    nodes = wait(Growing([]), 1, 0.05, settle=True)
    assert len(nodes) >= 2


def test_node_ids_come_back_as_python_ints() -> None:
    nodes = wait(ScriptedGrid([[np.uint64(2**63 + 5), np.int64(5)]]), 2, 0.0)
    assert nodes == [5, 2**63 + 5]
    assert all(type(node) is int for node in nodes)  # ConfigRecord and JSON take no numpy scalars
