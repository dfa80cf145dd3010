"""Server side of the market: PASS, scoring, the reverse auction and the awards, over a Flower ``Grid``.

Usage inside a ``ServerApp``::

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        outcome = MarketPhase(MarketConfig(budget=100.0, num_classes=10, expected_nodes=20)).run(grid)
        strategy.start(grid=WinnersGrid(grid, outcome.winners), initial_arrays=arrays, ...)

Steps (each one Flower message round, see :mod:`flmarket_flwr.market.messages`):

1. Wait for the nodes; give each a PASS index ``1..E`` (by sorted node id) and a fresh
   random session; collect the 32-byte public keys (``query.market_keys``).
2. Broadcast every key, collect the masked count vectors and unmask their sum ``N_s``
   (``query.market_mask``). A node that fails after sending its key breaks the mask
   cancellation: PASS restarts from step 1 over the survivors, with fresh keys and a fresh
   session, at most ``max_pass_attempts`` times.
3. Broadcast ``N_s`` and ``E``; each client returns its own score and bid (``query.market_bid``).
4. Run the auction (:func:`flmarket_flwr.pricing.run_auction`) and tell every bidder whether it
   won and what it is paid (``query.market_award``).

Replies are matched to requests by ``reply_to_message_id``. A node whose reply is missing,
an error, or malformed is excluded with a reason (logged at WARNING, kept in
:attr:`MarketOutcome.excluded`); only too few PASS participants stop the phase, with
:class:`MarketError`.
"""

from __future__ import annotations

import json
import math
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from flwr.app import ConfigRecord, Message
from flwr.common.logger import log
from flwr.serverapp import Grid

from flmarket_flwr.market.messages import (
    ACTION_AWARD,
    ACTION_BID,
    ACTION_KEYS,
    ACTION_MASK,
    KEY_BID,
    KEY_GLOBAL_COUNTS,
    KEY_INDICES,
    KEY_NUM_CLASSES,
    KEY_NUM_CLIENTS,
    KEY_PASS_INDEX,
    KEY_PAYMENT,
    KEY_PUBLIC_KEYS,
    KEY_SCORE,
    KEY_SESSION,
    KEY_WON,
    ReplyError,
    make_content,
    message_type,
    read_config,
    read_float,
    read_masked_counts,
    read_public_key,
)
from flmarket_flwr.pass_protocol import MIN_PARTICIPANTS, unmask_sum
from flmarket_flwr.pricing import AuctionResult, run_auction
from flmarket_flwr.pricing import score as compute_score

__all__ = ["MarketConfig", "MarketError", "MarketOutcome", "MarketPhase", "PassResult"]


class MarketError(RuntimeError):
    """The market phase cannot complete (too few clients left, PASS never completed, no bids)."""


