"""A direct, line-by-line transcription of the paper's Algorithm 1, used only as a test oracle.

It is O(K * E) and slow on purpose: it follows the pseudo-code, with the brief's two fixes
(the "after everyone" last position, and zero-score clients always failing the rule).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def reference_auction(scores: Sequence[float], bids: Sequence[float], budget: float) -> tuple[list[int], list[float]]:
    """Return (winners in selection order, payment per client) by transcribing Algorithm 1."""
    size = len(scores)
    order = sorted(range(size), key=lambda k: (-(scores[k] / bids[k]), k))

    def passes(k: int, total_with_k: float) -> bool:
        return scores[k] > 0 and bids[k] <= budget / 2.0 * scores[k] / total_with_k

    winners: list[int] = []
    total = 0.0
    for k in order:
        if not passes(k, total + scores[k]):
            break
        winners.append(k)
        total += scores[k]

    payments = [0.0] * size
    for e in winners:
        u_e = scores[e]
        total = 0.0
        payment = 0.0
        walked_everyone = True
        for j in (k for k in order if k != e):
            lam = u_e * bids[j] / scores[j] if scores[j] > 0 else math.inf
            beta = budget / 2.0 * u_e / (total + u_e)
            payment = max(payment, min(lam, beta))
            if not passes(j, total + scores[j]):
                walked_everyone = False
                break
            total += scores[j]
        if walked_everyone:
            payment = max(payment, budget / 2.0 * u_e / (total + u_e))
        payments[e] = payment
    return winners, payments
