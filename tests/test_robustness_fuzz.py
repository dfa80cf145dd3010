"""Hostile or broken replies, fuzzed against the server side of the market phase.

Every case runs the whole market phase (``MarketPhase.run``) over real ClientApps on an
in-process grid; :class:`FuzzGrid` lets a case rewrite, drop, duplicate or add the replies the
server receives for one node's messages at one step (each crafted reply crosses Flower's wire
format, so only what a ``Message`` can really carry arrives). A case passes when:

* the phase neither raises nor hangs (a ``MarketError`` is accepted only where too few clients
  are left, which no case here produces);
* a node whose reply is malformed is excluded, with a reason naming the step, logged at WARNING
  (the award step has nothing to exclude from: a bad acknowledgement is logged);
* replies the server must ignore (second replies, replies from a node other than the one asked,
  replies to unknown messages) change nothing;
* the outcome is the one computed directly from the true counts, scores and bids of the nodes
  left, and its payments are finite and within the budget.

Two families: an enumerated corpus (:data:`CORPUS`: wrong types, lengths, huge values, NaN/inf,
negative numbers, missing fields, error replies, duplicated, spoofed, stale and cross-wired
replies, at each of the four steps) and a Hypothesis search over arbitrary ``ConfigRecord``
contents (:func:`test_random_records_never_break_the_market`, derandomised for CI). The case
counts are asserted below and reported in ``benchmarks/RESULTS.md``.

Out of scope by design (PASS's semi-honest model): a *well-formed* lie inside PASS (a valid
but wrong 32-byte key, or a masked vector of the right length) cannot be told from the truth;
it breaks the mask cancellation, is detected with probability ``1 - 2**-C`` and makes PASS
restart (``test_market_faults.py::test_round_two_dropout_reruns_pass_with_fresh_keys``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from uuid import uuid4

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from flwr.app import ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict

from flmarket_flwr.market import CostBasedBid, MarketConfig, MarketPhase
from flmarket_flwr.market.messages import (
    ACTION_AWARD,
    ACTION_BID,
    ACTION_KEYS,
    ACTION_MASK,
    KEY_ACCEPTED,
    KEY_BID,
    KEY_MASKED_COUNTS,
    KEY_PUBLIC_KEY,
    KEY_SCORE,
    RECORD_KEY,
)
from flmarket_flwr.market.testing import InProcessGrid, market_client_app, wire_roundtrip
from flmarket_flwr.pass_protocol import load_public_key
from flmarket_flwr.pricing import run_auction, score

NUM_CLASSES = 5
NUM_NODES = 6
BUDGET = 70.0
COST, MARKUP = 0.05, 0.2
_RNG = np.random.default_rng(99)
COUNTS = {4000 + 13 * i: _RNG.integers(1, 45, size=NUM_CLASSES) * (i + 1) for i in range(NUM_NODES)}
NODES = sorted(COUNTS)
OFFENDER = NODES[2]
BYSTANDER = NODES[4]  # another node, named by spoofed and cross-wired replies
STEPS = (ACTION_KEYS, ACTION_MASK, ACTION_BID, ACTION_AWARD)
FIELD = {ACTION_KEYS: KEY_PUBLIC_KEY, ACTION_MASK: KEY_MASKED_COUNTS, ACTION_AWARD: KEY_ACCEPTED}

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
        self.by_id.update(zip(ids, messages))
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


def other_steps_content(step: str) -> Rewrite:
    """A well-formed reply of another step (keys content for a bid message, ...)."""
    contents = {
        ACTION_KEYS: ConfigRecord({KEY_MASKED_COUNTS: bytes(8 * NUM_CLASSES)}),
        ACTION_MASK: ConfigRecord({KEY_SCORE: 1.0, KEY_BID: 1.0}),
        ACTION_BID: ConfigRecord({KEY_ACCEPTED: True}),
        ACTION_AWARD: ConfigRecord({KEY_PUBLIC_KEY: bytes(32)}),
    }
    return replace_content(lambda: _content(contents[step]))


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
WRONG_BYTES = [b"", b"\x00", b"\x01" * 31, b"\x01" * 33, b"\x00" * (8 * NUM_CLASSES - 1), b"\xff" * 1_000_000]
MALFORMED_KEYS = [v for v in WRONG_TYPES if not isinstance(v, bytes)] + WRONG_BYTES + LOW_ORDER_POINTS
MALFORMED_MASKS = (
    [v for v in WRONG_TYPES if not isinstance(v, bytes)]
    + [b for b in WRONG_BYTES if len(b) != 8 * NUM_CLASSES]
    + [b"\x00" * (8 * NUM_CLASSES + 8), b"\x00" * (8 * NUM_CLASSES - 8), b"\x00" * 4]
)
BAD_SCORES = [
    -1.0, -5e-324, -(2**63), -1e308, 1e308, 1e30, 2**63 - 1, 2**64 - 1, math.nan, math.inf, -math.inf,
    True, False, "1.0", b"1", [1.0], [],
]  # fmt: skip
BAD_BIDS = [0, 0.0, -0.0, -1.0, -5e-324, -1e308, -(2**63), math.nan, math.inf, -math.inf, True, "2.0", b"2", [2.0]]
EXTREME_VALID_BIDS = [5e-324, 1e-300, 1e308, 2**63 - 1, 2**64 - 1, 1]  # finite and > 0: accepted, paid <= budget
EXTREME_VALID_SCORES = [0, 0.0, 5e-324, 1e-300]  # below the highest possible score: accepted


@dataclass(frozen=True)
class Case:
    """One fuzz case: what happens to ``node``'s replies at ``step``, and what must follow."""

    step: str
    rewrite: Rewrite
    excluded: bool  # the offender must be excluded (or, at the award step, not acknowledged)
    node: int = OFFENDER


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
        add(f"{step}/timeout", Case(step, drop, excluded))
        add(f"{step}/spoofed-src-only", Case(step, from_node(BYSTANDER), excluded))
        add(f"{step}/cross-wired-only", Case(step, to_message_of(BYSTANDER), excluded))
        add(f"{step}/unknown-message-only", Case(step, to_unknown_message, excluded))
        add(f"{step}/unknown-node-only", Case(step, from_unknown_node, excluded))
        # Ignored extras: the genuine reply is there too, the outcome is the clean one.
        add(f"{step}/duplicate", Case(step, duplicate, False))
        add(f"{step}/genuine-then-malformed", Case(step, then(genuine, error_reply(0, "late")), False))
        add(f"{step}/genuine-plus-unknown-node", Case(step, then(from_unknown_node, genuine), False))
        add(f"{step}/genuine-plus-unknown-message", Case(step, then(to_unknown_message, genuine), False))
        add(f"{step}/genuine-plus-spoofed-for-bystander", Case(step, then(to_message_of(BYSTANDER), genuine), False))
        add(f"{step}/malformed-then-genuine", Case(step, then(error_reply(0, "first"), genuine), True))
        if step != ACTION_AWARD:  # a reply to the previous step's message, left over
            previous = STEPS[STEPS.index(step) - 1] if step != ACTION_KEYS else None
            if previous is not None:
                add(f"{step}/stale-reply-only", Case(step, to_message_of(OFFENDER, previous), True))
                add(f"{step}/genuine-plus-stale", Case(step, then(to_message_of(OFFENDER, previous), genuine), False))
        if step != ACTION_AWARD:
            add(f"{step}/other-steps-content", Case(step, other_steps_content(step), True))

    for i, value in enumerate(MALFORMED_KEYS):
        add(f"keys/value-{i}-{type(value).__name__}", Case(ACTION_KEYS, set_field(KEY_PUBLIC_KEY, value), True))
    add("keys/missing", Case(ACTION_KEYS, set_field(KEY_PUBLIC_KEY, MISSING), True))
    for i, value in enumerate(MALFORMED_MASKS):
        add(f"mask/value-{i}-{type(value).__name__}", Case(ACTION_MASK, set_field(KEY_MASKED_COUNTS, value), True))
    add("mask/missing", Case(ACTION_MASK, set_field(KEY_MASKED_COUNTS, MISSING), True))
    for key, values in ((KEY_SCORE, BAD_SCORES), (KEY_BID, BAD_BIDS)):
        for i, value in enumerate(values):
            add(f"bid/{key}-{i}-{type(value).__name__}", Case(ACTION_BID, set_field(key, value), True))
        add(f"bid/{key}-missing", Case(ACTION_BID, set_field(key, MISSING), True))
    for i, value in enumerate(EXTREME_VALID_BIDS):
        add(f"bid/extreme-valid-bid-{i}", Case(ACTION_BID, set_field(KEY_BID, value), False))
    for i, value in enumerate(EXTREME_VALID_SCORES):
        add(f"bid/extreme-valid-score-{i}", Case(ACTION_BID, set_field(KEY_SCORE, value), False))
    for i, value in enumerate([False, 0, "no", b"", [], math.nan]):  # any record counts as an acknowledgement
        add(f"award/accepted-{i}", Case(ACTION_AWARD, set_field(KEY_ACCEPTED, value), False))
    return cases


