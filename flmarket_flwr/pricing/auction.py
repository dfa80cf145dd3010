"""Budget-constrained reverse auction (FLMarket, Algorithm 1): truthful, individually rational, budget-feasible.

:func:`run_auction` ranks clients by score per bid, admits them while they pass the budget rule, and pays
each winner its critical value, in ``O(E log E)``; an optional cohort cap keeps every guarantee. The budget
rule is a named choice (:data:`BUDGET_RULES`): the paper's ``"half"`` (Algorithm 1, ``R/2``) or ``"whole"``
(the same walk at ``R``, sound because FLMarket's value is additive). :func:`cohort_budget` gives the least
budget that buys a full cohort. The rules, the payment and the proofs are in :func:`run_auction` and
docs/mechanism.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["BUDGET_RULES", "AuctionResult", "auction_order", "cohort_budget", "decisive_head", "run_auction"]

BUDGET_RULES: tuple[str, ...] = ("half", "whole")
"""The auction's budget rules: ``"half"``, Algorithm 1 as the paper states it (a client joins while
``b_e <= R/2 * u_e / U(S + e)``; Singer's factor for submodular values), and ``"whole"``, the same walk at the
whole budget (``b_e <= R * u_e / U(S + e)``; FLMarket's value ``U(S) = sum u_e`` is additive). Under either rule
every winner is paid one price per unit of score (docs/mechanism.md): the total is at most ``R/2`` under
``"half"`` and at most ``R`` under ``"whole"``."""

_RULE_SHARE: dict[str, float] = {"half": 0.5, "whole": 1.0}
"""The share of ``R`` each rule walks with."""


@dataclass(frozen=True)
class AuctionResult:
    """Outcome of :func:`run_auction`.

    Attributes
    ----------
    winners : NDArray[np.intp]
        Input positions of the winners, in selection order.
    payments : NDArray[np.float64]
        One payment per input client; ``0.0`` for losers.
    order : NDArray[np.intp]
        Every input position, ranked by score per bid (ties: lower input position first).
    budget : float
        The budget ``R``.
    num_winners : int or None
        The cohort cap, ``None`` for none.
    budget_rule : str
        The budget rule that ran (:data:`BUDGET_RULES`).
    """

    winners: NDArray[np.intp]
    payments: NDArray[np.float64]
    order: NDArray[np.intp]
    budget: float
    num_winners: int | None = None
    budget_rule: str = "half"

    @property
    def total_payment(self) -> float:
        """Sum of all payments."""
        return float(self.payments.sum())

    @property
    def within_budget(self) -> bool:
        """Whether the total payment is within the budget (always true: kept for the records)."""
        return self.total_payment <= self.budget * (1.0 + 1e-12)

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python form for JSON."""
        return {
            "winners": [int(i) for i in self.winners],
            "payments": [float(p) for p in self.payments],
            "order": [int(i) for i in self.order],
            "budget": self.budget,
            "num_winners": self.num_winners,
            "budget_rule": self.budget_rule,
            "total_payment": self.total_payment,
        }


VALUE_RANGE: tuple[float, float] = (1e-100, 1e100)
"""The range of a positive score, every bid and the budget: inside it the payments' products and quotients stay
far from float64's overflow and underflow, so the guarantees (``p_e >= b_e``, ``sum p <= R``) hold in floating
point; outside it they can fail (a total payment above ``R`` near ``1e150``), so such input is refused."""


def rule_budget(budget: float, budget_rule: str) -> float:
    """The budget the rule walks with: ``R/2`` under ``"half"``, ``R`` under ``"whole"``.

    Raises
    ------
    ValueError
        If ``budget_rule`` is not one of :data:`BUDGET_RULES`.
    """
    if not isinstance(budget_rule, str) or budget_rule not in _RULE_SHARE:
        raise ValueError(f"budget_rule must be one of {BUDGET_RULES}, got {budget_rule!r}")
    return budget * _RULE_SHARE[budget_rule]


def _outside_range(values: NDArray[np.float64]) -> NDArray[np.intp]:
    """Positions of the positive ``values`` outside :data:`VALUE_RANGE` (zero is allowed: a zero score)."""
    low, high = VALUE_RANGE
    return np.flatnonzero((values != 0) & ((values < low) | (values > high)))


def _validate(
    scores: ArrayLike, bids: ArrayLike, budget: float
) -> tuple[NDArray[np.float64], NDArray[np.float64], float]:
    """Check the auction's inputs and return them as float64 arrays and a float budget."""
    score_array = np.asarray(scores, dtype=np.float64)
    bid_array = np.asarray(bids, dtype=np.float64)
    if score_array.ndim != 1 or bid_array.ndim != 1:
        raise ValueError(f"scores and bids must be 1-D, got shapes {score_array.shape} and {bid_array.shape}")
    if score_array.shape != bid_array.shape:
        raise ValueError(f"scores and bids differ in length: {score_array.size} scores, {bid_array.size} bids")
    if not np.all(np.isfinite(score_array)):
        raise ValueError("scores must be finite (found NaN or infinity)")
    if np.any(score_array < 0):
        raise ValueError(f"scores must be >= 0; negative at positions {np.flatnonzero(score_array < 0)[:10].tolist()}")
    if not np.all(np.isfinite(bid_array)):
        raise ValueError(
            f"bids must be finite; non-finite at positions {np.flatnonzero(~np.isfinite(bid_array))[:10].tolist()}"
        )
    if np.any(bid_array <= 0):
        raise ValueError(f"bids must be > 0; non-positive at positions {np.flatnonzero(bid_array <= 0)[:10].tolist()}")
    if isinstance(budget, bool) or not isinstance(budget, (int, float, np.integer, np.floating)):
        raise TypeError(f"budget must be a number, got {type(budget).__name__}")
    if not math.isfinite(budget) or budget <= 0:
        raise ValueError(f"budget must be a finite number > 0, got {budget}")
    low, high = VALUE_RANGE
    for name, values, allowed in (("scores", score_array, "0 or within"), ("bids", bid_array, "within")):
        outside = _outside_range(values)
        if outside.size:
            raise ValueError(
                f"{name} must be {allowed} [{low:g}, {high:g}] (beyond it floating point cannot keep the "
                f"payments within the budget); outside at positions {outside[:10].tolist()}"
            )
    if not low <= budget <= high:
        raise ValueError(f"budget must be within [{low:g}, {high:g}], got {budget}")
    return score_array, bid_array, float(budget)


def auction_order(scores: ArrayLike, bids: ArrayLike) -> NDArray[np.intp]:
    """Rank clients by score per bid, highest first; ties go to the lower input position.

    Parameters
    ----------
    scores : ArrayLike
        Scores ``u_e >= 0``.
    bids : ArrayLike
        Bids ``b_e > 0``.

    Returns
    -------
    NDArray[np.intp]
        Input positions in auction order.
    """
    ratio = np.asarray(scores, dtype=np.float64) / np.asarray(bids, dtype=np.float64)
    positions = np.arange(ratio.size)
    return np.lexsort((positions, -ratio)).astype(np.intp)


def _first_true(
    low: NDArray[np.intp],
    high: NDArray[np.intp],
    predicate: Callable[[NDArray[np.intp], NDArray[np.intp]], NDArray[np.bool_]],
) -> NDArray[np.intp]:
    """Vectorised bisection: for each row, the first position in ``[low, high)`` where a monotone
    predicate (False ... False True ... True) holds, or ``high`` if it never does.

    ``predicate(positions, rows)`` evaluates the predicate of the given rows at the given positions.
    """
    low = low.copy()
    high = high.copy()
    while True:
        rows = np.flatnonzero(low < high)
        if rows.size == 0:
            return low
        middle = (low[rows] + high[rows]) // 2
        holds = predicate(middle, rows)
        high[rows[holds]] = middle[holds]
        low[rows[~holds]] = middle[~holds] + 1


def _budget_winner_count(
    sorted_scores: NDArray[np.float64],
    sorted_bids: NDArray[np.float64],
    walk_budget: float,
    prefix: NDArray[np.float64],
) -> int:
    """Length of the prefix of the ranking that passes the budget rule."""
    with np.errstate(divide="ignore", invalid="ignore"):
        passes = (sorted_scores > 0) & (sorted_bids <= walk_budget * sorted_scores / prefix)
    failing = np.flatnonzero(~passes)
    return int(failing[0]) if failing.size else int(passes.size)


def _walk_ends(
    sorted_scores: NDArray[np.float64],
    sorted_bids: NDArray[np.float64],
    walk_budget: float,
    prefix: NDArray[np.float64],
    num_winners: int,
) -> NDArray[np.intp]:
    """For each of the first ``num_winners`` ranked clients ``e``, the first ranked client ``m >= num_winners`` that
    fails the rule once ``e`` is gone (the end of the walk over ``V^-e``), or the list's length if none does.

    Every client up to the last winner still passes there (removing ``e`` only lowers prefix sums).
    """
    size = sorted_scores.size
    winner_score = sorted_scores[:num_winners]

    def fails_without_winner(m: NDArray[np.intp], rows: NDArray[np.intp]) -> NDArray[np.bool_]:
        u_m = sorted_scores[m]
        with np.errstate(divide="ignore", invalid="ignore"):
            threshold = walk_budget * u_m / (prefix[m] - winner_score[rows])
        return (u_m <= 0) | (sorted_bids[m] > threshold)

    start = np.full(num_winners, num_winners, dtype=np.intp)
    return _first_true(start, np.full(num_winners, size, dtype=np.intp), fails_without_winner)


def _budget_payments(
    sorted_scores: NDArray[np.float64],
    sorted_bids: NDArray[np.float64],
    walk_budget: float,
    prefix: NDArray[np.float64],
    num_winners: int,
    cohort_cap: int,
) -> NDArray[np.float64]:
    """Critical-value payments of the first ``num_winners`` ranked clients, with at most ``cohort_cap`` winners."""
    size = sorted_scores.size
    winner_position = np.arange(num_winners, dtype=np.intp)
    winner_score = sorted_scores[:num_winners]
    first_failing = _walk_ends(sorted_scores, sorted_bids, walk_budget, prefix, num_winners)
    # Candidate positions j' of V^-e run from 0 to last_candidate (inclusive); V^-e[j'] is ranked
    # client j' before e's own position and j' + 1 after it; j' = size - 1 is "after everyone".
    # With a cohort cap, e must also find fewer than cohort_cap others ahead of it: j' <= cohort_cap - 1.
    last_candidate = np.minimum(first_failing - 1, cohort_cap - 1)

    def lam_beta(j: NDArray[np.intp], rows: NDArray[np.intp]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        own_position = winner_position[rows]
        u_e = winner_score[rows]
        element = np.where(j < own_position, j, j + 1)
        inside = element < size
        clipped = np.minimum(element, size - 1)
        u_j = sorted_scores[clipped]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            lam = np.where(inside & (u_j > 0), u_e * sorted_bids[clipped] / u_j, np.inf)
        before = np.where(j > 0, prefix[np.maximum(j - 1, 0)], 0.0)
        others_before = np.where(j <= own_position, before, prefix[np.minimum(j, size - 1)] - u_e)
        beta = walk_budget * u_e / (others_before + u_e)
        return lam, beta

    def crossed(j: NDArray[np.intp], rows: NDArray[np.intp]) -> NDArray[np.bool_]:
        lam, beta = lam_beta(j, rows)
        return lam >= beta

    crossing = _first_true(np.zeros(num_winners, dtype=np.intp), last_candidate + 1, crossed)
    rows = np.arange(num_winners)
    payments = np.zeros(num_winners)
    # The peak of min(lambda, beta) is at the crossing or just before it.
    for candidate in (crossing - 1, crossing):
        valid = (candidate >= 0) & (candidate <= last_candidate)
        lam, beta = lam_beta(np.clip(candidate, 0, None), rows)
        payments = np.where(valid, np.maximum(payments, np.minimum(lam, beta)), payments)
    return payments


def cohort_budget(scores: ArrayLike, bids: ArrayLike, num_winners: int, *, budget_rule: str = "half") -> float:
    """The least budget at which :func:`run_auction` with ``num_winners`` selects a full cohort.

    With budget ``R`` the first ``n`` positive-score clients of the ranking all pass the rule iff
    ``s R >= b_k * U_k / u_k`` for each of them (``U_k`` the scores summed up to ``k``; ``s`` the rule's share
    of ``R``: ``1/2`` or ``1``), and then every one of them is eligible (``b_k <= s R``). For experiments that
    compare selectors at equal cohort size: the budget is then as small as the cohort allows, and still binds in
    total.

    Parameters
    ----------
    scores, bids : ArrayLike
        As for :func:`run_auction`.
    num_winners : int
        The cohort size ``n >= 1``, at most the number of positive-score clients.
    budget_rule : str
        As for :func:`run_auction`.

    Returns
    -------
    float
        The budget (a hair above the bound, so rounding cannot drop the last client).

    Raises
    ------
    ValueError
        Invalid scores or bids, or fewer than ``num_winners`` clients with a positive score.
    """
    score_array, bid_array, _ = _validate(scores, bids, 1.0)
    share = rule_budget(1.0, budget_rule)
    count = _cohort_size(num_winners, score_array.size)
    order = auction_order(score_array, bid_array)
    positive = order[score_array[order] > 0][:count]
    if positive.size < count:
        raise ValueError(
            f"num_winners={count} but only {positive.size} clients have a positive score: no budget buys that cohort"
        )
    head_scores = score_array[positive]
    bound = float(np.max(bid_array[positive] * np.cumsum(head_scores) / head_scores / share))
    return bound * (1.0 + 1e-9)


def decisive_head(
    scores: ArrayLike, bids: ArrayLike, budget: float, *, num_winners: int | None = None, budget_rule: str = "half"
) -> tuple[NDArray[np.intp], bool]:
    """The head of the ranking that :func:`run_auction`'s outcome depends on, and whether it is closed.

    Every walk of the auction (the selection, and each winner's walk over ``V^-e`` for its payment) stops at a
    client that fails the rule, or at the cohort cap; the head is the ranked eligible clients up to the last place
    any walk reads. *Closed* means every walk stopped inside the head: then clients ranked after it (or not
    eligible) change neither the winners nor any payment, so :func:`run_auction` over the head alone gives the
    outcome over all of them. Not closed means some walk ran off the end of the list (everyone passed): the head
    is then every eligible client, and one more could change the outcome. This is what lets an award carry only
    the head (:mod:`flmarket_flwr.market.wire.award`); ``tests/test_auction.py`` checks it on random instances.

    Under either rule the outcome reads at most the winners and the first eligible client after them (the payments
    are one price per unit of score, fixed by the last winner and that client: docs/mechanism.md); the head may be
    that long or, where a walk over ``V^-e`` ends later, longer, and it is exactly what the payment walks read.

    Parameters
    ----------
    scores, bids, budget, num_winners, budget_rule
        As for :func:`run_auction`.

    Returns
    -------
    tuple[NDArray[np.intp], bool]
        The head's input positions in ranking order, and whether it is closed.
    """
    score_array, bid_array, budget_value = _validate(scores, bids, budget)
    walk_budget = rule_budget(budget_value, budget_rule)
    cap = score_array.size if num_winners is None else _cohort_size(num_winners, score_array.size)
    order = auction_order(score_array, bid_array)
    eligible = order[bid_array[order] <= budget_value]
    size = eligible.size
    if size == 0:
        return eligible, False
    sorted_scores, sorted_bids = score_array[eligible], bid_array[eligible]
    prefix = np.cumsum(sorted_scores)
    count = min(_budget_winner_count(sorted_scores, sorted_bids, walk_budget, prefix), cap)
    if count == 0:
        return eligible[:1], True  # the first ranked client failed the rule: nobody after it is read
    # The selection reads up to its failing client (at ``count``) or stops at the cap; each payment reads up to
    # the end of its walk over V^-e or, with the cap, up to position ``cap`` (lambda of the client there).
    ends = _walk_ends(sorted_scores, sorted_bids, walk_budget, prefix, count)
    last_read = int(np.max(np.minimum(ends, cap)))
    closed = last_read < size
    return eligible[: min(last_read + 1, size)], closed


def _cohort_size(num_winners: object, num_clients: int) -> int:
    """Validate a cohort cap against the number of candidate clients."""
    if isinstance(num_winners, bool) or not isinstance(num_winners, (int, np.integer)) or num_winners < 1:
        raise ValueError(f"num_winners must be a positive int or None, got {num_winners!r}")
    if num_winners > num_clients:
        raise ValueError(f"num_winners={int(num_winners)} exceeds the {num_clients} candidate clients")
    return int(num_winners)


def run_auction(
    scores: ArrayLike, bids: ArrayLike, budget: float, *, num_winners: int | None = None, budget_rule: str = "half"
) -> AuctionResult:
    r"""Select winners and pay each its critical value: FLMarket's selection rule, the one the product applies.

    Algorithm 1 over the eligible clients (bid at most the budget), optionally capped at
    ``num_winners`` winners (see the notes below). Zero-score clients never win; the total
    payment is at most ``budget`` in every mode, and so is every payment.

    Parameters
    ----------
    scores : ArrayLike
        Data value scores ``u_e >= 0``, one per client.
    bids : ArrayLike
        Bids ``b_e > 0``, one per client, in the same order.
    budget : float
        Budget ``R > 0``.
    num_winners : int, optional
        Cohort cap ``1 <= n <= E``: at most ``n`` winners, the head of the same walk.
    budget_rule : str
        ``"half"`` (default: Algorithm 1 as the paper states it, the walk at ``R/2``, total paid at most ``R/2``)
        or ``"whole"`` (the same walk at ``R``, total paid at most ``R``). See :data:`BUDGET_RULES` and the notes.

    Returns
    -------
    AuctionResult
        Winners in selection order, a payment per client (``0.0`` for losers) and the ranking.

    Raises
    ------
    ValueError
        Non-finite or non-positive bids, negative or non-finite scores, ``budget <= 0``, a positive
        score, a bid or the budget outside :data:`VALUE_RANGE`, mismatched lengths, ``num_winners``
        not in ``[1, E]``, or a ``budget_rule`` not in :data:`BUDGET_RULES`.

    Notes
    -----
    Winner selection
        Clients are ranked by score per bid ``u_e / b_e``, highest first; ties go to the lower input
        index (a stable, deterministic rule). Walking that list, the client at position ``k`` joins the
        winner set ``S`` while

        .. math:: u_k > 0 \quad\text{and}\quad b_k \le \frac{R}{2} \cdot \frac{u_k}{U(S \cup \{k\})},

        where ``U`` sums scores; the first client that fails stops the walk (a zero-score client always
        fails, so it never wins).

    Payment (critical value)
        For winner ``e``, rebuild the walk over the list without ``e`` (``V^-e``). At each position ``j``
        up to and including the first one that fails, ``e`` could have taken ``j``'s place with any bid
        below ``min(lambda_j, beta_j)``, where ``lambda_j = u_e * b_j / u_j`` (``e`` still ranks ahead of
        ``j``) and ``beta_j = R/2 * u_e / U(S'_{j-1} \cup \{e\})`` (``e`` still passes the budget rule).
        The payment is the largest of these. When every client of ``V^-e`` passes, the last position is
        "after everyone", where only ``beta`` applies (the paper's pseudo-code leaves this undefined).

    Why the payments are fast
        Along ``V^-e``, ``lambda_j`` never decreases (the list is sorted by ``b/u`` ascending) and
        ``beta_j`` never increases (the prefix sum grows), so ``min(lambda_j, beta_j)`` is unimodal and
        peaks where the two curves cross. The end of each walk is also a threshold: a client ``m``
        behind ``e`` passes in ``V^-e`` iff ``u_m/b_m >= 2 (U_m - u_e) / R``, whose left side falls and
        right side rises with ``m``. Both places are found by bisection, vectorised over all winners
        at once: ``O(E log E)`` for the sort and ``O(K log E)`` for ``K`` winners' payments, instead of
        the ``O(K E)`` of a direct transcription.

    Guarantees (the paper's Theorems, checked by property-based tests): monotone selection, payment
    equal to the critical bid (truthful), ``p_e >= b_e`` (individually rational), ``sum p_e <= R``
    (budget-feasible).

    One price per unit of score
        Write ``s R`` for the budget the rule walks with (``s = 1/2`` under ``"half"``, ``1`` under
        ``"whole"``: the formulas above use ``R/2``). With winners ``S`` and ``next`` the first eligible
        client after them (none: ``b_next / u_next = inf``), every winner's critical value is
        ``p* u_e`` with ``p* = min(s R / U(S), b_next / u_next)``: bidding up to it keeps ``e`` ahead of
        ``next`` and within the rule at any position up to ``U(S)``, and past ``b_next / u_next`` either
        ``next`` fails (the walk stops before ``e``) or takes its place. Hence ``sum p_e = p* U(S) <= s R``:
        the paper's rule never spends more than half the budget, ``"whole"`` up to all of it. Because
        the value ``U`` is additive, no factor below 1 is needed for budget feasibility; Singer's ``1/2``
        is for submodular values. docs/mechanism.md has the argument in full, with what each rule
        guarantees against the best affordable set.

    Eligibility
        A bid above the budget can never be paid, so such a client is left out of the ranking: it
        neither wins nor stops the walk nor moves anyone's critical value (Algorithm 1 would let it
        stop the walk). Whether a client is eligible depends on its own bid only, so truthfulness holds.

    Cohort cap (``num_winners=n``)
        The same walk, stopped after ``n`` winners: a client joins while it passes the budget rule
        *and* fewer than ``n`` clients joined before it. Selection stays monotone (a lower bid moves a
        client up the ranking, past fewer and a subset of the clients it followed, so it still passes
        and still finds fewer than ``n`` ahead). Its critical value is the same maximum of
        ``min(lambda_j, beta_j)``, taken only over the positions ``j <= n - 1`` (``e`` must find fewer
        than ``n`` others ahead of it).

        Budget-feasible in total. Each capped winner is an uncapped winner (the capped winners are a
        prefix of the uncapped ones), and its capped payment is a maximum over a subset of the
        positions of its uncapped payment, so it is at most that payment. Hence
        ``sum_capped p_e <= sum_uncapped p_e <= R`` (the uncapped mechanism is budget-feasible,
        Theorem 3 of the paper). The price of the guarantee: with a budget that binds, fewer than
        ``n`` clients win. :func:`cohort_budget` gives the least budget that buys a full cohort.
    """
    score_array, bid_array, budget_value = _validate(scores, bids, budget)
    walk_budget = rule_budget(budget_value, budget_rule)
    cap = score_array.size if num_winners is None else _cohort_size(num_winners, score_array.size)

    order = auction_order(score_array, bid_array)
    eligible = order[bid_array[order] <= budget_value]
    sorted_scores = score_array[eligible]
    sorted_bids = bid_array[eligible]
    payments = np.zeros(score_array.size)

    prefix = np.cumsum(sorted_scores)
    count = min(_budget_winner_count(sorted_scores, sorted_bids, walk_budget, prefix), cap)
    winners = eligible[:count]
    if count:
        sorted_payments = _budget_payments(sorted_scores, sorted_bids, walk_budget, prefix, count, cap)
        # p_e >= b_e holds exactly in theory; the clamp only absorbs floating-point rounding, and
        # the cap at R only guards the total's rounding (every payment is at most s R in theory).
        payments[winners] = np.minimum(np.maximum(sorted_payments, sorted_bids[:count]), budget_value)
    return AuctionResult(
        winners=winners,
        payments=payments,
        order=order,
        budget=budget_value,
        num_winners=None if num_winners is None else cap,
        budget_rule=budget_rule,
    )
