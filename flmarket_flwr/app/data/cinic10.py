"""CINIC-10 from the official folder of PNG files (nothing is downloaded).

Pass the extracted folder (``train/``, ``valid/``, ``test/``, one sub-folder per class), or its parent, as
``root``. :func:`load_cinic10` decodes a split deterministically and can cache it on disk; its docstring
gives the layout and the cache rules.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final

import numpy as np
from numpy.typing import NDArray

from flmarket_flwr.app.data.cifar10 import CIFAR10_CLASS_NAMES

__all__ = [
    "CINIC10_CLASS_NAMES",
    "CINIC10_DIRNAME",
    "CINIC10_IMAGE_SHAPE",
    "CINIC10_MEAN",
    "CINIC10_NUM_CLASSES",
    "CINIC10_SPLITS",
    "CINIC10_STD",
    "cinic10_cache_path",
    "list_cinic10_files",
    "load_cinic10",
    "read_cinic10_image",
    "resolve_cinic10_dir",
]

CINIC10_CLASS_NAMES: Final[tuple[str, ...]] = CIFAR10_CLASS_NAMES
"""Class folder names in label order (the CIFAR-10 classes and order)."""

CINIC10_NUM_CLASSES: Final[int] = 10
"""Number of classes."""

CINIC10_IMAGE_SHAPE: Final[tuple[int, int, int]] = (3, 32, 32)
"""Shape of one image, channels first."""

CINIC10_SPLITS: Final[tuple[str, ...]] = ("train", "valid", "test")
"""The three official splits (90,000 images each)."""

CINIC10_DIRNAME: Final[str] = "CINIC-10"
"""Folder name looked for inside ``root`` when ``root`` itself has no split folder."""

CINIC10_MEAN: Final[tuple[float, float, float]] = (0.47889522, 0.47227842, 0.43047404)
"""Per-channel (R, G, B) mean published with CINIC-10, pixels scaled to [0, 1]."""

CINIC10_STD: Final[tuple[float, float, float]] = (0.24205776, 0.23828046, 0.25874835)
"""Per-channel (R, G, B) standard deviation published with CINIC-10."""

_CACHE_VERSION: Final[int] = 1
_CHUNK: Final[int] = 512
_DEFAULT_MAX_WORKERS: Final[int] = 8


def resolve_cinic10_dir(root: str | os.PathLike[str]) -> Path:
    """Find the CINIC-10 folder (the one holding ``train/``, ``valid/``, ``test/``).

    Parameters
    ----------
    root : str or path-like
        The CINIC-10 folder itself, or the folder that contains ``CINIC-10/``.

    Returns
    -------
    pathlib.Path
        The folder holding the split folders.

    Raises
    ------
    FileNotFoundError
        If neither ``root`` nor ``root/CINIC-10`` holds a split folder; the message says
        what to download and where to extract it.
    """
    base = Path(root).expanduser()
    for candidate in (base, base / CINIC10_DIRNAME):
        if any((candidate / split).is_dir() for split in CINIC10_SPLITS):
            return candidate
    raise FileNotFoundError(
        f"CINIC-10 not found under {base}: download CINIC-10 (CINIC-10.tar.gz, "
        f"https://github.com/BayesWatch/cinic-10) and extract it so that "
        f"{base / 'train' / 'airplane'} holds the PNG files (likewise valid/ and test/, one folder per class)"
    )


def list_cinic10_files(
    root: str | os.PathLike[str],
    split: str = "train",
) -> tuple[list[Path], NDArray[np.int64]]:
    """List a split's PNG files and their labels, in deterministic order.

    Parameters
    ----------
    root : str or path-like
        The CINIC-10 folder, or the folder that contains ``CINIC-10/``.
    split : {"train", "valid", "test"}, default "train"
        The split.

    Returns
    -------
    paths : list of pathlib.Path
        PNG files, classes in label order, sorted by file name within a class.
    labels : numpy.ndarray
        ``int64`` label of each file.

    Raises
    ------
    FileNotFoundError
        If the folder, the split folder or a class folder is missing, or a class folder
        holds no ``.png`` file.
    ValueError
        On an unknown split.
    """
    _check_split(split)
    folder = resolve_cinic10_dir(root) / split
    if not folder.is_dir():
        raise FileNotFoundError(f"CINIC-10 split folder {folder} is missing: extract the complete CINIC-10 archive")
    paths: list[Path] = []
    labels: list[int] = []
    for label, name in enumerate(CINIC10_CLASS_NAMES):
        class_dir = folder / name
        if not class_dir.is_dir():
            raise FileNotFoundError(
                f"CINIC-10 class folder {class_dir} is missing: {folder} must hold one folder per class "
                f"({', '.join(CINIC10_CLASS_NAMES)}) with the PNG files"
            )
        files = sorted(name for name in os.listdir(class_dir) if name.lower().endswith(".png"))
        if not files:
            raise FileNotFoundError(f"CINIC-10 class folder {class_dir} holds no .png file")
        paths.extend(class_dir / file for file in files)
        labels.extend([label] * len(files))
    return paths, np.asarray(labels, dtype=np.int64)


def read_cinic10_image(path: str | os.PathLike[str]) -> NDArray[np.uint8]:
    """Decode one CINIC-10 PNG to a channels-first RGB array.

    Parameters
    ----------
    path : str or path-like
        A 32x32 image file (any mode Pillow can convert to RGB; greyscale included).

    Returns
    -------
    numpy.ndarray
        ``uint8`` array of shape ``(3, 32, 32)``.

    Raises
    ------
    ValueError
        If the file cannot be decoded or is not 32x32 (the message names the file).
    """
    from PIL import Image

    file = Path(path)
    try:
        with Image.open(file) as image:
            size = image.size
            rgb = np.asarray(image.convert("RGB"), dtype=np.uint8)
    except OSError as error:  # PIL.UnidentifiedImageError and truncated files are OSErrors
        raise ValueError(f"{file}: not a readable image ({error})") from error
    if size != CINIC10_IMAGE_SHAPE[1:]:
        raise ValueError(f"{file}: expected a 32x32 image, got {size[0]}x{size[1]}")
    return np.ascontiguousarray(rgb.transpose(2, 0, 1))


def cinic10_cache_path(
    root: str | os.PathLike[str],
    split: str = "train",
    cache_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """Where :func:`load_cinic10` keeps the cache of a split.

    Parameters
    ----------
    root : str or path-like
        The CINIC-10 folder, or the folder that contains ``CINIC-10/``.
    split : {"train", "valid", "test"}, default "train"
        The split.
    cache_dir : str or path-like, optional
        Folder of the cache; default: the CINIC-10 folder.

    Returns
    -------
    pathlib.Path
        ``<cache_dir>/cinic10-<split>.npz``.
    """
    _check_split(split)
    folder = Path(cache_dir).expanduser() if cache_dir is not None else resolve_cinic10_dir(root)
    return folder / f"cinic10-{split}.npz"


def load_cinic10(
    root: str | os.PathLike[str],
    split: str = "train",
    *,
    cache: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
    num_workers: int | None = None,
) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """Load one CINIC-10 split.

    Parameters
    ----------
    root : str or path-like
        The CINIC-10 folder (holding ``train/``, ``valid/``, ``test/``), or the folder
        that contains ``CINIC-10/``.
    split : {"train", "valid", "test"}, default "train"
        The split.
    cache : bool, default False
        Reuse (or create) the decoded split as ``cinic10-<split>.npz`` (see the notes below).
    cache_dir : str or path-like, optional
        Folder of the cache (created if needed); default: the CINIC-10 folder.
    num_workers : int, optional
        Decoding threads; default ``min(8, os.cpu_count())``.

    Returns
    -------
    images : numpy.ndarray
        ``float32`` array of shape ``(N, 3, 32, 32)``, values in ``[0, 1]``.
    labels : numpy.ndarray
        ``int64`` array of shape ``(N,)``, values ``0 .. 9``
        (:data:`CINIC10_CLASS_NAMES` order).

    Raises
    ------
    FileNotFoundError
        If the folder, the split, a class folder or its PNG files are missing.
    ValueError
        On an unknown split, a bad ``num_workers``, or an unreadable or wrongly sized
        image (the message names the file).

    Notes
    -----
    Download ``CINIC-10.tar.gz`` (https://github.com/BayesWatch/cinic-10) and extract it. The layout is
    ``root/<split>/<class>/*.png`` with ``<class>`` one of ``airplane automobile bird cat deer dog frog horse
    ship truck`` (labels ``0 .. 9``, the CIFAR-10 order); every image is a 32x32 PNG, a greyscale one is
    converted to RGB. Files are read in sorted file-name order within each class, classes in label order, so
    the result is deterministic; a pool of threads decodes them.

    With ``cache=True`` the decoded split is stored as an uncompressed ``cinic10-<split>.npz`` (``uint8``) in
    ``cache_dir``. The cache records a fingerprint of the split's file list (relative names and sizes); a later
    call reuses it when the fingerprint matches and rebuilds it otherwise (also when it is unreadable). A cache
    that cannot be written only gives a warning.
    """
    workers = _check_workers(num_workers)
    paths, labels = list_cinic10_files(root, split)
    cache_file = cinic10_cache_path(root, split, cache_dir) if cache else None
    fingerprint = _fingerprint(paths)
    pixels = _read_cache(cache_file, fingerprint, labels) if cache_file is not None else None
    if pixels is None:
        pixels = _decode_all(paths, workers)
        if cache_file is not None:
            _write_cache(cache_file, fingerprint, pixels, labels)
    images = pixels.astype(np.float32)
    images /= np.float32(255.0)
    return images, labels


def _check_split(split: str) -> None:
    """Raise ``ValueError`` unless ``split`` is an official split."""
    if split not in CINIC10_SPLITS:
        raise ValueError(f"CINIC-10 split must be one of {list(CINIC10_SPLITS)}, got {split!r}")


def _check_workers(num_workers: int | None) -> int:
    """Validate ``num_workers``; return the number of threads to use."""
    if num_workers is None:
        return min(_DEFAULT_MAX_WORKERS, os.cpu_count() or 1)
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(f"num_workers must be an integer >= 1, got {num_workers!r}")
    return num_workers


def _decode_all(paths: list[Path], workers: int) -> NDArray[np.uint8]:
    """Decode every file into one ``uint8`` array ``(N, 3, 32, 32)``."""
    pixels = np.empty((len(paths), *CINIC10_IMAGE_SHAPE), dtype=np.uint8)

    def decode_chunk(start: int) -> None:
        for offset, path in enumerate(paths[start : start + _CHUNK]):
            pixels[start + offset] = read_cinic10_image(path)

    starts = range(0, len(paths), _CHUNK)
    if workers == 1 or len(paths) <= _CHUNK:
        for start in starts:
            decode_chunk(start)
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for _ in pool.map(decode_chunk, starts):  # re-raises the first error
                pass
    return pixels


def _fingerprint(paths: list[Path]) -> str:
    """SHA-256 of the files' class/name and size, in load order."""
    digest = hashlib.sha256(f"cinic10-cache-v{_CACHE_VERSION}\n".encode())
    for path in paths:
        digest.update(f"{path.parent.name}/{path.name}:{path.stat().st_size}\n".encode())
    return digest.hexdigest()


def _read_cache(
    cache_file: Path,
    fingerprint: str,
    labels: NDArray[np.int64],
) -> NDArray[np.uint8] | None:
    """Return the cached pixels if the cache exists and matches, else ``None``."""
    if not cache_file.is_file():
        return None
    try:
        with np.load(cache_file, allow_pickle=False) as stored:
            if str(stored["fingerprint"]) != fingerprint or not np.array_equal(stored["labels"], labels):
                return None
            pixels = stored["images"]
    except (OSError, ValueError, KeyError, EOFError):  # unreadable cache: rebuild it
        return None
    if pixels.dtype != np.uint8 or pixels.shape != (len(labels), *CINIC10_IMAGE_SHAPE):
        return None
    return pixels


def _write_cache(
    cache_file: Path,
    fingerprint: str,
    pixels: NDArray[np.uint8],
    labels: NDArray[np.int64],
) -> None:
    """Write the cache atomically; warn (do not fail) when it cannot be written."""
    temporary = cache_file.with_name(f".{cache_file.stem}.{os.getpid()}.tmp.npz")
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        np.savez(temporary, images=pixels, labels=labels, fingerprint=np.asarray(fingerprint))
        os.replace(temporary, cache_file)
    except OSError as error:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        warnings.warn(f"could not write the CINIC-10 cache {cache_file}: {error}", RuntimeWarning, stacklevel=3)
