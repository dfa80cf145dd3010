"""Hostile or broken replies, fuzzed against the server side of the market phase, at each of its eight steps.

Every case runs the whole market phase (``MarketPhase.run``) over real ClientApps on an
in-process grid; :class:`FuzzGrid` lets a case rewrite, drop, duplicate or add the replies the
server receives for one node's messages at one step (each crafted reply crosses Flower's wire
format, so only what a ``Message`` can really carry arrives). The offender is a winner of the
honest auction, so that its audit reply is fuzzed too. A case passes when:

* the phase neither raises nor hangs (no case here leaves too few clients for a ``MarketError``);
* a node whose reply is malformed is excluded, with a reason naming the step (or ``PASS``, for what
  the protocol object itself refuses), logged at WARNING (the award step has nothing to exclude
  from: a bad acknowledgement is logged); a score or bid changed in transit is not what the client sent, so the
  client refuses to endorse the award that lists it, and is excluded at the endorse step;
* replies the server must ignore (second replies, replies from a node other than the one asked,
  replies to unknown messages) change nothing;
* the sum is exact over the nodes whose masked input counts, and the outcome is the one computed
  directly from the true counts, scores and bids of the nodes left, with finite payments within the budget.

Two families: an enumerated corpus (:data:`CORPUS`: wrong types, lengths, huge values, NaN/inf,
negative numbers, missing fields, error replies, duplicated, spoofed, stale and cross-wired
replies, at each of the seven steps) and a Hypothesis search over arbitrary ``ConfigRecord``
contents (:func:`test_random_records_never_break_the_market`, derandomised for CI).

Out of scope here: a *well-formed* lie inside PASS (another valid 32-byte key, a masked vector of the
right length but the wrong value) cannot be told from the truth by the server; a returned unmask share
of the wrong value can, and names its sender (``test_adversarial_clients.py``).
Such a lie either makes the liar's own next step fail, or poisons the sum, which is then refused
when it leaves its declared bounds (``test_market_faults.py::test_a_poisoned_masked_vector_is_refused_never_used``);
a false counts commitment is caught at the audit.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from uuid import uuid4

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from flmarket_flwr.market import CostBasedBid, MarketConfig, MarketPhase
from flmarket_flwr.market.wire.messages import (
    ACTION_ADVERTISE,
    ACTION_AUDIT,
    ACTION_AWARD,
    ACTION_BID,
    ACTION_BIND,
    ACTION_DRAW,
    ACTION_ENDORSE,
    ACTION_MASK,
    ACTION_SHARE,
    ACTION_SURVIVORS,
    ACTION_TAGS,
    ACTION_UNMASK,
    ACTIONS,
    KEY_ACCEPTED,
    KEY_BID,
    KEY_COUNTS,
    KEY_ENDORSEMENT,
    KEY_NONCE,
    KEY_SCORE,
    RECORD_KEY,
)
from flmarket_flwr.pass_protocol.primitives import load_public_key
from flmarket_flwr.pricing import run_auction, score
from simulations.inprocess_grid import InProcessGrid, market_client_app, wire_roundtrip

NUM_CLASSES = 5
NUM_NODES = 6
BUDGET = 150.0
TIMEOUT = 3.0  # the step timeout: every reply, however large, arrives within one pull of the in-process grid
DROP_TIMEOUT = 0.5  # for cases whose reply never arrives (small replies only), so that the wait stays cheap
COST, MARKUP = 0.05, 0.2
_RNG = np.random.default_rng(99)
COUNTS = {4000 + 13 * i: _RNG.integers(1, 45, size=NUM_CLASSES) * (i + 1) for i in range(NUM_NODES)}
NODES = sorted(COUNTS)
OFFENDER = NODES[2]  # a winner of the honest auction (checked below), so that its audit is fuzzed
BYSTANDER = NODES[1]  # another winner, named by spoofed and cross-wired replies
# The consistency round needs identity keys; the tags step runs only for a buyer that names a tag
# (tests/test_market_membership.py plays a node silent or lying there); the bind step only with a directory keyed by
# member (tests/test_member_directory.py plays nodes and a buyer lying there).
STEPS = tuple(action for action in ACTIONS if action not in (ACTION_DRAW, ACTION_SURVIVORS, ACTION_TAGS, ACTION_BIND))
PASS_STEPS = (ACTION_ADVERTISE, ACTION_SHARE, ACTION_MASK, ACTION_UNMASK)
FIELDS = {
    ACTION_ADVERTISE: ("cipher_public_key", "mask_public_key", "signature", "cipher_key_proof"),
    ACTION_SHARE: ("receivers", "ciphertexts"),
    ACTION_MASK: ("masked_counts", "counts_commitment"),
    ACTION_UNMASK: ("survivor_indices", "survivor_shares", "dropped_indices", "dropped_shares"),
    ACTION_BID: (KEY_SCORE, KEY_BID),
    ACTION_ENDORSE: (KEY_ENDORSEMENT,),
    ACTION_AUDIT: (KEY_COUNTS, KEY_NONCE),
    ACTION_AWARD: (KEY_ACCEPTED,),
}

# Replies as seen by the server for one instruction: (grid, instruction, genuine reply) -> replies.
Rewrite = Callable[["FuzzGrid", Message, Message], list[Message]]


class FuzzGrid(InProcessGrid):
    """An in-process grid whose replies to ``(node, step)`` go through ``rewrite`` first."""

    def __init__(self, rewrite: Rewrite, node: int, step: str, once: bool = False) -> None:
        super().__init__(market_client_app(COUNTS, CostBasedBid(COST, markup=MARKUP)), NODES)
        self.rewrite, self.node, self.step, self.once = rewrite, node, step, once
        self.by_id: dict[str, Message] = {}
        self.rewritten = 0

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        messages = list(messages)
        ids = super().push_messages(messages)
        self.by_id.update(zip(ids, messages, strict=True))
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        replies = []
        for reply in super().pull_messages(list(message_ids)):
            instruction = self.by_id[reply.metadata.reply_to_message_id]
            targeted = instruction.metadata.dst_node_id == self.node and instruction.metadata.message_type.endswith(
                self.step
            )
            if targeted and not (self.once and self.rewritten):
                self.rewritten += 1
                replies.extend(wire_roundtrip(_with_id(m))[0] for m in self.rewrite(self, instruction, reply))
            else:
                replies.append(reply)
        return replies

    def instruction(self, node: int, step: str) -> Message:
        """The latest instruction sent to ``node`` for ``step``."""
        return [m for m in self.sent if m.metadata.dst_node_id == node and m.metadata.message_type.endswith(step)][-1]


def _with_id(message: Message) -> Message:
    if not message.metadata.message_id:
        message.metadata.__dict__["_message_id"] = str(uuid4())
    return message


def _content(record: ConfigRecord) -> RecordDict:
    return RecordDict({RECORD_KEY: record})


# --- Rewrites -----------------------------------------------------------------------------------
def set_field(key: str, value: object) -> Rewrite:
    """The genuine record with ``key`` set to ``value`` (removed when ``value`` is ``MISSING``)."""

    def rewrite(grid: FuzzGrid, instruction: Message, reply: Message) -> list[Message]:
        record = ConfigRecord(dict(reply.content.config_records[RECORD_KEY]))
        if value is MISSING:
            del record[key]
        else:
            record[key] = value  # type: ignore[assignment]
        return [Message(_content(record), reply_to=instruction)]

    return rewrite


MISSING = object()


def replace_content(content: Callable[[], RecordDict]) -> Rewrite:
    return lambda grid, instruction, reply: [Message(content(), reply_to=instruction)]


def error_reply(code: int, reason: str) -> Rewrite:
    return lambda grid, instruction, reply: [Message(Error(code=code, reason=reason), reply_to=instruction)]


def drop(grid: FuzzGrid, instruction: Message, reply: Message) -> list[Message]:
    return []


def duplicate(grid: FuzzGrid, instruction: Message, reply: Message) -> list[Message]:
    return [reply, reply]


def then(first: Rewrite, second: Rewrite) -> Rewrite:
    return lambda grid, instruction, reply: first(grid, instruction, reply) + second(grid, instruction, reply)


def genuine(grid: FuzzGrid, instruction: Message, reply: Message) -> list[Message]:
    return [reply]


def from_node(src: int) -> Rewrite:
    """The genuine reply, claiming to come from node ``src``."""

    def rewrite(grid: FuzzGrid, instruction: Message, reply: Message) -> list[Message]:
        spoofed = Message(reply.content, reply_to=instruction)
        spoofed.metadata.__dict__["_src_node_id"] = src
        return [spoofed]

    return rewrite


def to_message_of(node: int, step: str | None = None) -> Rewrite:
    """The genuine content, as a reply to ``node``'s latest ``step`` message (this step by default)."""

    def rewrite(grid: FuzzGrid, instruction: Message, reply: Message) -> list[Message]:
        target = grid.instruction(node, step or grid.step)
        crossed = Message(reply.content, reply_to=instruction)
        crossed.metadata.__dict__["_reply_to_message_id"] = target.metadata.message_id
        return [crossed]

    return rewrite


