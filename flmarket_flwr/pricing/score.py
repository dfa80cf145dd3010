"""Data value score of a client (FLMarket, section 3.2): :func:`score`, built from :func:`theta` and :func:`phi`.

The score rewards a client for holding classes that are rare in the global counts, up to the saturation
point ``alpha = N_s / (E C)``; it is evaluated in closed form, vectorised (formula: :func:`score`), and gives the same
bits on every machine: a node's score is checked by others (the buyer's audit, the award) and pinned.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["alpha", "phi", "score", "theta"]

# Largest count accepted: float64 holds every integer below 2**53 exactly.
_MAX_EXACT_COUNT = 2**53


def _as_counts(values: ArrayLike, name: str) -> NDArray[np.int64]:
    """Validate non-negative integer counts and return them as int64.

    Parameters
    ----------
    values : ArrayLike
        Integer counts, given as an integer array or a float array with integral values.
    name : str
        Argument name used in error messages.

    Returns
    -------
    NDArray[np.int64]
        The same counts as int64.
    """
    array = np.asarray(values)
    if array.dtype == np.bool_ or not (
        np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)
    ):
        raise TypeError(f"{name} must hold integer counts, got dtype {array.dtype}")
    if array.size == 0:
        raise ValueError(f"{name} is empty: it needs one count per class")
    if np.issubdtype(array.dtype, np.floating):
        if not np.all(np.isfinite(array)):
            raise ValueError(f"{name} contains NaN or infinite values")
        if np.any(array != np.floor(array)):
            raise ValueError(f"{name} contains non-integer counts")
    if array.min() < 0:
        raise ValueError(f"{name} contains negative counts")
    if array.max() >= _MAX_EXACT_COUNT:
        raise ValueError(f"{name} contains counts of 2**53 or more, which float64 cannot hold exactly")
    return array.astype(np.int64, copy=False)


def _check_num_clients(num_clients: int) -> int:
    if isinstance(num_clients, bool) or not isinstance(num_clients, (int, np.integer)):
        raise TypeError(f"num_clients must be an int, got {type(num_clients).__name__}")
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    return int(num_clients)


def _global_counts(global_counts: ArrayLike) -> NDArray[np.int64]:
    counts = _as_counts(global_counts, "global_counts")
    if counts.ndim != 1:
        raise ValueError(f"global_counts must have shape (C,), got {counts.shape}")
    if counts.sum() == 0:
        raise ValueError("global_counts are all zero: the global distribution is undefined")
    return counts


def theta(global_counts: ArrayLike) -> NDArray[np.float64]:
    """Class weights ``theta_c = 1 - n_s^c / N_s`` (scarce classes weigh more).

    Parameters
    ----------
    global_counts : ArrayLike
        Global per-class counts ``n_s^c``, shape ``(C,)``.

    Returns
    -------
    NDArray[np.float64]
        ``theta``, shape ``(C,)``, each in ``[0, 1]``.
    """
    counts = _global_counts(global_counts)
    return 1.0 - counts / counts.sum()


def alpha(global_counts: ArrayLike, num_clients: int) -> float:
    """Saturation threshold ``alpha = N_s / (E * C)``: the mean per-class volume of a client.

    Parameters
    ----------
    global_counts : ArrayLike
        Global per-class counts ``n_s^c``, shape ``(C,)``.
    num_clients : int
        Number of candidate clients ``E``.

    Returns
    -------
    float
        ``alpha``.
    """
    counts = _global_counts(global_counts)
    return float(counts.sum() / (_check_num_clients(num_clients) * counts.size))


# --- Portable logarithms --------------------------------------------------------------------------------------
# numpy's log is dispatched per vector unit (an AVX-512 kernel of its own), libm's log and lgamma per CPU (glibc picks
# an FMA variant where the CPU has one) and a matrix product per BLAS kernel: each may round differently. The score
# is compared and pinned across machines, so it is built from IEEE-754 basic operations alone (+, -, *, / and
# frexp, each correctly rounded by every vector unit), one numpy call per operation, in an order fixed here.
_LN2_HIGH = float.fromhex("0x1.62e42p-1")
"""``ln 2`` to 21 bits: ``e * _LN2_HIGH`` is exact for every float64 exponent ``e``."""
_LN2_LOW = float.fromhex("0x1.fdf473de6af28p-22")
"""``ln 2 - _LN2_HIGH``, rounded to float64."""
_HALF_LN_2PI = float.fromhex("0x1.d67f1c864beb5p-1")
"""``ln(2 pi) / 2``, rounded to float64."""
_SQRT_HALF = float.fromhex("0x1.6a09e667f3bcdp-1")
_ATANH_COEFFICIENTS = tuple(2.0 / (2 * k + 1) for k in range(1, 12))
"""``2 / (2k + 1)``, ``k >= 1``: ``ln(1 + g) = 2 s + s R`` with ``s = g / (2 + g)``, ``R = sum_k 2 s^(2k) / (2k + 1)``
(the ``atanh`` series); for ``1 + g`` in ``[sqrt(1/2), sqrt(2))``, ``s^2 <= 0.0295`` and the first term left out is
below ``2^-58`` of ``R``."""


def _ln(values: NDArray[np.float64]) -> NDArray[np.float64]:
    """Natural logarithm of positive finite float64 values, the same bits on every machine.

    ``x = (1 + g) 2^e`` with ``1 + g`` in ``[sqrt(1/2), sqrt(2))`` (``frexp``, exact, and ``g`` exact); then
    ``ln(1 + g) = g - (g^2/2 - s (g^2/2 + R))`` (:data:`_ATANH_COEFFICIENTS`), whose large term ``g`` is exact, and
    ``e ln 2`` in two parts. Within an ulp of ``ln x`` (tests/test_score.py measures it against an exact
    logarithm).
    """
    fraction, exponent = np.frexp(values)
    below = fraction < _SQRT_HALF
    g = np.where(below, fraction * 2.0, fraction) - 1.0
    exponents = (exponent - below).astype(np.float64)
    s = g / (2.0 + g)
    z = s * s
    r = np.full_like(z, _ATANH_COEFFICIENTS[-1])
    for coefficient in reversed(_ATANH_COEFFICIENTS[:-1]):
        np.multiply(r, z, out=r)
        np.add(r, coefficient, out=r)
    np.multiply(r, z, out=r)
    half_square = 0.5 * g * g
    return exponents * _LN2_HIGH - ((half_square - (s * (half_square + r) + exponents * _LN2_LOW)) - g)


_TABLE_SIZE = 4096


@functools.cache
def _log_factorial_table() -> NDArray[np.float64]:
    """``ln(m!)`` for ``m < 4096``: the running sum of :func:`_ln` of ``1..m``, carried in two floats (Knuth's
    two-sum), so that only each ``ln t``'s own rounding is left (far below an ulp of the sum)."""
    table = np.zeros(_TABLE_SIZE)
    high = low = 0.0
    for m, term in enumerate(_ln(np.arange(1.0, _TABLE_SIZE)).tolist(), start=1):
        total = high + term
        part = total - high
        low += (high - (total - part)) + (term - part)
        high = total
        table[m] = high + low
    table.flags.writeable = False
    return table


