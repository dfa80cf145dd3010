"""Server side of the market: PASS, scores and bids, the audited reverse auction and the awards, over a ``Grid``.

Steps (each a round of Flower ``query`` messages, see :mod:`flmarket_flwr.market.messages`):

1. Wait for the nodes (bounded) and run PASS over them (:mod:`flmarket_flwr.market.pass_rounds`):
   the server learns the global counts ``N_s`` and each survivor's commitment to its counts, once.
2. Broadcast ``N_s``, ``E`` and the session's transcript hash; each client returns its score and
   bid (``query.market_bid``). The market aborts if most PASS participants fail this step.
3. Run the auction (:func:`flmarket_flwr.pricing.run_auction`); every winner opens its counts
   commitment to the buyer (``query.market_audit``); a winner whose counts do not match its
   commitment, or whose claimed score is not the score of those counts, is excluded and the auction
   runs again without it. Every payment is capped at the budget, in every mode.
4. Tell every node that took part in any step whether it won and what it is paid
   (``query.market_award``), which also makes each client wipe what is left of its PASS state.

Every step is bounded by ``timeout`` whatever the transport does underneath. A node whose reply is
missing, an error or malformed is excluded with the reason logged at WARNING and kept in
:attr:`MarketOutcome.excluded`; what cannot be recovered stops the phase with :class:`MarketError`.
The threat model is in the README ("Threat model") and in :mod:`flmarket_flwr.market.pass_rounds`.
"""

from __future__ import annotations

import json
import math
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Message
from flwr.app.typing import ConfigRecordValues
from flwr.common.logger import log
from flwr.serverapp import Grid

from flmarket_flwr.market.client import LABEL_COUNTS_FAILED
from flmarket_flwr.market.errors import MarketError
from flmarket_flwr.market.messages import (
    ACTION_AUDIT,
    ACTION_AWARD,
    ACTION_BID,
    KEY_BID,
    KEY_COUNTS,
    KEY_GLOBAL_COUNTS,
    KEY_NONCE,
    KEY_NUM_CLIENTS,
    KEY_PAYMENT,
    KEY_SCORE,
    KEY_SESSION,
    KEY_TRANSCRIPT,
    KEY_WON,
    ReplyError,
    make_content,
    message_type,
    read_config,
    read_float,
)
from flmarket_flwr.market.pass_rounds import PassResult, PassRounds
from flmarket_flwr.nodes import wait_for_nodes
from flmarket_flwr.pass_protocol import MIN_PARTICIPANTS, IdentityDirectory, counts_commitment
from flmarket_flwr.pricing import run_auction
from flmarket_flwr.pricing import score as compute_score

__all__ = ["MarketConfig", "MarketError", "MarketOutcome", "MarketPhase"]

DEFAULT_COUNT_BOUND = 10**9
"""Default declared maximum of one client's count of one class."""

_PULL_INTERVAL = 0.1
"""Seconds between two pulls of replies."""
_STUCK_PULL_S = 5.0
"""Seconds after which a pull of replies that has not returned counts as stuck in the transport."""

_LAST_PULL_S = 1.0
"""Seconds the last pull of a step may take, even when the step's deadline has passed."""


