"""``label_counts``: a client's per-class counts from a PyTorch Dataset or DataLoader (tuple and dict batches), a
list of dicts or of ``(x, y)`` pairs, or an array, without importing torch or datasets itself (Hugging Face
datasets: test_label_counts_hugging_face.py; torchvision's: test_label_counts_torchvision.py)."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Subset, TensorDataset, WeightedRandomSampler

from flmarket_flwr.market import label_counts

C = 4
LABELS = np.array([0, 1, 1, 3, 3, 3, 0, 1, 3, 3])
EXPECTED = np.array([2, 3, 0, 5])


class DictDataset(Dataset):
    """A map-style dataset of dict rows, as Hugging Face datasets are inside a DataLoader."""

    def __init__(self, labels: np.ndarray, key: str = "label") -> None:
        self.rows, self.key = labels, key

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        return {"img": torch.full((1, 2, 2), float(i)), self.key: int(self.rows[i])}


class TransformedColumns:
    """The part of ``datasets.Dataset``'s API the helper uses, with a ``with_transform`` that fails
    when asked for the label column alone (as Flower's quickstart transform does: it reads ``img``)."""

    def __init__(self, columns: dict[str, list], transformed: bool = True) -> None:
        self._columns, self._transformed = columns, transformed

    @property
    def column_names(self) -> list[str]:
        return list(self._columns)

    def with_format(self, type: str | None = None) -> TransformedColumns:  # noqa: A002 (datasets' name)
        return TransformedColumns(self._columns, transformed=type is not None)

    def __getitem__(self, key: str) -> list:
        if self._transformed:
            raise KeyError("img")
        return self._columns[key]

    def __len__(self) -> int:
        return len(next(iter(self._columns.values())))


def test_array_list_and_tensor() -> None:
    for labels in (LABELS, LABELS.tolist(), torch.tensor(LABELS), LABELS.astype(np.float64), LABELS[:, None]):
        counts = label_counts(labels, C)
        assert counts.tolist() == EXPECTED.tolist()
        assert counts.dtype == np.int64


def test_tensor_dataset_subset_and_targets() -> None:
    dataset = TensorDataset(torch.zeros(len(LABELS), 3), torch.tensor(LABELS))
    assert label_counts(dataset, C).tolist() == EXPECTED.tolist()
    assert label_counts(Subset(dataset, [0, 1, 2]), C).tolist() == [1, 2, 0, 0]

    class WithTargets(Dataset):  # torchvision's datasets keep their labels in ``targets``
        targets = LABELS.tolist()

    assert label_counts(WithTargets(), C).tolist() == EXPECTED.tolist()


def test_dataset_of_tuples_and_of_dicts() -> None:
    class Pairs(Dataset):
        def __len__(self) -> int:
            return len(LABELS)

        def __getitem__(self, i: int) -> tuple:
            return torch.zeros(2), torch.tensor(LABELS[i])

    assert label_counts(Pairs(), C).tolist() == EXPECTED.tolist()
    assert label_counts(DictDataset(LABELS), C).tolist() == EXPECTED.tolist()
    assert label_counts(DictDataset(LABELS, key="fine_label"), C, label="fine_label").tolist() == EXPECTED.tolist()


def test_data_loader_of_dict_batches_shuffled_or_not() -> None:
    for shuffle in (False, True):
        loader = DataLoader(DictDataset(LABELS), batch_size=3, shuffle=shuffle)
        assert label_counts(loader, C).tolist() == EXPECTED.tolist()


def test_data_loader_that_does_not_visit_each_item_once_is_read_batch_by_batch() -> None:
    dataset = TensorDataset(torch.zeros(len(LABELS), 3), torch.tensor(LABELS))
    dropped = DataLoader(dataset, batch_size=4, drop_last=True)  # the last 2 items are never trained on
    assert label_counts(dropped, C).tolist() == np.bincount(LABELS[:8], minlength=C).tolist()

    only_class_3 = WeightedRandomSampler((LABELS == 3).astype(float), num_samples=6, replacement=True)
    sampled = DataLoader(DictDataset(LABELS), batch_size=4, sampler=only_class_3)
    assert label_counts(sampled, C).tolist() == [0, 0, 0, 6]


def test_hugging_face_dataset_is_read_by_column_without_its_transform() -> None:
    dataset = TransformedColumns({"img": [None] * len(LABELS), "label": LABELS.tolist()})
    assert label_counts(dataset, C).tolist() == EXPECTED.tolist()
    # Inside a DataLoader (Flower's quickstart), the loader's dataset is read the same way.
    loader = DataLoader(dataset, batch_size=4, shuffle=True)  # type: ignore[arg-type]
    assert label_counts(loader, C).tolist() == EXPECTED.tolist()
    with pytest.raises(ValueError, match=r"no label column 'fine_label'.*\['img', 'label'\].*label=<column>"):
        label_counts(dataset, C, label="fine_label")


@pytest.mark.parametrize(
    ("labels", "num_classes", "match"),
    [
        ([0, 4], 4, r"label 4 is outside \[0, 4\): set num_classes"),
        ([0, -1], 4, r"label -1 is outside"),
        ([0.5, 1.0], 4, "non-integer values"),
        (["a", "b"], 4, "integer class indices"),
        ([[0, 1]], 4, "one class index per sample"),
        ([[0, 1], [1, 0]], 4, "one class index per sample"),
        ([0, 1], 0, "num_classes must be a positive int"),
    ],
)
def test_bad_labels_are_named(labels: list, num_classes: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        label_counts(labels, num_classes)


def test_unknown_kinds_and_missing_keys_are_named() -> None:
    with pytest.raises(TypeError, match="cannot read labels from a object: pass .* the array of labels"):
        label_counts(object(), C)
    with pytest.raises(ValueError, match=r"no key 'label' \(their keys: \['img', 'target'\]\)"):
        label_counts(DictDataset(LABELS, key="target"), C)
    assert label_counts([], C).tolist() == [0] * C


def test_the_helper_imports_neither_torch_nor_datasets() -> None:
    code = "import sys, flmarket_flwr.market; print([m for m in ('torch', 'datasets') if m in sys.modules])"
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert completed.stdout.strip() == "[]"


def quickstart_rows(labels: np.ndarray) -> list[dict]:
    """Flower's quickstart partition as a plain list: one {"img": 3x32x32 tensor, "label": int} dict per image."""
    return [{"img": torch.rand(3, 32, 32), "label": int(y)} for y in labels]


def test_flowers_quickstart_shape_a_list_of_dicts_behind_a_data_loader() -> None:
    rows = quickstart_rows(LABELS)
    for shuffle in (True, False):
        trainloader = DataLoader(rows, batch_size=32, shuffle=shuffle)  # type: ignore[arg-type]
        assert label_counts(trainloader, C).tolist() == EXPECTED.tolist()
    # drop_last: the loader is read batch by batch (collated dict batches), and the dropped rows are not counted
    dropped = DataLoader(rows, batch_size=4, drop_last=True)  # type: ignore[arg-type]
    assert label_counts(dropped, C).tolist() == np.bincount(LABELS[:8], minlength=C).tolist()


def test_lists_and_tuples_of_dicts_or_of_pairs() -> None:
    rows = quickstart_rows(LABELS)
    assert label_counts(rows, C).tolist() == EXPECTED.tolist()
    assert label_counts(tuple(rows), C).tolist() == EXPECTED.tolist()
    renamed = [{"image": row["img"], "fine_label": row["label"]} for row in rows]
    assert label_counts(renamed, C, label="fine_label").tolist() == EXPECTED.tolist()
    pairs = [(torch.zeros(2), torch.tensor(y)) for y in LABELS]
    assert label_counts(pairs, C).tolist() == EXPECTED.tolist()
    assert label_counts([(np.zeros(3), int(y)) for y in LABELS], C).tolist() == EXPECTED.tolist()
    assert label_counts([[[0.0, 1.0], int(y)] for y in LABELS], C).tolist() == EXPECTED.tolist()  # [x, y] lists
    assert label_counts(DataLoader(pairs, batch_size=3), C).tolist() == EXPECTED.tolist()  # type: ignore[arg-type]


def test_subsets_and_concatenations_of_every_kind() -> None:
    rows = quickstart_rows(LABELS)
    assert label_counts(Subset(rows, [0, 1, 2]), C).tolist() == [1, 2, 0, 0]  # type: ignore[arg-type]
    nested = Subset(Subset(DictDataset(LABELS), [3, 4, 5, 6]), [0, 3])
    assert label_counts(nested, C).tolist() == [1, 0, 0, 1]
    tensors = TensorDataset(torch.zeros(len(LABELS), 3), torch.tensor(LABELS))
    both = ConcatDataset([tensors, DictDataset(LABELS)])
    assert label_counts(both, C).tolist() == (2 * EXPECTED).tolist()
    assert label_counts(DataLoader(both, batch_size=5, shuffle=True), C).tolist() == (2 * EXPECTED).tolist()


def test_tensors_of_labels_column_or_row() -> None:
    assert label_counts(torch.tensor(LABELS).view(-1, 1), C).tolist() == EXPECTED.tolist()
    assert label_counts([torch.tensor(int(y)) for y in LABELS], C).tolist() == EXPECTED.tolist()


@pytest.mark.parametrize(
    "features",
    [np.zeros((10, 4)), torch.zeros(10, 4), np.zeros((10, 8, 8)), [[0, 1, 2], [1, 2, 3]]],
    ids=["numpy X_train", "tensor", "images", "list of rows"],
)
def test_features_passed_for_labels_are_named_by_their_shape(features: object) -> None:
    """A numpy app's ``load_data(...)[0]`` is X_train: the error names its shape and the way out."""
    shape = tuple(np.shape(features))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=rf"shape {re.escape(str(shape))}.*y_train, not X_train.*label=<key>"):
        label_counts(features, C)


def test_what_cannot_be_read_is_named_with_the_label_argument() -> None:
    with pytest.raises(ValueError, match=r"got dtype <U3 from a list of 2 str values .*'cat'.*label=<key>"):
        label_counts(["cat", "dog"], C)

    class Images(Dataset):  # items with no label at all
        def __len__(self) -> int:
            return 3

        def __getitem__(self, i: int) -> object:
            return object()

    with pytest.raises(TypeError, match=r"item of type object.*dict with the key label='label'"):
        label_counts(DataLoader(Images(), batch_size=2), C)
    with pytest.raises(ValueError, match=r"no key 'label' \(their keys: \['img', 'target'\]\); pass label=<key>"):
        label_counts([{"img": 0, "target": 1}], C)
    with pytest.raises(TypeError, match="label must be the str key"):
        label_counts(LABELS, C, label=1)  # type: ignore[arg-type]
