"""Tests of the Fashion-MNIST loader: small gzipped IDX fixtures always, the installed files too.

The fixtures are written in the official format by ``fixtures_datasets.idx_bytes`` (``struct``, not the
loader's parser). The ``test_installed_*`` tests read Debian's ``dataset-fashion-mnist`` (CI installs it);
without the package they fail with a message that says how to install it, never skip: the results of
issue 22 rest on these files. Deselect them explicitly with ``-k "not installed"``.
"""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

import numpy as np
import pytest
from fixtures_datasets import FASHION_FILES, idx_bytes, write_fashion_mnist, write_idx_gz
from hypothesis import given, settings
from hypothesis import strategies as st

from flmarket_flwr.app.data import LoadedDataset, load_dataset, make_partition
from flmarket_flwr.app.data import fashion_mnist as fmnist
from flmarket_flwr.app.data.fashion_mnist import (
    DEBIAN_PACKAGE,
    FASHION_MNIST_CLASS_NAMES,
    load_fashion_mnist,
    read_idx,
    resolve_fashion_mnist_dir,
)
from flmarket_flwr.app.task import DataConfig
from flmarket_flwr.pricing import alpha

# sha256 of the four decompressed files of Debian's dataset-fashion-mnist 0.0~git20200523.55506a9-1,
# the data behind results/fashion_mnist/.
INSTALLED_SHA256 = {
    "train-images-idx3-ubyte.gz": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
    "train-labels-idx1-ubyte.gz": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
    "t10k-images-idx3-ubyte.gz": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
    "t10k-labels-idx1-ubyte.gz": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
}
# The first ten labels of each official split (Zalando's README: ankle boot, T-shirt, T-shirt, dress, ...).
FIRST_TRAIN_LABELS = [9, 0, 0, 3, 0, 2, 7, 2, 5, 5]
FIRST_TEST_LABELS = [9, 2, 1, 1, 6, 1, 4, 6, 5, 7]


