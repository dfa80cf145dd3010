"""Label-based federated partitions (the paper's set-up): an imbalanced global distribution, then Dirichlet.

:func:`global_distribution_indices` prunes the data set to ``d1`` (balanced) ... ``d7`` (most imbalanced),
:func:`dirichlet_split` spreads each class over the ``E`` clients, and :func:`make_partition` chains both
into a :class:`Partition` (per-client indices and the ``(E, C)`` label counts the market uses). The levels
are nested and every draw is seeded; the schedules are in :func:`global_distribution_indices`, the redraw
rule in :func:`dirichlet_split`, the seeds in :func:`make_partition`.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import isfinite
from typing import Final

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_MIN_SAMPLES_PER_CLIENT",
    "DEFAULT_SCHEDULE",
    "DISTRIBUTIONS",
    "LINEAR_MIN_KEEP_RATIO",
    "MIN_KEEP_RATIO",
    "SCHEDULES",
    "Partition",
    "as_label_array",
    "dirichlet_split",
    "global_distribution_indices",
    "keep_fractions",
    "make_partition",
]

MIN_KEEP_RATIO: Final[dict[str, float]] = {
    "d1": 1.0,
    "d2": 0.5,
    "d3": 0.25,
    "d4": 0.1,
    "d5": 0.05,
    "d6": 0.02,
    "d7": 0.01,
}
"""Minimum keep ratio ``rho_d`` per global distribution: the fraction of the balanced
per-class size kept by the most pruned class. Equal to the inverse of the
largest/smallest class ratio (up to rounding)."""

LINEAR_MIN_KEEP_RATIO: Final[dict[str, float]] = {
    "d1": 1.0,
    "d2": 0.82,
    "d3": 0.64,
    "d4": 0.46,
    "d5": 0.28,
    "d6": 0.10,
    "d7": 0.05,
}
"""Kept fraction of the smallest class per level under the linear schedule (equal steps
from 1 at ``d1`` to 0.1 at ``d6``, the paper's Table 2 tail; ``d7`` halves it again)."""

SCHEDULES: Final[tuple[str, ...]] = ("geometric", "linear")
"""Names of the pruning schedules (see :func:`global_distribution_indices`)."""

DEFAULT_SCHEDULE: Final[str] = "geometric"
"""The schedule used unless another is asked for."""

DISTRIBUTIONS: Final[tuple[str, ...]] = tuple(MIN_KEEP_RATIO)
"""Names of the global distributions, from balanced (``d1``) to most imbalanced."""

DEFAULT_ALPHA: Final[float] = 0.5
"""Dirichlet concentration used in the paper."""

DEFAULT_MIN_SAMPLES_PER_CLIENT: Final[int] = 1
"""Default smallest client size accepted by :func:`dirichlet_split`."""

DEFAULT_MAX_ATTEMPTS: Final[int] = 10_000
"""Default bound on the Dirichlet redraws made to meet the minimum client size."""

_PRUNE_STREAM: Final[int] = 0x5052554E  # "PRUN"
_SPLIT_STREAM: Final[int] = 0x53504C54  # "SPLT"

IndexArray = NDArray[np.int64]


@dataclass(frozen=True, eq=False)
class Partition:
    """A federated partition of a labelled data set.

    Attributes
    ----------
    client_indices : list of numpy.ndarray
        One sorted ``int64`` array per client with the indices (into the label array
        the partition was made from) of the samples it holds. Disjoint.
    label_counts : numpy.ndarray
        ``(E, C)`` ``int64`` matrix; row ``e`` is client ``e``'s per-class count
        ``N_e``.
    num_classes : int
        Number of classes ``C``.
    distribution : str
        Global distribution name (``"d1"`` ... ``"d7"``).
    alpha : float
        Dirichlet concentration of the split.
    seed : int
        Seed the partition was drawn with.
    schedule : str
        Pruning schedule of the global distribution (``"geometric"`` or ``"linear"``).
    """

    client_indices: list[IndexArray]
    label_counts: NDArray[np.int64]
    num_classes: int
    distribution: str
    alpha: float
    seed: int
    schedule: str = DEFAULT_SCHEDULE

    @property
    def num_clients(self) -> int:
        """Number of clients ``E``."""
        return len(self.client_indices)

    @property
    def client_sizes(self) -> NDArray[np.int64]:
        """Number of samples per client, shape ``(E,)``."""
        return self.label_counts.sum(axis=1)

    @property
    def global_counts(self) -> NDArray[np.int64]:
        """Global per-class counts ``N_s`` (sum of the clients' counts), shape ``(C,)``."""
        return self.label_counts.sum(axis=0)


def as_label_array(labels: ArrayLike, num_classes: int | None = None) -> tuple[NDArray[np.int64], int]:
    """Validate a label array and return it as ``int64`` with its class count.

    Parameters
    ----------
    labels : array_like
        1-D array of non-negative integer class labels.
    num_classes : int, optional
        Number of classes ``C``; inferred as ``max(labels) + 1`` when omitted.

    Returns
    -------
    tuple of (numpy.ndarray, int)
        The labels as a 1-D ``int64`` array and the number of classes.

    Raises
    ------
    ValueError
        If the labels are empty, not 1-D, not integers, negative, or not below
        ``num_classes``, or if ``num_classes`` is not a positive integer.
    """
    array = np.asarray(labels)
    if array.ndim != 1:
        raise ValueError(f"labels must be a 1-D array, got shape {array.shape}")
    if array.size == 0:
        raise ValueError("labels must not be empty")
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"labels must be integers, got dtype {array.dtype}")
    array = array.astype(np.int64, copy=False)
    smallest = int(array.min())
    if smallest < 0:
        raise ValueError(f"labels must be non-negative, got {smallest}")
    largest = int(array.max())
    if num_classes is None:
        return array, largest + 1
    _check_positive_int("num_classes", num_classes)
    if largest >= num_classes:
        raise ValueError(f"labels must be below num_classes={num_classes}, got label {largest}")
    return array, int(num_classes)


