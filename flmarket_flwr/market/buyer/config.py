"""The market phase's settings (:class:`MarketConfig`) and its result (:class:`MarketOutcome`)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from flmarket_flwr.market.buyer.membership import Member, check_allow_list, check_membership
from flmarket_flwr.market.wire.ledger import RosterHistory
from flmarket_flwr.market.wire.profiles import (
    PROFILE_DROPOUT,
    SECURITY_PROFILES,
    profile_colluders,
    profile_roster_floor,
)
from flmarket_flwr.pass_protocol import MIN_PARTICIPANTS, IdentityDirectory, PassError, SkellamNoise
from flmarket_flwr.pass_protocol.graph_parameters import DEFAULT_SECURITY_BITS
from flmarket_flwr.pass_protocol.noise import SECURE_PROFILE_DELTA, SECURE_PROFILE_EPSILON
from flmarket_flwr.pass_protocol.sparse_secure import DEFAULT_MARKETS, SparseSecureSettings, sparse_costs_less
from flmarket_flwr.pricing.auction import VALUE_RANGE, rule_budget

__all__ = ["DEFAULT_COUNT_BOUND", "MarketConfig", "MarketOutcome", "PassSession"]

DEFAULT_COUNT_BOUND = 10**9
"""Default declared maximum of one client's count of one class."""
DEFAULT_PASS_RERUNS: Final = 2
""":attr:`MarketConfig.pass_reruns` outside the secure profile."""


