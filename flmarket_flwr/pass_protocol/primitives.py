"""Cryptographic and arithmetic primitives of PASS: pure functions over bytes and numpy arrays.

The ring ``Z_{2^64}`` (numpy ``uint64``, wrapping) and the validation of the counts that enter it; X25519
with public-key validation; pairwise seeds (HKDF-SHA256 bound to the run and the pair); the ChaCha20 PRG.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import numbers
import struct
from typing import Final

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.asymmetric.x25519 import (
    X25519PrivateKey,
    X25519PublicKey,
)
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

PROTOCOL_LABEL: Final[bytes] = b"flmarket-pass/v1"
"""Fixed domain-separation label put in front of every HKDF ``info``."""

PUBLIC_KEY_LENGTH: Final[int] = 32
"""Length in bytes of a raw X25519 public key."""

SEED_LENGTH: Final[int] = 32
"""Length in bytes of a pairwise seed (a ChaCha20 key)."""

MIN_PARTICIPANTS: Final[int] = 3
"""Smallest number of participants for which PASS hides individual counts."""

MASK_DTYPE: Final[np.dtype] = np.dtype(np.uint64)
"""Dtype of masked vectors: elements of the ring ``Z_{2^64}``."""

COUNT_LIMIT: Final[int] = 2**63
"""Exclusive upper bound on every count (and on every per-class total)."""

_MAX_INDEX: Final[int] = 2**64 - 1
_NO_SALT: Final[bytes] = bytes(32)  # RFC 5869: HKDF without a salt uses HashLen zero bytes
_CHACHA20_NONCE: Final[bytes] = bytes(16)  # every seed is a fresh, unique key
_PRG_WORD_DTYPE: Final[np.dtype] = np.dtype("<u8")


# ----------------------------------------------------------------------------
# Validation helpers
# ----------------------------------------------------------------------------
def is_integer(value: object) -> bool:
    """An integer of any kind (numpy's too), but not a bool: ``True`` must not pass as a setting of 1."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool | np.bool_)


def validate_index(index: object, what: str = "index") -> int:
    """Return ``index`` as a Python ``int`` after checking it is a valid index.

    Parameters
    ----------
    index : object
        Candidate participant index: a non-negative integer below ``2^64``
        (``int`` or numpy integer, never ``bool``).
    what : str, optional
        Name used in error messages.

    Returns
    -------
    int
        The index.

    Raises
    ------
    TypeError
        If ``index`` is not an integer, or is a ``bool``.
    ValueError
        If ``index`` is negative or does not fit in 64 bits.
    """
    if isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer)):
        raise TypeError(f"{what} must be a non-negative int, got {type(index).__name__} {index!r}")
    value = int(index)
    if value < 0 or value > _MAX_INDEX:
        raise ValueError(f"{what} must be a non-negative int below 2**64, got {value}")
    return value


def validate_session(session: object) -> bytes:
    """Check that ``session`` is a non-empty ``bytes`` run identifier.

    Raises
    ------
    TypeError
        If ``session`` is not ``bytes``.
    ValueError
        If ``session`` is empty.
    """
    if not isinstance(session, bytes):
        raise TypeError(f"session must be bytes, got {type(session).__name__}")
    if not session:
        raise ValueError("session must be non-empty bytes")
    return session


def validate_public_key_bytes(key: object, index: int) -> bytes:
    """Check that ``key`` looks like a raw X25519 public key (32 ``bytes``).

    Parameters
    ----------
    key : object
        Candidate raw public key.
    index : int
        Index of the participant it belongs to, used in error messages.

    Raises
    ------
    TypeError
        If ``key`` is not ``bytes``.
    ValueError
        If ``key`` does not have length 32.
    """
    if not isinstance(key, bytes):
        raise TypeError(f"public key of participant {index} must be bytes, got {type(key).__name__}")
    if len(key) != PUBLIC_KEY_LENGTH:
        raise ValueError(f"public key of participant {index} must be {PUBLIC_KEY_LENGTH} bytes, got {len(key)}")
    return key


def validate_counts(counts: npt.ArrayLike) -> npt.NDArray[np.uint64]:
    """Convert per-class label counts to a fresh ``uint64`` vector.

    Parameters
    ----------
    counts : array_like
        One-dimensional, non-empty vector of non-negative integers below
        ``2^63``. Integer arrays are accepted, and float arrays whose values are
        all exactly integral.

    Returns
    -------
    numpy.ndarray
        A new read-only ``uint64`` array of shape ``(C,)``.

    Raises
    ------
    TypeError
        If the values are not numbers (bool, complex, strings, objects, ...).
    ValueError
        If the shape is not ``(C,)`` with ``C >= 1``, or if a value is NaN,
        infinite, negative, not integral, or ``>= 2^63``.
    """
    array = np.asarray(counts)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"counts must be a non-empty 1-D vector (one entry per class), got shape {array.shape}")
    if array.dtype.kind == "O":
        array = _object_counts_to_array(array)
    if array.dtype.kind == "f":
        return _float_counts_to_uint64(array)
    if array.dtype.kind in "iu":
        return _int_counts_to_uint64(array)
    raise TypeError(f"counts must be integers or integral floats, got dtype {array.dtype}")