def to_unknown_message(grid: FuzzGrid, instruction: Message, reply: Message) -> list[Message]:
    stray = Message(reply.content, reply_to=instruction)
    stray.metadata.__dict__["_reply_to_message_id"] = str(uuid4())
    return [stray]


def from_unknown_node(grid: FuzzGrid, instruction: Message, reply: Message) -> list[Message]:
    """A reply from a node that is not in the federation, to this node's message."""
    return from_node(123_456_789)(grid, instruction, reply)


def change_field(key: str, change: Callable[[object], object]) -> Rewrite:
    """The genuine record with ``key`` set to ``change(genuine value)``."""

    def rewrite(grid: FuzzGrid, instruction: Message, reply: Message) -> list[Message]:
        record = ConfigRecord(dict(reply.content.config_records[RECORD_KEY]))
        record[key] = change(record[key])  # type: ignore[assignment]
        return [Message(_content(record), reply_to=instruction)]

    return rewrite


OTHER_STEPS_CONTENT = {  # a well-formed reply of the next step, for each step
    ACTION_ADVERTISE: {"receivers": [1, 2], "ciphertexts": [b"x" * 140, b"y" * 140]},
    ACTION_SHARE: {"masked_counts": bytes(8 * NUM_CLASSES), "counts_commitment": bytes(32)},
    ACTION_MASK: {
        "survivor_indices": [1],
        "survivor_shares": [bytes(44)],
        "dropped_indices": [2],
        "dropped_shares": [bytes(44)],
    },
    ACTION_UNMASK: {KEY_SCORE: 1.0, KEY_BID: 1.0},
    ACTION_BID: {KEY_ENDORSEMENT: bytes(64)},
    ACTION_ENDORSE: {KEY_COUNTS: [1] * NUM_CLASSES, KEY_NONCE: bytes(32)},
    ACTION_AUDIT: {KEY_ACCEPTED: True},
}


