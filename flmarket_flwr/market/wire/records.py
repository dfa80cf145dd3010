"""Flower records built, read and serialised at the market's volume: Flower's checks, Flower's bytes, fewer calls.

Everything here is Flower's public record API (``ConfigRecord``, ``RecordDict``, ``Message``, ``Context`` and
their serialisation) except two accelerators, each checked on import and replaced by Flower's own path where a
Flower lacks it: :data:`FAST_STORAGE` and :data:`FAST_IDS`. ``tests/test_market_records.py`` holds both paths
byte for byte equal to Flower's.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import repeat
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.common.constant import INT64_MAX_VALUE
from flwr.common.serde import (
    array_record_from_proto,
    array_record_to_proto,
    metric_record_from_proto,
    metric_record_to_proto,
    user_config_value_to_proto,
)
from flwr.proto.message_pb2 import Context as ProtoContext  # pylint: disable=E0611
from flwr.proto.recorddict_pb2 import (  # pylint: disable=E0611
    BoolList,
    BytesList,
    DoubleList,
    SintList,
    StringList,
    UintList,
)
from flwr.proto.recorddict_pb2 import ConfigRecord as ProtoConfigRecord  # pylint: disable=E0611
from flwr.proto.recorddict_pb2 import ConfigRecordValue as ProtoConfigRecordValue  # pylint: disable=E0611
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict  # pylint: disable=E0611
from flwr.proto.transport_pb2 import Scalar  # pylint: disable=E0611
from flwr.supercore.inflatable import inflatable_object
from flwr.supercore.inflatable.inflatable_object import (
    InflatableObject,
    add_header_to_object_body,
    get_all_nested_objects,
    get_object_body,
    get_object_head_values_from_object_content,
    get_object_id,
    no_object_id_recompute,
)
from flwr.supercore.inflatable.inflatable_utils import inflatable_class_registry

__all__ = [
    "config_record",
    "context_from_bytes",
    "context_to_bytes",
    "deflate_message",
    "inflate_message",
    "set_values",
]

_SCALARS = (bool, int, float, str, bytes)
"""Flower's ``ConfigScalar`` types (``typing.get_args(flwr.app.ConfigScalar)``)."""
_FLOWER_ORDER: list[type[Any]] = [bool, int, float, str, bytes]
"""Flower's serialiser tries the types in this order (``bool`` first: ``isinstance(True, int)``)."""
_SCALAR_FIELD = {bool: "bool", int: "sint64", float: "double", str: "string", bytes: "bytes"}
_LIST_CLASS = {
    bool: (BoolList, "bool_list"),
    int: (SintList, "sint_list"),
    float: (DoubleList, "double_list"),
    str: (StringList, "string_list"),
    bytes: (BytesList, "bytes_list"),
}


def _data(record: ConfigRecord) -> dict[str, Any]:
    return record.__dict__["_data"]


FAST_STORAGE = isinstance(ConfigRecord().__dict__.get("_data"), dict)
"""Whether this Flower keeps a record's items in ``__dict__['_data']`` (1.41 and 1.42 do): then the checked items
of :func:`set_values` and the deserialised ones are written there once, without Flower's per-item ``typing`` calls.
Otherwise Flower's own ``record[key] = value`` and ``ConfigRecord(items)``: slower, the same records."""

_computed_object_ids = getattr(inflatable_object, "_get_computed_object_ids", None)
FAST_IDS = callable(_computed_object_ids)
"""Whether this Flower exposes the set of object ids computed under ``no_object_id_recompute()`` (1.41 and 1.42
do): then :func:`deflate_message` deflates each object once and registers its id there, as ``object_id`` does.
Otherwise Flower's own ``{i: o.deflate() for i, o in get_all_nested_objects(message).items()}``: the same bytes."""


def check_value(key: object, value: object) -> None:
    """Flower's ``ConfigRecord`` rules for one item; ``TypeError`` (as Flower raises) if broken."""
    if not isinstance(key, str):
        raise TypeError(f"Key must be of type `str` but `{type(key)}` was passed.")
    if isinstance(value, list):
        if value:
            first = value[0]
            if not isinstance(first, _SCALARS):
                raise TypeError(f"Not all values are of valid type: `{type(first)}` was passed.")
            if not all(map(isinstance, value, repeat(type(first)))):
                raise TypeError("All values in a list must be of the same valid type.")
    elif not isinstance(value, _SCALARS):
        raise TypeError(f"Not all values are of valid type: `{type(value)}` was passed.")


def config_record(values: Mapping[str, Any]) -> ConfigRecord:
    """``ConfigRecord(dict(values))``, with Flower's checks made once per item (``TypeError`` if one fails)."""
    record = ConfigRecord()
    set_values(record, values)
    return record


