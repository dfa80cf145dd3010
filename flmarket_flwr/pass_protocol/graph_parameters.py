"""Out-degree ``k`` and Shamir threshold ``t`` of a PASS graph whose clients draw their own out-neighbours.

A node computes them from the roster it was shown and its own settings (the colluders it assumes, its roster floor,
the re-runs its ledger allows), so that a buyer who picks the roster, grinds it over every allowed re-run and seats
its colluders anywhere still meets the bounds below: no victim opened, and no sum the buyer can unmask that holds
half the honest clients or fewer (:func:`closed_set_tail`). The derivation is in :func:`find_graph_parameters`, the
argument in docs/threat-model.md; the table for E = 100 ... 100,000 is
``python -m flmarket_flwr.pass_protocol.graph_parameters``.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Final

from flmarket_flwr.pass_protocol.graph import max_secret_threshold, share_threshold
from flmarket_flwr.pass_protocol.primitives import MIN_PARTICIPANTS

DEFAULT_SECURITY_BITS: Final[int] = 40
"""The buyer learns a sum of fewer honest inputs than intended with probability at most ``2^-40``."""
DEFAULT_CORRECTNESS_BITS: Final[int] = 20
"""A session fails (a client's secrets unrecoverable, a node over its in-degree cap) with probability at most
``2^-20`` when the clients are honest up to the stated colluders and dropout."""

MAX_ROSTER: Final[int] = 1_000_000
"""The largest roster the finder takes (Google's finder stops there too): its float tails stay within ``_MARGIN``."""
_MARGIN: Final[float] = 1e-6
"""Relative slack on every float tail comparison: ``lgamma`` of arguments up to :data:`MAX_ROSTER` is off by less
than ``1e-8`` relative, so a tail the floats put under its target by this margin is under it exactly."""
_TINY: Final[float] = 1e-60
"""Probability mass left out of a sum outright (and added back as a bound): below any correctness target here
(``2^-128 / 2`` over a roster of :data:`MAX_ROSTER` is about ``1.5e-45``)."""
_NEGLIGIBLE: Final[float] = 1e-16
"""A tail sum stops once the geometric bound on what is left is below this fraction of the sum (the bound is
added, so the sum stays an upper bound)."""


@dataclass(frozen=True)
class GraphParameters:
    """What :func:`find_graph_parameters` certifies for one roster.

    Attributes
    ----------
    roster, roster_floor, colluders, dropout, reruns, security_bits, correctness_bits
        The inputs, as given.
    degree : int
        ``k``: each client draws ``k`` distinct out-neighbours uniformly from the rest of the roster (``E - 1``:
        the complete graph).
    threshold : int
        ``t``: a client's two secrets are Shamir-shared ``t``-of-``k`` among its out-neighbours.
    tolerated_colluders : int
        ``2t - k - 1``: the colluding out-neighbours a client withstands in a split consistency round (the
        project's split tolerance); the corrupt-neighbour quantile lies below it.
    in_degree_cap : int
        The most in-neighbours a client accepts: above every honest in-degree but with probability within the
        correctness budget (``E - 1`` on the complete graph).
    complete : bool
        ``degree == roster - 1``: no sparse degree meets the bounds, the complete graph is needed.
    security_failure : float
        The union bound ``(reruns + 1) * E * P[C >= 2t - k]`` (``C``: colluding out-neighbours of one client),
        at most ``2^-security_bits``; ``0`` on the complete graph, where ``C = colluders < 2t - k``.
    one_sum_failure : float
        :func:`closed_set_tail` at ``largest = (E - c) // 2``, times ``reruns + 1``: the bound on the buyer being
        able to unmask a sum of half the honest clients or fewer, at most ``2^-security_bits``; ``0`` on the
        complete graph, where every closed set holds more than half of them.
    correctness_failure : float
        The bound on a session failing with honest clients (some client left with fewer than ``t`` honest, live
        out-neighbours, or an honest in-degree over the cap), at most ``2^-correctness_bits`` on a sparse graph; on
        the complete graph, the probability that fewer than ``t`` honest neighbours stay (at any size).
    """

    roster: int
    roster_floor: int
    colluders: int
    dropout: float
    reruns: int
    security_bits: int
    correctness_bits: int
    degree: int
    threshold: int
    tolerated_colluders: int
    in_degree_cap: int
    complete: bool
    security_failure: float
    correctness_failure: float
    one_sum_failure: float = 0.0


def find_graph_parameters(
    roster: int,
    *,
    roster_floor: int,
    colluders: int,
    dropout: float,
    reruns: int,
    security_bits: int = DEFAULT_SECURITY_BITS,
    correctness_bits: int = DEFAULT_CORRECTNESS_BITS,
    one_sum: bool = True,
) -> GraphParameters:
    """The least out-degree ``k``, and its threshold ``t``, that meet the bounds below for a roster of ``E``.

    Model (Bell, Bonawitz, Gascon, Lepoint, Raykova, CCS 2020, malicious variant). Once the signed roster and
    keys are fixed, each client draws ``k`` distinct out-neighbours uniformly from the other roster members with
    its own randomness, and Shamir-shares its mask key and its self-mask seed ``t``-of-``k`` among them. The
    buyer picks the roster (any size from the floor ``F`` to ``E``) and may seat all ``c`` colluders in it;
    colluders withhold shares when that helps the buyer. Honest clients drop independently with probability
    ``delta``. Each allowed re-run is a fresh draw on a roster the buyer picks again.

    Let ``n`` be the size of the roster a draw is made on and ``N = n - 1`` the population a client draws from.
    The number ``C`` of colluders among one honest client's out-neighbours is hypergeometric,
    ``C ~ HG(N, c, k)``. Its tail is largest where the colluders are densest, at the smallest roster a draw of
    ``k`` is possible on, ``N* = max(F, k + 1) - 1`` (for fixed ``c`` and ``k`` the hypergeometric falls
    stochastically as ``N`` grows): every tail below is taken at ``N*``, so it bounds every roster from the
    floor to ``E``. Colluders are thereby counted against the floor, not ``E``.

    1. Security. Both secrets of a victim come out only if ``t`` holders answer for each; an honest holder
       answers for one of them, a colluder for both, so a split consistency round opens the victim iff
       ``C >= 2t - k`` (which also covers ``C >= t``, a colluders-only reconstruction). A union bound over
       the at most ``E`` honest victims and the ``reruns + 1`` draws gives
       ``P[some victim opened] <= (reruns + 1) * E * P[HG(N*, c, k) >= 2t - k] <= 2^-security_bits``,
       i.e. ``2t - k >= m_s``, the least ``m`` with that bound: ``t >= ceil((k + m_s) / 2)``.
    2. Correctness: ``t`` within the honest, live out-neighbours. Given ``C``, the honest out-neighbours are
       ``k - C`` distinct honest clients, each dropping independently: the silent ones (colluders and dropped)
       number ``S = C + Bin(k - C, delta)``. ``P[S >= m] = E[g(C)]`` with ``g(j) = P[Bin(k - j, delta) >= m - j]``
       rising in ``j``, so it too is largest at ``N*``. A union bound over the ``E`` clients,
       ``E * P[S >= k + 1 - t] <= 2^-correctness_bits / 2``, leaves every client ``t`` answering holders.
    3. In-degree cap. A client is drawn by each other client independently with probability ``k / (n - 1)``:
       its in-degree from honest clients has mean at most ``k``, and by Anderson and Samuels (1967) its tail at
       or above ``k + 1`` lies below the ``Poisson(k)`` tail. The cap is the least ``m`` with
       ``E * P[Poisson(k) > m] <= 2^-correctness_bits / 2`` (at most ``E - 1``). Colluders that all choose one
       client can push it to the cap: that stops the session (as the buyer can anyway) and never adds a share
       holder, since shares go to out-neighbours only.
    4. Protocol rules: ``k // 2 + 1 <= t <= max(k // 2 + 1, k - 1)`` (:func:`.graph.share_threshold`,
       :func:`.graph.max_secret_threshold`).
    5. One sum. The buyer can unmask a sum only over a *closed* set of honest clients, one in which every member
       has at least ``t`` out-neighbours among the set and the colluders (docs/threat-model.md, "The sparse
       secure profile"). ``(reruns + 1) * closed_set_tail(E, c, k, t, (E - c) // 2) <= 2^-security_bits``: no
       closed set of half the honest clients or fewer, so at most one sum, over more than half of them. Taken
       at the roster ``E`` itself (a node computes it for the roster it is shown; every re-run on its own).

    ``k`` is the least degree from 2 up with a ``t`` that meets 1 to 5: from the least ``t`` of 1 and 4 up to the
    largest that 2 allows (a larger ``t`` tolerates fewer silent holders), the least that meets 5. If no
    ``k <= E - 2`` has one, the complete graph is needed: ``k = E - 1``, every colluder a neighbour (``C = c``
    exactly), ``t`` the least with ``2t - k > c`` (then every closed set holds more than half the honest
    clients: 5 holds outright), and ``correctness_failure`` what the roster gives,
    ``P[Bin(E - 1 - c, delta) > k - c - t]``, which small rosters cannot bring to ``2^-correctness_bits``.

    Parameters
    ----------
    roster : int
        ``E``, the roster size, from :data:`~.primitives.MIN_PARTICIPANTS` to :data:`MAX_ROSTER`.
    roster_floor : int
        ``F``: the node's least roster (``pass-min-participants``), ``3 <= F <= E``.
    colluders : int
        ``c``: colluding clients assumed (``pass-colluders``), ``0 <= c <= F - 2``.
    dropout : float
        ``delta``: the probability that an honest client drops, in ``[0, 1)``.
    reruns : int
        Fresh draws of one client the buyer may see beyond the first, ``>= 0``: the union bounds count
        ``reruns + 1``. The sparse mode passes every placement of a node's life, ``(pass-reruns + 1) x
        pass-markets`` less one (:attr:`~.sparse_secure.SparseSecureSettings.placements`).
    security_bits, correctness_bits : int
        Targets ``2^-security_bits`` and ``2^-correctness_bits``, each in ``[1, 128]``.
    one_sum : bool
        Whether bound 5 applies (``False``: the per-neighbourhood bounds alone, which take every roster from the
        floor to ``E`` at once, so their degree grows with ``E``; bound 5 is taken at ``E`` itself, where a fixed
        number of colluders is thinner, and the degree it needs can fall as ``E`` grows).

    Raises
    ------
    ValueError
        An input out of range (named), or so many colluders that no threshold outvotes them even on the complete
        graph.
    """
    _check_inputs(roster, roster_floor, colluders, dropout, reruns, security_bits, correctness_bits)
    k = roster - 1
    t = max(share_threshold(k), (k + colluders) // 2 + 1)
    if t > max_secret_threshold(k):
        raise ValueError(
            f"no Shamir threshold works even on the complete graph of {roster}: {colluders} colluders need "
            f"t > (k + {colluders}) / 2 = {(k + colluders) / 2}, above the largest threshold {max_secret_threshold(k)} "
            f"that survives one lost holder; lower pass-colluders or grow the roster"
        )
    complete = GraphParameters(
        roster=roster,
        roster_floor=roster_floor,
        colluders=colluders,
        dropout=dropout,
        reruns=reruns,
        security_bits=security_bits,
        correctness_bits=correctness_bits,
        degree=k,
        threshold=t,
        tolerated_colluders=2 * t - k - 1,
        in_degree_cap=k,
        complete=True,
        security_failure=0.0,
        correctness_failure=binomial_tail(k - colluders, dropout, k - colluders - t + 1),
    )
    return _least_sparse_degree(complete, one_sum) or complete


def _least_sparse_degree(complete: GraphParameters, one_sum: bool) -> GraphParameters | None:
    """The parameters at the least ``k <= E - 2`` that meets the bounds, or ``None`` (inputs from ``complete``)."""
    roster, roster_floor, colluders = complete.roster, complete.roster_floor, complete.colluders
    dropout, reruns = complete.dropout, complete.reruns
    security_bits, correctness_bits = complete.security_bits, complete.correctness_bits
    security_target = 2.0**-security_bits / ((reruns + 1) * roster)
    one_sum_target = 2.0**-security_bits / (reruns + 1) if one_sum else math.inf
    silent_target = 2.0**-correctness_bits / 2 / roster
    honest_half = (roster - colluders) // 2
    hint = 0
    for k in range(2, roster - 1):
        population = max(roster_floor, k + 1) - 1
        if not _may_fit(k, population, colluders):
            continue
        hint = _tail_quantile(partial(hypergeometric_tail, population, colluders, k), security_target, k, hint)
        least = max(share_threshold(k), -((k + hint) // -2))
        if (
            least > max_secret_threshold(k)
            or hypergeometric_tail(population, colluders, k, k + 1 - least) > silent_target
        ):
            continue  # the second: the colluders alone leave fewer than t answering holders too often
        silent = partial(silent_tail, population, colluders, k, dropout)
        if silent(k + 1 - least) > silent_target * (1.0 - _MARGIN):
            continue  # a larger t leaves even fewer
        t = _least_one_sum_threshold(roster, colluders, k, (least, silent, silent_target), honest_half, one_sum_target)
        if t is None:
            continue
        cap = min(roster - 1, _tail_quantile(partial(poisson_tail, k), silent_target, 10 * k + 100, k + 1) - 1)
        over_cap = roster * poisson_tail(k, cap + 1) if cap < roster - 1 else 0.0  # no in-degree passes E - 1
        return replace(
            complete,
            degree=k,
            threshold=t,
            tolerated_colluders=2 * t - k - 1,
            in_degree_cap=cap,
            complete=False,
            security_failure=(reruns + 1) * roster * hypergeometric_tail(population, colluders, k, 2 * t - k),
            correctness_failure=roster * silent(k + 1 - t) + over_cap,
            one_sum_failure=(reruns + 1) * closed_set_tail(roster, colluders, k, t, honest_half),
        )
    return None


def _least_one_sum_threshold(
    roster: int,
    colluders: int,
    k: int,
    start: tuple[int, Callable[[int], float], float],
    largest: int,
    target: float,
) -> int | None:
    """The least ``t`` with ``closed_set_tail(..., t, largest) <= target`` (it falls in ``t``), from ``least`` up
    to the largest ``t`` the correctness tail allows, or ``None``: bisection.

    ``start`` is ``(least, silent, silent_target)``: the least ``t`` of the security bound and the protocol's
    rules, and ``silent(m) = P[S >= m]`` with its target (``silent(k + 1 - t)`` rises in ``t``)."""
    least, silent, silent_target = start
    bound = target * (1.0 - _MARGIN)

    def ok(t: int) -> bool:
        return bound == math.inf or closed_set_tail(roster, colluders, k, t, largest, stop_above=bound) <= bound

    if ok(least):
        return least
    most = min(max_secret_threshold(k), k + 1 - _tail_quantile(silent, silent_target, k, k + 1 - least))
    if not ok(most):
        return None
    low, high = least - 1, most  # ok(high); ok(low) false by convention
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if ok(middle) else (middle, high)
    return high


_LOG_NEGLIGIBLE_BLOCK: Final[float] = math.log(1e-60)
"""A block of set sizes whose bound is below ``1e-60`` is added as its bound, not summed term by term."""
_UNDERFLOW: Final[float] = 1e-300
"""Stands for a hypergeometric tail whose float sum underflowed to 0: its terms are each below the least normal
double, so the tail, at most ``k + 1`` of them, is below this."""


def closed_set_tail(
    roster: int, colluders: int, degree: int, threshold: int, largest: int, *, stop_above: float = math.inf
) -> float:
    """A bound on some set of at most ``largest`` honest clients being closed, when each draws ``degree`` of the
    others uniformly as out-neighbours: ``2 * sum_{r=1..largest} C(E - c, r) * P[HG(E - 1, r - 1 + c, k) >= t]^r``.

    A set ``X`` of honest clients is *closed* when every member has at least ``t`` out-neighbours in ``X`` and the
    ``c`` colluders together: the buyer can unmask a sum only over a closed set (docs/threat-model.md, "The sparse
    secure profile"). For a fixed ``X`` of size ``r`` the members' draws are independent, each meets the condition
    with probability ``P[HG(E - 1, r - 1 + c, k) >= t]``; a union bound over the ``C(E - c, r)`` sets of each size
    gives the sum. The factor 2 covers a roster with fewer than ``c`` colluders: counting ``c - c'`` honest clients
    as colluders turns every closed set into a closed set of this model or the empty set, and two disjoint such
    choices leave every client counted honest in one of them.

    Parameters
    ----------
    roster, colluders, degree, threshold : int
        ``E``, ``c``, ``k`` and ``t``.
    largest : int
        The largest set size bounded (``(E - c) // 2`` for one sum).
    stop_above : float
        Return as soon as the partial sum exceeds this (a value above it, not the whole sum).

    Returns
    -------
    float
        The bound (at most ``stop_above`` unless it returned early), computed in logarithms: an upper bound
        within the ``lgamma`` error (a relative ``1e-8`` on each term, under the finder's margin).
    """
    honest = roster - colluders
    log_stop = math.log(stop_above / 2) if stop_above < math.inf else math.inf
    log_total = -math.inf

    def log_tail(size: int) -> float:
        return math.log(hypergeometric_tail(roster - 1, size - 1 + colluders, degree, threshold) or _UNDERFLOW)

    def add(log_term: float) -> None:
        nonlocal log_total
        high, low = max(log_total, log_term), min(log_total, log_term)
        log_total = high + math.log1p(math.exp(low - high)) if low > -math.inf else high

    first, last = max(1, threshold + 1 - colluders), min(largest, honest)  # smaller sets cannot close
    while first <= last and log_total <= log_stop:
        end = min(last, first + first // 32)
        # the block's terms, each below C(E - c, r) at its largest in the block times the tail at `end` (it rises
        # with r) to the power `first` (the tail is below 1): their count times that bounds them all
        peak = max(_log_comb(honest, size) for size in {first, end, min(max(first, honest // 2), end)})
        block = math.log(end - first + 1) + peak + first * log_tail(end)
        if block <= _LOG_NEGLIGIBLE_BLOCK or end == first:
            add(block)
        else:  # worth summing term by term
            for size in range(first, end + 1):
                add(_log_comb(honest, size) + size * log_tail(size))
        first = end + 1
    if log_total == -math.inf:
        return 0.0
    return 1.0 if log_total > 0.0 else min(1.0, 2.0 * math.exp(log_total))


def _check_inputs(
    roster: int,
    roster_floor: int,
    colluders: int,
    dropout: float,
    reruns: int,
    security_bits: int,
    correctness_bits: int,
) -> None:
    """Raise ``ValueError`` naming the first input out of range."""
    for name, value in (
        ("roster", roster),
        ("roster_floor", roster_floor),
        ("colluders", colluders),
        ("reruns", reruns),
        ("security_bits", security_bits),
        ("correctness_bits", correctness_bits),
    ):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be an int, got {value!r}")
    if not MIN_PARTICIPANTS <= roster <= MAX_ROSTER:
        raise ValueError(
            f"roster must be in [{MIN_PARTICIPANTS}, {MAX_ROSTER:,}] (PASS with fewer leaks; the float tails are "
            f"checked up to the most), got {roster}"
        )
    if not MIN_PARTICIPANTS <= roster_floor <= roster:
        raise ValueError(f"roster_floor must be in [{MIN_PARTICIPANTS}, roster={roster}], got {roster_floor}")
    if not 0 <= colluders <= roster_floor - 2:
        raise ValueError(
            f"colluders must be in [0, roster_floor - 2 = {roster_floor - 2}] (a roster at the floor must hold an "
            f"honest client besides the victim), got {colluders}"
        )
    if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be a probability in [0, 1), got {dropout!r}")
    if reruns < 0:
        raise ValueError(f"reruns must be >= 0, got {reruns}")
    for name, bits in (("security_bits", security_bits), ("correctness_bits", correctness_bits)):
        if not 1 <= bits <= 128:
            raise ValueError(f"{name} must be in [1, 128], got {bits}")


def _may_fit(k: int, population: int, colluders: int) -> bool:
    """A necessary condition, from the mode of ``C``, whose probability (at least ``1 / (k + 1)``) is above every
    target: the security quantile lies above it, ``t >= (k + mode + 1) / 2``, and ``P[S >= k + 1 - t] >=
    P[C >= k + 1 - t]`` is below its target only if ``k + 1 - t > mode``."""
    mode = (k + 1) * (colluders + 1) // (population + 2)
    return -((k + mode + 1) // -2) <= k - mode


def _tail_quantile(tail: Callable[[int], float], target: float, top: int, hint: int) -> int:
    """The least ``m`` in ``[0, top + 1]`` with ``tail(m) <= target * (1 - margin)``, for a tail that falls in
    ``m`` and is 0 above ``top``: a gallop from ``hint``, then bisection."""
    bound = target * (1.0 - _MARGIN)

    def ok(m: int) -> bool:
        return m > top or tail(m) <= bound

    low, high = -1, top + 1  # ok(low) is false by convention, ok(high) true
    m = min(max(hint, 0), top + 1)
    step = 1
    if ok(m):
        high = m
        while high - step > low:
            if not ok(high - step):
                low = high - step
                break
            high -= step
            step *= 2
    else:
        low = m
        while low + step < high:
            if ok(low + step):
                high = low + step
                break
            low += step
            step *= 2
    while high - low > 1:
        middle = (low + high) // 2
        if ok(middle):
            high = middle
        else:
            low = middle
    return high


def _log_comb(n: int, r: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(r + 1) - math.lgamma(n - r + 1)


def _unimodal_sum(
    first: int, last: int, log_p: Callable[[int], float], ratio: Callable[[int], float], mode: int
) -> float:
    """``sum_{j=first..last} p(j)`` for a log-concave pmf given ``log p(j)`` and ``p(j + 1) / p(j) = ratio(j)``.

    Summed outwards from the mode: the terms fall both ways and their ratios with them, so once a term times
    ``q / (1 - q)`` (``q`` its ratio onwards) is negligible it bounds the rest, which is added: the result is an
    upper bound within a relative ``1e-16``.
    """
    total = 0.0
    start = max(first, mode)
    if start <= last:  # upwards from the mode (or from first, past it)
        term, j = math.exp(log_p(start)), start
        while True:
            total += term
            if j >= last or term == 0.0:
                break
            r = ratio(j)
            if r < 1.0 and term * r / (1.0 - r) <= total * _NEGLIGIBLE:
                total += term * r / (1.0 - r)
                break
            term, j = term * r, j + 1
    start = min(last, mode - 1)
    if start >= first:  # downwards from just below the mode
        term, j = math.exp(log_p(start)), start
        while True:
            total += term
            if j <= first or term == 0.0:
                break
            q = 1.0 / ratio(j - 1)
            if q < 1.0 and term * q / (1.0 - q) <= total * _NEGLIGIBLE:
                total += term * q / (1.0 - q)
                break
            term, j = term * q, j - 1
    return min(1.0, total)


def hypergeometric_tail(population: int, successes: int, draws: int, at_least: int) -> float:
    """``P[X >= at_least]`` for ``X ~ HG(population, successes, draws)``: ``draws`` taken without replacement from
    ``population`` items of which ``successes`` are marked (an upper bound within a relative ``1e-16``)."""
    low = max(0, draws - (population - successes))
    high = min(successes, draws)
    first = max(at_least, low)
    if first > high:
        return 0.0
    if first == low:
        return 1.0
    whole = _log_comb(population, draws)

    def log_p(j: int) -> float:
        return _log_comb(successes, j) + _log_comb(population - successes, draws - j) - whole

    def ratio(j: int) -> float:
        return (successes - j) * (draws - j) / ((j + 1) * (population - successes - draws + j + 1))

    mode = min(high, max(low, (draws + 1) * (successes + 1) // (population + 2)))
    return _unimodal_sum(first, high, log_p, ratio, mode)


def binomial_tail(trials: int, probability: float, at_least: int) -> float:
    """``P[X >= at_least]`` for ``X ~ Bin(trials, probability)``."""
    first = max(at_least, 0)
    if first > trials:
        return 0.0
    if first == 0:
        return 1.0
    if probability == 0.0:
        return 0.0
    log_q, log_r = math.log(probability), math.log1p(-probability)
    odds = probability / (1.0 - probability)

    def log_p(j: int) -> float:
        return _log_comb(trials, j) + j * log_q + (trials - j) * log_r

    mode = min(trials, math.floor((trials + 1) * probability))
    return _unimodal_sum(first, trials, log_p, lambda j: (trials - j) / (j + 1) * odds, mode)


def poisson_tail(mean: float, at_least: int) -> float:
    """``P[X >= at_least]`` for ``X ~ Poisson(mean)``, ``mean > 0``."""
    first = max(at_least, 0)
    if first == 0:
        return 1.0

    def log_p(j: int) -> float:
        return j * math.log(mean) - mean - math.lgamma(j + 1)

    return _unimodal_sum(first, 1 << 62, log_p, lambda j: mean / (j + 1), math.floor(mean))


def silent_tail(population: int, colluders: int, draws: int, dropout: float, at_least: int) -> float:
    """``P[S >= at_least]`` for ``S = C + Bin(draws - C, dropout)``, ``C ~ HG(population, colluders, draws)``: the
    silent out-neighbours of a client (colluders, and honest ones that drop), within a relative ``1e-12``.

    ``sum_j P[C = j] g(j)`` with ``g(j) = P[Bin(draws - j, dropout) >= at_least - j]``: the ``j >= at_least``
    part is a hypergeometric tail. The rest runs upwards from the least ``j`` below which ``P[C < j]`` is under
    ``1e-60`` (added, as ``g <= 1``), with ``g(j + 1) = g(j) + (1 - dropout) P[Bin(draws - j - 1, dropout) =
    at_least - j - 1]``, so each term costs O(1), and stops past the mode once the geometric bound on the rest of
    ``P[C = j]`` is negligible (added too).
    """
    if dropout == 0.0 or at_least <= 0 or at_least > draws:
        return hypergeometric_tail(population, colluders, draws, at_least)
    low, high = max(0, draws - (population - colluders)), min(colluders, draws)
    total = hypergeometric_tail(population, colluders, draws, at_least)  # C >= at_least: silent enough alone
    top = min(high, at_least - 1)
    if top < low:
        return total
    whole = _log_comb(population, draws)

    def log_p(j: int) -> float:
        return _log_comb(colluders, j) + _log_comb(population - colluders, draws - j) - whole

    def ratio(j: int) -> float:  # P[C = j + 1] / P[C = j]
        return (colluders - j) * (draws - j) / ((j + 1) * (population - colluders - draws + j + 1))

    mode = min(top, max(low, (draws + 1) * (colluders + 1) // (population + 2)))
    start, p = mode, math.exp(log_p(mode))
    while start > low:  # down to where what lies below is negligible
        q = 1.0 / ratio(start - 1)
        if q < 1.0 and p * q / (1.0 - q) <= _TINY:
            total += p * q / (1.0 - q)
            break
        start, p = start - 1, p * q
    log_q, log_r = math.log(dropout), math.log1p(-dropout)
    n, r = draws - start, at_least - start  # g(j) = P[Bin(n, dropout) >= r], n - r fixed
    g = binomial_tail(n, dropout, r)
    log_b = _log_comb(n - 1, r - 1) + (r - 1) * log_q + (n - r) * log_r  # P[Bin(n - 1) = r - 1]
    p = math.exp(log_p(start))
    for j in range(start, top + 1):
        total += p * g
        if j == top:
            break
        step = ratio(j)
        if j >= mode and step < 1.0 and p * step / (1.0 - step) <= total * _NEGLIGIBLE:
            total += p * step / (1.0 - step)
            break
        p *= step
        g = min(1.0, g + (1.0 - dropout) * math.exp(log_b))
        log_b += math.log(r - 1) - math.log(n - 1) - log_q
        n, r = n - 1, r - 1
    return min(1.0, total)


# --- the table -----------------------------------------------------------------------------------------------------
SIZES: Final[tuple[int, ...]] = (100, 300, 1_000, 3_000, 10_000, 100_000)
COLLUDER_SHARES: Final[tuple[float, ...]] = (0.05, 0.10, 0.20)
TABLE_DROPOUT: Final[float] = 0.05
TABLE_RERUNS: Final[int] = 2
"""The table's re-runs: the market's default ``pass_reruns`` (3 draws a market)."""


def table(
    sizes: Sequence[int] = SIZES,
    shares: Sequence[float] = COLLUDER_SHARES,
    *,
    dropout: float = TABLE_DROPOUT,
    reruns: int = TABLE_RERUNS,
) -> str:
    """The degree table (markdown): each roster at its own floor (``F = E``), ``c = ceil(share * F)``."""
    head = "| E | " + " | ".join(f"{share:.0%} colluders: k / t / in-cap" for share in shares) + " |"
    lines = [head, "|" + " --- |" * (len(shares) + 1)]
    for size in sizes:
        cells = []
        for share in shares:
            found = find_graph_parameters(
                size,
                roster_floor=size,
                colluders=math.ceil(share * size - 1e-9),
                dropout=dropout,
                reruns=reruns,
            )
            if found.complete:
                cells.append(f"complete ({found.degree}) / {found.threshold} / -")
            else:
                cells.append(f"{found.degree} / {found.threshold} / {found.in_degree_cap}")
        lines.append(f"| {size:,} | " + " | ".join(cells) + " |")
    needed = [last_complete_roster(share, dropout=dropout, reruns=reruns) for share in shares]
    lines.append(f"| complete graph needed, largest E <= {COMPLETE_SCAN} | " + " | ".join(map(str, needed)) + " |")
    return "\n".join(lines)


COMPLETE_SCAN: Final[int] = 200
"""How far :func:`last_complete_roster` looks (the table's next size needs a sparse graph at every share)."""


def last_complete_roster(share: float, *, dropout: float, reruns: int, up_to: int = COMPLETE_SCAN) -> int | None:
    """The largest roster ``E <= up_to``, at its own floor with ``ceil(share * E)`` colluders, for which the
    finder needs the complete graph (or refuses); ``None`` if none. Not monotone below it: ``ceil`` steps in
    ``c`` can make a smaller roster sparse."""
    for size in range(up_to, MIN_PARTICIPANTS - 1, -1):
        colluders = math.ceil(share * size - 1e-9)
        if colluders > size - 2:
            return size
        try:
            found = find_graph_parameters(size, roster_floor=size, colluders=colluders, dropout=dropout, reruns=reruns)
        except ValueError:
            return size
        if found.complete:
            return size
    return None


def main(argv: Sequence[str] | None = None) -> None:
    """Print the degree table (``--help`` for its settings)."""
    parser = argparse.ArgumentParser(
        prog="python -m flmarket_flwr.pass_protocol.graph_parameters",
        description="Out-degree k, Shamir threshold t and in-degree cap of a graph whose clients draw their own "
        "out-neighbours, at security 2^-40 and correctness 2^-20, each roster at its own floor.",
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="roster sizes E")
    parser.add_argument(
        "--colluder-shares", type=float, nargs="+", default=list(COLLUDER_SHARES), help="colluders over the floor"
    )
    parser.add_argument("--dropout", type=float, default=TABLE_DROPOUT, help="honest dropout probability")
    parser.add_argument("--reruns", type=int, default=TABLE_RERUNS, help="PASS re-runs after the first session")
    args = parser.parse_args(argv)
    print(table(args.sizes, args.colluder_shares, dropout=args.dropout, reruns=args.reruns))


if __name__ == "__main__":
    main()