def keep_fractions(distribution: str, num_ranked: int, schedule: str = DEFAULT_SCHEDULE) -> NDArray[np.float64]:
    """Fraction of the balanced class size kept at each rank, for one distribution.

    Parameters
    ----------
    distribution : str
        Global distribution name, ``"d1"`` ... ``"d7"`` (case-insensitive).
    num_ranked : int
        Number of ranked classes.
    schedule : str, default "geometric"
        ``"geometric"`` or ``"linear"`` (see :func:`global_distribution_indices`).

    Returns
    -------
    numpy.ndarray
        Geometric: ``keep[r] = rho_d ** (r / (num_ranked - 1))``; linear:
        ``keep[r] = 1 - (1 - rho_d) * r / (num_ranked - 1)``, for ``r = 0 .. num_ranked - 1``
        (``[1.0]`` for a single class): 1 at rank 0, ``rho_d`` of the schedule at the last rank.
    """
    name = _normalise_distribution(distribution)
    kind = _normalise_schedule(schedule)
    _check_positive_int("num_ranked", num_ranked)
    if num_ranked == 1:
        return np.ones(1)
    steps = np.arange(num_ranked) / (num_ranked - 1)
    if kind == "linear":
        return 1.0 - (1.0 - LINEAR_MIN_KEEP_RATIO[name]) * steps
    return MIN_KEEP_RATIO[name] ** steps


