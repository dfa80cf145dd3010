"""Tests of the two-step federated partition (global distribution, then Dirichlet)."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from flmarket_flwr.app.data import (
    DISTRIBUTIONS,
    MIN_KEEP_RATIO,
    Partition,
    dirichlet_split,
    global_distribution_indices,
    keep_fractions,
    load_digits_arrays,
    make_partition,
    train_test_split_balanced,
)

NUM_CLASSES = 10


@pytest.fixture(scope="module")
def cifar_labels() -> NDArray[np.int64]:
    """A CIFAR-10-sized label array: 5,000 samples of each of 10 classes, shuffled."""
    labels = np.repeat(np.arange(NUM_CLASSES, dtype=np.int64), 5_000)
    np.random.default_rng(1234).shuffle(labels)
    return labels


@pytest.fixture(scope="module")
def digits_labels() -> NDArray[np.int64]:
    """Labels of all 1,797 bundled digits (174..183 per class)."""
    return load_digits_arrays()[1]


@pytest.fixture(scope="module")
def digits_pool_labels(digits_labels: NDArray[np.int64]) -> NDArray[np.int64]:
    """Labels of the digits training pool (30 per class held out)."""
    train_idx, _ = train_test_split_balanced(digits_labels, test_per_class=30, seed=0)
    return digits_labels[train_idx]


@pytest.fixture(params=["cifar_labels", "digits_labels", "digits_pool_labels"])
def labels(request: pytest.FixtureRequest) -> NDArray[np.int64]:
    """Each realistic label array in turn."""
    return request.getfixturevalue(request.param)


def class_counts(labels: NDArray[np.int64], indices: NDArray[np.int64]) -> NDArray[np.int64]:
    """Per-class counts of ``labels[indices]``."""
    return np.bincount(labels[indices], minlength=NUM_CLASSES)


def normalised_entropy(counts: NDArray[np.int64]) -> float:
    """Shannon entropy of the class distribution divided by ``log(C)`` (1 = balanced)."""
    probabilities = counts[counts > 0] / counts.sum()
    return float(-(probabilities * np.log(probabilities)).sum() / np.log(len(counts)))


def mean_distance_to_global(partition: Partition) -> float:
    """Mean total-variation distance between non-empty clients' label mix and the global one."""
    counts = partition.label_counts.astype(float)
    rows = counts[counts.sum(axis=1) > 0]
    client_mix = rows / rows.sum(axis=1, keepdims=True)
    global_mix = partition.global_counts / partition.global_counts.sum()
    return float(0.5 * np.abs(client_mix - global_mix).sum(axis=1).mean())


# --- the keep-ratio table --------------------------------------------------------------


def test_distribution_names_and_table() -> None:
    assert DISTRIBUTIONS == ("d1", "d2", "d3", "d4", "d5", "d6", "d7")
    assert tuple(MIN_KEEP_RATIO) == DISTRIBUTIONS
    ratios = [MIN_KEEP_RATIO[name] for name in DISTRIBUTIONS]
    assert ratios[0] == 1.0
    assert all(later < earlier for earlier, later in pairwise(ratios))
    assert all(0.0 < ratio <= 1.0 for ratio in ratios)


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_keep_fractions_decay_geometrically_from_one_to_rho(name: str) -> None:
    fractions = keep_fractions(name, NUM_CLASSES)
    assert fractions.shape == (NUM_CLASSES,)
    assert fractions[0] == pytest.approx(1.0)
    assert fractions[-1] == pytest.approx(MIN_KEEP_RATIO[name])
    assert np.all(np.diff(fractions) <= 0)
    successive = fractions[1:] / fractions[:-1]
    np.testing.assert_allclose(successive, successive[0])
    np.testing.assert_allclose(keep_fractions(name, 1), [1.0])


# --- step 1: global distribution --------------------------------------------------------