def other_steps_content(step: str) -> Rewrite:
    return replace_content(lambda: _content(ConfigRecord(dict(OTHER_STEPS_CONTENT[step]))))  # type: ignore[arg-type]


# --- Hostile values -----------------------------------------------------------------------------
LOW_ORDER_POINTS = [  # X25519 points whose exchange gives an all-zero secret with any key
    bytes(32),
    b"\x01" + bytes(31),
    bytes.fromhex("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800"),
    bytes.fromhex("5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157"),
    bytes.fromhex("ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f"),
]
WRONG_TYPES: list[object] = [
    0, 1, -1, 2**63 - 1, -(2**63), 2**64 - 1,
    0.0, -0.0, 1.5, 1e308, -1e308, 5e-324, math.nan, math.inf, -math.inf,
    True, False,
    "", "12", "x" * 1_000_000,
    [], [1] * NUM_CLASSES, [-1] * NUM_CLASSES, [1.0] * NUM_CLASSES, [math.nan] * NUM_CLASSES,
    [True], ["a"], [b"\x00" * 8] * NUM_CLASSES, list(range(100_000)),
]  # fmt: skip
NOT_BYTES = [v for v in WRONG_TYPES if not isinstance(v, bytes)]
NOT_INT_LISTS = [v for v in WRONG_TYPES if not (isinstance(v, list) and v and all(type(x) is int for x in v))]
NOT_BYTES_LISTS = [v for v in WRONG_TYPES if not (isinstance(v, list) and v and all(type(x) is bytes for x in v))]
WRONG_BYTES = [b"", b"\x00", b"\x01" * 31, b"\x01" * 33, b"\x00" * (8 * NUM_CLASSES - 1), b"\xff" * 1_000_000]
MALFORMED_KEYS = NOT_BYTES + WRONG_BYTES + LOW_ORDER_POINTS
MALFORMED_MASKS = (
    NOT_BYTES
    + [b for b in WRONG_BYTES if len(b) != 8 * NUM_CLASSES]
    + [
        b"\x00" * (8 * NUM_CLASSES + 8),
        b"\x00" * (8 * NUM_CLASSES - 8),
        b"\x00" * 4,
    ]
)
MALFORMED_COMMITMENTS = NOT_BYTES + [b for b in WRONG_BYTES if len(b) != 32]
BAD_SCORES = [
    -1.0, -5e-324, -(2**63), -1e308, 1e308, 1e30, 2**63 - 1, 2**64 - 1, math.nan, math.inf, -math.inf,
    True, False, "1.0", b"1", [1.0], [],
]  # fmt: skip
OUT_OF_RANGE = [5e-324, 1e-300, 1e308]  # beyond the auction's [1e-100, 1e100]: refused
BAD_BIDS = [0, 0.0, -0.0, -1.0, -5e-324, -1e308, -(2**63), math.nan, math.inf, -math.inf, True, "2.0", b"2", [2.0]]
BAD_BIDS += OUT_OF_RANGE
BAD_SCORES += [5e-324, 1e-300]  # a positive score below the auction's range
EXTREME_VALID_BIDS = [1e-100, 1e100, 2**63 - 1, 2**64 - 1, 1, BUDGET, BUDGET * (1 + 1e-15)]  # within its range
EXTREME_VALID_SCORES = [0, 0.0, 1e-100]  # below the highest possible score: accepted
VALID_SIGNATURES = [b"", b"x", bytes(64), b"\xff" * 1000]  # no directory: a signature is not checked
BAD_AUDIT_COUNTS = [
    *NOT_INT_LISTS,
    [0] * NUM_CLASSES,
    [1] * (NUM_CLASSES - 1),
    [10**9 + 1] * NUM_CLASSES,
    [-1] * NUM_CLASSES,
    [1] * (NUM_CLASSES + 1),
]
BAD_NONCES = [*NOT_BYTES, b"", bytes(32), b"\x01" * 31]


