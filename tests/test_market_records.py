"""market.records: the same checks as Flower's ConfigRecord, and byte for byte Flower's serialisation."""

from __future__ import annotations

import random

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.common.serde import context_from_proto, context_to_proto
from flwr.proto.message_pb2 import Context as ProtoContext  # pylint: disable=E0611
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects, no_object_id_recompute
from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents

from flmarket_flwr.market.inprocess import InProcessGrid, market_client_app
from flmarket_flwr.market.records import (
    config_record,
    context_from_bytes,
    context_to_bytes,
    deflate_message,
    inflate_message,
    set_values,
)

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
INVALID = [[1, "a"], [True, 1], [object()], object(), [[1]], {"a": 1}, None, np.int64(3), (1, 2)]


def _typed(record: ConfigRecord) -> dict:
    return {
        key: (value, type(value), [type(v) for v in value] if isinstance(value, list) else None)
        for key, value in record.items()
    }


def _random_items(rng: random.Random) -> dict:
    return {f"k{j}": rng.choice(VALUES) for j in range(rng.randint(0, 8))}


@pytest.mark.parametrize("fast_storage", [True, False], ids=["flower-1.41-storage", "a-flower-without-it"])
def test_config_record_equals_flowers_and_refuses_what_it_refuses(
    fast_storage: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same record, same refusals as Flower's; with ``FAST_STORAGE`` off (a later Flower) through Flower's own path."""
    from flmarket_flwr.market import records

    monkeypatch.setattr(records, "FAST_STORAGE", fast_storage)
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


def test_context_bytes_are_flowers():
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
        raw = context_to_proto(context).SerializeToString()
        assert context_to_bytes(context) == raw
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


def test_message_tree_is_flowers():
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
            flowers = {object_id: obj.deflate() for object_id, obj in get_all_nested_objects(message).items()}
            root = message.object_id
        ours = deflate_message(message)
        assert list(ours) == list(flowers) and ours == flowers
        assert next(reversed(ours)) == root
        theirs, copy = inflate_object_from_contents(root, dict(flowers)), inflate_message(root, ours)
        assert isinstance(theirs, Message) and copy.metadata == theirs.metadata
        if theirs.has_error():
            assert (copy.error.code, copy.error.reason) == (theirs.error.code, theirs.error.reason)
            continue
        assert list(copy.content) == list(theirs.content)
        for key in ("a", "same"):
            assert _typed(copy.content[key]) == _typed(theirs.content[key])  # type: ignore[arg-type]
        assert copy.content["m"] == theirs.content["m"]
