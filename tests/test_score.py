"""The data value score: closed form against the paper's sums, vectorisation, errors."""

from __future__ import annotations

import math
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from flmarket_flwr.pricing import alpha, phi, score, theta


def direct_phi(x: int, alpha_value: float) -> float:
    """phi(x) = sum_{t=1..x} -ln(min(t/alpha, 1)), summed term by term."""
    return sum(-math.log(min(t / alpha_value, 1.0)) for t in range(1, x + 1))


def direct_score(local: np.ndarray, global_counts: np.ndarray, num_clients: int) -> float:
    """u_e = sum_c theta_c * phi(n_e^c), straight from the paper's equations."""
    total = int(global_counts.sum())
    alpha_value = total / (num_clients * global_counts.size)
    return sum(
        (1 - int(global_counts[c]) / total) * direct_phi(int(local[c]), alpha_value) for c in range(global_counts.size)
    )


@settings(max_examples=400, deadline=None)
@given(x=st.integers(0, 400), alpha_value=st.floats(0.05, 300.0))
def test_phi_closed_form_equals_direct_sum(x: int, alpha_value: float) -> None:
    expected = direct_phi(x, alpha_value)
    assert phi(x, alpha_value) == pytest.approx(expected, rel=1e-9, abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(
    counts=hnp.arrays(
        np.int64, hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=8), elements=st.integers(0, 60)
    ),
    extra_clients=st.integers(0, 5),
)
def test_score_equals_direct_formula(counts: np.ndarray, extra_clients: int) -> None:
    global_counts = counts.sum(axis=0)
    if global_counts.sum() == 0:
        global_counts = global_counts + 1
    num_clients = counts.shape[0] + extra_clients
    vectorised = score(counts, global_counts, num_clients)
    assert vectorised.shape == (counts.shape[0],)
    for row, value in zip(counts, vectorised, strict=True):
        expected = direct_score(row, global_counts, num_clients)
        assert value == pytest.approx(expected, rel=1e-9, abs=1e-9)
        assert score(row, global_counts, num_clients) == pytest.approx(value, rel=1e-12, abs=1e-12)


def test_one_client_returns_float_and_many_return_array() -> None:
    global_counts = np.array([30, 20, 10])
    assert isinstance(score([10, 5, 2], global_counts, 3), float)
    assert score([[10, 5, 2], [20, 15, 8]], global_counts, 3).shape == (2,)


def test_theta_and_alpha_follow_the_paper() -> None:
    global_counts = np.array([50, 30, 20])
    np.testing.assert_allclose(theta(global_counts), [0.5, 0.7, 0.8])
    assert theta(global_counts).sum() == pytest.approx(global_counts.size - 1)
    assert alpha(global_counts, num_clients=5) == pytest.approx(100 / 15)


def test_phi_saturates_at_alpha_and_never_decreases() -> None:
    alpha_value = 7.5
    values = [phi(x, alpha_value) for x in range(30)]
    assert all(b >= a for a, b in pairwise(values))
    assert values[7] > values[6]
    assert all(v == values[7] for v in values[7:])
    assert phi(0, alpha_value) == 0.0
    assert phi(100, 0.9) == 0.0  # alpha <= 1: every term is zero


def test_scarce_classes_are_worth_more() -> None:
    global_counts = np.array([900, 100])
    rich_in_common, rich_in_scarce = score([[50, 0], [0, 50]], global_counts, num_clients=10)
    assert rich_in_scarce > rich_in_common


def test_counts_in_the_millions_match_lgamma() -> None:
    rng = np.random.default_rng(7)
    counts = rng.integers(0, 5_000_000, size=(500, 10))
    global_counts = counts.sum(axis=0)
    alpha_value = global_counts.sum() / (500 * 10)
    got = score(counts, global_counts, 500)
    weights = 1 - global_counts / global_counts.sum()
    for row, value in zip(counts[:20], got[:20], strict=True):
        saturated = [min(int(x), math.floor(alpha_value)) for x in row]
        expected = sum(
            w * (m * math.log(alpha_value) - math.lgamma(m + 1)) for w, m in zip(weights, saturated, strict=True)
        )
        assert value == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("local", "global_counts", "num_clients", "error", "message"),
    [
        ([1, -1], [5, 5], 2, ValueError, "negative"),
        ([1.5, 1], [5, 5], 2, ValueError, "non-integer"),
        ([np.nan, 1], [5, 5], 2, ValueError, "NaN"),
        ([1, 2, 3], [5, 5], 2, ValueError, "shape"),
        ([[[1, 2]]], [5, 5], 2, ValueError, "shape"),
        ([1, 2], [[5, 5]], 2, ValueError, "global_counts must have shape"),
        ([1, 2], [5, 5], 0, ValueError, "num_clients must be >= 1"),
        ([1, 2], [5, 5], 2.0, TypeError, "num_clients must be an int"),
        ([0, 0], [0, 0], 2, ValueError, "all zero"),
        ([6, 1], [5, 5], 2, ValueError, "exceed"),
        ([True, False], [5, 5], 2, TypeError, "integer counts"),
        (["a", "b"], [5, 5], 2, TypeError, "integer counts"),
        ([], [], 2, ValueError, "empty"),
        ([1, 2], [2**60, 5], 2, ValueError, "2\\*\\*53"),
    ],
)
def test_bad_input_names_the_problem(local, global_counts, num_clients, error, message) -> None:
    with pytest.raises(error, match=message):
        score(local, global_counts, num_clients)


@pytest.mark.parametrize("bad_alpha", [0.0, -1.0, math.nan, math.inf])
def test_phi_rejects_bad_alpha(bad_alpha: float) -> None:
    with pytest.raises(ValueError, match="alpha"):
        phi(3, bad_alpha)
