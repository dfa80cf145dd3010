"""Pre-training client selectors: FLMarket and the baselines of the paper's section 5 (RS, QBS, DICE, DDS).

Every selector sees only the ``(E, C)`` label counts (plus bids or embeddings where a method needs them),
shares one signature and is deterministic given its inputs and ``seed``; ``SELECTORS`` maps names to
functions and :func:`select_clients` runs one by name (its docstring gives the contract and each method).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flmarket_flwr.pricing.auction import cohort_budget, run_auction
from flmarket_flwr.pricing.score import score

__all__ = [
    "DDS_DIVERSITY_WEIGHT",
    "DICE_VOLUME_WEIGHT",
    "SELECTORS",
    "dds_homogeneity",
    "dice_quality",
    "flmarket_scores",
    "select_clients",
    "select_dds",
    "select_dice",
    "select_flmarket",
    "select_qbs",
    "select_rs",
    "select_within_budget",
]

# Default weight of the volume term in DICE's quality (the std term gets 1 - this).
DICE_VOLUME_WEIGHT = 0.5
# Default weight lambda of the diversity term in DDS's greedy objective.
DDS_DIVERSITY_WEIGHT = 1.0

# Keywords that some selector understands; the others accept and ignore them.
_SELECTOR_KEYWORDS = frozenset({"bids", "budget", "volume_weight", "embeddings", "diversity_weight"})


# ----------------------------------------------------------------------------- validation


def _label_counts(values: ArrayLike) -> NDArray[np.int64]:
    """Validate an ``(E, C)`` matrix of non-negative integer counts and return it as int64."""
    array = np.asarray(values)
    if array.dtype == np.bool_ or not (
        np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)
    ):
        raise TypeError(f"label_counts must hold integer counts, got dtype {array.dtype}")
    if array.ndim != 2:
        raise ValueError(f"label_counts must be 2-D with shape (E, C), got shape {array.shape}")
    if array.shape[0] == 0 or array.shape[1] == 0:
        raise ValueError(f"label_counts needs at least one client and one class, got shape {array.shape}")
    if np.issubdtype(array.dtype, np.floating):
        if not np.all(np.isfinite(array)):
            raise ValueError("label_counts contains NaN or infinite values")
        if np.any(array != np.floor(array)):
            raise ValueError("label_counts contains non-integer counts")
    if array.min() < 0:
        rows = np.flatnonzero((array < 0).any(axis=1))[:10].tolist()
        raise ValueError(f"label_counts contains negative counts (clients {rows})")
    return array.astype(np.int64, copy=False)


def _num_selected(num_selected: int, num_clients: int) -> int:
    """Validate ``1 <= num_selected <= E``."""
    if isinstance(num_selected, bool) or not isinstance(num_selected, (int, np.integer)):
        raise TypeError(f"num_selected must be an int, got {type(num_selected).__name__}")
    if not 1 <= num_selected <= num_clients:
        raise ValueError(
            f"num_selected must be between 1 and the number of clients E={num_clients}, got {num_selected}"
        )
    return int(num_selected)


def _seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    return int(seed)


def _check_extra(extra: dict[str, Any]) -> None:
    """Reject keywords that no selector understands (a typo would otherwise pass silently)."""
    unknown = sorted(set(extra) - _SELECTOR_KEYWORDS)
    if unknown:
        raise TypeError(f"unknown selector keyword(s) {unknown}; known: {sorted(_SELECTOR_KEYWORDS)}")


def _prepare(
    label_counts: ArrayLike, num_selected: int, seed: int, extra: dict[str, Any]
) -> tuple[NDArray[np.int64], int]:
    counts = _label_counts(label_counts)
    _check_extra(extra)
    _seed(seed)
    return counts, _num_selected(num_selected, counts.shape[0])


def _weight(value: float, name: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float, np.integer, np.floating))
        or not np.isfinite(value)
    ):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _rank_descending(values: NDArray[np.float64], has_data: NDArray[np.bool_]) -> NDArray[np.intp]:
    """Positions sorted by ``values`` descending, clients without data last, ties by lower position."""
    positions = np.arange(values.size)
    return np.lexsort((positions, -values, ~has_data)).astype(np.intp)


# ----------------------------------------------------------------------------- FLMarket


def flmarket_scores(label_counts: ArrayLike) -> NDArray[np.float64]:
    """Every client's data value score against the pool's global counts, as PASS would aggregate them.

    .. math:: u_e = \\mathrm{score}(n_e, n_s, E), \\qquad n_s^c = \\sum_{e=1}^{E} n_e^c.

    Parameters
    ----------
    label_counts : ArrayLike
        Per-class counts, shape ``(E, C)``.

    Returns
    -------
    NDArray[np.float64]
        ``(E,)`` scores.

    Raises
    ------
    ValueError
        All-zero label counts: no global distribution to score against (the market phase stops there too).
    """
    counts = _label_counts(label_counts)
    return np.atleast_1d(score(counts, counts.sum(axis=0), counts.shape[0])).astype(np.float64)


def select_flmarket(
    label_counts: ArrayLike,
    num_selected: int,
    *,
    seed: int = 0,
    bids: ArrayLike | None = None,
    budget: float | None = None,
    **extra: Any,
) -> NDArray[np.intp]:
    """FLMarket: data value scores (:func:`flmarket_scores`) and the product's auction with a cohort cap.

    The winners are exactly those of :func:`~flmarket_flwr.pricing.auction.run_auction` with
    ``num_winners=num_selected``, the rule the market phase applies: clients ranked by ``u_e / b_e``,
    the budget rule, at most ``num_selected`` winners. Zero-score clients never win, so with fewer
    positive-score clients than ``num_selected`` (or a budget that binds) the cohort is smaller:
    the comparison records what the market would really buy, never a filled-up cohort.

    Parameters
    ----------
    label_counts : ArrayLike
        Per-class counts, shape ``(E, C)``.
    num_selected : int
        Cohort cap ``1 <= n <= E``.
    seed : int
        Unused (the auction is deterministic); accepted for the common interface.
    bids : ArrayLike
        Required: one bid ``b_e > 0`` per client.
    budget : float, optional
        Budget ``R``. Default: :func:`~flmarket_flwr.pricing.auction.cohort_budget`, the least budget
        that buys the cohort (of the positive-score clients, if fewer than ``num_selected``).

    Returns
    -------
    NDArray[np.intp]
        At most ``num_selected`` positions, in selection order.

    Raises
    ------
    ValueError
        No bids, or a number of bids different from ``E``; invalid bids or budget (see ``run_auction``).
    """
    counts, count = _prepare(label_counts, num_selected, seed, extra)
    num_clients = counts.shape[0]
    if bids is None:
        raise ValueError("select_flmarket needs bids=: one bid per client (the auction ranks by score per bid)")
    bid_array = np.asarray(bids, dtype=np.float64)
    if bid_array.ndim != 1 or bid_array.size != num_clients:
        raise ValueError(f"bids must have shape ({num_clients},), one per client, got shape {bid_array.shape}")
    scores = flmarket_scores(counts)
    if budget is None:
        buyable = min(count, int(np.count_nonzero(scores > 0)))
        if buyable == 0:
            return np.zeros(0, dtype=np.intp)
        budget = cohort_budget(scores, bid_array, buyable)
    return run_auction(scores, bid_array, budget=budget, num_winners=count).winners.astype(np.intp)


# ----------------------------------------------------------------------------- RS and QBS


def select_rs(label_counts: ArrayLike, num_selected: int, *, seed: int = 0, **extra: Any) -> NDArray[np.intp]:
    """Random selection (RS): a uniformly random subset, in random order.

    Every ``num_selected``-subset is equally likely; the draw is
    ``numpy.random.default_rng(seed).choice(E, num_selected, replace=False)``.

    Parameters
    ----------
    label_counts : ArrayLike
        Per-class counts, shape ``(E, C)`` (only ``E`` is used).
    num_selected : int
        Cohort size ``1 <= n <= E``.
    seed : int
        Seed of the numpy generator (``>= 0``).

    Returns
    -------
    NDArray[np.intp]
        ``num_selected`` distinct positions.
    """
    counts, count = _prepare(label_counts, num_selected, seed, extra)
    generator = np.random.default_rng(_seed(seed))
    return generator.choice(counts.shape[0], size=count, replace=False).astype(np.intp)


def select_qbs(label_counts: ArrayLike, num_selected: int, *, seed: int = 0, **extra: Any) -> NDArray[np.intp]:
    """Quantity-based selection (QBS; Zeng et al. 2020, FMore): largest data volume first.

    Clients are ranked by ``N_e = sum_c n_e^c`` descending; ties go to the lower position.

    Parameters
    ----------
    label_counts : ArrayLike
        Per-class counts, shape ``(E, C)``.
    num_selected : int
        Cohort size ``1 <= n <= E``.
    seed : int
        Unused; accepted for the common interface.

    Returns
    -------
    NDArray[np.intp]
        The ``num_selected`` largest clients, largest first.
    """
    counts, count = _prepare(label_counts, num_selected, seed, extra)
    volumes = counts.sum(axis=1)
    positions = np.arange(volumes.size)
    return np.lexsort((positions, -volumes))[:count].astype(np.intp)


# ----------------------------------------------------------------------------- DICE


def _min_max(values: NDArray[np.float64]) -> NDArray[np.float64]:
    """``(x - min x) / (max x - min x)``; all zeros when every value is equal."""
    low, high = float(values.min()), float(values.max())
    if high <= low:
        return np.zeros_like(values)
    return (values - low) / (high - low)


def dice_quality(label_counts: ArrayLike, *, volume_weight: float = DICE_VOLUME_WEIGHT) -> NDArray[np.float64]:
    """DICE data quality of each client (a reconstruction: DICE has no public code).

    The FLMarket paper describes DICE's score as "defined in terms of the data volume ratio and
    the standard deviation of data volume in different categories". With the volume ratio
    ``r_e = N_e / N_s`` (``N_e = sum_c n_e^c``, ``N_s = sum_e N_e``) and the population standard
    deviation of the client's per-class volumes
    ``sigma_e = sqrt(1/C * sum_c (n_e^c - N_e / C)^2)``, the quality is the weighted sum of the
    two, min-max normalised over the candidate pool so that they share a scale:

    .. math::

        q_e = w \\, \\frac{r_e - \\min_k r_k}{\\max_k r_k - \\min_k r_k}
              + (1 - w) \\left(1 - \\frac{\\sigma_e - \\min_k \\sigma_k}{\\max_k \\sigma_k - \\min_k \\sigma_k}\\right),

    with ``w = 0.5`` by default (a normalised term is 0 when all clients tie on it; the minima
    and maxima run over the clients that hold data). Larger and more evenly spread clients score
    higher; the std is taken of raw counts, not proportions, as the description says.

    Why this form: it uses exactly the two quantities named, with no hidden constant besides
    ``w``; and it reproduces the paper's Table 5 (CIFAR-10, D6, 10 of 20): over the 14 clients
    printed there, the four FLMarket-specific clients (4, 8, 10, 12) rank below the ten that DICE
    picked. The paper's diagnosis of DICE (volume-driven, local rather than global class
    balance, no diminishing returns) holds for it by construction.

    Parameters
    ----------
    label_counts : ArrayLike
        Per-class counts, shape ``(E, C)``.
    volume_weight : float
        ``w`` in ``[0, 1]``.

    Returns
    -------
    NDArray[np.float64]
        ``q_e`` in ``[0, 1]``, shape ``(E,)``; ``-inf`` for clients that hold no data.
    """
    counts = _label_counts(label_counts)
    weight = _weight(volume_weight, "volume_weight")
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"volume_weight must lie in [0, 1], got {weight}")
    volumes = counts.sum(axis=1)
    has_data = volumes > 0
    quality = np.full(counts.shape[0], -np.inf)
    if not has_data.any():
        return quality
    ratio = volumes[has_data] / volumes.sum()
    spread = counts[has_data].astype(np.float64).std(axis=1)
    quality[has_data] = weight * _min_max(ratio) + (1.0 - weight) * (1.0 - _min_max(spread))
    return quality


def select_dice(
    label_counts: ArrayLike,
    num_selected: int,
    *,
    seed: int = 0,
    volume_weight: float = DICE_VOLUME_WEIGHT,
    **extra: Any,
) -> NDArray[np.intp]:
    """DICE (Saha et al. 2022): highest data quality first (a reconstruction, see :func:`dice_quality`).

    Clients are ranked by ``q_e`` descending; ties go to the lower position and clients without
    data come last.

    Parameters
    ----------
    label_counts : ArrayLike
        Per-class counts, shape ``(E, C)``.
    num_selected : int
        Cohort size ``1 <= n <= E``.
    seed : int
        Unused; accepted for the common interface.
    volume_weight : float
        Weight ``w`` of the volume term (default 0.5).

    Returns
    -------
    NDArray[np.intp]
        ``num_selected`` positions, best first.
    """
    counts, count = _prepare(label_counts, num_selected, seed, extra)
    quality = dice_quality(counts, volume_weight=volume_weight)
    has_data = counts.sum(axis=1) > 0
    return _rank_descending(np.where(has_data, quality, 0.0), has_data)[:count]


# ----------------------------------------------------------------------------- DDS


def _label_distribution(counts: NDArray[np.int64]) -> NDArray[np.float64]:
    """Rows ``p_e = n_e / N_e``; all-zero rows for clients without data."""
    volumes = counts.sum(axis=1, keepdims=True)
    return np.divide(counts, volumes, out=np.zeros(counts.shape), where=volumes > 0)


def dds_homogeneity(label_counts: ArrayLike) -> NDArray[np.float64]:
    """DDS statistical homogeneity: closeness of a client's labels to uniform (a reconstruction).

    With ``p_e^c = n_e^c / N_e`` and the total variation distance to the uniform distribution,
    rescaled by its largest value ``1 - 1/C`` (a one-class client):

    .. math::

        h_e = 1 - \\frac{\\tfrac12 \\sum_{c=1}^{C} |p_e^c - 1/C|}{1 - 1/C} \\in [0, 1],

    1 for a perfectly balanced client, 0 for a one-class client (``h_e = 1`` when ``C = 1``).

    Parameters
    ----------
    label_counts : ArrayLike
        Per-class counts, shape ``(E, C)``.

    Returns
    -------
    NDArray[np.float64]
        ``h_e``, shape ``(E,)``; ``0`` for clients that hold no data.
    """
    counts = _label_counts(label_counts)
    num_classes = counts.shape[1]
    has_data = counts.sum(axis=1) > 0
    if num_classes == 1:
        return has_data.astype(np.float64)
    distance = 0.5 * np.abs(_label_distribution(counts) - 1.0 / num_classes).sum(axis=1)
    homogeneity = 1.0 - distance / (1.0 - 1.0 / num_classes)
    return np.where(has_data, np.clip(homogeneity, 0.0, 1.0), 0.0)


def _embeddings(embeddings: ArrayLike | None, counts: NDArray[np.int64]) -> NDArray[np.float64]:
    if embeddings is None:
        return _label_distribution(counts)
    array = np.asarray(embeddings, dtype=np.float64)
    if array.ndim != 2:
        raise ValueError(f"embeddings must be 2-D with shape (E, D), got shape {array.shape}")
    if array.shape[0] != counts.shape[0]:
        raise ValueError(
            f"embeddings must have one row per client: {counts.shape[0]} clients, {array.shape[0]} embedding rows"
        )
    if not np.all(np.isfinite(array)):
        raise ValueError("embeddings contain NaN or infinite values")
    return array


def select_dds(
    label_counts: ArrayLike,
    num_selected: int,
    *,
    seed: int = 0,
    embeddings: ArrayLike | None = None,
    diversity_weight: float = DDS_DIVERSITY_WEIGHT,
    **extra: Any,
) -> NDArray[np.intp]:
    """Diversity-driven selection (DDS; Li et al. 2021), a reconstruction: no public code.

    The paper describes two criteria: statistical homogeneity (similarity of a client's label
    distribution to the uniform one) and content diversity (distance between clients' dataset
    embeddings), the selection favouring both. Reconstructed as a greedy max-min (MMR-style)
    selection. Homogeneity ``h_e`` is :func:`dds_homogeneity`; with ``z_e`` the embedding of
    client ``e`` and ``S`` the clients selected so far,

    .. math::

        \\delta_e(S) = \\min_{s \\in S} \\lVert z_e - z_s \\rVert_2, \\qquad
        \\hat\\delta_e(S) = \\frac{\\delta_e(S)}{\\max_{k \\notin S} \\delta_k(S)}, \\qquad
        e_{t+1} = \\arg\\max_{e \\notin S} \\; h_e + \\lambda \\, \\hat\\delta_e(S),

    starting from ``S = {}`` where the diversity term is 0 (the first pick is the most
    homogeneous client). Dividing by the largest remaining distance puts both terms in
    ``[0, 1]`` at every step, so ``lambda`` (default 1.0) does not depend on the scale of the
    embeddings (``hat delta = 0`` when every remaining client coincides with ``S``). Taking the
    minimum distance to the selected set rewards covering new regions and stops near-duplicates
    from being picked together. Ties go to the lower position; clients without data come last,
    by position.

    Parameters
    ----------
    label_counts : ArrayLike
        Per-class counts, shape ``(E, C)``.
    num_selected : int
        Cohort size ``1 <= n <= E``.
    seed : int
        Unused; accepted for the common interface.
    embeddings : ArrayLike, optional
        One vector per client, shape ``(E, D)`` (e.g. the mean feature vector of its data,
        computed elsewhere). Default: the normalised label distribution ``p_e``, so diversity is
        then Euclidean distance between label distributions.
    diversity_weight : float
        ``lambda >= 0``.

    Returns
    -------
    NDArray[np.intp]
        ``num_selected`` positions in greedy order.

    Raises
    ------
    ValueError
        Embeddings that are not 2-D, have a number of rows different from ``E`` or hold
        non-finite values; a negative ``diversity_weight``.
    """
    counts, count = _prepare(label_counts, num_selected, seed, extra)
    selected = _dds_greedy(counts, embeddings, diversity_weight, count)
    empty = np.flatnonzero(counts.sum(axis=1) == 0)
    return np.concatenate([np.asarray(selected, dtype=np.intp), empty])[:count].astype(np.intp)


def _dds_greedy(
    counts: NDArray[np.int64],
    embeddings: ArrayLike | None,
    diversity_weight: float,
    count: int,
    costs: NDArray[np.float64] | None = None,
    budget: float = math.inf,
) -> list[int]:
    """DDS's greedy max-min picks among the clients with data (see :func:`select_dds`), at most ``count``.

    With ``costs``, a client is a candidate at a step only while its cost fits in what is left of ``budget``:
    the greedy rule restricted to the affordable clients, so every pick is made against the clients really bought.
    """
    weight = _weight(diversity_weight, "diversity_weight")
    if weight < 0:
        raise ValueError(f"diversity_weight must be >= 0, got {weight}")
    vectors = _embeddings(embeddings, counts)
    homogeneity = dds_homogeneity(counts)
    candidates = np.flatnonzero(counts.sum(axis=1) > 0)
    prices = np.zeros(candidates.size) if costs is None else costs[candidates]

    selected: list[int] = []
    spent = 0.0
    nearest = np.full(candidates.size, np.inf)  # delta_e(S) of each candidate with data
    available = np.ones(candidates.size, dtype=bool)
    for _ in range(min(count, candidates.size)):
        available &= spent + prices <= budget
        if not available.any():
            break
        if selected:
            largest = float(nearest[available].max())
            diversity = nearest / largest if largest > 0 else np.zeros_like(nearest)
        else:
            diversity = np.zeros(candidates.size)
        objective = np.where(available, homogeneity[candidates] + weight * diversity, -np.inf)
        best = int(np.argmax(objective))  # argmax returns the first maximum: the lower position
        chosen = int(candidates[best])
        selected.append(chosen)
        spent += float(prices[best])
        available[best] = False
        distance = np.linalg.norm(vectors[candidates] - vectors[chosen], axis=1)
        nearest = np.minimum(nearest, distance)
    return selected


# ----------------------------------------------------------------------------- budget-matched purchase


def select_within_budget(
    name: str, label_counts: ArrayLike, bids: ArrayLike, budget: float, *, seed: int = 0, **extra: Any
) -> NDArray[np.intp]:
    """A baseline's purchase within the budget ``R`` at the clients' bids (pay-as-bid): the buyer's question.

    The baseline walks its own priority order (RS: a uniformly random order of all ``E`` clients,
    :func:`select_rs` of all ``E``; QBS and DICE: their rankings of all ``E``) and buys every client whose
    bid fits in what is left of ``R``, skipping one that does not; DDS makes its greedy pick at each step among the
    clients still affordable. Each bought client is paid its bid, so the bids bought sum to at most ``R``. None of
    the four methods has a payment rule of its own (they select, they do not price), hence pay-as-bid; it is not
    truthful (a client paid its bid gains by bidding above its cost), so at the same bids it is the most
    favourable case for the baseline: FLMarket, truthful, pays each winner its critical value, at least its bid.

    Parameters
    ----------
    name : str
        ``"rs"``, ``"qbs"``, ``"dice"`` or ``"dds"``.
    label_counts : ArrayLike
        Per-class counts, shape ``(E, C)``.
    bids : ArrayLike
        One bid ``b_e > 0`` per client, shape ``(E,)``.
    budget : float
        ``R > 0``.
    seed : int
        Seed (RS's order).
    **extra
        The selector's keywords (``volume_weight``, ``embeddings``, ``diversity_weight``).

    Returns
    -------
    NDArray[np.intp]
        The positions bought, in buying order; ``sum(bids[result]) <= budget``.

    Raises
    ------
    ValueError
        FLMarket (it buys by its auction), an unknown name, bids of the wrong shape or not finite and positive, a
        budget not finite and positive.
    """
    counts = _label_counts(label_counts)
    num_clients = counts.shape[0]
    key = name.lower()
    if key == "flmarket":
        raise ValueError("FLMarket buys by its own auction (run_auction), not by select_within_budget")
    if key not in SELECTORS:
        raise ValueError(f"unknown selector {name!r}; known: {sorted(SELECTORS)}")
    prices = np.asarray(bids, dtype=np.float64)
    if prices.shape != (num_clients,):
        raise ValueError(f"bids must have shape ({num_clients},), one per client, got shape {prices.shape}")
    if not np.all(np.isfinite(prices)) or np.any(prices <= 0):
        raise ValueError("bids must be finite and > 0")
    if isinstance(budget, bool) or not np.isfinite(budget) or budget <= 0:
        raise ValueError(f"budget must be finite and > 0, got {budget!r}")
    _check_extra(extra)
    if key == "dds":
        weight = extra.get("diversity_weight", DDS_DIVERSITY_WEIGHT)
        chosen = _dds_greedy(counts, extra.get("embeddings"), weight, num_clients, prices, float(budget))
        order = [int(e) for e in np.flatnonzero(counts.sum(axis=1) == 0)]  # then the clients without data
    else:
        chosen, order = [], [int(e) for e in select_clients(key, counts, num_clients, seed=seed, **extra)]
    spent = 0.0
    for position in chosen:
        spent += float(prices[position])
    for position in order:
        if spent + float(prices[position]) <= budget:
            chosen.append(position)
            spent += float(prices[position])
    return np.asarray(chosen, dtype=np.intp)


# ----------------------------------------------------------------------------- registry

Selector = Callable[..., NDArray[np.intp]]

SELECTORS: dict[str, Selector] = {
    "flmarket": select_flmarket,
    "rs": select_rs,
    "qbs": select_qbs,
    "dice": select_dice,
    "dds": select_dds,
}


def select_clients(
    name: str, label_counts: ArrayLike, num_selected: int, *, seed: int = 0, **extra: Any
) -> NDArray[np.intp]:
    """Run the selector called ``name`` (case-insensitive; see ``SELECTORS``).

    Parameters
    ----------
    name : str
        One of ``"flmarket"``, ``"rs"``, ``"qbs"``, ``"dice"``, ``"dds"``.
    label_counts : ArrayLike
        Per-class counts, shape ``(E, C)``.
    num_selected : int
        Cohort size ``1 <= n <= E``.
    seed : int
        Seed (used by RS only).
    **extra
        Selector keywords: ``bids``/``budget`` (flmarket), ``volume_weight`` (dice),
        ``embeddings``/``diversity_weight`` (dds); the others ignore them.

    Returns
    -------
    NDArray[np.intp]
        ``num_selected`` distinct positions in selection order (FLMarket: at most that many).

    Raises
    ------
    ValueError
        An unknown selector name (the message lists the known ones).

    Notes
    -----
    Every selector sees only what a pre-training market sees, the per-class label counts of the
    ``E`` candidate clients (plus, where a method needs them, bids or dataset embeddings), and has
    the same signature::

        select_<name>(label_counts, num_selected, *, seed=0, **extra) -> positions

    where ``label_counts`` is an ``(E, C)`` integer array (``n_e^c``: samples of class ``c`` held by
    client ``e``) and the result holds ``num_selected`` distinct row positions in selection
    (priority) order (FLMarket: at most ``num_selected``, see below). Selectors are deterministic
    given their inputs and ``seed``; only RS uses the seed. Keywords meant for another selector
    (``bids``, ``embeddings``, ...) are accepted and ignored, so one set of keywords can drive every
    selector; an unknown keyword is an error.

    Selectors (``SELECTORS`` maps the names to the functions)

    ``flmarket``
        Data value score ``u_e`` (:func:`~flmarket_flwr.pricing.score.score`) and the product's
        reverse auction with a cohort cap: clients ranked by ``u_e / b_e``. The one selector that may
        return fewer than ``num_selected`` positions: zero-score clients never win.
    ``rs``
        Random selection: a uniformly random subset.
    ``qbs``
        Quantity-based selection (Zeng et al. 2020, FMore): largest data volume ``N_e`` first.
    ``dice``
        DICE (Saha et al. 2022): highest data quality from the volume ratio and the standard
        deviation of the per-class volumes. A reconstruction: DICE has no public code.
    ``dds``
        Diversity-driven selection (Li et al. 2021): statistical homogeneity to the uniform label
        distribution plus content diversity of dataset embeddings, chosen greedily. A
        reconstruction: DDS has no public code.

    Clients that hold no data at all rank after every client with data in QBS, DICE and DDS (ties
    by lower position); in FLMarket their score is zero, so they come last in the auction order.
    """
    if not isinstance(name, str):
        raise TypeError(f"selector name must be a str, got {type(name).__name__}")
    selector = SELECTORS.get(name.lower())
    if selector is None:
        raise ValueError(f"unknown selector {name!r}; known selectors: {sorted(SELECTORS)}")
    return selector(label_counts, num_selected, seed=seed, **extra)
