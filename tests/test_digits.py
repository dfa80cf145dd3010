"""Tests of the bundled digits loader and the balanced train/test split."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flmarket_flwr.app.data import DISTRIBUTIONS, load_digits_arrays, make_partition, train_test_split_balanced
from flmarket_flwr.app.data import digits as digits_module


def test_digits_arrays_have_the_expected_shape_dtype_and_range() -> None:
    images, labels = load_digits_arrays()
    assert images.shape == (1797, *digits_module.IMAGE_SHAPE) == (1797, 1, 8, 8)
    assert images.dtype == np.float32
    assert labels.shape == (1797,)
    assert labels.dtype == np.int64
    assert images.min() == 0.0
    assert images.max() == 1.0
    levels = np.unique(images * 16)
    np.testing.assert_allclose(levels, np.round(levels))  # 17 grey levels 0..16 scaled to [0, 1]
    assert len(levels) == 17


def test_digits_have_ten_nearly_balanced_classes() -> None:
    _, labels = load_digits_arrays()
    counts = np.bincount(labels)
    assert len(counts) == digits_module.NUM_CLASSES == 10
    assert counts.min() == 174
    assert counts.max() == 183


def test_digits_images_are_not_trivial() -> None:
    images, labels = load_digits_arrays()
    class_means = np.stack([images[labels == digit].mean(axis=0) for digit in range(10)])
    distances = np.abs(class_means[:, None] - class_means[None, :]).sum(axis=(2, 3, 4))
    assert np.all(distances[~np.eye(10, dtype=bool)] > 1.0)


def test_loader_is_cached_and_returns_independent_copies() -> None:
    first_images, first_labels = load_digits_arrays()
    hits_before = digits_module._load_digits_cached.cache_info().hits
    first_images[0] = -5.0
    first_labels[0] = 99
    second_images, second_labels = load_digits_arrays()
    assert digits_module._load_digits_cached.cache_info().hits == hits_before + 1
    assert digits_module._load_digits_cached.cache_info().misses == 1
    assert second_images.min() == 0.0
    assert second_labels.max() == 9
    assert second_images.flags.writeable and second_labels.flags.writeable


def test_balanced_split_is_disjoint_complete_and_balanced() -> None:
    _, labels = load_digits_arrays()
    train_idx, test_idx = train_test_split_balanced(labels, test_per_class=30, seed=0)
    assert train_idx.dtype == np.int64 and test_idx.dtype == np.int64
    assert np.intersect1d(train_idx, test_idx).size == 0
    np.testing.assert_array_equal(np.sort(np.concatenate([train_idx, test_idx])), np.arange(len(labels)))
    assert np.all(np.diff(train_idx) > 0) and np.all(np.diff(test_idx) > 0)
    np.testing.assert_array_equal(np.bincount(labels[test_idx], minlength=10), np.full(10, 30))
    np.testing.assert_array_equal(np.bincount(labels[train_idx]), np.bincount(labels) - 30)


def test_balanced_split_default_is_30_per_class() -> None:
    _, labels = load_digits_arrays()
    _, test_idx = train_test_split_balanced(labels)
    assert digits_module.DEFAULT_TEST_PER_CLASS == 30
    assert len(test_idx) == 300


def test_balanced_split_is_deterministic_by_seed() -> None:
    _, labels = load_digits_arrays()
    first = train_test_split_balanced(labels, 30, seed=4)
    again = train_test_split_balanced(labels, 30, seed=4)
    other = train_test_split_balanced(labels, 30, seed=5)
    np.testing.assert_array_equal(first[1], again[1])
    np.testing.assert_array_equal(first[0], again[0])
    assert not np.array_equal(first[1], other[1])


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(0, 40), min_size=1, max_size=8).filter(lambda c: max(c) > 0),
    test_per_class=st.integers(1, 5),
    seed=st.integers(0, 2**32),
)
def test_balanced_split_property(counts: list[int], test_per_class: int, seed: int) -> None:
    labels = np.repeat(np.arange(len(counts)), counts)
    np.random.default_rng(seed % 1000).shuffle(labels)
    if any(0 < count <= test_per_class for count in counts):
        with pytest.raises(ValueError, match="leaves no training sample"):
            train_test_split_balanced(labels, test_per_class, seed)
        return
    train_idx, test_idx = train_test_split_balanced(labels, test_per_class, seed)
    present = np.asarray(counts) > 0
    test_counts = np.bincount(labels[test_idx], minlength=len(counts))
    np.testing.assert_array_equal(test_counts, np.where(present, test_per_class, 0))
    assert np.intersect1d(train_idx, test_idx).size == 0
    assert train_idx.size + test_idx.size == labels.size


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"test_per_class": 174}, r"leaves no training sample for class\(es\) \[8\]"),
        ({"test_per_class": 0}, "test_per_class must be an integer >= 1"),
        ({"test_per_class": 2.5}, "test_per_class must be an integer >= 1"),
        ({"seed": -3}, "seed must be an integer >= 0"),
    ],
)
def test_balanced_split_rejects_bad_input(kwargs: dict[str, object], message: str) -> None:
    _, labels = load_digits_arrays()
    with pytest.raises(ValueError, match=message):
        train_test_split_balanced(labels, **kwargs)  # type: ignore[arg-type]


def test_balanced_split_rejects_bad_labels() -> None:
    with pytest.raises(ValueError, match="labels must be integers"):
        train_test_split_balanced(np.array([0.5, 1.0]), 1)


@pytest.mark.parametrize("name", DISTRIBUTIONS[:6])
def test_digits_training_pool_partitions_over_20_clients(name: str) -> None:
    _, labels = load_digits_arrays()
    train_idx, test_idx = train_test_split_balanced(labels, 30, seed=0)
    partition = make_partition(labels[train_idx], 20, distribution=name, seed=0)
    assert partition.label_counts.shape == (20, 10)
    assert partition.client_sizes.min() >= 1
    pool_positions = np.concatenate(partition.client_indices)
    assert np.intersect1d(train_idx[pool_positions], test_idx).size == 0
