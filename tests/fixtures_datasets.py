"""Writers of small fixtures in the official on-disk formats of CIFAR-10, CINIC-10, DEAP and Fashion-MNIST.

The CIFAR-10 batches and DEAP's ``sNN.dat`` are Python 2 ``cPickle`` files. Python 3
cannot write those byte for byte (it pickles ``bytes`` through ``_codecs.encode`` and
names ``numpy._core``), so :func:`py2_pickle_dumps` emits the Python 2 protocol-2
opcodes directly: ``str`` as ``SHORT_BINSTRING``/``BINSTRING``, numpy arrays through
``numpy.core.multiarray._reconstruct`` with the raw buffer as a Python 2 string, as
Python 2's numpy did. :func:`write_cifar10` can also write Python 3 pickles with
``bytes`` keys (``pickle.dump(..., protocol=2)``) for the loader's other accepted form.
Fashion-MNIST's files are gzipped IDX: :func:`idx_bytes` packs the header with ``struct``
(two zero bytes, the type code, the number of dimensions, each dimension as a big-endian
``uint32``) and the values big-endian, independently of the loader's parser.
"""

from __future__ import annotations

import gzip
import pickle
import struct
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

CLASS_NAMES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")

_GLOBAL_RECONSTRUCT = b"cnumpy.core.multiarray\n_reconstruct\n"
_GLOBAL_NDARRAY = b"cnumpy\nndarray\n"
_GLOBAL_DTYPE = b"cnumpy\ndtype\n"


def py2_pickle_dumps(obj: Any) -> bytes:
    """Pickle ``obj`` as Python 2's ``cPickle.dumps(obj, 2)`` would.

    Supports ``None``, ``bool``, ``int``, ``float``, ``str``/``bytes`` (both become a
    Python 2 ``str``), ``list``, ``tuple``, ``dict`` and numpy arrays.
    """
    out = bytearray(b"\x80\x02")
    _emit(obj, out)
    out += b"."
    return bytes(out)


def _emit(obj: Any, out: bytearray) -> None:
    """Append the opcodes of one object."""
    if obj is None:
        out += b"N"
    elif isinstance(obj, bool):
        out += b"\x88" if obj else b"\x89"
    elif isinstance(obj, (int, np.integer)):
        _emit_int(int(obj), out)
    elif isinstance(obj, float):
        out += b"G" + struct.pack(">d", obj)
    elif isinstance(obj, (str, bytes)):
        _emit_py2_str(obj if isinstance(obj, bytes) else obj.encode("ascii"), out)
    elif isinstance(obj, list):
        out += b"]"
        if obj:
            out += b"("
            for item in obj:
                _emit(item, out)
            out += b"e"
    elif isinstance(obj, tuple):
        _emit_tuple(obj, out)
    elif isinstance(obj, dict):
        out += b"}("
        for key, value in obj.items():
            _emit(key, out)
            _emit(value, out)
        out += b"u"
    elif isinstance(obj, np.ndarray):
        _emit_array(obj, out)
    else:
        raise TypeError(f"cannot emit {type(obj).__name__}")


def _emit_tuple(items: tuple[Any, ...], out: bytearray) -> None:
    """EMPTY_TUPLE / TUPLE1..3 as protocol 2 writes short tuples, else MARK ... TUPLE."""
    if len(items) > 3:
        out += b"("
    for item in items:
        _emit(item, out)
    out += {0: b")", 1: b"\x85", 2: b"\x86", 3: b"\x87"}.get(len(items), b"t")


def _emit_int(value: int, out: bytearray) -> None:
    """BININT1 / BININT2 / BININT."""
    if 0 <= value < 256:
        out += b"K" + bytes([value])
    elif 0 <= value < 65536:
        out += b"M" + struct.pack("<H", value)
    else:
        out += b"J" + struct.pack("<i", value)


def _emit_py2_str(data: bytes, out: bytearray) -> None:
    """SHORT_BINSTRING / BINSTRING: a Python 2 ``str``."""
    if len(data) < 256:
        out += b"U" + bytes([len(data)]) + data
    else:
        out += b"T" + struct.pack("<i", len(data)) + data