def test_d1_is_exactly_balanced_to_the_smallest_class(labels: NDArray[np.int64]) -> None:
    kept = global_distribution_indices(labels, "d1", seed=0)
    counts = class_counts(labels, kept)
    smallest = np.bincount(labels).min()
    assert np.all(counts == smallest)


def test_imbalance_grows_strictly_from_d1_to_d7(labels: NDArray[np.int64]) -> None:
    ratios, entropies, sizes = [], [], []
    for name in DISTRIBUTIONS:
        counts = class_counts(labels, global_distribution_indices(labels, name, seed=3))
        ratios.append(counts.max() / counts.min())
        entropies.append(normalised_entropy(counts))
        sizes.append(counts.sum())
    assert ratios[0] == 1.0
    assert entropies[0] == pytest.approx(1.0)
    assert all(later > earlier for earlier, later in pairwise(ratios))
    assert all(later < earlier for earlier, later in pairwise(entropies))
    assert all(later < earlier for earlier, later in pairwise(sizes))


def test_cifar_sized_ratios_match_the_table(cifar_labels: NDArray[np.int64]) -> None:
    for name in DISTRIBUTIONS:
        counts = class_counts(cifar_labels, global_distribution_indices(cifar_labels, name, seed=0))
        assert counts.max() == 5_000
        assert counts.min() == round(5_000 * MIN_KEEP_RATIO[name])
        expected = np.sort(np.floor(5_000 * keep_fractions(name, NUM_CLASSES) + 0.5))
        np.testing.assert_array_equal(np.sort(counts), expected)


def test_levels_are_nested_for_one_seed(labels: NDArray[np.int64]) -> None:
    previous = global_distribution_indices(labels, DISTRIBUTIONS[0], seed=7)
    for name in DISTRIBUTIONS[1:]:
        current = global_distribution_indices(labels, name, seed=7)
        assert np.isin(current, previous).all()
        previous = current


def test_global_distribution_indices_are_sorted_unique_int64(cifar_labels: NDArray[np.int64]) -> None:
    kept = global_distribution_indices(cifar_labels, "d4", seed=0)
    assert kept.dtype == np.int64
    assert kept.ndim == 1
    assert np.all(np.diff(kept) > 0)
    assert kept[0] >= 0 and kept[-1] < len(cifar_labels)


def test_class_ranking_depends_on_the_seed(cifar_labels: NDArray[np.int64]) -> None:
    rankings = {
        tuple(np.argsort(class_counts(cifar_labels, global_distribution_indices(cifar_labels, "d6", seed))))
        for seed in range(10)
    }
    assert len(rankings) > 1


def test_global_distribution_is_reproducible_by_seed(digits_labels: NDArray[np.int64]) -> None:
    first = global_distribution_indices(digits_labels, "d3", seed=11)
    again = global_distribution_indices(digits_labels, "d3", seed=11)
    other = global_distribution_indices(digits_labels, "d3", seed=12)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


def test_every_class_keeps_at_least_one_sample() -> None:
    labels = np.repeat(np.arange(NUM_CLASSES), 3)
    for name in DISTRIBUTIONS:
        counts = class_counts(labels, global_distribution_indices(labels, name, seed=0))
        assert np.all(counts >= 1)


def test_absent_classes_stay_absent_and_present_ones_balance() -> None:
    labels = np.array([0] * 20 + [2] * 30 + [5] * 25)
    kept = global_distribution_indices(labels, "d1", seed=0, num_classes=8)
    counts = np.bincount(labels[kept], minlength=8)
    np.testing.assert_array_equal(counts, [20, 0, 20, 0, 0, 20, 0, 0])


def test_single_class_is_kept_whole() -> None:
    labels = np.zeros(17, dtype=np.int64)
    np.testing.assert_array_equal(global_distribution_indices(labels, "d6", seed=0), np.arange(17))


def test_distribution_name_is_case_insensitive(digits_labels: NDArray[np.int64]) -> None:
    np.testing.assert_array_equal(
        global_distribution_indices(digits_labels, "D5", seed=0),
        global_distribution_indices(digits_labels, "d5", seed=0),
    )
    assert make_partition(digits_labels, 5, distribution="D5").distribution == "d5"


