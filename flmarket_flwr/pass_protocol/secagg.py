"""PASS v2: dropout-robust secure aggregation of label counts on a sparse graph (Bonawitz 2017 + Bell 2020).

Each client masks its counts twice, a self-mask and pairwise masks with its ``k`` graph neighbours, and
Shamir-shares both secrets among them; only ONE sum is ever released per session. :class:`PassClient` and
:class:`PassServer` run the rounds (advertise, share keys, masked input, with identity keys consistency,
unmask); every message is a dataclass over ``ConfigRecord`` types. The threat model, verifiable dealing and
blame rules are in :class:`PassServer` (tests: docs/threat-model.md).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import os
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Self

import numpy as np
import numpy.typing as npt
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from flmarket_flwr.pass_protocol.dleq import (
    dealing_matches,
    edwards_lift,
    mask_scalar,
    montgomery_u,
    prove_exchange,
    prove_possession,
    public_key_of_scalar,
    scalar_exchange,
    share_point,
    verify_exchange,
    verify_possession,
)
from flmarket_flwr.pass_protocol.graph import (
    DEFAULT_BAD_FRACTION,
    DEFAULT_SECURITY_BITS,
    GRAPH_SEED_LENGTH,
    check_degree,
    commit_graph_seed,
    derive_graph_seed,
    mask_graph,
    max_secret_threshold,
    neighbourhood_size,
    neighbours_of,
    roster_digest,
    secret_threshold,
    share_threshold,
)
from flmarket_flwr.pass_protocol.identity import (
    ROSTER_LENGTH,
    IdentityDirectory,
    sign_advertisement,
    sign_share_ciphertext,
    sign_survivor_set,
    verify_advertisement,
    verify_share_ciphertext,
    verify_survivor_set,
)
from flmarket_flwr.pass_protocol.primitives import (
    COUNT_LIMIT,
    MIN_PARTICIPANTS,
    derive_pair_seed,
    exchange_shared_secret,
    expand_seed,
    hkdf_sha256,
    is_integer,
    load_public_key,
    parse_public_key,
    ring_sum,
    validate_counts,
    validate_public_key_bytes,
)
from flmarket_flwr.pass_protocol.shamir import (
    SCALAR_BYTES,
    random_scalar,
    reconstruct_scalar,
    scalar_from_bytes,
    scalar_to_bytes,
    split_scalars,
)

SECRET_LENGTH: Final[int] = 32
"""Bytes of each shared secret (an X25519 private key, a self-mask seed)."""

MAX_PARTICIPANTS: Final[int] = 2**20
"""Largest PASS index, so that a roster bitmap is at most 128 KiB."""

_LABEL: Final[bytes] = b"flmarket-pass/v2"
_SHARE_BYTES: Final[int] = SCALAR_BYTES  # one secret's share: a scalar mod l
_PLAINTEXT_BYTES: Final[int] = len(_LABEL) + 16 + 2 * _SHARE_BYTES
_NONCE_BYTES: Final[int] = 12
_CIPHERTEXT_BYTES: Final[int] = _NONCE_BYTES + _PLAINTEXT_BYTES + 16  # random nonce, ChaCha20-Poly1305 and its tag


class PassError(ValueError):
    """PASS v2 refused to go on: a check failed, or too few clients or shares are left (fail closed)."""


# ----------------------------------------------------------------------------
# Public helpers
# ----------------------------------------------------------------------------
def counts_commitment(session: bytes, index: int, counts: npt.ArrayLike, nonce: bytes) -> bytes:
    """``SHA-256(label || session || index || counts as <u8 words || nonce)``: binds a client to its counts.

    The client keeps ``nonce`` (32 random bytes) private; the market audits a winner by asking for counts and
    nonce and recomputing this.
    """
    words = validate_counts(counts).astype("<u8").tobytes()
    return hashlib.sha256(
        _LABEL
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
    return _LABEL + b"/share-digest" + struct.pack(">Q", len(session)) + session + struct.pack(">QQ", dealer, holder)


def _prefixed_digest(prefix: bytes, kind: bytes, share: bytes) -> bytes:
    """:func:`share_digest` given its :func:`_digest_prefix`."""
    return hashlib.sha256(prefix + kind + share).digest()


def _pair_digest(session: bytes, dealer: int, holder: int, both: bytes) -> bytes:
    """The 64-byte digest of one neighbour's share pair (mask-key share, then self-mask-seed share).

    The two :func:`share_digest` s (shorter if the mask-key share is not a non-zero scalar below ``l``).
    """
    return share_digest(session, dealer, holder, b"s", both[:_SHARE_BYTES]) + share_digest(
        session, dealer, holder, b"b", both[_SHARE_BYTES:]
    )


def survivor_transcript(session: bytes, survivors: Iterable[int] | np.ndarray) -> bytes:
    """``SHA-256(label || session || sorted U3)``: what the sum covers, recorded by clients for the bid step."""
    values = survivors if isinstance(survivors, np.ndarray) else np.asarray(list(survivors))
    ordered = np.sort(values.astype(np.uint64))
    body = struct.pack(">Q", len(session)) + session + struct.pack(">Q", ordered.size)
    return hashlib.sha256(_LABEL + b"/transcript" + body + ordered.astype(">u8").tobytes()).digest()


def roster_fingerprint(run_id: int, session: bytes, node_ids: Sequence[int]) -> bytes:
    """``SHA-256(label || run id || session || node ids in PASS-index order)``: the roster every advert binds.

    The server announces it with each advertise request; a client signs it with its keys, and its neighbours
    check their signatures under their own copy, so all honest neighbours of a client were shown one roster.
    """
    ids = np.asarray([int(node) for node in node_ids], dtype=np.uint64)
    body = struct.pack(">QQ", run_id, len(session)) + session + struct.pack(">Q", ids.size)
    return hashlib.sha256(_LABEL + b"/roster" + body + ids.astype(">u8").tobytes()).digest()


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
    return _bitmap_array(bitmap).tolist()


def _bitmap_bits(bitmap: bytes, size: int = 0) -> npt.NDArray[np.bool_]:
    """The bitmap as booleans (position ``i - 1`` for index ``i``), at least ``size`` long; checked as above."""
    if len(bitmap) > MAX_PARTICIPANTS // 8:
        raise PassError(f"a roster bitmap holds at most {MAX_PARTICIPANTS} indices")
    if bitmap and bitmap[-1] == 0:
        raise PassError("a roster bitmap must not end with a zero byte")
    bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8), bitorder="little").astype(bool)
    return np.concatenate([bits, np.zeros(max(0, size - bits.size), dtype=bool)])


def _bitmap_array(bitmap: bytes) -> npt.NDArray[np.int64]:
    """:func:`bitmap_to_indices` as a numpy array (no Python int per index)."""
    return (np.flatnonzero(_bitmap_bits(bitmap)) + 1).astype(np.int64)


def _in_bitmap(bitmap: bytes, index: int) -> bool:
    """Whether ``index`` is set in ``bitmap`` (one byte read)."""
    byte = (index - 1) // 8
    return 0 <= byte < len(bitmap) and index >= 1 and bool(bitmap[byte] >> ((index - 1) % 8) & 1)


def _strictly_increasing(values: list[int]) -> bool:
    """True if ``values`` is sorted without repeats (an empty list is)."""
    return all(a < b for a, b in itertools.pairwise(values))


def _channel_key(secret: bytes, aad: bytes) -> bytes:
    """AEAD key of the ciphertext ``sender -> receiver`` from the edge's channel secret ``X25519(c_u, C_v)``.

    ``aad`` is :func:`_channel_aad` of that direction, bound in the HKDF info: the two directions of an
    edge share the secret but never a key.
    """
    return hkdf_sha256(secret, _LABEL + b"/channel" + aad)


def _seal(secret: bytes, session: bytes, sender: int, receiver: int, both: bytes) -> bytes:
    """``nonce || ChaCha20-Poly1305(share pair)`` for ``receiver`` under the edge's channel secret.

    Each direction's key encrypts one share pair per session, but the nonce is random all the same: a
    client whose state is replayed (a retried step) must not encrypt a second pair under one key and nonce.
    """
    aad = _channel_aad(session, sender, receiver)
    plaintext = _LABEL + struct.pack(">QQ", sender, receiver) + both
    nonce = os.urandom(_NONCE_BYTES)
    return nonce + ChaCha20Poly1305(_channel_key(secret, aad)).encrypt(nonce, plaintext, aad)


def _unseal(
    secret: bytes, ciphertext: bytes, session: bytes, sender: int, receiver: int, digest: bytes
) -> bytes | None:
    """The share pair in ``ciphertext`` given the X25519 secret, or ``None`` if it does not open.

    "Does not open": the AEAD tag fails, the plaintext is malformed or addressed to another pair, a share
    is not a scalar below ``l``, or the pair does not match the ``digest`` its dealer sent the server: for the
    mask-key share that is its point ``sigma B`` (the receiver's check of a verifiable dealing). The
    receiver and the server (from a proven channel secret) run this same check, so they agree on the verdict.
    """
    aad = _channel_aad(session, sender, receiver)
    if len(ciphertext) != _CIPHERTEXT_BYTES:
        return None
    try:
        plaintext = ChaCha20Poly1305(_channel_key(secret, aad)).decrypt(
            ciphertext[:_NONCE_BYTES], ciphertext[_NONCE_BYTES:], aad
        )
    except InvalidTag:
        return None
    header = _LABEL + struct.pack(">QQ", sender, receiver)
    if len(plaintext) != _PLAINTEXT_BYTES or not plaintext.startswith(header):
        return None
    both = plaintext[len(header) :]  # 2 * _SHARE_BYTES by the length check above
    if scalar_from_bytes(both[:_SHARE_BYTES]) is None or scalar_from_bytes(both[_SHARE_BYTES:]) is None:
        return None
    return both if _pair_digest(session, sender, receiver, both) == digest else None


def _channel_aad(session: bytes, sender: int, receiver: int) -> bytes:
    """``len(session) || session || sender || receiver``: the direction ``sender -> receiver`` in this session."""
    return struct.pack(">Q", len(session)) + session + struct.pack(">QQ", sender, receiver)


def accusation_context(run_id: int, roster: bytes, session: bytes, accuser: int, accused: int) -> bytes:
    """What an accuser's proof of its channel secret is bound to: this run, roster, session and edge."""
    return _LABEL + b"/accusation" + struct.pack(">Q", run_id) + roster + _channel_aad(session, accused, accuser)


def possession_context(run_id: int, session: bytes, index: int) -> bytes:
    """What a cipher key's proof of possession is bound to: this run, session and the advertiser's index."""
    return _LABEL + b"/possession" + struct.pack(">Q", run_id) + _channel_aad(session, index, 0)


def _scalar_pair_mask(
    scalar: bytes, peer_key: bytes, session: bytes, own: int, peer: int, length: int
) -> npt.NDArray[np.uint64]:
    """``eps_{own,peer} * PRG(s_{own,peer})`` in ``Z_2^64`` from ``own``'s mask key as a scalar mod ``l``.

    The exchange is :func:`~flmarket_flwr.pass_protocol.dleq.scalar_exchange`, equal to X25519's: the mask the
    peer added with its own private key, negated (eps = +1 if own < peer else -1).
    """
    secret = scalar_exchange(scalar, peer_key)
    if secret is None:  # every advertised mask key was checked to lift: not reached for an advertised key
        raise PassError(f"client {peer}'s mask key is not a point of the prime-order subgroup")
    return _signed_mask(derive_pair_seed(secret, session, own, peer), own, peer, length)


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


def _noise_words(noise: npt.ArrayLike, length: int) -> npt.NDArray[np.uint64]:
    """Signed integer noise as ring elements (two's complement mod 2^64), or :class:`PassError`."""
    values = np.asarray(noise)
    if values.shape != (length,) or not np.issubdtype(values.dtype, np.integer):
        raise PassError(f"noise must be {length} integers, got shape {values.shape} of {values.dtype}")
    return values.astype(np.int64).view(np.uint64)


def _signed_mask(pair_seed: bytes, own: int, peer: int, length: int) -> npt.NDArray[np.uint64]:
    """``eps_{own,peer} * PRG(pair_seed)``: the pair's mask as ``own`` adds it."""
    mask = expand_seed(pair_seed, length)
    return mask if own < peer else (np.uint64(0) - mask)


# ----------------------------------------------------------------------------
# Messages
# ----------------------------------------------------------------------------
_CHECKS = {
    "bytes": lambda v: isinstance(v, bytes),
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "list[int]": lambda v: isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v),
    "list[bytes]": lambda v: isinstance(v, list) and all(isinstance(x, bytes) for x in v),
}