@dataclass(frozen=True)
class MarketConfig:
    """Configuration of the market phase.

    Parameters
    ----------
    budget : float
        Budget ``R > 0`` of the reverse auction. Every payment is at most ``R``.
    num_classes : int
        Number of classes ``C`` (length of every label-count vector).
    num_winners : int, optional
        Fixed-cohort mode: select the first ``num_winners`` clients of the auction's ranking
        (payments are the critical values for staying in that cohort, each capped at ``R``).
        ``None`` (default): budget mode, total payment ``<= R``.
    min_clients : int (default: 3)
        Fewest PASS survivors accepted; at least 3 (with 2, each learns the other's counts).
    timeout : float (default: 60.0)
        Seconds one message round may take, whatever the transport does underneath.
    wait_for_nodes_timeout : float (default: 60.0)
        Longest wait for nodes to connect before the market starts.
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
        clients (:func:`flmarket_flwr.pass_protocol.neighbourhood_size`; the complete graph for small E).
    directory : IdentityDirectory, optional
        The buyer's directory of client identity keys (node id -> Ed25519 public key). With it the
        server drops any unsigned or wrongly signed key advertisement; the clients check their
        neighbours' signatures themselves against their own copy.
    audit_winners : bool (default: True)
        Whether each winner must open its PASS counts commitment to the buyer, so that a false
        score is caught before anyone is paid. Winners then disclose their counts to the buyer
        (losers never do); with ``False`` every score is the client's word (see the threat model).
    """

    budget: float
    num_classes: int
    num_winners: int | None = None
    min_clients: int = MIN_PARTICIPANTS
    timeout: float = 60.0
    wait_for_nodes_timeout: float = 60.0
    expected_nodes: int | None = None
    session_label: str = "flmarket"
    poll_interval: float = 1.0
    count_bound: int = DEFAULT_COUNT_BOUND
    neighbours: int | str = "auto"
    directory: IdentityDirectory | None = None
    audit_winners: bool = True

    def __post_init__(self) -> None:
        """Validate every field."""
        _check_positive_number("budget", self.budget)
        _check_int("num_classes", self.num_classes, minimum=1)
        if self.num_winners is not None:
            _check_int("num_winners", self.num_winners, minimum=1)
        _check_int("min_clients", self.min_clients, minimum=MIN_PARTICIPANTS)
        _check_positive_number("timeout", self.timeout)
        _check_positive_number("wait_for_nodes_timeout", self.wait_for_nodes_timeout, allow_zero=True)
        if self.expected_nodes is not None:
            _check_int("expected_nodes", self.expected_nodes, minimum=self.min_clients)
        if not isinstance(self.session_label, str) or not self.session_label:
            raise ValueError(f"session_label must be a non-empty str, got {self.session_label!r}")
        _check_positive_number("poll_interval", self.poll_interval)
        _check_int("count_bound", self.count_bound, minimum=1)
        if self.neighbours not in ("auto", "all"):
            _check_int("neighbours", self.neighbours, minimum=2)
        if not isinstance(self.audit_winners, bool):
            raise TypeError(f"audit_winners must be a bool, got {type(self.audit_winners).__name__}")


@dataclass
class MarketOutcome:
    """Result of the market phase.

    Attributes
    ----------
    winners : list[int]
        Node ids of the winners, in the auction's selection order.
    participants : list[int]
        Node ids of the auction's bidders (valid score and bid, not caught lying), ascending.
    scores, bids, payments : dict[int, float]
        Per bidder (payments are ``0.0`` for losers, each at most ``budget``).
    total_payment : float
        Sum of the payments.
    budget : float
        The budget ``R``.
    global_counts : list[int]
        ``N_s``, the per-class label counts summed over the PASS survivors.
    excluded : dict[int, str]
        Node id -> reason, for every node left out at some step.
    timings : dict[str, float]
        Seconds per step (``wait_for_nodes``, ``pass``, ``bid``, ``auction``, ``award``) and ``total``.
    pass_participants : list[int]
        Node ids whose counts are in ``global_counts`` (``E`` = their number), ascending.
    num_winners : int or None
        The fixed cohort size, or ``None`` in budget mode.
    award_acknowledged : list[int]
        Bidders that acknowledged their award message.
    audited : list[int]
        Winners whose opened counts matched their commitment and their claimed score.
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

    @property
    def within_budget(self) -> bool:
        """Whether the total payment is within the budget (always in budget mode)."""
        return self.total_payment <= self.budget * (1.0 + 1e-12)

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python form (int node-id keys; :meth:`save_json` writes them as strings)."""
        return {
            "winners": list(self.winners),
            "participants": list(self.participants),
            "pass_participants": list(self.pass_participants),
            "scores": dict(self.scores),
            "bids": dict(self.bids),
            "payments": dict(self.payments),
            "total_payment": self.total_payment,
            "budget": self.budget,
            "within_budget": self.within_budget,
            "num_winners": self.num_winners,
            "global_counts": list(self.global_counts),
            "excluded": dict(self.excluded),
            "audited": list(self.audited),
            "award_acknowledged": list(self.award_acknowledged),
            "timings": dict(self.timings),
        }

    def save_json(self, path: str | Path) -> Path:
        """Write :meth:`to_dict` as JSON to ``path`` (parents created) and return the path."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n", encoding="utf-8")
        return target


@dataclass
class _Award:
    """The audited auction's result: who bids, who wins, what each is paid."""

    bidders: list[int]
    winners: list[int]
    payments: dict[int, float]
    audited: list[int]