# --- step 2 and the whole partition: invariants ----------------------------------------


def assert_partition_invariants(labels: NDArray[np.int64], partition: Partition, kept: NDArray[np.int64]) -> None:
    """Totals preserved, clients disjoint, counts consistent."""
    clients = partition.client_indices
    assert len(clients) == partition.num_clients
    merged = np.concatenate(clients)
    assert merged.size == np.unique(merged).size, "an index is shared by two clients"
    np.testing.assert_array_equal(np.sort(merged), kept)
    assert partition.label_counts.dtype == np.int64
    assert partition.label_counts.shape == (len(clients), partition.num_classes)
    for row, client in zip(partition.label_counts, clients, strict=True):
        assert client.dtype == np.int64
        assert np.all(np.diff(client) > 0)
        np.testing.assert_array_equal(row, np.bincount(labels[client], minlength=partition.num_classes))
    np.testing.assert_array_equal(partition.global_counts, np.bincount(labels[kept], minlength=partition.num_classes))
    np.testing.assert_array_equal(partition.client_sizes, [len(client) for client in clients])


@pytest.mark.parametrize("name", DISTRIBUTIONS)
@pytest.mark.parametrize("num_clients", [20, 100])
def test_partition_preserves_totals_on_cifar_sized_labels(
    cifar_labels: NDArray[np.int64], name: str, num_clients: int
) -> None:
    partition = make_partition(cifar_labels, num_clients, distribution=name, seed=5)
    kept = global_distribution_indices(cifar_labels, name, seed=5)
    assert_partition_invariants(cifar_labels, partition, kept)
    assert partition.client_sizes.min() >= 1
    assert (partition.distribution, partition.alpha, partition.seed) == (name, 0.5, 5)
    assert partition.num_classes == NUM_CLASSES


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_partition_preserves_totals_on_digits_pool(digits_pool_labels: NDArray[np.int64], name: str) -> None:
    partition = make_partition(digits_pool_labels, 20, distribution=name, seed=2)
    kept = global_distribution_indices(digits_pool_labels, name, seed=2)
    assert_partition_invariants(digits_pool_labels, partition, kept)


@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    num_classes=st.integers(1, 12),
    num_clients=st.integers(1, 25),
    distribution=st.sampled_from(DISTRIBUTIONS),
    alpha=st.floats(0.01, 1_000.0),
    seed=st.integers(0, 2**32),
)
def test_partition_invariants_hold_for_random_inputs(
    data: st.DataObject,
    num_classes: int,
    num_clients: int,
    distribution: str,
    alpha: float,
    seed: int,
) -> None:
    raw = data.draw(st.lists(st.integers(0, num_classes - 1), min_size=1, max_size=400), label="labels")
    labels = np.asarray(raw, dtype=np.int64)
    partition = make_partition(
        labels,
        num_clients,
        distribution=distribution,
        alpha=alpha,
        seed=seed,
        num_classes=num_classes,
        min_samples_per_client=0,
    )
    kept = global_distribution_indices(labels, distribution, seed, num_classes=num_classes)
    assert_partition_invariants(labels, partition, kept)
    present = np.bincount(labels, minlength=num_classes) > 0
    assert np.all(partition.global_counts[present] >= 1)
    assert np.all(partition.global_counts[~present] == 0)


@settings(max_examples=100, deadline=None)
@given(
    data=st.data(),
    num_clients=st.integers(1, 10),
    minimum=st.integers(0, 3),
    seed=st.integers(0, 2**32),
)
def test_dirichlet_split_of_any_subset_is_an_exact_cover_or_a_clear_error(
    data: st.DataObject, num_clients: int, minimum: int, seed: int
) -> None:
    labels = np.asarray(data.draw(st.lists(st.integers(0, 4), min_size=60, max_size=200)), dtype=np.int64)
    subset = np.asarray(data.draw(st.lists(st.integers(0, len(labels) - 1), unique=True)), dtype=np.int64)
    try:
        clients = dirichlet_split(
            labels, subset, num_clients, alpha=5.0, seed=seed, min_samples_per_client=minimum, max_attempts=20
        )
    except ValueError as error:
        assert minimum > 0
        assert "cannot give" in str(error) or "in 20 attempts" in str(error)
        return
    assert len(clients) == num_clients
    merged = np.concatenate(clients)
    assert merged.size == subset.size
    np.testing.assert_array_equal(np.sort(merged), np.sort(subset))
    assert all(len(client) >= minimum for client in clients)


