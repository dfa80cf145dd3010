"""scikit-learn's bundled ``digits`` (1,797 8x8 images, 10 classes): the offline default data set.

A balanced held-out test set is taken first (:func:`train_test_split_balanced`); the rest is the training
pool that :func:`flmarket_flwr.app.data.partition.make_partition` splits over the clients.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Final

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flmarket_flwr.app.data.partition import _check_positive_int, _check_seed, as_label_array

__all__ = [
    "DEFAULT_TEST_PER_CLASS",
    "IMAGE_SHAPE",
    "NUM_CLASSES",
    "load_digits_arrays",
    "train_test_split_balanced",
]

NUM_CLASSES: Final[int] = 10
"""Number of classes (digits 0..9)."""

IMAGE_SHAPE: Final[tuple[int, int, int]] = (1, 8, 8)
"""Shape of one image, channels first."""

DEFAULT_TEST_PER_CLASS: Final[int] = 30
"""Default held-out test images per class (300 in all, 1,497 left for training)."""

_MAX_PIXEL: Final[float] = 16.0
_SPLIT_STREAM: Final[int] = 0x54455354  # "TEST"


def load_digits_arrays() -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """Load the bundled digits as arrays ready for a CNN.

    The scikit-learn loader runs once per process (cached); each call returns fresh,
    writable copies (about 0.5 MB), so callers may modify them freely.

    Returns
    -------
    images : numpy.ndarray
        ``float32`` array of shape ``(1797, 1, 8, 8)``, values in ``[0, 1]``.
    labels : numpy.ndarray
        ``int64`` array of shape ``(1797,)``, values ``0 .. 9``.
    """
    images, labels = _load_digits_cached()
    return images.copy(), labels.copy()


def train_test_split_balanced(
    labels: ArrayLike,
    test_per_class: int = DEFAULT_TEST_PER_CLASS,
    seed: int = 0,
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Split sample indices into a class-balanced test set and the training pool.

    Each class present in ``labels`` gives ``test_per_class`` randomly chosen samples
    to the test set; all other samples form the training pool.

    Parameters
    ----------
    labels : array_like
        1-D array of non-negative integer class labels.
    test_per_class : int, default 30
        Test samples per class (at least 1).
    seed : int, default 0
        Non-negative seed of the choice.

    Returns
    -------
    train_idx : numpy.ndarray
        Sorted ``int64`` indices of the training pool.
    test_idx : numpy.ndarray
        Sorted ``int64`` indices of the test set, ``test_per_class`` per class.

    Raises
    ------
    ValueError
        On invalid labels, seed or ``test_per_class``, or when a class has no more than
        ``test_per_class`` samples (it would be missing from the training pool).
    """
    array, _ = as_label_array(labels)
    _check_positive_int("test_per_class", test_per_class)
    _check_seed(seed)
    class_sizes = np.bincount(array)
    present = np.flatnonzero(class_sizes)
    too_small = present[class_sizes[present] <= test_per_class]
    if too_small.size:
        raise ValueError(
            f"test_per_class={test_per_class} leaves no training sample for class(es) "
            f"{too_small.tolist()} (sizes {class_sizes[too_small].tolist()})"
        )
    rng = np.random.default_rng([seed, _SPLIT_STREAM])
    test_parts = [rng.permutation(np.flatnonzero(array == label))[:test_per_class] for label in present]
    test_idx = np.sort(np.concatenate(test_parts))
    is_test = np.zeros(array.size, dtype=bool)
    is_test[test_idx] = True
    return np.flatnonzero(~is_test).astype(np.int64), test_idx.astype(np.int64)


@lru_cache(maxsize=1)
def _load_digits_cached() -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """Run scikit-learn's loader once; return read-only arrays shared by all callers."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = (np.asarray(bunch.images, dtype=np.float32) / np.float32(_MAX_PIXEL)).reshape(-1, *IMAGE_SHAPE)
    labels = np.asarray(bunch.target, dtype=np.int64)
    images.setflags(write=False)
    labels.setflags(write=False)
    return images, labels