def _object_counts_to_array(array: np.ndarray) -> np.ndarray:
    """Turn an object array of Python numbers into an int or float array."""
    values = array.tolist()
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        too_large = [v for v in values if v >= COUNT_LIMIT]
        if too_large:
            raise ValueError(f"counts must be < 2**63, got {too_large[0]}")
        negative = [v for v in values if v < 0]
        if negative:
            raise ValueError(f"counts must be non-negative, got {negative[0]}")
        return np.asarray(values, dtype=np.uint64)
    raise TypeError("counts must be integers or integral floats, got objects")


def _float_counts_to_uint64(array: np.ndarray) -> npt.NDArray[np.uint64]:
    """Validate and convert a float count vector."""
    if np.isnan(array).any():
        raise ValueError("counts must not contain NaN")
    if np.isinf(array).any():
        raise ValueError("counts must be finite, got an infinite value")
    if (array < 0).any():
        raise ValueError(f"counts must be non-negative, got {array.min()}")
    if (np.floor(array) != array).any():
        bad = array[np.floor(array) != array][0]
        raise ValueError(f"counts must be integers, got non-integer value {bad}")
    if (array >= float(COUNT_LIMIT)).any():
        raise ValueError(f"counts must be < 2**63, got {array.max()}")
    return _read_only(array.astype(np.uint64))


def _int_counts_to_uint64(array: np.ndarray) -> npt.NDArray[np.uint64]:
    """Validate and convert an integer count vector."""
    if array.dtype.kind == "i" and (array < 0).any():
        raise ValueError(f"counts must be non-negative, got {array.min()}")
    if array.dtype.kind == "u" and (array >= np.uint64(COUNT_LIMIT)).any():
        raise ValueError(f"counts must be < 2**63, got {array.max()}")
    return _read_only(array.astype(np.uint64))


def _read_only(array: np.ndarray) -> np.ndarray:
    """Mark ``array`` read-only and return it."""
    array.setflags(write=False)
    return array


# ----------------------------------------------------------------------------
# Key agreement and seed derivation
# ----------------------------------------------------------------------------
def load_public_key(key: bytes, index: int) -> X25519PublicKey:
    """Load a raw X25519 public key and check it is usable for the exchange.

    A low-order point (for instance 32 zero bytes) makes every exchange
    produce the all-zero shared secret, which ``cryptography`` refuses; this
    function detects it with one exchange against a probe key (one random key
    per process, made on first use: its outputs are thrown away, and any
    clamped scalar gives the all-zero secret on a low-order point).

    Parameters
    ----------
    key : bytes
        32 raw public-key bytes.
    index : int
        Index of the participant the key belongs to, used in error messages.

    Returns
    -------
    X25519PublicKey
        The loaded key.

    Raises
    ------
    TypeError, ValueError
        If the key is not 32 bytes, or is not a valid point for X25519.
    """
    public_key = parse_public_key(validate_public_key_bytes(key, index), index)
    exchange_shared_secret(_probe_key(), public_key, index)
    return public_key


@functools.cache
def _probe_key() -> X25519PrivateKey:
    """The process's probe key for :func:`load_public_key` (generated once instead of once per key)."""
    return X25519PrivateKey.generate()


def parse_public_key(key: bytes, index: int) -> X25519PublicKey:
    """Parse 32 raw bytes as an X25519 public key (no low-order check).

    Raises
    ------
    ValueError
        If ``cryptography`` rejects the bytes; the message names ``index``.
    """
    try:
        return X25519PublicKey.from_public_bytes(key)
    except ValueError as error:
        raise ValueError(f"public key of participant {index} is not a valid X25519 key: {error}") from error


def exchange_shared_secret(private_key: X25519PrivateKey, peer_public_key: X25519PublicKey, peer_index: int) -> bytes:
    """Run the X25519 exchange with the key of participant ``peer_index``.

    Raises
    ------
    ValueError
        If the peer key is a low-order point (all-zero shared secret).
    """
    try:
        return private_key.exchange(peer_public_key)
    except ValueError as error:
        raise ValueError(
            f"public key of participant {peer_index} is not a valid point for the "
            f"X25519 exchange (low-order point, shared secret would be all zeros)"
        ) from error