@dataclass(frozen=True)
class Case:
    """One fuzz case: what happens to ``node``'s replies at ``step``, and what must follow."""

    step: str
    rewrite: Rewrite
    excluded: bool  # the offender must be excluded (or, at the award step, not acknowledged)
    node: int = OFFENDER
    claimed: tuple[float | None, float | None] = (None, None)  # (score, bid) it claims instead of the truth
    timeout: float = TIMEOUT


def _corpus() -> dict[str, Case]:
    cases: dict[str, Case] = {}

    def add(name: str, case: Case) -> None:
        assert name not in cases, name
        cases[name] = case

    for step in STEPS:
        # Message-level: errors, missing or foreign content, duplicates, spoofing, strays.
        excluded = True
        for code, reason in [(0, ""), (-1, "x"), (2**31 - 1, "é" * 10_000), (2, "flmarket: fake")]:
            add(f"{step}/error-{code}-{len(reason)}", Case(step, error_reply(code, reason), excluded))
        add(f"{step}/empty-recorddict", Case(step, replace_content(RecordDict), excluded))
        foreign = {
            "other-record-key": lambda: RecordDict({"x": ConfigRecord({"a": 1})}),
            "metric-record": lambda: RecordDict({RECORD_KEY: MetricRecord({"a": 1.0})}),
            "array-record": lambda: RecordDict({RECORD_KEY: ArrayRecord()}),
        }
        for label, content in foreign.items():
            add(f"{step}/{label}", Case(step, replace_content(content), excluded))
        # Only-reply-lost cases: the server waits for the step's timeout, kept short here.
        add(f"{step}/timeout", Case(step, drop, excluded, timeout=DROP_TIMEOUT))
        add(f"{step}/spoofed-src-only", Case(step, from_node(BYSTANDER), excluded, timeout=DROP_TIMEOUT))
        add(f"{step}/cross-wired-only", Case(step, to_message_of(BYSTANDER), excluded, timeout=DROP_TIMEOUT))
        add(f"{step}/unknown-message-only", Case(step, to_unknown_message, excluded, timeout=DROP_TIMEOUT))
        add(f"{step}/unknown-node-only", Case(step, from_unknown_node, excluded, timeout=DROP_TIMEOUT))
        # Ignored extras: the genuine reply is there too, the outcome is the clean one.
        add(f"{step}/duplicate", Case(step, duplicate, False))
        add(f"{step}/genuine-then-malformed", Case(step, then(genuine, error_reply(0, "late")), False))
        add(f"{step}/genuine-plus-unknown-node", Case(step, then(from_unknown_node, genuine), False))
        add(f"{step}/genuine-plus-unknown-message", Case(step, then(to_unknown_message, genuine), False))
        add(f"{step}/genuine-plus-spoofed-for-bystander", Case(step, then(to_message_of(BYSTANDER), genuine), False))
        add(f"{step}/malformed-then-genuine", Case(step, then(error_reply(0, "first"), genuine), True))
        if step not in (ACTION_ADVERTISE, ACTION_AWARD):  # a reply to the previous step's message, left over
            previous = STEPS[STEPS.index(step) - 1]
            add(f"{step}/stale-reply-only", Case(step, to_message_of(OFFENDER, previous), True, timeout=DROP_TIMEOUT))
            add(f"{step}/genuine-plus-stale", Case(step, then(to_message_of(OFFENDER, previous), genuine), False))
        if step != ACTION_AWARD:
            add(f"{step}/other-steps-content", Case(step, other_steps_content(step), True))
        for key in FIELDS[step]:
            if step != ACTION_AWARD:
                add(f"{step}/{key}-missing", Case(step, set_field(key, MISSING), True))

    def values(step: str, key: str, bad: list[object], excluded: bool = True) -> None:
        for i, value in enumerate(bad):
            add(f"{step}/{key}-{i}-{type(value).__name__}", Case(step, set_field(key, value), excluded))

    values(ACTION_ADVERTISE, "cipher_public_key", MALFORMED_KEYS)
    values(ACTION_ADVERTISE, "mask_public_key", MALFORMED_KEYS)
    values(ACTION_ADVERTISE, "signature", NOT_BYTES)
    values(ACTION_ADVERTISE, "cipher_key_proof", [*NOT_BYTES, b"", bytes(96)])  # no proof of possession
    for i, value in enumerate(VALID_SIGNATURES):
        add(f"{ACTION_ADVERTISE}/signature-valid-{i}", Case(ACTION_ADVERTISE, set_field("signature", value), False))
    add(
        f"{ACTION_ADVERTISE}/same-key-twice",
        Case(
            ACTION_ADVERTISE,
            lambda g, i, r: set_field("mask_public_key", r.content.config_records[RECORD_KEY]["cipher_public_key"])(
                g, i, r
            ),
            True,
        ),
    )
    values(ACTION_SHARE, "receivers", NOT_INT_LISTS)
    values(ACTION_SHARE, "ciphertexts", NOT_BYTES_LISTS)
    share_changes = {
        "receivers-reversed": ("receivers", lambda v: list(reversed(v))),
        "receivers-one-less": ("receivers", lambda v: list(v)[:-1]),
        "receivers-stranger": ("receivers", lambda v: [*list(v)[:-1], 99]),
        "ciphertexts-one-less": ("ciphertexts", lambda v: list(v)[:-1]),
        "ciphertexts-one-more": ("ciphertexts", lambda v: [*v, v[0]]),
        "ciphertexts-short": ("ciphertexts", lambda v: [c[:-1] for c in v]),
        "ciphertexts-long": ("ciphertexts", lambda v: [c + b"\x00" for c in v]),
    }
    for name, (key, change) in share_changes.items():
        add(f"{ACTION_SHARE}/{name}", Case(ACTION_SHARE, change_field(key, change), True))
    values(ACTION_MASK, "masked_counts", MALFORMED_MASKS)
    values(ACTION_MASK, "counts_commitment", MALFORMED_COMMITMENTS)
    for key in ("survivor_indices", "dropped_indices"):
        values(ACTION_UNMASK, key, [v for v in NOT_INT_LISTS if v != []])
    for key in ("survivor_shares", "dropped_shares"):
        values(ACTION_UNMASK, key, [v for v in NOT_BYTES_LISTS if v != []])
    unmask_changes = {
        "survivor-stranger": ("survivor_indices", lambda v: [*list(v)[:-1], 99]),
        "survivor-self": ("survivor_indices", lambda v: [*list(v)[:-1], 3]),
        "survivor-repeated": ("survivor_indices", lambda v: [v[0]] * len(v)),
        "survivor-one-less": ("survivor_indices", lambda v: list(v)[:-1]),
        "survivor-shares-short": ("survivor_shares", lambda v: [s[:-1] for s in v]),
        "survivor-shares-one-more": ("survivor_shares", lambda v: [*v, v[0]]),
        "dropped-named-alive": ("dropped_indices", lambda v: [1]),
    }
    for name, (key, change) in unmask_changes.items():
        add(f"{ACTION_UNMASK}/{name}", Case(ACTION_UNMASK, change_field(key, change), True))
    values(ACTION_BID, KEY_SCORE, BAD_SCORES)
    values(ACTION_BID, KEY_BID, BAD_BIDS)
    for i, value in enumerate(EXTREME_VALID_BIDS):
        add(
            f"{ACTION_BID}/extreme-valid-bid-{i}",
            Case(ACTION_BID, set_field(KEY_BID, value), False, claimed=(None, float(value))),
        )
    for i, value in enumerate(EXTREME_VALID_SCORES):
        add(
            f"{ACTION_BID}/extreme-valid-score-{i}",
            Case(ACTION_BID, set_field(KEY_SCORE, value), False, claimed=(float(value), None)),
        )
    values(ACTION_AUDIT, KEY_COUNTS, BAD_AUDIT_COUNTS)
    values(ACTION_AUDIT, KEY_NONCE, BAD_NONCES)
    add(
        f"{ACTION_AUDIT}/counts-plus-one",
        Case(ACTION_AUDIT, change_field(KEY_COUNTS, lambda v: [x + 1 for x in v]), True),
    )
    for i, value in enumerate([False, 0, "no", b"", [], math.nan]):  # a bool acknowledges; anything else is malformed
        add(f"{ACTION_AWARD}/accepted-{i}", Case(ACTION_AWARD, set_field(KEY_ACCEPTED, value), value is not False))
    return cases