class _Record:
    """Dataclass mixin: ``to_record()`` / ``from_record()`` over ConfigRecord-compatible types."""

    def to_record(self) -> dict[str, Any]:
        """The message as a plain dict (bytes, int and lists of them)."""
        fields = dataclasses.fields(self)  # type: ignore[arg-type]
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), list) else v) for f in fields}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Self:
        """Parse and type-check a dict made by :meth:`to_record`; ``PassError`` if malformed."""
        values = {}
        for field in dataclasses.fields(cls):  # type: ignore[arg-type]
            if field.name not in record:
                raise PassError(f"{cls.__name__} lacks field {field.name!r}")
            value = record[field.name]
            value = list(value) if isinstance(value, tuple) else value
            if not _CHECKS[str(field.type)](value):
                raise PassError(f"{cls.__name__}.{field.name} must be {field.type}")
            values[field.name] = value
        return cls(**values)

    @classmethod
    def coerce(cls, value: Self | Mapping[str, Any]) -> Self:
        """Accept the message itself or its record; ``PassError`` for anything else."""
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise PassError(f"expected a {cls.__name__} or its record, got {type(value).__name__}")
        return cls.from_record(value)


@dataclass(frozen=True)
class AdvertiseRequest(_Record):
    """Round 1, server -> client ``index``."""

    session: bytes
    index: int
    node_id: int
    num_classes: int
    count_bound: int
    graph_commitment: bytes
    roster: bytes


@dataclass(frozen=True)
class Advertisement(_Record):
    """Round 1, client -> server: two X25519 public keys, an Ed25519 signature (``b""`` if unsigned), and a
    proof that the advertiser knows the cipher key's private key
    (:func:`~flmarket_flwr.pass_protocol.dleq.prove_possession` under :func:`possession_context`)."""

    cipher_public_key: bytes
    mask_public_key: bytes
    signature: bytes
    cipher_key_proof: bytes


@dataclass(frozen=True)
class ShareKeysRequest(_Record):
    """Round 2, server -> client: the opened seed, all participants U1 (bitmap), the degree, the neighbours' adverts.

    ``cipher_key_proofs[i]`` is neighbour ``i``'s proof of possession of its cipher key: the client checks it
    only if it comes to accuse that neighbour (:meth:`PassClient.mask_input`); the server checked every one.
    """

    server_seed: bytes
    participants: bytes
    degree: int
    neighbours: list[int]
    neighbour_node_ids: list[int]
    cipher_public_keys: list[bytes]
    mask_public_keys: list[bytes]
    signatures: list[bytes]
    cipher_key_proofs: list[bytes]


@dataclass(frozen=True)
class ShareKeysReply(_Record):
    """Round 2, client -> server: one encrypted share pair per neighbour, and a digest of each pair.

    ``share_digests[i]`` is :func:`share_digest` of the mask-key share (its point ``sigma B``) then of the
    self-mask-seed share (a SHA-256 digest) sent to ``receivers[i]`` (64 bytes): the receiver checks its shares
    against it, the server checks the one share the receiver returns at unmask, so a corrupted unmask share
    names its sender, and the server checks a dropped dealer's points against its advertised mask key.
    With an identity key, ``signatures[i]`` signs ``ciphertexts[i]`` and ``share_digests[i]``
    (:func:`~flmarket_flwr.pass_protocol.identity.sign_share_ciphertext`); without one it is empty.
    ``threshold`` is the Shamir threshold of the dealer's own two secrets (its split tolerance may raise it
    above the session's, :func:`~flmarket_flwr.pass_protocol.graph.secret_threshold`): the server rebuilds
    them from that many shares, and fewer than that many never give them. The server refuses one above
    :func:`~flmarket_flwr.pass_protocol.graph.max_secret_threshold` (``k - 1``): one receiver's loss must
    leave the dealer's secrets recoverable.
    """

    receivers: list[int]
    ciphertexts: list[bytes]
    share_digests: list[bytes]
    threshold: int
    signatures: list[bytes] = dataclasses.field(default_factory=list)


@dataclass(frozen=True)
class MaskRequest(_Record):
    """Round 3, server -> client: the ciphertexts addressed to it by the neighbours in U2, digests and signatures."""

    senders: list[int]
    ciphertexts: list[bytes]
    share_digests: list[bytes] = dataclasses.field(default_factory=list)
    signatures: list[bytes] = dataclasses.field(default_factory=list)


@dataclass(frozen=True)
class MaskedInput(_Record):
    """Round 3, client -> server: ``Y_e`` as little-endian uint64 words, the counts commitment, and accusations.

    ``accused`` (ascending) are the senders whose shares did not open at this client, which masked without
    them; ``proofs[i]`` is its proof of the channel secret with ``accused[i]`` (the secret is read from it,
    :func:`~flmarket_flwr.pass_protocol.dleq.prove_exchange`), or ``b""`` when the ciphertext's own
    signature failed (the server's copy then decides, and no secret is revealed to a server that may have
    forged it) or the accused's cipher key came without a valid proof of possession (an honest server relays
    only keys whose proofs it checked). Empty ``masked_counts`` and ``counts_commitment`` with accusations: the
    client withdraws (fewer than ``t`` senders' shares opened) and is treated as dropped.
    """

    masked_counts: bytes
    counts_commitment: bytes
    accused: list[int] = dataclasses.field(default_factory=list)
    proofs: list[bytes] = dataclasses.field(default_factory=list)


@dataclass(frozen=True)
class ConsistencyRequest(_Record):
    """Consistency round (with identity keys), server -> survivor: the survivor set U3 and dropped D, as bitmaps."""

    survivors: bytes
    dropped: bytes


@dataclass(frozen=True)
class ConsistencyReply(_Record):
    """Consistency round, survivor -> server: its Ed25519 signature on the set it was shown."""

    signature: bytes


@dataclass(frozen=True)
class UnmaskRequest(_Record):
    """Round 4, server -> client: survivors U3 (sent Y) and dropped D = U2 \\ U3, as roster bitmaps.

    After a consistency round it also carries the signatures of the client's neighbours on that same set
    (``signers`` ascending, one signature each); without one both lists are empty.
    """

    survivors: bytes
    dropped: bytes
    signers: list[int] = dataclasses.field(default_factory=list)
    signatures: list[bytes] = dataclasses.field(default_factory=list)

    @classmethod
    def of(
        cls,
        survivors: Iterable[int],
        dropped: Iterable[int],
        signers: Iterable[int] = (),
        signatures: Iterable[bytes] = (),
    ) -> UnmaskRequest:
        """The request for these index sets (and the neighbours' signatures on them, if any)."""
        return cls(indices_to_bitmap(survivors), indices_to_bitmap(dropped), list(signers), list(signatures))


@dataclass(frozen=True)
class UnmaskReply(_Record):
    """Round 4, client -> server: self-mask-seed shares of surviving neighbours, mask-key shares of dropped ones."""

    survivor_indices: list[int]
    survivor_shares: list[bytes]
    dropped_indices: list[int]
    dropped_shares: list[bytes]


# ----------------------------------------------------------------------------
# Client
# ----------------------------------------------------------------------------
_STAGE_NEW, _STAGE_ADVERTISED, _STAGE_SHARED, _STAGE_MASKED, _STAGE_UNMASKED, _STAGE_WITHDRAWN = range(6)