def pair_info(session: bytes, index_a: int, index_b: int) -> bytes:
    """HKDF ``info`` binding the protocol, the run and the unordered pair.

    The layout is ``PROTOCOL_LABEL || len(session) (8 bytes, big-endian) ||
    session || min(a, b) (8 bytes, big-endian) || max(a, b) (8 bytes,
    big-endian)``, so both members of a pair build the same bytes, and the
    encoding is injective (the length prefix stops a session from swallowing
    index bytes).
    """
    low, high = sorted((validate_index(index_a), validate_index(index_b)))
    if low == high:
        raise ValueError(f"a pair needs two distinct indices, got {low} twice")
    session = validate_session(session)
    length_prefix = struct.pack(">Q", len(session))
    return PROTOCOL_LABEL + length_prefix + session + struct.pack(">QQ", low, high)


def derive_pair_seed(shared_secret: bytes, session: bytes, index_a: int, index_b: int) -> bytes:
    """Derive the 32-byte pairwise seed ``s_{a,b}`` from an X25519 secret.

    Parameters
    ----------
    shared_secret : bytes
        Output of the X25519 exchange between ``a`` and ``b``.
    session : bytes
        Identifier of the run (and attempt) the masks belong to.
    index_a, index_b : int
        The two participant indices, in either order.

    Returns
    -------
    bytes
        ``HKDF-SHA256(ikm=shared_secret, salt=None, info=pair_info(...))``,
        32 bytes, identical on both sides of the pair.
    """
    return hkdf_sha256(shared_secret, pair_info(session, index_a, index_b))


def hkdf_sha256(ikm: bytes, info: bytes) -> bytes:
    """HKDF-SHA256 (RFC 5869) without salt, 32 bytes of output: two calls of the standard library's ``hmac.digest``.

    The same bytes as ``cryptography``'s ``HKDF(SHA256(), length=32, salt=None, info=info).derive(ikm)`` (a test
    compares them on random inputs), without a key-derivation object per call (PASS derives three keys per
    neighbour: the pair seed, a channel key each way).

    Parameters
    ----------
    ikm : bytes
        Input keying material (an X25519 secret or a seed).
    info : bytes
        Context bound into the output.

    Returns
    -------
    bytes
        ``T(1) = HMAC(PRK, info || 0x01)`` with ``PRK = HMAC(32 zero bytes, ikm)``: 32 bytes.
    """
    prk = hmac.digest(_NO_SALT, ikm, "sha256")
    return hmac.digest(prk, info + b"\x01", "sha256")


# ----------------------------------------------------------------------------
# PRG and ring arithmetic
# ----------------------------------------------------------------------------
def expand_seed(seed: bytes, length: int) -> npt.NDArray[np.uint64]:
    """Expand a seed into ``length`` uniform elements of ``Z_{2^64}``.

    The PRG is the ChaCha20 keystream under key ``seed`` with an all-zero
    16-byte nonce (safe because every seed is used as a key exactly once per
    pair and run), read as little-endian 64-bit words.

    Parameters
    ----------
    seed : bytes
        32-byte pairwise seed.
    length : int
        Number of 64-bit words, the number of classes ``C``.

    Returns
    -------
    numpy.ndarray
        Writable ``uint64`` array of shape ``(length,)``.
    """
    if len(seed) != SEED_LENGTH:
        raise ValueError(f"seed must be {SEED_LENGTH} bytes, got {len(seed)}")
    if length < 0:
        raise ValueError(f"length must be non-negative, got {length}")
    encryptor = Cipher(algorithms.ChaCha20(seed, _CHACHA20_NONCE), mode=None).encryptor()
    keystream = encryptor.update(bytes(8 * length))
    return np.frombuffer(keystream, dtype=_PRG_WORD_DTYPE).astype(np.uint64)


def pairwise_sign(own_index: int, peer_index: int) -> int:
    """Sign ``eps_{e,v}`` of the mask shared by ``e = own_index`` and ``v = peer_index``.

    Returns
    -------
    int
        ``+1`` if ``e < v`` and ``-1`` if ``e > v``.

    Raises
    ------
    ValueError
        If the two indices are equal.
    """
    if own_index == peer_index:
        raise ValueError(f"a participant has no mask with itself (index {own_index})")
    return 1 if own_index < peer_index else -1


def ring_sum(vectors: np.ndarray) -> npt.NDArray[np.uint64]:
    """Sum the rows of a 2-D ``uint64`` array modulo ``2^64``."""
    return np.add.reduce(vectors, axis=0, dtype=np.uint64)


def public_key_fingerprint(public_key: bytes) -> str:
    """Short, non-secret fingerprint of a public key (16 hex digits of SHA-256)."""
    return hashlib.sha256(public_key).hexdigest()[:16]