@dataclass(frozen=True)
class MarketConfig:
    """Configuration of the market phase.

    Parameters
    ----------
    budget : float
        Budget ``R > 0`` of the reverse auction. The payments sum to at most ``R``, in every mode. Given to
        ``FLMarket``, it is the run's: each re-launch runs with a copy whose ``budget`` is what is left of it.
    num_classes : int
        Number of classes ``C`` (length of every label-count vector).
    num_winners : int, optional
        Cohort cap: at most ``num_winners`` winners, the head of the budget-feasible walk (see
        :func:`flmarket_flwr.pricing.run_auction`); fewer win when the budget binds. ``None``
        (default): the budget alone decides. More than the connected nodes is an error.
    budget_rule : {"half", "whole"} (default: "half")
        The auction's budget rule (:data:`flmarket_flwr.pricing.BUDGET_RULES`): ``"half"``, Algorithm 1 as the
        paper states it, whose payments add up to at most ``R/2``; ``"whole"``, the same walk at the whole budget,
        whose payments add up to at most ``R`` (both truthful and individually rational; docs/mechanism.md). Part of
        the terms announced before PASS and signed in the award: every node re-runs this rule when it checks it.
    min_clients : int (default: 3)
        Fewest PASS survivors accepted; at least 3 (with 2, each learns the other's counts).
    min_participation : float (default: 0.5)
        Fraction of the invited nodes that must still be bidders after the bid step; below it the market
        fails, naming who was excluded and why, rather than buy from a minority (a thin market). In ``(0, 1]``.
    timeout : float (default: 60.0)
        Base seconds one message round may take, whatever the transport does underneath.
    timeout_per_node : float (default: 1.0)
        Seconds added to a round's deadline per node it addresses (:meth:`step_timeout`): a large federation
        on busy machines needs longer to answer, and a fixed deadline timed most of it out.
    wait_for_nodes_timeout : float (default: 120.0)
        Longest wait for nodes to connect before the market starts.
    stall_timeout : float (default: 5.0)
        The wait ends early, with an error that names the fix, when some nodes but fewer than
        ``min_clients`` are connected and none has joined for this many seconds (a simulation's
        federation connects at once). Raise it for a deployment whose SuperNodes start slowly.
    expected_nodes : int, optional
        Wait until this many nodes are connected (bounded by ``wait_for_nodes_timeout``).
        ``None``: wait until ``min_clients`` are connected and their number has not changed
        for one ``poll_interval``.
    session_label : str (default: "flmarket")
        Label prefixed to the PASS session id (binds the masks to this application).
    poll_interval : float (default: 1.0)
        Seconds between two node-count polls while waiting for nodes.
    count_bound : int (default: 10**9)
        Declared maximum of any one client's count of any one class, announced before masking.
        A client with a larger count refuses to take part; an unmasked sum with a class above
        ``count_bound * E`` is rejected (:class:`MarketError`), never used.
    neighbours : int or str (default: "auto")
        PASS masking graph: ``"all"`` masks with every other client (the paper's PASS), an int
        ``k`` with ``k`` neighbours of a random graph, ``"auto"`` picks ``k`` from the number of
        clients (:func:`flmarket_flwr.pass_protocol.graph.neighbourhood_size`; the complete graph for small E). In
        the secure profile: ``"auto"`` the cheaper of the complete graph and the sparse secure mode
        (:meth:`runs_sparse`), ``"all"`` the complete graph, ``"sparse"`` the sparse secure mode wherever its degree
        is below ``E - 1``, even where it costs more.
    directory : IdentityDirectory, optional
        The buyer's directory of client identity keys (node id -> Ed25519 public key). With it the
        server drops any unsigned or wrongly signed key advertisement; the clients check their
        neighbours' signatures themselves against their own copy.
    audit_winners : bool (default: True)
        Whether each winner must open its PASS counts commitment to the buyer, so that a false
        score is caught before anyone is paid. Winners then disclose their counts to the buyer
        (losers never do); with ``False`` every score is the client's word (see the threat model).
    noise : SkellamNoise, optional
        Distributed differential privacy on ``N_s`` (:mod:`flmarket_flwr.pass_protocol.noise`): the clients
        add Skellam noise before masking (their own setting, :func:`register_market_handlers`'s ``noise``;
        set both the same). Here it widens the bound checks by the noise's tail, and ``N_s`` is clipped
        below at 0 before it is scored. ``None`` (default): exact counts.
    security : {"semi-honest", "malicious"} (default: "semi-honest")
        The buyer's side of the secure profile. ``"malicious"`` needs ``directory`` (the one the nodes pin); with
        ``neighbours="auto"`` it runs PASS's sparse secure mode (each client draws its own out-neighbours, with
        the degree the nodes' parameter finder gives for :attr:`sparse_settings`) where that costs less than the
        complete graph (:meth:`runs_sparse`), and the complete graph otherwise; ``"all"``: always the complete
        graph; ``"sparse"``: the sparse mode wherever the finder's degree is below ``E - 1``; a fixed degree is
        refused (the buyer would place the graph). It announces noise on the
        counts
        (``noise`` defaults to epsilon 1 per release, delta 1e-6), which nodes in the profile add whatever the
        buyer announces. The nodes' side (identity keys, a pinned directory, roster floor, split tolerance,
        budget, ledger) is each node's own: node config ``market-security=malicious``.
    roster_history : RosterHistory, optional
        The buyer's record of its earlier markets' PASS members. With it the market leaves out, before PASS,
        the few connected clients whose presence would let this sum be differenced with an earlier one to
        fewer than ``min_roster_change`` clients (:func:`~flmarket_flwr.market.wire.ledger.plan_roster`: the
        clients' release ledgers would refuse the whole market), and records its own members after PASS.
    pass_reruns : int or "auto" (default: "auto")
        How many times a PASS session that fails closed before any unmask request (no sum released: no client
        has sent a share of any secret) is run again, as a fresh session without every client it named (a
        client garbling its shares, a dealer whose key cannot be rebuilt, a dropout). A named client is in no
        later session, so it is named once; a session may name several. ``"auto"``: 2, and in the secure profile
        the colluding clients it assumes, :attr:`pass_colluders` (by default :func:`.profile_colluders` of the
        directory, a fifth, rounded up, as the nodes' ``pass-colluders``): ``c`` re-runs let PASS finish despite
        ``c`` colluders taking turns to stop it, while the nodes' roster floors and privacy budgets allow. A
        failure after the unmask request, too few clients left, or a session that names nobody stops the market
        at once. Each session is a full PASS run, bounded by ``timeout`` per round, and each that reached the
        mask round is charged to the honest nodes' release ledgers (write-ahead) though it released nothing
        (docs/threat-model.md). Resolved to an int here.
    pass_markets : int (default: 65,536)
        The sparse secure mode: the markets over a node's life its degrees are sized for (announced with the other
        settings; the nodes' ``pass-markets``, the same default, refuse fewer placements than their own).
    buyer_key : Ed25519PrivateKey, optional
        The buyer's signing key. Its public half is announced with the market's terms (budget, cohort cap)
        in the PASS advertisement, and it signs the award (:mod:`flmarket_flwr.market.wire.award`), which the
        clients check and endorse before any winner opens its counts. Nodes may pin its public half
        (node config ``market-buyer-key``) and then refuse any other. ``None`` (default): a fresh key per
        market, its public half logged.
    include : Mapping[int | str, float], optional
        Nodes that must train, by node id (an int) or by the tag they declare (a str: node config
        ``market-tag``, the node's own word) -> the fixed payment each is paid
        (:mod:`~flmarket_flwr.market.buyer.membership`). They take no part in PASS or the auction; their payments are
        charged against ``budget`` before the auction runs, which then runs over the other nodes with
        ``R' = budget - sum(payments)`` (so it stays truthful, and all payments together stay within
        ``budget``); the award records them. Each must match a connected node when the market runs (a re-launch
        logs and skips one that does not). A tag is never all digits. Default: none.
    exclude : tuple[int | str, ...], optional
        Nodes the market never invites, by id (never sent any message) or by tag (asked its tag once); each must
        match a connected node when the market runs, as for ``include`` (a typo is an error).
        A node in both lists, or included payments that leave no budget, is a ``ValueError`` naming the list.
    allow : tuple[int, ...], optional
        Allow-list-only mode: when given, the market sends messages to these node ids only (ids, not tags: a tag is
        learned by asking the node); every other connected node is sent nothing, not even the tags query, and
        never trains. An allowed node need not be connected (the market runs among those that are); an included
        node named by id must be allowed. Default: ``()``, every connected node may be invited.
    """

    budget: float
    num_classes: int
    num_winners: int | None = None
    budget_rule: str = "half"
    min_clients: int = MIN_PARTICIPANTS
    min_participation: float = 0.5
    timeout: float = 60.0
    timeout_per_node: float = 1.0
    wait_for_nodes_timeout: float = 120.0
    stall_timeout: float = 5.0
    expected_nodes: int | None = None
    session_label: str = "flmarket"
    poll_interval: float = 1.0
    count_bound: int = DEFAULT_COUNT_BOUND
    neighbours: int | str = "auto"
    directory: IdentityDirectory | None = None
    audit_winners: bool = True
    noise: SkellamNoise | None = None
    roster_history: RosterHistory | None = None
    security: str = "semi-honest"
    pass_reruns: int | str = "auto"
    pass_colluders: int | str = "auto"
    pass_min_participants: int | str = "auto"
    pass_dropout: float = PROFILE_DROPOUT
    pass_security_bits: int = DEFAULT_SECURITY_BITS
    pass_markets: int = DEFAULT_MARKETS
    buyer_key: Ed25519PrivateKey | None = None
    include: Mapping[Member, float] = field(default_factory=dict)
    exclude: tuple[Member, ...] = ()
    allow: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        """Validate every field; apply the secure profile's settings (``security="malicious"``)."""
        if self.security not in SECURITY_PROFILES:
            raise ValueError(f"security must be one of {list(SECURITY_PROFILES)}, got {self.security!r}")
        for name, minimum in (("pass_colluders", 0), ("pass_min_participants", MIN_PARTICIPANTS), ("pass_reruns", 0)):
            _check_count_or_auto(name, getattr(self, name), minimum)  # before the profile derives one from another
        if self.security == "malicious":
            if self.neighbours not in ("auto", "all", "sparse"):
                raise ValueError(
                    f"security='malicious' runs PASS on the complete graph or on a graph the clients draw: neighbours "
                    f"must be 'auto', 'all' or 'sparse', got {self.neighbours!r} (on a graph the server places it can "
                    "seat a client among colluders)"
                )
            if self.directory is None:
                raise ValueError(
                    "security='malicious' needs the directory of the nodes' identity keys (MarketConfig.directory; "
                    "run config identity-directory; FLMarket(..., directory=...)): the same directory the nodes pin, "
                    "against which the buyer checks signatures and names the clients that break the protocol"
                )
            size = self.directory.members
            if self.pass_colluders == "auto":
                object.__setattr__(self, "pass_colluders", profile_colluders(size))
            if self.pass_min_participants == "auto":
                object.__setattr__(self, "pass_min_participants", profile_roster_floor(size, MIN_PARTICIPANTS))
            if self.pass_reruns == "auto":  # c re-runs: PASS finishes despite c colluders taking turns to stop it
                object.__setattr__(self, "pass_reruns", self.pass_colluders)
            if self.noise is None:
                object.__setattr__(self, "noise", SkellamNoise(SECURE_PROFILE_EPSILON, SECURE_PROFILE_DELTA))
        check_positive_number("budget", self.budget)
        if not VALUE_RANGE[0] <= self.budget <= VALUE_RANGE[1]:
            raise ValueError(f"budget must be within [{VALUE_RANGE[0]:g}, {VALUE_RANGE[1]:g}], got {self.budget}")
        check_int("num_classes", self.num_classes, minimum=1)
        if self.num_winners is not None:
            check_int("num_winners", self.num_winners, minimum=1)
        rule_budget(self.budget, self.budget_rule)  # a ValueError naming the rules, for any other value
        check_int("min_clients", self.min_clients, minimum=MIN_PARTICIPANTS)
        check_positive_number("min_participation", self.min_participation)
        if self.min_participation > 1:
            raise ValueError(f"min_participation must be in (0, 1], got {self.min_participation}")
        check_positive_number("timeout", self.timeout)
        check_positive_number("timeout_per_node", self.timeout_per_node, allow_zero=True)
        check_positive_number("wait_for_nodes_timeout", self.wait_for_nodes_timeout, allow_zero=True)
        check_positive_number("stall_timeout", self.stall_timeout)
        if self.expected_nodes is not None:
            check_int("expected_nodes", self.expected_nodes, minimum=self.min_clients)
        if not isinstance(self.session_label, str) or not self.session_label:
            raise ValueError(f"session_label must be a non-empty str, got {self.session_label!r}")
        check_positive_number("poll_interval", self.poll_interval)
        check_int("count_bound", self.count_bound, minimum=1)
        if self.neighbours == "sparse" and self.security != "malicious":
            raise ValueError(
                "neighbours='sparse' is the secure profile's sparse mode (each client draws its own out-neighbours): "
                "it needs security='malicious'"
            )
        if self.neighbours not in ("auto", "all", "sparse"):
            check_int("neighbours", self.neighbours, minimum=2)
        if not isinstance(self.audit_winners, bool):
            raise TypeError(f"audit_winners must be a bool, got {type(self.audit_winners).__name__}")
        if self.noise is not None and not isinstance(self.noise, SkellamNoise):
            raise TypeError(f"noise must be a SkellamNoise or None, got {type(self.noise).__name__}")
        if self.roster_history is not None and not isinstance(self.roster_history, RosterHistory):
            raise TypeError(f"roster_history must be a RosterHistory, got {type(self.roster_history).__name__}")
        if self.pass_reruns == "auto":
            object.__setattr__(self, "pass_reruns", DEFAULT_PASS_RERUNS)
        if isinstance(self.pass_reruns, str):
            raise ValueError(f'pass_reruns must be an int >= 0 or "auto", got {self.pass_reruns!r}')
        check_int("pass_reruns", self.pass_reruns, minimum=0)
        for name in ("pass_colluders", "pass_min_participants"):  # "auto" left outside the secure profile: unused
            value = getattr(self, name)
            if value != "auto":
                check_int(name, value, minimum=0 if name == "pass_colluders" else MIN_PARTICIPANTS)
        if isinstance(self.pass_dropout, bool) or not isinstance(self.pass_dropout, (int, float)):
            raise TypeError(f"pass_dropout must be a float, got {type(self.pass_dropout).__name__}")
        if not 0.0 <= self.pass_dropout < 1.0:
            raise ValueError(f"pass_dropout must be in [0, 1), got {self.pass_dropout}")
        check_int("pass_security_bits", self.pass_security_bits, minimum=1)
        check_int("pass_markets", self.pass_markets, minimum=1)
        if self.buyer_key is not None and not isinstance(self.buyer_key, Ed25519PrivateKey):
            raise TypeError(f"buyer_key must be an Ed25519PrivateKey or None, got {type(self.buyer_key).__name__}")
        object.__setattr__(self, "include", dict(self.include))
        check_membership(self.include, list(self.exclude), self.budget)
        ids, tags = (
            sorted({m for m in self.exclude if isinstance(m, int)}),
            sorted({m for m in self.exclude if isinstance(m, str)}),
        )
        object.__setattr__(self, "exclude", (*ids, *tags))
        object.__setattr__(self, "allow", check_allow_list(self.allow, self.include))

    @property
    def sparse_settings(self) -> SparseSecureSettings | None:
        """The settings the sparse secure mode announces (``None``: the mode is off: outside the secure profile, or
        ``neighbours="all"``)."""
        if self.security != "malicious" or self.neighbours not in ("auto", "sparse"):
            return None
        return SparseSecureSettings.of(
            colluders=int(self.pass_colluders),
            roster_floor=int(self.pass_min_participants),
            dropout=float(self.pass_dropout),
            reruns=int(self.pass_reruns),
            security_bits=int(self.pass_security_bits),
            markets=int(self.pass_markets),
        )

    def runs_sparse(self, invited: int) -> bool:
        """Whether PASS over ``invited`` clients runs in the sparse secure mode: :attr:`sparse_settings` is on, the
        finder's degree ``k`` for that roster is below the complete graph's and, with ``neighbours="auto"``, the
        sparse mode costs less there (:func:`~flmarket_flwr.pass_protocol.sparse_secure.sparse_costs_less`: a
        client's out- and in-neighbours below half the roster); ``neighbours="sparse"`` takes it wherever ``k`` is
        below ``E - 1``. A roster the finder refuses, below the floor: the complete graph, which the nodes then refuse
        or run."""
        settings = self.sparse_settings
        if settings is None:
            return False
        try:
            degree = settings.parameters(invited).degree
        except PassError:
            return False
        if self.neighbours == "sparse":
            return degree < invited - 1
        return sparse_costs_less(invited, degree)

    def step_timeout(self, num_nodes: int) -> float:
        """Seconds a message round to ``num_nodes`` nodes may take: ``timeout + timeout_per_node * num_nodes``."""
        return self.timeout + self.timeout_per_node * num_nodes

    @property
    def noise_tolerance(self) -> int:
        """How far the noise may move a class of ``N_s`` in the bound checks (0 without noise)."""
        return 0 if self.noise is None else self.noise.tail_bound()