class PassClient:
    """One client's side of PASS v2; all state (keys included) lives in a record, see :meth:`to_record`.

    Parameters
    ----------
    record : mapping, optional
        A state from :meth:`to_record` (a fresh client if omitted).

    Rounds
    ------
    Rounds (:class:`PassClient` / :class:`PassServer`; every message and the client state are
    ``ConfigRecord``-compatible records):

    1. advertise: the server assigns each client an index, a session id, ``C``, a declared count bound,
       its commitment to the graph seed and a roster fingerprint; each client makes an X25519 cipher key
       pair and mask key pair and returns the public keys (signed with its Ed25519 identity key if it has
       one, bound to its own run id, the session and the roster, :mod:`.identity`);
    2. share keys: the server opens the graph seed; each client checks its neighbourhood in the graph
       (:mod:`.graph`), Shamir-shares (:mod:`.shamir`, as scalars mod ``l``) its mask private key ``s_e`` and
       a fresh self-mask seed ``b_e`` among its ``k`` neighbours (threshold ``t = k // 2 + 1``, at most
       ``k - 1``), encrypted to each, with a digest of each share (:func:`share_digest`; for the mask key its
       point ``sigma B``, which makes the dealing verifiable against the advertised key) that the receiver
       checks and the server keeps, so that a corrupted unmask share names the client that returned it and a
       mis-dealt mask key names its dealer before anyone unmasks; each ciphertext is encrypted under the
       edge's channel secret, ``X25519`` of the two cipher keys (and signed with the identity key, if any);
    3. masked input: ``Y_e = N_e + PRG(b_e) + sum_v eps_{e,v} PRG(s_{e,v})`` over its neighbours that
       shared, and a commitment to ``N_e``; the private keys are then wiped; a neighbour whose shares do not
       open is accused (masked without), with the channel secret and a proof of it (:mod:`.dleq`), and the
       server opens the ciphertext itself and names whichever of the two lied, with no extra round;
    4. consistency (only with identity keys): each survivor signs the survivor set it is shown, once;
    5. unmask: each survivor sends shares of ``b`` for surviving neighbours and of ``s`` for dropped ones,
       never both for one peer (with identity keys: only for the set it signed, on ``t`` valid signatures of
       its neighbours on that set); the server removes every mask and obtains ``N_s`` over the survivors.

    Arithmetic is in the ring ``Z_2^64`` (numpy ``uint64``, wrapping), where a mask that is uniform (given
    the PRG) hides a count completely and the sum is exact; counts are integers in ``[0, count_bound]``
    with ``count_bound * E < 2^63`` (:mod:`.primitives`: X25519, HKDF-SHA256 seeds bound to the session and
    the pair, ChaCha20 PRG).
    """

    def __init__(self, record: Mapping[str, Any] | None = None) -> None:
        self._state: dict[str, Any] = {
            k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in (record or {}).items()
        }
        self._state.setdefault("stage", _STAGE_NEW)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> PassClient:
        """Restore a client from :meth:`to_record` (a fresh process between rounds)."""
        return cls(record)

    def to_record(self) -> dict[str, Any]:
        """State as ``str -> bytes | int | bool | list[int] | list[bytes]``; holds private keys until wiped."""
        return {k: (list(v) if isinstance(v, list) else v) for k, v in self._state.items()}

    @property
    def transcript(self) -> bytes | None:
        """``survivor_transcript`` of the sum this client contributed to (after unmask)."""
        return self._state.get("transcript")

    @property
    def survivor_count(self) -> int | None:
        """``|U3|`` (after unmask)."""
        return self._state.get("survivor_count")

    @property
    def participant_count(self) -> int:
        """``|U1|``, the roster this client was shown at share keys; :class:`PassError` before :meth:`share_keys`."""
        participants = self._state.get("participants")
        if participants is None:
            raise PassError("no roster yet: share_keys has not run")
        return int(_bitmap_bits(participants).sum())

    @property
    def counts_nonce(self) -> bytes | None:
        """Nonce of the counts commitment (kept private; revealed only for an audit)."""
        return self._state.get("nonce")

    def _require(self, stage: int, step: str) -> None:
        if self._state["stage"] != stage:
            raise PassError(f"{step} is not allowed now (protocol stage {self._state['stage']}, need {stage})")

    # Round 1 -----------------------------------------------------------------
    def advertise(
        self,
        request: AdvertiseRequest | Mapping[str, Any],
        counts: npt.ArrayLike,
        *,
        identity_key: Ed25519PrivateKey | None = None,
        security_bits: int = DEFAULT_SECURITY_BITS,
        bad_fraction: float = DEFAULT_BAD_FRACTION,
        min_participants: int = MIN_PARTICIPANTS,
        run_id: int = 0,
        complete_graph: bool = False,
        split_tolerance: int = 0,
    ) -> Advertisement:
        """Make the session's cipher and mask key pairs and return the public keys (signed if ``identity_key``).

        ``security_bits`` / ``bad_fraction`` are this client's own floor on the graph degree, and
        ``min_participants`` its floor on ``|U1|`` (from its config, not from the server): it later refuses a
        sparser graph than :func:`neighbourhood_size` gives, or a roster smaller than that floor (a malicious
        server could otherwise show a victim a roster of colluders only). ``run_id`` is the run this client
        is in, from its own runtime (Flower's ``context.run_id``), never from the server: the signature binds
        it with the session and the announced roster fingerprint. With ``complete_graph`` the client later
        refuses any graph but the complete one (``k = |U1| - 1``): the server assigns the indices, so on a
        sparse graph it can seat this client among ``t`` colluders; on the complete graph every participant
        is its neighbour, and its secrets need ``t`` colluders of all of them (at ``O(|U1|)`` work).
        ``split_tolerance`` is how many colluding neighbours its own secrets must withstand when a server
        splits the consistency round (:func:`~flmarket_flwr.pass_protocol.graph.secret_threshold`); it raises
        their Shamir threshold, and the client refuses a graph too sparse for it.
        """
        request = AdvertiseRequest.coerce(request)
        if self._state["stage"] != _STAGE_NEW:
            raise PassError(
                f"this client already advertised (session {self._state.get('session', b'').hex()[:16]}): "
                "one PASS session per run"
            )
        if not request.session or not 1 <= request.count_bound or request.num_classes < 1:
            raise PassError("advertise request needs a session, num_classes >= 1 and count_bound >= 1")
        if len(request.graph_commitment) != 32 or not 0 < request.index <= MAX_PARTICIPANTS:
            raise PassError(
                f"advertise request needs a 32-byte graph commitment and an index in [1, {MAX_PARTICIPANTS}]"
            )
        if not is_integer(split_tolerance) or split_tolerance < 0:
            raise PassError(f"split_tolerance must be an integer >= 0, got {split_tolerance!r}")
        if not is_integer(min_participants):
            raise PassError(f"min_participants must be an integer, got {min_participants!r}")
        if len(request.roster) != ROSTER_LENGTH or not 0 <= run_id < 2**64:
            raise PassError(f"advertise request needs a {ROSTER_LENGTH}-byte roster fingerprint (and a valid run id)")
        values = validate_counts(counts)
        if values.shape != (request.num_classes,):
            raise PassError(f"counts have {values.size} classes, the session has {request.num_classes}")
        if int(values.max()) > request.count_bound:
            raise PassError(f"a class count {int(values.max())} exceeds the declared count_bound {request.count_bound}")
        cipher_key, mask_key = X25519PrivateKey.generate(), X25519PrivateKey.generate()
        cipher_public = cipher_key.public_key().public_bytes_raw()
        mask_public = mask_key.public_key().public_bytes_raw()
        possession = prove_possession(
            cipher_key.private_bytes_raw(),
            cipher_public,
            possession_context(run_id, request.session, request.index),
        )
        signature = b""
        if identity_key is not None:
            signature = sign_advertisement(
                identity_key,
                request.session,
                request.index,
                request.node_id,
                cipher_public,
                mask_public,
                run_id=run_id,
                roster=request.roster,
            )
        self._state.update(
            stage=_STAGE_ADVERTISED,
            session=request.session,
            index=request.index,
            node_id=request.node_id,
            num_classes=request.num_classes,
            count_bound=request.count_bound,
            graph_commitment=request.graph_commitment,
            run_id=int(run_id),
            roster=request.roster,
            counts=values.astype("<u8").tobytes(),
            cipher_private_key=cipher_key.private_bytes_raw(),
            mask_private_key=mask_key.private_bytes_raw(),
            cipher_public_key=cipher_public,
            mask_public_key=mask_public,
            min_security_bits=int(security_bits),
            max_bad_fraction_ppm=round(bad_fraction * 1_000_000),
            min_participants=max(int(min_participants), MIN_PARTICIPANTS),
            complete_graph=bool(complete_graph),
            split_tolerance=int(split_tolerance),
        )
        return Advertisement(cipher_public, mask_public, signature, possession)

    # Round 2 -----------------------------------------------------------------
    def share_keys(
        self,
        request: ShareKeysRequest | Mapping[str, Any],
        directory: IdentityDirectory | None = None,
        identity_key: Ed25519PrivateKey | None = None,
    ) -> ShareKeysReply:
        """Check the graph and the neighbours' keys, then send each neighbour its encrypted shares of ``s_e, b_e``.

        With ``directory`` every neighbour's advertisement must carry a valid signature for its node id, this
        run, this session and the roster this client was shown; the client then also requires the consistency
        round before it unmasks (:meth:`sign_survivors`, :meth:`unmask`). Each share pair is encrypted under
        the edge's channel secret (``X25519`` of the two cipher keys, one exchange per neighbour, kept until
        :meth:`mask_input` opens the neighbour's pair with it), and signed with ``identity_key`` if given.
        """
        request = ShareKeysRequest.coerce(request)
        self._require(_STAGE_ADVERTISED, "share_keys")
        state = self._state
        session, index = state["session"], state["index"]
        if commit_graph_seed(request.server_seed) != state["graph_commitment"]:
            raise PassError("the server seed does not match the graph commitment")
        participants = _bitmap_array(request.participants)
        if not _in_bitmap(request.participants, index):
            raise PassError("the participants do not include this client")
        if len(participants) < state["min_participants"]:
            raise PassError(
                f"this client needs at least {state['min_participants']} participants, got {len(participants)}"
            )
        k = request.degree
        try:
            check_degree(k, len(participants))
        except ValueError as error:
            raise PassError(str(error)) from error
        floor = neighbourhood_size(
            len(participants),
            security_bits=state["min_security_bits"],
            bad_fraction=state["max_bad_fraction_ppm"] / 1_000_000,
        )
        if k < floor:
            raise PassError(f"degree {k} is below this client's floor {floor} for {len(participants)} participants")
        if state.get("complete_graph") and k != len(participants) - 1:
            raise PassError(
                f"this client takes part only on the complete graph (degree {len(participants) - 1}), got {k}"
            )
        seed = derive_graph_seed(request.server_seed, roster_digest(session, participants))
        neighbours = list(neighbours_of(seed, participants, k, index))
        columns = (
            request.neighbour_node_ids,
            request.cipher_public_keys,
            request.mask_public_keys,
            request.signatures,
            request.cipher_key_proofs,
        )
        if request.neighbours != neighbours or any(len(column) != k for column in columns):
            raise PassError("the neighbours sent are not this client's neighbourhood in the committed graph")
        try:
            threshold = secret_threshold(k, state.get("split_tolerance", 0))
        except ValueError as error:
            raise PassError(str(error)) from error
        pair_seeds, channel_secrets = self._check_neighbour_keys(request, directory)
        self_seed = scalar_to_bytes(random_scalar())
        key = int.from_bytes(mask_scalar(state["mask_private_key"]), "little")
        rows = split_scalars([key, int.from_bytes(self_seed, "little")], neighbours, threshold)
        ciphertexts, digests, signatures = [], [], []
        for v, secret, (key_share, seed_share) in zip(neighbours, channel_secrets, rows, strict=True):
            both = scalar_to_bytes(key_share) + scalar_to_bytes(seed_share)
            ciphertexts.append(_seal(secret, session, index, v, both))
            digests.append(_pair_digest(session, index, v, both))
            if identity_key is not None:
                signatures.append(
                    sign_share_ciphertext(
                        identity_key,
                        index,
                        v,
                        ciphertexts[-1],
                        digests[-1],
                        run_id=state["run_id"],
                        session=session,
                        roster=state["roster"],
                    )
                )
        state.update(
            stage=_STAGE_SHARED,
            self_seed=self_seed,
            degree=k,
            participants=request.participants,
            neighbours=neighbours,
            pair_seeds=pair_seeds,
            channel_secrets=channel_secrets,
            neighbour_cipher_keys=list(request.cipher_public_keys),
            neighbour_cipher_proofs=list(request.cipher_key_proofs),
        )
        if directory is not None:  # the neighbours' identity keys, for the consistency round
            state["identity_keys"] = [directory.key_of(node) for node in request.neighbour_node_ids]
        return ShareKeysReply(
            receivers=neighbours,
            ciphertexts=ciphertexts,
            share_digests=digests,
            threshold=threshold,
            signatures=signatures,
        )

    def _check_neighbour_keys(
        self, request: ShareKeysRequest, directory: IdentityDirectory | None
    ) -> tuple[list[bytes], list[bytes]]:
        """Keys valid and pairwise distinct (own keys included); signatures valid when a directory is given.

        Each key is validated by the one exchange this client makes with it (a low-order point gives the
        all-zero secret, which the exchange refuses). Returns each neighbour's pairwise mask seed and the
        edge's channel secret: two X25519 exchanges per neighbour, the whole of this client's key agreement.
        """
        state = self._state
        mask_key = X25519PrivateKey.from_private_bytes(state["mask_private_key"])
        cipher_key = X25519PrivateKey.from_private_bytes(state["cipher_private_key"])
        pair_seeds, channel_secrets = [], []
        session, index = state["session"], state["index"]
        seen = {montgomery_u(state["cipher_public_key"]), montgomery_u(state["mask_public_key"])}
        for v, node_id, cipher_public, mask_public, signature in zip(
            request.neighbours,
            request.neighbour_node_ids,
            request.cipher_public_keys,
            request.mask_public_keys,
            request.signatures,
            strict=True,
        ):
            try:
                validate_public_key_bytes(cipher_public, v)
                validate_public_key_bytes(mask_public, v)
                channel_secrets.append(exchange_shared_secret(cipher_key, parse_public_key(cipher_public, v), v))
                mask_secret = exchange_shared_secret(mask_key, parse_public_key(mask_public, v), v)
                pair_seeds.append(derive_pair_seed(mask_secret, session, index, v))
                if directory is not None:
                    if node_id == state["node_id"]:
                        raise ValueError(f"neighbour {v} claims this client's node id {node_id}")
                    verify_advertisement(
                        directory.key_of(node_id),
                        signature,
                        session,
                        v,
                        node_id,
                        cipher_public,
                        mask_public,
                        run_id=state["run_id"],
                        roster=state["roster"],
                    )
            except (TypeError, ValueError) as error:
                raise PassError(f"neighbour {v} refused: {error}") from error
            keys = {montgomery_u(cipher_public), montgomery_u(mask_public)}
            if len(keys) != 2 or keys & seen:
                raise PassError(f"neighbour {v} reuses a public key already in this session")
            seen |= keys
        if directory is not None and len(set(request.neighbour_node_ids)) != len(request.neighbour_node_ids):
            raise PassError("two neighbours claim one node id")
        return pair_seeds, channel_secrets

    # Round 3 -----------------------------------------------------------------
    def mask_input(
        self,
        request: MaskRequest | Mapping[str, Any],
        noise: npt.ArrayLike | None = None,
    ) -> MaskedInput:
        """Open the shares held for neighbours in U2 and return ``Y_e``, the counts commitment and any accusations.

        A neighbour whose shares do not open (:func:`_unseal`) is accused, not fatal: this client masks without
        it and holds nothing for it, and sends the edge's channel secret with a proof that it is the one
        behind the two advertised cipher keys (:func:`~flmarket_flwr.pass_protocol.dleq.prove_exchange`), so
        the server opens the ciphertext it relayed exactly as this client did and names whoever lied. The
        secret opens that edge's two share pairs, both of which the accused holds anyway. With identity keys a
        ciphertext must carry its sender's signature, checked only for one that does not open (a ciphertext
        that opens under the edge's secret and matches its digest came from the sender: the server knows
        neither key); an unsigned one is accused without a secret (the server's own copy decides), so a server
        that forges a ciphertext learns nothing from the accusation.
        Afterwards the client's own private keys, self-mask seed and channel secrets are wiped from the state.

        When fewer than ``t`` senders' shares open because some were accused, the client withdraws instead of
        masking with too few neighbours: it sends its accusations alone (empty ``masked_counts`` and
        ``counts_commitment``), so that ``k - t + 1`` colluders who garble their shares to one client get
        themselves named rather than it silently refused; the server treats it as dropped. With fewer than
        ``t`` and no one to accuse it raises :class:`PassError`.

        ``noise`` (signed integers, one per class; :mod:`~flmarket_flwr.pass_protocol.noise`) is added to the
        counts inside ``Y_e`` (mod 2^64) and kept nowhere; the counts commitment binds the exact counts.
        """
        request = MaskRequest.coerce(request)
        self._require(_STAGE_SHARED, "mask_input")
        state = self._state
        session, index, neighbours = state["session"], state["index"], state["neighbours"]
        senders = request.senders
        threshold = share_threshold(state["degree"])
        signed = "identity_keys" in state
        if (
            not _strictly_increasing(senders)
            or not set(senders) <= set(neighbours)
            or len(senders) != len(request.ciphertexts)
            or len(senders) != len(request.share_digests)
            or len(request.signatures) != (len(senders) if signed else len(request.signatures))
        ):
            raise PassError("the senders must be distinct neighbours of this client, one ciphertext and digest each")
        position = {v: i for i, v in enumerate(neighbours)}
        held, held_from, accused, proofs = [], [], [], []
        for i, (v, ciphertext) in enumerate(zip(senders, request.ciphertexts, strict=True)):
            digest = request.share_digests[i]
            both = _unseal(state["channel_secrets"][position[v]], ciphertext, session, v, index, digest)
            if both is None:  # the sender's signature matters only now: an accusation reveals the edge's secret
                accused.append(v)
                forged = signed and not self._signed_by(v, request.signatures[i], ciphertext, digest)
                proofs.append(b"" if forged else self._prove_channel(v))
                continue
            held.append(both)
            held_from.append(v)
        if len(held_from) < threshold:
            if not accused:  # too few senders, and none to blame: the server knows who sent nothing
                raise PassError(f"only {len(held_from)} neighbours' shares opened here, the threshold is {threshold}")
            self._wipe_secrets()  # withdraw, naming who made it: no masked input, accusations only
            state.update(stage=_STAGE_WITHDRAWN, accused=accused)
            return MaskedInput(b"", b"", accused, proofs)
        num_classes = state["num_classes"]
        counts = np.frombuffer(state["counts"], dtype="<u8").astype(np.uint64)
        masked = counts + expand_seed(state["self_seed"], num_classes)
        if noise is not None:  # distributed DP: signed noise wraps mod 2^64 and is decoded signed by the server
            masked += _noise_words(noise, num_classes)
        for v in held_from:
            masked += _signed_mask(state["pair_seeds"][position[v]], index, v, num_classes)
        nonce = os.urandom(32)
        commitment = counts_commitment(session, index, counts, nonce)
        self._wipe_secrets()
        state.update(
            stage=_STAGE_MASKED,
            nonce=nonce,
            commitment=commitment,
            held_from=held_from,
            held_shares=held,
        )
        if accused:  # a ConfigRecord list must not be empty
            state["accused"] = accused
        return MaskedInput(masked.astype("<u8").tobytes(), commitment, accused, proofs)

    def _wipe_secrets(self) -> None:
        """Delete the private keys, the self-mask seed and every edge's secrets: nothing of them is needed now."""
        for secret_name in (
            "cipher_private_key",
            "mask_private_key",
            "self_seed",
            "pair_seeds",
            "channel_secrets",
            "neighbour_cipher_keys",
            "neighbour_cipher_proofs",
        ):
            del self._state[secret_name]

    def _signed_by(self, sender: int, signature: bytes, ciphertext: bytes, digest: bytes) -> bool:
        """Whether ``sender``'s identity key signed this ciphertext and digest (run, session, roster bound)."""
        state = self._state
        try:
            verify_share_ciphertext(
                state["identity_keys"][state["neighbours"].index(sender)],
                signature,
                sender,
                state["index"],
                ciphertext,
                digest,
                run_id=state["run_id"],
                session=state["session"],
                roster=state["roster"],
            )
        except ValueError:
            return False
        return True

    def _prove_channel(self, accused: int) -> bytes:
        """The channel secret with ``accused`` and its proof, bound to this run, roster, session and edge.

        ``b""`` (nothing revealed) unless the accused's cipher key came with a valid proof of possession: a
        key made as a multiple of another client's key would otherwise turn the secret proven here into the
        secret of another edge. The server checked every advertised proof, so an honest relay never gets here
        with a bad one; a server that relays one is the party deviating.
        """
        state = self._state
        run_id, roster, session = state["run_id"], state["roster"], state["session"]
        position = state["neighbours"].index(accused)
        peer_key = state["neighbour_cipher_keys"][position]
        possession = state["neighbour_cipher_proofs"][position]
        if not verify_possession(peer_key, possession, possession_context(run_id, session, accused)):
            return b""
        context = accusation_context(run_id, roster, session, state["index"], accused)
        return prove_exchange(state["cipher_private_key"], state["cipher_public_key"], peer_key, context)

    # Consistency round (with identity keys) ------------------------------------
    def sign_survivors(
        self, request: ConsistencyRequest | Mapping[str, Any], identity_key: Ed25519PrivateKey | None
    ) -> ConsistencyReply:
        """Sign the survivor set the server shows, once, after the same checks as :meth:`unmask`.

        The signature binds the run, the session, the roster fingerprint, ``U1`` and the set; the client
        keeps the set and later unmasks only for exactly that set (Bonawitz et al. 2017's consistency check).
        """
        request = ConsistencyRequest.coerce(request)
        self._require(_STAGE_MASKED, "sign_survivors")
        state = self._state
        if state.get("view_requested") or state.get("unmask_requested"):
            raise PassError("this client already signed a survivor set in this session")
        state["view_requested"] = True
        if identity_key is None:
            raise PassError("this client has no identity key to sign a survivor set with")
        self._check_view(request.survivors, request.dropped)
        signature = sign_survivor_set(
            identity_key,
            request.survivors,
            request.dropped,
            run_id=state["run_id"],
            session=state["session"],
            roster=state["roster"],
            participants=state["participants"],
        )
        state.update(signed_survivors=request.survivors, signed_dropped=request.dropped)
        return ConsistencyReply(signature)

    def _check_view(self, survivors_bitmap: bytes, dropped_bitmap: bytes) -> npt.NDArray[np.bool_]:
        """``PassError`` unless the survivor/dropped split is one this client can answer; return the survivor bits.

        Vectorised over the roster bitmaps (``E / 8`` bytes each): no Python work per participant, only per
        neighbour. ``bits[i - 1]`` is True for a survivor ``i``.
        """
        state = self._state
        size = 8 * max(len(survivors_bitmap), len(dropped_bitmap), len(state["participants"]))
        survivors = _bitmap_bits(survivors_bitmap, size)
        dropped = _bitmap_bits(dropped_bitmap, size)
        participants = _bitmap_bits(state["participants"], size)
        for name, group in (("survivors", survivors), ("dropped", dropped)):
            if bool((group & ~participants).any()):
                raise PassError(f"{name} must be participants")
        if bool((survivors & dropped).any()):
            raise PassError("a client cannot be both a survivor and dropped")
        if not survivors[state["index"] - 1]:
            raise PassError("this client sent its masked input but is not listed as a survivor")
        count = int(np.count_nonzero(survivors))
        if count < MIN_PARTICIPANTS:
            raise PassError(f"only {count} survivors, PASS needs {MIN_PARTICIPANTS}")
        neighbours = np.asarray(state["neighbours"], dtype=np.int64) - 1
        alive, gone = survivors[neighbours], dropped[neighbours]
        accused = set(state.get("accused", []))
        answered = {int(v) + 1 for v in neighbours[alive | gone]}
        if answered != set(state["held_from"]) | accused:
            raise PassError("survivors and dropped do not match the neighbours that completed key sharing")
        if any(survivors[v - 1] for v in accused):
            raise PassError("a neighbour whose shares did not open here cannot be a survivor (no mask with it)")
        threshold = share_threshold(state["degree"])
        if int(np.count_nonzero(alive)) < threshold:
            raise PassError(f"only {int(np.count_nonzero(alive))} neighbours survived, the threshold is {threshold}")
        return survivors

    def _check_consistency(self, request: UnmaskRequest, survivors: npt.NDArray[np.bool_]) -> None:
        """With identity keys: the set is the one this client signed, and ``t`` neighbours signed it too.

        The signatures are checked in the order sent until ``t`` are valid: an invalid one is skipped (a
        colluder's, or the server's), never counted, and named if the client ends short of ``t``.
        """
        state = self._state
        if state.get("signed_survivors") is None:
            raise PassError("this client unmasks only after signing the survivor set (consistency round)")
        if (request.survivors, request.dropped) != (state["signed_survivors"], state["signed_dropped"]):
            raise PassError("the survivor set differs from the one this client signed: two views, refused")
        neighbours = state["neighbours"]
        position = {v: i for i, v in enumerate(neighbours)}
        signers = request.signers
        if (
            not _strictly_increasing(signers)
            or not set(signers) <= set(neighbours)
            or not all(survivors[v - 1] for v in signers)
            or len(signers) != len(request.signatures)
        ):
            raise PassError("the signers must be distinct surviving neighbours, one signature each")
        threshold = share_threshold(state["degree"])
        if len(signers) < threshold:
            raise PassError(f"only {len(signers)} neighbours signed this survivor set, the threshold is {threshold}")
        valid, refused = 0, []
        for v, signature in zip(signers, request.signatures, strict=True):
            if valid == threshold:  # t neighbours' word on this one set is the whole check
                break
            try:
                verify_survivor_set(
                    state["identity_keys"][position[v]],
                    signature,
                    request.survivors,
                    request.dropped,
                    run_id=state["run_id"],
                    session=state["session"],
                    roster=state["roster"],
                    participants=state["participants"],
                )
            except ValueError as error:
                refused.append(f"neighbour {v}: {error}")
                continue
            valid += 1
        if valid < threshold:
            raise PassError(
                f"only {valid} valid neighbour signatures on this survivor set, the threshold is {threshold} "
                f"({'; '.join(refused)})"
            )

    # Round 4 -----------------------------------------------------------------
    def unmask(self, request: UnmaskRequest | Mapping[str, Any]) -> UnmaskReply:
        """Answer the server's survivor/dropout split once: ``b`` shares of survivors, ``s`` shares of dropped.

        Any request after the first (answered or refused) is refused. With identity keys (a directory at
        :meth:`share_keys`) the split must be the one this client signed in the consistency round, and carry
        valid signatures on it from at least ``t`` of its neighbours.
        """
        request = UnmaskRequest.coerce(request)
        if self._state["stage"] == _STAGE_UNMASKED or self._state.get("unmask_requested"):
            raise PassError("this client already received an unmask request in this session")
        self._require(_STAGE_MASKED, "unmask")
        state = self._state
        state["unmask_requested"] = True
        survivors = self._check_view(request.survivors, request.dropped)
        if "identity_keys" in state:
            self._check_consistency(request, survivors)
        reply = UnmaskReply([], [], [], [])
        for v, both in zip(state["held_from"], state["held_shares"], strict=True):
            if survivors[v - 1]:
                reply.survivor_indices.append(v)
                reply.survivor_shares.append(both[_SHARE_BYTES:])  # share of b_v
            else:
                reply.dropped_indices.append(v)
                reply.dropped_shares.append(both[:_SHARE_BYTES])  # share of s_v
        del state["held_shares"]
        state.update(
            stage=_STAGE_UNMASKED,
            transcript=survivor_transcript(state["session"], np.flatnonzero(survivors) + 1),
            survivor_count=int(np.count_nonzero(survivors)),
        )
        return reply


