"""The PASS channel and masks: each edge's AEAD under its X25519 secret, the proof contexts, and the ring masks.

A share pair travels sealed under the edge's channel secret (:func:`seal`, :func:`unseal`); the masks are the
PRG expansions added to the counts in ``Z_2^64`` (:func:`signed_mask`), rebuilt by the server from a dropped
client's mask key (:func:`scalar_pair_mask`, :func:`rebuild_secret`).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from typing import Final

import numpy as np
import numpy.typing as npt
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from flmarket_flwr.pass_protocol.dleq import scalar_exchange
from flmarket_flwr.pass_protocol.encoding import LABEL, SHARE_BYTES, PassError, pair_digest
from flmarket_flwr.pass_protocol.primitives import derive_pair_seed, expand_seed, hkdf_sha256
from flmarket_flwr.pass_protocol.shamir import reconstruct_scalar, scalar_from_bytes, scalar_to_bytes

_PLAINTEXT_BYTES: Final[int] = len(LABEL) + 16 + 2 * SHARE_BYTES
_NONCE_BYTES: Final[int] = 12
CIPHERTEXT_BYTES: Final[int] = _NONCE_BYTES + _PLAINTEXT_BYTES + 16
"""One sealed share pair: a random nonce, then ChaCha20-Poly1305 of the pair and its tag."""


def _channel_key(secret: bytes, aad: bytes) -> bytes:
    """AEAD key of the ciphertext ``sender -> receiver`` from the edge's channel secret ``X25519(c_u, C_v)``.

    ``aad`` is :func:`channel_aad` of that direction, bound in the HKDF info: the two directions of an
    edge share the secret but never a key.
    """
    return hkdf_sha256(secret, LABEL + b"/channel" + aad)


def seal(secret: bytes, session: bytes, sender: int, receiver: int, both: bytes) -> bytes:
    """``nonce || ChaCha20-Poly1305(share pair)`` for ``receiver`` under the edge's channel secret.

    Each direction's key encrypts one share pair per session, but the nonce is random all the same: a
    client whose state is replayed (a retried step) must not encrypt a second pair under one key and nonce.
    """
    aad = channel_aad(session, sender, receiver)
    plaintext = LABEL + struct.pack(">QQ", sender, receiver) + both
    nonce = os.urandom(_NONCE_BYTES)
    return nonce + ChaCha20Poly1305(_channel_key(secret, aad)).encrypt(nonce, plaintext, aad)


def unseal(secret: bytes, ciphertext: bytes, session: bytes, sender: int, receiver: int, digest: bytes) -> bytes | None:
    """The share pair in ``ciphertext`` given the X25519 secret, or ``None`` if it does not open.

    "Does not open": the AEAD tag fails, the plaintext is malformed or addressed to another pair, a share
    is not a scalar below ``l``, or the pair does not match the ``digest`` its dealer sent the server: for the
    mask-key share that is its point ``sigma B`` (the receiver's check of a verifiable dealing). The
    receiver and the server (from a proven channel secret) run this same check, so they agree on the verdict.
    """
    aad = channel_aad(session, sender, receiver)
    if len(ciphertext) != CIPHERTEXT_BYTES:
        return None
    try:
        plaintext = ChaCha20Poly1305(_channel_key(secret, aad)).decrypt(
            ciphertext[:_NONCE_BYTES], ciphertext[_NONCE_BYTES:], aad
        )
    except InvalidTag:
        return None
    header = LABEL + struct.pack(">QQ", sender, receiver)
    if len(plaintext) != _PLAINTEXT_BYTES or not plaintext.startswith(header):
        return None
    both = plaintext[len(header) :]  # 2 * SHARE_BYTES by the length check above
    if scalar_from_bytes(both[:SHARE_BYTES]) is None or scalar_from_bytes(both[SHARE_BYTES:]) is None:
        return None
    return both if pair_digest(session, sender, receiver, both) == digest else None


def channel_aad(session: bytes, sender: int, receiver: int) -> bytes:
    """``len(session) || session || sender || receiver``: the direction ``sender -> receiver`` in this session."""
    return struct.pack(">Q", len(session)) + session + struct.pack(">QQ", sender, receiver)


def accusation_context(run_id: int, roster: bytes, session: bytes, accuser: int, accused: int) -> bytes:
    """What an accuser's proof of its channel secret is bound to: this run, roster, session and edge."""
    return LABEL + b"/accusation" + struct.pack(">Q", run_id) + roster + channel_aad(session, accused, accuser)


def possession_context(run_id: int, session: bytes, index: int) -> bytes:
    """What a cipher key's proof of possession is bound to: this run, session and the advertiser's index."""
    return LABEL + b"/possession" + struct.pack(">Q", run_id) + channel_aad(session, index, 0)


def scalar_pair_mask(
    scalar: bytes, peer_key: bytes, session: bytes, own: int, peer: int, length: int
) -> npt.NDArray[np.uint64]:
    """``eps_{own,peer} * PRG(s_{own,peer})`` in ``Z_2^64`` from ``own``'s mask key as a scalar mod ``l``.

    The exchange is :func:`~flmarket_flwr.pass_protocol.dleq.scalar_exchange`, equal to X25519's: the mask the
    peer added with its own private key, negated (eps = +1 if own < peer else -1).
    """
    secret = scalar_exchange(scalar, peer_key)
    if secret is None:  # every advertised mask key was checked to lift: not reached for an advertised key
        raise PassError(f"client {peer}'s mask key is not a point of the prime-order subgroup")
    return signed_mask(derive_pair_seed(secret, session, own, peer), own, peer, length)


def rebuild_secret(shares: Sequence[tuple[int, bytes]]) -> bytes:
    """The 32-byte secret (a scalar mod ``l``) behind ``(holder index, share)`` pairs; all are used, so pass ``t``.

    Raises
    ------
    ValueError
        A share is not a scalar below ``l``, or two holders repeat.
    """
    values = [scalar_from_bytes(share) for _, share in shares]
    if any(value is None for value in values):
        raise ValueError("a share is not a scalar below l")
    return scalar_to_bytes(reconstruct_scalar([x for x, _ in shares], [int(value or 0) for value in values]))


def noise_words(noise: npt.ArrayLike, length: int) -> npt.NDArray[np.uint64]:
    """Signed integer noise as ring elements (two's complement mod 2^64), or :class:`PassError`."""
    values = np.asarray(noise)
    if values.shape != (length,) or not np.issubdtype(values.dtype, np.integer):
        raise PassError(f"noise must be {length} integers, got shape {values.shape} of {values.dtype}")
    return values.astype(np.int64).view(np.uint64)


def signed_mask(pair_seed: bytes, own: int, peer: int, length: int) -> npt.NDArray[np.uint64]:
    """``eps_{own,peer} * PRG(pair_seed)``: the pair's mask as ``own`` adds it."""
    mask = expand_seed(pair_seed, length)
    return mask if own < peer else (np.uint64(0) - mask)
