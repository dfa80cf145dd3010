"""Tests of the CIFAR-10, CINIC-10 and DEAP loaders and of ``load_dataset``.

Every fixture is written to a temporary folder in the data set's official on-disk
format (see ``fixtures_datasets``); nothing is downloaded.
"""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fixtures_datasets import (
    CLASS_NAMES,
    deap_subject_content,
    py2_pickle_dumps,
    write_cifar10,
    write_cifar_pickle,
    write_cinic10,
    write_deap_subject,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from flmarket_flwr.app.data import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    LoadedDataset,
    load_cifar10,
    load_cinic10,
    load_dataset,
    load_deap,
    load_deap_windows,
    normalize_images,
)
from flmarket_flwr.app.data import cinic10 as cinic10_module
from flmarket_flwr.app.data import deap as deap_module
from flmarket_flwr.app.data.cifar10 import load_cifar10_label_names, read_cifar10_batch
from flmarket_flwr.app.data.deap import deap_train_test_split, ratings_to_labels

# --------------------------------------------------------------------------- fixtures

# Ratings of the fixture's DEAP trials: (valence, arousal, dominance, liking).
# Subject 1 probes the threshold (5.0 is low, 5.01 high); subject 2 covers HVHA.
SUBJECT_RATINGS = {
    1: np.array([[5.0, 5.01, 3.0, 9.0], [9.0, 1.0, 5.0, 1.0], [1.0, 3.0, 7.5, 6.0]]),
    2: np.array([[7.0, 8.0, 1.0, 2.0], [2.5, 6.0, 9.0, 4.0], [5.5, 4.99, 2.0, 5.0]]),
}
# Expected quadrants (0 HVHA, 1 HVLA, 2 LVHA, 3 LVLA) and binary valence / arousal labels.
EXPECTED_QUADRANTS = {1: [2, 1, 3], 2: [0, 2, 1]}
EXPECTED_VALENCE = {1: [0, 1, 0], 2: [1, 0, 1]}
EXPECTED_AROUSAL = {1: [1, 0, 0], 2: [1, 1, 0]}