CORPUS = _corpus()


# --- Checking one case --------------------------------------------------------------------------
def true_score_and_bid(node: int, pass_nodes: list[int]) -> tuple[float, float]:
    total = np.sum([COUNTS[n] for n in pass_nodes], axis=0)
    return score(COUNTS[node], total, len(pass_nodes)), COST * float(COUNTS[node].sum()) * (1 + MARKUP)


def expected(
    pass_nodes: list[int],
    bidders: list[int],
    claimed: dict[int, tuple[float | None, float | None]] | None = None,
    failing: frozenset[int] = frozenset(),
):
    """``(N_s, winners, payments, bidders left)`` of the audited auction, as the server runs it.

    Bids above the budget stay (paid 0) but are left out of the auction; payments are capped at the budget. The
    award is never re-issued: a winner whose claimed score or bid is not the one it sent (changed in transit)
    refuses to endorse it, and a winner in ``failing`` refuses it or fails its audit; either is left out unpaid, the
    other winners keep the award's payments, and nobody is promoted. A loser's claim stands in the award.
    """
    total = np.sum([COUNTS[n] for n in pass_nodes], axis=0)
    true = {n: true_score_and_bid(n, pass_nodes) for n in bidders}
    claims = dict(true)
    for node, (new_score, new_bid) in (claimed or {}).items():
        claims[node] = (
            true[node][0] if new_score is None else new_score,
            true[node][1] if new_bid is None else new_bid,
        )
    payments = {n: 0.0 for n in bidders}
    in_auction = [n for n in bidders if claims[n][1] <= BUDGET]
    result = run_auction([claims[n][0] for n in in_auction], [claims[n][1] for n in in_auction], BUDGET)
    awarded = [in_auction[i] for i in result.winners]
    payments.update({n: min(float(result.payments[i]), BUDGET) for i, n in enumerate(in_auction)})
    dropped = {n for n in awarded if claims[n] != true[n] or n in failing}
    winners = [n for n in awarded if n not in dropped]
    kept = {n: payment for n, payment in payments.items() if n not in dropped}
    return total, winners, kept, [n for n in bidders if n not in dropped]