class MarketPhase:
    """The market phase of a ``ServerApp``: PASS, scores and bids, audited auction, awards.

    Parameters
    ----------
    config : MarketConfig
        Budget, number of classes, timeouts, and the other settings.
    """

    def __init__(self, config: MarketConfig) -> None:
        if not isinstance(config, MarketConfig):
            raise TypeError(f"config must be a MarketConfig, got {type(config).__name__}")
        self.config = config
        self._excluded: dict[int, str] = {}
        self._contacted: set[int] = set()
        self._session = b""

    # --- Public API ----------------------------------------------------------------------------
    def run(self, grid: Grid) -> MarketOutcome:
        """Run the whole market phase on ``grid`` and return its outcome.

        Parameters
        ----------
        grid : Grid
            The ``Grid`` given to the ``ServerApp``'s main function.

        Returns
        -------
        MarketOutcome
            Winners, payments, global counts, exclusions and timings.

        Raises
        ------
        MarketError
            Too few nodes connected or left in PASS, PASS could not recover its dropouts, the
            global counts failed their bounds, or most PASS participants failed the bid step.
            Every node contacted so far is told the market closed before the error is raised.
        """
        self._excluded = {}
        self._contacted = set()
        self._session = b""
        timings: dict[str, float] = {}
        started = time.perf_counter()
        try:
            nodes = self._timed(timings, "wait_for_nodes", lambda: self.wait_for_nodes(grid))
            pass_result = self._timed(timings, "pass", lambda: self.run_pass(grid, nodes))
            bids = self._timed(timings, "bid", lambda: self.collect_bids(grid, pass_result))
            award = self._timed(timings, "auction", lambda: self._audited_auction(grid, pass_result, bids))
        except MarketError as err:
            log(WARNING, "Market: aborted (%s)", err)
            self._close(grid, {}, set())
            raise
        acknowledged = self._timed(timings, "award", lambda: self._close(grid, award.payments, set(award.winners)))
        timings["total"] = time.perf_counter() - started

        outcome = MarketOutcome(
            winners=award.winners,
            participants=award.bidders,
            scores={node: bids[node][0] for node in award.bidders},
            bids={node: bids[node][1] for node in award.bidders},
            payments=award.payments,
            total_payment=math.fsum(award.payments.values()),  # exact: independent of the node-id order
            budget=float(self.config.budget),
            global_counts=[int(c) for c in pass_result.global_counts],
            excluded=dict(self._excluded),
            timings=timings,
            pass_participants=list(pass_result.participants),
            num_winners=self.config.num_winners,
            award_acknowledged=acknowledged,
            audited=award.audited,
        )
        log(
            INFO,
            "Market: %d winners of %d bidders, total payment %.4g (budget %.4g)",
            len(award.winners),
            len(award.bidders),
            outcome.total_payment,
            outcome.budget,
        )
        return outcome

    # --- Step 0: nodes -------------------------------------------------------------------------
    def wait_for_nodes(self, grid: Grid) -> list[int]:
        """Wait (bounded) until enough nodes are connected; return their ids, ascending.

        Raises
        ------
        MarketError
            If fewer than ``min_clients`` nodes are connected when the wait ends.
        """
        cfg = self.config
        nodes = wait_for_nodes(
            grid,
            cfg.expected_nodes if cfg.expected_nodes is not None else cfg.min_clients,
            cfg.wait_for_nodes_timeout,
            poll_interval=cfg.poll_interval,
            settle=cfg.expected_nodes is None,
            who="Market",
        )
        if len(nodes) < cfg.min_clients:
            raise MarketError(
                f"only {len(nodes)} node(s) connected after {cfg.wait_for_nodes_timeout:g} s; "
                f"the market needs at least {cfg.min_clients} (PASS with fewer than "
                f"{MIN_PARTICIPANTS} would reveal a client's counts)"
            )
        if cfg.expected_nodes is not None and len(nodes) < cfg.expected_nodes:
            log(
                WARNING,
                "Market: %d of %d expected nodes connected after %g s; going on with them",
                len(nodes),
                cfg.expected_nodes,
                cfg.wait_for_nodes_timeout,
            )
        return nodes

    # --- Step 1: PASS -------------------------------------------------------------------------
    def run_pass(self, grid: Grid, nodes: Sequence[int]) -> PassResult:
        """Run PASS once over ``nodes`` and return ``N_s`` with the survivors and their commitments.

        Raises
        ------
        MarketError
            Too few survivors, a secret without enough shares, or ``N_s`` out of its bounds.
        """
        self._contacted.update(nodes)
        self._session = f"{self.config.session_label}/pass/".encode() + secrets.token_bytes(16)
        try:
            return PassRounds(self.config, self, self._session).run(grid, nodes)
        except MarketError as err:
            cause = _label_count_failures(self._excluded)
            if cause:  # name the root cause, not its symptom ("only 0 clients advertised valid keys")
                raise MarketError(f"{cause}; {err}") from err
            raise

    def require_enough(self, nodes: Sequence[int], where: str) -> None:
        """Raise :class:`MarketError` if fewer than ``min_clients`` nodes are left."""
        if len(nodes) < self.config.min_clients:
            raise MarketError(
                f"{where}: only {len(nodes)} client(s) left, the market needs at least "
                f"{self.config.min_clients} (PASS with fewer than {MIN_PARTICIPANTS} would reveal "
                f"a client's counts); excluded so far: {self._excluded}"
            )

    # --- Step 2: scores and bids ---------------------------------------------------------------
    def collect_bids(self, grid: Grid, pass_result: PassResult) -> dict[int, tuple[float, float]]:
        """Broadcast ``N_s``, ``E`` and the transcript hash; return ``{node: (score, bid)}``.

        Raises
        ------
        MarketError
            If ``N_s`` is all zero (no client can score), or most PASS participants failed.
        """
        record: dict[str, ConfigRecordValues] = {
            KEY_SESSION: pass_result.session,
            KEY_GLOBAL_COUNTS: [int(c) for c in pass_result.global_counts],
            KEY_NUM_CLIENTS: len(pass_result.participants),
            KEY_TRANSCRIPT: pass_result.transcript,
        }
        # A survivor excluded at the unmask round stays in N_s and E, but is left out of the rest of the market.
        requests = {node: ConfigRecord(dict(record)) for node in pass_result.participants if not self.is_excluded(node)}
        highest = _highest_possible_score(pass_result)
        replies = self.exchange(grid, ACTION_BID, requests)
        bids = self.validated(ACTION_BID, requests, replies, lambda reply: _read_score_and_bid(reply, highest))
        failed = len(pass_result.participants) - len(bids)
        if 2 * failed > len(pass_result.participants):
            raise MarketError(
                f"{failed} of {len(pass_result.participants)} PASS participants failed the bid step: "
                "the market aborts rather than pay the rest (see the excluded reasons)"
            )
        return bids

    # --- Step 3: audited auction ---------------------------------------------------------------
    def _audited_auction(self, grid: Grid, pass_result: PassResult, bids: Mapping[int, tuple[float, float]]) -> _Award:
        """Run the auction; audit new winners; drop the liars and run it again until every winner holds."""
        bidders = dict(bids)
        audited: list[int] = []
        while True:
            nodes = sorted(bidders)
            winners, payments = self._run_auction(nodes, bidders)
            pending = [node for node in winners if node not in audited]
            if not self.config.audit_winners or not pending:
                return _Award(bidders=nodes, winners=winners, payments=payments, audited=audited)
            honest = self._audit(grid, pass_result, {node: payments[node] for node in pending}, bidders)
            audited.extend(node for node in pending if node in honest)
            for node in pending:
                if node not in honest:
                    del bidders[node]

    def _run_auction(
        self, bidders: Sequence[int], bids: Mapping[int, tuple[float, float]]
    ) -> tuple[list[int], dict[int, float]]:
        """Winners (selection order) and payments, each capped at the budget.

        A bid above the budget can never be paid: such a bidder stays a (losing) participant but is
        left out of the auction, so it can neither win nor move anyone's critical value.
        """
        budget = float(self.config.budget)
        payments = {node: 0.0 for node in bidders}
        nodes = [node for node in bidders if bids[node][1] <= budget]
        if not nodes:
            return [], payments
        scores = np.array([bids[node][0] for node in nodes], dtype=np.float64)
        prices = np.array([bids[node][1] for node in nodes], dtype=np.float64)
        try:
            result = run_auction(scores, prices, self.config.budget, num_winners=self.config.num_winners)
        except ValueError as err:  # validated above; kept as a clear error all the same
            raise MarketError(f"the auction rejected its input: {err}") from err
        winners = [nodes[int(i)] for i in result.winners]
        payments.update({node: min(float(result.payments[pos]), budget) for pos, node in enumerate(nodes)})
        return winners, payments

    def _audit(
        self,
        grid: Grid,
        pass_result: PassResult,
        offers: Mapping[int, float],
        bids: Mapping[int, tuple[float, float]],
    ) -> set[int]:
        """Ask each tentative winner to open its counts commitment; return those that hold."""
        requests = {
            node: ConfigRecord({KEY_SESSION: pass_result.session, KEY_PAYMENT: float(payment)})
            for node, payment in offers.items()
        }
        replies = self.exchange(grid, ACTION_AUDIT, requests)

        def check(reply: Message, node: int) -> None:
            _check_opening(reply, node, pass_result, self.config, claimed_score=bids[node][0])

        opened = self.validated(ACTION_AUDIT, requests, replies, check, pass_node=True)
        return set(opened)

    # --- Step 4: awards ------------------------------------------------------------------------
    def _close(self, grid: Grid, payments: Mapping[int, float], winners: set[int]) -> list[int]:
        """Tell every contacted node its award (``won=False`` but for the winners); return the acknowledging bidders."""
        session = self._session
        requests = {
            node: ConfigRecord(
                {KEY_SESSION: session, KEY_WON: node in winners, KEY_PAYMENT: float(payments.get(node, 0.0))}
            )
            for node in sorted(self._contacted)
        }
        if not requests:
            return []
        replies = self.exchange(grid, ACTION_AWARD, requests)
        acknowledged = []
        for node in sorted(payments):
            reply = replies.get(node)
            try:
                if reply is None:
                    raise ReplyError("no reply")
                read_config(reply)
            except ReplyError as err:
                log(WARNING, "Market: node %d did not acknowledge its award (%s)", node, err)
                continue
            acknowledged.append(node)
        return acknowledged

    # --- Messaging -----------------------------------------------------------------------------
    def exchange(self, grid: Grid, action: str, requests: Mapping[int, ConfigRecord]) -> dict[int, Message]:
        """Send one request per node and return ``{node: reply}`` received within ``timeout``.

        Replies are matched by ``reply_to_message_id``. An error reply that the transport made for a
        node (Flower's own, e.g. an upload that never completed) is kept as that node's reply, so its
        real reason is logged; other replies from an unexpected sender, and second replies, are ignored.
        """
        messages = [
            Message(make_content(record), dst_node_id=node, message_type=message_type(action), group_id=action)
            for node, record in requests.items()
        ]
        replies = _send_and_receive_within(grid, messages, self.config.timeout)
        node_of = {msg.metadata.message_id: msg.metadata.dst_node_id for msg in messages}
        matched: dict[int, Message] = {}
        for reply in replies:
            node = node_of.get(reply.metadata.reply_to_message_id)
            if node is None:
                log(WARNING, "Market: %s: ignoring a reply to an unknown message", action)
                continue
            if reply.metadata.src_node_id != node and not reply.has_error():
                log(
                    WARNING,
                    "Market: %s: ignoring a reply to node %d sent by node %d",
                    action,
                    node,
                    reply.metadata.src_node_id,
                )
                continue
            if node in matched:
                log(WARNING, "Market: %s: ignoring a second reply for node %d", action, node)
                continue
            matched[node] = reply
        return matched

    def validated(
        self,
        action: str,
        requests: Mapping[int, Any],
        replies: Mapping[int, Message],
        read: Callable[..., Any],
        *,
        pass_node: bool = False,
    ) -> dict[int, Any]:
        """Apply ``read`` to the reply of every requested node; exclude missing or bad replies.

        With ``pass_node=True`` ``read`` is called as ``read(reply, node)``.
        """
        valid: dict[int, Any] = {}
        for node in sorted(requests):
            reply = replies.get(node)
            if reply is None:
                self.exclude(node, action, f"no reply within {self.config.timeout:g} s")
                continue
            try:
                valid[node] = read(reply, node) if pass_node else read(reply)
            except ReplyError as err:
                self.exclude(node, action, str(err))
        return valid

    def is_excluded(self, node: int) -> bool:
        """Whether ``node`` was excluded at some step."""
        return node in self._excluded

    def exclude(self, node: int, action: str, reason: str) -> None:
        """Leave ``node`` out of the rest of the market, logging and keeping the reason."""
        message = f"{action}: {reason}"
        log(WARNING, "Market: excluding node %d (%s)", node, message)
        self._excluded[node] = message

    @staticmethod
    def _timed(timings: dict[str, float], name: str, step: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        try:
            return step()
        finally:
            timings[name] = time.perf_counter() - started


def _label_count_failures(excluded: Mapping[int, str]) -> str:
    """The clients whose own ``get_label_counts`` raised, grouped by exception ("" if none)."""
    nodes_of: dict[str, list[int]] = {}
    for node, reason in sorted(excluded.items()):
        if LABEL_COUNTS_FAILED in reason:
            nodes_of.setdefault(reason[reason.index(LABEL_COUNTS_FAILED) :], []).append(node)
    return "; ".join(
        f"the label-count callback failed on {len(nodes)} client(s) {nodes}: {cause}"
        for cause, nodes in nodes_of.items()
    )


def _send_and_receive_within(grid: Grid, messages: list[Message], timeout: float) -> list[Message]:
    """Push ``messages`` and pull their replies until all arrived or ``timeout`` seconds passed.

    Unlike ``Grid.send_and_receive``, a pull that blocks inside the transport cannot hold the market
    past its deadline: each pull runs in a daemon thread that is abandoned when the deadline passes.
    One last pull is always made (bounded by ``_LAST_PULL_S``). A pull stuck in the transport (a node
    cut off while uploading its reply: Flower retries that reply's objects until the SuperLink's
    upload session expires, minutes later) would also hold every reply that arrives after it, so once
    a pull is stuck the others are pulled one message id at a time.
    """
    deadline = time.monotonic() + timeout
    pending = set(grid.push_messages(messages))
    received: list[Message] = []
    pulls: list[_Pull] = []
    one_by_one = False
    while pending:
        last = time.monotonic() >= deadline
        busy = {message_id for pull in pulls if len(pull.ids) == 1 or not pull.stuck for message_id in pull.ids}
        idle = sorted(pending - busy)
        if idle and one_by_one:
            pulls.extend(_Pull(grid, [message_id]) for message_id in idle)
        elif idle:
            pulls.append(_Pull(grid, idle))
        if last:
            _wait_for(pulls, _LAST_PULL_S)
        else:
            time.sleep(min(_PULL_INTERVAL, max(0.0, deadline - time.monotonic())))
        for pull in [pull for pull in pulls if pull.done]:
            pulls.remove(pull)
            received.extend(pull.replies)
            pending.difference_update(reply.metadata.reply_to_message_id for reply in pull.replies)
        if last:
            break
        if not one_by_one and any(pull.stuck for pull in pulls):
            one_by_one = True
            log(WARNING, "Market: a pull of replies is stuck in the transport; pulling the others one by one")
    if pending and pulls:
        log(WARNING, "Market: pulling replies did not return within the step's timeout; going on without them")
    return received


class _Pull:
    """One ``grid.pull_messages(ids)`` call in a daemon thread, abandoned if it never returns."""

    def __init__(self, grid: Grid, ids: list[str]) -> None:
        self.ids = ids
        self.replies: list[Message] = []
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._pull, args=(grid,), name="flmarket-pull", daemon=True)
        self._thread.start()

    def _pull(self, grid: Grid) -> None:
        self.replies = list(grid.pull_messages(self.ids))

    @property
    def done(self) -> bool:
        """Whether the call returned (or failed)."""
        return not self._thread.is_alive()

    def wait(self, seconds: float) -> None:
        """Wait at most ``seconds`` for the call to return."""
        self._thread.join(max(seconds, 0.0))

    @property
    def stuck(self) -> bool:
        """Whether the call has been running longer than a pull of replies takes unless the transport is stuck."""
        return not self.done and time.monotonic() - self._started > _STUCK_PULL_S


