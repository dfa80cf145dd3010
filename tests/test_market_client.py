"""Client handlers: PASS key handling in ``context.state``, scoring, bidding, awards, privacy."""

from __future__ import annotations

import math
from uuid import uuid4

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity

from flmarket_flwr.market import (
    CostBasedBid,
    MarketConfig,
    MarketPhase,
    NoBidError,
    SimulatedCostBid,
    read_award,
    register_market_handlers,
    simulated_cost_per_sample,
)
from flmarket_flwr.market.client import ERROR_PREFIX
from flmarket_flwr.market.messages import (
    ACTION_AWARD,
    ACTION_BID,
    ACTION_KEYS,
    ACTION_MASK,
    KEY_ACCEPTED,
    KEY_BID,
    KEY_GLOBAL_COUNTS,
    KEY_INDICES,
    KEY_MASKED_COUNTS,
    KEY_NUM_CLASSES,
    KEY_NUM_CLIENTS,
    KEY_PASS_INDEX,
    KEY_PAYMENT,
    KEY_PUBLIC_KEY,
    KEY_PUBLIC_KEYS,
    KEY_SCORE,
    KEY_SESSION,
    KEY_WON,
    RECORD_KEY,
    decode_masked_counts,
    message_type,
)
from flmarket_flwr.market.testing import InProcessGrid, market_client_app
from flmarket_flwr.pass_protocol import unmask_sum
from flmarket_flwr.pricing import score

C = 5
SESSION = b"flmarket/test-session"


@pytest.fixture(autouse=True)
def _server_identity() -> None:
    TaskIdentity.task_id = 1
    TaskIdentity.run_id = 1
    TaskIdentity.node_id = SUPERLINK_NODE_ID


class Node:
    """One client: a ClientApp and a Context, called the way Flower's runtimes call them."""

    def __init__(self, counts, bid_policy=None, node_id: int = 7, node_config=None) -> None:
        self.counts = np.asarray(counts)
        self.app = ClientApp()
        register_market_handlers(self.app, lambda context: self.counts, bid_policy)
        self.context = Context(1, node_id, dict(node_config or {"partition-id": 3}), RecordDict(), {})

    def call(self, action: str, **fields: object) -> Message:
        message = Message(
            RecordDict({RECORD_KEY: ConfigRecord(fields)}),  # type: ignore[arg-type]
            dst_node_id=self.context.node_id,
            message_type=message_type(action),
        )
        message.metadata.__dict__["_message_id"] = str(uuid4())
        reply = self.app(message, self.context)
        assert reply.metadata.reply_to_message_id == message.metadata.message_id
        return reply

    def state(self) -> ConfigRecord:
        return self.context.state.config_records[RECORD_KEY]


def record(reply: Message) -> ConfigRecord:
    assert not reply.has_error(), reply.error.reason
    return reply.content.config_records[RECORD_KEY]


def error_reason(reply: Message) -> str:
    assert reply.has_error()
    assert reply.error.reason.startswith(ERROR_PREFIX)
    return reply.error.reason


def keys_round(nodes: list[Node], session: bytes = SESSION) -> dict[int, bytes]:
    keys = {}
    for index, node in enumerate(nodes, start=1):
        reply = node.call(ACTION_KEYS, **{KEY_PASS_INDEX: index, KEY_SESSION: session, KEY_NUM_CLASSES: C})
        keys[index] = record(reply)[KEY_PUBLIC_KEY]
    return keys


def mask_call(node: Node, index: int, keys: dict[int, bytes], session: bytes = SESSION) -> Message:
    return node.call(
        ACTION_MASK,
        **{
            KEY_PASS_INDEX: index,
            KEY_SESSION: session,
            KEY_INDICES: list(keys),
            KEY_PUBLIC_KEYS: list(keys.values()),
        },
    )


def three_nodes() -> list[Node]:
    return [Node([1, 2, 3, 4, 5]), Node([10, 0, 7, 1, 2]), Node([0, 9, 9, 9, 1])]


