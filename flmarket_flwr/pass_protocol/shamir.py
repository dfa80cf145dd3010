"""Shamir secret sharing: of byte strings over ``F_p``, ``p = 2^32 - 5`` (vectorised), and of scalars mod ``l``.

Any ``t`` shares reconstruct a secret, any ``t - 1`` reveal nothing; nothing here authenticates shares. PASS
shares its secrets as scalars mod ``l`` (:func:`split_scalars`), so a dealing can be checked in the exponent.
"""

from __future__ import annotations

import secrets as _secrets
import struct
from collections.abc import Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

FIELD_PRIME: Final[int] = 2**32 - 5
"""The field prime; a product of two field elements fits in ``uint64``."""

WORD_BYTES: Final[int] = 3
"""Bytes of secret per field word (``2^24 < p``)."""

_P = np.uint64(FIELD_PRIME)
_SHARE_WORD_DTYPE: Final[np.dtype] = np.dtype("<u4")


def words_per_secret(secret_length: int) -> int:
    """Number of field words that encode a secret of ``secret_length`` bytes."""
    if secret_length < 1:
        raise ValueError(f"secret_length must be >= 1, got {secret_length}")
    return -(-secret_length // WORD_BYTES)


def _encode(secrets: Sequence[bytes]) -> npt.NDArray[np.uint64]:
    """Secrets of equal length -> ``(len(secrets), words)`` array of 24-bit words (zero-padded)."""
    if not secrets:
        raise ValueError("need at least one secret to split")
    lengths = {len(s) for s in secrets}
    if len(lengths) != 1 or 0 in lengths:
        raise ValueError(f"secrets must be non-empty and all of one length, got lengths {sorted(lengths)}")
    if not all(isinstance(s, bytes) for s in secrets):
        raise TypeError("secrets must be bytes")
    words = words_per_secret(lengths.pop())
    padded = b"".join(s.ljust(words * WORD_BYTES, b"\0") for s in secrets)
    raw = np.frombuffer(padded, dtype=np.uint8).reshape(len(secrets), words, WORD_BYTES).astype(np.uint64)
    return raw[..., 0] | (raw[..., 1] << np.uint64(8)) | (raw[..., 2] << np.uint64(16))


def _decode(words: npt.NDArray[np.uint64], secret_length: int) -> list[bytes]:
    """Inverse of :func:`_encode`; refuses words >= ``2^24`` or non-zero padding (inconsistent shares)."""
    if (words >= np.uint64(1 << 24)).any():
        raise ValueError("reconstruction gave a word >= 2**24: the shares are inconsistent or corrupted")
    raw = np.stack([(words >> np.uint64(8 * i)) & np.uint64(0xFF) for i in range(WORD_BYTES)], axis=-1)
    blobs = [row.astype(np.uint8).tobytes() for row in raw]
    if any(any(blob[secret_length:]) for blob in blobs):
        raise ValueError("reconstruction gave non-zero padding: the shares are inconsistent or corrupted")
    return [blob[:secret_length] for blob in blobs]


def _check_xs(xs: Sequence[int]) -> list[int]:
    """Validate evaluation points: distinct ints in ``[1, p)``."""
    values = [int(x) for x in xs]
    if not values:
        raise ValueError("need at least one x-coordinate")
    bad = [x for x in values if not 1 <= x < FIELD_PRIME]
    if bad:
        raise ValueError(f"x-coordinates must satisfy 1 <= x < {FIELD_PRIME} (x = 0 is the secret), got {bad[0]}")
    if len(set(values)) != len(values):
        raise ValueError("x-coordinates must be distinct, got duplicates")
    return values


def random_field_elements(shape: tuple[int, ...], rng: np.random.Generator | None = None) -> npt.NDArray[np.uint64]:
    """Uniform elements of ``F_p``: CSPRNG words rejection-sampled below ``p`` (``rng`` only for tests)."""
    count = int(np.prod(shape, dtype=np.int64))
    out = np.empty(count, dtype=np.uint64)
    filled = 0
    while filled < count:
        need = count - filled
        if rng is None:
            draw = np.frombuffer(_secrets.token_bytes(4 * need), dtype="<u4").astype(np.uint64)
        else:
            draw = rng.integers(0, 2**32, size=need, dtype=np.uint64)
        draw = draw[draw < _P]
        out[filled : filled + draw.size] = draw
        filled += draw.size
    return out.reshape(shape)


def split_secrets(
    secrets: Sequence[bytes],
    xs: Sequence[int],
    threshold: int,
    rng: np.random.Generator | None = None,
) -> npt.NDArray[np.uint64]:
    """Split equal-length secrets into shares for the receivers at ``xs``.

    Parameters
    ----------
    secrets : sequence of bytes
        Secrets of one common length (32 bytes typically).
    xs : sequence of int
        Receivers' x-coordinates (their PASS indices): distinct, ``1 <= x < p``.
    threshold : int
        ``t``: any ``t`` shares reconstruct, ``t - 1`` reveal nothing; ``1 <= t <= len(xs)``.
    rng : numpy.random.Generator, optional
        Only for tests; the default draws coefficients from the OS CSPRNG.

    Returns
    -------
    numpy.ndarray
        ``uint64`` array of shape ``(len(xs), len(secrets), words)``: row ``i`` is receiver ``xs[i]``'s share.
    """
    points = _check_xs(xs)
    if not 1 <= threshold <= len(points):
        raise ValueError(f"threshold must be in [1, {len(points)}] (number of receivers), got {threshold}")
    constant = _encode(secrets)
    coefficients = random_field_elements((threshold - 1, *constant.shape), rng)
    x = np.asarray(points, dtype=np.uint64)[:, None, None]
    acc = np.zeros((len(points), *constant.shape), dtype=np.uint64)
    # Horner over the degree, highest coefficient first: t steps, each vectorised over all shares and done in
    # place. acc * x + c < p * p + p < 2^64 for acc, x, c < p: one reduction per step, nothing wraps around.
    for coefficient in coefficients[::-1]:
        np.multiply(acc, x, out=acc)
        np.add(acc, coefficient, out=acc)
        np.remainder(acc, _P, out=acc)
    np.multiply(acc, x, out=acc)
    np.add(acc, constant, out=acc)
    return np.remainder(acc, _P, out=acc)


def lagrange_at_zero(xs: Sequence[int], modulus: int = FIELD_PRIME) -> list[int]:
    """Lagrange coefficients ``l_i = prod_{j != i} x_j / (x_j - x_i)`` mod ``modulus`` (interpolation at 0).

    ``modulus`` is a prime above every ``x``: ``p`` (the default) or :data:`GROUP_ORDER`.
    """
    points = _check_xs(xs)
    coefficients = []
    for i, xi in enumerate(points):
        numerator, denominator = 1, 1
        for j, xj in enumerate(points):
            if j != i:
                numerator = numerator * xj % modulus
                denominator = denominator * (xj - xi) % modulus
        coefficients.append(numerator * pow(denominator, -1, modulus) % modulus)
    return coefficients


GROUP_ORDER: Final[int] = 2**252 + 27742317777372353535851937790883648493
"""``l``, the order of edwards25519's prime-order subgroup: the field of :func:`split_scalars`."""

SCALAR_BYTES: Final[int] = 32
"""Bytes of one scalar share (little-endian, below ``l``)."""


def random_scalar() -> int:
    """A uniform scalar mod ``l`` from the OS CSPRNG (64 bytes reduced: bias below ``2^-259``)."""
    return int.from_bytes(_secrets.token_bytes(64), "little") % GROUP_ORDER


def split_scalars(secrets: Sequence[int], xs: Sequence[int], threshold: int) -> list[list[int]]:
    """Shamir-split scalars mod ``l`` for the receivers at ``xs``: row ``i`` holds receiver ``xs[i]``'s shares.

    Every secret gets its own random polynomial ``f`` of degree ``threshold - 1`` with ``f(0)`` the secret; any
    ``threshold`` shares give it back (:func:`reconstruct_scalar`), fewer are uniform whatever it is.

    Notes
    -----
    PASS v2 shares each client's mask key and self-mask seed among its graph neighbours (Bonawitz et al. 2017) as
    scalars modulo ``l``, the order of edwards25519's prime-order subgroup (:func:`split_scalars`), so that a share
    ``sigma`` has a public image ``sigma B`` and the dealing can be checked in the exponent, Feldman-style
    (:func:`parity_weights`; the curve operations are in :mod:`~flmarket_flwr.pass_protocol.dleq`).
    """
    points = _check_xs(xs)
    if not 1 <= threshold <= len(points):
        raise ValueError(f"threshold must be in [1, {len(points)}] (number of receivers), got {threshold}")
    if any(not 0 <= int(secret) < GROUP_ORDER for secret in secrets):
        raise ValueError("the secrets must be scalars in [0, l)")
    polynomials = [[int(secret)] + [random_scalar() for _ in range(threshold - 1)] for secret in secrets]
    rows = []
    for x in points:
        row = []
        for coefficients in polynomials:
            value = 0
            for coefficient in reversed(coefficients):  # Horner
                value = (value * x + coefficient) % GROUP_ORDER
            row.append(value)
        rows.append(row)
    return rows


def reconstruct_scalar(xs: Sequence[int], shares: Sequence[int]) -> int:
    """The scalar mod ``l`` behind ``shares`` held at ``xs`` (all used: pass ``threshold`` of them)."""
    if len(shares) != len(xs):
        raise ValueError(f"need one share per x-coordinate, got {len(shares)} shares for {len(xs)} xs")
    coefficients = lagrange_at_zero(xs, GROUP_ORDER)
    return sum(c * int(share) for c, share in zip(coefficients, shares, strict=True)) % GROUP_ORDER


def scalar_to_bytes(value: int) -> bytes:
    """A scalar mod ``l`` as :data:`SCALAR_BYTES` little-endian bytes."""
    if not 0 <= value < GROUP_ORDER:
        raise ValueError("a scalar must be in [0, l)")
    return value.to_bytes(SCALAR_BYTES, "little")


def scalar_from_bytes(data: bytes) -> int | None:
    """The scalar encoded by ``data``, or ``None`` unless it is :data:`SCALAR_BYTES` bytes below ``l`` (canonical)."""
    if not isinstance(data, bytes) or len(data) != SCALAR_BYTES:
        return None
    value = int.from_bytes(data, "little")
    return value if value < GROUP_ORDER else None


def parity_weights(xs: Sequence[int], threshold: int) -> list[int]:
    """Random weights ``w``, ``sum_i w_i f(x_i) = 0`` mod ``l`` for every polynomial ``f`` of degree < ``threshold``.

    A random codeword of the dual of the Reed-Solomon code at ``xs``: ``w_i = c_i g(x_i)``, ``c_i =
    1 / prod_{j != i} (x_i - x_j)``, ``g`` random of degree ``len(xs) - threshold - 1``. Values ``v_i`` not on one
    polynomial of degree < ``threshold`` give ``sum w_i v_i != 0`` except with probability ``1 / l``, so one
    weighted sum checks them all; in the exponent (``v_i B``) it checks a dealing against its commitments.
    ``xs`` may include 0 (the secret's point); empty if ``len(xs) <= threshold`` (any such values fit).
    """
    points = [int(x) for x in xs]
    if len(set(points)) != len(points) or any(not 0 <= x < GROUP_ORDER for x in points):
        raise ValueError("the x-coordinates must be distinct scalars")
    if threshold < 1:
        raise ValueError(f"threshold must be >= 1, got {threshold}")
    degree = len(points) - threshold - 1
    if degree < 0:
        return []
    draw = [random_scalar() for _ in range(degree + 1)]
    weights = []
    for i, xi in enumerate(points):
        denominator = 1
        for j, xj in enumerate(points):
            if j != i:
                denominator = denominator * (xi - xj) % GROUP_ORDER
        g = 0
        for coefficient in reversed(draw):
            g = (g * xi + coefficient) % GROUP_ORDER
        weights.append(g * pow(denominator, -1, GROUP_ORDER) % GROUP_ORDER)
    return weights


def reconstruct_secrets(xs: Sequence[int], shares: npt.ArrayLike, secret_length: int) -> list[bytes]:
    """Reconstruct the secrets from the shares held at ``xs`` (Lagrange interpolation at 0).

    Parameters
    ----------
    xs : sequence of int
        The x-coordinates of the given shares; all of them are used, so pass at least ``t``.
    shares : array_like
        ``(len(xs), num_secrets, words)`` field elements, as :func:`split_secrets` returns (a subset of rows).
    secret_length : int
        Length in bytes of each secret.

    Returns
    -------
    list of bytes
        The secrets. With fewer than ``t`` shares the result is wrong (usually refused as out of range).

    Raises
    ------
    ValueError
        Duplicate or out-of-range xs, shape mismatch, values >= p, or an inconsistent reconstruction.
    """
    points = _check_xs(xs)
    array = np.asarray(shares)
    words = words_per_secret(secret_length)
    if array.ndim != 3 or array.shape[0] != len(points) or array.shape[2] != words:
        raise ValueError(
            f"shares must have shape ({len(points)}, num_secrets, {words}) for {len(points)} xs and "
            f"{secret_length}-byte secrets, got {array.shape}"
        )
    if array.dtype.kind not in "iu" or (array < 0).any() or (array >= FIELD_PRIME).any():
        raise ValueError(f"shares must be integers in [0, {FIELD_PRIME})")
    array = array.astype(np.uint64)
    coefficients = np.asarray(lagrange_at_zero(points), dtype=np.uint64)[:, None, None]
    # Each term is below p (a product below p^2 < 2^64, reduced); at most p - 1 of them sum below 2^64.
    terms = np.remainder(array * coefficients, _P)
    return _decode(np.remainder(terms.sum(axis=0, dtype=np.uint64), _P), secret_length)


def share_to_bytes(share: npt.ArrayLike) -> bytes:
    """One receiver's share row ``(num_secrets, words)`` as little-endian ``uint32`` words."""
    array = np.asarray(share)
    if array.ndim != 2 or (array >= FIELD_PRIME).any() or (array < 0).any():
        raise ValueError(f"a share row must be 2-D with values in [0, {FIELD_PRIME}), got shape {array.shape}")
    return array.astype(_SHARE_WORD_DTYPE).tobytes()


def share_from_bytes(data: bytes, num_secrets: int, secret_length: int) -> npt.NDArray[np.uint64]:
    """Inverse of :func:`share_to_bytes` for ``num_secrets`` secrets of ``secret_length`` bytes."""
    words = words_per_secret(secret_length)
    expected = 4 * num_secrets * words
    if not isinstance(data, bytes) or len(data) != expected:
        raise ValueError(f"a share of {num_secrets} x {secret_length}-byte secrets is {expected} bytes")
    array = np.frombuffer(data, dtype=_SHARE_WORD_DTYPE).astype(np.uint64).reshape(num_secrets, words)
    if (array >= _P).any():
        raise ValueError(f"share word >= {FIELD_PRIME}: not a field element")
    return array


def share_words_in_field(data: bytes) -> bool:
    """Whether ``data`` is whole little-endian ``uint32`` words, each a field element (below ``p``).

    The check :func:`share_from_bytes` makes on a share's words, for one short share without building an array
    (a PASS client checks one share pair per neighbour).
    """
    if len(data) % 4:
        return False
    return not data or max(struct.unpack(f"<{len(data) // 4}I", data)) < FIELD_PRIME