def run_case(case: Case, caplog, once: bool = False):
    grid = FuzzGrid(case.rewrite, case.node, case.step, once=once)
    cfg = MarketConfig(
        budget=BUDGET, num_classes=NUM_CLASSES, timeout=case.timeout, timeout_per_node=0.0, poll_interval=0.001
    )
    with caplog.at_level(logging.WARNING, logger="flwr"):
        outcome = MarketPhase(cfg).run(grid)  # any exception fails the case
    assert grid.rewritten >= 1, "the case never applied"
    payments = np.array(list(outcome.payments.values()))
    assert np.isfinite(payments).all() and (payments >= 0).all() and (payments <= BUDGET).all()
    assert math.isfinite(outcome.total_payment) and outcome.total_payment <= BUDGET * (1 + 1e-12)
    assert set(outcome.excluded) <= {case.node}, f"an honest node was excluded: {outcome.excluded}"
    endorse = (ACTION_ENDORSE + ":",) if case.step == ACTION_BID else ()  # the award lists what it did not send
    for node, reason in outcome.excluded.items():
        assert reason.startswith((case.step + ":", "PASS:", *endorse)), reason
        assert f"excluding node {node} (" in caplog.text
    return outcome, grid


def test_the_offender_and_the_bystander_win_the_honest_auction() -> None:
    _, winners, _, _ = expected(NODES, NODES)
    assert OFFENDER in winners and BYSTANDER in winners and len(winners) < NUM_NODES


