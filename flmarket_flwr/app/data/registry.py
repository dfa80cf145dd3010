"""One entry point for every data set: :func:`load_dataset` (training set and held-out set, by name).

Its docstring tables each data set's test split, ``root`` folder and options; ``seed`` only matters where
the test set is drawn (``digits``, ``deap``), so callers may always pass it. Nothing is downloaded.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from flmarket_flwr.app.data import cifar10, cinic10, deap, digits_xl, fashion_mnist
from flmarket_flwr.app.data.digits import DEFAULT_TEST_PER_CLASS, load_digits_arrays, train_test_split_balanced
from flmarket_flwr.app.data.digits import NUM_CLASSES as DIGITS_NUM_CLASSES

__all__ = ["DATASET_NAMES", "DATASET_OPTIONS", "LoadedDataset", "canonical_dataset_name", "load_dataset"]

DATASET_NAMES: Final[tuple[str, ...]] = (
    "digits",
    "digits_xl",
    "digits_xl_rgb32",
    "cifar10",
    "cinic10",
    "deap",
    "fashion_mnist",
)
"""Names accepted by :func:`load_dataset` (case, ``-`` and ``_`` are ignored: ``"CIFAR-10"`` works)."""

_DIGITS_XL_OPTIONS: Final[tuple[str, ...]] = (
    "test_per_class",
    "variants_per_image",
    "generation_seed",
    "strength",
    "cache_dir",
)

DATASET_OPTIONS: Final[Mapping[str, tuple[str, ...]]] = {
    "digits": ("test_per_class",),
    "digits_xl": _DIGITS_XL_OPTIONS,
    "digits_xl_rgb32": _DIGITS_XL_OPTIONS,
    "cifar10": (),
    "cinic10": ("cache", "cache_dir", "num_workers", "include_valid"),
    "deap": ("label", "num_classes", "window_seconds", "subjects", "standardize", "test_fraction"),
    "fashion_mnist": (),
}
"""Keyword options each data set accepts."""


@dataclass(frozen=True, eq=False)
class LoadedDataset:
    """Training and test arrays of one data set.

    Attributes
    ----------
    name : str
        Canonical name (one of :data:`DATASET_NAMES`).
    train_images, test_images : numpy.ndarray
        ``float32`` inputs, ``(N, C, H, W)`` images or ``(N, channels, length)`` signals.
    train_labels, test_labels : numpy.ndarray
        ``int64`` labels ``0 .. num_classes - 1``.
    num_classes : int
        Number of classes.
    input_shape : tuple of int
        Shape of one input (``train_images.shape[1:]``).
    class_names : tuple of str
        Name of each class, in label order.
    mean, std : tuple of float or None
        Per-channel normalisation constants for the training code (CIFAR-10, CINIC-10);
        ``None`` where the inputs need none (digits in ``[0, 1]``, DEAP already standardised).
    train_groups, test_groups : numpy.ndarray or None
        ``int64`` group of each sample (DEAP: the subject number; digits_xl: the source original); ``None`` otherwise.
    """

    name: str
    train_images: NDArray[np.float32]
    train_labels: NDArray[np.int64]
    test_images: NDArray[np.float32]
    test_labels: NDArray[np.int64]
    num_classes: int
    input_shape: tuple[int, ...]
    class_names: tuple[str, ...]
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    train_groups: NDArray[np.int64] | None = None
    test_groups: NDArray[np.int64] | None = None


def canonical_dataset_name(name: str) -> str:
    """Map a user-written name (``"CIFAR-10"``, ``"cinic_10"``) to one of :data:`DATASET_NAMES`.

    Raises
    ------
    ValueError
        On an unknown name.
    """
    key = str(name).strip().lower().replace("-", "").replace("_", "")
    canonical = {known.replace("_", ""): known for known in DATASET_NAMES}
    if key not in canonical:
        raise ValueError(f"unknown data set {name!r}: choose one of {list(DATASET_NAMES)}")
    return canonical[key]


def load_dataset(
    name: str,
    root: str | os.PathLike[str] | None = None,
    split: str = "test",
    *,
    seed: int = 0,
    **options: Any,
) -> LoadedDataset:
    """Load a data set's training set and its test (or validation) set.

    Parameters
    ----------
    name : str
        ``"digits"``, ``"digits_xl"``, ``"digits_xl_rgb32"``, ``"cifar10"``, ``"cinic10"``, ``"deap"`` or
        ``"fashion_mnist"`` (see the notes below).
    root : str or path-like, optional
        Local data folder; required for ``cifar10``, ``cinic10`` and ``deap`` (an empty string counts as
        not given; ``fashion_mnist`` then reads Debian's folder). Nothing is ever downloaded.
    split : str, default "test"
        The held-out set returned as ``test_*``: ``"test"``; CINIC-10 also accepts
        ``"valid"``.
    seed : int, default 0
        Seed of the held-out draw for ``digits`` and ``deap``; ignored otherwise.
    **options
        Data-set specific options (:data:`DATASET_OPTIONS`).

    Returns
    -------
    LoadedDataset
        The arrays and their metadata.

    Raises
    ------
    ValueError
        On an unknown name or split, a missing ``root``, or invalid option values.
    TypeError
        On an option the data set does not accept.
    FileNotFoundError
        If the data folder or its files are missing (the message says what to put where).

    Notes
    -----
    ========== ========================= ============================================ =======================
    name       data                      test set                                     root
    ========== ========================= ============================================ =======================
    digits     scikit-learn's bundled    balanced held-out set, ``test_per_class``    not needed (ignored)
               8x8 digits, 10 classes    (default 30) per class, drawn by ``seed``
    digits_xl  digits plus deformed      held-out real originals, ``test_per_class``  optional: the cache
               copies (derived, see      (default 50) per class, drawn by             folder of the generated
               :mod:`.digits_xl`)        ``generation_seed`` (not ``seed``)           arrays
    digits_xl  digits_xl upsampled to    as ``digits_xl``                             as ``digits_xl``
    _rgb32     3x32x32 (ResNet-56's
               input shape)
    cifar10    CIFAR-10, 10 classes      the official ``test_batch`` (10,000)         ``cifar-10-batches-py``
                                                                                      or its parent
    cinic10    CINIC-10, 10 classes      official ``test/`` (``split="test"``) or     CINIC-10 folder or its
                                         ``valid/`` (``split="valid"``), 90,000       parent
    deap       DEAP peripheral signals,  whole trials held out per subject,           ``data_preprocessed_python``
               2 or 4 classes            ``test_fraction`` (default 0.2) by ``seed``  or its parent
    fashion    Fashion-MNIST, 28x28      the official ``t10k`` files (10,000)         optional: the IDX folder
    _mnist     grey-scale, 10 classes                                                 (default: Debian's
                                                                                      ``dataset-fashion-mnist``)
    ========== ========================= ============================================ =======================

    Options (keyword arguments after ``seed``):

    * ``digits``: ``test_per_class``.
    * ``digits_xl``: ``test_per_class``, ``variants_per_image``, ``generation_seed``, ``strength``, ``cache_dir``
      (see :func:`~flmarket_flwr.app.data.digits_xl.load_digits_xl`); ``train_groups`` / ``test_groups`` hold
      each image's source original, for leakage checks.
    * ``digits_xl_rgb32``: as ``digits_xl``; each image bilinearly resized to 32x32 and repeated over 3 channels
      (:func:`~flmarket_flwr.app.data.digits_xl.upsample_to_rgb`).
    * ``cifar10``, ``fashion_mnist``: none.
    * ``cinic10``: ``cache``, ``cache_dir``, ``num_workers`` (see :func:`~flmarket_flwr.app.data.cinic10.load_cinic10`)
      and ``include_valid`` (default ``False``; ``True`` trains on ``train/`` + ``valid/``, 180,000 images,
      and needs ``split="test"``).
    * ``deap``: ``label`` (default ``"valence_arousal"``, 4 classes), ``num_classes``, ``window_seconds``
      (default 4), ``subjects``, ``standardize`` (see :func:`~flmarket_flwr.app.data.deap.load_deap_windows`)
      and ``test_fraction``.

    ``seed`` only matters where the test set is drawn (``digits``, ``deap``); the official
    splits ignore it, so callers may always pass it.
    """
    key = canonical_dataset_name(name)
    unknown = sorted(set(options) - set(DATASET_OPTIONS[key]))
    if unknown:
        raise TypeError(f"unknown option(s) {unknown} for {key!r}; accepted: {list(DATASET_OPTIONS[key]) or 'none'}")
    allowed_splits = ("test", "valid") if key == "cinic10" else ("test",)
    if split not in allowed_splits:
        raise ValueError(f"split for {key!r} must be one of {list(allowed_splits)}, got {split!r}")
    folder = None if root is None or str(root) == "" else root
    return _LOADERS[key](folder, split, seed, options)


def _require_root(name: str, root: str | os.PathLike[str] | None) -> str | os.PathLike[str]:
    """Return ``root`` or explain that a local folder is needed."""
    if root is None:
        raise ValueError(
            f"{name!r} is read from a local folder: pass root=<folder> (see flmarket_flwr.app.data.{name})"
        )
    return root


def _load_digits(root: object, split: str, seed: int, options: dict[str, Any]) -> LoadedDataset:
    """Bundled digits with a balanced, seeded held-out set (``root`` is ignored)."""
    images, labels = load_digits_arrays()
    train_idx, test_idx = train_test_split_balanced(
        labels, test_per_class=options.get("test_per_class", DEFAULT_TEST_PER_CLASS), seed=seed
    )
    return _assemble(
        "digits",
        (images[train_idx], labels[train_idx]),
        (images[test_idx], labels[test_idx]),
        DIGITS_NUM_CLASSES,
        tuple(str(digit) for digit in range(DIGITS_NUM_CLASSES)),
    )


def _load_digits_xl(
    root: str | os.PathLike[str] | None, split: str, seed: int, options: dict[str, Any]
) -> LoadedDataset:
    """Derived digits, cached under ``root`` when given (``seed`` is ignored: ``generation_seed`` fixes the data)."""
    data = digits_xl.load_digits_xl(**{"cache_dir": root, **options})
    return _assemble(
        "digits_xl",
        (data.train_images, data.train_labels),
        (data.test_images, data.test_labels),
        DIGITS_NUM_CLASSES,
        tuple(str(digit) for digit in range(DIGITS_NUM_CLASSES)),
        groups=(data.train_sources, data.test_sources),
    )


def _load_digits_xl_rgb32(
    root: str | os.PathLike[str] | None, split: str, seed: int, options: dict[str, Any]
) -> LoadedDataset:
    """``digits_xl`` upsampled to ``3 x 32 x 32`` (:func:`~flmarket_flwr.app.data.digits_xl.upsample_to_rgb`)."""
    data = _load_digits_xl(root, split, seed, options)
    train_images = digits_xl.upsample_to_rgb(data.train_images)
    return replace(
        data,
        name="digits_xl_rgb32",
        train_images=train_images,
        test_images=digits_xl.upsample_to_rgb(data.test_images),
        input_shape=tuple(int(size) for size in train_images.shape[1:]),
    )


def _load_cifar10(root: str | os.PathLike[str] | None, split: str, seed: int, options: dict[str, Any]) -> LoadedDataset:
    """Official CIFAR-10 training and test batches."""
    folder = _require_root("cifar10", root)
    return _assemble(
        "cifar10",
        cifar10.load_cifar10(folder, "train"),
        cifar10.load_cifar10(folder, "test"),
        cifar10.CIFAR10_NUM_CLASSES,
        cifar10.CIFAR10_CLASS_NAMES,
        mean=cifar10.CIFAR10_MEAN,
        std=cifar10.CIFAR10_STD,
    )


def _load_cinic10(root: str | os.PathLike[str] | None, split: str, seed: int, options: dict[str, Any]) -> LoadedDataset:
    """Official CINIC-10 ``train/`` (plus ``valid/`` on request) and ``test/`` or ``valid/``."""
    folder = _require_root("cinic10", root)
    read_options = {key: value for key, value in options.items() if key != "include_valid"}
    include_valid = bool(options.get("include_valid", False))
    if include_valid and split == "valid":
        raise ValueError("include_valid=True trains on valid/: evaluate on split='test'")
    parts = [cinic10.load_cinic10(folder, part, **read_options) for part in ("train", "valid")[: 1 + include_valid]]
    train = (np.concatenate([images for images, _ in parts]), np.concatenate([labels for _, labels in parts]))
    return _assemble(
        "cinic10",
        train,
        cinic10.load_cinic10(folder, split, **read_options),
        cinic10.CINIC10_NUM_CLASSES,
        cinic10.CINIC10_CLASS_NAMES,
        mean=cinic10.CINIC10_MEAN,
        std=cinic10.CINIC10_STD,
    )


def _load_deap(root: str | os.PathLike[str] | None, split: str, seed: int, options: dict[str, Any]) -> LoadedDataset:
    """DEAP peripheral windows; whole trials held out per subject by ``seed``."""
    folder = _require_root("deap", root)
    read_options = {key: value for key, value in options.items() if key != "test_fraction"}
    windows = deap.load_deap_windows(folder, **read_options)
    train_idx, test_idx = deap.deap_train_test_split(
        windows.subjects,
        windows.trials,
        test_fraction=options.get("test_fraction", deap.DEFAULT_DEAP_TEST_FRACTION),
        seed=seed,
    )
    label = read_options.get("label", deap.DEFAULT_DEAP_LABEL)
    names = deap.QUADRANT_NAMES if windows.num_classes == 4 else (f"low {label}", f"high {label}")
    return _assemble(
        "deap",
        (windows.signals[train_idx], windows.labels[train_idx]),
        (windows.signals[test_idx], windows.labels[test_idx]),
        windows.num_classes,
        names,
        groups=(windows.subjects[train_idx], windows.subjects[test_idx]),
    )


def _assemble(
    name: str,
    train: tuple[NDArray[np.float32], NDArray[np.int64]],
    test: tuple[NDArray[np.float32], NDArray[np.int64]],
    num_classes: int,
    class_names: tuple[str, ...],
    mean: tuple[float, ...] | None = None,
    std: tuple[float, ...] | None = None,
    groups: tuple[NDArray[np.int64], NDArray[np.int64]] | None = None,
) -> LoadedDataset:
    """Build the :class:`LoadedDataset` record."""
    return LoadedDataset(
        name=name,
        train_images=train[0],
        train_labels=train[1],
        test_images=test[0],
        test_labels=test[1],
        num_classes=num_classes,
        input_shape=tuple(int(size) for size in train[0].shape[1:]),
        class_names=tuple(class_names),
        mean=mean,
        std=std,
        train_groups=None if groups is None else groups[0],
        test_groups=None if groups is None else groups[1],
    )


def _load_fashion_mnist(
    root: str | os.PathLike[str] | None, split: str, seed: int, options: dict[str, Any]
) -> LoadedDataset:
    """Official Fashion-MNIST training and test files, from ``root`` or Debian's folder."""
    return _assemble(
        "fashion_mnist",
        fashion_mnist.load_fashion_mnist(root, "train"),
        fashion_mnist.load_fashion_mnist(root, "test"),
        fashion_mnist.FASHION_MNIST_NUM_CLASSES,
        fashion_mnist.FASHION_MNIST_CLASS_NAMES,
    )


_LOADERS: Final[dict[str, Callable[[Any, str, int, dict[str, Any]], LoadedDataset]]] = {
    "digits": _load_digits,
    "digits_xl": _load_digits_xl,
    "digits_xl_rgb32": _load_digits_xl_rgb32,
    "cifar10": _load_cifar10,
    "cinic10": _load_cinic10,
    "deap": _load_deap,
    "fashion_mnist": _load_fashion_mnist,
}