# --- PASS ----------------------------------------------------------------------------------------
def test_keys_handler_keeps_the_private_key_in_state_and_replies_its_public_key() -> None:
    node = Node([3, 1, 4, 1, 5])
    reply = node.call(ACTION_KEYS, **{KEY_PASS_INDEX: 2, KEY_SESSION: SESSION, KEY_NUM_CLASSES: C})

    public_key = record(reply)[KEY_PUBLIC_KEY]
    stored = [v for k, v in node.state().items() if k.startswith("pass-key/")]
    assert len(stored) == 1 and isinstance(stored[0], bytes) and len(stored[0]) == 32
    private = X25519PrivateKey.from_private_bytes(stored[0])
    assert private.public_key().public_bytes_raw() == public_key
    assert list(record(reply).keys()) == [KEY_PUBLIC_KEY]


def test_masked_counts_of_three_clients_unmask_to_the_exact_sum() -> None:
    nodes = three_nodes()
    keys = keys_round(nodes)

    masked = {}
    for index, node in enumerate(nodes, start=1):
        data = record(mask_call(node, index, keys))[KEY_MASKED_COUNTS]
        masked[index] = decode_masked_counts(data, C)  # type: ignore[arg-type]

    expected = sum(node.counts for node in nodes)
    np.testing.assert_array_equal(unmask_sum(masked), expected)
    for index, node in enumerate(nodes, start=1):
        assert not np.array_equal(masked[index], node.counts)


def test_a_key_masks_once_only() -> None:
    nodes = three_nodes()
    keys = keys_round(nodes)
    record(mask_call(nodes[0], 1, keys))

    again = mask_call(nodes[0], 1, keys)
    assert "no unused PASS key" in error_reason(again)
    assert not [k for k in nodes[0].state() if k.startswith("pass-key/")]


def test_mask_refuses_fewer_than_three_keys_and_keeps_the_key() -> None:
    nodes = three_nodes()
    keys = keys_round(nodes)

    reply = mask_call(nodes[0], 1, {1: keys[1], 2: keys[2]})
    assert "at least 3" in error_reason(reply)
    record(mask_call(nodes[0], 1, keys))  # the refused request did not consume the key


@pytest.mark.parametrize(
    "fields, reason",
    [
        ({KEY_PASS_INDEX: 1, KEY_SESSION: b"other-session"}, "no unused PASS key"),
        ({KEY_PASS_INDEX: 2, KEY_SESSION: SESSION}, "index"),
        ({KEY_PASS_INDEX: 1}, "session"),
        ({KEY_SESSION: SESSION}, "pass-index"),
    ],
)
def test_mask_refuses_unknown_sessions_and_bad_requests(fields: dict[str, object], reason: str) -> None:
    nodes = three_nodes()
    keys = keys_round(nodes)
    reply = nodes[0].call(ACTION_MASK, **fields, **{KEY_INDICES: list(keys), KEY_PUBLIC_KEYS: list(keys.values())})
    assert reason in error_reason(reply)


def test_mask_refuses_a_key_set_without_its_own_key() -> None:
    nodes = three_nodes()
    keys = keys_round(nodes)
    forged = dict(keys)
    forged[1] = X25519PrivateKey.generate().public_key().public_bytes_raw()
    assert "does not match" in error_reason(mask_call(nodes[0], 1, forged))


def test_keys_are_kept_per_session() -> None:
    """A late round-one message of an older attempt must not clobber the current key."""
    nodes = three_nodes()
    old = keys_round(nodes, session=b"attempt-1")
    new = keys_round(nodes, session=b"attempt-2")
    assert old != new
    record(mask_call(nodes[0], 1, new, session=b"attempt-2"))
    record(mask_call(nodes[0], 1, old, session=b"attempt-1"))


def test_label_counts_of_the_wrong_length_are_refused() -> None:
    node = Node([1, 2, 3])
    reply = node.call(ACTION_KEYS, **{KEY_PASS_INDEX: 1, KEY_SESSION: SESSION, KEY_NUM_CLASSES: C})
    assert "3 classes, the market has 5" in error_reason(reply)


