"""market.wire.records: the same checks as Flower's ConfigRecord, byte for byte Flower's serialisation, no warning."""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.common.serde import config_record_to_proto as flowers_config_record_to_proto
from flwr.common.serde import context_from_proto, context_to_proto
from flwr.proto.message_pb2 import Context as ProtoContext  # pylint: disable=E0611
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects, no_object_id_recompute
from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents
from hypothesis import given, settings
from hypothesis import strategies as st

from flmarket_flwr.market import CostBasedBid, MarketConfig, MarketPhase
from flmarket_flwr.market.wire import records
from flmarket_flwr.market.wire.records import (
    config_record,
    config_record_to_proto,
    context_from_bytes,
    context_to_bytes,
    deflate_message,
    inflate_message,
    set_values,
)
from simulations.inprocess_grid import InProcessGrid, market_client_app

T = TypeVar("T")
PROTOBUF_BOOL_AS_INT = "Expected an int, got a boolean"
"""protobuf's warning (an error from 7.34) when a ``bool`` is written into an integer field."""


def silenced(make: Callable[..., T], *args: Any) -> T:
    """``make(*args)`` with protobuf's warning silenced (Flower's own serialiser raises it on ``[1, True]``)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=f".*{PROTOBUF_BOOL_AS_INT}", category=DeprecationWarning)
        return make(*args)


def without_warnings(make: Callable[..., T], *args: Any) -> T:
    """``make(*args)`` with every warning an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return make(*args)


def flowers_tree(message: Message) -> dict[str, bytes]:
    """What Flower's grids push for a message (under ``no_object_id_recompute()``)."""
    return {object_id: obj.deflate() for object_id, obj in get_all_nested_objects(message).items()}


@pytest.fixture(
    params=[(True, True), (False, True), (True, False), (False, False)],
    ids=["both-accelerators", "public-storage", "public-ids", "public-only"],
)
def accelerators(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[bool, bool]]:
    """Each of the two accelerators on (the installed Flower) and off (Flower's own path, as on a Flower without it)."""
    if (request.param[0] and not records.FAST_STORAGE) or (request.param[1] and not records.FAST_IDS):
        pytest.skip("this Flower lacks the accelerator (test_the_pinned_flower_has_both_accelerators says so)")
    monkeypatch.setattr(records, "FAST_STORAGE", request.param[0])
    monkeypatch.setattr(records, "FAST_IDS", request.param[1])
    yield request.param


VALUES = [
    True,
    False,
    0,
    -5,
    2**63 - 1,
    2**63,
    2**64 - 1,
    1.5,
    float("inf"),
    "",
    "x",
    b"",
    b"ab",
    [],
    [1, 2, 3],
    [2**63, 1],
    [True, False],
    [1, True],
    [1.0, 2.5],
    ["a", "b"],
    [b"x", b""],
    [np.float64(1.0)],
    np.float64(2.0),
]
MIXED = [[1, True], [2**63, True, False], [0, False, 5]]
"""``int`` lists that hold ``bool`` s: ``ConfigRecord`` accepts them, protobuf warns when Flower writes them."""
INVALID = [[1, "a"], [True, 1], [object()], object(), [[1]], {"a": 1}, None, np.int64(3), (1, 2)]


def _typed(record: ConfigRecord) -> dict:
    return {
        key: (value, type(value), [type(v) for v in value] if isinstance(value, list) else None)
        for key, value in record.items()
    }


def _random_items(rng: random.Random) -> dict:
    return {f"k{j}": rng.choice(VALUES + MIXED) for j in range(rng.randint(0, 8))}


def test_the_pinned_flower_has_both_accelerators() -> None:
    """Flower 1.42 keeps a record's items in ``__dict__["_data"]`` and exposes the computed-id set.

    A Flower without them still gives the same records and bytes (the ``public-*`` cases below), only slower:
    re-measure ``benchmarks/bench_market_scale.py --sizes 2000`` before moving the pin past such a Flower.
    """
    assert records.FAST_STORAGE
    assert records.FAST_IDS


def test_config_record_equals_flowers_and_refuses_what_it_refuses(accelerators: tuple[bool, bool]) -> None:
    """Same record, same refusals as Flower's, with and without the accelerators."""
    rng = random.Random(0)
    for _ in range(200):
        items = _random_items(rng)
        assert _typed(config_record(items)) == _typed(ConfigRecord(items))
    for bad in INVALID:
        with pytest.raises(TypeError):
            ConfigRecord({"a": bad})
        with pytest.raises(TypeError):
            config_record({"a": bad})
        record = ConfigRecord({"b": 1})
        with pytest.raises(TypeError):
            set_values(record, {"a": bad})
    with pytest.raises(TypeError):
        config_record({1: 2})  # type: ignore[dict-item]


def test_context_bytes_are_flowers(accelerators: tuple[bool, bool]) -> None:
    rng = random.Random(1)
    for _ in range(200):
        state = RecordDict(
            {
                "a": ConfigRecord(_random_items(rng)),
                "m": MetricRecord({"x": 1.0}),
                "arr": ArrayRecord([np.arange(3)]),
                "c": ConfigRecord({"z": [1]}),
            }
        )
        context = Context(
            3, 7, {"partition-id": 1, "s": "x"}, state, {"lr": 0.1, "n": 3, "b": True, "s": "x", "big": 2**62}
        )
        raw = silenced(context_to_proto, context).SerializeToString()
        assert without_warnings(context_to_bytes, context) == raw
        theirs, ours = context_from_proto(ProtoContext.FromString(raw)), context_from_bytes(raw)
        assert (ours.run_id, ours.node_id, ours.node_config, ours.run_config) == (
            theirs.run_id,
            theirs.node_id,
            theirs.node_config,
            theirs.run_config,
        )
        assert list(ours.state) == list(theirs.state)
        for key in ("a", "c"):
            assert _typed(ours.state[key]) == _typed(theirs.state[key])  # type: ignore[arg-type]
        assert ours.state["m"] == theirs.state["m"]
        assert np.array_equal(ours.state["arr"].to_numpy_ndarrays()[0], np.arange(3))  # type: ignore[union-attr]