_BLOCK = 1 << 15
"""Values per block of Stirling's series in :func:`_log_factorial`: its few dozen passes then run in the cache (2-3x
faster on a million values); elementwise, so the blocks change no bit."""


def _log_factorial(values: NDArray[np.int64]) -> NDArray[np.float64]:
    """``ln(m!) = lgamma(m + 1)`` of non-negative integers, vectorised, the same bits on every machine.

    Below 4096 from :func:`_log_factorial_table`; above, Stirling's series to the ``m^-5`` term, whose
    truncation error is below ``1 / (1680 m^7)`` (under 1e-28 there): the float64 rounding of the
    leading terms dominates, as it does in any lgamma (within 3 ulps of ``ln(m!)``).
    """
    table = _log_factorial_table()
    largest = int(values.max()) if values.size else 0
    if largest < _TABLE_SIZE:
        return table[values]
    if largest + 1 < values.size:  # saturated counts repeat: evaluate each integer once, then gather
        return _log_factorial(np.arange(largest + 1, dtype=np.int64))[values]
    flat = values.ravel()
    out = np.empty(flat.size)
    for start in range(0, flat.size, _BLOCK):
        block = flat[start : start + _BLOCK]
        m = np.maximum(block, 1).astype(np.float64)
        inverse = 1.0 / m
        inverse_squared = inverse * inverse
        series = inverse * (1.0 / 12.0 - inverse_squared * (1.0 / 360.0 - inverse_squared / 1260.0))
        stirling = ((m + 0.5) * _ln(m) - m) + _HALF_LN_2PI + series
        out[start : start + _BLOCK] = np.where(block < _TABLE_SIZE, table[np.minimum(block, _TABLE_SIZE - 1)], stirling)
    return out.reshape(values.shape)


def _row_sums(terms: NDArray[np.float64]) -> NDArray[np.float64]:
    """Sum over the last axis in one fixed pairwise order, the same bits on every machine and for a row alone or
    in a matrix (a BLAS product sums in an order of its kernel's choosing).

    The row is padded with zeros to a power of two (the terms are non-negative: ``x + 0.0`` is ``x``), then folded
    in half until one column is left.
    """
    width = terms.shape[-1]
    padded = np.zeros((*terms.shape[:-1], 1 << (width - 1).bit_length()))
    padded[..., :width] = terms
    while padded.shape[-1] > 1:
        half = padded.shape[-1] // 2
        padded = padded[..., :half] + padded[..., half:]
    return padded[..., 0]