def global_distribution_indices(
    labels: ArrayLike,
    distribution: str,
    seed: int,
    num_classes: int | None = None,
    schedule: str = DEFAULT_SCHEDULE,
) -> IndexArray:
    """Indices kept by pruning the data set to a global distribution.

    The schedule is in the notes below. Classes absent from ``labels`` stay
    absent; the others are balanced to the smallest present class, then pruned.

    Parameters
    ----------
    labels : array_like
        1-D array of non-negative integer class labels.
    distribution : str
        ``"d1"`` (balanced) ... ``"d7"`` (most imbalanced), case-insensitive.
    seed : int
        Non-negative seed of the class ranking and of the kept samples.
    num_classes : int, optional
        Number of classes; inferred as ``max(labels) + 1`` when omitted.
    schedule : str, default "geometric"
        Pruning schedule, ``"geometric"`` or ``"linear"``.

    Returns
    -------
    numpy.ndarray
        Sorted ``int64`` indices into ``labels`` of the kept samples.

    Raises
    ------
    ValueError
        On an unknown distribution, invalid labels or an invalid seed.

    Notes
    -----
    The paper only says classes are "randomly pruned", incrementally from D2 to D6; the schedule is fixed here:

    * every class is first cut down to the size ``m`` of the smallest present class, so ``d1`` is exactly
      balanced even when the raw data is not;
    * the ``C`` classes are ranked by a permutation drawn from ``seed``. Geometric schedule (the default): the
      class at rank ``r`` keeps ``round(m * rho_d ** (r / (C - 1)))`` samples, at least 1, with ``rho_d`` the
      level's minimum keep ratio (:data:`MIN_KEEP_RATIO`; largest/smallest class ratio 1, 2, 4, 10, 20, 50 and
      100 for ``d1`` ... ``d7``). Linear schedule (``schedule="linear"``): the class at rank ``r`` keeps
      ``1 - (1 - rho_d) * r / (C - 1)`` of ``m``, with ``rho_d`` (:data:`LINEAR_MIN_KEEP_RATIO`) falling in
      equal steps from 1 at ``d1`` to 0.1 at ``d6`` (``d7``: 0.05), the tail of the paper's Table 2;
    * which samples of a class are kept is a seeded random choice. The ranking and the order in which each
      class's samples are dropped depend on ``seed`` only, not on the level, so the levels are nested: for one
      seed, the samples kept at ``d{k+1}`` are a subset of those kept at ``d{k}``.
    """
    name = _normalise_distribution(distribution)
    array, _ = as_label_array(labels, num_classes)
    _check_seed(seed)
    rng = np.random.default_rng([seed, _PRUNE_STREAM])
    per_class = _shuffled_class_indices(array, rng)
    present = sorted(per_class)
    balanced_size = min(len(per_class[label]) for label in present)
    rank_order = rng.permutation(len(present))
    fractions = keep_fractions(name, len(present), schedule)
    kept = [
        per_class[present[class_pos]][: _kept_count(balanced_size, fractions[rank])]
        for rank, class_pos in enumerate(rank_order)
    ]
    return np.sort(np.concatenate(kept))


def dirichlet_split(
    labels: ArrayLike,
    indices: ArrayLike,
    num_clients: int,
    alpha: float = DEFAULT_ALPHA,
    seed: int = 0,
    min_samples_per_client: int = DEFAULT_MIN_SAMPLES_PER_CLIENT,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
) -> list[IndexArray]:
    """Split the samples at ``indices`` over clients, class by class, with Dirichlet draws.

    For each class, ``p ~ Dir(alpha * 1_E)`` and the class's shuffled indices are cut
    at ``floor(cumsum(p) * n_c)``. All proportions are redrawn while some client holds
    fewer than ``min_samples_per_client`` samples, at most ``max_attempts`` times.

    Parameters
    ----------
    labels : array_like
        1-D array of non-negative integer class labels of the whole data set.
    indices : array_like
        Distinct indices into ``labels`` of the samples to split (e.g. the output of
        :func:`global_distribution_indices`).
    num_clients : int
        Number of clients ``E`` (at least 1).
    alpha : float, default 0.5
        Dirichlet concentration (positive, finite). Small values give very non-IID
        clients; large values approach an IID split.
    seed : int, default 0
        Non-negative seed.
    min_samples_per_client : int, default 1
        Smallest accepted client size (0 accepts empty clients).
    max_attempts : int, default 10000
        Largest number of Dirichlet draws tried before giving up.

    Returns
    -------
    list of numpy.ndarray
        ``num_clients`` disjoint, sorted ``int64`` index arrays whose union is
        ``indices``.

    Raises
    ------
    ValueError
        On invalid arguments, when fewer than ``num_clients * min_samples_per_client``
        samples are given, or when no draw met the minimum within ``max_attempts``.

    Notes
    -----
    This is the rule of Flower's ``DirichletPartitioner`` without its ``self_balancing``, on any 1-D integer
    label array. The redraws condition the split on the minimum: free for large pools, but a tiny pool over
    many clients needs many attempts, hence the generous default of ``max_attempts``. Pass
    ``min_samples_per_client=0`` to accept empty clients and keep the plain Dirichlet statistics.
    """
    array, _ = as_label_array(labels)
    subset = _as_index_array(indices, len(array))
    _check_positive_int("num_clients", num_clients)
    _check_alpha(alpha)
    _check_seed(seed)
    _check_non_negative_int("min_samples_per_client", min_samples_per_client)
    _check_positive_int("max_attempts", max_attempts)
    if subset.size < num_clients * min_samples_per_client:
        raise ValueError(
            f"cannot give {num_clients} clients at least {min_samples_per_client} "
            f"samples each from only {subset.size} samples"
        )
    rng = np.random.default_rng([seed, _SPLIT_STREAM])
    per_class = _shuffled_class_indices(array[subset], rng)
    class_members = [subset[per_class[label]] for label in sorted(per_class)]
    class_sizes = np.array([len(members) for members in class_members], dtype=np.int64)
    counts = _draw_counts(rng, class_sizes, num_clients, alpha, min_samples_per_client, max_attempts)
    return _assemble_clients(class_members, counts, len(array))


