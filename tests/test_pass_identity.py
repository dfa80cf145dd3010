"""Signed PASS v2 key advertisements and the identity directory."""

import json

import pytest

from flmarket_flwr.pass_protocol.identity import (
    IdentityDirectory,
    advertisement_message,
    generate_identity,
    sign_advertisement,
    verify_advertisement,
)

CIPHER, MASK = b"\x11" * 32, b"\x22" * 32


def test_signature_verifies_only_for_exactly_what_was_signed():
    private, public = generate_identity()
    signature = sign_advertisement(private, b"run-1", 4, 77, CIPHER, MASK)
    verify_advertisement(public, signature, b"run-1", 4, 77, CIPHER, MASK)
    for args, _what in [
        ((b"run-2", 4, 77, CIPHER, MASK), "replayed from another session"),
        ((b"run-1", 5, 77, CIPHER, MASK), "another index"),
        ((b"run-1", 4, 78, CIPHER, MASK), "another node id"),
        ((b"run-1", 4, 77, MASK, CIPHER), "swapped keys"),
        ((b"run-1", 4, 77, b"\x33" * 32, MASK), "substituted key"),
    ]:
        with pytest.raises(ValueError, match="does not verify"):
            verify_advertisement(public, signature, *args)
    _, other = generate_identity()
    with pytest.raises(ValueError, match="does not verify"):
        verify_advertisement(other, signature, b"run-1", 4, 77, CIPHER, MASK)
    forged = bytes([signature[0] ^ 1]) + signature[1:]
    with pytest.raises(ValueError, match="does not verify"):
        verify_advertisement(public, forged, b"run-1", 4, 77, CIPHER, MASK)
    with pytest.raises(ValueError, match="not signed"):
        verify_advertisement(public, b"", b"run-1", 4, 77, CIPHER, MASK)
    with pytest.raises(ValueError, match="64 bytes"):
        verify_advertisement(public, signature[:10], b"run-1", 4, 77, CIPHER, MASK)


def test_message_is_injective_over_field_boundaries():
    assert advertisement_message(b"ab", 1, 2, CIPHER, MASK) != advertisement_message(b"a", 1, 2, CIPHER, MASK)
    assert advertisement_message(b"s", 1, 2, CIPHER, MASK) != advertisement_message(b"s", 2, 1, CIPHER, MASK)
    with pytest.raises(ValueError, match="32 bytes"):
        advertisement_message(b"s", 1, 2, b"short", MASK)
    with pytest.raises(ValueError, match="session"):
        advertisement_message(b"", 1, 2, CIPHER, MASK)


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
