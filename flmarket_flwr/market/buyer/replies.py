"""The market phase's checks of the clients' replies: score and bid bounds, and the winners' audit."""

from __future__ import annotations

import math

import numpy as np
from flwr.app import Message

from flmarket_flwr.market.buyer.config import MarketConfig
from flmarket_flwr.market.buyer.errors import MarketError
from flmarket_flwr.market.buyer.pass_rounds import PassResult
from flmarket_flwr.market.wire.messages import AuditReply, BidReply, ReplyError, read_config
from flmarket_flwr.pass_protocol import counts_commitment
from flmarket_flwr.pass_protocol.identity import SIGNATURE_LENGTH
from flmarket_flwr.pricing import score as compute_score
from flmarket_flwr.pricing.auction import VALUE_RANGE

__all__ = ["check_opening", "highest_possible_score", "read_score_and_bid"]


def highest_possible_score(pass_result: PassResult, tolerance: int = 0) -> float:
    """The largest score any PASS participant can have: that of counts equal to ``N_s`` (plus ``tolerance``).

    ``phi`` never decreases and every client's count of a class is at most ``n_s^c``, so
    ``score(N_s, N_s, E)`` bounds every honest score. With noise on ``N_s`` a count can exceed its noisy
    class by up to the noise's tail: ``tolerance`` (:attr:`MarketConfig.noise_tolerance`) is added.

    Raises
    ------
    MarketError
        If ``N_s`` is all zero: no client holds data, nothing can be scored.
    """
    counts = pass_result.global_counts
    try:
        bound = float(
            compute_score(counts + tolerance, counts, len(pass_result.participants), exact_global=tolerance == 0)
        )
    except ValueError as err:
        raise MarketError(f"the global counts cannot be scored ({err}): no client holds data") from err
    return bound * (1.0 + 1e-9) + 1e-9


def read_score_and_bid(reply: Message, highest_score: float) -> BidReply:
    """A ``market_bid`` reply, checked: score 0 or in ``[1e-100, highest_score]``, bid in ``VALUE_RANGE``, a signature
    (if any) 64 bytes."""
    bid_reply = BidReply.from_record(read_config(reply))
    score, bid = bid_reply.score, bid_reply.bid
    if score < 0:
        raise ReplyError(f"'score' must be >= 0, got {score}")
    if score > highest_score:
        raise ReplyError(
            f"'score' {score} exceeds {highest_score:.6g}, the score of all the global counts: "
            "no client can score that much"
        )
    low, high = VALUE_RANGE
    if not low <= bid <= high:
        raise ReplyError(f"'bid' must be within [{low:g}, {high:g}] (the auction's range), got {bid}")
    if score != 0 and score < low:
        raise ReplyError(f"'score' must be 0 or at least {low:g} (the auction's range), got {score}")
    signature = bid_reply.bid_signature
    if signature is not None and len(signature) != SIGNATURE_LENGTH:
        raise ReplyError(f"'bid-signature' must be a {SIGNATURE_LENGTH}-byte signature, got {len(signature)} bytes")
    return bid_reply


def check_opening(
    reply: Message, node: int, pass_result: PassResult, config: MarketConfig, claimed_score: float
) -> None:
    """Check a winner's opened counts against its PASS commitment, the bounds and its claimed score.

    Raises
    ------
    ReplyError
        With the reason the winner is excluded.
    """
    try:
        opening = AuditReply.from_record(read_config(reply))
    except ReplyError as err:
        raise ReplyError(f"audit: {err}") from err
    counts, nonce = opening.counts, opening.nonce
    if len(counts) != config.num_classes:
        raise ReplyError(f"audit: 'counts' must be a list of {config.num_classes} ints")
    if any(c < 0 or c > config.count_bound for c in counts):
        raise ReplyError(f"audit: 'counts' must hold ints in [0, {config.count_bound}]")
    opened = np.asarray(counts, dtype=np.int64)
    index = pass_result.indices[node]
    if counts_commitment(pass_result.session, index, opened, nonce) != pass_result.commitments[node]:
        raise ReplyError("audit: the opened counts do not match the client's PASS commitment")
    if np.any(opened > pass_result.global_counts + config.noise_tolerance):
        raise ReplyError("audit: the opened counts exceed the global counts")
    true_score = float(
        compute_score(
            opened, pass_result.global_counts, len(pass_result.participants), exact_global=config.noise is None
        )
    )
    if not math.isclose(true_score, claimed_score, rel_tol=1e-9, abs_tol=1e-12):
        raise ReplyError(
            f"audit: the claimed score {claimed_score:.6g} is not the score {true_score:.6g} of the committed counts"
        )