@pytest.mark.parametrize("counts", [[1, -2, 3, 4, 5], [1.5, 2, 3, 4, 5], [[1, 2, 3, 4, 5]]])
def test_invalid_label_counts_are_refused(counts: object) -> None:
    node = Node(counts)
    reply = node.call(ACTION_KEYS, **{KEY_PASS_INDEX: 1, KEY_SESSION: SESSION, KEY_NUM_CLASSES: C})
    assert reply.has_error()


# --- Score and bid -------------------------------------------------------------------------------
def test_bid_handler_scores_locally_and_applies_the_policy() -> None:
    counts = [3, 0, 8, 2, 1]
    global_counts = [30, 12, 40, 9, 4]
    node = Node(counts, bid_policy=CostBasedBid(0.5, markup=0.1))

    reply = record(node.call(ACTION_BID, **{KEY_GLOBAL_COUNTS: global_counts, KEY_NUM_CLIENTS: 4}))

    assert reply[KEY_SCORE] == score(counts, global_counts, 4)
    assert reply[KEY_BID] == pytest.approx(0.5 * 14 * 1.1)
    assert node.state()[KEY_SCORE] == reply[KEY_SCORE]


def test_a_client_without_data_cannot_bid() -> None:
    node = Node([0, 0, 0, 0, 0])
    reply = node.call(ACTION_BID, **{KEY_GLOBAL_COUNTS: [5, 5, 5, 5, 5], KEY_NUM_CLIENTS: 3})
    assert "no data" in error_reason(reply)


@pytest.mark.parametrize("bad_bid", [float("nan"), 0.0, -1.0, math.inf, "1.0", None])
def test_a_bid_policy_returning_an_invalid_bid_gives_an_error_reply(bad_bid: object) -> None:
    node = Node([1, 2, 3, 4, 5], bid_policy=lambda counts, s, context: bad_bid)
    reply = node.call(ACTION_BID, **{KEY_GLOBAL_COUNTS: [5, 5, 5, 5, 5], KEY_NUM_CLIENTS: 3})
    assert "bid" in error_reason(reply)


@pytest.mark.parametrize(
    "fields",
    [
        {KEY_GLOBAL_COUNTS: [1, 1, 1, 1, 1], KEY_NUM_CLIENTS: 3},  # local counts exceed global ones
        {KEY_GLOBAL_COUNTS: [50, 50, 50, 50], KEY_NUM_CLIENTS: 3},  # wrong number of classes
        {KEY_GLOBAL_COUNTS: [50, 50, 50, 50, 50], KEY_NUM_CLIENTS: 0},
        {KEY_GLOBAL_COUNTS: [50, 50, 50, 50, 50]},
        {KEY_NUM_CLIENTS: 3},
    ],
)
def test_inconsistent_bid_requests_give_error_replies(fields: dict[str, object]) -> None:
    node = Node([1, 2, 3, 4, 5])
    assert node.call(ACTION_BID, **fields).has_error()


def test_simulated_cost_bid_reads_the_partition_id() -> None:
    policy = SimulatedCostBid(seed=3, low=1.0, high=2.0, markup=0.0)
    node = Node([1, 2, 3, 4, 5], bid_policy=policy, node_config={"partition-id": 4})
    reply = record(node.call(ACTION_BID, **{KEY_GLOBAL_COUNTS: [9, 9, 9, 9, 9], KEY_NUM_CLIENTS: 3}))
    assert reply[KEY_BID] == pytest.approx(simulated_cost_per_sample(4, seed=3, low=1.0, high=2.0) * 15)

    no_partition = Node([1, 2, 3, 4, 5], bid_policy=policy, node_config={"other": 1})
    reply = no_partition.call(ACTION_BID, **{KEY_GLOBAL_COUNTS: [9, 9, 9, 9, 9], KEY_NUM_CLIENTS: 3})
    assert "partition-id" in error_reason(reply)


