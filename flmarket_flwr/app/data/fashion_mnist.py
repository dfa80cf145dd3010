"""Fashion-MNIST (Xiao et al., 2017) from its four gzipped IDX files (nothing is downloaded).

The default folder is Debian's ``dataset-fashion-mnist`` package (:data:`DEBIAN_FASHION_MNIST_DIR`); ``root``
(the app's ``data-root``) overrides it. :func:`read_idx` parses one IDX file and :func:`load_fashion_mnist`
checks each file's header and labels before it returns a split.
"""

from __future__ import annotations

import gzip
import math
import os
import zlib
from pathlib import Path
from typing import Final

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "DEBIAN_FASHION_MNIST_DIR",
    "DEBIAN_PACKAGE",
    "FASHION_MNIST_CLASS_NAMES",
    "FASHION_MNIST_FILES",
    "FASHION_MNIST_IMAGE_SHAPE",
    "FASHION_MNIST_NUM_CLASSES",
    "IDX_TYPES",
    "load_fashion_mnist",
    "read_idx",
    "resolve_fashion_mnist_dir",
]

DEBIAN_PACKAGE: Final[str] = "dataset-fashion-mnist"
"""The Debian package that installs the official files."""

DEBIAN_FASHION_MNIST_DIR: Final[Path] = Path("/usr/share/datasets/fashion-mnist")
"""Where :data:`DEBIAN_PACKAGE` puts them (``dpkg -L dataset-fashion-mnist``): the default folder."""

FASHION_MNIST_CLASS_NAMES: Final[tuple[str, ...]] = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
"""Class names in label order (the data set's README)."""

FASHION_MNIST_NUM_CLASSES: Final[int] = 10
"""Number of classes."""

FASHION_MNIST_IMAGE_SHAPE: Final[tuple[int, int, int]] = (1, 28, 28)
"""Shape of one image, channels first."""

FASHION_MNIST_FILES: Final[dict[str, tuple[str, str]]] = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
"""Images file and labels file of each split."""

IDX_TYPES: Final[dict[int, np.dtype]] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
"""IDX type code (third byte of the magic number) to the big-endian numpy type of the values."""

_UNSIGNED_BYTE: Final[int] = 0x08


def read_idx(path: str | os.PathLike[str]) -> NDArray[np.generic]:
    """Read one IDX file, gzipped (name ending in ``.gz``) or not.

    Parameters
    ----------
    path : str or path-like
        The file.

    Returns
    -------
    numpy.ndarray
        The values, shaped by the header's dimensions, in native byte order.

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    ValueError
        If it is not a readable gzip file (for ``.gz``), or not IDX: its magic number does not start
        with two zero bytes, its type code is unknown, or its length disagrees with the header's
        dimensions. The message names the file.
    """
    file = Path(path)
    content = _read_bytes(file)
    if len(content) < 4 or content[0] != 0 or content[1] != 0:
        raise ValueError(f"{file}: not an IDX file (magic number {content[:4].hex() or 'missing'})")
    code, ndim = content[2], content[3]
    if code not in IDX_TYPES:
        raise ValueError(f"{file}: unknown IDX type code 0x{code:02x} (known: {[hex(key) for key in IDX_TYPES]})")
    header = 4 + 4 * ndim
    if len(content) < header:
        raise ValueError(f"{file}: truncated IDX header ({len(content)} bytes, {header} needed for {ndim} dimensions)")
    shape = tuple(int(size) for size in np.frombuffer(content, dtype=">u4", count=ndim, offset=4))
    dtype = IDX_TYPES[code]
    expected = math.prod(shape) * dtype.itemsize  # exact: a forged header cannot overflow it
    if len(content) - header != expected:
        raise ValueError(
            f"{file}: {len(content) - header} bytes of data, but the header's shape {shape} of "
            f"{dtype.name} needs {expected}"
        )
    values = np.frombuffer(content, dtype=dtype, offset=header).reshape(shape)
    return values.astype(dtype.newbyteorder("="))


def resolve_fashion_mnist_dir(root: str | os.PathLike[str] | None = None) -> Path:
    """The folder holding the IDX files.

    Parameters
    ----------
    root : str or path-like, optional
        A folder with the four files, or one that contains a ``fashion-mnist`` folder with them;
        ``None``: :data:`DEBIAN_FASHION_MNIST_DIR`.

    Returns
    -------
    pathlib.Path
        The folder.

    Raises
    ------
    FileNotFoundError
        If no candidate folder holds any of the files; the message names the Debian package and
        the ``data-root`` key.
    """
    base = DEBIAN_FASHION_MNIST_DIR if root is None else Path(root).expanduser()
    names = [name for pair in FASHION_MNIST_FILES.values() for name in pair]
    for candidate in (base, base / "fashion-mnist"):
        if any(_find(candidate, name) is not None for name in names):
            return candidate
    raise FileNotFoundError(f"Fashion-MNIST not found under {base}: {_INSTALL_HINT}")


