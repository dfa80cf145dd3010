"""Include and exclude: nodes the buyer must train and nodes it never invites, and the auction's budget after them.

An *included* node trains outside the auction for a fixed payment the buyer states; the payments are charged
against the budget before the auction runs (:func:`auction_budget`: ``R' = R - sum``), so the auction over the
other nodes is the plain truthful, budget-feasible ``run_auction`` with ``R'`` and every payment together stays
within ``R``. An *excluded* node is never invited. Either list names nodes by id (an int) or by the tag a node
declares in its node config (a str: ``market-tag``, the node's own word; never all digits, so that a tag is never
read as an id). :func:`plan_membership` splits the connected nodes, by one rule for ids and tags alike: at a run's
first market a member that matches no connected node is an error; in a re-launch it is reported and skipped
(nodes come and go). Pure: no Flower.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

Member = int | str
"""A node id, or a tag (``market-tag``) that names every node declaring it."""

__all__ = [
    "INCLUDE_KEY",
    "EXCLUDE_KEY",
    "MembershipPlan",
    "Member",
    "auction_budget",
    "check_allow_list",
    "check_membership",
    "names_a_tag",
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
    unmatched : list[int | str]
        Members of either list that match no connected node (an id not connected, a tag no connected node
        declares); only a re-launch's plan has any (``strict=False``).
    """

    included: dict[int, float]
    invited: list[int]
    excluded: list[int]
    unmatched: list[Member] = field(default_factory=list)


def parse_node_ids(key: str, value: str) -> tuple[Member, ...]:
    """The members of a run-config list such as ``"12, 345, tag:partner"`` (``""``: none), each once, in order.

    Returns
    -------
    tuple[int | str, ...]
        Node ids as ints, tags (``tag:<label>``) as their label.

    Raises
    ------
    ValueError
        Naming ``key`` and the first entry that is neither a node id (a non-negative int) nor ``tag:<label>``,
        or one given twice.
    """
    if not isinstance(value, str):
        raise ValueError(f"run-config key {key}={value!r}: must be a str of comma-separated node ids, like '12, 345'")
    members: list[Member] = []
    for entry in (part.strip() for part in value.split(",")):
        if not entry and not value.strip():
            continue
        member: Member
        if entry.startswith("tag:") and entry[4:].strip():
            member = entry[4:].strip()
        elif entry.isdigit() and int(entry) < 2**64:
            member = int(entry)
        else:
            raise ValueError(
                f"run-config key {key}={value!r}: {entry!r} is neither a node id nor tag:<label> (comma-separated, "
                "like '12, 345, tag:partner'; `flwr ls` or the market log list the node ids)"
            )
        if member in members:
            raise ValueError(f"run-config key {key}={value!r}: {entry} is listed twice")
        members.append(member)
    return tuple(members)


def check_membership(include: Mapping[Member, float], exclude: Iterable[Member], budget: float) -> None:
    """Check the lists on their own: node ids or tags, payments ``>= 0`` and finite, no member in both, and budget
    left over for the auction even if each included tag names a single node.

    Raises
    ------
    TypeError
        A member that is neither an int nor a str, or a payment that is not a number.
    ValueError
        Naming the list (field and run-config key): a bad id, an empty tag, a tag that is all digits (``"5"``: node
        ids are ints), a bad payment, a member in both lists, or included payments that leave no budget for the
        auction.
    """
    for name, members in ((INCLUDE_KEY, list(include)), (EXCLUDE_KEY, list(exclude))):
        for member in members:
            if isinstance(member, str):
                if not member.strip():
                    raise ValueError(f"{name}: a tag must be a non-empty str")
                if member.strip().isdigit():
                    raise ValueError(
                        f"{name}: {member!r} is a str of digits, read as a tag, not as node {member.strip()}: give a "
                        f"node id as an int ({member.strip()}), and a tag as a word that is not all digits"
                    )
                continue
            if isinstance(member, bool) or not isinstance(member, int):
                raise TypeError(f"{name}: members must be node ids (int) or tags (str), got {member!r}")
            if not 0 <= member < 2**64:
                raise ValueError(f"{name}: {member} is not a node id (an int in [0, 2**64))")
    for member, payment in include.items():
        if isinstance(payment, bool) or not isinstance(payment, (int, float)):
            raise TypeError(f"{INCLUDE_KEY}: {member!r}'s payment must be a number, got {payment!r}")
        if not math.isfinite(payment) or payment < 0:
            raise ValueError(
                f"{INCLUDE_KEY}: {member!r}'s payment must be finite and >= 0 "
                f"(run config market-include-payment), got {payment}"
            )
    both = sorted(set(include) & set(exclude), key=str)
    if both:
        raise ValueError(f"{both} are in both {INCLUDE_KEY} and {EXCLUDE_KEY}: a node is one or the other")
    auction_budget(budget, include.values())  # each tag names one node at least: the smallest total it can be