CORPUS = _corpus()


# --- Checking one case --------------------------------------------------------------------------
def expected(pass_nodes: list[int], bidders: list[int], replaced: dict[int, tuple[float, float]] | None = None):
    total = np.sum([COUNTS[n] for n in pass_nodes], axis=0)
    scores = [score(COUNTS[n], total, len(pass_nodes)) for n in bidders]
    bids = [COST * float(COUNTS[n].sum()) * (1 + MARKUP) for n in bidders]
    for node, (new_score, new_bid) in (replaced or {}).items():
        scores[bidders.index(node)], bids[bidders.index(node)] = new_score, new_bid
    result = run_auction(scores, bids, BUDGET)
    return total, [bidders[i] for i in result.winners], {n: float(result.payments[i]) for i, n in enumerate(bidders)}


def run_case(case: Case, caplog, once: bool = False):
    grid = FuzzGrid(case.rewrite, case.node, case.step, once=once)
    cfg = MarketConfig(budget=BUDGET, num_classes=NUM_CLASSES, timeout=5.0, poll_interval=0.001)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        outcome = MarketPhase(cfg).run(grid)  # any exception fails the case
    assert grid.rewritten >= 1, "the case never applied"
    payments = np.array(list(outcome.payments.values()))
    assert np.isfinite(payments).all() and (payments >= 0).all()
    assert math.isfinite(outcome.total_payment) and outcome.total_payment <= BUDGET * (1 + 1e-12)
    assert set(outcome.excluded) <= {case.node}, f"an honest node was excluded: {outcome.excluded}"
    return outcome, grid


