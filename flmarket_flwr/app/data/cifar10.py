"""CIFAR-10 from the official "CIFAR-10 python version" folder (nothing is downloaded).

Pass the extracted ``cifar-10-batches-py`` folder, or its parent, as ``root``; :func:`load_cifar10` says
what it reads and returns. Normalising with :func:`normalize_images` is left to the training code.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from flmarket_flwr.app.data._legacy_pickle import load_pickled_dict

__all__ = [
    "CIFAR10_CLASS_NAMES",
    "CIFAR10_DIRNAME",
    "CIFAR10_IMAGE_SHAPE",
    "CIFAR10_MEAN",
    "CIFAR10_NUM_CLASSES",
    "CIFAR10_SPLITS",
    "CIFAR10_STD",
    "TRAIN_BATCHES",
    "load_cifar10",
    "load_cifar10_label_names",
    "normalize_images",
    "read_cifar10_batch",
    "resolve_cifar10_dir",
]

CIFAR10_DIRNAME: Final[str] = "cifar-10-batches-py"
"""Name of the folder inside the official archive."""

CIFAR10_CLASS_NAMES: Final[tuple[str, ...]] = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
"""Class names in label order (as in ``batches.meta``)."""

CIFAR10_NUM_CLASSES: Final[int] = 10
"""Number of classes."""

CIFAR10_IMAGE_SHAPE: Final[tuple[int, int, int]] = (3, 32, 32)
"""Shape of one image, channels first."""

CIFAR10_MEAN: Final[tuple[float, float, float]] = (0.4914, 0.4822, 0.4465)
"""Per-channel (R, G, B) mean of the 50,000 training images, pixels scaled to [0, 1]."""

CIFAR10_STD: Final[tuple[float, float, float]] = (0.2470, 0.2435, 0.2616)
"""Per-channel (R, G, B) standard deviation over all training pixels, scaled to [0, 1]."""

TRAIN_BATCHES: Final[tuple[str, ...]] = tuple(f"data_batch_{number}" for number in range(1, 6))
"""File names of the five training batches."""

CIFAR10_SPLITS: Final[dict[str, tuple[str, ...]]] = {"train": TRAIN_BATCHES, "test": ("test_batch",)}
"""Batch files of each split."""

_ARCHIVE_NAME: Final[str] = "cifar-10-python.tar.gz"
_META_NAME: Final[str] = "batches.meta"
_ROW_LENGTH: Final[int] = 3 * 32 * 32


def resolve_cifar10_dir(root: str | os.PathLike[str]) -> Path:
    """Find the ``cifar-10-batches-py`` folder from a user-given root.

    Parameters
    ----------
    root : str or path-like
        The ``cifar-10-batches-py`` folder itself, or the folder that contains it.

    Returns
    -------
    pathlib.Path
        The folder holding the batch files.

    Raises
    ------
    FileNotFoundError
        If neither ``root`` nor ``root/cifar-10-batches-py`` holds a batch file; the
        message says what to download and where to extract it.
    """
    base = Path(root).expanduser()
    for candidate in (base, base / CIFAR10_DIRNAME):
        if any((candidate / name).is_file() for name in (*TRAIN_BATCHES, "test_batch")):
            return candidate
    raise FileNotFoundError(_missing_message(base))


def read_cifar10_batch(path: str | os.PathLike[str]) -> tuple[NDArray[np.uint8], NDArray[np.int64]]:
    """Read one official batch file.

    Parameters
    ----------
    path : str or path-like
        A ``data_batch_<k>`` or ``test_batch`` file.

    Returns
    -------
    images : numpy.ndarray
        ``uint8`` array of shape ``(N, 3, 32, 32)`` (channel, row, column).
    labels : numpy.ndarray
        ``int64`` array of shape ``(N,)``, values ``0 .. 9``.

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    ValueError
        If the file is not a CIFAR-10 batch (not a pickled dict, missing ``data`` or
        ``labels``, wrong dtype or shape, labels out of range).
    """
    file = Path(path)
    batch = load_pickled_dict(file)
    data = _batch_data(file, batch)
    labels = _batch_labels(file, batch, len(data))
    return data.reshape(-1, *CIFAR10_IMAGE_SHAPE), labels


def load_cifar10(
    root: str | os.PathLike[str],
    split: str = "train",
) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """Load the CIFAR-10 training or test split.

    Parameters
    ----------
    root : str or path-like
        The ``cifar-10-batches-py`` folder, or the folder that contains it.
    split : {"train", "test"}, default "train"
        ``"train"``: the five ``data_batch_<k>`` files in order (50,000 images);
        ``"test"``: ``test_batch`` (10,000 images).

    Returns
    -------
    images : numpy.ndarray
        ``float32`` array of shape ``(N, 3, 32, 32)``, values in ``[0, 1]``.
    labels : numpy.ndarray
        ``int64`` array of shape ``(N,)``, values ``0 .. 9``
        (:data:`CIFAR10_CLASS_NAMES` order).

    Raises
    ------
    FileNotFoundError
        If the folder or one of the split's batch files is missing.
    ValueError
        On an unknown split or a corrupt batch file (the message names the file).

    Notes
    -----
    Download ``cifar-10-python.tar.gz`` from https://www.cs.toronto.edu/~kriz/cifar.html and extract it. Each
    batch is a Python 2 pickle of a ``dict`` whose ``data`` entry is a ``uint8`` array of shape ``(N, 3072)``:
    each row is one 32x32 colour image stored as three row-major channel planes (red, green, blue, 1,024
    values each); ``labels`` is a list of ``N`` ints in ``0 .. 9``. Images are returned channels first,
    pixel / 255.
    """
    if split not in CIFAR10_SPLITS:
        raise ValueError(f"CIFAR-10 split must be one of {sorted(CIFAR10_SPLITS)}, got {split!r}")
    folder = resolve_cifar10_dir(root)
    missing = [name for name in CIFAR10_SPLITS[split] if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"CIFAR-10 folder {folder} lacks {', '.join(missing)}: extract the complete "
            f"'{_ARCHIVE_NAME}' there (it holds data_batch_1..5, test_batch and batches.meta)"
        )
    parts = [read_cifar10_batch(folder / name) for name in CIFAR10_SPLITS[split]]
    pixels = np.concatenate([images for images, _ in parts])
    labels = np.concatenate([batch_labels for _, batch_labels in parts])
    return _to_unit_float(pixels), labels


def load_cifar10_label_names(root: str | os.PathLike[str]) -> tuple[str, ...]:
    """Read the class names from ``batches.meta``.

    Parameters
    ----------
    root : str or path-like
        The ``cifar-10-batches-py`` folder, or the folder that contains it.

    Returns
    -------
    tuple of str
        The ten class names in label order.

    Raises
    ------
    FileNotFoundError
        If the folder or ``batches.meta`` is missing.
    ValueError
        If ``batches.meta`` has no list of ten ``label_names``.
    """
    folder = resolve_cifar10_dir(root)
    path = folder / _META_NAME
    if not path.is_file():
        raise FileNotFoundError(
            f"CIFAR-10 folder {folder} lacks {_META_NAME}: extract the complete '{_ARCHIVE_NAME}' there"
        )
    names = load_pickled_dict(path).get("label_names")
    if not isinstance(names, (list, tuple)) or len(names) != CIFAR10_NUM_CLASSES:
        raise ValueError(f"{path}: expected 'label_names', a list of {CIFAR10_NUM_CLASSES} names, got {names!r}")
    return tuple(name.decode("latin1") if isinstance(name, bytes) else str(name) for name in names)


def normalize_images(
    images: NDArray[np.float32],
    mean: tuple[float, ...] = CIFAR10_MEAN,
    std: tuple[float, ...] = CIFAR10_STD,
) -> NDArray[np.float32]:
    """Standardise channels-first images per channel: ``(x - mean[c]) / std[c]``.

    Parameters
    ----------
    images : numpy.ndarray
        Array of shape ``(N, C, H, W)``, values in ``[0, 1]``.
    mean, std : tuple of float
        Per-channel constants, ``C`` each (default: CIFAR-10's).

    Returns
    -------
    numpy.ndarray
        A new ``float32`` array of the same shape.

    Raises
    ------
    ValueError
        If the constants do not match the channel count or a ``std`` is not positive.
    """
    array = np.asarray(images, dtype=np.float32)
    if array.ndim != 4 or len(mean) != array.shape[1] or len(std) != array.shape[1]:
        raise ValueError(f"need (N, C, H, W) images and C constants, got shape {array.shape}, {len(mean)}/{len(std)}")
    if min(std) <= 0:
        raise ValueError(f"std must be positive, got {std}")
    shift = np.asarray(mean, dtype=np.float32).reshape(1, -1, 1, 1)
    scale = np.asarray(std, dtype=np.float32).reshape(1, -1, 1, 1)
    return (array - shift) / scale


def _batch_data(file: Path, batch: dict[str, Any]) -> NDArray[np.uint8]:
    """Validate a batch's ``data`` entry: ``uint8`` of shape ``(N, 3072)``."""
    if "data" not in batch:
        raise ValueError(f"{file}: not a CIFAR-10 batch, no 'data' entry (keys: {sorted(map(str, batch))})")
    data = batch["data"]
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != _ROW_LENGTH:
        described = f"{data.dtype} array of shape {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise ValueError(f"{file}: 'data' must be a uint8 array of shape (N, {_ROW_LENGTH}), got {described}")
    return data


def _batch_labels(file: Path, batch: dict[str, Any], count: int) -> NDArray[np.int64]:
    """Validate a batch's ``labels`` entry: ``count`` ints in ``0 .. 9``."""
    if "labels" not in batch:
        raise ValueError(f"{file}: not a CIFAR-10 batch, no 'labels' entry (keys: {sorted(map(str, batch))})")
    try:
        labels = np.asarray(batch["labels"], dtype=np.int64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{file}: 'labels' are not integers ({error})") from error
    if labels.shape != (count,):
        raise ValueError(f"{file}: {labels.size} labels for {count} images")
    if count and (labels.min() < 0 or labels.max() >= CIFAR10_NUM_CLASSES):
        raise ValueError(f"{file}: labels must lie in 0..{CIFAR10_NUM_CLASSES - 1}, got {labels.min()}..{labels.max()}")
    return labels


def _to_unit_float(pixels: NDArray[np.uint8]) -> NDArray[np.float32]:
    """Scale ``uint8`` pixels to ``float32`` in ``[0, 1]``."""
    images = pixels.astype(np.float32)
    images /= np.float32(255.0)
    return images


def _missing_message(base: Path) -> str:
    """Explain where the extracted CIFAR-10 folder must go."""
    hint = ""
    if (base / _ARCHIVE_NAME).is_file():
        hint = f" (found {base / _ARCHIVE_NAME}: extract it with 'tar -xzf {_ARCHIVE_NAME}' in {base})"
    return (
        f"CIFAR-10 not found under {base}: download 'CIFAR-10 python version' ({_ARCHIVE_NAME}) from "
        f"https://www.cs.toronto.edu/~kriz/cifar.html and extract it so that "
        f"{base / CIFAR10_DIRNAME / 'data_batch_1'} exists{hint}"
    )