def check_allow_list(allow: Iterable[int], include: Mapping[Member, float]) -> tuple[int, ...]:
    """The allow list (allow-list-only mode) as sorted unique node ids; every included id must be on it.

    Raises
    ------
    TypeError
        A member that is not an int (a tag cannot be allowed: it is learned by asking the node).
    ValueError
        An id out of range, or an included node id that is not allowed.
    """
    if isinstance(allow, (str, bytes)):
        raise TypeError(f"allow must be a collection of node ids, got {allow!r}")
    ids: set[int] = set()
    for member in allow:
        if isinstance(member, bool) or not isinstance(member, int):
            raise TypeError(
                f"allow: members must be node ids (int; a tag is learned by asking the node), got {member!r}"
            )
        if not 0 <= member < 2**64:
            raise ValueError(f"allow: {member} is not a node id (an int in [0, 2**64))")
        ids.add(member)
    outside = sorted(member for member in include if isinstance(member, int) and ids and member not in ids)
    if outside:
        raise ValueError(f"{INCLUDE_KEY}: node(s) {outside} are not on the allow list {sorted(ids)}")
    return tuple(sorted(ids))


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
    connected: Sequence[int],
    include: Mapping[Member, float],
    exclude: Iterable[Member],
    budget: float,
    tags: Mapping[int, str] | None = None,
    *,
    strict: bool = True,
) -> MembershipPlan:
    """Split ``connected`` into the included nodes, those the market invites, and those it never invites.

    One rule for ids and tags alike: a member of either list that matches no connected node (an id not connected,
    a tag no node in ``tags`` declares) is an error when ``strict`` (a run's first market: a typo must not let a node
    in, or leave one out), and is listed in :attr:`MembershipPlan.unmatched` otherwise (a re-launch: nodes come
    and go).

    Parameters
    ----------
    connected : Sequence[int]
        The nodes connected now.
    include, exclude
        The buyer's lists (node ids, or tags with ``tags``); an included node named by id and by a tag is paid
        its id's payment.
    budget : float
        ``R``.
    tags : Mapping[int, str], optional
        The declared tag of each connected node that was asked (needed when a list names a tag; a node excluded
        by id is never asked, and matches no tag).
    strict : bool (default: True)
        Whether a member that matches no connected node is an error.

    Raises
    ------
    ValueError
        With ``strict``, a member of either list (id or tag) that matches no connected node; a node both included
        and excluded (through a tag), included payments that leave no budget (each named with its list), or
        anything :func:`check_membership` refuses.
    """
    exclude = list(exclude)
    check_membership(include, exclude, budget)
    online, declared = set(connected), dict(tags or {})
    unmatched: list[Member] = []
    for name, members in ((INCLUDE_KEY, list(include)), (EXCLUDE_KEY, exclude)):
        ids = sorted(member for member in members if isinstance(member, int) and member not in online)
        labels = sorted(member for member in members if isinstance(member, str) and member not in declared.values())
        unmatched += [*ids, *labels]
        if strict and ids:
            raise ValueError(
                f"{name}: node(s) {ids} are not connected (connected: {sorted(online)}); "
                "check the ids in the market log or with `flwr ls`"
            )
        if strict and labels:
            raise ValueError(f"{name}: no connected node declares the tag(s) {labels} (node config market-tag)")
    included: dict[int, float] = {}
    for node in sorted(online):
        if node in include:
            included[node] = float(include[node])
        elif declared.get(node) in include:
            included[node] = float(include[declared[node]])
    excluded = {node for node in online if node in exclude or (node in declared and declared[node] in exclude)}
    both = sorted(set(included) & excluded)
    if both:
        raise ValueError(
            f"node(s) {both} are both included and excluded (through their tags {[declared.get(n) for n in both]}): "
            f"{INCLUDE_KEY} and {EXCLUDE_KEY} must not name one node"
        )
    auction_budget(budget, included.values())
    return MembershipPlan(
        included=included,
        invited=sorted(online - set(included) - excluded),
        excluded=sorted(excluded),
        unmatched=unmatched,
    )


def names_a_tag(include: Iterable[Member], exclude: Iterable[Member]) -> bool:
    """Whether either list names a tag (then the market asks the connected nodes for theirs first)."""
    return any(isinstance(member, str) for member in [*include, *exclude])
