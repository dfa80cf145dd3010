"""Bid policies: how a client prices its data in the reverse auction.

A bid policy is any callable ``(label_counts, score, context) -> float`` (:class:`BidPolicy`) that returns a
finite bid ``> 0``. The auction is truthful, so bidding the true cost (``markup=0``) is a dominant strategy.
What each policy's bid reveals about the data volume is in its class docstring (docs/threat-model.md).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
from flwr.app import Context
from numpy.typing import NDArray

__all__ = [
    "DEFAULT_COST_PER_SAMPLE",
    "BidPolicy",
    "BucketedCostBid",
    "CostBasedBid",
    "NoBidError",
    "SimulatedCostBid",
    "cost_based_bid",
    "simulated_cost_per_sample",
]

DEFAULT_COST_PER_SAMPLE = 1.0
"""Cost per sample of the default policy (``CostBasedBid(DEFAULT_COST_PER_SAMPLE)``)."""


class NoBidError(ValueError):
    """The client cannot place a bid (e.g. it holds no data)."""


@runtime_checkable
class BidPolicy(Protocol):
    """A client's bid policy.

    Parameters
    ----------
    label_counts : NDArray[np.int64]
        The client's own per-class label counts ``N_e``, shape ``(C,)``.
    score : float
        The client's data value score ``u_e`` computed from the broadcast ``N_s`` and ``E``.
    context : Context
        The client's Flower context (``node_config``, ``run_config``, ``state``).

    Returns
    -------
    float
        The bid ``b_e``, finite and ``> 0``.

    Notes
    -----
    A bid policy is any callable ``(label_counts, score, context) -> float``
    (:class:`BidPolicy`). It runs on the client, after the client has computed its
    own score from the broadcast global counts, and must return a finite bid
    ``> 0``; the server excludes any other bid from the auction.

    The auction is truthful: bidding the true cost (``markup=0``) is a dominant
    strategy. A positive markup models clients that ask for a margin anyway.

    A client without data has nothing to sell: :class:`CostBasedBid` raises
    :class:`NoBidError` for it, the client handler turns that into an error reply,
    and the server leaves the client out of the auction with that reason.
    """

    def __call__(self, label_counts: NDArray[np.int64], score: float, context: Context) -> float:
        """Return the bid."""
        ...  # pragma: no cover


def _check_positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"{name} must be finite and > 0, got {value}")
    return number


def _check_markup(markup: float) -> float:
    if isinstance(markup, bool) or not isinstance(markup, (int, float, np.integer, np.floating)):
        raise TypeError(f"markup must be a number, got {type(markup).__name__}")
    number = float(markup)
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"markup must be finite and >= 0, got {markup}")
    return number


def cost_based_bid(label_counts: NDArray[np.int64], cost_per_sample: float, markup: float) -> float:
    """The cost-based bid ``cost_per_sample * N_e * (1 + markup)`` of a client with counts ``label_counts``.

    Raises
    ------
    NoBidError
        If ``N_e == 0``: a client without data cannot bid.
    """
    num_samples = int(np.sum(np.asarray(label_counts, dtype=np.int64)))
    if num_samples <= 0:
        raise NoBidError("the client holds no data (N_e = 0) and cannot bid")
    return cost_per_sample * num_samples * (1.0 + markup)


@dataclass(frozen=True)
class CostBasedBid:
    """Bid the cost of the data plus a markup: ``b_e = cost_per_sample * N_e * (1 + markup)``.

    Parameters
    ----------
    cost_per_sample : float
        Cost of one sample, ``> 0``.
    markup : float (default: 0.2)
        Relative margin asked on top of the cost, ``>= 0``.

    Raises
    ------
    NoBidError
        When called for a client with ``N_e = 0``.

    Notes
    -----
    What a bid reveals to the buyer: :class:`CostBasedBid` and :class:`SimulatedCostBid`
    bid ``cost x N_e x (1 + markup)``, so anyone who knows the cost learns the data volume
    ``N_e`` exactly (the simulated cost is a public hash of partition id and seed);
    :class:`BucketedCostBid` prices ``N_e`` rounded up to a geometric bucket, so the bid
    reveals only the bucket (``N_e`` within a factor ``ratio``).
    """

    cost_per_sample: float
    markup: float = 0.2

    def __post_init__(self) -> None:
        """Validate the parameters."""
        object.__setattr__(self, "cost_per_sample", _check_positive("cost_per_sample", self.cost_per_sample))
        object.__setattr__(self, "markup", _check_markup(self.markup))

    def __call__(self, label_counts: NDArray[np.int64], score: float, context: Context) -> float:
        """Return ``cost_per_sample * N_e * (1 + markup)``."""
        return cost_based_bid(label_counts, self.cost_per_sample, self.markup)


def bucket_ceiling(num_samples: int, ratio: float) -> int:
    """The smallest ``ceil(ratio**j)`` (``j >= 0``) that is at least ``num_samples``: ``N_e``'s bucket.

    Every ``N_e`` in ``(ceil(ratio**(j-1)), ceil(ratio**j)]`` maps to the same value, so a price of the
    bucket does not tell which of them a client holds.
    """
    if num_samples < 1:
        raise NoBidError("the client holds no data (N_e = 0) and cannot bid")
    exponent = max(0, math.floor(math.log(num_samples) / math.log(ratio)) - 1)
    while math.ceil(ratio**exponent) < num_samples:
        exponent += 1
    return math.ceil(ratio**exponent)


@dataclass(frozen=True)
class BucketedCostBid:
    """Bid the cost of ``N_e`` rounded up to a geometric bucket: ``cost * bucket_ceiling(N_e) * (1 + markup)``.

    The bid reveals which bucket ``N_e`` lies in (within a factor ``ratio``), not ``N_e`` itself, even to a
    buyer who knows the cost; it never bids below :class:`CostBasedBid` with the same cost and markup, and
    at most ``ratio`` times (plus one sample) above it. The auction stays truthful for the rounded cost.

    Parameters
    ----------
    cost_per_sample : float
        Cost of one sample, ``> 0``.
    markup : float (default: 0.2)
        Relative margin, ``>= 0``.
    ratio : float (default: 1.25)
        Bucket growth factor, ``> 1``.
    """

    cost_per_sample: float
    markup: float = 0.2
    ratio: float = 1.25

    def __post_init__(self) -> None:
        """Validate the parameters."""
        object.__setattr__(self, "cost_per_sample", _check_positive("cost_per_sample", self.cost_per_sample))
        object.__setattr__(self, "markup", _check_markup(self.markup))
        ratio = _check_positive("ratio", self.ratio)
        if ratio <= 1.0:
            raise ValueError(f"ratio must be > 1, got {self.ratio}")
        object.__setattr__(self, "ratio", ratio)

    def __call__(self, label_counts: NDArray[np.int64], score: float, context: Context) -> float:
        """Return ``cost_per_sample * bucket_ceiling(N_e, ratio) * (1 + markup)``."""
        num_samples = int(np.sum(np.asarray(label_counts, dtype=np.int64)))
        return self.cost_per_sample * bucket_ceiling(num_samples, self.ratio) * (1.0 + self.markup)


def simulated_cost_per_sample(partition_id: int, seed: int = 0, low: float = 0.5, high: float = 1.5) -> float:
    """Deterministic, heterogeneous cost per sample of a simulated client.

    The cost is uniform in ``[low, high)`` and depends only on ``(partition_id, seed)``
    (a SHA-256 of both, not Python's salted ``hash``), so every process, machine and
    run computes the same value for the same client.

    Parameters
    ----------
    partition_id : int
        The client's partition id (``context.node_config["partition-id"]`` in simulation).
    seed : int (default: 0)
        Experiment seed.
    low, high : float (default: 0.5, 1.5)
        Range of the cost, ``0 < low <= high``.

    Returns
    -------
    float
        The cost per sample.
    """
    if isinstance(partition_id, bool) or not isinstance(partition_id, (int, np.integer)):
        raise TypeError(f"partition_id must be an int, got {type(partition_id).__name__}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    low = _check_positive("low", low)
    high = _check_positive("high", high)
    if high < low:
        raise ValueError(f"high must be >= low, got low={low}, high={high}")
    digest = hashlib.sha256(f"flmarket-cost/{int(seed)}/{int(partition_id)}".encode()).digest()
    unit = int.from_bytes(digest[:8], "big") / 2.0**64
    return low + (high - low) * unit


@dataclass(frozen=True)
class SimulatedCostBid:
    """:class:`CostBasedBid` with the cost drawn by :func:`simulated_cost_per_sample`.

    The client's partition id is read from ``context.node_config[partition_key]``
    (Flower's simulation sets ``"partition-id"``).

    Parameters
    ----------
    seed : int (default: 0)
        Experiment seed.
    low, high : float (default: 0.5, 1.5)
        Range of the cost per sample.
    markup : float (default: 0.2)
        Relative margin, ``>= 0``.
    partition_key : str (default: "partition-id")
        ``node_config`` key holding the partition id.
    """

    seed: int = 0
    low: float = 0.5
    high: float = 1.5
    markup: float = 0.2
    partition_key: str = "partition-id"

    def __post_init__(self) -> None:
        """Validate the parameters (by drawing one cost)."""
        simulated_cost_per_sample(0, self.seed, self.low, self.high)
        object.__setattr__(self, "markup", _check_markup(self.markup))

    def cost_per_sample(self, context: Context) -> float:
        """Return this client's cost per sample."""
        if self.partition_key not in context.node_config:
            raise KeyError(f"node_config has no '{self.partition_key}': cannot derive the client's cost")
        partition_id = context.node_config[self.partition_key]
        return simulated_cost_per_sample(int(partition_id), self.seed, self.low, self.high)

    def __call__(self, label_counts: NDArray[np.int64], score: float, context: Context) -> float:
        """Return ``cost_per_sample(context) * N_e * (1 + markup)``."""
        return cost_based_bid(label_counts, self.cost_per_sample(context), self.markup)
