"""Include and exclude: nodes the buyer must train and nodes it never invites, and the auction's budget after them.

An *included* node trains outside the auction for a fixed payment the buyer states; the payments are charged
against the budget before the auction runs (:func:`auction_budget`: ``R' = R - sum``), so the auction over the
other nodes is the plain truthful, budget-feasible ``run_auction`` with ``R'`` and every payment together stays
within ``R``. An *excluded* node is never invited. :func:`plan_membership` splits the connected nodes. Pure: no
Flower.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "INCLUDE_KEY",
    "EXCLUDE_KEY",
    "MembershipPlan",
    "auction_budget",
    "check_membership",
    "parse_node_ids",
    "plan_membership",
]

INCLUDE_KEY = "include (run config market-include)"
"""How errors name the include list: the ``MarketConfig`` field and the run-config key."""
EXCLUDE_KEY = "exclude (run config market-exclude)"
"""How errors name the exclude list."""


@dataclass(frozen=True)
class MembershipPlan:
    """The connected nodes split by the buyer's lists.

    Attributes
    ----------
    included : dict[int, float]
        Node id -> fixed payment, for the included nodes (they train; no PASS, no bid).
    invited : list[int]
        The nodes the market invites to PASS and the auction, ascending.
    excluded : list[int]
        Connected nodes never invited, ascending.
    """

    included: dict[int, float]
    invited: list[int]
    excluded: list[int]


def parse_node_ids(key: str, value: str) -> tuple[int, ...]:
    """The node ids of a run-config list such as ``"12, 345"`` (``""``: none), each once, in the order given.

    Raises
    ------
    ValueError
        Naming ``key`` and the first entry that is not a node id (a non-negative int), or one given twice.
    """
    if not isinstance(value, str):
        raise ValueError(f"run-config key {key}={value!r}: must be a str of comma-separated node ids, like '12, 345'")
    nodes: list[int] = []
    for entry in (part.strip() for part in value.split(",")):
        if not entry and not value.strip():
            continue
        if not entry.isdigit() or int(entry) >= 2**64:
            raise ValueError(
                f"run-config key {key}={value!r}: {entry!r} is not a node id (comma-separated ints, like '12, 345'; "
                "`flwr ls` or the market log list them)"
            )
        if int(entry) in nodes:
            raise ValueError(f"run-config key {key}={value!r}: node {entry} is listed twice")
        nodes.append(int(entry))
    return tuple(nodes)


def check_membership(include: Mapping[int, float], exclude: Iterable[int], budget: float) -> None:
    """Check the lists on their own: node ids, payments ``>= 0`` and finite, no node in both, budget left over.

    Raises
    ------
    TypeError
        A node id that is not an int, or a payment that is not a number.
    ValueError
        Naming the list (field and run-config key): a bad id or payment, a node in both lists, or included
        payments that leave no budget for the auction.
    """
    for name, nodes in ((INCLUDE_KEY, list(include)), (EXCLUDE_KEY, list(exclude))):
        for node in nodes:
            if isinstance(node, bool) or not isinstance(node, int):
                raise TypeError(f"{name}: node ids must be ints, got {node!r}")
            if not 0 <= node < 2**64:
                raise ValueError(f"{name}: {node} is not a node id (an int in [0, 2**64))")
    for node, payment in include.items():
        if isinstance(payment, bool) or not isinstance(payment, (int, float)):
            raise TypeError(f"{INCLUDE_KEY}: node {node}'s payment must be a number, got {payment!r}")
        if not math.isfinite(payment) or payment < 0:
            raise ValueError(
                f"{INCLUDE_KEY}: node {node}'s payment must be finite and >= 0 "
                f"(run config market-include-payment), got {payment}"
            )
    both = sorted(set(include) & set(exclude))
    if both:
        raise ValueError(f"node(s) {both} are in both {INCLUDE_KEY} and {EXCLUDE_KEY}: a node is one or the other")
    auction_budget(budget, include.values())


def auction_budget(budget: float, included_payments: Iterable[float]) -> float:
    """``R' = R - sum(included payments)``, the budget left for the auction.

    Raises
    ------
    ValueError
        If the included payments leave nothing (``R' <= 0``), naming the include list.
    """
    payments = list(included_payments)
    left = float(budget) - math.fsum(payments)
    if not left > 0:
        raise ValueError(
            f"{INCLUDE_KEY}: the included nodes' fixed payments sum to {math.fsum(payments):.6g}, which leaves no "
            f"budget for the auction (budget {budget:.6g}): lower market-include-payment, include fewer nodes, or "
            "raise the budget"
        )
    return left


def plan_membership(
    connected: Sequence[int], include: Mapping[int, float], exclude: Iterable[int], budget: float
) -> MembershipPlan:
    """Split ``connected`` into the included nodes, those the market invites, and those it never invites.

    Raises
    ------
    ValueError
        An included or excluded node that is not connected (named with its list), or anything
        :func:`check_membership` refuses.
    """
    excluded = set(exclude)
    check_membership(include, excluded, budget)
    online = set(connected)
    for name, nodes in ((INCLUDE_KEY, set(include)), (EXCLUDE_KEY, excluded)):
        unknown = sorted(nodes - online)
        if unknown:
            raise ValueError(
                f"{name}: node(s) {unknown} are not connected (connected: {sorted(online)}); "
                "check the ids in the market log or with `flwr ls`"
            )
    return MembershipPlan(
        included={node: float(include[node]) for node in sorted(include)},
        invited=sorted(online - set(include) - excluded),
        excluded=sorted(excluded),
    )
