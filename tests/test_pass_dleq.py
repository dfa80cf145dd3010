"""The blame evidence, played by a cheating prover: a proof that an X25519 secret belongs to two advertised keys,
and a proof that an advertised key's maker knows its private key."""

from __future__ import annotations

import hashlib

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from hypothesis import given, settings
from hypothesis import strategies as st
from nacl import bindings as sodium

from flmarket_flwr.pass_protocol import dleq

_FIELD = 2**255 - 19
_KEYS = st.binary(min_size=32, max_size=32)
_CONTEXTS = st.binary(max_size=64)


def _public(private: bytes) -> bytes:
    return X25519PrivateKey.from_private_bytes(private).public_key().public_bytes_raw()


def _secret(private: bytes, peer: bytes) -> bytes:
    return X25519PrivateKey.from_private_bytes(private).exchange(X25519PublicKey.from_public_bytes(peer))


def _edwards_to_u(point: bytes) -> bytes:
    y = int.from_bytes(point, "little") & ((1 << 255) - 1)
    return ((1 + y) * pow(1 - y, -1, _FIELD) % _FIELD).to_bytes(32, "little")


_ORDER_TWO = (_FIELD - 1).to_bytes(32, "little")  # the Edwards point (0, -1): order 2


@settings(max_examples=60, deadline=None)
@given(prover=_KEYS, peer=_KEYS, context=_CONTEXTS)
def test_a_proof_verifies_and_gives_exactly_the_x25519_secret(prover: bytes, peer: bytes, context: bytes) -> None:
    public, peer_public = _public(prover), _public(peer)
    proof = dleq.prove_exchange(prover, public, peer_public, context)
    assert len(proof) == dleq.PROOF_BYTES
    assert dleq.verify_exchange(public, peer_public, proof, context) == _secret(prover, peer_public)
    assert dleq.verify_exchange(public, peer_public, proof, context) == _secret(peer, public)  # the edge's one secret


@settings(max_examples=60, deadline=None)
@given(prover=_KEYS, peer=_KEYS, other=_KEYS, context=_CONTEXTS, position=st.integers(0, 127), flip=st.integers(1, 255))
def test_a_proof_binds_its_keys_its_context_and_every_byte(
    prover: bytes, peer: bytes, other: bytes, context: bytes, position: int, flip: int
) -> None:
    public, peer_public, other_public = _public(prover), _public(peer), _public(other)
    proof = dleq.prove_exchange(prover, public, peer_public, context)
    tampered = proof[:position] + bytes([proof[position] ^ flip]) + proof[position + 1 :]
    assert dleq.verify_exchange(public, peer_public, tampered, context) is None
    assert dleq.verify_exchange(public, peer_public, proof, context + b"/another edge") is None
    if other_public not in (public, peer_public):
        assert dleq.verify_exchange(other_public, peer_public, proof, context) is None  # someone else's proof
        assert dleq.verify_exchange(public, other_public, proof, context) is None  # another peer


@settings(max_examples=30, deadline=None)
@given(prover=_KEYS, impostor=_KEYS, peer=_KEYS)
def test_a_prover_without_the_advertised_private_key_cannot_prove(prover: bytes, impostor: bytes, peer: bytes) -> None:
    """Proving with another key while claiming ``A``: the first point is not ``A``'s, so nothing verifies."""
    public, peer_public = _public(prover), _public(peer)
    if _public(impostor) == public:
        return
    proof = dleq.prove_exchange(impostor, public, peer_public, b"ctx")
    assert dleq.verify_exchange(public, peer_public, proof, b"ctx") is None