@dataclass(frozen=True)
class PassSession:
    """One PASS session of a market: whom it invited and how it ended.

    Attributes
    ----------
    session : str
        The session id, hex.
    roster : list[int]
        Node ids invited to it, ascending.
    result : str
        ``"released"`` (its sum was released), else why it stopped.
    named : list[int]
        Node ids it excluded (each with its reason in :attr:`MarketOutcome.excluded`), left out of the next;
        not those that withdrew only because named senders garbled their shares to them (taken back).
    """

    session: str
    roster: list[int]
    result: str
    named: list[int]


@dataclass
class MarketOutcome:
    """Result of the market phase.

    Attributes
    ----------
    winners : list[int]
        Node ids of the winners, in the auction's selection order.
    participants : list[int]
        Node ids of the final award's bidders (valid score and bid, not caught lying, not a winner that refused
        to endorse), ascending; a loser that did not endorse stays one, its reason in ``excluded``.
    scores, bids, payments : dict[int, float]
        Per bidder (payments are ``0.0`` for losers, each at most ``budget``).
    total_payment : float
        Sum of the payments.
    budget : float
        The budget ``R``.
    budget_rule : str
        The auction's budget rule (:attr:`MarketConfig.budget_rule`); :attr:`paid_share` is what it spent of ``R``.
    global_counts : list[int]
        ``N_s``, the per-class label counts summed over the PASS survivors (with :attr:`MarketConfig.noise`:
        plus the clients' noise, clipped below at 0).
    excluded : dict[int, str]
        Node id -> reason, for every node left out at some step.
    timings : dict[str, float]
        Seconds per step (``wait_for_nodes``, ``pass``, ``bid``, ``auction``, ``award``) and ``total``.
    pass_participants : list[int]
        Node ids whose counts are in ``global_counts`` (``E`` = their number), ascending.
    num_winners : int or None
        The cohort cap, or ``None`` when the budget alone decides.
    award_acknowledged : list[int]
        Bidders that acknowledged their award message.
    audited : list[int]
        Winners whose opened counts matched their commitment and their claimed score.
    status : str
        ``"succeeded"`` (it bought a cohort), ``"failed"`` for a market that stopped or bought nobody (:meth:`failed`:
        no winner, no payment; the scores and bids it received are kept), or ``"skipped"`` for a re-launch that never
        ran (known before any message).
    reason : str
        Why a market failed or was skipped (``""`` when it succeeded).
    invited : list[int]
        Node ids the market invited to PASS (after any roster plan), ascending.
    pass_sessions : list[PassSession]
        Every PASS session run, in order: more than one when a session failed before releasing anything
        and was run again without the clients it named (:attr:`MarketConfig.pass_reruns`).
    award_digest : bytes
        SHA-256 of the final buyer-signed award (:class:`~flmarket_flwr.market.wire.award.Award`) that every
        contacted node was sent; ``b""`` if none was made.
    included : dict[int, float]
        The nodes the buyer included (:attr:`MarketConfig.include`) -> their fixed payment, also in ``payments``
        and ``total_payment``; they train with the winners (:attr:`cohort`) but took no part in the auction.
    """

    winners: list[int]
    participants: list[int]
    scores: dict[int, float]
    bids: dict[int, float]
    payments: dict[int, float]
    total_payment: float
    budget: float
    global_counts: list[int]
    excluded: dict[int, str]
    timings: dict[str, float]
    pass_participants: list[int] = field(default_factory=list)
    num_winners: int | None = None
    award_acknowledged: list[int] = field(default_factory=list)
    audited: list[int] = field(default_factory=list)
    pass_sessions: list[PassSession] = field(default_factory=list)
    status: str = "succeeded"
    reason: str = ""
    invited: list[int] = field(default_factory=list)
    included: dict[int, float] = field(default_factory=dict)
    budget_rule: str = "half"

    @classmethod
    def failed(  # pylint: disable=too-many-arguments
        cls,
        reason: str,
        budget: float,
        invited: list[int],
        excluded: dict[int, str],
        timings: dict[str, float],
        *,
        status: str = "failed",
        budget_rule: str = "half",
    ) -> MarketOutcome:
        """The record of a market that stopped (``status="skipped"``: one that never ran, known before any message):
        nobody won or is paid; who was excluded at which step, and why."""
        return cls(
            winners=[],
            participants=[],
            scores={},
            bids={},
            payments={},
            total_payment=0.0,
            budget=float(budget),
            global_counts=[],
            excluded=dict(excluded),
            timings=dict(timings),
            status=status,
            reason=reason,
            invited=sorted(invited),
            budget_rule=budget_rule,
        )

    def exclusion_summary(self) -> str:
        """How many nodes each step excluded, e.g. ``"3 at market_advertise, 1 at market_bid"`` (``""`` if none)."""
        by_step: dict[str, int] = {}
        for reason in self.excluded.values():
            step = reason.split(":", 1)[0]
            by_step[step] = by_step.get(step, 0) + 1
        return ", ".join(f"{count} at {step}" for step, count in by_step.items())

    award_digest: bytes = b""

    @property
    def cohort(self) -> list[int]:
        """The nodes that train: the included nodes (ascending), then the winners in selection order."""
        return sorted(self.included) + [node for node in self.winners if node not in self.included]

    @property
    def within_budget(self) -> bool:
        """Whether the total payment is within the budget (always in budget mode)."""
        return self.total_payment <= self.budget * (1.0 + 1e-12)

    @property
    def paid_share(self) -> float:
        """The total payment over the budget ``R``: at most 1/2 under the paper's rule, at most 1 under ``"whole"``."""
        return self.total_payment / self.budget

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python form (int node-id keys; :meth:`save_json` writes them as strings)."""
        return {
            "status": self.status,
            "reason": self.reason,
            "invited": list(self.invited),
            "winners": list(self.winners),
            "included": dict(self.included),
            "participants": list(self.participants),
            "pass_participants": list(self.pass_participants),
            "scores": dict(self.scores),
            "bids": dict(self.bids),
            "payments": dict(self.payments),
            "total_payment": self.total_payment,
            "budget": self.budget,
            "budget_rule": self.budget_rule,
            "paid_share": self.paid_share,
            "within_budget": self.within_budget,
            "num_winners": self.num_winners,
            "global_counts": list(self.global_counts),
            "excluded": dict(self.excluded),
            "audited": list(self.audited),
            "award_acknowledged": list(self.award_acknowledged),
            "pass_sessions": [dataclasses.asdict(session) for session in self.pass_sessions],
            "award_digest": self.award_digest.hex(),
            "timings": dict(self.timings),
        }

    def save_json(self, path: str | Path) -> Path:
        """Write :meth:`to_dict` as JSON to ``path`` (parents created) and return the path."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n", encoding="utf-8")
        return target


def _check_count_or_auto(name: str, value: object, minimum: int) -> None:
    """Raise unless ``value`` is ``"auto"`` or an int of at least ``minimum``, naming the setting: ``TypeError`` for
    a value that is neither an int nor a str, ``ValueError`` for another str or a smaller int."""
    if value == "auto":
        return
    wanted = f'{name} must be an int >= {minimum} or "auto", got {value!r}'
    if isinstance(value, str):
        raise ValueError(wanted)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(wanted)
    if value < minimum:
        raise ValueError(wanted)


def check_int(name: str, value: object, minimum: int) -> None:
    """Raise ``TypeError`` unless ``value`` is an int, ``ValueError`` unless it is at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def check_positive_number(name: str, value: object, allow_zero: bool = False) -> None:
    """Raise ``TypeError`` unless ``value`` is a real number, ``ValueError`` unless it is finite and > 0 (or >= 0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be finite and {bound}, got {value}")