@pytest.mark.parametrize("name", list(CORPUS))
def test_corpus_case(name: str, caplog) -> None:
    case = CORPUS[name]
    outcome, grid = run_case(case, caplog)
    others = [n for n in NODES if n != case.node]
    if case.step == ACTION_AWARD:
        total, winners, payments, bidders = expected(NODES, NODES)
        if case.excluded:
            assert outcome.award_acknowledged == others
            assert f"node {case.node} did not acknowledge its award" in caplog.text
        else:
            assert outcome.award_acknowledged == NODES
        assert outcome.excluded == {}
    elif case.excluded:
        assert set(outcome.excluded) == {case.node}
        in_sum = others if case.step in (ACTION_ADVERTISE, ACTION_SHARE, ACTION_MASK) else NODES
        if case.step in (ACTION_ENDORSE, ACTION_AUDIT):  # it bid: the one award lists it, and it is left out of it
            total, winners, payments, bidders = expected(in_sum, NODES, failing=frozenset({case.node}))
        else:
            total, winners, payments, bidders = expected(in_sum, others)
        assert outcome.pass_participants == in_sum
    else:
        claimed = {case.node: case.claimed} if case.claimed != (None, None) else None
        assert outcome.excluded.keys() == ({case.node} if claimed else set())  # it refused the award listing it
        total, winners, payments, bidders = expected(NODES, NODES, claimed)
        assert outcome.pass_participants == NODES
    assert outcome.global_counts == [int(c) for c in total]
    assert outcome.participants == bidders
    assert outcome.winners == winners
    assert outcome.payments == pytest.approx(payments, rel=1e-12)


# --- Random records (Hypothesis) ----------------------------------------------------------------
# Flower serialises an int list as sint64 or as uint64: one list cannot mix -1 and 2**63.
INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
UINT64 = st.integers(min_value=2**63, max_value=2**64 - 1)
SMALL = st.integers(min_value=-2, max_value=8)  # near the PASS indices and the counts
FLOATS = st.floats(allow_nan=True, allow_infinity=True)
SCALARS = st.one_of(INT64, UINT64, FLOATS, st.booleans(), st.text(max_size=40), st.binary(max_size=80))
VALUES = st.one_of(
    SCALARS,
    st.lists(INT64, max_size=12),
    st.lists(SMALL, max_size=6),
    st.lists(UINT64, max_size=4),
    st.lists(FLOATS, max_size=12),
    st.lists(st.binary(max_size=60), max_size=12),
    st.lists(st.text(max_size=8), max_size=4),
    st.lists(st.booleans(), max_size=4),
)
RECORD_KEYS = st.one_of(
    st.sampled_from(sorted({k for keys in FIELDS.values() for k in keys})), st.text(min_size=1, max_size=10)
)


