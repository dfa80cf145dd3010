"""A direct, line-by-line transcription of the paper's Algorithm 1, used only as a test oracle.

It is O(K * E) and slow on purpose: it follows the pseudo-code, with the brief's two fixes
(the "after everyone" last position, and zero-score clients always failing the rule), and the
product's two additions: bids above the budget are left out of the ranking, and an optional cap
of ``num_winners`` winners (a client can take a position only with fewer than that many ahead).
``share`` is the share of the budget the rule walks with: ``0.5`` for the paper's rule, ``1.0`` for the
whole-budget rule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def reference_auction(
    scores: Sequence[float],
    bids: Sequence[float],
    budget: float,
    num_winners: int | None = None,
    share: float = 0.5,
) -> tuple[list[int], list[float]]:
    """Return (winners in selection order, payment per client) by transcribing Algorithm 1."""
    size = len(scores)
    cap = size if num_winners is None else num_winners
    ranked = sorted(range(size), key=lambda k: (-(scores[k] / bids[k]), k))
    order = [k for k in ranked if bids[k] <= budget]

    def passes(k: int, total_with_k: float) -> bool:
        return scores[k] > 0 and bids[k] <= budget * share * scores[k] / total_with_k

    winners: list[int] = []
    total = 0.0
    for k in order:
        if len(winners) == cap or not passes(k, total + scores[k]):
            break
        winners.append(k)
        total += scores[k]

    payments = [0.0] * size
    for e in winners:
        u_e = scores[e]
        total = 0.0
        payment = 0.0
        walked_everyone = True
        for ahead, j in enumerate(k for k in order if k != e):
            if ahead == cap:  # e would find cap others ahead of it here and after
                walked_everyone = False
                break
            lam = u_e * bids[j] / scores[j] if scores[j] > 0 else math.inf
            beta = budget * share * u_e / (total + u_e)
            payment = max(payment, min(lam, beta))
            if not passes(j, total + scores[j]):
                walked_everyone = False
                break
            total += scores[j]
        if walked_everyone and len(order) - 1 < cap:
            payment = max(payment, budget * share * u_e / (total + u_e))
        payments[e] = payment
    return winners, payments
