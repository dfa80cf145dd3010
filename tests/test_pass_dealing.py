"""Verifiable dealing of a PASS mask key: Shamir over Z_l, share points ``sigma B``, the parity check against the
advertised X25519 key, and the exchanges the server recomputes from a rebuilt scalar (equal to X25519's)."""

from __future__ import annotations

import os

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from flmarket_flwr.pass_protocol.dleq import (
    dealing_matches,
    mask_scalar,
    public_key_of_scalar,
    scalar_exchange,
    share_point,
)
from flmarket_flwr.pass_protocol.shamir import (
    GROUP_ORDER,
    parity_weights,
    random_scalar,
    reconstruct_scalar,
    scalar_from_bytes,
    scalar_to_bytes,
    split_scalars,
)

keys = st.binary(min_size=32, max_size=32)
dealings = st.tuples(st.integers(1, 8), st.integers(0, 6)).map(lambda tk: (tk[0], tk[0] + tk[1]))  # (t, k)


def _deal(raw: bytes, xs: list[int], t: int) -> tuple[bytes, list[int], list[bytes]]:
    """A dealer's advertised key, its shares of the mask scalar at ``xs`` and their points."""
    key = X25519PrivateKey.from_private_bytes(raw).public_key().public_bytes_raw()
    secret = int.from_bytes(mask_scalar(raw), "little")
    shares = [row[0] for row in split_scalars([secret], xs, t)]
    return key, shares, [share_point(scalar_to_bytes(s)) or b"" for s in shares]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, GROUP_ORDER - 1), min_size=1, max_size=3), dealings, st.randoms())
def test_any_t_shares_rebuild_each_scalar(secrets, tk, rnd) -> None:
    t, k = tk
    xs = rnd.sample(range(1, 2**20), k)
    rows = split_scalars(secrets, xs, t)
    chosen = rnd.sample(range(k), t)
    for i, secret in enumerate(secrets):
        assert reconstruct_scalar([xs[j] for j in chosen], [rows[j][i] for j in chosen]) == secret


@settings(max_examples=30, deadline=None)
@given(keys, dealings, st.randoms())
def test_a_correct_dealing_of_the_mask_key_matches_its_x25519_key(raw: bytes, tk, rnd) -> None:
    t, k = tk
    xs = rnd.sample(range(1, 2**20), k)
    key, _, points = _deal(raw, xs, t)
    assert dealing_matches(key, xs, points, t)


@settings(max_examples=30, deadline=None)
@given(keys, dealings, st.randoms(), st.data())
def test_any_changed_share_point_fails_the_dealing(raw: bytes, tk, rnd, data) -> None:
    """A holder's point replaced by that of another share: the points leave every polynomial of degree < t
    through the key."""
    t, k = tk
    xs = rnd.sample(range(1, 2**20), k)
    key, shares, points = _deal(raw, xs, t)
    at = data.draw(st.integers(0, k - 1))
    other = (shares[at] + data.draw(st.integers(1, GROUP_ORDER - 1))) % GROUP_ORDER
    changed = [*points[:at], share_point(scalar_to_bytes(other)) or b"", *points[at + 1 :]]
    assert not dealing_matches(key, xs, changed, t)


@settings(max_examples=30, deadline=None)
@given(keys, keys, dealings, st.randoms())
def test_a_dealing_of_another_secret_or_against_another_key_fails(raw: bytes, other: bytes, tk, rnd) -> None:
    """Attack (b): shares of any value but the mask key (or the commitment of another key) do not match."""
    t, k = tk
    xs = rnd.sample(range(1, 2**20), k)
    key, _, points = _deal(raw, xs, t)
    other_key, _, other_points = _deal(other, xs, t)
    if mask_scalar(raw) == mask_scalar(other):
        return
    assert not dealing_matches(other_key, xs, points, t)
    assert not dealing_matches(key, xs, other_points, t)


@settings(max_examples=40, deadline=None)
@given(keys, keys)
def test_the_rebuilt_scalar_gives_exactly_what_x25519_gives(raw: bytes, peer: bytes) -> None:
    """The server's exchange from ``s = clamp(k) mod l`` (or ``-s``, the same u) equals X25519(k, P)."""
    peer_key = X25519PrivateKey.from_private_bytes(peer).public_key()
    expected = X25519PrivateKey.from_private_bytes(raw).exchange(peer_key)
    scalar = int.from_bytes(mask_scalar(raw), "little")
    for s in (scalar, GROUP_ORDER - scalar):
        assert scalar_exchange(scalar_to_bytes(s), peer_key.public_bytes_raw()) == expected
    public = X25519PrivateKey.from_private_bytes(raw).public_key().public_bytes_raw()
    assert public_key_of_scalar(scalar_to_bytes(scalar)) == public


@settings(max_examples=40, deadline=None)
@given(keys, dealings, st.randoms())
def test_t_shares_rebuild_the_scalar_whose_exchanges_are_the_dealers(raw: bytes, tk, rnd) -> None:
    t, k = tk
    xs = rnd.sample(range(1, 2**20), k)
    _, shares, _ = _deal(raw, xs, t)
    chosen = rnd.sample(range(k), t)
    rebuilt = scalar_to_bytes(reconstruct_scalar([xs[j] for j in chosen], [shares[j] for j in chosen]))
    peer = X25519PrivateKey.generate().public_key()
    assert scalar_exchange(rebuilt, peer.public_bytes_raw()) == X25519PrivateKey.from_private_bytes(raw).exchange(peer)


@given(st.lists(st.integers(0, 2**20), min_size=1, max_size=12, unique=True), st.integers(1, 12), st.randoms())
def test_parity_weights_vanish_on_every_low_degree_polynomial(xs, t, rnd) -> None:
    weights = parity_weights(xs, t)
    if len(xs) <= t:
        assert weights == []
        return
    coefficients = [rnd.randrange(GROUP_ORDER) for _ in range(t)]
    values = [sum(c * pow(x, i, GROUP_ORDER) for i, c in enumerate(coefficients)) % GROUP_ORDER for x in xs]
    assert sum(w * v for w, v in zip(weights, values, strict=True)) % GROUP_ORDER == 0
    values[rnd.randrange(len(xs))] += 1  # off the polynomial: caught unless a weight is 0 (probability 1/l)
    assert sum(w * v for w, v in zip(weights, values, strict=True)) % GROUP_ORDER != 0


def test_share_points_and_scalars_refuse_non_canonical_and_zero_values() -> None:
    assert scalar_from_bytes(GROUP_ORDER.to_bytes(32, "little")) is None
    assert scalar_from_bytes(bytes(31)) is None
    assert share_point(bytes(32)) is None  # zero: no point to commit to
    assert share_point(GROUP_ORDER.to_bytes(32, "little")) is None
    assert share_point(scalar_to_bytes(random_scalar())) is not None
    with pytest.raises(ValueError, match="scalar"):
        scalar_to_bytes(GROUP_ORDER)


def test_a_key_off_the_prime_order_subgroup_is_never_matched() -> None:
    xs = [1, 2, 3, 4]
    key, _, points = _deal(os.urandom(32), xs, 2)
    small_order = bytes(32)  # u = 0: the point of order 2 on the Montgomery curve
    assert dealing_matches(key, xs, points, 2)
    assert not dealing_matches(small_order, xs, points, 2)
    assert scalar_exchange(scalar_to_bytes(random_scalar()), small_order) is None