MISSING_FIELD = object()


def _is_pass_lie(step: str, key: str, value: object) -> bool:
    """A PASS value of the right shape: a lie the server cannot tell from the truth (out of scope, see above)."""
    if not isinstance(value, bytes):
        return False
    if key in ("cipher_public_key", "mask_public_key"):
        try:
            load_public_key(value, index=0)
        except (TypeError, ValueError):
            return False
        return True
    return (key, len(value)) in (("masked_counts", 8 * NUM_CLASSES), ("counts_commitment", 32))


RANDOM_EXAMPLES = 250


@settings(
    max_examples=RANDOM_EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    step=st.sampled_from(STEPS),
    record=st.dictionaries(RECORD_KEYS, VALUES, max_size=4),
    keep_genuine_fields=st.booleans(),
)
def test_random_records_never_break_the_market(
    step: str, record: dict[str, object], keep_genuine_fields: bool, caplog
) -> None:
    """The offender's reply at ``step`` becomes an arbitrary record (optionally over its genuine fields)."""
    genuine_fields: dict[str, object] = {}

    def rewrite(grid: FuzzGrid, instruction: Message, reply: Message) -> list[Message]:
        genuine_fields.update(reply.content.config_records[RECORD_KEY])
        fields = dict(genuine_fields) if keep_genuine_fields else {}
        fields.update(record)
        return [Message(_content(ConfigRecord(fields)), reply_to=instruction)]

    for key, value in record.items():
        assume(not (key in FIELDS[step] and _is_pass_lie(step, key, value)))
    caplog.clear()
    outcome, _ = run_case(Case(step, rewrite, excluded=False), caplog)

    changed = [
        key
        for key in FIELDS[step]
        if (record[key] if key in record else genuine_fields[key] if keep_genuine_fields else MISSING_FIELD)
        != genuine_fields[key]
    ]
    others = [n for n in NODES if n != OFFENDER]
    signature_only = changed and all(k == "signature" for k in changed) and isinstance(record["signature"], bytes)
    if step in (ACTION_ADVERTISE, ACTION_SHARE, ACTION_MASK) and changed and not signature_only:
        # Anything but a well-formed reply of its step is malformed: the offender is out of PASS.
        assert OFFENDER in outcome.excluded
        in_sum = others
    else:
        in_sum = NODES
    assert outcome.pass_participants == in_sum
    assert outcome.global_counts == [int(c) for c in np.sum([COUNTS[n] for n in in_sum], axis=0)]
    assert set(outcome.participants) >= set(others)
    assert set(outcome.winners) <= set(outcome.participants)
    if step == ACTION_AUDIT and changed:
        assert OFFENDER in outcome.excluded and OFFENDER not in outcome.winners
    if step == ACTION_AWARD:  # a reply whose `accepted` is a bool acknowledges; anything else is malformed
        accepted = record.get(KEY_ACCEPTED, genuine_fields.get(KEY_ACCEPTED) if keep_genuine_fields else None)
        acknowledges = isinstance(accepted, bool)
        assert outcome.award_acknowledged == (NODES if acknowledges else others)
    if not changed:
        _, winners, payments, _ = expected(NODES, NODES)
        assert outcome.excluded == {} and outcome.winners == winners
        assert outcome.payments == pytest.approx(payments, rel=1e-12)


def test_corpus_size() -> None:
    """Every step has its own share of the enumerated cases (plus the random ones)."""
    per_step = {step: sum(1 for case in CORPUS.values() if case.step == step) for step in STEPS}
    assert all(count >= 15 for count in per_step.values()), per_step
    assert sum(per_step.values()) == len(CORPUS) >= 400, per_step