@pytest.mark.parametrize("name", list(CORPUS))
def test_corpus_case(name: str, caplog) -> None:
    case = CORPUS[name]
    outcome, grid = run_case(case, caplog)
    others = [n for n in NODES if n != case.node]
    if case.step == ACTION_AWARD:
        total, winners, payments = expected(NODES, NODES)
        if case.excluded:
            assert outcome.award_acknowledged == others
            assert f"node {case.node} did not acknowledge its award" in caplog.text
        else:
            assert outcome.award_acknowledged == NODES
        assert outcome.excluded == {}
    elif case.excluded:
        assert set(outcome.excluded) == {case.node}
        assert outcome.excluded[case.node].startswith(case.step + ":"), outcome.excluded
        assert f"excluding node {case.node} ({case.step}:" in caplog.text
        pass_nodes = NODES if case.step == ACTION_BID else others
        total, winners, payments = expected(pass_nodes, others)
        assert outcome.pass_participants == pass_nodes
        assert outcome.participants == others
    else:
        assert outcome.excluded == {}
        replaced = None
        if name.startswith("bid/extreme-valid"):
            value = _extreme_value(name)
            true_score = score(COUNTS[case.node], np.sum(list(COUNTS.values()), axis=0), NUM_NODES)
            true_bid = COST * float(COUNTS[case.node].sum()) * (1 + MARKUP)
            replaced = {case.node: (true_score, float(value)) if "bid-" in name else (float(value), true_bid)}
        total, winners, payments = expected(NODES, NODES, replaced)
    assert outcome.global_counts == [int(c) for c in total]
    assert outcome.winners == winners
    assert outcome.payments == pytest.approx(payments, rel=1e-12)


