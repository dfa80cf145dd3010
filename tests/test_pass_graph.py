"""The PASS v2 masking graph: deterministic, symmetric, k-regular, k-connected, and robust to 10% bad nodes."""

import itertools
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flmarket_flwr.pass_protocol.graph import (
    commit_graph_seed,
    derive_graph_seed,
    mask_graph,
    max_secret_threshold,
    neighbourhood_size,
    neighbours_of,
    roster_digest,
    secret_threshold,
    share_threshold,
)


def _connected(graph: dict[int, tuple[int, ...]], alive: set[int]) -> bool:
    start = next(iter(alive))
    seen, frontier = {start}, [start]
    while frontier:
        node = frontier.pop()
        for peer in graph[node]:
            if peer in alive and peer not in seen:
                seen.add(peer)
                frontier.append(peer)
    return seen == alive


@st.composite
def graphs(draw):
    size = draw(st.integers(3, 60))
    indices = draw(st.lists(st.integers(1, 10_000), min_size=size, max_size=size, unique=True))
    even = [k for k in range(2, size - 1, 2)]
    k = draw(st.sampled_from(even + [size - 1]))
    return draw(st.binary(min_size=32, max_size=32)), indices, k


@settings(max_examples=80, deadline=None)
@given(graphs())
def test_graph_is_deterministic_symmetric_and_k_regular(case):
    seed, indices, k = case
    graph = mask_graph(seed, indices, k)
    assert graph == mask_graph(seed, list(reversed(indices)), k)  # depends on the set, not the order given
    assert set(graph) == set(indices)
    for node, peers in graph.items():
        assert len(peers) == k and len(set(peers)) == k and node not in peers
        assert all(node in graph[peer] for peer in peers)
    for node in indices:  # the vectorised selection (list or array input) agrees with the sorted cycle
        assert neighbours_of(seed, indices, k, node) == graph[node]
        assert neighbours_of(seed, np.asarray(indices), k, node) == graph[node]


def test_complete_graph_when_k_is_e_minus_one():
    indices = list(range(1, 12))
    graph = mask_graph(os.urandom(32), indices, 10)
    assert all(set(peers) == set(indices) - {node} for node, peers in graph.items())


def test_seed_changes_the_graph():
    indices = list(range(1, 101))
    assert mask_graph(b"\x01" * 32, indices, 10) != mask_graph(b"\x02" * 32, indices, 10)


@pytest.mark.parametrize(("size", "k"), [(9, 2), (10, 4), (12, 4), (11, 6)])
def test_graph_is_k_connected(size, k):
    graph = mask_graph(os.urandom(32), range(1, size + 1), k)
    for removed in itertools.combinations(range(1, size + 1), k - 1):
        assert _connected(graph, set(range(1, size + 1)) - set(removed))