def phi(counts: ArrayLike, alpha_value: float) -> NDArray[np.float64] | float:
    """Diminishing-returns volume utility ``phi(x) = sum_{t=1..x} -ln(min(t/alpha, 1))``.

    Evaluated in closed form as ``m * ln(alpha) - lgamma(m + 1)`` with ``m = min(x, floor(alpha))``.

    Parameters
    ----------
    counts : ArrayLike
        Non-negative integer counts ``x`` (any shape).
    alpha_value : float
        Saturation threshold ``alpha > 0``.

    Returns
    -------
    NDArray[np.float64] or float
        ``phi`` of each count (a float for a scalar input). Zero wherever ``alpha <= 1``.
    """
    if not (isinstance(alpha_value, (int, float, np.integer, np.floating)) and math.isfinite(alpha_value)):
        raise ValueError(f"alpha must be a finite number, got {alpha_value!r}")
    if alpha_value <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha_value}")
    saturated = np.minimum(_as_counts(np.atleast_1d(counts), "counts"), math.floor(alpha_value))
    values = saturated * _ln(np.array([alpha_value], dtype=np.float64))[0] - _log_factorial(saturated)
    # Rounding can leave a value of a few ulps below zero where m is 0 or 1 and alpha ~ 1.
    values = np.maximum(values, 0.0)
    if np.ndim(counts) == 0:
        return float(values[0])
    return values


def score(
    local_counts: ArrayLike, global_counts: ArrayLike, num_clients: int, *, exact_global: bool = True
) -> NDArray[np.float64] | float:
    r"""Data value score ``u_e = sum_c theta_c * phi(n_e^c)`` of one client or of many.

    Parameters
    ----------
    local_counts : ArrayLike
        Per-class counts of one client, shape ``(C,)``, or of ``E`` clients, shape ``(E, C)``.
    global_counts : ArrayLike
        Global per-class counts ``n_s^c`` (from PASS), shape ``(C,)``.
    num_clients : int
        Number of candidate clients ``E`` in the market (not the number of rows given).
    exact_global : bool (default: True)
        Whether ``global_counts`` is the exact sum; ``False`` when it carries distributed-DP noise
        (:mod:`flmarket_flwr.pass_protocol.noise`), so that a local count may exceed its noisy class.

    Returns
    -------
    NDArray[np.float64] or float
        A float for a ``(C,)`` input, an ``(E,)`` array for an ``(E, C)`` input.

    Raises
    ------
    ValueError
        Negative, non-integer or non-finite counts; shapes that do not agree; a local count above
        the global count of its class (with ``exact_global``); ``num_clients < 1``; all-zero global counts.

    Notes
    -----
    The score of client ``e`` is

    .. math::

        u_e = \sum_{c=1}^{C} \theta_c \, \phi(n_e^c), \qquad
        \theta_c = 1 - n_s^c / N_s, \qquad
        \phi(x) = \sum_{t=1}^{x} -\ln \min(t / \alpha, 1), \qquad
        \alpha = N_s / (E \cdot C).

    Every term of ``phi`` with ``t >= alpha`` is ``-ln(1) = 0``, so ``phi`` saturates at
    ``m = min(x, floor(alpha))`` and has the closed form

    .. math::

        \phi(x) = \sum_{t=1}^{m} (\ln \alpha - \ln t) = m \ln \alpha - \ln \Gamma(m + 1).

    It is evaluated in that closed form with a vectorised ``ln(m!)`` (a table, then Stirling's series): no
    loop over samples or clients, so counts in the millions and ``(100_000, 100)`` count matrices cost one vectorised
    pass. Every step is an IEEE-754 basic operation in a fixed order (no BLAS product, no dispatched ``log``), so the
    score has the same bits on every machine, and a row scored alone the bits it has in a matrix.
    """
    global_array = _global_counts(global_counts)
    local = _as_counts(local_counts, "local_counts")
    if local.ndim not in (1, 2) or local.shape[-1] != global_array.size:
        raise ValueError(f"local_counts must have shape (C,) or (E, C) with C={global_array.size}, got {local.shape}")
    if exact_global and np.any(local > global_array):
        raise ValueError("local_counts exceed global_counts for some class: they cannot be part of that sum")
    weights = theta(global_array)
    utilities = phi(local, alpha(global_array, num_clients))
    scores = _row_sums(utilities * weights)
    if local.ndim == 1:
        return float(scores)
    return scores
