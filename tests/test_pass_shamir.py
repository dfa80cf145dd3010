"""Shamir sharing over F_p (PASS v2): exact reconstruction from any t shares, secrecy of t - 1, bad input."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flmarket_flwr.pass_protocol.shamir import (
    FIELD_PRIME,
    WORD_BYTES,
    random_field_elements,
    reconstruct_secrets,
    share_from_bytes,
    share_to_bytes,
    share_words_in_field,
    split_secrets,
    words_per_secret,
)


@st.composite
def sharings(draw):
    n = draw(st.integers(1, 12))
    threshold = draw(st.integers(1, n))
    xs = draw(st.lists(st.integers(1, FIELD_PRIME - 1), min_size=n, max_size=n, unique=True))
    length = draw(st.integers(1, 40))
    secrets = draw(st.lists(st.binary(min_size=length, max_size=length), min_size=1, max_size=3))
    subset = draw(st.lists(st.sampled_from(range(n)), min_size=threshold, max_size=n, unique=True))
    return xs, threshold, secrets, subset


@settings(max_examples=150, deadline=None)
@given(sharings(), st.integers(0, 2**32))
def test_any_t_shares_reconstruct_every_secret(case, seed):
    xs, threshold, secrets, subset = case
    shares = split_secrets(secrets, xs, threshold, rng=np.random.default_rng(seed))
    assert shares.shape[:2] == (len(xs), len(secrets))
    assert (shares < FIELD_PRIME).all()
    assert reconstruct_secrets([xs[i] for i in subset], shares[subset], len(secrets[0])) == secrets


@settings(max_examples=150, deadline=None)
@given(sharings(), st.integers(0, 2**32))
def test_split_evaluates_the_polynomial_exactly(case, seed):
    """Each share is ``secret word + sum_j c_j x^j mod p`` in Python integers, for xs up to ``p - 1``."""
    xs, threshold, secrets, _ = case
    shares = split_secrets(secrets, xs, threshold, rng=np.random.default_rng(seed))
    words = words_per_secret(len(secrets[0]))
    coefficients = random_field_elements((threshold - 1, len(secrets), words), np.random.default_rng(seed))
    for i, x in enumerate(xs):
        for s, secret in enumerate(secrets):
            padded = secret.ljust(words * WORD_BYTES, b"\0")
            for w in range(words):
                value = int.from_bytes(padded[WORD_BYTES * w : WORD_BYTES * (w + 1)], "little")
                value += sum(int(coefficients[j, s, w]) * x ** (j + 1) for j in range(threshold - 1))
                assert int(shares[i, s, w]) == value % FIELD_PRIME


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([0, 1, FIELD_PRIME - 1, FIELD_PRIME, 2**32 - 1]) | st.integers(0, 2**32 - 1)))
def test_share_words_in_field_is_the_check_of_share_from_bytes(words):
    data = np.asarray(words, dtype="<u4").tobytes()
    try:
        share_from_bytes(data, 1, WORD_BYTES * len(words))
        accepted = bool(words)
    except ValueError:
        accepted = False
    assert share_words_in_field(data) == (accepted or not words)
    assert not share_words_in_field(data + b"\0")  # not whole words


def test_all_subsets_of_size_t_reconstruct_with_the_os_csprng():
    secrets = [bytes(range(32)), b"\xff" * 32]
    xs = [3, 8, 11, 20, 41]
    shares = split_secrets(secrets, xs, 3)
    for subset in itertools.combinations(range(5), 3):
        assert reconstruct_secrets([xs[i] for i in subset], shares[list(subset)], 32) == secrets


def test_fewer_than_t_shares_do_not_reconstruct():
    secrets = [bytes(range(32))]
    shares = split_secrets(secrets, [1, 2, 3, 4], 3)
    try:
        assert reconstruct_secrets([1, 2], shares[:2], 32) != secrets
    except ValueError:
        pass  # an out-of-range word is the usual sign


def _chi_square(counts: np.ndarray) -> float:
    expected = counts.sum() / counts.size
    return float(((counts - expected) ** 2 / expected).sum())


def test_t_minus_one_shares_are_uniform_and_independent_of_the_secret():
    """The joint law of t - 1 = 2 shares is the same (uniform) for two different fixed secrets."""
    bins, trials, xs, threshold = 8, 6000, [1, 2, 3, 4, 5], 3
    rng = np.random.default_rng(7)
    histograms = []
    for secret in (b"\x00\x00\x00", b"\xff\xff\xff"):
        shares = split_secrets([secret] * trials, xs, threshold, rng=rng)[:2, :, 0]  # 2 shares x trials
        cells = (shares * bins // FIELD_PRIME).astype(np.int64)
        joint = np.bincount(cells[0] * bins + cells[1], minlength=bins * bins)
        # 63 degrees of freedom: the 99.9% quantile is about 103
        assert _chi_square(joint) < 103
        histograms.append(joint)
    table = np.stack(histograms).astype(float)
    expected = table.sum(0, keepdims=True) * table.sum(1, keepdims=True) / table.sum()
    assert float(((table - expected) ** 2 / expected).sum()) < 103  # homogeneity A vs B, 63 dof


def test_t_shares_determine_the_secret():
    """Sanity check of the test above: with t shares the secret is a function of the shares."""
    shares = split_secrets([b"\x01\x02\x03"], [1, 2, 3], 3)
    assert reconstruct_secrets([1, 2, 3], shares, 3) == [b"\x01\x02\x03"]


def test_share_bytes_round_trip():
    shares = split_secrets([b"a" * 32, b"b" * 32], [5, 6, 7], 2)
    data = share_to_bytes(shares[1])
    assert len(data) == 2 * 11 * 4
    assert (share_from_bytes(data, 2, 32) == shares[1]).all()
    with pytest.raises(ValueError, match="bytes"):
        share_from_bytes(data[:-1], 2, 32)
    with pytest.raises(ValueError, match="field element"):
        share_from_bytes(b"\xff" * len(data), 2, 32)


@pytest.mark.parametrize(
    ("xs", "threshold", "match"),
    [
        ([1, 1, 2], 2, "distinct"),
        ([0, 1, 2], 2, "x = 0"),
        ([1, FIELD_PRIME], 1, "x"),
        ([1, 2], 3, "threshold"),
        ([1, 2], 0, "threshold"),
    ],
)
def test_split_refuses_bad_input(xs, threshold, match):
    with pytest.raises(ValueError, match=match):
        split_secrets([b"k" * 32], xs, threshold)


def test_split_refuses_unequal_or_empty_secrets():
    with pytest.raises(ValueError, match="one length"):
        split_secrets([b"a", b"bb"], [1, 2], 1)
    with pytest.raises(ValueError, match="at least one"):
        split_secrets([], [1, 2], 1)


def test_reconstruct_refuses_bad_input():
    shares = split_secrets([b"k" * 32], [1, 2, 3], 2)
    with pytest.raises(ValueError, match="distinct"):
        reconstruct_secrets([1, 1], shares[:2], 32)
    with pytest.raises(ValueError, match="x = 0"):
        reconstruct_secrets([0, 1], shares[:2], 32)
    with pytest.raises(ValueError, match="shape"):
        reconstruct_secrets([1, 2, 3], shares[:2], 32)
    with pytest.raises(ValueError, match="shape"):
        reconstruct_secrets([1, 2], shares[:2], 16)
    bad = shares[:2].copy()
    bad[0, 0, 0] = FIELD_PRIME
    with pytest.raises(ValueError, match="integers in"):
        reconstruct_secrets([1, 2], bad, 32)
    corrupted = shares[:2].copy()
    corrupted[0, 0, :] = (corrupted[0, 0, :] + 987_654_321) % FIELD_PRIME
    with pytest.raises(ValueError, match="inconsistent"):
        reconstruct_secrets([1, 2], corrupted, 32)
