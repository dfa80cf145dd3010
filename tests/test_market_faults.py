"""Dropouts and malformed replies: each excludes its node with a logged reason, the phase completes.

Faults are injected on real replies of real ClientApps (``InProcessGrid.reply_hook``): a reply
is dropped (a timeout), replaced by an error reply, or replaced by a malformed one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import pytest

from flwr.app import ConfigRecord, Error, Message, RecordDict
from flwr.common.constant import ErrorCode

from flmarket_flwr.market import CostBasedBid, MarketConfig, MarketError, MarketPhase
from flmarket_flwr.market.messages import (
    ACTION_AWARD,
    ACTION_BID,
    ACTION_KEYS,
    ACTION_MASK,
    KEY_INDICES,
    KEY_MASKED_COUNTS,
    KEY_PUBLIC_KEY,
    KEY_PUBLIC_KEYS,
    KEY_SESSION,
    RECORD_KEY,
    message_type,
)
from flmarket_flwr.market.testing import InProcessGrid, market_client_app
from flmarket_flwr.pricing import run_auction, score

NUM_CLASSES = 6
Corruption = Callable[[Message, Message], Message | None]


def make_counts(num_nodes: int, seed: int = 0) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {1000 + 17 * i: rng.integers(1, 40, size=NUM_CLASSES) for i in range(num_nodes)}


def config(**overrides: object) -> MarketConfig:
    values: dict[str, object] = {"budget": 60.0, "num_classes": NUM_CLASSES, "poll_interval": 0.001}
    values.update(overrides)
    return MarketConfig(**values)  # type: ignore[arg-type]


# --- Corruptions ---------------------------------------------------------------------------------
def drop(instruction: Message, reply: Message) -> None:
    return None


def error_reply(instruction: Message, reply: Message) -> Message:
    return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason="boom"), reply_to=instruction)


def with_record(record: ConfigRecord) -> Corruption:
    def corrupt(instruction: Message, reply: Message) -> Message:
        return Message(RecordDict({RECORD_KEY: record}), reply_to=instruction)

    return corrupt


def without_record(instruction: Message, reply: Message) -> Message:
    return Message(RecordDict({"other": ConfigRecord({"x": 1})}), reply_to=instruction)


def with_field(key: str, value: object) -> Corruption:
    """The genuine reply with one field replaced (or removed if ``value`` is None)."""

    def corrupt(instruction: Message, reply: Message) -> Message:
        record = ConfigRecord(dict(reply.content.config_records[RECORD_KEY]))
        if value is None:
            del record[key]
        else:
            record[key] = value  # type: ignore[assignment]
        return Message(RecordDict({RECORD_KEY: record}), reply_to=instruction)

    return corrupt


def flip_top_bit(instruction: Message, reply: Message) -> Message:
    """A masked vector of the right length whose first word is off by 2**63."""
    data = bytearray(reply.content.config_records[RECORD_KEY][KEY_MASKED_COUNTS])  # type: ignore[arg-type]
    data[7] ^= 0x80
    return Message(RecordDict({RECORD_KEY: ConfigRecord({KEY_MASKED_COUNTS: bytes(data)})}), reply_to=instruction)


class Faults:
    """Reply hook applying ``corruption`` to the replies of ``nodes`` for ``action``, ``times`` times each."""

    def __init__(self) -> None:
        self.rules: list[tuple[str, set[int], Corruption, dict[int, int]]] = []
        self.instructions: list[Message] = []
        self.replies: list[Message] = []

    def add(self, action: str, nodes: set[int], corruption: Corruption, times: int = 10**9) -> Faults:
        self.rules.append((message_type(action), set(nodes), corruption, {n: times for n in nodes}))
        return self

    def __call__(self, instruction: Message, reply: Message) -> Message | None:
        self.instructions.append(instruction)
        self.replies.append(reply)
        node = instruction.metadata.dst_node_id
        for kind, nodes, corruption, left in self.rules:
            if instruction.metadata.message_type == kind and node in nodes and left[node] > 0:
                left[node] -= 1
                return corruption(instruction, reply)
        return reply


def run_market(
    counts: dict[int, np.ndarray], faults: Faults, **overrides: object
) -> tuple[object, InProcessGrid]:
    grid = InProcessGrid(market_client_app(counts, CostBasedBid(0.05)), list(counts), reply_hook=faults)
    return MarketPhase(config(**overrides)).run(grid), grid


def true_sum(counts: dict[int, np.ndarray], nodes: list[int]) -> list[int]:
    return [int(c) for c in np.sum([counts[n] for n in nodes], axis=0)]


# --- PASS dropouts -------------------------------------------------------------------------------
@pytest.mark.parametrize("corruption", [drop, error_reply, flip_top_bit], ids=["timeout", "error", "garbage"])
def test_round_two_dropout_reruns_pass_with_fresh_keys(corruption: Corruption, caplog) -> None:
    counts = make_counts(6, seed=1)
    nodes = sorted(counts)
    culprit = nodes[2]
    faults = Faults().add(ACTION_MASK, {culprit}, corruption, times=1)

    with caplog.at_level(logging.WARNING, logger="flwr"):
        outcome, _ = run_market(counts, faults)

    assert outcome.pass_attempts == 2
    keys_by_attempt: dict[bytes, dict[int, bytes]] = {}
    for instruction, reply in zip(faults.instructions, faults.replies):
        if instruction.metadata.message_type == message_type(ACTION_KEYS):
            session = instruction.content.config_records[RECORD_KEY][KEY_SESSION]
            keys_by_attempt.setdefault(session, {})[instruction.metadata.dst_node_id] = (
                reply.content.config_records[RECORD_KEY][KEY_PUBLIC_KEY]
            )
    assert len(keys_by_attempt) == 2, "the second attempt must use a fresh session"
    first, second = keys_by_attempt.values()
    for node in second:
        assert second[node] != first[node], "the second attempt must use fresh keys"
    if corruption is flip_top_bit:
        # The culprit cannot be identified: everyone masks again, and the sum is exact.
        assert outcome.pass_participants == nodes
        assert outcome.global_counts == true_sum(counts, nodes)
        assert "no valid sum" in caplog.text
    else:
        survivors = [n for n in nodes if n != culprit]
        assert set(second) == set(survivors)
        assert outcome.pass_participants == survivors
        assert outcome.global_counts == true_sum(counts, survivors)
        assert culprit in outcome.excluded and outcome.excluded[culprit].startswith(ACTION_MASK)
        assert culprit not in outcome.participants
        assert f"excluding node {culprit}" in caplog.text


def test_round_two_broadcast_lists_only_key_holders() -> None:
    counts = make_counts(6, seed=2)
    nodes = sorted(counts)
    faults = Faults().add(ACTION_KEYS, {nodes[0]}, drop)

    outcome, _ = run_market(counts, faults)

    masks = [m for m in faults.instructions if m.metadata.message_type == message_type(ACTION_MASK)]
    assert {m.metadata.dst_node_id for m in masks} == set(nodes[1:])
    for mask in masks:
        record = mask.content.config_records[RECORD_KEY]
        assert len(record[KEY_INDICES]) == len(record[KEY_PUBLIC_KEYS]) == 5
    assert outcome.pass_attempts == 1, "a round-one dropout does not break mask cancellation"
    assert outcome.global_counts == true_sum(counts, nodes[1:])
    assert "no reply" in outcome.excluded[nodes[0]]


def test_dropouts_below_three_raise_a_clear_error() -> None:
    counts = make_counts(4, seed=3)
    nodes = sorted(counts)
    faults = Faults().add(ACTION_MASK, {nodes[0], nodes[1]}, drop)

    with pytest.raises(MarketError, match=r"only 2 client\(s\) left.*at least 3"):
        run_market(counts, faults)


def test_round_one_dropouts_below_three_raise_before_any_mask() -> None:
    counts = make_counts(4, seed=4)
    nodes = sorted(counts)
    faults = Faults().add(ACTION_KEYS, {nodes[0], nodes[3]}, error_reply)

    with pytest.raises(MarketError, match="public keys"):
        run_market(counts, faults)
    assert not [m for m in faults.instructions if m.metadata.message_type == message_type(ACTION_MASK)]


def test_pass_gives_up_after_max_attempts() -> None:
    counts = make_counts(8, seed=5)
    faults = Faults().add(ACTION_MASK, {sorted(counts)[3]}, flip_top_bit)

    with pytest.raises(MarketError, match=r"PASS did not complete in 2 attempt\(s\)"):
        run_market(counts, faults, max_pass_attempts=2)


def test_a_different_dropout_each_attempt_is_survived_within_the_bound() -> None:
    counts = make_counts(8, seed=6)
    nodes = sorted(counts)
    sessions: list[bytes] = []
    failing = {1: (nodes[0], drop), 2: (nodes[5], error_reply)}  # attempt -> (node, fault)

    def hook(instruction: Message, reply: Message) -> Message | None:
        if instruction.metadata.message_type != message_type(ACTION_MASK):
            return reply
        session = instruction.content.config_records[RECORD_KEY][KEY_SESSION]
        if session not in sessions:
            sessions.append(session)  # type: ignore[arg-type]
        node, fault = failing.get(sessions.index(session) + 1, (None, drop))
        return fault(instruction, reply) if instruction.metadata.dst_node_id == node else reply

    grid = InProcessGrid(market_client_app(counts, CostBasedBid(0.05)), nodes, reply_hook=hook)
    outcome = MarketPhase(config()).run(grid)

    assert outcome.pass_attempts == 3
    survivors = [n for n in nodes if n not in (nodes[0], nodes[5])]
    assert outcome.pass_participants == survivors
    assert outcome.global_counts == true_sum(counts, survivors)
    assert len(sessions) == 3


# --- Malformed replies at each step -------------------------------------------------------------
MALFORMED_KEYS = {
    "timeout": drop,
    "error": error_reply,
    "no-record": without_record,
    "short-key": with_field(KEY_PUBLIC_KEY, b"\x01" * 31),
    "str-key": with_field(KEY_PUBLIC_KEY, "not bytes"),
    "missing-key": with_field(KEY_PUBLIC_KEY, None),
}


@pytest.mark.parametrize("corruption", MALFORMED_KEYS.values(), ids=MALFORMED_KEYS.keys())
def test_malformed_public_key_excludes_the_node(corruption: Corruption, caplog) -> None:
    counts = make_counts(5, seed=7)
    culprit = sorted(counts)[1]

    with caplog.at_level(logging.WARNING, logger="flwr"):
        outcome, _ = run_market(counts, Faults().add(ACTION_KEYS, {culprit}, corruption))

    others = [n for n in sorted(counts) if n != culprit]
    assert outcome.excluded.keys() == {culprit}
    assert outcome.excluded[culprit].startswith(ACTION_KEYS)
    assert outcome.pass_participants == others
    assert outcome.global_counts == true_sum(counts, others)
    assert outcome.pass_attempts == 1
    assert f"excluding node {culprit}" in caplog.text


def test_duplicate_public_keys_exclude_both_holders() -> None:
    counts = make_counts(6, seed=8)
    nodes = sorted(counts)
    stolen: dict[str, bytes] = {}

    def copy_key(instruction: Message, reply: Message) -> Message:
        key = reply.content.config_records[RECORD_KEY][KEY_PUBLIC_KEY]
        if instruction.metadata.dst_node_id == nodes[0]:
            stolen["key"] = key  # type: ignore[assignment]
            return reply
        return with_field(KEY_PUBLIC_KEY, stolen["key"])(instruction, reply)

    grid = InProcessGrid(market_client_app(counts, CostBasedBid(0.05)), nodes, shuffle_seed=None)
    grid.reply_hook = Faults().add(ACTION_KEYS, {nodes[0], nodes[1]}, copy_key)
    outcome = MarketPhase(config()).run(grid)

    assert {nodes[0], nodes[1]} <= outcome.excluded.keys()
    assert "shared" in outcome.excluded[nodes[1]]
    assert outcome.global_counts == true_sum(counts, nodes[2:])


MALFORMED_MASKS = {
    "timeout": drop,
    "error": error_reply,
    "no-record": without_record,
    "short": with_field(KEY_MASKED_COUNTS, b"\x00" * (8 * NUM_CLASSES - 8)),
    "long": with_field(KEY_MASKED_COUNTS, b"\x00" * (8 * NUM_CLASSES + 8)),
    "int-list": with_field(KEY_MASKED_COUNTS, [1] * NUM_CLASSES),
}


@pytest.mark.parametrize("corruption", MALFORMED_MASKS.values(), ids=MALFORMED_MASKS.keys())
def test_malformed_masked_counts_exclude_the_node_and_rerun_pass(corruption: Corruption) -> None:
    counts = make_counts(5, seed=9)
    culprit = sorted(counts)[3]

    outcome, _ = run_market(counts, Faults().add(ACTION_MASK, {culprit}, corruption))

    others = [n for n in sorted(counts) if n != culprit]
    assert outcome.excluded.keys() == {culprit}
    assert outcome.excluded[culprit].startswith(ACTION_MASK)
    assert outcome.pass_attempts == 2
    assert outcome.global_counts == true_sum(counts, others)


MALFORMED_BIDS = {
    "timeout": drop,
    "error": error_reply,
    "no-record": without_record,
    "nan-bid": with_field("bid", float("nan")),
    "inf-bid": with_field("bid", float("inf")),
    "zero-bid": with_field("bid", 0.0),
    "negative-bid": with_field("bid", -3.0),
    "str-bid": with_field("bid", "12"),
    "missing-bid": with_field("bid", None),
    "nan-score": with_field("score", float("nan")),
    "negative-score": with_field("score", -1.0),
    "bool-score": with_field("score", True),
    "list-score": with_field("score", [1.0, 2.0]),
    "missing-score": with_field("score", None),
}


@pytest.mark.parametrize("corruption", MALFORMED_BIDS.values(), ids=MALFORMED_BIDS.keys())
def test_malformed_score_or_bid_leaves_the_node_out_of_the_auction(corruption: Corruption, caplog) -> None:
    counts = make_counts(6, seed=10)
    nodes = sorted(counts)
    culprit = nodes[4]

    with caplog.at_level(logging.WARNING, logger="flwr"):
        outcome, grid = run_market(counts, Faults().add(ACTION_BID, {culprit}, corruption))

    others = [n for n in nodes if n != culprit]
    assert outcome.excluded.keys() == {culprit}
    assert outcome.excluded[culprit].startswith(ACTION_BID)
    assert outcome.participants == others
    assert outcome.pass_participants == nodes, "its counts are still in N_s"
    assert outcome.global_counts == true_sum(counts, nodes)
    assert culprit not in outcome.payments and culprit not in outcome.winners
    # The auction ran on the others' true scores and bids, with E = all PASS participants.
    total = np.sum([counts[n] for n in nodes], axis=0)
    scores = [score(counts[n], total, len(nodes)) for n in others]
    bids = [0.05 * counts[n].sum() * 1.2 for n in others]
    expected = run_auction(scores, bids, 60.0)
    assert outcome.winners == [others[i] for i in expected.winners]
    assert [m.metadata.dst_node_id for m in grid.sent if m.metadata.message_type == message_type(ACTION_AWARD)]
    assert culprit not in [
        m.metadata.dst_node_id for m in grid.sent if m.metadata.message_type == message_type(ACTION_AWARD)
    ]
    assert f"excluding node {culprit}" in caplog.text


@pytest.mark.parametrize("corruption", [drop, error_reply], ids=["timeout", "error"])
def test_unanswered_awards_are_logged_not_fatal(corruption: Corruption, caplog) -> None:
    counts = make_counts(5, seed=11)
    culprit = sorted(counts)[0]

    with caplog.at_level(logging.WARNING, logger="flwr"):
        outcome, _ = run_market(counts, Faults().add(ACTION_AWARD, {culprit}, corruption))

    assert outcome.award_acknowledged == sorted(counts)[1:]
    assert outcome.excluded == {}
    assert f"node {culprit} did not acknowledge its award" in caplog.text


def test_no_valid_bid_at_all_is_a_clear_error() -> None:
    counts = make_counts(4, seed=12)
    with pytest.raises(MarketError, match="no client placed a valid score and bid"):
        run_market(counts, Faults().add(ACTION_BID, set(counts), error_reply))


def test_client_without_data_is_excluded_from_the_auction_only() -> None:
    counts = make_counts(5, seed=13)
    empty = sorted(counts)[2]
    counts[empty] = np.zeros(NUM_CLASSES, dtype=np.int64)

    outcome, _ = run_market(counts, Faults())

    assert empty in outcome.pass_participants
    assert empty not in outcome.participants
    assert "no data" in outcome.excluded[empty]
    assert outcome.global_counts == true_sum(counts, sorted(counts))


def test_client_with_wrong_number_of_classes_is_excluded_at_round_one() -> None:
    counts = make_counts(5, seed=14)
    odd = sorted(counts)[0]
    counts[odd] = np.ones(NUM_CLASSES + 1, dtype=np.int64)

    outcome, _ = run_market(counts, Faults())

    assert outcome.excluded[odd].startswith(ACTION_KEYS)
    assert "classes" in outcome.excluded[odd]
    assert outcome.pass_attempts == 1


def test_stray_and_duplicate_replies_are_ignored(caplog) -> None:
    counts = make_counts(5, seed=15)
    nodes = sorted(counts)

    class NoisyGrid(InProcessGrid):
        def pull_messages(self, message_ids):  # type: ignore[no-untyped-def]
            replies = super().pull_messages(message_ids)
            if not replies:
                return replies
            duplicate = replies[0]
            stray = Message(duplicate.content, reply_to=duplicate)  # replies to a reply: unknown id
            return [*replies, duplicate, stray]

    grid = NoisyGrid(market_client_app(counts, CostBasedBid(0.05)), nodes)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        outcome = MarketPhase(config()).run(grid)

    assert outcome.excluded == {}
    assert outcome.global_counts == true_sum(counts, nodes)
    assert "second reply" in caplog.text
    assert "unknown message" in caplog.text
