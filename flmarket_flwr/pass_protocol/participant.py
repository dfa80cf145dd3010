"""Client side of PASS: one participant holding a key pair and its label counts."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import NoReturn, Union

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from flmarket_flwr.pass_protocol.primitives import (
    MIN_PARTICIPANTS,
    derive_pair_seed,
    exchange_shared_secret,
    expand_seed,
    pairwise_sign,
    parse_public_key,
    public_key_fingerprint,
    validate_counts,
    validate_index,
    validate_public_key_bytes,
    validate_session,
)

PublicKeys = Union[Mapping[int, bytes], Iterable[tuple[int, bytes]]]
"""Broadcast public keys: a mapping ``index -> key`` or ``(index, key)`` pairs."""

DEFAULT_SESSION: bytes = b"flmarket-pass/default-session"
"""Session used when none is given; real runs should pass a per-run, per-attempt id."""

_NO_COPY_MESSAGE = (
    "PassParticipant holds an X25519 private key and cannot be pickled or copied; "
    "keep the key material in the client's local state and rebuild the participant "
    "with PassParticipant(index, counts, session, private_key=...)"
)


class PassParticipant:
    """One client of a PASS round.

    The participant owns an X25519 key pair and its per-class label counts
    ``N_e``. It publishes :attr:`public_key`, and, once the server has
    broadcast every participant's public key, computes the masked vector
    ``Y_e = N_e + sum_{v > e} PRG(s_{e,v}) - sum_{v < e} PRG(s_{e,v})``
    in ``Z_{2^64}`` with :meth:`masked_counts`.

    The private key never leaves the object: there is no attribute, property
    or method returning it, its ``repr`` shows only the index and a public-key
    fingerprint, and pickling or copying raises ``TypeError``.

    Parameters
    ----------
    index : int
        Non-negative participant index assigned by the server, unique in the round.
    counts : array_like
        Per-class label counts, shape ``(C,)``, non-negative integers below
        ``2^63`` (see :func:`validate_counts`).
    session : bytes, optional
        Non-empty identifier binding the masks to one run (and attempt). All
        participants of a round must use the same value.
    private_key : X25519PrivateKey, optional
        Existing key, for rebuilding a participant from key material kept in
        the client's local state. A fresh key is generated when omitted.

    Notes
    -----
    A key pair should mask one set of participants only: if the same key and
    session were used for two different broadcast sets, the server could
    subtract the two masked vectors and strip masks. The object therefore
    refuses a second :meth:`masked_counts` call with a different key set;
    a caller that rebuilds participants across processes must use a fresh key
    (or a fresh ``session``) for every attempt.
    """

    def __init__(
        self,
        index: int,
        counts: npt.ArrayLike,
        session: bytes = DEFAULT_SESSION,
        private_key: X25519PrivateKey | None = None,
    ) -> None:
        self._index = validate_index(index)
        self._counts = validate_counts(counts)
        self._session = validate_session(session)
        if private_key is None:
            private_key = X25519PrivateKey.generate()
        elif not isinstance(private_key, X25519PrivateKey):
            raise TypeError(
                f"private_key must be an X25519PrivateKey or None, "
                f"got {type(private_key).__name__}"
            )
        self.__private_key = private_key
        self._public_key = private_key.public_key().public_bytes_raw()
        self._masked_key_set: bytes | None = None

    # ------------------------------------------------------------------
    # Public read-only state
    # ------------------------------------------------------------------
    @property
    def index(self) -> int:
        """Participant index assigned by the server."""
        return self._index

    @property
    def num_classes(self) -> int:
        """Number of classes ``C`` (length of the counts vector)."""
        return int(self._counts.shape[0])

    @property
    def session(self) -> bytes:
        """Run identifier the masks are bound to."""
        return self._session

    @property
    def public_key(self) -> bytes:
        """Raw X25519 public key, 32 bytes, to send to the server."""
        return self._public_key

    # ------------------------------------------------------------------
    # Protocol
    # ------------------------------------------------------------------
    def masked_counts(self, public_keys: PublicKeys) -> npt.NDArray[np.uint64]:
        """Compute the masked count vector ``Y_e`` for the broadcast key set.

        Parameters
        ----------
        public_keys : Mapping[int, bytes] or Iterable[tuple[int, bytes]]
            Public keys of ALL participants of the round, this one included.

        Returns
        -------
        numpy.ndarray
            ``uint64`` array of shape ``(C,)``, uniform-looking on its own.

        Raises
        ------
        TypeError
            If an index is not an int or a key is not ``bytes``.
        ValueError
            If fewer than 3 participants are listed, this participant's index
            is missing or maps to another key, an index repeats, a key repeats
            under different indices, a key is not 32 bytes or not a valid
            X25519 point, or this key pair already masked a different key set.
        """
        peers = self._validated_peers(public_keys)
        key_set = self._check_key_set(peers)
        positive = np.zeros(self.num_classes, dtype=np.uint64)
        negative = np.zeros(self.num_classes, dtype=np.uint64)
        for peer_index, peer_key in peers.items():
            mask = self._pair_mask(peer_index, peer_key)
            target = positive if pairwise_sign(self._index, peer_index) > 0 else negative
            np.add(target, mask, out=target)
        masked = self._counts + positive
        np.subtract(masked, negative, out=masked)
        self._masked_key_set = key_set
        return masked

    def _pair_mask(self, peer_index: int, peer_key: bytes) -> npt.NDArray[np.uint64]:
        """``PRG(s_{e,v})`` for the peer ``v = peer_index``."""
        public_key = parse_public_key(peer_key, peer_index)
        shared = exchange_shared_secret(self.__private_key, public_key, peer_index)
        seed = derive_pair_seed(shared, self._session, self._index, peer_index)
        return expand_seed(seed, self.num_classes)

    def _validated_peers(self, public_keys: PublicKeys) -> dict[int, bytes]:
        """Check the broadcast key set and return the other participants' keys."""
        keys = _collect_public_keys(public_keys)
        if len(keys) < MIN_PARTICIPANTS:
            raise ValueError(
                f"PASS needs at least {MIN_PARTICIPANTS} participants, got {len(keys)}: "
                f"with 2 each learns the other's counts from the sum (sum minus own "
                f"counts), with 1 the sum is the counts"
            )
        if self._index not in keys:
            raise ValueError(
                f"own index {self._index} is missing from the broadcast public keys"
            )
        if keys[self._index] != self._public_key:
            raise ValueError(
                f"the public key broadcast for own index {self._index} does not match "
                f"this participant's public key"
            )
        return {index: key for index, key in keys.items() if index != self._index}

    def _check_key_set(self, peers: Mapping[int, bytes]) -> bytes:
        """Digest of the key set; refuse a set other than one already masked."""
        digest = hashlib.sha256()
        for index in sorted(peers):
            digest.update(index.to_bytes(8, "big") + peers[index])
        key_set = digest.digest()
        if self._masked_key_set is not None and self._masked_key_set != key_set:
            raise ValueError(
                "this key pair already masked counts for a different set of "
                "participants; reusing it would let the server strip masks: "
                "re-run PASS with a fresh key pair (or a fresh session)"
            )
        return key_set

    # ------------------------------------------------------------------
    # Keep the private key inside the object
    # ------------------------------------------------------------------
    def __repr__(self) -> str:
        fingerprint = public_key_fingerprint(self._public_key)
        return f"PassParticipant(index={self._index}, public_key_fingerprint={fingerprint!r})"

    def __getstate__(self) -> NoReturn:
        raise TypeError(_NO_COPY_MESSAGE)

    def __reduce__(self) -> NoReturn:
        raise TypeError(_NO_COPY_MESSAGE)

    def __reduce_ex__(self, protocol: object) -> NoReturn:
        raise TypeError(_NO_COPY_MESSAGE)

    def __copy__(self) -> NoReturn:
        raise TypeError(_NO_COPY_MESSAGE)

    def __deepcopy__(self, memo: object) -> NoReturn:
        raise TypeError(_NO_COPY_MESSAGE)