def make_partition(
    labels: ArrayLike,
    num_clients: int,
    distribution: str = "d1",
    alpha: float = DEFAULT_ALPHA,
    seed: int = 0,
    num_classes: int | None = None,
    min_samples_per_client: int = DEFAULT_MIN_SAMPLES_PER_CLIENT,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    schedule: str = DEFAULT_SCHEDULE,
) -> Partition:
    """Make the paper's two-step partition: global distribution, then Dirichlet split.

    Parameters
    ----------
    labels : array_like
        1-D array of non-negative integer class labels (the training pool).
    num_clients : int
        Number of clients ``E``.
    distribution : str, default "d1"
        Global distribution, ``"d1"`` ... ``"d7"`` (case-insensitive).
    alpha : float, default 0.5
        Dirichlet concentration.
    seed : int, default 0
        Non-negative seed; the pruning and the split use separate streams of it.
    num_classes : int, optional
        Number of classes ``C``; inferred as ``max(labels) + 1`` when omitted.
    min_samples_per_client : int, default 1
        Smallest accepted client size, see :func:`dirichlet_split`.
    max_attempts : int, default 10000
        Bound on the Dirichlet redraws, see :func:`dirichlet_split`.
    schedule : str, default "geometric"
        Pruning schedule of the global distribution, ``"geometric"`` or ``"linear"``.

    Returns
    -------
    Partition
        Client indices and the ``(E, C)`` label-count matrix.

    Raises
    ------
    ValueError
        On invalid arguments or an unsatisfiable minimum client size.

    Notes
    -----
    All randomness comes from :func:`numpy.random.default_rng` seeded with ``[seed, stream]``, one stream for
    pruning and one for the split, so changing ``alpha`` or the number of clients never changes which samples
    the global distribution keeps. Same arguments (and numpy version), same partition.
    """
    array, classes = as_label_array(labels, num_classes)
    name = _normalise_distribution(distribution)
    kept = global_distribution_indices(array, name, seed, classes, schedule)
    clients = dirichlet_split(
        array,
        kept,
        num_clients,
        alpha=alpha,
        seed=seed,
        min_samples_per_client=min_samples_per_client,
        max_attempts=max_attempts,
    )
    return Partition(
        client_indices=clients,
        label_counts=_label_count_matrix(array, clients, classes),
        num_classes=classes,
        distribution=name,
        alpha=float(alpha),
        seed=int(seed),
        schedule=_normalise_schedule(schedule),
    )


def _normalise_distribution(distribution: str) -> str:
    """Return the lower-case distribution name, or raise on an unknown one."""
    name = distribution.lower() if isinstance(distribution, str) else distribution
    if name not in MIN_KEEP_RATIO:
        raise ValueError(f"unknown distribution {distribution!r}; expected one of {', '.join(DISTRIBUTIONS)}")
    return name


def _normalise_schedule(schedule: str) -> str:
    """Return the lower-case schedule name, or raise on an unknown one."""
    name = schedule.lower() if isinstance(schedule, str) else schedule
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; expected one of {', '.join(SCHEDULES)}")
    return name


def _kept_count(balanced_size: int, fraction: float) -> int:
    """Samples a class keeps: ``fraction`` of the balanced size, rounded, at least 1."""
    return max(1, int(np.floor(balanced_size * fraction + 0.5)))


def _shuffled_class_indices(labels: NDArray[np.int64], rng: np.random.Generator) -> dict[int, IndexArray]:
    """Map each present class to a random permutation of its positions in ``labels``.

    The permutations are drawn in ascending class order, so the result depends only on
    ``labels`` and the generator state.
    """
    class_sizes = np.bincount(labels)
    compact = labels.astype(np.min_scalar_type(len(class_sizes)), copy=False)  # radix sort for small types
    groups = np.split(np.argsort(compact, kind="stable"), np.cumsum(class_sizes)[:-1])
    return {int(label): rng.permutation(groups[label]) for label in np.flatnonzero(class_sizes)}