def test_dirichlet_split_gives_every_client_the_minimum(digits_pool_labels: NDArray[np.int64]) -> None:
    indices = np.arange(len(digits_pool_labels))
    clients = dirichlet_split(digits_pool_labels, indices, 50, alpha=0.1, seed=0, min_samples_per_client=5)
    assert min(len(client) for client in clients) >= 5


def test_digits_with_100_clients_works_up_to_d7(digits_pool_labels: NDArray[np.int64]) -> None:
    for name in ("d6", "d7"):
        partition = make_partition(digits_pool_labels, 100, distribution=name, seed=0)
        assert partition.client_sizes.min() >= 1


def test_zero_minimum_allows_empty_clients() -> None:
    labels = np.repeat(np.arange(2), 5)
    partition = make_partition(labels, 30, min_samples_per_client=0)
    assert partition.client_sizes.sum() == 10
    assert (partition.client_sizes == 0).any()


def test_pruning_does_not_depend_on_alpha_or_clients(cifar_labels: NDArray[np.int64]) -> None:
    one = make_partition(cifar_labels, 20, distribution="d4", alpha=0.5, seed=9)
    two = make_partition(cifar_labels, 100, distribution="d4", alpha=50.0, seed=9)
    np.testing.assert_array_equal(one.global_counts, two.global_counts)
    np.testing.assert_array_equal(
        np.sort(np.concatenate(one.client_indices)), np.sort(np.concatenate(two.client_indices))
    )


# --- heterogeneity and reproducibility ---------------------------------------------------


@pytest.mark.parametrize("num_clients", [20, 100])
def test_small_alpha_gives_non_iid_clients(cifar_labels: NDArray[np.int64], num_clients: int) -> None:
    def distances(alpha: float) -> list[float]:
        partitions = [make_partition(cifar_labels, num_clients, alpha=alpha, seed=seed) for seed in range(3)]
        return [mean_distance_to_global(partition) for partition in partitions]

    non_iid, near_iid = distances(0.5), distances(1_000.0)
    assert min(non_iid) > 0.3
    assert max(near_iid) < 0.05
    assert min(non_iid) > 5 * max(near_iid)


def test_small_alpha_gives_unequal_client_sizes(cifar_labels: NDArray[np.int64]) -> None:
    sizes = make_partition(cifar_labels, 20, alpha=0.5, seed=0).client_sizes
    assert sizes.max() > 2 * sizes.min()


def test_same_seed_gives_identical_partition(digits_pool_labels: NDArray[np.int64]) -> None:
    first = make_partition(digits_pool_labels, 20, distribution="d3", seed=42)
    again = make_partition(digits_pool_labels, 20, distribution="d3", seed=42)
    np.testing.assert_array_equal(first.label_counts, again.label_counts)
    for left, right in zip(first.client_indices, again.client_indices, strict=True):
        np.testing.assert_array_equal(left, right)


def test_different_seed_gives_different_partition(digits_pool_labels: NDArray[np.int64]) -> None:
    first = make_partition(digits_pool_labels, 20, distribution="d3", seed=42)
    other = make_partition(digits_pool_labels, 20, distribution="d3", seed=43)
    assert not np.array_equal(first.label_counts, other.label_counts)


def test_partition_is_frozen(digits_pool_labels: NDArray[np.int64]) -> None:
    partition = make_partition(digits_pool_labels, 4)
    with pytest.raises(AttributeError):
        partition.seed = 1  # type: ignore[misc]


