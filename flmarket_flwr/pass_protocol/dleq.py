"""Proof that an X25519 shared secret is the one behind two public keys (Chaum-Pedersen over edwards25519).

PASS's blame evidence (:func:`prove_exchange`, :func:`verify_exchange`): a receiver proves the channel secret
it reveals, so it cannot frame an honest sender, and anyone judges from the advertised keys alone. Also the
cipher key's proof of possession (:func:`prove_possession`) and the check of a dealer's mask-key shares
(:func:`share_point`, :func:`dealing_matches`). Only prime-order-subgroup points are accepted.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import Final

from nacl import bindings as sodium
from nacl.exceptions import CryptoError

from flmarket_flwr.pass_protocol.shamir import GROUP_ORDER, parity_weights, scalar_from_bytes

PROOF_BYTES: Final[int] = 128
"""``X1 || X2 || e || s``: the two Edwards points ``c B`` and ``c P``, the challenge and the response."""

POSSESSION_BYTES: Final[int] = 96
"""``X1 || e || s``: the Edwards point ``c B`` of a proof of possession, the challenge and the response."""

_FIELD: Final[int] = 2**255 - 19
_ORDER: Final[int] = GROUP_ORDER  # l, the prime-order subgroup's order
_DOMAIN: Final[bytes] = b"flmarket-pass/v2/dleq"
_POSSESSION_DOMAIN: Final[bytes] = b"flmarket-pass/v2/possession"


def check_libsodium() -> None:
    """``RuntimeError`` unless libsodium refuses points with a small-order component (run once at import).

    Every check of this module on the prime-order subgroup is ``crypto_core_ed25519_is_valid_point``: a
    libsodium build whose check let such points through would let the cofactor cheat through (the one PyNaCl
    bundles refuses them), and then PASS had better not run at all.
    """
    base = sodium.crypto_scalarmult_ed25519_base_noclamp((1).to_bytes(32, "little"))
    order_two = (_FIELD - 1).to_bytes(32, "little")  # the Edwards point (0, -1)
    if not sodium.crypto_core_ed25519_is_valid_point(base) or sodium.crypto_core_ed25519_is_valid_point(
        sodium.crypto_core_ed25519_add(base, order_two)
    ):
        raise RuntimeError("this libsodium accepts Edwards points off the prime-order subgroup: PASS cannot use it")


def montgomery_u(key: bytes) -> int:
    """An X25519 public key as the u-coordinate the exchange uses (bit 255 cleared, reduced mod p).

    Two encodings of one u are one key to X25519: PASS compares keys by this value.
    """
    return (int.from_bytes(key, "little") & ((1 << 255) - 1)) % _FIELD


def edwards_lift(key: bytes) -> bytes | None:
    """The 32-byte Edwards encoding of X25519 public key ``key`` (even x), or ``None`` off the prime-order subgroup.

    ``None`` for a key that is not 32 bytes, lies on the twist, has small order or a small-order component:
    no honest key does.
    """
    if len(key) != 32:
        return None
    u = montgomery_u(key)
    if (u + 1) % _FIELD == 0:
        return None
    y = (u - 1) * pow(u + 1, -1, _FIELD) % _FIELD
    encoded = y.to_bytes(32, "little")  # bit 255 (the sign of x) clear: the even root
    return encoded if sodium.crypto_core_ed25519_is_valid_point(encoded) else None


def _montgomery_of(point: bytes) -> bytes:
    """The X25519 encoding (u, little-endian) of a valid Edwards point: ``u = (1 + y) / (1 - y)``."""
    y = int.from_bytes(point, "little") & ((1 << 255) - 1)
    return ((1 + y) * pow(1 - y, -1, _FIELD) % _FIELD).to_bytes(32, "little")


def _scalar(private_key: bytes) -> bytes:
    """The clamped X25519 scalar of ``private_key`` reduced mod l (libsodium, constant-time)."""
    clamped = bytearray(private_key)
    clamped[0] &= 248
    clamped[31] = (clamped[31] & 127) | 64
    return sodium.crypto_core_ed25519_scalar_reduce(bytes(clamped) + bytes(32))


def _challenge(domain: bytes, context: bytes, prover_key: bytes, peer_key: bytes, *points: bytes) -> bytes:
    """``SHA-512(domain || len(context) || context || A || P || points) mod l`` (``P`` empty for possession)."""
    body = domain + len(context).to_bytes(8, "big") + context + prover_key + peer_key + b"".join(points)
    return sodium.crypto_core_ed25519_scalar_reduce(hashlib.sha512(body).digest())


def prove_exchange(private_key: bytes, public_key: bytes, peer_key: bytes, context: bytes) -> bytes:
    """A :data:`PROOF_BYTES` proof that ``X25519(private_key, peer_key)`` is the secret behind ``public_key``.

    Parameters
    ----------
    private_key : bytes
        The prover's raw X25519 private key ``c``.
    public_key : bytes
        Its public key ``A`` as advertised (the bytes the verifier will use).
    peer_key : bytes
        The other party's advertised X25519 public key ``P``.
    context : bytes
        What the proof is about (session, parties, run): a proof verifies only under the same context.

    Raises
    ------
    ValueError
        ``peer_key`` is not in the prime-order subgroup (then no proof exists; no honest key is).

    Notes
    -----
    PASS's blame evidence. A receiver whose shares do not open reveals its channel secret with one sender,
    ``K = X25519(c, P)`` for its own cipher key ``c`` (public ``A``) and the sender's cipher key ``P``, and
    proves in zero knowledge that the same scalar is behind ``A`` and ``K``: a discrete-log-equality proof on
    the Edwards form of the curve, made non-interactive with SHA-512 (Fiat-Shamir) over a caller's context.
    The server checks it against the two advertised keys alone, so a receiver cannot frame an honest sender
    with a wrong secret, and no party needs a private key to judge.

    X25519 keys are Montgomery u-coordinates; each is lifted to the Edwards point with that u and an even x
    (``y = (u - 1) / (u + 1)``). A point and its negative share one u, and ``u(c P) = u(c (-P))``, so the
    lift's sign does not matter. Only points of the prime-order subgroup are accepted (libsodium's
    ``crypto_core_ed25519_is_valid_point``, and its scalar multiplications refuse others too): an honest key
    is always one, and with the cofactor a cheating prover could add a small-order point to ``X2`` and grind
    its nonce until the challenge kills it, proving a secret that is not the exchange's. The prover's scalar
    operations are libsodium's (PyNaCl), constant-time; the verifier's work is public.
    """
    lifted = edwards_lift(peer_key)
    if lifted is None:
        raise ValueError("the peer key is not a point of the prime-order subgroup: no proof exists")
    c = _scalar(private_key)
    first = sodium.crypto_scalarmult_ed25519_base_noclamp(c)
    second = sodium.crypto_scalarmult_ed25519_noclamp(c, lifted)
    # Hedged nonce: fresh randomness, and the secret and the statement in case the randomness is weak.
    r = sodium.crypto_core_ed25519_scalar_reduce(hashlib.sha512(os.urandom(32) + c + context + lifted).digest())
    commitments = (
        sodium.crypto_scalarmult_ed25519_base_noclamp(r),
        sodium.crypto_scalarmult_ed25519_noclamp(r, lifted),
    )
    e = _challenge(_DOMAIN, context, public_key, peer_key, first, second, *commitments)
    s = sodium.crypto_core_ed25519_scalar_add(r, sodium.crypto_core_ed25519_scalar_mul(e, c))
    return first + second + e + s


def verify_exchange(public_key: bytes, peer_key: bytes, proof: bytes, context: bytes) -> bytes | None:
    """The X25519 secret of ``public_key``'s owner with ``peer_key`` if ``proof`` shows it, else ``None``.

    Checks that both proof points are in the prime-order subgroup, that the first is ``public_key``'s
    point, that ``e`` and ``s`` are reduced scalars, and the two Chaum-Pedersen equations through the
    challenge: ``s B - e X1`` and ``s P - e X2`` hash back to ``e``. The secret returned is the u-coordinate
    of ``X2``, exactly what :meth:`X25519PrivateKey.exchange` gives the prover.
    """
    lifted = edwards_lift(peer_key)
    if lifted is None or not isinstance(proof, bytes) or len(proof) != PROOF_BYTES:
        return None
    first, second, e, s = proof[:32], proof[32:64], proof[64:96], proof[96:]
    base_commitment = _base_commitment(public_key, first, e, s)
    if base_commitment is None or not sodium.crypto_core_ed25519_is_valid_point(second):
        return None
    try:
        peer_commitment = sodium.crypto_core_ed25519_sub(
            sodium.crypto_scalarmult_ed25519_noclamp(s, lifted), sodium.crypto_scalarmult_ed25519_noclamp(e, second)
        )
    except CryptoError:  # a product is the identity (s or e zero): no honest proof gives one
        return None
    if _challenge(_DOMAIN, context, public_key, peer_key, first, second, base_commitment, peer_commitment) != e:
        return None
    return _montgomery_of(second)


def _base_commitment(public_key: bytes, first: bytes, e: bytes, s: bytes) -> bytes | None:
    """``s B - e X1`` for a proof about ``public_key``, or ``None`` when the proof cannot be about it.

    Both proofs' shared checks: ``X1`` a point of the prime-order subgroup with ``public_key``'s u-coordinate
    (either sign: ``c`` and ``-c`` are both known to whoever knows one), and ``e``, ``s`` reduced scalars (an
    unreduced ``s + l`` would pass the equation too).
    """
    if len(public_key) != 32 or not sodium.crypto_core_ed25519_is_valid_point(first):
        return None
    if _montgomery_of(first) != montgomery_u(public_key).to_bytes(32, "little"):
        return None
    if int.from_bytes(e, "little") >= _ORDER or int.from_bytes(s, "little") >= _ORDER:
        return None
    try:
        return sodium.crypto_core_ed25519_sub(
            sodium.crypto_scalarmult_ed25519_base_noclamp(s), sodium.crypto_scalarmult_ed25519_noclamp(e, first)
        )
    except CryptoError:  # a product is the identity (s or e zero): no honest proof gives one
        return None


def prove_possession(private_key: bytes, public_key: bytes, context: bytes) -> bytes:
    """A :data:`POSSESSION_BYTES` Schnorr proof that the maker of ``public_key`` knows its private key.

    Without it a key could be advertised as a multiple ``lambda C`` of another client's key ``C``, and a
    proven channel secret ``c (lambda C)`` would give whoever knows ``lambda`` the secret ``c C`` of a
    different edge: a client checks the accused's proof before it proves anything
    (:func:`verify_possession`), so every secret it reveals is one the accused could compute itself.

    Parameters
    ----------
    private_key : bytes
        The raw X25519 private key ``c``.
    public_key : bytes
        Its public key as advertised.
    context : bytes
        What the key is advertised for (PASS binds the run, the session and the index): the proof verifies
        only there.

    Notes
    -----
    Each advertised cipher key comes with a Schnorr proof of possession (:func:`prove_possession`), and a
    receiver proves a channel secret only with a sender whose proof verifies: a secret ``c P`` is then one the
    sender could compute itself, never the secret of another edge (a key ``P = lambda C`` made from another
    client's key ``C`` would turn ``c P`` into ``c C``).
    """
    c = _scalar(private_key)
    first = sodium.crypto_scalarmult_ed25519_base_noclamp(c)
    r = sodium.crypto_core_ed25519_scalar_reduce(hashlib.sha512(os.urandom(32) + c + context + public_key).digest())
    commitment = sodium.crypto_scalarmult_ed25519_base_noclamp(r)
    e = _challenge(_POSSESSION_DOMAIN, context, public_key, b"", first, commitment)
    return first + e + sodium.crypto_core_ed25519_scalar_add(r, sodium.crypto_core_ed25519_scalar_mul(e, c))


def verify_possession(public_key: bytes, proof: bytes, context: bytes) -> bool:
    """Whether ``proof`` shows that ``public_key``'s maker knows its private key, under ``context``.

    Checks that ``X1`` is a point of the prime-order subgroup with ``public_key``'s u-coordinate (so a key
    off that subgroup never passes), that ``e`` and ``s`` are reduced scalars, and that ``s B - e X1``
    hashes back to ``e``.
    """
    if not isinstance(proof, bytes) or len(proof) != POSSESSION_BYTES:
        return False
    first, e, s = proof[:32], proof[32:64], proof[64:]
    commitment = _base_commitment(public_key, first, e, s)
    return commitment is not None and _challenge(_POSSESSION_DOMAIN, context, public_key, b"", first, commitment) == e


# ----------------------------------------------------------------------------
# Verifiable dealing of the mask key (Feldman-style, over the same curve)
# ----------------------------------------------------------------------------
def mask_scalar(private_key: bytes) -> bytes:
    """The clamped X25519 scalar of ``private_key`` reduced mod ``l``: the secret a PASS client deals."""
    return _scalar(private_key)


def share_point(share: bytes) -> bytes | None:
    """``sigma B`` for a scalar share ``sigma`` (32 bytes, below ``l``, not zero), or ``None``.

    The dealer's public word on a share of its mask key: binding, and it reveals of ``sigma`` only what
    Feldman's commitments would (the points of all receivers lie on the dealer's polynomial in the exponent).
    """
    value = scalar_from_bytes(share)
    if not value:
        return None
    return sodium.crypto_scalarmult_ed25519_base_noclamp(share)


def dealing_matches(key: bytes, xs: Sequence[int], points: Sequence[bytes], threshold: int) -> bool:
    """Whether the share points held at ``xs`` and X25519 key ``key`` lie on one polynomial of degree < ``threshold``.

    That is, whether the shares behind the points reconstruct, from any ``threshold`` of them, a scalar ``s``
    with ``u(s B) = key``: the mask key itself (or its negative, which gives the same exchanges). Checked in the
    exponent with one random parity check (:func:`~flmarket_flwr.pass_protocol.shamir.parity_weights`):
    ``sum_i w_i P_i = -w_0 A``, compared up to sign, where ``A`` lifts the key. False for a key or a point off
    the prime-order subgroup; a wrong dealing passes with probability ``1 / l``.

    Notes
    -----
    The same curve makes a dealer's shares of its mask key verifiable (:func:`share_point`,
    :func:`dealing_matches`): each share ``sigma`` (a scalar mod ``l``) travels with its point ``sigma B``, which
    its receiver checks and the server keeps, and the server checks that the points of a dropped dealer's
    holders lie on one polynomial of degree < ``t`` through the lift of its advertised mask key before it asks
    anyone to unmask; it then rebuilds the key as a scalar and recomputes the exchanges (:func:`scalar_exchange`).
    """
    lifted = edwards_lift(key)
    if (
        lifted is None
        or len(points) != len(xs)
        or not all(sodium.crypto_core_ed25519_is_valid_point(p) for p in points)
    ):
        return False
    weights = parity_weights([0, *xs], threshold)
    if not weights:
        return True
    try:
        total = b""
        for weight, point in zip(weights[1:], points, strict=True):
            if weight:
                term = sodium.crypto_scalarmult_ed25519_noclamp(weight.to_bytes(32, "little"), point)
                total = sodium.crypto_core_ed25519_add(total, term) if total else term
        expected = sodium.crypto_scalarmult_ed25519_noclamp(weights[0].to_bytes(32, "little"), lifted)
    except CryptoError:  # a product is the identity: a weight was 0 (probability 2 / l), refuse rather than guess
        return False
    return bool(total) and _y_of(total) == _y_of(expected)


def public_key_of_scalar(scalar: bytes) -> bytes | None:
    """The X25519 public key (u, little-endian) of scalar ``scalar`` mod ``l``, or ``None`` for a bad scalar."""
    point = share_point(scalar)
    return None if point is None else _montgomery_of(point)


def scalar_exchange(scalar: bytes, peer_key: bytes) -> bytes | None:
    """``u(s P)`` for scalar ``s`` mod ``l`` and X25519 key ``P`` of the prime-order subgroup, else ``None``.

    Exactly what :meth:`X25519PrivateKey.exchange` gives for any private key whose clamped scalar is ``s`` or
    ``-s`` mod ``l``: clamping makes the scalar a multiple of 8 that acts on the subgroup as its residue mod
    ``l``, and ``u(-Q) = u(Q)``. The server rebuilds a dropped client's mask key as such a scalar.
    """
    lifted = edwards_lift(peer_key)
    if lifted is None or not scalar_from_bytes(scalar):
        return None
    return _montgomery_of(sodium.crypto_scalarmult_ed25519_noclamp(scalar, lifted))


def _y_of(point: bytes) -> bytes:
    """An Edwards encoding without its sign bit: equal for a point and its negative."""
    return point[:31] + bytes([point[31] & 0x7F])


check_libsodium()