def _wait_for(pulls: list[_Pull], seconds: float) -> None:
    """Wait at most ``seconds`` in all for the pulls that are not stuck to return."""
    end = time.monotonic() + seconds
    for pull in pulls:
        if not pull.stuck:
            pull.wait(end - time.monotonic())


def _highest_possible_score(pass_result: PassResult) -> float:
    """The largest score any PASS participant can have: that of counts equal to ``N_s``.

    ``phi`` never decreases and every client's count of a class is at most ``n_s^c``, so
    ``score(N_s, N_s, E)`` bounds every honest score.

    Raises
    ------
    MarketError
        If ``N_s`` is all zero: no client holds data, nothing can be scored.
    """
    counts = pass_result.global_counts
    try:
        bound = float(compute_score(counts, counts, len(pass_result.participants)))
    except ValueError as err:
        raise MarketError(f"the global counts cannot be scored ({err}): no client holds data") from err
    return bound * (1.0 + 1e-9) + 1e-9


def _read_score_and_bid(reply: Message, highest_score: float) -> tuple[float, float]:
    """``(score, bid)`` of a ``market_bid`` reply: score in ``[0, highest_score]``, bid finite and ``> 0``."""
    record = read_config(reply)
    score = read_float(record, KEY_SCORE)
    bid = read_float(record, KEY_BID)
    if score < 0:
        raise ReplyError(f"'{KEY_SCORE}' must be >= 0, got {score}")
    if score > highest_score:
        raise ReplyError(
            f"'{KEY_SCORE}' {score} exceeds {highest_score:.6g}, the score of all the global counts: "
            "no client can score that much"
        )
    if bid <= 0:
        raise ReplyError(f"'{KEY_BID}' must be > 0, got {bid}")
    return score, bid