@pytest.fixture(scope="module")
def fixture_root(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """A folder with the four gzipped IDX files: 30 training and 20 test images."""
    folder = tmp_path_factory.mktemp("fashion")
    return folder, write_fashion_mnist(folder)


def _copy(source: Path, target: Path) -> Path:
    """Copy the fixture's files so a test can damage one."""
    target.mkdir()
    for path in source.iterdir():
        (target / path.name).write_bytes(path.read_bytes())
    return target


# --------------------------------------------------------------------------- fixtures in the real format


def test_splits_shapes_dtypes_and_exact_pixels(fixture_root: tuple[Path, dict]) -> None:
    folder, written = fixture_root
    for split, size in (("train", 30), ("test", 20)):
        images, labels = load_fashion_mnist(folder, split)
        assert images.shape == (size, 1, 28, 28) and images.dtype == np.float32
        assert labels.shape == (size,) and labels.dtype == np.int64
        np.testing.assert_array_equal(labels, written[split][1])
        np.testing.assert_array_equal(images[:, 0], written[split][0].astype(np.float32) / np.float32(255.0))
        assert images.min() == 0.0 and images.max() == 1.0  # 23,520 random bytes reach both ends


def test_pixels_are_row_major_rows(tmp_path: Path) -> None:
    rows, cols = np.meshgrid(np.arange(28), np.arange(28), indexing="ij")
    image = (rows * 9).astype(np.uint8)  # varies along the rows only
    images = np.stack([image, image.T, np.full((28, 28), 200, np.uint8)])
    write_idx_gz(tmp_path / "t10k-images-idx3-ubyte.gz", idx_bytes(images))
    write_idx_gz(tmp_path / "t10k-labels-idx1-ubyte.gz", idx_bytes(np.array([4, 0, 9], np.uint8)))
    loaded, labels = load_fashion_mnist(tmp_path, "test")
    assert labels.tolist() == [4, 0, 9]
    np.testing.assert_allclose(loaded[0, 0] * 255, rows * 9, atol=1e-4)  # pixel (r, c) holds 9 r
    np.testing.assert_allclose(loaded[1, 0] * 255, cols * 9, atol=1e-4)
    np.testing.assert_allclose(loaded[2, 0] * 255, 200, atol=1e-4)


@settings(max_examples=40, deadline=None)
@given(
    kind=st.sampled_from(["u1", "i1", "i2", "i4", "f4", "f8"]),
    shape=st.lists(st.integers(0, 5), min_size=1, max_size=4).map(tuple),
    seed=st.integers(0, 2**32 - 1),
)
def test_read_idx_round_trips_every_type_big_endian(
    tmp_path_factory: pytest.TempPathFactory, kind: str, shape: tuple[int, ...], seed: int
) -> None:
    rng = np.random.default_rng(seed)
    dtype = np.dtype(kind)
    if dtype.kind == "f":
        array = rng.standard_normal(shape).astype(dtype)
    else:
        info = np.iinfo(dtype)
        array = rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    folder = tmp_path_factory.mktemp("idx")
    gzipped = read_idx(write_idx_gz(folder / "a.gz", idx_bytes(array)))
    (folder / "a.idx").write_bytes(idx_bytes(array))
    plain = read_idx(folder / "a.idx")
    for result in (gzipped, plain):
        assert result.shape == shape and result.dtype == dtype and result.dtype.isnative
        np.testing.assert_array_equal(result, array)


def test_folder_resolution_parent_decompressed_and_default(
    fixture_root: tuple[Path, dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, written = fixture_root
    nested = _copy(folder, tmp_path / "fashion-mnist")
    assert resolve_fashion_mnist_dir(tmp_path) == nested  # the parent of a fashion-mnist folder
    for name in FASHION_FILES["test"]:  # decompressed by the user: the names without .gz
        path = nested / name
        path.with_suffix("").write_bytes(gzip.decompress(path.read_bytes()))
        path.unlink()
    images, labels = load_fashion_mnist(tmp_path, "test")
    np.testing.assert_array_equal(labels, written["test"][1])
    assert images.shape == (20, 1, 28, 28)
    monkeypatch.setattr(fmnist, "DEBIAN_FASHION_MNIST_DIR", folder)  # root None: the package's folder
    np.testing.assert_array_equal(load_fashion_mnist()[1], written["train"][1])


def test_missing_folder_names_the_package_and_data_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(FileNotFoundError) as error:
        load_fashion_mnist(tmp_path / "nowhere")
    message = str(error.value)
    assert str(tmp_path / "nowhere") in message
    assert f"apt-get install {DEBIAN_PACKAGE}" in message and "data-root" in message
    monkeypatch.setattr(fmnist, "DEBIAN_FASHION_MNIST_DIR", tmp_path / "not-installed")
    with pytest.raises(FileNotFoundError, match="not-installed") as error:
        load_fashion_mnist()
    assert DEBIAN_PACKAGE in str(error.value)


def test_missing_file_is_named(fixture_root: tuple[Path, dict], tmp_path: Path) -> None:
    folder = _copy(fixture_root[0], tmp_path / "data")
    (folder / "train-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(FileNotFoundError, match="lacks train-labels-idx1-ubyte.gz") as error:
        load_fashion_mnist(folder, "train")
    assert DEBIAN_PACKAGE in str(error.value) and "data-root" in str(error.value)
    assert load_fashion_mnist(folder, "test")[0].shape == (20, 1, 28, 28)  # the test split is complete


_IMAGES = np.zeros((30, 28, 28), np.uint8)
_LABELS = np.arange(30, dtype=np.uint8) % 10


_BAD_FILES = [
    ("train-images-idx3-ubyte.gz", b"plain bytes, no gzip", False, "not a readable gzip file"),
    ("train-images-idx3-ubyte.gz", gzip.compress(idx_bytes(_IMAGES))[:-40], False, "not a readable gzip"),
    ("train-images-idx3-ubyte.gz", b"\x1f\x8b" + b"\x00" * 30, False, "not a readable gzip file"),
    ("train-images-idx3-ubyte.gz", b"\x01\x00" + idx_bytes(_IMAGES)[2:], True, "not an IDX file"),
    ("train-images-idx3-ubyte.gz", b"", True, "not an IDX file"),
    ("train-images-idx3-ubyte.gz", idx_bytes(_IMAGES, code=0x07), True, "unknown IDX type code 0x07"),
    ("train-images-idx3-ubyte.gz", idx_bytes(_IMAGES)[:10], True, "truncated IDX header"),
    ("train-images-idx3-ubyte.gz", idx_bytes(_IMAGES)[:-1], True, "bytes of data, but the header"),
    ("train-images-idx3-ubyte.gz", idx_bytes(_IMAGES) + b"\x00", True, "bytes of data, but the header"),
    ("train-images-idx3-ubyte.gz", idx_bytes(_IMAGES.astype(">i2")), True, r"magic number 0x00000b03"),
    ("train-images-idx3-ubyte.gz", idx_bytes(_LABELS), True, r"magic number 0x00000801.*expected 0x00000803"),
    ("train-images-idx3-ubyte.gz", idx_bytes(np.zeros((30, 27, 28), np.uint8)), True, "must be 28x28"),
    ("train-labels-idx1-ubyte.gz", idx_bytes(_IMAGES), True, r"magic number 0x00000803.*expected 0x00000801"),
    ("train-labels-idx1-ubyte.gz", idx_bytes(_LABELS.astype(">i4")), True, "magic number 0x00000c01"),
    ("train-labels-idx1-ubyte.gz", idx_bytes(np.r_[_LABELS[:-1], 10].astype(np.uint8)), True, r"1 do not \(largest 10"),
    ("train-labels-idx1-ubyte.gz", idx_bytes(np.r_[_LABELS[:-2], 10, 255].astype(np.uint8)), True, "2 do not"),
    ("train-labels-idx1-ubyte.gz", idx_bytes(_LABELS[:29]), True, "29 labels for the 30 images"),
]
"""(file, content, already gzipped, expected problem): each damages one file of the training split."""


@pytest.mark.parametrize(("name", "content", "gzipped", "problem"), _BAD_FILES, ids=[case[3] for case in _BAD_FILES])
def test_bad_file_names_the_file_and_the_problem(
    fixture_root: tuple[Path, dict], tmp_path: Path, name: str, content: bytes, gzipped: bool, problem: str
) -> None:
    folder = _copy(fixture_root[0], tmp_path / "data")
    path = write_idx_gz(folder / name, content) if gzipped else folder / name
    if not gzipped:
        path.write_bytes(content)
    with pytest.raises(ValueError, match=problem) as error:
        load_fashion_mnist(folder, "train")
    assert str(path) in str(error.value)


def test_unknown_split() -> None:
    with pytest.raises(ValueError, match="split"):
        load_fashion_mnist("/nonexistent", "valid")


def test_registry_entry(fixture_root: tuple[Path, dict], monkeypatch: pytest.MonkeyPatch) -> None:
    folder, written = fixture_root
    dataset = load_dataset("Fashion-MNIST", folder, seed=4)
    assert isinstance(dataset, LoadedDataset) and dataset.name == "fashion_mnist"
    assert dataset.num_classes == 10 and dataset.input_shape == (1, 28, 28)
    assert dataset.class_names == FASHION_MNIST_CLASS_NAMES
    assert dataset.mean is None and dataset.std is None and dataset.train_groups is None
    assert dataset.train_images.shape == (30, 1, 28, 28) and dataset.test_images.shape == (20, 1, 28, 28)
    np.testing.assert_array_equal(dataset.test_labels, written["test"][1])
    monkeypatch.setattr(fmnist, "DEBIAN_FASHION_MNIST_DIR", folder)
    np.testing.assert_array_equal(load_dataset("fashion_mnist", "").train_labels, written["train"][1])
    with pytest.raises(TypeError, match="unknown option"):
        load_dataset("fashion_mnist", folder, cache=True)


def test_app_config_needs_no_data_root() -> None:
    config = DataConfig.from_run_config({"dataset": "fashion_mnist", "data-root": ""})
    assert config.dataset_name == "fashion_mnist"
    with pytest.raises(ValueError, match="data-root"):
        DataConfig.from_run_config({"dataset": "cifar10", "data-root": ""})


# --------------------------------------------------------------------------- the installed files


@pytest.fixture(scope="module")
def installed() -> LoadedDataset:
    """Fashion-MNIST from Debian's package; a failure that says how to install it when absent."""
    missing = [name for name in INSTALLED_SHA256 if not (fmnist.DEBIAN_FASHION_MNIST_DIR / name).is_file()]
    if missing:
        pytest.fail(
            f"{fmnist.DEBIAN_FASHION_MNIST_DIR} lacks {', '.join(missing)}: install the data with "
            f"'apt-get install -y {DEBIAN_PACKAGE}' (or deselect these tests with -k 'not installed')"
        )
    return load_dataset("fashion_mnist")


def test_installed_files_are_the_ones_the_results_used(installed: LoadedDataset) -> None:
    for name, expected in INSTALLED_SHA256.items():
        with gzip.open(fmnist.DEBIAN_FASHION_MNIST_DIR / name, "rb") as stream:
            assert hashlib.sha256(stream.read()).hexdigest() == expected, name


def test_installed_splits_are_the_official_ones(installed: LoadedDataset) -> None:
    assert installed.train_images.shape == (60_000, 1, 28, 28) and installed.test_images.shape == (10_000, 1, 28, 28)
    np.testing.assert_array_equal(np.bincount(installed.train_labels), np.full(10, 6_000))
    np.testing.assert_array_equal(np.bincount(installed.test_labels), np.full(10, 1_000))
    assert installed.train_labels[:10].tolist() == FIRST_TRAIN_LABELS
    assert installed.test_labels[:10].tolist() == FIRST_TEST_LABELS
    assert installed.train_images.min() == 0.0 and installed.train_images.max() == 1.0
    assert 0.28 < float(installed.train_images.mean()) < 0.29  # Fashion-MNIST's mean pixel, 0.286
    assert not np.array_equal(installed.train_images[:100], installed.train_images[100:200])


@pytest.mark.parametrize(
    ("distribution", "num_clients", "expected"),
    [("d1", 20, 300.0), ("d1", 100, 60.0), ("d6", 20, 165.0), ("d6", 100, 33.0)],
)
def test_installed_alpha_under_the_linear_schedule(
    installed: LoadedDataset, distribution: str, num_clients: int, expected: float
) -> None:
    partition = make_partition(installed.train_labels, num_clients, distribution, seed=0, schedule="linear")
    assert partition.schedule == "linear"
    assert alpha(partition.global_counts, num_clients) == pytest.approx(expected)
    per_class = [6_000] * 10 if distribution == "d1" else list(range(600, 6_001, 600))  # d6: 10%, 20%, ..., 100%
    assert sorted(partition.global_counts.tolist()) == per_class
