"""Waiting, bounded, for the nodes of a Flower ``Grid``: the one copy the market phase and S-FedAvg share.

In simulation ``grid.get_node_ids()`` is empty when the ``ServerApp`` starts, and Flower's own strategies
wait for nodes forever. :func:`wait_for_nodes` polls until enough are connected or a deadline passes and
returns what it saw; what too few nodes mean (an error, a warning) is the caller's decision.
"""

from __future__ import annotations

import time
from logging import INFO

from flwr.serverapp import Grid
from flwr.supercore import log

__all__ = ["connected_nodes", "wait_for_nodes"]


def connected_nodes(grid: Grid) -> list[int]:
    """Return the ids of the nodes ``grid`` sees now, as Python ints, ascending, without duplicates."""
    return sorted({int(node) for node in grid.get_node_ids()})


def wait_for_nodes(
    grid: Grid,
    target: int,
    timeout: float,
    *,
    poll_interval: float = 1.0,
    settle: bool = False,
    stall_timeout: float | None = None,
    who: str = "Server",
) -> list[int]:
    """Poll ``grid`` until ``target`` nodes are connected or ``timeout`` seconds have passed.

    Parameters
    ----------
    grid : Grid
        The grid whose ``get_node_ids()`` is polled.
    target : int
        Number of connected nodes to wait for.
    timeout : float
        Seconds to wait at most (0: look once).
    poll_interval : float (default: 1.0)
        Seconds between two polls (the last sleep is cut short at the deadline).
    settle : bool (default: False)
        Once ``target`` nodes are connected, go on polling until the set of nodes is the same at two
        polls in a row (or the deadline), so that nodes still joining are not left out.
    stall_timeout : float, optional
        Give up early when some nodes but fewer than ``target`` are connected and their set has not
        changed for this many seconds (a simulated federation connects at once: waiting longer for a
        node that does not exist only delays the error). ``None``: wait until ``timeout``.
    who : str (default: "Server")
        Name to log the wait under (one line when the wait starts and one each time the count changes).

    Returns
    -------
    list[int]
        The ids of the nodes connected at the last poll, ascending; fewer than ``target`` when the
        deadline passed first.
    """
    deadline = time.monotonic() + timeout
    nodes = connected_nodes(grid)
    changed_at = time.monotonic()
    logged: int | None = None
    while True:
        enough = len(nodes) >= target
        now = time.monotonic()
        stalled = stall_timeout is not None and 0 < len(nodes) < target and now - changed_at >= stall_timeout
        if (enough and not settle) or now >= deadline or stalled:
            return nodes
        if not enough and logged != len(nodes):
            log(INFO, "%s: waiting for nodes (%d connected, %d wanted)", who, len(nodes), target)
            logged = len(nodes)
        time.sleep(min(poll_interval, max(deadline - time.monotonic(), 0.0)))
        latest = connected_nodes(grid)
        if enough and latest == nodes:
            return nodes
        if latest != nodes:
            changed_at = time.monotonic()
        nodes = latest