@pytest.fixture(scope="module")
def cifar_root(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """Parent folder of a Python 2 style ``cifar-10-batches-py`` (5 x 20 + 20 images)."""
    parent = tmp_path_factory.mktemp("cifar")
    _, written = write_cifar10(parent)
    return parent, written


@pytest.fixture(scope="module")
def cinic_root(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A CINIC-10 tree with 3 PNGs per class and split (one greyscale image per split)."""
    root = tmp_path_factory.mktemp("cinic")
    return root, write_cinic10(root)


@pytest.fixture(scope="module")
def deap_root(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, dict[str, np.ndarray]]]:
    """Parent of ``data_preprocessed_python`` with s01.dat, s02.dat (3 trials, 40 x 8064 each)."""
    parent = tmp_path_factory.mktemp("deap")
    contents = {}
    for subject, ratings in SUBJECT_RATINGS.items():
        content = deap_subject_content(ratings, seed=subject)
        write_deap_subject(parent / "data_preprocessed_python" / f"s{subject:02d}.dat", content)
        contents[subject] = content
    return parent, contents


def _copy_tree(source: Path, target: Path) -> Path:
    """Copy a fixture folder so a test can damage it."""
    shutil.copytree(source, target)
    return target


# --------------------------------------------------------------------------- CIFAR-10


def test_cifar10_train_and_test_shapes_dtypes_and_range(cifar_root: tuple[Path, dict[str, Any]]) -> None:
    parent, written = cifar_root
    images, labels = load_cifar10(parent, "train")
    assert images.shape == (100, 3, 32, 32) and images.dtype == np.float32
    assert labels.shape == (100,) and labels.dtype == np.int64
    assert 0.0 <= images.min() and images.max() <= 1.0
    assert images.min() == 0.0 and images.max() == 1.0  # 614,400 random bytes hit both ends
    expected_labels = np.concatenate([written[f"data_batch_{k}"][1] for k in range(1, 6)])
    np.testing.assert_array_equal(labels, expected_labels)  # batches concatenated in order 1..5
    test_images, test_labels = load_cifar10(parent, "test")
    assert test_images.shape == (20, 3, 32, 32)
    np.testing.assert_array_equal(test_labels, written["test_batch"][1])


def test_cifar10_pixel_layout_is_channel_planes_of_row_major_rows(cifar_root: tuple[Path, dict[str, Any]]) -> None:
    parent, written = cifar_root
    images, _ = load_cifar10(parent, "train")
    rows = written["data_batch_3"][0]
    image_index = 2 * 20 + 7  # image 7 of the third batch
    for channel, y, x in [(0, 0, 0), (0, 0, 31), (0, 1, 0), (1, 5, 9), (2, 31, 31), (2, 17, 4)]:
        flat = channel * 1024 + y * 32 + x
        assert images[image_index, channel, y, x] == np.float32(rows[7, flat]) / np.float32(255.0)


def test_cifar10_known_pattern_lands_at_the_right_channel_row_and_column(tmp_path: Path) -> None:
    folder, _ = write_cifar10(tmp_path, per_batch=2, test_size=2)
    y, x = np.meshgrid(np.arange(32), np.arange(32), indexing="ij")
    pattern = np.concatenate([(x * 8).ravel(), (y * 8).ravel(), np.full(1024, 77)]).astype(np.uint8)
    data = np.stack([pattern, 255 - pattern])
    write_cifar_pickle(folder / "test_batch", {"labels": [3, 4], "data": data, "batch_label": "testing batch 1 of 1"})
    images, labels = load_cifar10(folder, "test")  # the folder itself as root
    np.testing.assert_array_equal(labels, [3, 4])
    np.testing.assert_allclose(images[0, 0] * 255, x * 8, atol=1e-4)  # red: column index
    np.testing.assert_allclose(images[0, 1] * 255, y * 8, atol=1e-4)  # green: row index
    np.testing.assert_allclose(images[0, 2] * 255, 77, atol=1e-4)  # blue: constant
    np.testing.assert_allclose(images[1, 0] * 255, 255 - x * 8, atol=1e-4)


def test_cifar10_reads_python3_pickles_with_bytes_keys(tmp_path: Path) -> None:
    folder, written = write_cifar10(tmp_path, per_batch=4, test_size=6, python2=False)
    raw = pickle.loads((folder / "test_batch").read_bytes(), encoding="bytes")
    assert b"data" in raw and b"labels" in raw  # the fixture really uses bytes keys
    images, labels = load_cifar10(tmp_path, "test")
    np.testing.assert_array_equal(labels, written["test_batch"][1])
    np.testing.assert_array_equal(np.round(images * 255).astype(np.uint8).reshape(6, -1), written["test_batch"][0])
    assert load_cifar10_label_names(tmp_path) == CLASS_NAMES


def test_cifar10_label_names_from_meta(cifar_root: tuple[Path, dict[str, Any]]) -> None:
    assert load_cifar10_label_names(cifar_root[0]) == CLASS_NAMES


def test_cifar10_normalisation_constants_and_helper(cifar_root: tuple[Path, dict[str, Any]]) -> None:
    assert len(CIFAR10_MEAN) == len(CIFAR10_STD) == 3
    images, _ = load_cifar10(cifar_root[0], "test")
    normalised = normalize_images(images)
    assert normalised.dtype == np.float32 and normalised.shape == images.shape
    np.testing.assert_allclose(normalised[:, 1], (images[:, 1] - CIFAR10_MEAN[1]) / CIFAR10_STD[1], rtol=1e-6)
    with pytest.raises(ValueError, match="constants"):
        normalize_images(images, mean=(0.5,), std=(0.5,))


def test_cifar10_missing_folder_says_what_to_extract_where(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as error:
        load_cifar10(tmp_path / "nowhere")
    message = str(error.value)
    assert "CIFAR-10 python version" in message
    assert str(tmp_path / "nowhere" / "cifar-10-batches-py" / "data_batch_1") in message


def test_cifar10_missing_archive_extraction_is_pointed_out(tmp_path: Path) -> None:
    (tmp_path / "cifar-10-python.tar.gz").write_bytes(b"not really")
    with pytest.raises(FileNotFoundError, match="tar -xzf"):
        load_cifar10(tmp_path)


def test_cifar10_missing_batch_is_named(cifar_root: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    folder = _copy_tree(cifar_root[0] / "cifar-10-batches-py", tmp_path / "cifar-10-batches-py")
    (folder / "data_batch_3").unlink()
    with pytest.raises(FileNotFoundError, match="data_batch_3"):
        load_cifar10(tmp_path, "train")
    load_cifar10(tmp_path, "test")  # the test split is still complete


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"\x80\x02}q\x00(U\x04data", "not a readable pickle"),  # truncated
        (b"this is not a pickle at all", "not a readable pickle"),
        (py2_pickle_dumps([1, 2, 3]), "expected a pickled dict"),
        (py2_pickle_dumps({"labels": [1]}), "no 'data' entry"),
        (py2_pickle_dumps({"data": np.zeros((2, 3072), np.float32), "labels": [1, 2]}), "uint8"),
        (py2_pickle_dumps({"data": np.zeros((2, 1024), np.uint8), "labels": [1, 2]}), "shape"),
        (py2_pickle_dumps({"data": np.zeros((2, 3072), np.uint8), "labels": [1]}), "1 labels for 2 images"),
        (py2_pickle_dumps({"data": np.zeros((2, 3072), np.uint8), "labels": [1, 10]}), "0..9"),
        (pickle.dumps({b"data": shutil.rmtree}, protocol=2), "not allowed"),  # foreign code is refused
    ],
)
def test_cifar10_corrupt_batch_names_the_file_and_the_problem(
    cifar_root: tuple[Path, dict[str, Any]], tmp_path: Path, content: bytes, problem: str
) -> None:
    folder = _copy_tree(cifar_root[0] / "cifar-10-batches-py", tmp_path / "cifar-10-batches-py")
    (folder / "data_batch_2").write_bytes(content)
    with pytest.raises(ValueError, match=problem) as error:
        load_cifar10(tmp_path, "train")
    assert str(folder / "data_batch_2") in str(error.value)


def test_cifar10_unknown_split() -> None:
    with pytest.raises(ValueError, match="split"):
        load_cifar10("/nonexistent", "valid")


def test_read_cifar10_batch_returns_uint8_images(cifar_root: tuple[Path, dict[str, Any]]) -> None:
    images, labels = read_cifar10_batch(cifar_root[0] / "cifar-10-batches-py" / "data_batch_1")
    assert images.dtype == np.uint8 and images.shape == (20, 3, 32, 32)
    np.testing.assert_array_equal(images.reshape(20, -1), cifar_root[1]["data_batch_1"][0])


# --------------------------------------------------------------------------- CINIC-10


@pytest.mark.parametrize("split", ["train", "valid", "test"])
def test_cinic10_splits_shapes_labels_and_pixels(cinic_root: tuple[Path, dict[str, Any]], split: str) -> None:
    root, written = cinic_root
    images, labels = load_cinic10(root, split)
    assert images.shape == (30, 3, 32, 32) and images.dtype == np.float32
    assert labels.dtype == np.int64
    assert 0.0 <= images.min() and images.max() <= 1.0
    np.testing.assert_array_equal(labels, [label for _, _, label in written[split]])
    np.testing.assert_array_equal(labels, np.repeat(np.arange(10), 3))  # fixed class order
    expected = np.stack([pixels for _, pixels, _ in written[split]])
    np.testing.assert_array_equal(np.round(images * 255).astype(np.uint8), expected)


def test_cinic10_greyscale_png_becomes_three_equal_channels(cinic_root: tuple[Path, dict[str, Any]]) -> None:
    root, written = cinic_root
    from PIL import Image

    modes = []
    for path, _, _ in written["train"]:
        with Image.open(path) as image:
            modes.append(image.mode)
    assert modes.count("L") == 1
    grey_index = modes.index("L")
    assert written["train"][grey_index][2] == CLASS_NAMES.index("cat")
    images, _ = load_cinic10(root, "train")
    np.testing.assert_array_equal(images[grey_index, 0], images[grey_index, 1])
    np.testing.assert_array_equal(images[grey_index, 0], images[grey_index, 2])


def test_cinic10_known_pixel_lands_at_channel_row_column(tmp_path: Path) -> None:
    from PIL import Image

    write_cinic10(tmp_path, per_class=1, splits=("test",))
    rgb = np.zeros((32, 32, 3), dtype=np.uint8)
    rgb[5, 3] = (10, 20, 30)  # row 5, column 3
    Image.fromarray(rgb).save(tmp_path / "test" / "airplane" / "aaa-first.png")  # sorts first
    images, labels = load_cinic10(tmp_path, "test", num_workers=1)
    assert labels[0] == 0 and images.shape == (11, 3, 32, 32)
    np.testing.assert_allclose(images[0, :, 5, 3] * 255, [10, 20, 30], atol=1e-4)
    assert np.count_nonzero(images[0]) == 3


def test_cinic10_accepts_the_parent_of_a_cinic10_folder(tmp_path: Path) -> None:
    write_cinic10(tmp_path / "CINIC-10", per_class=1, splits=("valid",))
    images, labels = load_cinic10(tmp_path, "valid")
    assert images.shape == (10, 3, 32, 32) and labels.tolist() == list(range(10))


def test_cinic10_threaded_and_serial_decoding_agree(tmp_path: Path) -> None:
    write_cinic10(tmp_path, per_class=60, splits=("train",))  # 600 files: more than one chunk
    serial = load_cinic10(tmp_path, "train", num_workers=1)
    threaded = load_cinic10(tmp_path, "train", num_workers=4)
    np.testing.assert_array_equal(serial[0], threaded[0])
    np.testing.assert_array_equal(serial[1], threaded[1])


def test_cinic10_cache_is_written_reused_and_invalidated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from PIL import Image

    write_cinic10(tmp_path, per_class=2, splits=("train",))
    first = load_cinic10(tmp_path, "train", cache=True)
    cache_file = tmp_path / "cinic10-train.npz"
    assert cache_file.is_file()
    assert cinic10_module.cinic10_cache_path(tmp_path, "train") == cache_file

    def refuse(path: object) -> np.ndarray:
        raise AssertionError("the cache should have been used")

    monkeypatch.setattr(cinic10_module, "read_cinic10_image", refuse)
    second = load_cinic10(tmp_path, "train", cache=True)
    np.testing.assert_array_equal(first[0], second[0])
    np.testing.assert_array_equal(first[1], second[1])
    monkeypatch.undo()

    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(tmp_path / "train" / "ship" / "new.png")
    third = load_cinic10(tmp_path, "train", cache=True)  # file list changed: rebuilt
    assert len(third[1]) == 21
    with np.load(cache_file) as stored:
        assert stored["images"].shape == (21, 3, 32, 32)


def test_cinic10_cache_dir_and_unreadable_cache(tmp_path: Path) -> None:
    write_cinic10(tmp_path / "data", per_class=1, splits=("test",))
    cache_dir = tmp_path / "cache" / "nested"
    expected = load_cinic10(tmp_path / "data", "test")
    load_cinic10(tmp_path / "data", "test", cache=True, cache_dir=cache_dir)
    assert (cache_dir / "cinic10-test.npz").is_file()
    assert not (tmp_path / "data" / "cinic10-test.npz").exists()
    (cache_dir / "cinic10-test.npz").write_bytes(b"garbage")
    again = load_cinic10(tmp_path / "data", "test", cache=True, cache_dir=cache_dir)
    np.testing.assert_array_equal(again[0], expected[0])
    with np.load(cache_dir / "cinic10-test.npz") as stored:  # rewritten
        assert stored["images"].shape == (10, 3, 32, 32)


def test_cinic10_cache_that_cannot_be_written_only_warns(tmp_path: Path) -> None:
    write_cinic10(tmp_path / "data", per_class=1, splits=("test",))
    (tmp_path / "blocker").write_text("a file, not a folder")
    with pytest.warns(RuntimeWarning, match="could not write the CINIC-10 cache"):
        images, _ = load_cinic10(tmp_path / "data", "test", cache=True, cache_dir=tmp_path / "blocker" / "sub")
    assert images.shape == (10, 3, 32, 32)


def test_cinic10_missing_folder_says_what_to_extract_where(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as error:
        load_cinic10(tmp_path, "train")
    assert str(tmp_path / "train" / "airplane") in str(error.value)
    assert "CINIC-10" in str(error.value)


def test_cinic10_missing_split_class_or_files_are_named(tmp_path: Path) -> None:
    write_cinic10(tmp_path, per_class=1, splits=("train",))
    with pytest.raises(FileNotFoundError, match="valid"):
        load_cinic10(tmp_path, "valid")
    shutil.rmtree(tmp_path / "train" / "horse")
    with pytest.raises(FileNotFoundError, match="horse"):
        load_cinic10(tmp_path, "train")
    (tmp_path / "train" / "horse").mkdir()
    with pytest.raises(FileNotFoundError, match="no .png"):
        load_cinic10(tmp_path, "train")


def test_cinic10_corrupt_or_wrongly_sized_png_names_the_file(tmp_path: Path) -> None:
    from PIL import Image

    write_cinic10(tmp_path, per_class=1, splits=("test",))
    bad = tmp_path / "test" / "dog" / "broken.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n but then nothing sensible")
    with pytest.raises(ValueError, match="not a readable image") as error:
        load_cinic10(tmp_path, "test")
    assert str(bad) in str(error.value)
    bad.unlink()
    small = tmp_path / "test" / "frog" / "small.png"
    Image.fromarray(np.zeros((28, 28, 3), np.uint8)).save(small)
    with pytest.raises(ValueError, match="32x32") as error:
        load_cinic10(tmp_path, "test", num_workers=2)
    assert str(small) in str(error.value)


def test_cinic10_rejects_bad_split_and_workers(cinic_root: tuple[Path, dict[str, Any]]) -> None:
    with pytest.raises(ValueError, match="split"):
        load_cinic10(cinic_root[0], "validation")
    with pytest.raises(ValueError, match="num_workers"):
        load_cinic10(cinic_root[0], "test", num_workers=0)


# --------------------------------------------------------------------------- DEAP


def test_deap_default_windows_shapes_and_ids(deap_root: tuple[Path, dict[int, Any]]) -> None:
    windows = load_deap_windows(deap_root[0])
    assert deap_module.DEFAULT_WINDOW_SECONDS == 4.0
    per_trial = 15  # 60 s / 4 s
    assert windows.signals.shape == (2 * 3 * per_trial, 8, 512)
    assert windows.signals.dtype == np.float32
    assert windows.labels.dtype == windows.subjects.dtype == windows.trials.dtype == np.int64
    assert windows.num_classes == 4
    np.testing.assert_array_equal(windows.subjects, np.repeat([1, 2], 3 * per_trial))
    np.testing.assert_array_equal(windows.trials, np.tile(np.repeat([0, 1, 2], per_trial), 2))
    assert windows.ratings.shape == (90, 4)
    np.testing.assert_array_equal(windows.ratings[15], SUBJECT_RATINGS[1][1])


def test_deap_windows_are_the_post_baseline_peripheral_samples(deap_root: tuple[Path, dict[int, Any]]) -> None:
    parent, contents = deap_root
    windows = load_deap_windows(parent, standardize=False, subjects=[2])
    data = contents[2]["data"]
    # Window 4 of trial 1 of subject 2, channel 5 (file channel 37, respiration belt).
    index = 1 * 15 + 4
    start = 384 + 4 * 512
    np.testing.assert_allclose(windows.signals[index, 5], data[1, 37, start : start + 512].astype(np.float32))
    # The first window starts right after the 3 s baseline; the last ends at sample 8064.
    np.testing.assert_allclose(windows.signals[0], data[0, 32:40, 384:896].astype(np.float32))
    np.testing.assert_allclose(windows.signals[44], data[2, 32:40, 8064 - 512 :].astype(np.float32))


def test_deap_standardisation_is_per_subject_and_channel(deap_root: tuple[Path, dict[int, Any]]) -> None:
    windows = load_deap_windows(deap_root[0])
    for subject in (1, 2):
        mine = windows.signals[windows.subjects == subject].astype(np.float64)
        np.testing.assert_allclose(mine.mean(axis=(0, 2)), 0.0, atol=1e-5)
        np.testing.assert_allclose(mine.std(axis=(0, 2)), 1.0, atol=1e-5)


def test_deap_constant_channel_standardises_to_zeros(tmp_path: Path) -> None:
    content = deap_subject_content(SUBJECT_RATINGS[1], seed=3)
    content["data"][:, 39, :] = 36.5  # temperature flat
    write_deap_subject(tmp_path / "s07.dat", content)
    signals, _ = load_deap(tmp_path)
    assert np.all(signals[:, 7] == 0.0)
    assert np.isfinite(signals).all()


def test_deap_quaternary_quadrant_mapping(deap_root: tuple[Path, dict[int, Any]]) -> None:
    assert deap_module.QUADRANT_NAMES == ("HVHA", "HVLA", "LVHA", "LVLA")
    windows = load_deap_windows(deap_root[0], label="valence_arousal", num_classes=4)
    expected = np.concatenate([np.repeat(EXPECTED_QUADRANTS[subject], 15) for subject in (1, 2)])
    np.testing.assert_array_equal(windows.labels, expected)


@pytest.mark.parametrize(("label", "expected"), [("valence", EXPECTED_VALENCE), ("arousal", EXPECTED_AROUSAL)])
def test_deap_binary_labels_use_rating_above_five(
    deap_root: tuple[Path, dict[int, Any]], label: str, expected: dict[int, list[int]]
) -> None:
    signals, labels = load_deap(deap_root[0], label=label, num_classes=2)
    assert signals.shape == (90, 8, 512)
    np.testing.assert_array_equal(labels, np.concatenate([np.repeat(expected[s], 15) for s in (1, 2)]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(*[st.floats(1.0, 9.0)] * 4), min_size=1, max_size=20))
def test_ratings_to_labels_matches_thresholds(rows: list[tuple[float, float, float, float]]) -> None:
    ratings = np.array(rows)
    quadrants = ratings_to_labels(ratings, "valence_arousal")
    np.testing.assert_array_equal(quadrants // 2, ratings[:, 0] <= 5)  # low valence: LV*
    np.testing.assert_array_equal(quadrants % 2, ratings[:, 1] <= 5)  # low arousal: *LA
    for column, dimension in enumerate(deap_module.RATING_DIMENSIONS):
        np.testing.assert_array_equal(ratings_to_labels(ratings, dimension), ratings[:, column] > 5)


@pytest.mark.parametrize(
    ("seconds", "samples", "per_trial"),
    [(1, 128, 60), (4, 512, 15), (7, 896, 8), (60, 7680, 1), (0.5, 64, 120)],
)
def test_deap_window_count_per_trial(
    deap_root: tuple[Path, dict[int, Any]], seconds: float, samples: int, per_trial: int
) -> None:
    signals, labels = load_deap(deap_root[0], window_seconds=seconds, subjects=[1])
    assert signals.shape == (3 * per_trial, 8, samples)
    assert labels.shape == (3 * per_trial,)


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"window_seconds": 0}, "window_seconds"),
        ({"window_seconds": 1 / 3}, "whole number of samples"),
        ({"window_seconds": 61}, "exceeds"),
        ({"label": "valence", "num_classes": 4}, "num_classes"),
        ({"label": "valence_arousal", "num_classes": 2}, "num_classes"),
        ({"label": "happiness"}, "label"),
        ({"subjects": []}, "at least one"),
        ({"subjects": [0]}, "subject numbers"),
        ({"subjects": [1, 1]}, "repeat"),
    ],
)
def test_deap_rejects_invalid_options(
    deap_root: tuple[Path, dict[int, Any]], options: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        load_deap(deap_root[0], **options)


def test_deap_subject_selection_and_missing_subject(deap_root: tuple[Path, dict[int, Any]]) -> None:
    windows = load_deap_windows(deap_root[0], subjects=[2])
    assert set(windows.subjects.tolist()) == {2}
    with pytest.raises(FileNotFoundError, match="s05.dat"):
        load_deap(deap_root[0], subjects=[1, 5])


def test_deap_missing_folder_says_what_to_extract_where(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as error:
        load_deap(tmp_path)
    assert str(tmp_path / "data_preprocessed_python" / "s01.dat") in str(error.value)
    assert "data_preprocessed_python.zip" in str(error.value)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"\x80\x02}(U\x04data", "not a readable pickle"),
        (py2_pickle_dumps({"labels": np.ones((1, 4))}), "no 'data' entry"),
        (py2_pickle_dumps({"data": np.zeros((1, 40, 8064), np.int16), "labels": np.ones((1, 4))}), "float array"),
        (py2_pickle_dumps({"data": np.zeros((1, 39, 8064)), "labels": np.ones((1, 4))}), r"\(1, 39, 8064\)"),
        (py2_pickle_dumps({"data": np.zeros((1, 40, 8000)), "labels": np.ones((1, 4))}), "shape"),
        (py2_pickle_dumps({"data": np.zeros((2, 40, 8064)), "labels": np.ones((1, 4))}), "'labels' must be"),
        (py2_pickle_dumps({"data": np.zeros((1, 40, 8064)), "labels": np.full((1, 4), 10.0)}), r"\[1, 9\]"),
    ],
)
def test_deap_corrupt_file_names_the_file_and_the_problem(tmp_path: Path, content: bytes, problem: str) -> None:
    path = tmp_path / "s03.dat"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=problem) as error:
        load_deap(tmp_path)
    assert str(path) in str(error.value)


def test_deap_nan_in_peripheral_signals_is_reported(tmp_path: Path) -> None:
    content = deap_subject_content(SUBJECT_RATINGS[2][:1], seed=4)
    content["data"][0, 34, 1000] = np.nan
    write_deap_subject(tmp_path / "s04.dat", content)
    with pytest.raises(ValueError, match="NaN") as error:
        load_deap(tmp_path)
    assert "s04.dat" in str(error.value)


def test_deap_split_holds_out_whole_trials_per_subject(deap_root: tuple[Path, dict[int, Any]]) -> None:
    windows = load_deap_windows(deap_root[0])
    train_idx, test_idx = deap_train_test_split(windows.subjects, windows.trials, test_fraction=0.2, seed=0)
    assert np.intersect1d(train_idx, test_idx).size == 0
    np.testing.assert_array_equal(np.sort(np.concatenate([train_idx, test_idx])), np.arange(90))
    train_trials = set(zip(windows.subjects[train_idx].tolist(), windows.trials[train_idx].tolist(), strict=True))
    test_trials = set(zip(windows.subjects[test_idx].tolist(), windows.trials[test_idx].tolist(), strict=True))
    assert not train_trials & test_trials  # no trial on both sides
    assert sorted(subject for subject, _ in test_trials) == [1, 2]  # round(0.2 * 3) -> at least 1 per subject
    again = deap_train_test_split(windows.subjects, windows.trials, test_fraction=0.2, seed=0)
    np.testing.assert_array_equal(again[1], test_idx)
    draws = {tuple(deap_train_test_split(windows.subjects, windows.trials, 0.2, seed)[1]) for seed in range(10)}
    assert len(draws) > 1


def test_deap_split_of_forty_trials_holds_out_eight_and_is_stable_per_subject() -> None:
    subjects = np.repeat([3, 9], 40 * 15)
    trials = np.tile(np.repeat(np.arange(40), 15), 2)
    _, test_idx = deap_train_test_split(subjects, trials, seed=1)
    assert len(test_idx) == 2 * 8 * 15
    _, only_nine = deap_train_test_split(subjects[subjects == 9], trials[subjects == 9], seed=1)
    held_out_alone = np.sort(trials[subjects == 9][only_nine])
    held_out_together = np.sort(trials[test_idx[subjects[test_idx] == 9]])
    np.testing.assert_array_equal(held_out_alone, held_out_together)
    with pytest.raises(ValueError, match="test_fraction"):
        deap_train_test_split(subjects, trials, test_fraction=1.0)
    with pytest.raises(ValueError, match="at least 2"):
        deap_train_test_split([1, 1], [0, 0])


# --------------------------------------------------------------------------- load_dataset


def test_load_dataset_digits_needs_no_root() -> None:
    dataset = load_dataset("digits", None, "test", seed=0)
    assert isinstance(dataset, LoadedDataset)
    assert dataset.name == "digits" and dataset.num_classes == 10
    assert dataset.input_shape == (1, 8, 8)
    assert dataset.train_images.shape == (1497, 1, 8, 8) and dataset.test_images.shape == (300, 1, 8, 8)
    assert dataset.train_images.dtype == np.float32 and dataset.test_labels.dtype == np.int64
    np.testing.assert_array_equal(np.bincount(dataset.test_labels), [30] * 10)
    same = load_dataset("digits", "", seed=0)
    np.testing.assert_array_equal(same.test_labels, dataset.test_labels)
    np.testing.assert_array_equal(same.test_images, dataset.test_images)
    assert load_dataset("digits", test_per_class=10).test_images.shape == (100, 1, 8, 8)


def test_load_dataset_cifar10(cifar_root: tuple[Path, dict[str, Any]]) -> None:
    dataset = load_dataset("CIFAR-10", cifar_root[0], "test", seed=3)
    assert dataset.name == "cifar10" and dataset.num_classes == 10
    assert dataset.input_shape == (3, 32, 32)
    assert dataset.train_images.shape == (100, 3, 32, 32) and dataset.test_images.shape == (20, 3, 32, 32)
    assert dataset.class_names == CLASS_NAMES
    assert dataset.mean == CIFAR10_MEAN and dataset.std == CIFAR10_STD
    assert dataset.train_groups is None


def test_load_dataset_cinic10_splits_and_options(cinic_root: tuple[Path, dict[str, Any]]) -> None:
    root, written = cinic_root
    dataset = load_dataset("cinic10", root)
    assert dataset.train_images.shape == (30, 3, 32, 32) and dataset.test_images.shape == (30, 3, 32, 32)
    assert dataset.mean == cinic10_module.CINIC10_MEAN
    valid = load_dataset("cinic-10", root, "valid", num_workers=1)
    expected = np.stack([pixels for _, pixels, _ in written["valid"]])
    np.testing.assert_array_equal(np.round(valid.test_images * 255).astype(np.uint8), expected)
    both = load_dataset("cinic10", root, include_valid=True)
    assert both.train_images.shape == (60, 3, 32, 32)
    with pytest.raises(ValueError, match="include_valid"):
        load_dataset("cinic10", root, "valid", include_valid=True)


def test_load_dataset_deap(deap_root: tuple[Path, dict[int, Any]]) -> None:
    dataset = load_dataset("deap", deap_root[0], seed=0)
    assert dataset.name == "deap" and dataset.num_classes == 4
    assert dataset.input_shape == (8, 512)
    assert dataset.class_names == ("HVHA", "HVLA", "LVHA", "LVLA")
    assert len(dataset.train_labels) + len(dataset.test_labels) == 90
    assert len(dataset.test_labels) == 2 * 15  # one of three trials per subject
    assert dataset.train_groups is not None and dataset.test_groups is not None
    assert set(dataset.test_groups.tolist()) == {1, 2}
    assert dataset.mean is None
    binary = load_dataset("deap", deap_root[0], label="arousal", window_seconds=2, test_fraction=0.5, seed=1)
    assert binary.num_classes == 2 and binary.input_shape == (8, 256)
    assert binary.class_names == ("low arousal", "high arousal")


def test_load_dataset_rejects_bad_calls(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown data set"):
        load_dataset("mnist")
    with pytest.raises(ValueError, match="root"):
        load_dataset("cifar10", None)
    with pytest.raises(TypeError, match="unknown option"):
        load_dataset("cifar10", tmp_path, cache=True)
    with pytest.raises(ValueError, match="split"):
        load_dataset("cifar10", tmp_path, "valid")
    with pytest.raises(FileNotFoundError, match="CIFAR-10 not found"):
        load_dataset("cifar10", tmp_path)
    with pytest.raises(FileNotFoundError, match="DEAP not found"):
        load_dataset("deap", tmp_path)