def test_a_cheating_prover_that_adds_a_small_order_point_to_claim_another_secret_is_refused() -> None:
    """The cofactor attack: ``X2 + T`` (T of order 2) passes both equations whenever the challenge is even.

    The cheat claims the secret ``u(c P + T)``, under which an honest sender's ciphertext would not open. It
    is built here exactly (nonces ground until ``e`` is even, so that ``e T`` vanishes and both equations
    hold) and refused: ``X2 + T`` is off the prime-order subgroup, which the verifier checks (and libsodium's
    multiplications refuse as well).
    """
    prover, peer = hashlib.sha256(b"prover").digest(), hashlib.sha256(b"peer").digest()
    public, peer_public = _public(prover), _public(peer)
    lifted = dleq.edwards_lift(peer_public)
    c = dleq._scalar(prover)
    first = sodium.crypto_scalarmult_ed25519_base_noclamp(c)
    cheat = sodium.crypto_core_ed25519_add(sodium.crypto_scalarmult_ed25519_noclamp(c, lifted), _ORDER_TWO)
    assert _edwards_to_u(cheat) != _secret(prover, peer_public)  # a different claimed secret
    for attempt in range(64):
        r = sodium.crypto_core_ed25519_scalar_reduce(hashlib.sha512(attempt.to_bytes(2, "big")).digest())
        commitments = (
            sodium.crypto_scalarmult_ed25519_base_noclamp(r),
            sodium.crypto_scalarmult_ed25519_noclamp(r, lifted),
        )
        e = dleq._challenge(dleq._DOMAIN, b"ctx", public, peer_public, first, cheat, *commitments)
        if e[0] % 2 == 0:  # e T = 0: s P - e (X2 + T) = r P, both equations hold
            break
    s = sodium.crypto_core_ed25519_scalar_add(r, sodium.crypto_core_ed25519_scalar_mul(e, c))
    # The premise: with e even, s P - e (X2 + T) = s P - e X2 = r P, the committed R2 (and s B - e X1 = R1).
    honest_second = sodium.crypto_scalarmult_ed25519_noclamp(c, lifted)
    assert (
        sodium.crypto_core_ed25519_sub(
            sodium.crypto_scalarmult_ed25519_noclamp(s, lifted),
            sodium.crypto_scalarmult_ed25519_noclamp(e, honest_second),
        )
        == commitments[1]
    )
    assert not sodium.crypto_core_ed25519_is_valid_point(cheat)
    assert dleq.verify_exchange(public, peer_public, first + cheat + e + s, b"ctx") is None