def load_fashion_mnist(
    root: str | os.PathLike[str] | None = None,
    split: str = "train",
) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """Load the training or test split.

    Parameters
    ----------
    root : str or path-like, optional
        Folder of the IDX files (see :func:`resolve_fashion_mnist_dir`); default: Debian's.
    split : {"train", "test"}, default "train"
        ``"train"``: 60,000 images; ``"test"``: the official 10,000.

    Returns
    -------
    images : numpy.ndarray
        ``float32``, ``(N, 1, 28, 28)``, values in ``[0, 1]`` (pixel / 255).
    labels : numpy.ndarray
        ``int64``, ``(N,)``, values ``0 .. 9`` (:data:`FASHION_MNIST_CLASS_NAMES` order).

    Raises
    ------
    FileNotFoundError
        If the folder or one of the split's two files is missing (the message names the Debian
        package and the ``data-root`` key).
    ValueError
        On an unknown split, or a file that is not what it should be (the message names the file).
    """
    if split not in FASHION_MNIST_FILES:
        raise ValueError(f"Fashion-MNIST split must be one of {sorted(FASHION_MNIST_FILES)}, got {split!r}")
    folder = resolve_fashion_mnist_dir(root)
    images_path, labels_path = (_require(folder, name) for name in FASHION_MNIST_FILES[split])
    pixels = _check_images(images_path, read_idx(images_path))
    labels = _check_labels(labels_path, read_idx(labels_path))
    if len(labels) != len(pixels):
        raise ValueError(f"{labels_path}: {len(labels)} labels for the {len(pixels)} images of {images_path}")
    images = pixels[:, None].astype(np.float32)
    images /= np.float32(255.0)
    return images, labels.astype(np.int64)


_INSTALL_HINT: Final[str] = (
    f"install the Debian package ('apt-get install {DEBIAN_PACKAGE}', files in {DEBIAN_FASHION_MNIST_DIR}) "
    "or set data-root to a folder holding train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
    "t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz"
)


def _find(folder: Path, name: str) -> Path | None:
    """``folder/name``, or the same file decompressed (no ``.gz``), or ``None``."""
    for candidate in (folder / name, folder / name.removesuffix(".gz")):
        if candidate.is_file():
            return candidate
    return None


def _require(folder: Path, name: str) -> Path:
    """The file ``name`` in ``folder``, or a ``FileNotFoundError`` that says how to get it."""
    found = _find(folder, name)
    if found is None:
        raise FileNotFoundError(f"Fashion-MNIST folder {folder} lacks {name}: {_INSTALL_HINT}")
    return found


def _read_bytes(file: Path) -> bytes:
    """The file's content, decompressed when its name ends in ``.gz``."""
    if file.suffix != ".gz":
        return file.read_bytes()
    try:
        with gzip.open(file, "rb") as stream:
            return stream.read()
    except (OSError, EOFError, zlib.error) as error:
        if isinstance(error, FileNotFoundError):
            raise
        raise ValueError(f"{file}: not a readable gzip file ({error})") from error


def _check_images(file: Path, values: NDArray[np.generic]) -> NDArray[np.uint8]:
    """Require ``(N, 28, 28)`` unsigned bytes (magic number ``0x00000803``)."""
    _check_magic(file, values, 3, "images")
    if values.shape[1:] != FASHION_MNIST_IMAGE_SHAPE[1:]:
        raise ValueError(f"{file}: images must be 28x28, the header says shape {values.shape}")
    return values.astype(np.uint8, copy=False)


def _check_labels(file: Path, values: NDArray[np.generic]) -> NDArray[np.uint8]:
    """Require ``(N,)`` unsigned bytes in ``0 .. 9`` (magic number ``0x00000801``)."""
    _check_magic(file, values, 1, "labels")
    labels = values.astype(np.uint8, copy=False)
    if labels.size and int(labels.max()) >= FASHION_MNIST_NUM_CLASSES:
        bad = int(np.count_nonzero(labels >= FASHION_MNIST_NUM_CLASSES))
        raise ValueError(
            f"{file}: labels must lie in 0..{FASHION_MNIST_NUM_CLASSES - 1}, {bad} do not (largest {int(labels.max())})"
        )
    return labels


def _check_magic(file: Path, values: NDArray[np.generic], ndim: int, what: str) -> None:
    """Require unsigned bytes (IDX type ``0x08``) in ``ndim`` dimensions: magic number ``0x000008<ndim>``."""
    if values.dtype != np.uint8 or values.ndim != ndim:
        code = next(key for key, dtype in IDX_TYPES.items() if dtype.newbyteorder("=") == values.dtype)
        raise ValueError(
            f"{file}: magic number 0x0000{code:02x}{values.ndim:02x} ({values.dtype.name}, {values.ndim}-D), "
            f"expected 0x0000{_UNSIGNED_BYTE:02x}{ndim:02x}: {what} are uint8 in {ndim} dimension(s)"
        )
