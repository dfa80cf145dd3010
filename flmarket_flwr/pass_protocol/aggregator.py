"""Server side of PASS: collecting keys and masked vectors, and unmasking the sum."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Union

import numpy as np
import numpy.typing as npt

from flmarket_flwr.pass_protocol.primitives import (
    COUNT_LIMIT,
    MASK_DTYPE,
    MIN_PARTICIPANTS,
    load_public_key,
    ring_sum,
    validate_index,
    validate_public_key_bytes,
)

MaskedVectors = Union[Mapping[int, np.ndarray], Sequence[np.ndarray], np.ndarray]
"""Masked vectors: ``{index: Y_e}``, a sequence of ``Y_e``, or a 2-D array of rows."""


def unmask_sum(masked: MaskedVectors) -> npt.NDArray[np.int64]:
    """Recover ``N_s = sum_e N_e`` from the masked vectors of ALL participants.

    The pairwise masks cancel only in the sum over every participant of the
    round, computed modulo ``2^64``.

    Parameters
    ----------
    masked : Mapping[int, numpy.ndarray] or Sequence[numpy.ndarray] or numpy.ndarray
        The vectors ``Y_e``: each 1-D, dtype ``uint64``, all the same length;
        or one 2-D ``uint64`` array whose rows are the vectors.

    Returns
    -------
    numpy.ndarray
        The per-class totals, dtype ``int64``, shape ``(C,)``.

    Raises
    ------
    TypeError
        If a vector is not a ``uint64`` numpy array.
    ValueError
        If there are fewer than 3 vectors, a vector is not 1-D or is empty,
        lengths differ, or a total is ``>= 2^63``.

    Notes
    -----
    Real totals are below ``2^63``, while the sum of an incomplete set of masked
    vectors is uniform in ``Z_{2^64}``: each of its ``C`` entries is ``>= 2^63``
    with probability 1/2. A total ``>= 2^63`` is therefore reported as a
    probably incomplete set. The check is probabilistic, not a guarantee: an
    incomplete set passes it with probability ``2^-C`` (1/2 for one class,
    about 1e-3 for ten). Completeness must be established by bookkeeping
    (see :class:`PassAggregator`); this check is only a safety net.
    """
    labels, vectors = _as_labelled_vectors(masked)
    if len(vectors) < MIN_PARTICIPANTS:
        raise ValueError(
            f"PASS needs the masked vectors of at least {MIN_PARTICIPANTS} "
            f"participants, got {len(vectors)}"
        )
    length = None
    for label, vector in zip(labels, vectors):
        _check_masked_vector(vector, label, length)
        length = vector.shape[0]
    total = ring_sum(np.stack(vectors))
    if (total >= np.uint64(COUNT_LIMIT)).any():
        raise ValueError(
            "unmasked total has an entry >= 2**63, which no real count reaches: the "
            "set of masked vectors is probably incomplete (a participant is missing, "
            "so the pairwise masks did not cancel)"
        )
    return total.astype(np.int64)


def _as_labelled_vectors(masked: MaskedVectors) -> tuple[list[str], list[np.ndarray]]:
    """Split the accepted input forms into (labels for errors, vectors)."""
    if isinstance(masked, Mapping):
        labels = [f"participant {validate_index(index)}" for index in masked]
        return labels, list(masked.values())
    if isinstance(masked, np.ndarray):
        if masked.ndim != 2:
            raise ValueError(
                f"an array of masked vectors must be 2-D (one row per participant), "
                f"got shape {masked.shape}"
            )
        _check_dtype(masked, "the array of masked vectors")
        return [f"row {i}" for i in range(masked.shape[0])], list(masked)
    vectors = list(masked)
    return [f"vector {i}" for i in range(len(vectors))], vectors


def _check_dtype(vector: object, label: str) -> None:
    """Raise ``TypeError`` unless ``vector`` is a ``uint64`` numpy array."""
    if not isinstance(vector, np.ndarray) or vector.dtype != MASK_DTYPE:
        dtype = getattr(vector, "dtype", type(vector).__name__)
        raise TypeError(f"masked vector of {label} must be a uint64 numpy array, got {dtype}")


def _check_masked_vector(vector: object, label: str, length: int | None) -> None:
    """Check dtype, shape and (if known) length of one masked vector."""
    _check_dtype(vector, label)
    assert isinstance(vector, np.ndarray)
    if vector.ndim != 1 or vector.size == 0:
        raise ValueError(
            f"masked vector of {label} must be a non-empty 1-D vector, "
            f"got shape {vector.shape}"
        )
    if length is not None and vector.shape[0] != length:
        raise ValueError(
            f"masked vector of {label} has length {vector.shape[0]}, expected {length}"
        )


class PassAggregator:
    """Bookkeeping for one PASS round on the server.

    Holds the expected participant indices, collects their public keys (to
    broadcast) and their masked vectors, and unmasks the sum once every
    vector has arrived. Every ``add_*`` method validates first and stores
    nothing on error.

    Parameters
    ----------
    indices : Iterable[int]
        Indices of the participants of this round: at least 3, unique.
    num_classes : int, optional
        Expected vector length ``C``. When omitted it is fixed by the first
        masked vector accepted.

    Notes
    -----
    A participant that drops out after sending its public key breaks the
    cancellation for everyone: the round cannot finish. Start a new round
    (fresh keys, fresh session) over the survivors instead.
    """

    def __init__(self, indices: Iterable[int], num_classes: int | None = None) -> None:
        self._indices = _validated_round_indices(indices)
        self._index_set = frozenset(self._indices)
        self._num_classes = None if num_classes is None else _validated_num_classes(num_classes)
        self._public_keys: dict[int, bytes] = {}
        self._masked: dict[int, npt.NDArray[np.uint64]] = {}

    @property
    def indices(self) -> tuple[int, ...]:
        """Expected participant indices, sorted."""
        return self._indices

    @property
    def num_classes(self) -> int | None:
        """Expected vector length, or ``None`` until the first masked vector."""
        return self._num_classes

    def add_public_key(self, index: int, key: bytes) -> None:
        """Record the public key of participant ``index``.

        Raises
        ------
        TypeError, ValueError
            If the index is unknown or already has a key, the key is not 32
            bytes, is not a valid X25519 point, or is already used by another
            participant.
        """
        index = self._known_index(index)
        if index in self._public_keys:
            raise ValueError(f"participant {index} already submitted a public key")
        key = validate_public_key_bytes(key, index)
        for other, other_key in self._public_keys.items():
            if other_key == key:
                raise ValueError(
                    f"duplicate public key: participant {index} sent the key of "
                    f"participant {other}"
                )
        load_public_key(key, index)
        self._public_keys[index] = key

    def add_masked(self, index: int, vector: np.ndarray) -> None:
        """Record the masked vector ``Y_e`` of participant ``index``.

        Raises
        ------
        ValueError
            If the index is unknown or already submitted, public keys are still
            missing, or the vector is not a 1-D ``uint64`` array of the
            expected length.
        """
        index = self._known_index(index)
        if index in self._masked:
            raise ValueError(f"participant {index} already submitted a masked vector")
        if self.missing_public_keys():
            raise ValueError(
                f"masked vector of participant {index} arrived before all public keys "
                f"(missing: {list(self.missing_public_keys())})"
            )
        self._masked[index] = self._validated_vector(index, vector)
        if self._num_classes is None:
            self._num_classes = int(vector.shape[0])

    def missing_public_keys(self) -> tuple[int, ...]:
        """Indices whose public key has not arrived, sorted."""
        return tuple(i for i in self._indices if i not in self._public_keys)

    def missing_masked(self) -> tuple[int, ...]:
        """Indices whose masked vector has not arrived, sorted."""
        return tuple(i for i in self._indices if i not in self._masked)

    def public_keys(self) -> dict[int, bytes]:
        """The complete key set to broadcast to every participant.

        Raises
        ------
        ValueError
            While any public key is missing: broadcasting a partial set would
            start a round over a different set of participants.
        """
        missing = self.missing_public_keys()
        if missing:
            raise ValueError(f"public keys still missing from participants {list(missing)}")
        return dict(sorted(self._public_keys.items()))

    def result(self) -> npt.NDArray[np.int64]:
        """Unmask and return the per-class totals ``N_s`` (dtype ``int64``).

        Raises
        ------
        ValueError
            While any masked vector is missing: without every ``Y_e`` the masks
            do not cancel and the sum is meaningless; re-run PASS over the
            survivors with fresh keys.
        """
        missing = self.missing_masked()
        if missing:
            raise ValueError(
                f"masked vectors still missing from participants {list(missing)}: the "
                f"pairwise masks only cancel over all participants; re-run PASS with "
                f"fresh keys over the survivors"
            )
        return unmask_sum(self._masked)

    def _known_index(self, index: int) -> int:
        """Validate ``index`` and check it belongs to this round."""
        index = validate_index(index, "participant index")
        if index not in self._index_set:
            raise ValueError(f"participant {index} is not part of this PASS round")
        return index

    def _validated_vector(self, index: int, vector: object) -> npt.NDArray[np.uint64]:
        """Check one masked vector and return a read-only copy of it."""
        label = f"participant {index}"
        try:
            _check_masked_vector(vector, label, self._num_classes)
        except TypeError as error:
            raise ValueError(str(error)) from error
        assert isinstance(vector, np.ndarray)
        stored = vector.copy()
        stored.setflags(write=False)
        return stored


def _validated_round_indices(indices: Iterable[int]) -> tuple[int, ...]:
    """Check the participant indices of a round: valid, unique, at least 3."""
    values = [validate_index(index, "participant index") for index in indices]
    duplicates = sorted(i for i, n in Counter(values).items() if n > 1)
    if duplicates:
        raise ValueError(f"duplicate participant indices {duplicates}")
    if len(values) < MIN_PARTICIPANTS:
        raise ValueError(
            f"PASS needs at least {MIN_PARTICIPANTS} participants, got {len(values)}: "
            f"with 2 each learns the other's counts from the sum"
        )
    return tuple(sorted(values))


def _validated_num_classes(num_classes: int) -> int:
    """Check an expected vector length."""
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)):
        raise TypeError(f"num_classes must be an int, got {type(num_classes).__name__}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    return int(num_classes)