def test_message_tree_is_flowers(accelerators: tuple[bool, bool]) -> None:
    InProcessGrid(market_client_app({1: np.zeros(3, dtype=np.int64)}), [1])  # sets the ServerApp identity
    rng = random.Random(2)
    for i in range(100):
        items = _random_items(rng)
        content = RecordDict(
            {
                "a": ConfigRecord(items),
                "same": ConfigRecord(items),
                "m": MetricRecord({"x": 1.0}),
                "arr": ArrayRecord([np.arange(3)]),
            }
        )
        message = Message(content, dst_node_id=1, message_type="query.x", group_id="g")
        if i % 4 == 0:
            message = Message(Error(code=1, reason="r"), reply_to=message)
        with no_object_id_recompute():
            theirs_tree = silenced(flowers_tree, message)
            root = message.object_id
        tree = (without_warnings if accelerators[1] else silenced)(deflate_message, message)
        assert list(tree) == list(theirs_tree) and tree == theirs_tree
        assert next(reversed(tree)) == root
        theirs, copy = inflate_object_from_contents(root, dict(theirs_tree)), inflate_message(root, tree)
        assert isinstance(theirs, Message) and copy.metadata == theirs.metadata
        if theirs.has_error():
            assert (copy.error.code, copy.error.reason) == (theirs.error.code, theirs.error.reason)
            continue
        assert list(copy.content) == list(theirs.content)
        for key in ("a", "same"):
            assert _typed(copy.content[key]) == _typed(theirs.content[key])  # type: ignore[arg-type]
        assert copy.content["m"] == theirs.content["m"]


SCALAR = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=5),
    st.binary(max_size=5),
)
VALUE = st.one_of(
    SCALAR,
    st.lists(st.booleans(), max_size=4),
    st.lists(st.integers(min_value=-(2**63), max_value=2**64 - 1), max_size=4),
    st.lists(st.floats(allow_nan=False), max_size=4),
    st.lists(st.text(max_size=3), max_size=4),
    st.lists(st.binary(max_size=3), max_size=4),
    st.tuples(st.integers(min_value=0, max_value=2**64 - 1), st.lists(st.one_of(st.booleans(), st.integers(0, 9)))).map(
        lambda first_rest: [first_rest[0], *first_rest[1]]  # an int first, then bools and ints: [1, True, 3]
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=4), VALUE, max_size=6))
def test_any_config_record_serialises_to_flowers_bytes_without_a_warning(values: dict[str, Any]) -> None:
    """Every record Flower accepts, the int lists with bools among them, gives Flower's bytes, and no warning."""
    record = ConfigRecord(values)
    try:
        expected = silenced(flowers_config_record_to_proto, record).SerializeToString()
    except ValueError:  # an int list with both a negative and a uint64 item fits no protobuf list: Flower refuses it
        with pytest.raises(ValueError, match="out of range"):
            without_warnings(config_record_to_proto, record)
        return
    assert without_warnings(config_record_to_proto, record).SerializeToString() == expected
    assert without_warnings(config_record_to_proto, config_record(values)).SerializeToString() == expected


def test_an_int_list_with_bools_crosses_the_wire_as_its_ints_without_a_warning() -> None:
    """``[1, True, False]``: Flower's bytes (its serialiser warns, once per process: an error from protobuf 7.34)."""
    record = ConfigRecord({"flags": [1, True, False]})
    expected = silenced(flowers_config_record_to_proto, record).SerializeToString()
    assert without_warnings(config_record_to_proto, record).SerializeToString() == expected
    InProcessGrid(market_client_app({1: np.zeros(3, dtype=np.int64)}), [1])  # sets the ServerApp identity
    message = Message(RecordDict({"r": record}), dst_node_id=1, message_type="query.x", group_id="g")
    tree = without_warnings(deflate_message, message)
    copy = inflate_message(next(reversed(tree)), tree)
    assert copy.content.config_records["r"]["flags"] == [1, 1, 0]


def test_a_whole_in_process_market_raises_no_warning() -> None:
    """A full market (PASS, bids, auction, award) over the in-process grid with every warning an error.

    Each reply also carries an ``int`` list holding ``bool`` s, the one record value that made protobuf warn.
    """
    rng = np.random.default_rng(0)
    nodes = list(range(1, 9))
    counts = {node: rng.integers(0, 50, size=4) for node in nodes}

    def with_mixed_list(instruction: Message, reply: Message) -> Message:
        if reply.has_content():
            reply.content["extra"] = ConfigRecord({"flags": [1, True, False]})
        return reply

    grid = InProcessGrid(market_client_app(counts, CostBasedBid(0.05)), nodes, reply_hook=with_mixed_list)
    config = MarketConfig(budget=100.0, num_classes=4, expected_nodes=len(nodes), poll_interval=0.001)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        outcome = MarketPhase(config).run(grid)
    assert list(outcome.global_counts) == np.sum(list(counts.values()), axis=0).tolist()
    assert outcome.winners and not outcome.excluded
    replies = [reply for reply in grid.received if reply.has_content()]
    assert replies and all(reply.content.config_records["extra"]["flags"] == [1, 1, 0] for reply in replies)