# --- Award ---------------------------------------------------------------------------------------
def test_award_is_recorded_and_pass_keys_purged() -> None:
    nodes = three_nodes()
    keys_round(nodes, session=b"never-masked")
    node = nodes[0]
    assert read_award(node.context) is None

    reply = record(node.call(ACTION_AWARD, **{KEY_WON: True, KEY_PAYMENT: 12.5}))

    assert reply[KEY_ACCEPTED] is True
    award = read_award(node.context)
    assert award is not None and award.won is True and award.payment == 12.5
    assert not [k for k in node.state() if k.startswith("pass-")]


@pytest.mark.parametrize("fields", [{KEY_WON: 1, KEY_PAYMENT: 1.0}, {KEY_WON: True, KEY_PAYMENT: float("nan")}, {}])
def test_malformed_awards_give_error_replies(fields: dict[str, object]) -> None:
    assert Node([1, 2, 3, 4, 5]).call(ACTION_AWARD, **fields).has_error()


def test_register_refuses_a_second_registration() -> None:
    app = ClientApp()
    register_market_handlers(app, lambda context: np.ones(C))
    with pytest.raises(ValueError, match="already registered"):
        register_market_handlers(app, lambda context: np.ones(C))


# --- Bid policies --------------------------------------------------------------------------------
def test_cost_based_bid() -> None:
    context = Context(1, 1, {}, RecordDict(), {})
    assert CostBasedBid(2.0)(np.array([1, 2, 3]), 0.0, context) == pytest.approx(2.0 * 6 * 1.2)
    assert CostBasedBid(2.0, markup=0.0)(np.array([1, 2, 3]), 0.0, context) == 12.0
    with pytest.raises(NoBidError):
        CostBasedBid(1.0)(np.zeros(3, dtype=np.int64), 0.0, context)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            CostBasedBid(bad)
    with pytest.raises(ValueError):
        CostBasedBid(1.0, markup=-0.1)
    with pytest.raises(TypeError):
        CostBasedBid("1.0")  # type: ignore[arg-type]


def test_simulated_cost_per_sample_is_deterministic_heterogeneous_and_in_range() -> None:
    costs = [simulated_cost_per_sample(p, seed=1, low=0.5, high=1.5) for p in range(200)]
    assert costs == [simulated_cost_per_sample(p, seed=1, low=0.5, high=1.5) for p in range(200)]
    assert all(0.5 <= c < 1.5 for c in costs)
    assert len(set(costs)) == 200
    assert np.std(costs) > 0.2
    assert costs != [simulated_cost_per_sample(p, seed=2, low=0.5, high=1.5) for p in range(200)]
    assert simulated_cost_per_sample(3, seed=0, low=2.0, high=2.0) == 2.0
    with pytest.raises(ValueError):
        simulated_cost_per_sample(0, low=2.0, high=1.0)
    with pytest.raises(TypeError):
        simulated_cost_per_sample(1.5)  # type: ignore[arg-type]


# --- Privacy ---------------------------------------------------------------------------------------
def _encodings(counts: np.ndarray) -> list[bytes]:
    """Every plausible binary encoding of a label-count vector."""
    out = []
    for dtype in ("<u8", ">u8", "<i8", "<u4", "<i4", "<f8", "<f4", "<u2"):
        out.append(np.asarray(counts).astype(dtype).tobytes())
    return out


def _values(config: ConfigRecord) -> list[object]:
    values: list[object] = []
    for value in config.values():
        values.append(value)
        if isinstance(value, list):
            values.extend(value)
    return values


def find_leaks(grid: InProcessGrid, counts: dict[int, np.ndarray], private_keys: list[bytes]) -> list[str]:
    """Search every reply the server received, and every message it sent, for counts and keys."""
    leaks = []
    received = b"".join(grid.received_wire)
    sent = b"".join(message.content.deflate() for message in grid.sent) + b"".join(
        record.deflate() for message in grid.sent for record in message.content.config_records.values()
    )
    for where, wire in (("received", received), ("sent", sent)):
        for node, vector in counts.items():
            if any(encoded in wire for encoded in _encodings(vector)):
                leaks.append(f"{where}: label counts of node {node} (raw bytes)")
        for key in private_keys:
            if key in wire or key.hex().encode() in wire:
                leaks.append(f"{where}: a private key (raw bytes)")
    count_lists = {tuple(int(c) for c in vector) for vector in counts.values()}
    for reply in grid.received:
        if reply.has_error():
            continue
        for config in reply.content.config_records.values():
            for value in _values(config):
                if isinstance(value, bytes) and value in private_keys:
                    leaks.append("received: a private key (value)")
                if isinstance(value, list) and tuple(value) in count_lists:
                    leaks.append("received: label counts (list value)")
                if isinstance(value, bytes) and len(value) % 8 == 0 and value:
                    words = tuple(int(w) for w in np.frombuffer(value, dtype="<u8"))
                    if words in count_lists:
                        leaks.append("received: label counts (uint64 bytes)")
        if reply.content.array_records or reply.content.metric_records:
            leaks.append("received: unexpected array or metric records")
    return leaks


