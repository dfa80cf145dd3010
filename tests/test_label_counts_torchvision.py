"""``label_counts`` on torchvision's datasets, built on this machine (no download): MNIST from its own file
format, SVHN from its ``.mat`` file, ``ImageFolder`` over a folder of PNGs and ``FakeData``, each alone, in a
``Subset`` and behind a ``DataLoader``."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import torch
from PIL import Image
from torch.utils.data import DataLoader, Subset
from torchvision import datasets, transforms

from flmarket_flwr.market import label_counts

C = 10
LABELS = np.array([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8])
EXPECTED = np.bincount(LABELS, minlength=C).tolist()


def write_mnist(root: Path, labels: np.ndarray) -> None:
    """MNIST's four raw files (IDX format), as torchvision reads them from ``root/MNIST/raw``."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    images = np.random.default_rng(0).integers(0, 256, (len(labels), 28, 28), dtype=np.uint8)
    image_head = struct.pack(">IIII", 2051, len(labels), 28, 28)
    label_head = struct.pack(">II", 2049, len(labels))
    for split in ("train", "t10k"):
        (raw / f"{split}-images-idx3-ubyte").write_bytes(image_head + images.tobytes())
        (raw / f"{split}-labels-idx1-ubyte").write_bytes(label_head + labels.astype(np.uint8).tobytes())


def test_mnist(tmp_path: Path) -> None:
    write_mnist(tmp_path, LABELS)
    mnist = datasets.MNIST(str(tmp_path), train=True, download=False, transform=transforms.ToTensor())
    assert isinstance(mnist.targets, torch.Tensor)
    assert label_counts(mnist, C).tolist() == EXPECTED
    assert label_counts(DataLoader(mnist, batch_size=5, shuffle=True), C).tolist() == EXPECTED
    assert label_counts(Subset(mnist, [0, 1, 2]), C).tolist() == np.bincount(LABELS[:3], minlength=C).tolist()


def test_svhn_keeps_numeric_labels(tmp_path: Path) -> None:
    stored = np.where(LABELS == 0, 10, LABELS)  # SVHN's files store the digit 0 as 10
    images = np.random.default_rng(1).integers(0, 256, (32, 32, 3, len(LABELS)), dtype=np.uint8)
    scipy.io.savemat(tmp_path / "train_32x32.mat", {"X": images, "y": stored.reshape(-1, 1)})

    class LocalSVHN(datasets.SVHN):
        def _check_integrity(self) -> bool:  # its checksum is that of the published file
            return True

    svhn = LocalSVHN(str(tmp_path), split="train", download=False)
    assert isinstance(svhn.labels, np.ndarray)
    assert label_counts(svhn, C).tolist() == EXPECTED
    assert label_counts(DataLoader(svhn, batch_size=4, shuffle=True), C).tolist() == EXPECTED


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("folder")
    for i, y in enumerate(LABELS):
        (root / f"class_{y}").mkdir(exist_ok=True)
        Image.new("RGB", (4, 4), (i, i, i)).save(root / f"class_{y}" / f"{i}.png")
    return root


def test_image_folder_and_its_loader(image_folder: Path) -> None:
    folder = datasets.ImageFolder(str(image_folder), transform=transforms.ToTensor())
    # ImageFolder numbers the classes it finds (here 7 of them), in sorted order
    expected = np.bincount(np.searchsorted(np.unique(LABELS), LABELS), minlength=C).tolist()
    assert label_counts(folder, C).tolist() == expected
    assert label_counts(DataLoader(folder, batch_size=5, shuffle=True), C).tolist() == expected


def test_fake_data_read_item_by_item() -> None:
    fake = datasets.FakeData(size=12, image_size=(1, 4, 4), num_classes=C, transform=transforms.ToTensor())
    expected = np.bincount([int(fake[i][1]) for i in range(len(fake))], minlength=C).tolist()
    assert label_counts(fake, C).tolist() == expected
    assert label_counts(DataLoader(fake, batch_size=5), C).tolist() == expected