@dataclass(frozen=True)
class MarketConfig:
    """Configuration of the market phase.

    Parameters
    ----------
    budget : float
        Budget ``R > 0`` of the reverse auction.
    num_classes : int
        Number of classes ``C`` (length of every label-count vector).
    num_winners : int, optional
        Fixed-cohort mode: select the first ``num_winners`` clients of the auction's ranking;
        the budget then does not bind the payments. ``None`` (default): budget mode.
    min_clients : int (default: 3)
        Fewest PASS participants accepted; at least 3 (with 2, each learns the other's counts).
    max_pass_attempts : int (default: 3)
        How many times PASS may run (the first run included) before giving up.
    timeout : float (default: 60.0)
        Seconds to wait for the replies of one message round.
    wait_for_nodes_timeout : float (default: 60.0)
        Longest wait for nodes to connect before the market starts.
    expected_nodes : int, optional
        Wait until this many nodes are connected (bounded by ``wait_for_nodes_timeout``).
        ``None``: wait until ``min_clients`` are connected and their number has not changed
        for one ``poll_interval``.
    session_label : str (default: "flmarket")
        Label prefixed to every PASS session id (binds the masks to this application).
    poll_interval : float (default: 1.0)
        Seconds between two node-count polls while waiting for nodes.
    """

    budget: float
    num_classes: int
    num_winners: int | None = None
    min_clients: int = MIN_PARTICIPANTS
    max_pass_attempts: int = 3
    timeout: float = 60.0
    wait_for_nodes_timeout: float = 60.0
    expected_nodes: int | None = None
    session_label: str = "flmarket"
    poll_interval: float = 1.0

    def __post_init__(self) -> None:
        """Validate every field."""
        _check_positive_number("budget", self.budget)
        _check_int("num_classes", self.num_classes, minimum=1)
        if self.num_winners is not None:
            _check_int("num_winners", self.num_winners, minimum=1)
        _check_int("min_clients", self.min_clients, minimum=MIN_PARTICIPANTS)
        _check_int("max_pass_attempts", self.max_pass_attempts, minimum=1)
        _check_positive_number("timeout", self.timeout)
        _check_positive_number("wait_for_nodes_timeout", self.wait_for_nodes_timeout, allow_zero=True)
        if self.expected_nodes is not None:
            _check_int("expected_nodes", self.expected_nodes, minimum=self.min_clients)
        if not isinstance(self.session_label, str) or not self.session_label:
            raise ValueError(f"session_label must be a non-empty str, got {self.session_label!r}")
        _check_positive_number("poll_interval", self.poll_interval)