def test_keys_off_the_prime_order_subgroup_have_no_lift_and_no_proof() -> None:
    honest = _public(hashlib.sha256(b"honest").digest())
    assert dleq.edwards_lift(honest) is not None
    with_torsion = sodium.crypto_core_ed25519_add(dleq.edwards_lift(honest), _ORDER_TWO)
    small_order = [0, 1, _FIELD - 1, 325606250916557431795983626356110631294008115727848805560023387167927233504]
    # On the twist: u^3 + 486662 u^2 + u is not a square mod p (Euler's criterion), so no curve point has this u.
    twist = next(u for u in range(2, 100) if pow(u**3 + 486662 * u**2 + u, (_FIELD - 1) // 2, _FIELD) != 1)
    keys = [_edwards_to_u(with_torsion), twist.to_bytes(32, "little"), *(u.to_bytes(32, "little") for u in small_order)]
    for key in [*keys, bytes(31)]:
        assert dleq.edwards_lift(key) is None
        with pytest.raises(ValueError, match="prime-order subgroup"):
            dleq.prove_exchange(hashlib.sha256(b"p").digest(), honest, key, b"ctx")


@settings(max_examples=60, deadline=None)
@given(owner=_KEYS, other=_KEYS, context=_CONTEXTS, position=st.integers(0, 95), flip=st.integers(1, 255))
def test_a_proof_of_possession_verifies_for_its_key_and_context_only(
    owner: bytes, other: bytes, context: bytes, position: int, flip: int
) -> None:
    public, other_public = _public(owner), _public(other)
    proof = dleq.prove_possession(owner, public, context)
    assert len(proof) == dleq.POSSESSION_BYTES
    assert dleq.verify_possession(public, proof, context)
    tampered = proof[:position] + bytes([proof[position] ^ flip]) + proof[position + 1 :]
    assert not dleq.verify_possession(public, tampered, context)
    assert not dleq.verify_possession(public, proof, context + b"/another index")
    if other_public != public:
        assert not dleq.verify_possession(other_public, proof, context)  # someone else's proof
        assert not dleq.verify_possession(public, dleq.prove_possession(other, public, context), context)  # an impostor


@settings(max_examples=30, deadline=None)
@given(owner=_KEYS, factor=st.binary(min_size=64, max_size=64))
def test_a_multiple_of_someone_elses_key_has_no_proof_of_possession(owner: bytes, factor: bytes) -> None:
    """``lambda C`` for another's key ``C``: whoever made it knows ``lambda``, not ``lambda c``. Neither ``C``'s own
    proof nor a proof made with ``lambda`` as the scalar (the best guess without ``c``) verifies for it."""
    public = _public(owner)
    scalar = sodium.crypto_core_ed25519_scalar_reduce(factor)
    if scalar == bytes(32):
        return  # lambda = 0 makes no key
    related = _edwards_to_u(sodium.crypto_scalarmult_ed25519_noclamp(scalar, dleq.edwards_lift(public)))
    if related == public:
        return
    assert not dleq.verify_possession(related, dleq.prove_possession(owner, public, b"ctx"), b"ctx")
    first = sodium.crypto_scalarmult_ed25519_base_noclamp(scalar)  # lambda B, not lambda C
    r = sodium.crypto_core_ed25519_scalar_reduce(hashlib.sha512(b"nonce").digest())
    e = dleq._challenge(
        dleq._POSSESSION_DOMAIN, b"ctx", related, b"", first, sodium.crypto_scalarmult_ed25519_base_noclamp(r)
    )
    s = sodium.crypto_core_ed25519_scalar_add(r, sodium.crypto_core_ed25519_scalar_mul(e, scalar))
    assert not dleq.verify_possession(related, first + e + s, b"ctx")


def test_keys_off_the_prime_order_subgroup_and_malformed_proofs_have_no_possession() -> None:
    owner = hashlib.sha256(b"owner").digest()
    public = _public(owner)
    proof = dleq.prove_possession(owner, public, b"ctx")
    with_torsion = _edwards_to_u(sodium.crypto_core_ed25519_add(dleq.edwards_lift(public), _ORDER_TWO))
    assert not dleq.verify_possession(with_torsion, proof, b"ctx")  # X1's u is the clean key's
    order = (2**252 + 27742317777372353535851937790883648493).to_bytes(32, "little")
    for bad in (b"", proof[:-1], proof + b"\0", proof[:32] + order + proof[64:], proof[:64] + order):
        assert not dleq.verify_possession(public, bad, b"ctx")
    assert not dleq.verify_possession(public[:31], proof, b"ctx")
    zero = proof[:32] + bytes(32) + bytes(32)  # e = s = 0: the libsodium multiplication refuses the identity
    assert not dleq.verify_possession(public, zero, b"ctx")


def test_a_libsodium_that_accepts_small_order_components_is_refused(monkeypatch) -> None:
    dleq.check_libsodium()  # the bundled one refuses them
    monkeypatch.setattr(dleq.sodium, "crypto_core_ed25519_is_valid_point", lambda point: True)
    with pytest.raises(RuntimeError, match="off the prime-order subgroup"):
        dleq.check_libsodium()


def test_a_response_not_reduced_mod_l_is_refused() -> None:
    """``s + l`` satisfies both equations as well as ``s``: the range check is what refuses it (malleability)."""
    owner, peer = hashlib.sha256(b"owner").digest(), hashlib.sha256(b"peer").digest()
    public, peer_public = _public(owner), _public(peer)
    order = 2**252 + 27742317777372353535851937790883648493

    def unreduced(scalar: bytes) -> bytes:
        return (int.from_bytes(scalar, "little") + order).to_bytes(32, "little")

    possession = dleq.prove_possession(owner, public, b"ctx")
    assert not dleq.verify_possession(public, possession[:64] + unreduced(possession[64:]), b"ctx")
    proof = dleq.prove_exchange(owner, public, peer_public, b"ctx")
    assert dleq.verify_exchange(public, peer_public, proof[:96] + unreduced(proof[96:]), b"ctx") is None
