"""Distributed Skellam noise on the label counts: each release of ``N_s`` carries a stated ``(epsilon, delta)``.

Each client adds symmetric Skellam noise to its counts before masking (:class:`SkellamNoise`), calibrated so
that the honest survivors alone reach the target, with a stated number of colluders in the roster adding none.
The privacy is record level (one training sample), not client level; releases compose, and a node's
:class:`PrivacyBudget` bounds them all (docs/threat-model.md).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt

__all__ = [
    "DEFAULT_HONEST_FRACTION",
    "MIN_HONEST_CLIENTS",
    "RDP_ORDERS",
    "SECURE_PROFILE_DELTA",
    "SECURE_PROFILE_EPSILON",
    "SECURE_PROFILE_TOTAL_EPSILON",
    "PrivacyBudget",
    "SkellamNoise",
    "composed_epsilon",
    "os_generator",
    "rdp_to_epsilon",
    "skellam_epsilon",
    "skellam_rdp",
    "skellam_rdp_curve",
    "skellam_variance_for",
]

RDP_ORDERS: Final[tuple[int, ...]] = tuple(range(2, 257)) + tuple(range(264, 4097, 8))
"""Integer Renyi orders searched by the conversion to ``(epsilon, delta)``."""

DEFAULT_HONEST_FRACTION: Final[float] = 0.5
"""Share of a roster assumed honest and surviving, whose noise alone must reach the target."""

MIN_HONEST_CLIENTS: Final[int] = 2
"""The fewest honest clients a roster must hold beside its assumed colluders: with one, the sum less the
colluders' counts is that client's counts plus its own noise, and secure aggregation hides nothing."""

TAIL_SDS: Final[float] = 12.0
"""Standard deviations of the summed noise allowed beyond a bound check (``P`` below ``1e-20`` per class)."""

SECURE_PROFILE_EPSILON: Final[float] = 1.0
"""Per-release ``epsilon`` of the secure profile: one market's ``N_s`` moves any event's odds by at most ``e``.