def _emit_array(array: NDArray[Any], out: bytearray) -> None:
    """A numpy array the way Python 2's numpy reduced it."""
    out += _GLOBAL_RECONSTRUCT
    out += _GLOBAL_NDARRAY
    _emit((0,), out)
    _emit(b"b", out)
    out += b"\x87R("  # TUPLE3 (ndarray, (0,), 'b'), REDUCE, then MARK of the state tuple
    _emit(1, out)
    _emit(tuple(array.shape), out)
    out += _GLOBAL_DTYPE
    _emit((array.dtype.str[1:], 0, 1), out)
    out += b"R"
    _emit((3, array.dtype.str[0], None, None, None, -1, -1, 0), out)
    out += b"b\x89"
    _emit_py2_str(np.ascontiguousarray(array).tobytes(), out)
    out += b"tb"


# --------------------------------------------------------------------------- CIFAR-10


def cifar_rows(count: int, rng: np.random.Generator) -> NDArray[np.uint8]:
    """Random ``uint8`` rows ``(count, 3072)``, as in the official ``data`` entry."""
    return rng.integers(0, 256, size=(count, 3072), dtype=np.uint8)


def write_cifar10(
    parent: Path,
    per_batch: int = 20,
    test_size: int = 20,
    seed: int = 0,
    python2: bool = True,
) -> tuple[Path, dict[str, tuple[NDArray[np.uint8], list[int]]]]:
    """Write ``parent/cifar-10-batches-py`` with five training batches, a test batch and meta.

    Returns the folder and, per file name, the written ``data`` rows and labels.
    """
    rng = np.random.default_rng(seed)
    folder = parent / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    written: dict[str, tuple[NDArray[np.uint8], list[int]]] = {}
    files = [(f"data_batch_{k}", per_batch) for k in range(1, 6)] + [("test_batch", test_size)]
    for index, (name, size) in enumerate(files):
        data = cifar_rows(size, rng)
        labels = [int(label) for label in rng.permutation(np.arange(size) % 10)]
        batch_label = f"training batch {index + 1} of 5" if name != "test_batch" else "testing batch 1 of 1"
        batch = {
            "batch_label": batch_label,
            "labels": labels,
            "data": data,
            "filenames": [f"img_{index}_{number}.png" for number in range(size)],
        }
        write_cifar_pickle(folder / name, batch, python2)
        written[name] = (data, labels)
    meta = {"num_cases_per_batch": per_batch, "label_names": list(CLASS_NAMES), "num_vis": 3072}
    write_cifar_pickle(folder / "batches.meta", meta, python2)
    return folder, written


def write_cifar_pickle(path: Path, content: dict[str, Any], python2: bool = True) -> None:
    """Write a CIFAR-style pickle: Python 2 ``str`` keys, or Python 3 ``bytes`` keys at protocol 2."""
    if python2:
        path.write_bytes(py2_pickle_dumps(content))
        return
    as_bytes = {
        key.encode(): ([item.encode() for item in value] if key == "label_names" else value)
        for key, value in content.items()
    }
    with open(path, "wb") as handle:
        pickle.dump(as_bytes, handle, protocol=2)


# --------------------------------------------------------------------------- CINIC-10