def test_accepts_plain_lists_and_small_integer_dtypes() -> None:
    labels = [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]
    from_list = make_partition(labels, 2, seed=0)
    from_uint8 = make_partition(np.asarray(labels, dtype=np.uint8), 2, seed=0)
    np.testing.assert_array_equal(from_list.label_counts, from_uint8.label_counts)
    assert from_list.num_classes == 3


# --- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"distribution": "d8"}, "unknown distribution 'd8'"),
        ({"distribution": "balanced"}, "unknown distribution"),
        ({"labels": np.zeros((3, 2), dtype=np.int64)}, "1-D"),
        ({"labels": np.array([0.0, 1.0, 2.0])}, "integers"),
        ({"labels": np.array([True, False])}, "integers"),
        ({"labels": np.array([0, -1, 2])}, "non-negative"),
        ({"labels": np.array([], dtype=np.int64)}, "empty"),
        ({"labels": []}, "empty"),
        ({"num_classes": 2}, "below num_classes=2"),
        ({"num_classes": 0}, "num_classes must be an integer >= 1"),
        ({"num_clients": 0}, "num_clients must be an integer >= 1"),
        ({"num_clients": 2.5}, "num_clients must be an integer >= 1"),
        ({"alpha": 0.0}, "alpha must be a positive finite number"),
        ({"alpha": -0.5}, "alpha must be a positive finite number"),
        ({"alpha": float("nan")}, "alpha must be a positive finite number"),
        ({"alpha": float("inf")}, "alpha must be a positive finite number"),
        ({"seed": -1}, "seed must be an integer >= 0"),
        ({"min_samples_per_client": -1}, "min_samples_per_client must be an integer >= 0"),
        ({"max_attempts": 0}, "max_attempts must be an integer >= 1"),
    ],
)
def test_make_partition_rejects_bad_input(kwargs: dict[str, object], message: str) -> None:
    arguments: dict[str, object] = {"labels": np.array([0, 1, 2, 0, 1, 2, 1, 0]), "num_clients": 2}
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=message):
        make_partition(**arguments)  # type: ignore[arg-type]


def test_too_few_samples_for_the_minimum_is_refused_at_once() -> None:
    labels = np.repeat(np.arange(3), 3)
    with pytest.raises(ValueError, match=r"cannot give 10 clients at least 1 samples each from only 9"):
        dirichlet_split(labels, np.arange(9), 10, min_samples_per_client=1)


def test_unmet_minimum_after_all_attempts_raises() -> None:
    labels = np.repeat(np.arange(NUM_CLASSES), 10)
    with pytest.raises(ValueError, match=r"in 3 attempts; lower min_samples_per_client"):
        dirichlet_split(labels, np.arange(100), 10, alpha=0.01, seed=0, min_samples_per_client=10, max_attempts=3)


@pytest.mark.parametrize(
    ("indices", "message"),
    [
        (np.array([0, 1, 1]), "distinct"),
        (np.array([0, 10]), r"must lie in \[0, 10\)"),
        (np.array([-1, 2]), r"must lie in \[0, 10\)"),
        (np.array([0.0, 1.0]), "indices must be integers"),
        (np.zeros((2, 2), dtype=np.int64), "indices must be a 1-D array"),
    ],
)
def test_dirichlet_split_rejects_bad_indices(indices: NDArray[np.generic], message: str) -> None:
    labels = np.repeat(np.arange(2), 5)
    with pytest.raises(ValueError, match=message):
        dirichlet_split(labels, indices, 2, min_samples_per_client=0)


def test_global_distribution_rejects_unknown_name_and_bad_labels() -> None:
    with pytest.raises(ValueError, match="unknown distribution 'D0'"):
        global_distribution_indices(np.array([0, 1]), "D0", seed=0)
    with pytest.raises(ValueError, match="below num_classes=3"):
        global_distribution_indices(np.array([0, 3]), "d1", seed=0, num_classes=3)