At ``delta = 1e-6`` it costs a variance of 21.6 per class (a standard deviation of 4.6 samples over the honest
survivors), small beside the class totals a market scores against (hundreds to thousands of samples).
"""

SECURE_PROFILE_DELTA: Final[float] = 1e-6
"""``delta`` of the secure profile, per release and for the total: well below ``1 / records`` for federations
of up to ``10^5`` training samples (a ``delta`` of ``1 / n`` would allow publishing one record outright)."""

SECURE_PROFILE_TOTAL_EPSILON: Final[float] = 4.0
"""Lifetime ``epsilon`` of the secure profile's node budget: 12 releases at ``epsilon = 1`` (RDP composed,
``delta = 1e-6``: 2 releases cost 1.45, 3 cost 1.81, 10 cost 3.51, 12 cost 3.89), e.g. a market a month for a
year. Beyond it the node releases nothing more over the same records (a new ledger only for new data)."""


def skellam_rdp(alpha: float, variance: float, l1: float = 1.0, l2: float = 1.0) -> float:
    """Renyi-DP ``eps(alpha)`` of one Skellam release with aggregate per-coordinate ``variance``.

    Parameters
    ----------
    alpha : float
        Renyi order, ``> 1`` (the bound is stated for integer orders).
    variance : float
        ``mu``: the variance of the summed Skellam noise in each coordinate, ``> 0``.
    l1, l2 : float (default: 1.0)
        L1 and L2 sensitivity of the counts (1 and 1: one sample added or removed).

    Returns
    -------
    float
        The bound on ``D_alpha`` between the outputs on neighbouring inputs.
    """
    if alpha <= 1 or variance <= 0:
        raise ValueError(f"need alpha > 1 and variance > 0, got {alpha} and {variance}")
    return float(skellam_rdp_curve(variance, l1, l2, orders=(alpha,))[0])


def skellam_rdp_curve(
    variance: float, l1: float = 1.0, l2: float = 1.0, orders: Sequence[float] = RDP_ORDERS
) -> npt.NDArray[np.float64]:
    """:func:`skellam_rdp` at every order of ``orders`` (default :data:`RDP_ORDERS`), as an array."""
    if variance <= 0:
        raise ValueError(f"variance must be > 0, got {variance}")
    alpha = np.asarray(orders, dtype=np.float64)
    lead = alpha * l2**2 / (2.0 * variance)
    surcharge = np.minimum(((2.0 * alpha - 1.0) * l2**2 + 6.0 * l1) / (4.0 * variance**2), 3.0 * l1 / (2.0 * variance))
    return lead + surcharge


def rdp_to_epsilon(rdp: Sequence[float], orders: Sequence[float], delta: float) -> float:
    """``epsilon`` at ``delta`` of an RDP curve: ``dp-accounting``'s conversion (Canonne, Kamath and Steinke).

    ``dp_accounting`` is imported here, not with the module: it takes about a second, and most market messages
    (a fresh process each in a deployment) never convert.
    """
    from dp_accounting.rdp import compute_epsilon  # pylint: disable=import-outside-toplevel

    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    return float(compute_epsilon(list(orders), list(rdp), delta)[0])


def composed_epsilon(variances: Sequence[float], delta: float, l1: float = 1.0, l2: float = 1.0) -> float:
    """``epsilon`` at ``delta`` of one Skellam release per entry of ``variances``, RDP composed.

    Parameters
    ----------
    variances : sequence of float
        Aggregate per-coordinate variance of each release (``inf``: no release; ``0``: one without noise,
        which makes the total infinite).
    delta : float
        Target ``delta`` in ``(0, 1)``.
    l1, l2 : float
        Sensitivities of each release (record level: 1, 1).

    Notes
    -----
    **Accounting.** The RDP curve is Agarwal, Kairouz and Liu's bound for the Skellam mechanism ("The Skellam
    Mechanism for Differentially Private Federated Learning", NeurIPS 2021; the same form as Google's reference
    ``_skellam_rdp`` in the ``distributed_dp`` code, scale 1): for aggregate per-coordinate variance ``mu`` and
    integer order ``alpha > 1``::

        eps(alpha) <= alpha D2^2 / (2 mu) + min(((2 alpha - 1) D2^2 + 6 D1) / (4 mu^2), 3 D1 / (2 mu))

    It never lies below the Renyi divergence of two shifted Skellam laws computed from the exact pmf (tested at
    orders 2 to 20: 2 to 3.6 times the truth at variance 2, within 15% at 30, 1% at 300). Releases compose by
    adding their curves (RDP composition); the conversion to ``(epsilon, delta)`` is Google's ``dp-accounting``
    (``dp_accounting.rdp.compute_epsilon``: Canonne, Kamath and Steinke's conversion, tighter than Mironov's
    ``min_alpha eps(alpha) + log(1/delta) / (alpha - 1)``: at variance 30 and ``delta = 1e-6``, 0.832 where
    Mironov's gives 0.994).
    """
    if any(not v >= 0 for v in variances):
        raise ValueError(f"variances must be >= 0, got {list(variances)}")
    if any(v == 0 for v in variances):
        return math.inf
    finite = [v for v in variances if math.isfinite(v)]
    if not finite:
        return 0.0
    curve = np.sum([skellam_rdp_curve(v, l1, l2) for v in finite], axis=0)
    return rdp_to_epsilon(curve.tolist(), RDP_ORDERS, delta)


def skellam_epsilon(variance: float, delta: float, releases: int = 1, l1: float = 1.0, l2: float = 1.0) -> float:
    """``epsilon`` at ``delta`` of ``releases`` Skellam releases, each with aggregate ``variance`` (RDP composed).

    Parameters
    ----------
    variance : float
        Aggregate per-coordinate variance of each release's noise (``inf`` gives 0).
    delta : float
        Target ``delta`` in ``(0, 1)``.
    releases : int (default: 1)
        Number of releases that involve the same record (e.g. the markets a client took part in).
    l1, l2 : float
        Sensitivities of one release (record level: 1, 1).
    """
    if releases < 1:
        raise ValueError(f"releases must be >= 1, got {releases}")
    if math.isinf(variance):
        return 0.0
    return rdp_to_epsilon((releases * skellam_rdp_curve(variance, l1, l2)).tolist(), RDP_ORDERS, delta)


@functools.lru_cache(maxsize=256)
def skellam_variance_for(epsilon: float, delta: float, releases: int = 1) -> float:
    """The smallest aggregate variance (to 0.1%) whose ``releases`` releases are ``(epsilon, delta)``-DP.

    Bisection on a log scale: :func:`skellam_epsilon` decreases as the variance grows.
    """
    if not epsilon > 0 or not math.isfinite(epsilon):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon}")
    low, high = 1e-3, 1.0
    while skellam_epsilon(high, delta, releases) > epsilon:
        low, high = high, high * 4.0
        if high > 1e15:
            raise ValueError(f"no variance below 1e15 reaches epsilon {epsilon} at delta {delta}")
    while high / low > 1.001:
        middle = math.sqrt(low * high)
        if skellam_epsilon(middle, delta, releases) > epsilon:
            low = middle
        else:
            high = middle
    return high


@dataclass(frozen=True)
class PrivacyBudget:
    """A node's total ``(epsilon, delta)`` over every release of its counts (node config ``pass-dp-total-*``).

    Parameters
    ----------
    epsilon : float
        The most composed ``epsilon`` the node's releases may reach, finite and ``> 0``.
    delta : float (default: :data:`SECURE_PROFILE_DELTA`)
        The ``delta`` at which the composition is converted.

    Notes
    -----
    **A node's total budget.** A node with a release ledger (:mod:`flmarket_flwr.market.wire.ledger`) records the
    aggregate variance each of its releases counted on and refuses one that would take the composed ``epsilon``
    of all of them past its :class:`PrivacyBudget`. Differencing two releases (colluders leaving together with a
    victim, which no ledger rule prevents) is post-processing: it learns what their composition allows, no more.
    Each release is charged the variance of the noise its honest survivors add, with the node's assumed colluders
    adding none (:meth:`SkellamNoise.release_variance`): the budget holds while there are no more colluders.
    """

    epsilon: float
    delta: float = SECURE_PROFILE_DELTA

    def __post_init__(self) -> None:
        """Validate the parameters."""
        if not math.isfinite(self.epsilon) or self.epsilon <= 0:
            raise ValueError(f"total epsilon must be finite and > 0, got {self.epsilon}")
        if not 0 < self.delta < 1:
            raise ValueError(f"total delta must be in (0, 1), got {self.delta}")

    def spent(self, variances: Sequence[float]) -> float:
        """The composed ``epsilon`` at :attr:`delta` of releases with these aggregate variances."""
        return composed_epsilon(variances, self.delta)


def os_generator() -> np.random.Generator:
    """A ``numpy`` generator seeded with 256 bits from ``os.urandom`` (fresh every call)."""
    return np.random.default_rng(int.from_bytes(os.urandom(32), "little"))


@dataclass(frozen=True)
class SkellamNoise:
    """Distributed Skellam noise for one release of ``N_s`` per market: the client's and the server's setting.

    Parameters
    ----------
    epsilon : float
        Target ``epsilon`` of one release (record level, ``L1 = L2 = 1``).
    delta : float (default: 1e-6)
        Target ``delta``.
    honest_fraction : float (default: 0.5)
        Share of the roster assumed honest and surviving; their noise alone reaches the target.
    colluders : int (default: 0)
        Clients of the roster that may collude with the server (node config ``pass-colluders``): they add no
        noise and the server knows their counts. The noise withstands this many or ``n - ceil(honest_fraction *
        n)``, whichever is more; ``0``: the honest-fraction rule alone.
    rng : callable, optional
        ``() -> numpy.random.Generator``; default :func:`os_generator`. Only tests inject one.

    Notes
    -----
    Each client adds integer noise ``Poisson(v/2) - Poisson(v/2)`` (symmetric Skellam, variance ``v``) to each of
    its class counts before masking. Skellam is closed under summation: the honest clients' noise in ``N_s`` is
    Skellam with the summed variance, whatever the other clients add.

    **Neighbouring relation: record level.** Two federations are neighbours when one training sample is added
    to or removed from one client; one class count of ``N_s`` then moves by 1 (``L1 = L2 = 1`` per release).
    This is *not* client-level privacy: one client's whole count vector moves ``N_s`` by up to ``count_bound``
    per class, and the noise here does not hide that (a client's presence in a run still shows in the sum,
    blurred by a standard deviation of a few samples, never by its volume).

    **Who must be honest.** The noise is calibrated so that the honest survivors alone reach the target: a
    client that sees a roster of ``n`` adds variance ``target / h`` with ``h = min(ceil(honest_fraction * n),
    n - colluders)`` (:meth:`honest_clients`): the roster may hold up to ``n - h`` colluders adding no noise
    (:meth:`assumed_colluders`: half the roster at the default fraction, or ``colluders`` when that is more),
    and the guarantee holds while the other ``h`` clients are honest and survive to the sum. ``colluders = 0``
    is the honest-fraction rule alone. A roster with fewer than :data:`MIN_HONEST_CLIENTS` clients beside
    ``colluders`` is refused. ``n`` is the roster the server shows: sybils it adds count, and shrink each honest
    client's noise (the pinned directory and the roster floor bound them).

    **What a release gives.** Each client's noise is fixed by the roster ``U1`` it was shown; the sum holds the
    survivors ``U3``, of which at most ``n - h`` collude, so its honest noise has variance at least
    ``client_variance(n) * (|U3| - (n - h))`` (:meth:`release_variance`): the target when every client survives,
    less when the server drops some after the roster was fixed. That is what a node's ledger charges
    (:meth:`~flmarket_flwr.market.wire.ledger.ReleaseLedger.charge_release`). It assumes the honest clients share this
    setting; with more colluders than ``n - h`` the release carries less noise than charged, and the guarantee
    stops there.

    Randomness comes from the operating system (``numpy.random.Generator`` seeded from ``os.urandom``), or
    from an injected factory in tests. The noise never leaves the client except inside its masked input.
    """

    epsilon: float
    delta: float = 1e-6
    honest_fraction: float = DEFAULT_HONEST_FRACTION
    colluders: int = 0
    rng: Callable[[], np.random.Generator] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        """Validate the parameters."""
        if not math.isfinite(self.epsilon) or self.epsilon <= 0:
            raise ValueError(f"epsilon must be finite and > 0, got {self.epsilon}")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {self.delta}")
        if not 0 < self.honest_fraction <= 1:
            raise ValueError(f"honest_fraction must be in (0, 1], got {self.honest_fraction}")
        if isinstance(self.colluders, bool) or not isinstance(self.colluders, int) or self.colluders < 0:
            raise ValueError(f"colluders must be an int >= 0, got {self.colluders!r}")

    @property
    def target_variance(self) -> float:
        """Aggregate per-class variance the honest survivors' noise must reach."""
        return skellam_variance_for(self.epsilon, self.delta)

    def honest_clients(self, roster_size: int) -> int:
        """``min(ceil(honest_fraction * roster_size), roster_size - colluders)``: the honest survivors the
        calibration counts on.

        Raises
        ------
        ValueError
            Naming ``pass-colluders``, if the roster holds fewer than :data:`MIN_HONEST_CLIENTS` clients beside
            the assumed colluders.
        """
        if roster_size < 1:
            raise ValueError(f"roster_size must be >= 1, got {roster_size}")
        assumed = max(1, math.ceil(self.honest_fraction * roster_size - 1e-9))
        if self.colluders == 0:
            return assumed
        honest = roster_size - self.colluders
        if honest < MIN_HONEST_CLIENTS:
            raise ValueError(
                f"a roster of {roster_size} with {self.colluders} colluders assumed (node config pass-colluders) "
                f"leaves {max(honest, 0)} honest client(s), fewer than {MIN_HONEST_CLIENTS}: the sum less the "
                "colluders' counts would be one client's own: refused"
            )
        return min(assumed, honest)

    def client_variance(self, roster_size: int) -> float:
        """Variance each client adds per class when it sees a roster of ``roster_size``."""
        return self.target_variance / self.honest_clients(roster_size)

    def assumed_colluders(self, roster_size: int) -> int:
        """The colluders a roster of ``roster_size`` may hold for the calibration to hold: ``roster_size - h``."""
        return roster_size - self.honest_clients(roster_size)

    def release_variance(self, roster_size: int, survivors: int) -> float:
        """The honest noise's aggregate per-class variance, at least, in a sum over ``survivors`` clients (``|U3|``)
        of a roster of ``roster_size`` (``|U1|``): ``client_variance(roster_size) * (survivors - assumed_colluders)``.

        The target when everyone survives; ``0`` when the survivors could all be colluders (no noise for certain).
        """
        if not 0 <= survivors <= roster_size:
            raise ValueError(f"survivors must be in [0, roster_size = {roster_size}], got {survivors}")
        honest = max(survivors - self.assumed_colluders(roster_size), 0)
        return self.client_variance(roster_size) * honest

    def tail_bound(self) -> int:
        """Largest noise in one class of ``N_s`` accepted by a bound check: ``TAIL_SDS`` standard deviations.

        The sum over all survivors has variance at most ``target * max(1 / honest_fraction, (colluders + 2) / 2)``:
        at most ``n`` survivors each add ``target / h``, and ``n / h`` is at most ``1 / honest_fraction``, or
        ``n / (n - colluders)``, largest at the smallest roster accepted, ``n = colluders + 2``.
        """
        ratio = max(1.0 / self.honest_fraction, (self.colluders + MIN_HONEST_CLIENTS) / MIN_HONEST_CLIENTS)
        return math.ceil(TAIL_SDS * math.sqrt(self.target_variance * ratio)) + 1

    def sample(self, num_classes: int, roster_size: int) -> npt.NDArray[np.int64]:
        """One client's noise vector: ``num_classes`` draws of ``Poisson(v/2) - Poisson(v/2)``."""
        half = self.client_variance(roster_size) / 2.0
        generator = (self.rng or os_generator)()
        return generator.poisson(half, num_classes).astype(np.int64) - generator.poisson(half, num_classes).astype(
            np.int64
        )

    def epsilon_after(self, releases: int) -> float:
        """``epsilon`` at :attr:`delta` after ``releases`` markets over the same records (RDP composition)."""
        return skellam_epsilon(self.target_variance, self.delta, releases)