def _check_opening(
    reply: Message, node: int, pass_result: PassResult, config: MarketConfig, claimed_score: float
) -> None:
    """Check a winner's opened counts against its PASS commitment, the bounds and its claimed score.

    Raises
    ------
    ReplyError
        With the reason the winner is excluded.
    """
    record = read_config(reply)
    counts = record.get(KEY_COUNTS)
    nonce = record.get(KEY_NONCE)
    if not isinstance(counts, list) or len(counts) != config.num_classes:
        raise ReplyError(f"audit: '{KEY_COUNTS}' must be a list of {config.num_classes} ints")
    if any(isinstance(c, bool) or not isinstance(c, int) or c < 0 or c > config.count_bound for c in counts):
        raise ReplyError(f"audit: '{KEY_COUNTS}' must hold ints in [0, {config.count_bound}]")
    if not isinstance(nonce, bytes):
        raise ReplyError(f"audit: '{KEY_NONCE}' must be bytes")
    opened = np.asarray(counts, dtype=np.int64)
    index = pass_result.indices[node]
    if counts_commitment(pass_result.session, index, opened, nonce) != pass_result.commitments[node]:
        raise ReplyError("audit: the opened counts do not match the client's PASS commitment")
    if np.any(opened > pass_result.global_counts):
        raise ReplyError("audit: the opened counts exceed the global counts")
    true_score = float(compute_score(opened, pass_result.global_counts, len(pass_result.participants)))
    if not math.isclose(true_score, claimed_score, rel_tol=1e-9, abs_tol=1e-12):
        raise ReplyError(
            f"audit: the claimed score {claimed_score:.6g} is not the score {true_score:.6g} of the committed counts"
        )


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def _check_positive_number(name: str, value: object, allow_zero: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be finite and {bound}, got {value}")