def run_recorded_market(app_factory) -> tuple[InProcessGrid, dict[int, np.ndarray], list[bytes]]:
    """Run a market where one client drops out of PASS round two; harvest every private key."""
    rng = np.random.default_rng(42)
    counts = {9000 + i: rng.integers(100, 10_000, size=10) for i in range(6)}
    private_keys: list[bytes] = []
    dropped: list[int] = []

    def hook(instruction: Message, reply: Message) -> Message | None:
        kind = instruction.metadata.message_type
        if kind == message_type(ACTION_KEYS):
            # Right after a keys round, read the key the node stored in its local state.
            state = grid.context(instruction.metadata.dst_node_id).state.config_records[RECORD_KEY]
            private_keys.extend(v for k, v in state.items() if k.startswith("pass-key/"))
        if kind == message_type(ACTION_MASK) and not dropped:
            dropped.append(instruction.metadata.dst_node_id)
            return None
        return reply

    grid = InProcessGrid(app_factory(counts), list(counts), reply_hook=hook)
    outcome = MarketPhase(MarketConfig(budget=500.0, num_classes=10, poll_interval=0.001)).run(grid)
    assert outcome.pass_attempts == 2
    assert len(set(private_keys)) >= 2 * len(counts) - 1
    return grid, counts, private_keys


def test_no_message_reveals_label_counts_or_private_keys() -> None:
    grid, counts, private_keys = run_recorded_market(lambda counts: market_client_app(counts, CostBasedBid(0.01)))
    assert len(grid.received) == len(grid.received_wire) > 4 * len(counts)
    assert find_leaks(grid, counts, private_keys) == []


def test_the_leak_search_catches_a_leaky_client() -> None:
    """Negative control: a client that adds its counts and key to its replies is caught."""

    def leaky_app(counts: dict[int, np.ndarray]) -> ClientApp:
        honest = market_client_app(counts, CostBasedBid(0.01))
        app = ClientApp()

        def leak(message: Message, context: Context) -> Message:
            reply = honest(message, context)
            if reply.has_content() and message.metadata.message_type == message_type(ACTION_BID):
                state = context.state.config_records[RECORD_KEY]
                reply.content.config_records[RECORD_KEY]["debug"] = counts[context.node_id].astype("<u8").tobytes()
                reply.content.config_records[RECORD_KEY]["keys"] = [
                    v for k, v in state.items() if k.startswith("pass-key/")
                ] or [b"-"]
            if reply.has_content() and message.metadata.message_type == message_type(ACTION_KEYS):
                state = context.state.config_records[RECORD_KEY]
                reply.content.config_records[RECORD_KEY]["debug-key"] = [
                    v for k, v in state.items() if k.startswith("pass-key/")
                ][0]
            return reply

        for action in (ACTION_KEYS, ACTION_MASK, ACTION_BID, ACTION_AWARD):
            app.query(action)(leak)
        return app

    grid, counts, private_keys = run_recorded_market(leaky_app)
    leaks = find_leaks(grid, counts, private_keys)
    assert any("label counts" in leak for leak in leaks)
    assert any("private key" in leak for leak in leaks)


def test_only_plain_values_live_in_the_client_state() -> None:
    nodes = three_nodes()
    keys_round(nodes)
    for value in nodes[0].state().values():
        assert isinstance(value, (bytes, int, float, bool, str))
