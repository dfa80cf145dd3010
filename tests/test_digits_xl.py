"""Tests of ``digits_xl``, the derived digits data set: determinism, shapes, alpha and no leakage."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from flmarket_flwr.app.data import load_dataset, load_digits_arrays, make_partition
from flmarket_flwr.app.data.digits_xl import (
    DEFAULT_STRENGTH,
    DigitsXL,
    deform,
    load_digits_xl,
    upsample_to_rgb,
)
from flmarket_flwr.pricing import alpha

NEAR_DUPLICATE_L2 = 0.25
"""L2 distance (pixels in [0, 1], 64 of them) under which two images count as nearly equal: an RMS
pixel difference of 0.03, half a grey level of the 0..16 originals. Distinct real originals of
scikit-learn's digits are at least 0.33 apart (measured)."""


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> DigitsXL:
    """The default data set, generated into a fresh cache folder."""
    return load_digits_xl(cache_dir=tmp_path_factory.mktemp("cache"))


def _flat(images: NDArray[np.float32]) -> NDArray[np.float64]:
    return images.reshape(len(images), -1).astype(np.float64)


def _min_distances(rows: NDArray[np.float64], columns: NDArray[np.float64]) -> NDArray[np.float64]:
    """For each row, the smallest L2 distance to any column vector."""
    squared = (rows**2).sum(1)[:, None] + (columns**2).sum(1)[None, :] - 2.0 * rows @ columns.T
    return np.sqrt(np.maximum(squared, 0.0)).min(axis=1)


def test_shapes_dtypes_and_ranges(data: DigitsXL) -> None:
    assert data.train_images.dtype == np.float32 and data.test_images.dtype == np.float32
    assert data.train_images.shape[1:] == (1, 8, 8) and data.test_images.shape == (500, 1, 8, 8)
    assert data.train_labels.dtype == np.int64 and data.train_sources.dtype == np.int64
    assert len(data.train_images) == len(data.train_labels) == len(data.train_sources) == 1_297 * 12
    assert 0.0 <= data.train_images.min() and data.train_images.max() <= 1.0
    assert np.array_equal(np.bincount(data.test_labels), np.full(10, 50))
    assert np.bincount(data.train_labels).min() >= 1_000


def test_labels_follow_sources(data: DigitsXL) -> None:
    _, labels = load_digits_arrays()
    assert np.array_equal(data.train_labels, labels[data.train_sources])
    assert np.array_equal(data.test_labels, labels[data.test_sources])


def test_deterministic_and_cached(tmp_path: Path, data: DigitsXL) -> None:
    fresh = load_digits_xl(cache_dir="")
    for key, value in data.__dict__.items():
        assert np.array_equal(value, getattr(fresh, key)), key
    first = load_digits_xl(variants_per_image=2, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("digits_xl-*.npz"))) == 1
    again = load_digits_xl(variants_per_image=2, cache_dir=tmp_path)
    assert np.array_equal(first.train_images, again.train_images)
    other = load_digits_xl(variants_per_image=2, generation_seed=1, cache_dir="")
    assert not np.array_equal(first.train_images, other.train_images)


def test_no_training_image_derives_from_a_test_original(data: DigitsXL) -> None:
    assert not set(data.train_sources.tolist()) & set(data.test_sources.tolist())
    originals, _ = load_digits_arrays()
    assert np.array_equal(data.test_images, originals[data.test_sources])


def test_no_training_image_equals_or_nearly_equals_a_test_image(data: DigitsXL) -> None:
    distances = _min_distances(_flat(data.train_images), _flat(data.test_images))
    assert distances.min() > NEAR_DUPLICATE_L2


def test_variants_differ_from_their_original(data: DigitsXL) -> None:
    originals = data.train_is_original
    assert originals.sum() == 1_297
    source_image = {
        int(s): img for s, img in zip(data.train_sources[originals], data.train_images[originals], strict=True)
    }
    variants = np.flatnonzero(~originals)[:2_000]
    reference = np.stack([source_image[int(s)] for s in data.train_sources[variants]])
    gaps = np.sqrt(((_flat(data.train_images[variants]) - _flat(reference)) ** 2).sum(1))
    assert np.median(gaps) > 1.0


@pytest.mark.parametrize(("num_clients", "minimum"), [(20, 50.0), (100, 10.0)])
def test_alpha_at_d1_is_in_the_papers_regime(data: DigitsXL, num_clients: int, minimum: float) -> None:
    partition = make_partition(data.train_labels, num_clients, "d1", seed=0, num_classes=10)
    assert alpha(partition.global_counts, num_clients) >= minimum


def test_registry_entry_carries_the_sources() -> None:
    loaded = load_dataset("digits-xl", variants_per_image=1, cache_dir="")
    assert loaded.name == "digits_xl" and loaded.num_classes == 10
    assert loaded.train_groups is not None and loaded.test_groups is not None
    assert not np.isin(loaded.train_groups, loaded.test_groups).any()


def test_deform_is_a_function_of_the_generator_state() -> None:
    images = load_digits_arrays()[0][:16, 0]
    first = deform(images, DEFAULT_STRENGTH, np.random.default_rng(3))
    second = deform(images, DEFAULT_STRENGTH, np.random.default_rng(3))
    assert first.shape == images.shape and np.array_equal(first, second)
    still = deform(images, DEFAULT_STRENGTH.scaled(0.0), np.random.default_rng(3))
    np.testing.assert_allclose(still, images, atol=1e-6)


# --- digits_xl_rgb32: the images at ResNet-56's input shape ------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    count=st.integers(1, 4),
    height=st.integers(1, 9),
    width=st.integers(1, 9),
    size=st.integers(1, 40),
    seed=st.integers(0, 2**32 - 1),
)
def test_upsample_is_torchs_bilinear_resize_repeated_over_channels(
    count: int, height: int, width: int, size: int, seed: int
) -> None:
    images = np.random.default_rng(seed).random((count, 1, height, width), dtype=np.float32)
    ours = upsample_to_rgb(images, size=size)
    reference = F.interpolate(torch.from_numpy(images), size=(size, size), mode="bilinear", align_corners=False)
    assert ours.shape == (count, 3, size, size) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, reference.repeat(1, 3, 1, 1).numpy(), atol=1e-6, rtol=0)
    # Convex weights: the range stays inside the input's.
    assert images.min() - 1e-6 <= ours.min() and ours.max() <= images.max() + 1e-6


def test_upsample_rejects_what_it_cannot_resize() -> None:
    with pytest.raises(ValueError, match=r"\(N, 1, H, W\)"):
        upsample_to_rgb(np.zeros((2, 3, 8, 8), np.float32))
    with pytest.raises(ValueError, match="size"):
        upsample_to_rgb(np.zeros((2, 1, 8, 8), np.float32), size=0)


def test_rgb32_registry_entry_is_digits_xl_at_32x32() -> None:
    small, large = load_dataset("digits_xl"), load_dataset("digits-xl-rgb32")
    assert large.name == "digits_xl_rgb32" and large.input_shape == (3, 32, 32)
    assert large.train_images.shape == (len(small.train_images), 3, 32, 32)
    assert np.array_equal(large.train_labels, small.train_labels)
    assert np.array_equal(large.test_groups, small.test_groups)
    assert np.array_equal(large.test_images, upsample_to_rgb(small.test_images))
    assert np.array_equal(large.train_images[:100], upsample_to_rgb(small.train_images[:100]))