def test_honest_survivors_stay_connected_under_ten_percent_bad_at_e_1000():
    size = 1000
    k = neighbourhood_size(size)
    assert k == 32
    rng = np.random.default_rng(3)
    for trial in range(60):
        graph = mask_graph(rng.bytes(32), range(1, size + 1), k)
        bad = set(rng.choice(np.arange(1, size + 1), size // 10, replace=False).tolist())
        alive = set(range(1, size + 1)) - bad
        assert _connected(graph, alive), trial
        assert min(sum(p in alive for p in graph[u]) for u in alive) >= share_threshold(k)


def test_neighbourhood_size_table_and_formula():
    assert [neighbourhood_size(e) for e in (20, 100, 1000, 10_000)] == [19, 30, 32, 34]
    assert [share_threshold(neighbourhood_size(e)) for e in (20, 100, 1000, 10_000)] == [10, 16, 17, 18]
    for size in (50, 500, 5000, 10**6):
        for bits, fraction in ((40, 0.1), (20, 0.2), (64, 0.05)):
            k = neighbourhood_size(size, security_bits=bits, bad_fraction=fraction)
            if k < size - 1:
                assert k % 2 == 0
                assert size * fraction ** (k / 2) <= 2.0**-bits
                assert size * fraction ** ((k - 2) / 2) > 2.0**-bits


@pytest.mark.parametrize("k", range(1, 40))
def test_threshold_exceeds_half_the_degree(k):
    t = share_threshold(k)
    assert 2 * t > k and t <= k


def test_commitment_and_derived_seed_bind_their_inputs():
    seed = b"\x07" * 32
    assert commit_graph_seed(seed) != commit_graph_seed(b"\x08" * 32)
    assert len(commit_graph_seed(seed)) == 32
    digest = roster_digest(b"run", [1, 2, 3])
    assert digest == roster_digest(b"run", [3, 1, 2])
    assert derive_graph_seed(seed, digest) != derive_graph_seed(seed, roster_digest(b"run", [1, 2, 4]))
    assert derive_graph_seed(seed, digest) != derive_graph_seed(seed, roster_digest(b"run2", [1, 2, 3]))
    with pytest.raises(ValueError, match="32 bytes"):
        commit_graph_seed(b"short")


def test_bad_degrees_and_indices_are_refused():
    with pytest.raises(ValueError, match="degree"):
        mask_graph(b"\x00" * 32, range(10), 3)
    with pytest.raises(ValueError, match="degree"):
        mask_graph(b"\x00" * 32, range(10), 10)
    with pytest.raises(ValueError, match="distinct"):
        mask_graph(b"\x00" * 32, [1, 1, 2], 2)
    with pytest.raises(ValueError, match="not a participant"):
        neighbours_of(b"\x00" * 32, range(10), 4, 99)
    with pytest.raises(ValueError, match="bad_fraction"):
        neighbourhood_size(10, bad_fraction=1.0)


def test_a_tie_of_keystream_words_falls_back_to_the_sorted_cycle(monkeypatch):
    """Two equal sort keys (probability below E^2 / 2^65) order by index, as in mask_graph."""
    from flmarket_flwr.pass_protocol import graph as graph_module

    words = np.array([5, 9, 5, 1, 7, 9, 3, 5], dtype=np.uint64)
    monkeypatch.setattr(graph_module, "_keystream_words", lambda seed, size: words[:size].copy())
    indices, seed = list(range(1, 9)), bytes(32)
    graph = mask_graph(seed, indices, 4)
    assert all(neighbours_of(seed, indices, 4, node) == graph[node] for node in indices)


@settings(max_examples=300, deadline=None)
@given(k=st.integers(1, 200), tolerance=st.integers(0, 220))
def test_a_secret_threshold_is_the_least_that_withstands_its_split_tolerance(k: int, tolerance: int) -> None:
    """``2t - k > c``: a split of the consistency round with ``c`` colluding neighbours needs ``c >= 2t - k``."""
    if (k + tolerance) // 2 + 1 > max(k - 1, share_threshold(k)):
        with pytest.raises(ValueError, match="no threshold up to"):
            secret_threshold(k, tolerance)
        return
    t = secret_threshold(k, tolerance)
    assert share_threshold(k) <= t <= max_secret_threshold(k) and 2 * t - k > tolerance
    assert t == share_threshold(k) or 2 * (t - 1) - k <= tolerance  # the least such threshold
    with pytest.raises(ValueError, match="split tolerance"):
        secret_threshold(k, -1)


@given(k=st.integers(1, 400))
def test_the_largest_threshold_leaves_a_dealer_recoverable_after_one_receiver_is_lost(k: int) -> None:
    """``t <= k - 1``: with one receiver gone (it accused the dealer, or dropped) ``t`` holders are left; never
    below the session's own ``k // 2 + 1`` (only at ``k = 2`` do the two meet above ``k - 1``)."""
    bound = max_secret_threshold(k)
    assert bound >= share_threshold(k)
    assert bound <= k - 1 or (k <= 2 and bound == share_threshold(k))
