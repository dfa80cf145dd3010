"""Signed PASS v2 key advertisements and survivor sets (bound to run, session and roster), the identity directory."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flmarket_flwr.pass_protocol.encoding import indices_to_bitmap
from flmarket_flwr.pass_protocol.identity import (
    IdentityDirectory,
    advertisement_message,
    generate_identity,
    load_directory,
    sign_advertisement,
    sign_survivor_set,
    verify_advertisement,
    verify_survivor_set,
)

CIPHER, MASK = b"\x11" * 32, b"\x22" * 32
ROSTER, OTHER_ROSTER = b"\x44" * 32, b"\x55" * 32
MODE, OTHER_MODE = b"\x66" * 32, b"\x77" * 32
CONTEXT = {"run_id": 7, "roster": ROSTER, "mode": MODE}


def test_signature_verifies_only_for_exactly_what_was_signed():
    private, public = generate_identity()
    signature = sign_advertisement(private, b"run-1", 4, 77, CIPHER, MASK, **CONTEXT)
    verify_advertisement(public, signature, b"run-1", 4, 77, CIPHER, MASK, **CONTEXT)
    for args, context, _what in [
        ((b"run-2", 4, 77, CIPHER, MASK), CONTEXT, "replayed from another session"),
        ((b"run-1", 4, 77, CIPHER, MASK), CONTEXT | {"run_id": 8}, "replayed from another run"),
        ((b"run-1", 4, 77, CIPHER, MASK), CONTEXT | {"roster": OTHER_ROSTER}, "shown under another roster"),
        ((b"run-1", 4, 77, CIPHER, MASK), CONTEXT | {"mode": OTHER_MODE}, "joined in another mode or settings"),
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
    with pytest.raises(ValueError, match="mode digest must be 32 bytes"):
        message(b"s", 1, 2, CIPHER, MASK, mode=b"short")


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


# --- Pinned directories: a digest, or a third party's signature -------------------------------------------------
def _directory(nodes=(101, 202, 303)):
    return IdentityDirectory({node: generate_identity()[1] for node in nodes})


@settings(max_examples=40, deadline=None)
@given(st.sets(st.integers(0, 2**64 - 2), min_size=1, max_size=6), st.randoms(use_true_random=False))
def test_the_digest_is_of_the_mapping_only_and_moves_with_any_entry(nodes, random):
    """Property: the digest ignores the order, the JSON layout and a signature; it moves when an id or a key does."""
    keys = {node: generate_identity()[1] for node in nodes}
    directory = IdentityDirectory(keys)
    shuffled = list(keys.items())
    random.shuffle(shuffled)
    assert IdentityDirectory(dict(shuffled)).digest() == directory.digest()
    assert IdentityDirectory.from_json(json.dumps(json.loads(directory.to_json()))).digest() == directory.digest()
    assert directory.signed_by(generate_identity()[0]).digest() == directory.digest()
    node = random.choice(sorted(keys))
    assert IdentityDirectory(keys | {node: generate_identity()[1]}).digest() != directory.digest()  # a key swapped
    free = next(n for n in range(2**64 - 1, 0, -1) if n not in keys)
    moved = {(free if n == node else n): key for n, key in keys.items()}
    assert IdentityDirectory(moved).digest() != directory.digest()  # a key seated under another node id
    assert IdentityDirectory(keys | {free: generate_identity()[1]}).digest() != directory.digest()  # a node added


def test_a_pinned_digest_accepts_its_directory_and_refuses_an_altered_one(tmp_path):
    honest = _directory()
    path = tmp_path / "directory.json"
    path.write_text(honest.to_json())
    assert load_directory(path, digest=honest.digest()) == honest
    sybil = generate_identity()[1]
    path.write_text(IdentityDirectory(dict(honest) | {202: sybil}).to_json())  # the buyer seats its own key
    with pytest.raises(ValueError, match=f"not the pinned digest {honest.digest().hex()}"):
        load_directory(path, digest=honest.digest())


def test_a_pinned_signer_accepts_its_signature_only(tmp_path):
    authority, authority_public = generate_identity()
    buyer, buyer_public = generate_identity()
    honest = _directory()
    path = tmp_path / "directory.json"
    path.write_text(honest.signed_by(authority).to_json())
    loaded = load_directory(path, signer=authority_public)
    assert loaded == honest and loaded.signature is not None and loaded.signature.signer == authority_public
    forged = IdentityDirectory(dict(honest) | {202: generate_identity()[1]})
    path.write_text(forged.signed_by(buyer).to_json())  # re-signed by the buyer
    with pytest.raises(ValueError, match=f"signed by {buyer_public.hex()}, not by the pinned signer"):
        load_directory(path, signer=authority_public)
    path.write_text(forged.to_json())  # not signed at all
    with pytest.raises(ValueError, match=f"not signed.*pins its signer {authority_public.hex()}"):
        load_directory(path, signer=authority_public)
    signed = json.loads(honest.signed_by(authority).to_json())
    signed["keys"]["202"] = generate_identity()[1].hex()  # altered after signing, the signature kept
    path.write_text(json.dumps(signed))
    with pytest.raises(ValueError, match="signature by .* does not verify over its keys"):
        load_directory(path, signer=authority_public)


def test_both_pins_must_hold_and_no_pin_is_refused_unless_accepted_explicitly(tmp_path):
    authority, authority_public = generate_identity()
    honest = _directory()
    path = tmp_path / "directory.json"
    path.write_text(honest.signed_by(authority).to_json())
    assert load_directory(path, digest=honest.digest(), signer=authority_public) == honest
    with pytest.raises(ValueError, match="pinned digest"):
        load_directory(path, digest=_directory().digest(), signer=authority_public)
    with pytest.raises(ValueError, match="is not pinned"):
        load_directory(path)
    assert load_directory(path, unpinned=True) == honest
    path.write_text("[]")
    with pytest.raises(ValueError, match="not a JSON object"):
        load_directory(path, unpinned=True)


@pytest.mark.parametrize(
    ("signature", "match"),
    [
        ({"signer": "00" * 32}, "signer.*value"),
        ({"signer": "zz", "value": "00" * 64}, "signer must be 64 hex"),
        ({"signer": "ab" * 32, "value": "00" * 64}, "signature"),
        ({"signer": "SIGNER", "value": "00" * 63}, "signature must be 128 hex"),
    ],
)
def test_a_malformed_signature_field_is_refused(signature, match):
    data = json.loads(_directory().to_json())
    signer_hex = generate_identity()[1].hex()
    data["signature"] = {key: (signer_hex if value == "SIGNER" else value) for key, value in signature.items()}
    with pytest.raises(ValueError, match=match):
        IdentityDirectory.from_json(json.dumps(data))


def test_an_unknown_directory_field_is_refused():
    data = json.loads(_directory().to_json()) | {"signatures": []}
    with pytest.raises(ValueError, match="unknown field.*signatures"):
        IdentityDirectory.from_json(json.dumps(data))


def test_the_cli_makes_signs_digests_and_checks_a_directory(tmp_path):
    """The operator's path end to end, through the module's command line (a child process)."""

    def cli(*args, ok=True):
        result = subprocess.run(
            [sys.executable, "-m", "flmarket_flwr.pass_protocol.identity_cli", *map(str, args)],
            capture_output=True,
            text=True,
            check=False,
            cwd=Path(__file__).resolve().parents[1],
        )
        assert (result.returncode == 0) == ok, result.stderr
        return result.stdout.strip() if ok else result.stderr.strip()

    publics = {node: cli("keygen", tmp_path / f"{node}.pem") for node in (101, 202, 303)}
    assert (tmp_path / "101.pem").stat().st_mode & 0o777 == 0o600
    assert cli("public-key", tmp_path / "101.pem") == publics[101]
    assert "never overwritten" in cli("keygen", tmp_path / "101.pem", ok=False)
    directory = tmp_path / "directory.json"
    digest = cli("make", directory, *(f"{node}={key}" for node, key in publics.items()))
    assert digest == cli("digest", directory) == IdentityDirectory.from_json(directory).digest().hex()
    assert dict(IdentityDirectory.from_json(directory)) == {n: bytes.fromhex(k) for n, k in publics.items()}
    signer = cli("keygen", tmp_path / "authority.pem")
    assert cli("sign", directory, tmp_path / "authority.pem") == signer
    assert "pins hold" in cli("check", directory, "--signer", signer, "--digest", digest)
    assert cli("digest", directory) == digest  # signing does not change what is pinned
    assert "not pinned" in cli("check", directory, ok=False)
    assert "not by the pinned signer" in cli("check", directory, "--signer", publics[101], ok=False)
    assert "hex digits" in cli("make", tmp_path / "bad.json", "101=beef", ok=False)
    assert "twice" in cli("make", tmp_path / "bad.json", f"1={publics[101]}", f"1={publics[202]}", ok=False)