# ----------------------------------------------------------------------------
# Server
# ----------------------------------------------------------------------------
class PassServer:
    """The server's side of PASS v2: builds each round's per-client requests and reconstructs ``N_s``.

    Every method takes and returns dicts keyed by PASS index (``node_of`` / ``index_of`` map to Flower node
    ids). A client whose reply is missing or invalid leaves the protocol at that round (reason in
    ``excluded``); the server never crashes on a bad reply and raises :class:`PassError` only when the
    session as a whole can no longer finish safely. Memory is ``O(E k)``: per-edge ciphertexts and shares.

    One session, driven by the glue (send each request's ``to_record()``, pass the replies back keyed by index;
    a missing reply is a dropout)::

        requests = server.advertise_requests(node_ids)           # -> client.advertise(request, counts)
        requests = server.receive_advertisements(replies)        # -> client.share_keys(request, directory)
        requests = server.receive_shares(replies)                # -> client.mask_input(request)
        requests = server.receive_masked(replies)                # -> client.unmask(request)
        server.receive_unmask(replies)

    Accusations ride in the masked inputs and are judged inside ``receive_masked`` (no extra round).

    With a ``directory`` the server runs the consistency round between the last two steps::

        requests = server.receive_masked(replies)                # -> client.sign_survivors(request, key)
        requests = server.receive_signatures(replies)            # -> client.unmask(request)
        label_counts = server.finish()

    Parameters
    ----------
    session : bytes
        Unique identifier of this PASS session (one per run).
    num_classes : int
        ``C``.
    count_bound : int
        Declared maximum count of any class at any client; the sum is refused above ``count_bound * |U3|``.
    degree : int, optional
        Graph degree ``k``; default :func:`neighbourhood_size` of ``|U1|`` (clients refuse a smaller one).
    security_bits, bad_fraction
        Parameters of :func:`neighbourhood_size` (the clients must use the same or weaker ones).
    directory : IdentityDirectory, optional
        Verify advertisement signatures (clients with a directory check them again themselves), and run the
        consistency round: survivors sign the set they were shown, and each gets its neighbours' signatures.
    server_seed : bytes, optional
        32-byte graph seed (random by default; only for tests).
    run_id : int (default: 0)
        The Flower run id, bound into every signature (the clients use their own).

    Threat model
    ------------
    docs/threat-model.md names the test behind each sentence. Semi-honest server: it learns ``N_s``
    over the survivors of the session and nothing else from it, for any dropout pattern that leaves each needed
    secret ``t`` shares; a second session in another run is a second sum, and the two difference to the counts of
    a client in one and not the other (not prevented here). Malicious server: it cannot get both secrets of one
    client from honest neighbours (each answers once, one kind per peer, and ``2t > k``), but that alone is beside
    the point, since the split-views attack needs only ONE secret per peer: the victim's self-mask seed from
    neighbours told it survived, and each of its peers' mask keys from the peers' neighbours told that peer
    dropped. Without identity keys nothing stops that attack, nor a man in the middle on keys: PASS is then secure
    against a semi-honest server only. With an :class:`~flmarket_flwr.pass_protocol.identity.IdentityDirectory`
    the adverts are signed under the run id, session and roster fingerprint (no substitution, no replay from
    another run, no second roster for a victim), and the consistency round (:meth:`PassClient.sign_survivors`)
    makes every releasing client hold ``t`` neighbour signatures on the one set it signed: on the complete graph
    with no colluder two released sets would need ``2t + 2 > E`` signers, so no split works; on sparse graphs the
    agreement is local to each neighbourhood, and a server that gives whole regions different sets is not ruled
    out by proof. Colluders sign both sets of a split: two of them open a victim's counts at the default
    threshold, unless the victim's ``split_tolerance`` raised the threshold of its own secrets
    (:func:`~flmarket_flwr.pass_protocol.graph.secret_threshold`; ``c`` colluders fail while ``2t - k > c``).
    The graph is committed before the keys exist (the server may retry graphs by excluding advertised clients,
    each retry succeeding with probability below ``2^-security_bits``), and the client's ``min_participants``
    floor bounds a roster of colluders. But the server assigns the indices: it can place ``t`` colluders
    around a chosen victim on a sparse graph (docs/threat-model.md); a client advertised with
    ``complete_graph=True`` refuses any graph but the complete one, where every participant is its neighbour,
    which helps only with a ``min_participants`` near the federation's size (the server also picks the roster).
    The server refuses (fails closed) a sum above ``count_bound * |U3|`` in any class.

    Verifiable dealing, and one client cannot stop PASS for everyone. Both secrets are shared
    as scalars mod ``l`` (the mask key as its clamped X25519 scalar), at a threshold of at most ``k - 1``
    (:func:`~flmarket_flwr.pass_protocol.graph.max_secret_threshold`), so one lost receiver never leaves a dealer's
    secrets short. Each mask-key share travels with its point ``sigma B`` (in the share digest its dealer signs):
    the receiver checks it, and before asking anyone to unmask the server checks that a dropped dealer's holders'
    points lie on one polynomial of degree < ``t`` through its advertised mask key
    (:func:`~flmarket_flwr.pass_protocol.dleq.dealing_matches`), so a dealer of anything else is named while no
    sum is released (the market then runs a fresh session without it). The self-mask seed gets no such check: it
    is only ever used inside its dealer's own masked input, which nothing binds to anything verifiable, so a
    wrong seed is the same as a wrong ``Y_e`` (input poisoning: the sum leaves its bounds and PASS fails closed
    after the unmask round; a range proof on ``Y_e`` would be needed for both).

    Blame, not abort. Each share pair travels under the edge's channel secret
    ``X25519(c_u, C_v)`` (one exchange per neighbour, a key per direction). A receiver whose shares do not open
    accuses the sender, masks without it, and sends the secret with a Chaum-Pedersen proof that it is the one
    behind the two advertised cipher keys (:mod:`~flmarket_flwr.pass_protocol.dleq`): the server opens the
    ciphertext it relayed exactly as the accuser had to, and names the sender (it does not open) or the accuser
    (it opens, or the proof fails), without trusting either and without another round. What the secret opens is
    the edge's two share pairs, which the accused holds anyway: a false accusation is worth to a server no more
    than the accuser's own collusion. Every cipher key is advertised with a proof that its maker knows the
    private key, checked by the server at advertise and by an accuser before it proves anything: without it a
    server could have a colluder advertise a multiple of a victim's key and turn each proven secret into the
    secret of that neighbour's edge with the victim. The culprit's masked input is left out (it is treated as
    dropped; an edge its accuser cut carries neither a mask nor shares). With identity keys each ciphertext is signed by
    its
    sender, and a receiver reveals a secret only for a validly signed ciphertext: a server that forges one gets
    a complaint with no secret (settled by its own copy). Without identity keys a malicious server could forge
    a ciphertext and read the secret, as it could substitute any key: semi-honest server only.

    Also (whatever the keys): a session needs at least 3 clients (with 2, each learns the other's counts); ``E -
    1`` colluders learn the last client's counts from ``N_s``; a client can commit to false counts, which nothing
    here detects; the server can always exclude clients or abort.
    """

    def __init__(
        self,
        session: bytes,
        num_classes: int,
        count_bound: int,
        *,
        degree: int | None = None,
        security_bits: int = DEFAULT_SECURITY_BITS,
        bad_fraction: float = DEFAULT_BAD_FRACTION,
        directory: IdentityDirectory | None = None,
        server_seed: bytes | None = None,
        run_id: int = 0,
    ) -> None:
        if not isinstance(session, bytes) or not session:
            raise ValueError("session must be non-empty bytes")
        if num_classes < 1 or count_bound < 1:
            raise ValueError("num_classes and count_bound must be >= 1")
        self.session, self.num_classes, self.count_bound = session, num_classes, count_bound
        self._degree_override, self._security_bits, self._bad_fraction = degree, security_bits, bad_fraction
        self.directory = directory
        self.run_id = int(run_id)
        self.roster = b""
        self._participants_bitmap = b""
        self._awaiting_signatures = False
        self._server_seed = server_seed if server_seed is not None else os.urandom(GRAPH_SEED_LENGTH)
        self.graph_commitment = commit_graph_seed(self._server_seed)
        self.node_of: dict[int, int] = {}
        self.index_of: dict[int, int] = {}
        self.excluded: dict[int, str] = {}
        self.adverts: dict[int, Advertisement] = {}
        self.graph: dict[int, tuple[int, ...]] = {}
        self.degree = 0
        self.threshold = 0
        self._thresholds: dict[int, int] = {}  # each dealer's own (its split tolerance may raise it)
        self.u2: list[int] = []
        self.survivors: list[int] = []
        self.dropped: list[int] = []
        self.commitments: dict[int, bytes] = {}
        self.transcript = b""
        self.noise_slack = 0
        """Noise allowed beyond ``[0, count_bound * |U3|]`` in a class of the sum (0: the clients add none)."""
        self._masked_sum = np.zeros(num_classes, dtype=np.uint64)
        self._b_shares: dict[int, list[tuple[int, bytes]]] = {}
        self._s_shares: dict[int, list[tuple[int, bytes]]] = {}
        self._digests: dict[tuple[int, int], bytes] = {}  # (dealer, holder) -> the dealer's share-pair digest
        self._ciphertexts: dict[tuple[int, int], tuple[bytes, bytes]] = {}  # (dealer, holder) -> (ciphertext, sig)
        self._masked: dict[int, MaskedInput] = {}
        self._accusations: dict[tuple[int, int], bytes] = {}  # (accuser, accused) -> the accuser's proof or b""
        self._culprits: set[int] = set()  # named by an accusation's judgement: their masked inputs are not used
        self._wronged: set[int] = set()  # withdrew because every sender it accused was convicted
        self._cut: set[tuple[int, int]] = set()  # (holder, dealer): no mask and no shares on that edge
        self._step = 0

    def _advance(self, step: int, name: str) -> None:
        if self._step != step:
            raise PassError(f"{name} called out of order (step {self._step}, expected {step})")
        self._step = step + 1

    def _exclude(self, index: int, reason: str) -> None:
        self.excluded.setdefault(index, reason)

    # Round 1 -----------------------------------------------------------------
    def advertise_requests(self, node_ids: Sequence[int]) -> dict[int, AdvertiseRequest]:
        """Assign indices ``1..E`` to ``node_ids`` (in the given order) and build the advertise requests."""
        self._advance(0, "advertise_requests")
        if len(set(node_ids)) != len(node_ids):
            raise ValueError("node ids must be distinct")
        if not MIN_PARTICIPANTS <= len(node_ids) <= MAX_PARTICIPANTS:
            raise PassError(f"PASS v2 needs {MIN_PARTICIPANTS} to {MAX_PARTICIPANTS} clients, got {len(node_ids)}")
        if self.count_bound * len(node_ids) >= COUNT_LIMIT:
            raise ValueError(f"count_bound * E must be < 2**63, got {self.count_bound} * {len(node_ids)}")
        self.node_of = {i + 1: int(node) for i, node in enumerate(node_ids)}
        self.index_of = {node: index for index, node in self.node_of.items()}
        self.roster = roster_fingerprint(self.run_id, self.session, list(node_ids))
        return {
            index: AdvertiseRequest(
                self.session, index, node, self.num_classes, self.count_bound, self.graph_commitment, self.roster
            )
            for index, node in self.node_of.items()
        }

    def _degree_for(self, size: int) -> int:
        if self._degree_override is None:
            return neighbourhood_size(size, security_bits=self._security_bits, bad_fraction=self._bad_fraction)
        k = min(self._degree_override, size - 1)
        return k + 1 if k < size - 1 and k % 2 else k

    def _valid_advert(self, index: int, reply: Any) -> Advertisement | None:
        try:
            advert = Advertisement.coerce(reply)
            load_public_key(advert.cipher_public_key, index)
            load_public_key(advert.mask_public_key, index)
            if self.directory is not None:
                node = self.node_of[index]
                verify_advertisement(
                    self.directory.key_of(node),
                    advert.signature,
                    self.session,
                    index,
                    node,
                    advert.cipher_public_key,
                    advert.mask_public_key,
                    run_id=self.run_id,
                    roster=self.roster,
                )
            possession = possession_context(self.run_id, self.session, index)
            if not verify_possession(advert.cipher_public_key, advert.cipher_key_proof, possession):
                raise ValueError("its cipher key comes without a valid proof of possession")
            if edwards_lift(advert.mask_public_key) is None:  # its dealing is checked against this point
                raise ValueError("its mask key is not a point of the prime-order subgroup")
        except (TypeError, ValueError) as error:
            self._exclude(index, f"advertisement refused: {error}")
            return None
        return advert

    def receive_advertisements(
        self, replies: Mapping[int, Advertisement | Mapping[str, Any]]
    ) -> dict[int, ShareKeysRequest]:
        """Validate the adverts (U1), open the graph seed, and build each client's share-keys request."""
        self._advance(1, "receive_advertisements")
        adverts = {i: a for i, r in replies.items() if i in self.node_of and (a := self._valid_advert(i, r))}
        owners: dict[int, list[int]] = {}
        for i, advert in adverts.items():
            for key in {montgomery_u(advert.cipher_public_key), montgomery_u(advert.mask_public_key)}:
                owners.setdefault(key, []).append(i)
            if montgomery_u(advert.cipher_public_key) == montgomery_u(advert.mask_public_key):
                owners.setdefault(-1, []).extend([i, i])
        for clash in (group for group in owners.values() if len(group) > 1):
            for i in clash:
                self._exclude(i, "advertisement reuses a public key")
                adverts.pop(i, None)
        for i in self.node_of:
            if i not in adverts:
                self._exclude(i, "no advertisement")
        participants = sorted(adverts)
        if len(participants) < MIN_PARTICIPANTS:
            raise PassError(f"only {len(participants)} clients advertised valid keys, PASS needs {MIN_PARTICIPANTS}")
        self.adverts = adverts
        self.degree = self._degree_for(len(participants))
        self.threshold = share_threshold(self.degree)
        seed = derive_graph_seed(self._server_seed, roster_digest(self.session, participants))
        self.graph = mask_graph(seed, participants, self.degree)
        requests, roster = {}, indices_to_bitmap(participants)
        self._participants_bitmap = roster
        for u in participants:
            neighbours = list(self.graph[u])
            requests[u] = ShareKeysRequest(
                server_seed=self._server_seed,
                participants=roster,
                degree=self.degree,
                neighbours=neighbours,
                neighbour_node_ids=[self.node_of[v] for v in neighbours],
                cipher_public_keys=[adverts[v].cipher_public_key for v in neighbours],
                mask_public_keys=[adverts[v].mask_public_key for v in neighbours],
                signatures=[adverts[v].signature for v in neighbours],
                cipher_key_proofs=[adverts[v].cipher_key_proof for v in neighbours],
            )
        return requests

    # Round 2 -----------------------------------------------------------------
    def receive_shares(self, replies: Mapping[int, ShareKeysReply | Mapping[str, Any]]) -> dict[int, MaskRequest]:
        """Keep the clients that sent one well-formed ciphertext per neighbour (U2); route the ciphertexts."""
        self._advance(2, "receive_shares")
        sent: dict[int, ShareKeysReply] = {}
        for u, reply in replies.items():
            if u not in self.graph:
                continue
            try:
                reply = ShareKeysReply.coerce(reply)
            except PassError as error:
                self._exclude(u, str(error))
                continue
            if (
                reply.receivers != list(self.graph[u])
                or len(reply.ciphertexts) != len(reply.receivers)
                or len(reply.share_digests) != len(reply.receivers)
                or any(len(c) != _CIPHERTEXT_BYTES for c in reply.ciphertexts)
                or any(len(d) != 64 for d in reply.share_digests)
                or len(reply.signatures) not in {len(reply.receivers), 0 if self.directory is None else -1}
            ):
                self._exclude(u, "share-keys reply does not hold one ciphertext and one digest per neighbour")
                continue
            if not self.threshold <= reply.threshold <= max_secret_threshold(self.degree):
                self._exclude(
                    u,
                    f"its announced threshold {reply.threshold} is outside [{self.threshold}, "
                    f"{max_secret_threshold(self.degree)}]: its secrets would not survive one receiver's loss",
                )
                continue
            sent[u] = reply
            self._thresholds[u] = reply.threshold
        for u in self.graph:
            if u not in sent:
                self._exclude(u, "no share-keys reply")
        self.u2 = sorted(sent)
        if len(self.u2) < MIN_PARTICIPANTS:
            raise PassError(f"only {len(self.u2)} clients shared their keys, PASS needs {MIN_PARTICIPANTS}")
        inbox: dict[int, MaskRequest] = {u: MaskRequest([], [], [], []) for u in self.u2}
        for u in self.u2:  # senders in increasing order, so each inbox is sorted
            signatures = sent[u].signatures or [b""] * len(sent[u].receivers)
            for v, ciphertext, digest, signature in zip(
                sent[u].receivers, sent[u].ciphertexts, sent[u].share_digests, signatures, strict=True
            ):
                if v in inbox:
                    inbox[v].senders.append(u)
                    inbox[v].ciphertexts.append(ciphertext)
                    inbox[v].share_digests.append(digest)
                    inbox[v].signatures.append(signature)  # b"" if unsigned: a client with a directory complains
                    self._digests[u, v] = digest
                    self._ciphertexts[u, v] = (ciphertext, signature)
        return inbox

    # Round 3 -----------------------------------------------------------------
    def receive_masked(
        self, replies: Mapping[int, MaskedInput | Mapping[str, Any]]
    ) -> dict[int, UnmaskRequest] | dict[int, ConsistencyRequest]:
        """Keep the masked inputs (U3), judge their accusations, and go on if every needed secret can be rebuilt.

        Returns the unmask requests, or with a directory the consistency-round requests (the survivor set
        to sign, for :meth:`receive_signatures`). Each accusation is settled here from the evidence it carries
        (:meth:`_judge`): blame costs no extra round, and the accused need not be online.
        """
        self._advance(3, "receive_masked")
        u2 = set(self.u2)
        withdrawals: list[int] = []
        for u, reply in replies.items():
            if u not in u2:
                continue
            try:
                reply = MaskedInput.coerce(reply)
            except PassError as error:
                self._exclude(u, str(error))
                continue
            withdrawn = reply.masked_counts == reply.counts_commitment == b"" and bool(reply.accused)
            if not withdrawn and (
                len(reply.masked_counts) != 8 * self.num_classes or len(reply.counts_commitment) != 32
            ):
                self._exclude(u, "masked input has the wrong size")
                continue
            senders = {v for v in self.graph[u] if (v, u) in self._ciphertexts}
            if (
                not _strictly_increasing(reply.accused)
                or not set(reply.accused) <= senders
                or len(reply.proofs) != len(reply.accused)
            ):
                self._exclude(u, "masked input accuses clients that sent it no shares")
                continue
            if withdrawn:
                withdrawals.append(u)
            else:
                self._masked[u] = reply
            for v, proof in zip(reply.accused, reply.proofs, strict=True):
                self._accusations[u, v] = proof
        for (u, v), proof in sorted(self._accusations.items()):
            self._judge(u, v, proof)
        for u in withdrawals:  # after the judging: a false accuser is named for that, not for withdrawing
            self._exclude(u, f"withdrew: fewer than {self.threshold} neighbours' shares opened at it")
            if u not in self._culprits and all(v in self._culprits for (w, v) in self._accusations if w == u):
                self._wronged.add(u)
        return self._close_inputs()

    def _judge(self, accuser: int, accused: int, proof: bytes) -> None:
        """Name whichever of ``accuser`` and ``accused`` deviated; it leaves PASS (its masked input is unused).

        In order: with a directory, a ciphertext whose sender's signature fails on the server's own copy
        names the sender (garbage shares; the accuser rightly revealed nothing). Otherwise (every advertised
        cipher key came with a valid proof of possession) the accuser must prove its channel secret with the sender
        (:func:`~flmarket_flwr.pass_protocol.dleq.verify_exchange` against both advertised cipher keys; none
        or a wrong one names the accuser), and the server opens the ciphertext it relayed with it exactly as
        the accuser had to (:func:`_unseal`): it opens, the accusation was false; it does not, the sender
        sent garbage. When the server relays faithfully, the client named is one that deviated, whatever the
        other did (a proof cannot name an honest sender: :mod:`~flmarket_flwr.pass_protocol.dleq`). A server
        that forges a ciphertext can get its honest receiver named, as it can exclude anyone anyway; with a
        directory it learns nothing by it (the receiver reveals no secret for a ciphertext not signed).
        """
        if accused in self._culprits:
            return  # already named: its masked input is out either way
        # An accuser named for another accusation is still heard: its proof is evidence whoever gives it.
        ciphertext, signature = self._ciphertexts[accused, accuser]
        digest = self._digests[accused, accuser]
        if self.directory is not None:
            try:
                verify_share_ciphertext(
                    self.directory.key_of(self.node_of[accused]),
                    signature,
                    accused,
                    accuser,
                    ciphertext,
                    digest,
                    run_id=self.run_id,
                    session=self.session,
                    roster=self.roster,
                )
            except ValueError:
                self._blame(accused, f"its share ciphertext to client {accuser} is not signed by it: garbage shares")
                return
        accused_key = self.adverts[accused].cipher_public_key  # with a proof of possession, checked at advertise
        secret = verify_exchange(
            self.adverts[accuser].cipher_public_key,
            accused_key,
            proof,
            accusation_context(self.run_id, self.roster, self.session, accuser, accused),
        )
        if secret is None:
            self._blame(accuser, f"it accused client {accused} without a valid proof of their channel secret")
        elif _unseal(secret, ciphertext, self.session, accused, accuser, digest) is not None:
            self._blame(
                accuser, f"it accused client {accused}, whose shares open under the proven secret: false accusation"
            )
        else:
            self._blame(accused, f"its shares to client {accuser} do not open under the proven secret: garbage shares")

    def _blame(self, index: int, reason: str) -> None:
        """Name ``index`` as one who deviated: it leaves PASS (its masked input is not used), and the reason
        replaces any earlier one (a convicted dealer may have been excluded as a mere dropout first)."""
        self._culprits.add(index)
        self.excluded[index] = reason

    @property
    def culprits(self) -> frozenset[int]:
        """The clients named for a deviation (garbage or mis-dealt shares, a false accusation)."""
        return frozenset(self._culprits)

    @property
    def wronged(self) -> frozenset[int]:
        """Clients that withdrew only because senders convicted of garbage shares left them short of ``t``:
        excluded from this session through no fault of their own (a fresh session may take them back)."""
        return frozenset(self._wronged)

    def _close_inputs(self) -> dict[int, UnmaskRequest] | dict[int, ConsistencyRequest]:
        """Fix U3 (masked inputs less the named culprits) and build the next round's requests."""
        masked = {u: reply for u, reply in self._masked.items() if u not in self._culprits}
        self.survivors = sorted(masked)
        self.dropped = sorted(set(self.u2) - set(masked))
        for d in self.dropped:
            self._exclude(d, "no masked input")
        # An accuser that is still in masked without its accused: that edge carries no mask and no shares.
        self._cut = {(u, v) for (u, v) in self._accusations if u in masked}
        self._check_recoverable()
        self._check_dealing()
        vectors = np.stack([np.frombuffer(masked[u].masked_counts, dtype="<u8") for u in self.survivors])
        self._masked_sum = ring_sum(vectors.astype(np.uint64))
        self.commitments = {u: masked[u].counts_commitment for u in self.survivors}
        self.transcript = survivor_transcript(self.session, self.survivors)
        request = UnmaskRequest.of(self.survivors, self.dropped)
        if self.directory is not None:
            self._awaiting_signatures = True
            view = ConsistencyRequest(request.survivors, request.dropped)
            return {u: view for u in self.survivors}
        return {u: request for u in self.survivors}

    # Consistency round -------------------------------------------------------
    def receive_signatures(
        self, replies: Mapping[int, ConsistencyReply | Mapping[str, Any]]
    ) -> dict[int, UnmaskRequest]:
        """Check each survivor's signature on the set; send each signer the valid signatures of its neighbours.

        A survivor whose signature is missing or does not verify under its directory key is excluded (it
        is not asked to unmask; its masked input stays in the sum). A signer with fewer than ``t`` signing
        neighbours will refuse to unmask; :meth:`finish` then tells whether enough shares came back.
        """
        if self._step != 4 or not self._awaiting_signatures:
            raise PassError("receive_signatures called out of order (it follows receive_masked with a directory)")
        self._awaiting_signatures = False
        directory = self.directory
        if directory is None:
            raise PassError("the consistency round needs the identity directory")
        view = UnmaskRequest.of(self.survivors, self.dropped)
        signed: dict[int, bytes] = {}
        for u in self.survivors:
            reply = replies.get(u)
            if reply is None:
                self._exclude(u, "no signature on the survivor set")
                continue
            try:
                signature = ConsistencyReply.coerce(reply).signature
                verify_survivor_set(
                    directory.key_of(self.node_of[u]),
                    signature,
                    view.survivors,
                    view.dropped,
                    run_id=self.run_id,
                    session=self.session,
                    roster=self.roster,
                    participants=self._participants_bitmap,
                )
            except ValueError as error:  # PassError is a ValueError
                self._exclude(u, f"survivor-set signature refused: {error}")
                continue
            signed[u] = signature
        if len(signed) < MIN_PARTICIPANTS:
            raise PassError(f"only {len(signed)} survivors signed the survivor set, PASS needs {MIN_PARTICIPANTS}")
        requests = {}
        for u in sorted(signed):
            signers = [v for v in self.graph[u] if v in signed]
            requests[u] = dataclasses.replace(view, signers=signers, signatures=[signed[v] for v in signers])
        return requests

    def _check_recoverable(self) -> None:
        """``PassError`` unless ``|U3| >= 3`` and each survivor and dropped client keeps ``t`` surviving neighbours."""
        if len(self.survivors) < MIN_PARTICIPANTS:
            raise PassError(f"only {len(self.survivors)} clients sent masked input, PASS needs {MIN_PARTICIPANTS}")
        alive = set(self.survivors)
        for u in self.survivors + self.dropped:
            left = len(self._holders(u, alive))
            if not left and u not in alive and any((v, u) in self._cut for v in self.graph[u]):
                continue  # every surviving neighbour accused it: none masked with it, nothing to rebuild
            if left < self._thresholds[u]:
                raise PassError(
                    f"client {u} keeps only {left} surviving neighbours, the threshold is {self._thresholds[u]}: "
                    "its secret cannot be rebuilt, the session stops before any share is requested"
                )

    def _check_dealing(self) -> None:
        """``PassError`` naming a dropped dealer whose mask-key shares do not rebuild its advertised mask key.

        Each holder checked its share against its point (:func:`_unseal`); here the points of the surviving
        holders must lie on one polynomial of degree < ``t`` through the advertised key
        (:func:`~flmarket_flwr.pass_protocol.dleq.dealing_matches`). A client that dealt shares of anything
        else and then withheld its masked input is thus named before any unmask request, when the market
        can still run a fresh session without it, rather than after everyone unmasked.
        """
        alive = set(self.survivors)
        for d in self.dropped:
            holders = self._holders(d, alive)
            points = [self._digests[d, v][:32] for v in holders]
            if holders and not dealing_matches(self.adverts[d].mask_public_key, holders, points, self._thresholds[d]):
                self._blame(d, "its mask-key shares do not rebuild its advertised mask key: mis-dealt shares")
                raise PassError(
                    f"client {d} dealt shares that do not rebuild its advertised mask key: the session stops "
                    "before any share is requested"
                )

    def _holders(self, dealer: int, alive: set[int]) -> list[int]:
        """The surviving neighbours that hold ``dealer``'s shares (and masked with it): all but its accusers."""
        return [v for v in self.graph[dealer] if v in alive and (v, dealer) not in self._cut]

    # Round 4 -----------------------------------------------------------------
    def receive_unmask(self, replies: Mapping[int, UnmaskReply | Mapping[str, Any]]) -> None:
        """Store the well-formed unmask replies (shares of ``b`` for survivors, of ``s`` for dropped clients)."""
        if self._awaiting_signatures:
            raise PassError("receive_unmask called before receive_signatures")
        self._advance(4, "receive_unmask")
        alive, gone = set(self.survivors), set(self.dropped)
        for v, reply in replies.items():
            if v not in alive:
                continue
            try:
                reply = UnmaskReply.coerce(reply)
            except PassError as error:
                self._exclude(v, str(error))
                continue
            neighbours = set(self.graph[v])
            groups = (
                (reply.survivor_indices, reply.survivor_shares, alive),
                (reply.dropped_indices, reply.dropped_shares, gone),
            )
            if any(
                len(i) != len(s)
                or len(set(i)) != len(i)
                or not set(i) <= neighbours & allowed
                or any(len(x) != _SHARE_BYTES for x in s)
                for i, s, allowed in groups
            ):
                self._exclude(v, "unmask reply names peers or shares it should not")
                continue
            forged = self._forged_share(v, reply)
            if forged is not None:
                self._exclude(v, forged)
                continue
            for u, share in zip(reply.survivor_indices, reply.survivor_shares, strict=True):
                self._b_shares.setdefault(u, []).append((v, share))
            for d, share in zip(reply.dropped_indices, reply.dropped_shares, strict=True):
                self._s_shares.setdefault(d, []).append((v, share))

    def _forged_share(self, holder: int, reply: UnmaskReply) -> str | None:
        """Evidence that ``holder`` returned a share other than the one its dealer sent it, or ``None``.

        The holder checked its shares against the dealer's digest when it masked, so a mismatch now is the
        holder's own doing; the server keeps none of its shares.
        """
        returned = (
            (reply.survivor_indices, reply.survivor_shares, b"b", slice(32, 64), "self-mask seed"),
            (reply.dropped_indices, reply.dropped_shares, b"s", slice(0, 32), "mask key"),
        )
        for dealers, shares, kind, part, what in returned:
            for dealer, share in zip(dealers, shares, strict=True):
                expected = self._digests.get((dealer, holder), b"")[part]
                if share_digest(self.session, dealer, holder, kind, share) != expected:
                    return (
                        f"its unmask share of the {what} of client {dealer} does not match the digest that "
                        f"client {dealer} sent with it (and that client {holder} accepted): corrupted share"
                    )
        return None

    def _rebuild(self, owner: int, shares: list[tuple[int, bytes]], what: str) -> bytes:
        """The secret (a scalar mod ``l``, 32 bytes) behind ``t`` of ``owner``'s shares, each checked at unmask."""
        threshold = self._thresholds[owner]
        if len(shares) < threshold:
            raise PassError(f"only {len(shares)} shares of {what} of client {owner}, the threshold is {threshold}")
        try:  # any t: each matched its dealer's digest or point (_forged_share)
            return rebuild_secret(shares[:threshold])
        except ValueError as error:
            raise PassError(f"the shares of {what} of client {owner}: {error}") from error

    def finish(self) -> npt.NDArray[np.int64]:
        """Remove every self-mask and every dropped client's pairwise masks; return ``N_s`` over U3.

        Raises
        ------
        PassError
            A needed secret has fewer than ``t`` shares or inconsistent ones, or the sum exceeds
            ``count_bound * |U3|`` in some class (a poisoned or incomplete sum is never returned); with
            :attr:`noise_slack` the sum is decoded signed (two's complement) and may leave
            ``[0, count_bound * |U3|]`` by that much.
        """
        self._advance(5, "finish")
        total = self._masked_sum.copy()
        for u in self.survivors:
            total -= expand_seed(self._rebuild(u, self._b_shares.get(u, []), "the self-mask seed"), self.num_classes)
        alive = set(self.survivors)
        for d in self.dropped:
            holders = self._holders(d, alive)
            if not holders:  # every surviving neighbour accused it: none masked with it
                continue
            scalar = self._rebuild(d, self._s_shares.get(d, []), "the mask key")
            advertised = self.adverts[d].mask_public_key
            if public_key_of_scalar(scalar) != montgomery_u(advertised).to_bytes(32, "little"):
                raise PassError(f"the rebuilt mask key of client {d} does not match its advertised key")
            for v in holders:  # v masked with +eps_{v,d} PRG; eps_{v,d} = -eps_{d,v}
                total += _scalar_pair_mask(
                    scalar, self.adverts[v].mask_public_key, self.session, d, v, self.num_classes
                )
        signed = total.view(np.int64)  # two's complement: clients' noise can take a class below zero
        bound, slack = self.count_bound * len(self.survivors), self.noise_slack
        if (signed > bound + slack).any() or (signed < -slack).any():
            raise PassError(
                f"the sum exceeds count_bound * |U3| = {bound} in some class (or leaves it, or 0, by more than "
                f"the noise slack {slack}): refused"
            )
        self._b_shares.clear()
        self._s_shares.clear()
        return signed.copy()
