"""Signed PASS v2 key advertisements and survivor sets (bound to run, session and roster), the identity directory."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flmarket_flwr.pass_protocol.identity import (
    IdentityDirectory,
    advertisement_message,
    generate_identity,
    sign_advertisement,
    sign_survivor_set,
    verify_advertisement,
    verify_survivor_set,
)
from flmarket_flwr.pass_protocol.secagg import indices_to_bitmap

CIPHER, MASK = b"\x11" * 32, b"\x22" * 32
ROSTER, OTHER_ROSTER = b"\x44" * 32, b"\x55" * 32
CONTEXT = {"run_id": 7, "roster": ROSTER}


def test_signature_verifies_only_for_exactly_what_was_signed():
    private, public = generate_identity()
    signature = sign_advertisement(private, b"run-1", 4, 77, CIPHER, MASK, **CONTEXT)
    verify_advertisement(public, signature, b"run-1", 4, 77, CIPHER, MASK, **CONTEXT)
    for args, context, _what in [
        ((b"run-2", 4, 77, CIPHER, MASK), CONTEXT, "replayed from another session"),
        ((b"run-1", 4, 77, CIPHER, MASK), {"run_id": 8, "roster": ROSTER}, "replayed from another run"),
        ((b"run-1", 4, 77, CIPHER, MASK), {"run_id": 7, "roster": OTHER_ROSTER}, "shown under another roster"),
        ((b"run-1", 5, 77, CIPHER, MASK), CONTEXT, "another index"),
        ((b"run-1", 4, 78, CIPHER, MASK), CONTEXT, "another node id"),
        ((b"run-1", 4, 77, MASK, CIPHER), CONTEXT, "swapped keys"),
        ((b"run-1", 4, 77, b"\x33" * 32, MASK), CONTEXT, "substituted key"),
    ]:
        with pytest.raises(ValueError, match="does not verify"):
            verify_advertisement(public, signature, *args, **context)
    _, other = generate_identity()
    with pytest.raises(ValueError, match="does not verify"):
        verify_advertisement(other, signature, b"run-1", 4, 77, CIPHER, MASK, **CONTEXT)
    forged = bytes([signature[0] ^ 1]) + signature[1:]
    with pytest.raises(ValueError, match="does not verify"):
        verify_advertisement(public, forged, b"run-1", 4, 77, CIPHER, MASK, **CONTEXT)
    with pytest.raises(ValueError, match="not signed"):
        verify_advertisement(public, b"", b"run-1", 4, 77, CIPHER, MASK, **CONTEXT)
    with pytest.raises(ValueError, match="64 bytes"):
        verify_advertisement(public, signature[:10], b"run-1", 4, 77, CIPHER, MASK, **CONTEXT)


def test_message_is_injective_over_field_boundaries():
    def message(*args, **context):
        return advertisement_message(*args, **(CONTEXT | context))

    assert message(b"ab", 1, 2, CIPHER, MASK) != message(b"a", 1, 2, CIPHER, MASK)
    assert message(b"s", 1, 2, CIPHER, MASK) != message(b"s", 2, 1, CIPHER, MASK)
    assert message(b"s", 1, 2, CIPHER, MASK) != message(b"s", 1, 2, CIPHER, MASK, run_id=8)
    with pytest.raises(ValueError, match="32 bytes"):
        message(b"s", 1, 2, b"short", MASK)
    with pytest.raises(ValueError, match="session"):
        message(b"", 1, 2, CIPHER, MASK)
    with pytest.raises(ValueError, match="roster"):
        message(b"s", 1, 2, CIPHER, MASK, roster=b"short")
    with pytest.raises(ValueError, match="run_id"):
        message(b"s", 1, 2, CIPHER, MASK, run_id=-1)


@settings(max_examples=200, deadline=None)
@given(
    survivors=st.frozensets(st.integers(1, 64), min_size=1),
    dropped=st.frozensets(st.integers(1, 64)),
    changed=st.frozensets(st.integers(1, 64), min_size=1),
    run_id=st.integers(0, 2**63),
)
def test_a_survivor_set_signature_verifies_for_that_set_and_context_only(survivors, dropped, changed, run_id):
    """Property: a signature on (U3, D) fails for any other survivor or dropped set, run, roster or U1."""
    private, public = generate_identity()
    participants = indices_to_bitmap(range(1, 65))
    context = {"run_id": run_id, "session": b"s", "roster": ROSTER, "participants": participants}
    shown = (indices_to_bitmap(survivors), indices_to_bitmap(dropped))
    signature = sign_survivor_set(private, *shown, **context)
    verify_survivor_set(public, signature, *shown, **context)
    other_survivors = indices_to_bitmap(survivors ^ changed)
    other_dropped = indices_to_bitmap(dropped ^ changed)
    for other, other_context in [
        ((other_survivors, shown[1]), context),
        ((shown[0], other_dropped), context),
        ((shown[1], shown[0]), context) if shown[0] != shown[1] else ((other_survivors, shown[1]), context),
        (shown, context | {"run_id": run_id ^ 1}),
        (shown, context | {"roster": OTHER_ROSTER}),
        (shown, context | {"participants": indices_to_bitmap(range(1, 64))}),
    ]:
        with pytest.raises(ValueError, match="does not verify"):
            verify_survivor_set(public, signature, *other, **other_context)


def test_directory_json_round_trip_and_file(tmp_path):
    keys = {node: generate_identity()[1] for node in (3, 10, 2**40)}
    directory = IdentityDirectory(keys)
    assert dict(directory) == keys and len(directory) == 3
    text = directory.to_json()
    assert json.loads(text)["version"] == 1
    assert dict(IdentityDirectory.from_json(text)) == keys
    path = tmp_path / "identities.json"
    path.write_text(text)
    assert dict(IdentityDirectory.from_json(path)) == keys
    assert dict(IdentityDirectory.from_json(str(path))) == keys
    with pytest.raises(ValueError, match="not in the identity directory"):
        directory.key_of(4)
    with pytest.raises(TypeError):
        directory[3] = b"x"  # type: ignore[index]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{not json", "not valid JSON"),
        ('{"version": 2, "keys": {}}', "version"),
        ('{"version": 1}', "keys"),
        ('{"version": 1, "keys": {"x": "00"}}', "node id"),
        ('{"version": 1, "keys": {"1": "zz"}}', "not hex"),
        ('{"version": 1, "keys": {"1": "0011"}}', "32 bytes"),
    ],
)
def test_directory_refuses_bad_json(text, match):
    with pytest.raises(ValueError, match=match):
        IdentityDirectory.from_json(text)


def test_directory_refuses_shared_keys():
    key = generate_identity()[1]
    with pytest.raises(ValueError, match="share one identity key"):
        IdentityDirectory({1: key, 2: key})
