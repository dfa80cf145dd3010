"""What a bid tells a buyer who knows the client's cost (issue 21, item 5): the buyer plays the inverter."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flmarket_flwr.market import BucketedCostBid, CostBasedBid
from flmarket_flwr.market.node.bidding import NoBidError, bucket_ceiling

COST, MARKUP = 0.37, 0.2


def volumes_behind(bid: float, policy, largest: int) -> list[int]:
    """Every ``N_e`` up to ``largest`` for which ``policy`` bids ``bid``: what the buyer can narrow it to."""
    return [n for n in range(1, largest + 1) if math.isclose(policy(np.array([n]), 0.0, None), bid, rel_tol=1e-12)]


def test_the_cost_based_bid_reveals_the_volume_exactly() -> None:
    """The control: with a known cost the default policy's bid inverts to ``N_e``."""
    policy = CostBasedBid(COST, MARKUP)
    for volume in (1, 57, 1000, 4321):
        bid = policy(np.array([volume // 2, volume - volume // 2]), 0.0, None)
        assert round(bid / (COST * (1 + MARKUP))) == volume
        assert volumes_behind(bid, policy, 5000) == [volume]


@pytest.mark.parametrize("volume", [57, 1000, 4321])
def test_the_bucketed_bid_hides_the_volume_within_its_bucket(volume: int) -> None:
    policy = BucketedCostBid(COST, MARKUP, ratio=1.25)
    bid = policy(np.array([volume]), 0.0, None)
    candidates = volumes_behind(bid, policy, 6000)
    assert volume in candidates
    assert len(candidates) >= volume // 5  # a bucket of width about 20% of N_e: never the exact volume


@settings(max_examples=300, deadline=None)
@given(volume=st.integers(1, 10**7), ratio=st.floats(1.01, 4.0))
def test_a_bucketed_bid_is_never_below_the_cost_and_within_ratio_above_it(volume: int, ratio: float) -> None:
    """Property: ``N_e <= bucket < ratio * N_e + 1``, and equal volumes in one bucket bid equally."""
    bucket = bucket_ceiling(volume, ratio)
    assert volume <= bucket < ratio * volume + 1
    assert bucket_ceiling(bucket, ratio) == bucket
    policy = BucketedCostBid(COST, MARKUP, ratio=ratio)
    assert policy(np.array([volume]), 0.0, None) >= CostBasedBid(COST, MARKUP)(np.array([volume]), 0.0, None)
    assert policy(np.array([volume]), 0.0, None) == policy(np.array([bucket]), 0.0, None)


def test_bad_parameters_and_no_data_are_refused() -> None:
    with pytest.raises(ValueError, match="ratio"):
        BucketedCostBid(COST, ratio=1.0)
    with pytest.raises(NoBidError):
        BucketedCostBid(COST)(np.array([0, 0]), 0.0, None)