def set_values(record: ConfigRecord, values: Mapping[str, Any]) -> None:
    """``record[key] = value`` for every item, with Flower's checks made once per item.

    Notes
    -----
    The market moves tens of thousands of records per phase (one per message and per client state). Flower's
    ``ConfigRecord.__setitem__`` type-checks every value through several layers of ``typing`` calls, its deserialisation
    builds each record through that same ``__setitem__``, and its serialisation
    tries every allowed type in turn. The helpers below apply **the same checks** (a ``str`` key; a scalar of
    ``bool``, ``int``, ``float``, ``str`` or ``bytes``; a list whose items are all instances of its first item's
    type, that type being one of those) in one pass, and write the checked values into the record; the
    serialisers give **byte for byte** the protobuf Flower's :mod:`flwr.common.serde` gives (a test compares
    them), with Flower's rule for every value (:func:`_any_value_to_proto`).
    """
    if not FAST_STORAGE:
        for key, value in values.items():
            record[key] = value
        return
    data = _data(record)
    for key, value in values.items():
        check_value(key, value)
        data[key] = value


# --- Serialisation (the protobuf of flwr.common.serde) -----------------------------------------------
def _value_to_proto(value: Any) -> ProtoConfigRecordValue:
    kind = type(value)
    if kind is list and value:
        kinds = set(map(type, value))
        if len(kinds) == 1 and (item := kinds.pop()) in _LIST_CLASS:
            list_class, field = _LIST_CLASS[item]
            if item is int and max(value) > INT64_MAX_VALUE:
                list_class, field = UintList, "uint_list"
            return ProtoConfigRecordValue(**{field: list_class(vals=value)})
    elif kind in _SCALAR_FIELD:
        field = "uint64" if kind is int and value > INT64_MAX_VALUE else _SCALAR_FIELD[kind]
        return ProtoConfigRecordValue(**{field: value})
    return _any_value_to_proto(value)


def _any_value_to_proto(value: Any) -> ProtoConfigRecordValue:
    """Flower's rule for any value (``serde_utils._record_value_to_proto``): subclasses, empty and mixed lists.

    The types are tried in Flower's order; the first that the value, or every item of the list, is an instance of
    gives the field. An ``int`` list may hold ``bool`` s (``ConfigRecord`` accepts ``[1, True]``): they are
    written as ``1`` and ``0``, the bytes protobuf writes for them, but without protobuf's "Expected an int, got a
    boolean" warning (an error from protobuf 7.34).
    """
    field: dict[str, Any] = {}
    for kind in _FLOWER_ORDER:
        if isinstance(value, kind):
            name = "uint64" if kind is int and value > INT64_MAX_VALUE else _SCALAR_FIELD[kind]
            field[name] = value
            return ProtoConfigRecordValue(**field)
        if isinstance(value, list) and all(isinstance(item, kind) for item in value):
            list_class, name = _LIST_CLASS[kind]
            items = [int(item) for item in value] if kind is int else value
            if kind is int and any(item > INT64_MAX_VALUE for item in items):
                list_class, name = UintList, "uint_list"
            field[name] = list_class(vals=items)
            return ProtoConfigRecordValue(**field)
    raise TypeError(f"The type of the following value is not allowed in 'ConfigRecordValue':\n{value}")


def config_record_to_proto(record: ConfigRecord) -> ProtoConfigRecord:
    """``flwr.common.serde.config_record_to_proto``, same message."""
    item = ProtoConfigRecord.Item
    return ProtoConfigRecord(items=[item(key=k, value=_value_to_proto(v)) for k, v in record.items()])


def config_record_from_proto(proto: ProtoConfigRecord) -> ConfigRecord:
    """``flwr.common.serde.config_record_from_proto``: every value a protobuf can hold is a valid item."""
    values = {}
    for item in proto.items:
        value = item.value
        field = value.WhichOneof("value")
        if field is None:
            raise ValueError(f"ConfigRecord item {item.key!r} has no value")
        values[item.key] = list(getattr(value, field).vals) if field.endswith("list") else getattr(value, field)
    if not FAST_STORAGE:
        return ConfigRecord(values)
    record = ConfigRecord()
    _data(record).update(values)
    return record


def _recorddict_to_proto(records: RecordDict) -> ProtoRecordDict:
    item = ProtoRecordDict.Item
    items = []
    for key, value in records.items():
        if isinstance(value, ConfigRecord):
            items.append(item(key=key, config_record=config_record_to_proto(value)))
        elif isinstance(value, ArrayRecord):
            items.append(item(key=key, array_record=array_record_to_proto(value)))
        elif isinstance(value, MetricRecord):
            items.append(item(key=key, metric_record=metric_record_to_proto(value)))
        else:
            raise ValueError(f"Unsupported record type: {type(value)}")
    return ProtoRecordDict(items=items)


def _recorddict_from_proto(proto: ProtoRecordDict) -> RecordDict:
    records = RecordDict()
    for item in proto.items:
        field = item.WhichOneof("value")
        if field == "config_record":
            records[item.key] = config_record_from_proto(item.config_record)
        elif field == "array_record":
            records[item.key] = array_record_from_proto(item.array_record)
        elif field == "metric_record":
            records[item.key] = metric_record_from_proto(item.metric_record)
        else:
            raise ValueError(f"Unsupported record type: {field}")
    return records


