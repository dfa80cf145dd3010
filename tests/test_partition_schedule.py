"""Tests of the linear pruning schedule beside the default geometric one."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from flmarket_flwr.app.data import (
    DISTRIBUTIONS,
    LINEAR_MIN_KEEP_RATIO,
    global_distribution_indices,
    keep_fractions,
    make_partition,
)


def _cifar_labels() -> np.ndarray:
    labels = np.repeat(np.arange(10, dtype=np.int64), 5_000)
    np.random.default_rng(7).shuffle(labels)
    return labels


def test_d6_linear_matches_table_2_tail() -> None:
    np.testing.assert_allclose(keep_fractions("d6", 10, "linear"), np.linspace(1.0, 0.1, 10))
    counts = np.bincount(_cifar_labels()[global_distribution_indices(_cifar_labels(), "d6", 0, schedule="linear")])
    assert sorted(counts.tolist())[:4] == [500, 1_000, 1_500, 2_000]


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_linear_fractions_are_equal_steps_down_to_the_level_minimum(distribution: str) -> None:
    fractions = keep_fractions(distribution, 10, "linear")
    assert fractions[0] == 1.0 and fractions[-1] == pytest.approx(LINEAR_MIN_KEEP_RATIO[distribution])
    assert np.allclose(np.diff(fractions), np.diff(fractions)[0])


def test_geometric_stays_the_default() -> None:
    labels = _cifar_labels()
    assert np.array_equal(
        global_distribution_indices(labels, "d4", 3), global_distribution_indices(labels, "d4", 3, schedule="geometric")
    )
    assert make_partition(labels, 20, "d4", seed=3).schedule == "geometric"


def test_linear_levels_are_nested_and_shrink() -> None:
    labels = _cifar_labels()
    kept = [set(global_distribution_indices(labels, level, 5, schedule="linear").tolist()) for level in DISTRIBUTIONS]
    for larger, smaller in itertools.pairwise(kept):
        assert smaller < larger


def test_partition_records_the_schedule_and_unknown_names_fail() -> None:
    partition = make_partition(_cifar_labels(), 20, "d6", seed=0, schedule="LINEAR")
    assert partition.schedule == "linear" and partition.global_counts.min() == 500
    with pytest.raises(ValueError, match="unknown schedule"):
        keep_fractions("d2", 10, "cubic")