def write_cinic10(
    root: Path,
    per_class: int = 3,
    seed: int = 0,
    splits: tuple[str, ...] = ("train", "valid", "test"),
) -> dict[str, list[tuple[Path, NDArray[np.uint8], int]]]:
    """Write ``root/<split>/<class>/*.png`` (32x32 RGB; one greyscale image per split, in ``cat``).

    Returns, per split, ``(path, expected (3, 32, 32) uint8 pixels, label)`` in load order.
    """
    from PIL import Image

    rng = np.random.default_rng(seed)
    written: dict[str, list[tuple[Path, NDArray[np.uint8], int]]] = {}
    for split in splits:
        entries: list[tuple[Path, NDArray[np.uint8], int]] = []
        for label, name in enumerate(CLASS_NAMES):
            class_dir = root / split / name
            class_dir.mkdir(parents=True)
            for number in range(per_class):
                path = class_dir / f"cifar10-{split}-{label * 100 + number:05d}.png"
                if name == "cat" and number == 0:
                    grey = rng.integers(0, 256, size=(32, 32), dtype=np.uint8)
                    Image.fromarray(grey, mode="L").save(path)
                    expected = np.stack([grey] * 3)
                else:
                    rgb = rng.integers(0, 256, size=(32, 32, 3), dtype=np.uint8)
                    Image.fromarray(rgb, mode="RGB").save(path)
                    expected = rgb.transpose(2, 0, 1)
                entries.append((path, expected, label))
        written[split] = entries
    return written


# --------------------------------------------------------------------------- DEAP


def deap_subject_content(
    ratings: NDArray[np.float64],
    seed: int,
    num_channels: int = 40,
    num_samples: int = 8064,
) -> dict[str, NDArray[np.float64]]:
    """A DEAP ``sNN.dat`` dict: ``data`` ``(T, 40, 8064)`` float64, ``labels`` ``(T, 4)``.

    Each channel gets its own offset and scale so standardisation is visible.
    """
    rng = np.random.default_rng(seed)
    trials = len(ratings)
    offsets = rng.uniform(-50, 50, size=(1, num_channels, 1))
    scales = rng.uniform(0.5, 20, size=(1, num_channels, 1))
    data = offsets + scales * rng.standard_normal((trials, num_channels, num_samples))
    return {"labels": np.asarray(ratings, dtype=np.float64), "data": data}


def write_deap_subject(path: Path, content: dict[str, Any]) -> None:
    """Write a DEAP subject file as the official Python 2 pickle."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(py2_pickle_dumps(content))


# --------------------------------------------------------------------------- Fashion-MNIST

IDX_TYPE_CODES = {"u1": 0x08, "i1": 0x09, "i2": 0x0B, "i4": 0x0C, "f4": 0x0D, "f8": 0x0E}
"""IDX type code of each numpy kind-and-size (``dtype.str[1:]``)."""

FASHION_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}


def idx_bytes(array: NDArray[Any], code: int | None = None, shape: tuple[int, ...] | None = None) -> bytes:
    """The IDX encoding of ``array``: header (``code`` and ``shape`` overridable, to forge bad files), then values."""
    values = np.ascontiguousarray(array)
    type_code = IDX_TYPE_CODES[values.dtype.str[1:]] if code is None else code
    dims = values.shape if shape is None else shape
    header = struct.pack(">BBBB", 0, 0, type_code, len(dims)) + struct.pack(f">{len(dims)}I", *dims)
    return header + values.astype(values.dtype.newbyteorder(">")).tobytes()


def write_idx_gz(path: Path, content: bytes) -> Path:
    """Write ``content`` gzipped to ``path`` (as the official ``*.gz`` files)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(content))
    return path


def write_fashion_mnist(
    folder: Path, train_size: int = 30, test_size: int = 20, seed: int = 0
) -> dict[str, tuple[NDArray[np.uint8], NDArray[np.uint8]]]:
    """Write the four gzipped IDX files of a small Fashion-MNIST into ``folder``.

    Returns, per split, the written ``(N, 28, 28)`` ``uint8`` images and ``(N,)`` labels (every class present).
    """
    rng = np.random.default_rng(seed)
    written = {}
    for split, size in (("train", train_size), ("test", test_size)):
        images = rng.integers(0, 256, size=(size, 28, 28), dtype=np.uint8)
        labels = rng.permutation(np.arange(size) % 10).astype(np.uint8)
        images_name, labels_name = FASHION_FILES[split]
        write_idx_gz(folder / images_name, idx_bytes(images))
        write_idx_gz(folder / labels_name, idx_bytes(labels))
        written[split] = (images, labels)
    return written