def _draw_counts(
    rng: np.random.Generator,
    class_sizes: NDArray[np.int64],
    num_clients: int,
    alpha: float,
    min_samples_per_client: int,
    max_attempts: int,
) -> NDArray[np.int64]:
    """Draw a ``(classes, clients)`` count matrix meeting the minimum client size."""
    concentration = np.full(num_clients, float(alpha))
    for _ in range(max_attempts):
        proportions = rng.dirichlet(concentration, size=len(class_sizes))
        counts = _counts_from_proportions(proportions, class_sizes)
        if counts.sum(axis=0).min() >= min_samples_per_client:
            return counts
    raise ValueError(
        f"no Dirichlet(alpha={alpha}) draw gave each of the {num_clients} clients at least "
        f"{min_samples_per_client} samples ({int(class_sizes.sum())} samples in all) in "
        f"{max_attempts} attempts; lower min_samples_per_client, raise alpha, use fewer "
        "clients or more data"
    )


def _counts_from_proportions(proportions: NDArray[np.float64], class_sizes: NDArray[np.int64]) -> NDArray[np.int64]:
    """Cut each class at ``floor(cumsum(p) * n_c)`` and return the per-client counts."""
    cumulative = np.cumsum(proportions, axis=1)[:, :-1]
    cuts = np.floor(cumulative * class_sizes[:, None]).astype(np.int64)
    cuts = np.minimum(cuts, class_sizes[:, None])
    zeros = np.zeros((len(class_sizes), 1), dtype=np.int64)
    bounds = np.concatenate([zeros, cuts, class_sizes[:, None]], axis=1)
    return np.diff(bounds, axis=1)


def _assemble_clients(class_members: list[IndexArray], counts: NDArray[np.int64], length: int) -> list[IndexArray]:
    """Turn per-class shuffled members and a count matrix into sorted client arrays.

    Member ``j`` of class ``k`` goes to the client whose cumulative count range in row
    ``k`` of ``counts`` contains ``j``. The grouping is a stable sort by owner of the
    members in index order, so each client's array comes out sorted.
    """
    num_clients = counts.shape[1]
    if not class_members:
        return [np.empty(0, dtype=np.int64) for _ in range(num_clients)]
    members = np.concatenate(class_members)
    owner_of = np.empty(length, dtype=np.min_scalar_type(num_clients))
    owner_of[members] = np.concatenate([np.repeat(np.arange(num_clients), row) for row in counts])
    ordered = np.sort(members)
    grouped = ordered[np.argsort(owner_of[ordered], kind="stable")]
    return np.split(grouped, np.cumsum(counts.sum(axis=0))[:-1])


def _label_count_matrix(labels: NDArray[np.int64], clients: list[IndexArray], num_classes: int) -> NDArray[np.int64]:
    """``(E, C)`` matrix of per-client class counts."""
    owners = np.repeat(np.arange(len(clients)), [len(client) for client in clients])
    flat = owners * num_classes + labels[np.concatenate(clients)]
    counts = np.bincount(flat, minlength=len(clients) * num_classes)
    return counts.reshape(len(clients), num_classes).astype(np.int64)


def _as_index_array(indices: ArrayLike, length: int) -> IndexArray:
    """Validate distinct integer indices into an array of ``length`` elements."""
    array = np.asarray(indices)
    if array.ndim != 1:
        raise ValueError(f"indices must be a 1-D array, got shape {array.shape}")
    if array.size == 0:
        return np.empty(0, dtype=np.int64)
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"indices must be integers, got dtype {array.dtype}")
    array = array.astype(np.int64, copy=False)
    if int(array.min()) < 0 or int(array.max()) >= length:
        raise ValueError(f"indices must lie in [0, {length}), got values in [{array.min()}, {array.max()}]")
    if np.bincount(array, minlength=length).max() > 1:
        raise ValueError("indices must be distinct (a sample cannot go to two clients)")
    return array


def _check_positive_int(name: str, value: int) -> None:
    """Raise ``ValueError`` unless ``value`` is an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def _check_non_negative_int(name: str, value: int) -> None:
    """Raise ``ValueError`` unless ``value`` is an integer >= 0."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")


def _check_seed(seed: int) -> None:
    """Raise ``ValueError`` unless ``seed`` is a non-negative integer."""
    _check_non_negative_int("seed", seed)


def _check_alpha(alpha: float) -> None:
    """Raise ``ValueError`` unless ``alpha`` is a positive, finite number."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.integer, np.floating)):
        raise ValueError(f"alpha must be a positive finite number, got {alpha!r}")
    if not isfinite(float(alpha)) or alpha <= 0:
        raise ValueError(f"alpha must be a positive finite number, got {alpha!r}")