@dataclass
class MarketOutcome:
    """Result of the market phase.

    Attributes
    ----------
    winners : list[int]
        Node ids of the winners, in the auction's selection order.
    participants : list[int]
        Node ids of the auction's bidders (valid score and bid), ascending.
    scores, bids, payments : dict[int, float]
        Per bidder (payments are ``0.0`` for losers).
    total_payment : float
        Sum of the payments.
    budget : float
        The budget ``R``.
    global_counts : list[int]
        ``N_s``, the per-class label counts summed over the PASS participants.
    excluded : dict[int, str]
        Node id -> reason, for every node left out at some step.
    pass_attempts : int
        PASS runs needed (1 if nobody dropped out).
    timings : dict[str, float]
        Seconds per step (``wait_for_nodes``, ``pass``, ``bid``, ``auction``, ``award``) and ``total``.
    pass_participants : list[int]
        Node ids whose counts are in ``global_counts`` (``E`` = their number), ascending.
    num_winners : int or None
        The fixed cohort size, or ``None`` in budget mode.
    award_acknowledged : list[int]
        Bidders that acknowledged their award message.
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
    pass_attempts: int
    timings: dict[str, float]
    pass_participants: list[int] = field(default_factory=list)
    num_winners: int | None = None
    award_acknowledged: list[int] = field(default_factory=list)

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
            "pass_attempts": self.pass_attempts,
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
class PassResult:
    """Outcome of PASS: who took part, their summed label counts, and the runs needed."""

    participants: list[int]
    global_counts: NDArray[np.int64]
    attempts: int


class MarketPhase:
    """The market phase of a ``ServerApp``: PASS, scores and bids, auction, awards.

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
            Fewer than ``min_clients`` nodes connected or left in PASS, PASS failed
            ``max_pass_attempts`` times, or no client placed a valid bid.
        """
        self._excluded = {}
        timings: dict[str, float] = {}
        started = time.perf_counter()

        nodes = self._timed(timings, "wait_for_nodes", lambda: self.wait_for_nodes(grid))
        pass_result = self._timed(timings, "pass", lambda: self.run_pass(grid, nodes))
        bids = self._timed(timings, "bid", lambda: self.collect_bids(grid, pass_result))
        participants = sorted(bids)
        if not participants:
            raise MarketError("no client placed a valid score and bid: the auction has no bidders")
        auction = self._timed(timings, "auction", lambda: self._run_auction(participants, bids))
        winners = [participants[int(i)] for i in auction.winners]
        payments = {node: float(auction.payments[pos]) for pos, node in enumerate(participants)}
        acknowledged = self._timed(timings, "award", lambda: self.send_awards(grid, payments, set(winners)))
        timings["total"] = time.perf_counter() - started

        outcome = MarketOutcome(
            winners=winners,
            participants=participants,
            scores={node: bids[node][0] for node in participants},
            bids={node: bids[node][1] for node in participants},
            payments=payments,
            total_payment=float(sum(payments.values())),
            budget=float(self.config.budget),
            global_counts=[int(c) for c in pass_result.global_counts],
            excluded=dict(self._excluded),
            pass_attempts=pass_result.attempts,
            timings=timings,
            pass_participants=list(pass_result.participants),
            num_winners=self.config.num_winners,
            award_acknowledged=acknowledged,
        )
        log(
            INFO,
            "Market: %d winners of %d bidders, total payment %.4g (budget %.4g), %d PASS attempt(s)",
            len(winners),
            len(participants),
            outcome.total_payment,
            outcome.budget,
            outcome.pass_attempts,
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
        target = cfg.expected_nodes if cfg.expected_nodes is not None else cfg.min_clients
        deadline = time.monotonic() + cfg.wait_for_nodes_timeout
        nodes = sorted(set(grid.get_node_ids()))
        while True:
            enough = len(nodes) >= target
            if (enough and cfg.expected_nodes is not None) or time.monotonic() >= deadline:
                break
            if not enough:
                log(INFO, "Market: waiting for nodes (%d connected, %d wanted)", len(nodes), target)
            time.sleep(cfg.poll_interval)
            latest = sorted(set(grid.get_node_ids()))
            if enough and latest == nodes:
                break  # No target count: go once the set of nodes has settled for one poll.
            nodes = latest
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

    # --- Steps 1-2: PASS -----------------------------------------------------------------------
    def run_pass(self, grid: Grid, nodes: Sequence[int]) -> PassResult:
        """Run PASS over ``nodes`` (restarting over the survivors on dropouts) and return ``N_s``.

        Raises
        ------
        MarketError
            If fewer than ``min_clients`` remain, or PASS failed ``max_pass_attempts`` times.
        """
        candidates = sorted(nodes)
        for attempt in range(1, self.config.max_pass_attempts + 1):
            self._require_enough(candidates, f"PASS attempt {attempt}")
            session = self._new_session(attempt)
            indices = {node: position for position, node in enumerate(candidates, start=1)}
            keys = self._collect_public_keys(grid, indices, session)
            self._require_enough(list(keys), f"PASS attempt {attempt} (public keys)")
            masked = self._collect_masked_counts(grid, indices, session, keys)
            survivors = sorted(masked)
            if len(survivors) == len(keys):
                try:
                    total = unmask_sum({indices[node]: masked[node] for node in survivors})
                except ValueError as err:
                    log(WARNING, "Market: PASS attempt %d gave no valid sum (%s); restarting", attempt, err)
                else:
                    return PassResult(participants=survivors, global_counts=total, attempts=attempt)
            else:
                log(
                    WARNING,
                    "Market: PASS attempt %d: %d of %d key holders did not mask; restarting over %d survivors",
                    attempt,
                    len(keys) - len(survivors),
                    len(keys),
                    len(survivors),
                )
            candidates = survivors
        raise MarketError(
            f"PASS did not complete in {self.config.max_pass_attempts} attempt(s); "
            f"{len(candidates)} client(s) left"
        )

    def _collect_public_keys(self, grid: Grid, indices: Mapping[int, int], session: bytes) -> dict[int, bytes]:
        """PASS round 1: send index and session, return ``{node: public key}`` of valid replies."""
        requests = {
            node: ConfigRecord(
                {KEY_PASS_INDEX: index, KEY_SESSION: session, KEY_NUM_CLASSES: self.config.num_classes}
            )
            for node, index in indices.items()
        }
        replies = self._exchange(grid, ACTION_KEYS, requests, group_id=f"market-pass-keys-{session.hex()[-8:]}")
        keys = self._validated(ACTION_KEYS, requests, replies, read_public_key)
        return self._drop_duplicate_keys(keys)

    def _collect_masked_counts(
        self, grid: Grid, indices: Mapping[int, int], session: bytes, keys: Mapping[int, bytes]
    ) -> dict[int, NDArray[np.uint64]]:
        """PASS round 2: broadcast the keys, return ``{node: masked counts}`` of valid replies."""
        holders = sorted(keys)
        broadcast_indices = [indices[node] for node in holders]
        broadcast_keys = [keys[node] for node in holders]
        requests = {
            node: ConfigRecord(
                {
                    KEY_PASS_INDEX: indices[node],
                    KEY_SESSION: session,
                    KEY_INDICES: list(broadcast_indices),
                    KEY_PUBLIC_KEYS: list(broadcast_keys),
                }
            )
            for node in holders
        }
        replies = self._exchange(grid, ACTION_MASK, requests, group_id=f"market-pass-mask-{session.hex()[-8:]}")
        num_classes = self.config.num_classes
        return self._validated(
            ACTION_MASK, requests, replies, lambda reply: read_masked_counts(reply, num_classes)
        )

    def _drop_duplicate_keys(self, keys: dict[int, bytes]) -> dict[int, bytes]:
        """Exclude every node whose public key is also another node's (it cannot be told apart)."""
        owners: dict[bytes, list[int]] = {}
        for node, key in keys.items():
            owners.setdefault(key, []).append(node)
        for nodes in owners.values():
            if len(nodes) > 1:
                for node in nodes:
                    self._exclude(node, ACTION_KEYS, f"public key shared with nodes {sorted(set(nodes) - {node})}")
                    del keys[node]
        return keys

    def _new_session(self, attempt: int) -> bytes:
        """Fresh, unpredictable session id of one PASS attempt."""
        return f"{self.config.session_label}/pass/{attempt}/".encode() + secrets.token_bytes(16)

    def _require_enough(self, nodes: Sequence[int], where: str) -> None:
        if len(nodes) < self.config.min_clients:
            raise MarketError(
                f"{where}: only {len(nodes)} client(s) left, the market needs at least "
                f"{self.config.min_clients} (PASS with fewer than {MIN_PARTICIPANTS} would reveal "
                f"a client's counts); excluded so far: {self._excluded}"
            )

    # --- Step 3: scores and bids ---------------------------------------------------------------
    def collect_bids(self, grid: Grid, pass_result: PassResult) -> dict[int, tuple[float, float]]:
        """Broadcast ``N_s`` and ``E``; return ``{node: (score, bid)}`` of the valid replies."""
        record = {
            KEY_GLOBAL_COUNTS: [int(c) for c in pass_result.global_counts],
            KEY_NUM_CLIENTS: len(pass_result.participants),
        }
        requests = {node: ConfigRecord(dict(record)) for node in pass_result.participants}
        replies = self._exchange(grid, ACTION_BID, requests, group_id="market-bid")
        highest = _highest_possible_score(pass_result)
        return self._validated(ACTION_BID, requests, replies, lambda reply: _read_score_and_bid(reply, highest))

    # --- Step 4: auction and awards ------------------------------------------------------------
    def _run_auction(self, participants: Sequence[int], bids: Mapping[int, tuple[float, float]]) -> AuctionResult:
        scores = np.array([bids[node][0] for node in participants], dtype=np.float64)
        prices = np.array([bids[node][1] for node in participants], dtype=np.float64)
        try:
            return run_auction(scores, prices, self.config.budget, num_winners=self.config.num_winners)
        except ValueError as err:  # validated above; kept as a clear error all the same
            raise MarketError(f"the auction rejected its input: {err}") from err

    def send_awards(self, grid: Grid, payments: Mapping[int, float], winners: set[int]) -> list[int]:
        """Tell every bidder whether it won and its payment; return the nodes that acknowledged."""
        requests = {
            node: ConfigRecord({KEY_WON: node in winners, KEY_PAYMENT: float(payment)})
            for node, payment in payments.items()
        }
        replies = self._exchange(grid, ACTION_AWARD, requests, group_id="market-award")
        acknowledged = []
        for node in sorted(requests):
            reply = replies.get(node)
            if reply is None:
                log(WARNING, "Market: node %d did not acknowledge its award (no reply)", node)
                continue
            try:
                read_config(reply)
            except ReplyError as err:
                log(WARNING, "Market: node %d did not acknowledge its award (%s)", node, err)
                continue
            acknowledged.append(node)
        return acknowledged

    # --- Messaging -----------------------------------------------------------------------------
    def _exchange(
        self, grid: Grid, action: str, requests: Mapping[int, ConfigRecord], group_id: str
    ) -> dict[int, Message]:
        """Send one request per node and return ``{node: reply}``, matched by message id.

        Nodes without a reply are absent from the result; replies to unknown message ids,
        replies sent by another node than the one asked, and second replies to one message
        are ignored.
        """
        messages = [
            Message(make_content(record), dst_node_id=node, message_type=message_type(action), group_id=group_id)
            for node, record in requests.items()
        ]
        replies = list(grid.send_and_receive(messages, timeout=self.config.timeout))
        # The grid sets each message's id when pushing it.
        node_of = {msg.metadata.message_id: msg.metadata.dst_node_id for msg in messages}
        matched: dict[int, Message] = {}
        for reply in replies:
            node = node_of.get(reply.metadata.reply_to_message_id)
            if node is None:
                log(WARNING, "Market: %s: ignoring a reply to an unknown message", action)
                continue
            if reply.metadata.src_node_id != node:
                log(
                    WARNING,
                    "Market: %s: ignoring a reply to node %d's message sent by node %d",
                    action,
                    node,
                    reply.metadata.src_node_id,
                )
                continue
            if node in matched:
                log(WARNING, "Market: %s: ignoring a second reply from node %d", action, node)
                continue
            matched[node] = reply
        return matched

    def _validated(
        self,
        action: str,
        requests: Mapping[int, ConfigRecord],
        replies: Mapping[int, Message],
        read: Callable[[Message], Any],
    ) -> dict[int, Any]:
        """Apply ``read`` to the reply of every requested node; exclude missing or bad replies."""
        valid: dict[int, Any] = {}
        for node in sorted(requests):
            reply = replies.get(node)
            if reply is None:
                self._exclude(node, action, f"no reply within {self.config.timeout:g} s")
                continue
            try:
                valid[node] = read(reply)
            except ReplyError as err:
                self._exclude(node, action, str(err))
        return valid

    def _exclude(self, node: int, action: str, reason: str) -> None:
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


def _highest_possible_score(pass_result: PassResult) -> float:
    """The largest score any PASS participant can have: that of counts equal to ``N_s``.

    ``phi`` never decreases and every client's count of a class is at most ``n_s^c``, so
    ``score(N_s, N_s, E)`` bounds every honest score. A reply above it is malformed (and a
    huge finite score would overflow the auction's sums into infinite or NaN payments).
    """
    try:
        counts = pass_result.global_counts
        bound = float(compute_score(counts, counts, len(pass_result.participants)))
    except ValueError:  # e.g. all-zero global counts: no client can score, nothing to bound
        return math.inf
    return bound * (1.0 + 1e-9) + 1e-9


def _read_score_and_bid(reply: Message, highest_score: float = math.inf) -> tuple[float, float]:
    """Return ``(score, bid)`` of a ``market_bid`` reply: score finite in ``[0, highest_score]``, bid finite ``> 0``."""
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