_USER_CONFIG_FIELD = {bool: "bool", float: "double", int: "sint64", str: "string"}


def _user_config_to_proto(config: Mapping[str, Any]) -> dict[str, Scalar]:
    """``flwr.common.serde.user_config_to_proto``: the same ``Scalar`` s (Flower's own function for subclasses)."""
    protos = {}
    for key, value in config.items():
        field = _USER_CONFIG_FIELD.get(type(value))
        protos[key] = Scalar(**{field: value}) if field is not None else user_config_value_to_proto(value)
    return protos


def _user_config_from_proto(proto: Mapping[str, Scalar]) -> dict[str, Any]:
    """``flwr.common.serde.user_config_from_proto``."""
    return {key: getattr(value, value.WhichOneof("scalar")) for key, value in proto.items()}  # type: ignore[arg-type]


def context_to_bytes(context: Context) -> bytes:
    """``context_to_proto(context).SerializeToString()`` (:mod:`flwr.common.serde`), same bytes."""
    return ProtoContext(
        run_id=context.run_id,
        node_id=context.node_id,
        node_config=_user_config_to_proto(context.node_config),
        state=_recorddict_to_proto(context.state),
        run_config=_user_config_to_proto(context.run_config),
        series_id=context.series_id,
    ).SerializeToString()


def context_from_bytes(raw: bytes) -> Context:
    """``context_from_proto(ProtoContext.FromString(raw))`` (:mod:`flwr.common.serde`), an equal ``Context``."""
    proto = ProtoContext.FromString(raw)
    return Context(
        run_id=proto.run_id,
        node_id=proto.node_id,
        node_config=_user_config_from_proto(proto.node_config),
        state=_recorddict_from_proto(proto.state),
        run_config=_user_config_from_proto(proto.run_config),
        series_id=proto.series_id,
    )


# --- Flower's wire format: the object tree of a message ------------------------------------------------
def deflate_message(message: Message) -> dict[str, bytes]:
    """``{object id: content}`` of the message and all its records, children before parents, as Flower sends them.

    Equal to ``{i: o.deflate() for i, o in get_all_nested_objects(message).items()}`` under
    ``no_object_id_recompute()`` (what Flower's grids push). With :data:`FAST_IDS` every object is deflated once
    (Flower deflates each record once for its id, then again for its content) and ``ConfigRecord`` s through
    :func:`config_record_to_proto`; the objects keep their ids, as with Flower.
    """
    with no_object_id_recompute():
        if not FAST_IDS:
            return {object_id: obj.deflate() for object_id, obj in get_all_nested_objects(message).items()}
        contents: dict[str, bytes] = {}
        _deflate_into(message, contents, _computed_object_ids())  # type: ignore[misc]
    return contents


def _deflate_into(obj: InflatableObject, contents: dict[str, bytes], computed: set[str]) -> None:
    if isinstance(obj, ConfigRecord):
        content = add_header_to_object_body(config_record_to_proto(obj).SerializeToString(), obj)
    elif isinstance(obj, (Message, RecordDict)):
        kids = list(obj.values()) if isinstance(obj, RecordDict) else [obj.content] if obj.has_content() else []
        for kid in kids:  # children first: the parent's content names their ids, now known
            _deflate_into(kid, contents, computed)
        content = obj.deflate()
    else:  # other records (an ArrayRecord and its Arrays): Flower's own traversal
        for object_id, nested in get_all_nested_objects(obj).items():
            contents.setdefault(object_id, nested.deflate())
        return
    object_id = get_object_id(content)
    obj.__dict__["_object_id"] = object_id  # as InflatableObject.object_id caches it
    computed.add(object_id)
    contents.setdefault(object_id, content)


def inflate_message(object_id: str, contents: Mapping[str, bytes]) -> Message:
    """Flower's ``inflate_object_from_contents(object_id, contents)``; ``ConfigRecord`` s read as above."""
    message = _inflate(object_id, contents, {})
    if not isinstance(message, Message):
        raise ValueError(f"object {object_id} is a {type(message).__name__}, not a Message")
    return message


def _inflate(object_id: str, contents: Mapping[str, bytes], objects: dict[str, InflatableObject]) -> InflatableObject:
    if object_id in objects:
        return objects[object_id]
    content = contents[object_id]
    kind, children_ids, _ = get_object_head_values_from_object_content(content)
    children = {child: _inflate(child, contents, objects) for child in children_ids}
    if kind == "ConfigRecord" and not children:
        obj: InflatableObject = config_record_from_proto(
            ProtoConfigRecord.FromString(get_object_body(content, ConfigRecord))
        )
    else:
        obj = inflatable_class_registry[kind].inflate(content, children=children)
    objects[object_id] = obj
    return obj
