"""PASS encodings: roster bitmaps, share digests, the counts commitment, the survivor transcript and roster fingerprint.

Every byte string that a PASS message carries or a signature binds, other than ciphertexts, is built here.
"""

from __future__ import annotations

import hashlib
import itertools
import struct
from collections.abc import Iterable, Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

from flmarket_flwr.pass_protocol.dleq import share_point
from flmarket_flwr.pass_protocol.primitives import validate_counts
from flmarket_flwr.pass_protocol.shamir import SCALAR_BYTES

SECRET_LENGTH: Final[int] = 32
"""Bytes of each shared secret (an X25519 private key, a self-mask seed)."""

MAX_PARTICIPANTS: Final[int] = 2**20
"""Largest PASS index, so that a roster bitmap is at most 128 KiB."""

LABEL: Final[bytes] = b"flmarket-pass/v2"
"""Domain label of PASS v2: the prefix of every digest, channel key and plaintext."""
SHARE_BYTES: Final[int] = SCALAR_BYTES
"""One secret's share: a scalar mod ``l``."""


class PassError(ValueError):
    """PASS v2 refused to go on: a check failed, or too few clients or shares are left (fail closed)."""


def counts_commitment(session: bytes, index: int, counts: npt.ArrayLike, nonce: bytes) -> bytes:
    """``SHA-256(label || session || index || counts as <u8 words || nonce)``: binds a client to its counts.

    The client keeps ``nonce`` (32 random bytes) private; the market audits a winner by asking for counts and
    nonce and recomputing this.
    """
    words = validate_counts(counts).astype("<u8").tobytes()
    return hashlib.sha256(
        LABEL
        + b"/counts"
        + struct.pack(">Q", len(session))
        + session
        + struct.pack(">QQ", index, len(words) // 8)
        + words
        + nonce
    ).digest()


def share_digest(session: bytes, dealer: int, holder: int, kind: bytes, share: bytes) -> bytes:
    """The dealer's word on one share: its point ``sigma B`` for the mask key, a hiding digest for the seed.

    ``kind`` is ``b"s"`` (a share of the mask key: :func:`~flmarket_flwr.pass_protocol.dleq.share_point`,
    ``b""`` for a share that is not a non-zero scalar below ``l``, so that the server can check the dealing
    against the advertised key in the exponent) or ``b"b"`` (of the self-mask seed:
    ``SHA-256(label || session || dealer || holder || kind || share)``; a share is uniform on its own, so its
    digest hides it).
    """
    if kind == b"s":
        return share_point(share) or b""
    return _prefixed_digest(_digest_prefix(session, dealer, holder), kind, share)


def _digest_prefix(session: bytes, dealer: int, holder: int) -> bytes:
    """``label || "/share-digest" || len(session) || session || dealer || holder``: each share digest's prefix."""
    return LABEL + b"/share-digest" + struct.pack(">Q", len(session)) + session + struct.pack(">QQ", dealer, holder)


def _prefixed_digest(prefix: bytes, kind: bytes, share: bytes) -> bytes:
    """:func:`share_digest` given its :func:`_digest_prefix`."""
    return hashlib.sha256(prefix + kind + share).digest()


def pair_digest(session: bytes, dealer: int, holder: int, both: bytes) -> bytes:
    """The 64-byte digest of one neighbour's share pair (mask-key share, then self-mask-seed share).

    The two :func:`share_digest` s (shorter if the mask-key share is not a non-zero scalar below ``l``).
    """
    return share_digest(session, dealer, holder, b"s", both[:SHARE_BYTES]) + share_digest(
        session, dealer, holder, b"b", both[SHARE_BYTES:]
    )


def survivor_transcript(session: bytes, survivors: Iterable[int] | np.ndarray) -> bytes:
    """``SHA-256(label || session || sorted U3)``: what the sum covers, recorded by clients for the bid step."""
    values = survivors if isinstance(survivors, np.ndarray) else np.asarray(list(survivors))
    ordered = np.sort(values.astype(np.uint64))
    body = struct.pack(">Q", len(session)) + session + struct.pack(">Q", ordered.size)
    return hashlib.sha256(LABEL + b"/transcript" + body + ordered.astype(">u8").tobytes()).digest()


def roster_fingerprint(run_id: int, session: bytes, node_ids: Sequence[int] | np.ndarray) -> bytes:
    """``SHA-256(label || run id || session || node ids in PASS-index order)``: the roster every advert binds.

    The server announces it with each advertise request; a client signs it with its keys, and its neighbours
    check their signatures under their own copy, so all honest neighbours of a client were shown one roster.
    """
    if isinstance(node_ids, np.ndarray) and node_ids.dtype.kind == "u":  # a roster sent as uint64 words
        ids = node_ids.astype(np.uint64)
    else:
        ids = np.asarray([int(node) for node in node_ids], dtype=np.uint64)
    body = struct.pack(">QQ", run_id, len(session)) + session + struct.pack(">Q", ids.size)
    return hashlib.sha256(LABEL + b"/roster" + body + ids.astype(">u8").tobytes()).digest()


def indices_to_bitmap(indices: Iterable[int]) -> bytes:
    """Set of PASS indices (1-based) as a bitmap: bit ``(i - 1) % 8`` of byte ``(i - 1) // 8``, no trailing zeros.

    Rosters travel as bitmaps: ``E / 8`` bytes per message instead of ``8 E`` for a list of ints.
    """
    values = np.asarray(list(indices), dtype=np.int64)
    if values.size == 0:
        return b""
    if values.min() < 1 or values.max() > MAX_PARTICIPANTS:
        raise ValueError(f"indices must be in [1, {MAX_PARTICIPANTS}]")
    bits = np.zeros(int(values.max()), dtype=np.uint8)
    bits[values - 1] = 1
    return np.packbits(bits, bitorder="little").tobytes()


def bitmap_to_indices(bitmap: bytes) -> list[int]:
    """Inverse of :func:`indices_to_bitmap`: the sorted indices; ``PassError`` if oversized or not canonical."""
    return bitmap_array(bitmap).tolist()


def bitmap_bits(bitmap: bytes, size: int = 0) -> npt.NDArray[np.bool_]:
    """The bitmap as booleans (position ``i - 1`` for index ``i``), at least ``size`` long; checked as above."""
    if len(bitmap) > MAX_PARTICIPANTS // 8:
        raise PassError(f"a roster bitmap holds at most {MAX_PARTICIPANTS} indices")
    if bitmap and bitmap[-1] == 0:
        raise PassError("a roster bitmap must not end with a zero byte")
    bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8), bitorder="little").astype(bool)
    return np.concatenate([bits, np.zeros(max(0, size - bits.size), dtype=bool)])


def bitmap_array(bitmap: bytes) -> npt.NDArray[np.int64]:
    """:func:`bitmap_to_indices` as a numpy array (no Python int per index)."""
    return (np.flatnonzero(bitmap_bits(bitmap)) + 1).astype(np.int64)


def in_bitmap(bitmap: bytes, index: int) -> bool:
    """Whether ``index`` is set in ``bitmap`` (one byte read)."""
    byte = (index - 1) // 8
    return 0 <= byte < len(bitmap) and index >= 1 and bool(bitmap[byte] >> ((index - 1) % 8) & 1)


def strictly_increasing(values: list[int]) -> bool:
    """True if ``values`` is sorted without repeats (an empty list is)."""
    return all(a < b for a, b in itertools.pairwise(values))