def _collect_public_keys(public_keys: PublicKeys) -> dict[int, bytes]:
    """Normalise and validate a broadcast key set into ``{index: key}``.

    Raises
    ------
    TypeError, ValueError
        On a bad index or key, a repeated index, or a key repeated under two
        different indices.
    """
    items = public_keys.items() if isinstance(public_keys, Mapping) else public_keys
    keys: dict[int, bytes] = {}
    owner_of_key: dict[bytes, int] = {}
    for item in items:
        raw_index, raw_key = _unpack_pair(item)
        index = validate_index(raw_index, "participant index")
        key = validate_public_key_bytes(raw_key, index)
        if index in keys:
            raise ValueError(f"duplicate participant index {index} in the public keys")
        if key in owner_of_key:
            raise ValueError(
                f"duplicate public key: participants {owner_of_key[key]} and {index} "
                f"broadcast the same key"
            )
        keys[index] = key
        owner_of_key[key] = index
    return keys


def _unpack_pair(item: object) -> tuple[object, object]:
    """Split one ``(index, key)`` entry, with a clear error for malformed ones."""
    if isinstance(item, (bytes, str)) or not isinstance(item, tuple | list) or len(item) != 2:
        raise TypeError(
            f"public keys must be a mapping index -> bytes or (index, bytes) pairs, "
            f"got entry {item!r}"
        )
    return item[0], item[1]
