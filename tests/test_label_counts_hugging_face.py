"""``label_counts`` on real Hugging Face datasets made in memory (never the hub): a ``flwr-datasets`` partition is a
``datasets.Dataset``, read by its label column without and with the transforms Flower's quickstart sets, alone, split,
as a ``Subset`` and behind a ``DataLoader``; a ``DatasetDict`` (the split not chosen) is named."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from datasets import ClassLabel, Dataset, DatasetDict, Features, Image, Value
from PIL import Image as PILImage
from torch.utils.data import DataLoader, Subset

from flmarket_flwr.market import label_counts

C = 10
LABELS = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7]
EXPECTED = np.bincount(LABELS, minlength=C).tolist()


@pytest.fixture(scope="module")
def partition() -> Dataset:
    """A CIFAR-10-like partition: PIL images in an ``img`` column and a ``ClassLabel`` ``label`` column."""
    images = [PILImage.new("RGB", (8, 8), (i, i, i)) for i in range(len(LABELS))]
    features = Features({"img": Image(), "label": ClassLabel(num_classes=C)})
    return Dataset.from_dict({"img": images, "label": LABELS}, features=features)


def apply_transforms(batch: dict) -> dict:
    """The quickstart's transform: it reads ``img``, so asking for the label column alone through it fails."""
    batch["img"] = [torch.tensor(np.asarray(img), dtype=torch.float32).permute(2, 0, 1) / 255 for img in batch["img"]]
    return batch


def never_called(batch: dict) -> dict:
    raise AssertionError("the transform decoded the images")


def test_a_partition_with_and_without_transforms(partition: Dataset) -> None:
    assert label_counts(partition, C).tolist() == EXPECTED
    transformed = partition.with_transform(apply_transforms)
    assert label_counts(transformed, C).tolist() == EXPECTED
    assert label_counts(partition.with_transform(never_called), C).tolist() == EXPECTED  # no image decoded
    torch_format = partition.with_format("torch")
    assert label_counts(torch_format, C).tolist() == EXPECTED
    in_place = partition.map(lambda row: row)  # a copy, then a transform set on it in place
    in_place.set_transform(apply_transforms)
    assert label_counts(in_place, C).tolist() == EXPECTED


def test_the_quickstart_split_behind_a_data_loader(partition: Dataset) -> None:
    """Flower's quickstart: ``train_test_split``, ``with_transform``, ``DataLoader(split["train"], shuffle=True)``."""
    split = partition.train_test_split(test_size=0.2, seed=42).with_transform(apply_transforms)
    train = split["train"]
    expected = np.bincount(train.with_format(None)["label"], minlength=C).tolist()
    assert label_counts(DataLoader(train, batch_size=4, shuffle=True), C).tolist() == expected
    assert label_counts(Subset(train, [0, 1]), C).sum() == 2
    with pytest.raises(TypeError, match=r"a DatasetDict with keys \['train', 'test'\]: pass one split of it"):
        label_counts(split, C)
    assert isinstance(split, DatasetDict)


def test_a_renamed_or_missing_label_column_is_named() -> None:
    features = Features({"x": [Value("float32")], "fine_label": Value("int64")})
    data = Dataset.from_dict({"x": [[0.0, 1.0]] * 3, "fine_label": [1, 2, 2]}, features=features)
    assert label_counts(data, 4, label="fine_label").tolist() == [0, 1, 2, 0]
    with pytest.raises(
        ValueError, match=r"no label column 'label' \(its columns: \['x', 'fine_label'\]\); pass label="
    ):
        label_counts(data, 4)