def _extreme_value(name: str) -> object:
    index = int(name.rsplit("-", 1)[1])
    return EXTREME_VALID_BIDS[index] if "valid-bid" in name else EXTREME_VALID_SCORES[index]


# --- Random records (Hypothesis) ----------------------------------------------------------------
# Flower serialises an int list as sint64 or as uint64: one list cannot mix -1 and 2**63.
INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
UINT64 = st.integers(min_value=2**63, max_value=2**64 - 1)
FLOATS = st.floats(allow_nan=True, allow_infinity=True)
SCALARS = st.one_of(INT64, UINT64, FLOATS, st.booleans(), st.text(max_size=40), st.binary(max_size=80))
VALUES = st.one_of(
    SCALARS,
    st.lists(INT64, max_size=12),
    st.lists(UINT64, max_size=4),
    st.lists(FLOATS, max_size=12),
    st.lists(st.binary(max_size=40), max_size=12),
    st.lists(st.text(max_size=8), max_size=4),
    st.lists(st.booleans(), max_size=4),
)
RECORD_KEYS = st.one_of(
    st.sampled_from([KEY_PUBLIC_KEY, KEY_MASKED_COUNTS, KEY_SCORE, KEY_BID, KEY_ACCEPTED]),
    st.text(min_size=1, max_size=10),
)


GENUINE = object()


def _is_pass_lie(step: str, value: object) -> bool:
    """A key or masked vector of the right shape: a lie PASS cannot detect (out of scope, see above)."""
    if not isinstance(value, bytes):
        return False
    if step == ACTION_MASK:
        return len(value) == 8 * NUM_CLASSES
    try:
        load_public_key(value, index=0)
    except (TypeError, ValueError):
        return False
    return True


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

    def rewrite(grid: FuzzGrid, instruction: Message, reply: Message) -> list[Message]:
        fields = dict(reply.content.config_records[RECORD_KEY]) if keep_genuine_fields else {}
        fields.update(record)
        return [Message(_content(ConfigRecord(fields)), reply_to=instruction)]

    if step in (ACTION_KEYS, ACTION_MASK):
        sent = record.get(FIELD[step], GENUINE if keep_genuine_fields else MISSING)
        assume(not _is_pass_lie(step, sent))
    caplog.clear()
    outcome, _ = run_case(Case(step, rewrite, excluded=False), caplog)

    others = [n for n in NODES if n != OFFENDER]
    if outcome.excluded:
        assert outcome.excluded[OFFENDER].startswith(step + ":")
        assert f"excluding node {OFFENDER}" in caplog.text
    if step in (ACTION_KEYS, ACTION_MASK) and sent is not GENUINE:
        # Anything but a well-formed key or vector is malformed: the offender is out of PASS.
        assert OFFENDER in outcome.excluded
        pass_nodes = others
    else:
        pass_nodes = NODES
    assert outcome.pass_participants == pass_nodes
    assert outcome.global_counts == [int(c) for c in np.sum([COUNTS[n] for n in pass_nodes], axis=0)]
    assert set(outcome.participants) >= set(others)
    if step == ACTION_AWARD:
        assert outcome.award_acknowledged == NODES  # any ConfigRecord acknowledges


def test_corpus_size() -> None:
    """The number of enumerated cases reported in benchmarks/RESULTS.md (plus the random ones)."""
    per_step = {step: sum(1 for case in CORPUS.values() if case.step == step) for step in STEPS}
    assert sum(per_step.values()) == len(CORPUS) >= 200, per_step
