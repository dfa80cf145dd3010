"""The market steps' typed records: each reads back from what it writes, as Flower's wire carries it, and a
record with a missing or mistyped item is refused naming the record and the key."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from flwr.proto.recorddict_pb2 import ConfigRecord as ProtoConfigRecord
from hypothesis import given
from hypothesis import strategies as st

from flmarket_flwr.market.wire import messages
from flmarket_flwr.market.wire.messages import (
    AdvertiseTerms,
    AuditReply,
    AuditRequest,
    AwardReply,
    AwardRequest,
    BidReply,
    BidRequest,
    EndorseReply,
    EndorseRequest,
    ReplyError,
    RosterNodeIds,
    RosterWanted,
    TagsReply,
    TagsRequest,
)
from flmarket_flwr.market.wire.records import config_record, config_record_from_proto, config_record_to_proto

_u64 = st.integers(0, 2**63 - 1)
_floats = st.floats(allow_nan=False, allow_infinity=False)
_maybe_bytes = st.none() | st.binary(max_size=64)
RECORDS = st.one_of(
    st.builds(BidRequest, st.binary(max_size=48), st.lists(_u64, max_size=12), _u64, st.binary(max_size=32)),
    st.builds(BidReply, _floats, _floats),
    st.builds(EndorseRequest, st.binary(max_size=48), st.binary(max_size=64), st.binary(max_size=64), st.binary()),
    st.builds(EndorseReply, st.binary(max_size=64)),
    st.builds(AuditRequest, st.binary(max_size=48), st.binary(), _maybe_bytes, _maybe_bytes),
    st.builds(AuditReply, st.lists(_u64, max_size=12), st.binary(max_size=32)),
    st.builds(AwardRequest, st.binary(max_size=48), _maybe_bytes, _maybe_bytes, _maybe_bytes),
    st.builds(AwardReply, st.booleans()),
    st.builds(TagsReply, st.text(max_size=40)),
    st.builds(TagsRequest),
    st.builds(AdvertiseTerms, _floats, _u64, st.binary(max_size=32)),
    st.builds(RosterWanted, st.booleans()),
    st.builds(RosterNodeIds, _maybe_bytes),
)


@given(RECORDS)
def test_every_record_reads_back_from_its_items_across_flowers_wire(record: Any) -> None:
    raw = config_record_to_proto(config_record(record.to_record())).SerializeToString()
    delivered = config_record_from_proto(ProtoConfigRecord.FromString(raw))
    assert type(record).from_record(delivered) == record


def test_the_items_travel_under_the_wire_keys_in_field_order() -> None:
    request = BidRequest(b"s", [1, 2], 2, b"t")
    assert list(request.to_record()) == ["session", "global-counts", "num-clients", "transcript"]
    assert BidReply(1.5, 2.0).to_record() == {"score": 1.5, "bid": 2.0}
    assert AuditReply([3], b"n").to_record() == {"counts": [3], "nonce": b"n"}
    assert EndorseReply(b"e").to_record() == {"endorsement": b"e"}
    assert AwardReply(accepted=True).to_record() == {"accepted": True}
    assert TagsReply("lab-3").to_record() == {"tag": "lab-3"}  # the tags step, which no pinned market sends


@pytest.mark.parametrize(
    ("record", "items", "refusal"),
    [
        (BidReply, {"score": 1.0}, "BidReply lacks 'bid'"),
        (BidReply, {"score": True, "bid": 1.0}, "'score' must be a finite float"),
        (BidReply, {"score": math.nan, "bid": 1.0}, "'score' must be a finite float"),
        (BidRequest, {"session": b"", "global-counts": [1, True], "num-clients": 1, "transcript": b""}, "list"),
        (BidRequest, {"session": "s", "global-counts": [], "num-clients": 1, "transcript": b""}, "'session'"),
        (AwardReply, {"accepted": 1}, "'accepted' must be bool"),
    ],
)
def test_a_missing_or_mistyped_item_is_refused_by_name(record: Any, items: dict, refusal: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ReplyError, match=refusal):
        record.from_record(items)


def test_an_optional_item_that_is_none_does_not_travel() -> None:
    assert AwardRequest(b"s").to_record() == {"session": b"s"}  # an aborted market's award step
    held = AwardRequest(b"s", award_signature=b"g", award_digest=b"d")
    assert list(held.to_record().items()) == [("session", b"s"), ("award-digest", b"d"), ("award-signature", b"g")]
    assert AwardRequest.from_record(held.to_record()) == held


def test_an_int_is_a_float_item() -> None:
    assert BidReply.from_record({"score": 2, "bid": 3}) == BidReply(2.0, 3.0)


def test_the_advertise_terms_and_the_roster_items_travel_under_their_keys() -> None:
    assert AdvertiseTerms(2.0, 3, b"k").to_record() == {
        "terms-budget": 2.0,
        "terms-cohort-cap": 3,
        "terms-buyer-key": b"k",
    }
    assert RosterWanted(True).to_record() == {"roster-wanted": True}
    assert RosterNodeIds(b"\0" * 8).to_record() == {"roster-node-ids": b"\0" * 8}
    assert TagsRequest().to_record() == {}


_RECORD_CLASSES = [
    value
    for value in vars(messages).values()
    if isinstance(value, type) and hasattr(value, "wire_keys") and dataclasses.is_dataclass(value)
]
_RECEIPT_KEYS = {messages.KEY_WON, messages.KEY_PAYMENT}  # the node's receipt in its own state, not on the wire


def test_every_key_name_spells_a_records_field() -> None:
    """The ``KEY_`` names are spellings of the records' keys for raw records, never a second wire format."""
    record_keys = {key for record in _RECORD_CLASSES for key in record.wire_keys()}
    named = {value for name, value in vars(messages).items() if name.startswith("KEY_")}
    assert named - _RECEIPT_KEYS <= record_keys, named - _RECEIPT_KEYS - record_keys
