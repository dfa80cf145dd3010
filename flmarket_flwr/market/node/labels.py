"""A client's per-class label counts ``N_e`` from what a Flower app already holds.

``label_counts`` reads the labels of a Hugging Face / ``flwr-datasets`` partition (by column name), a
PyTorch ``Dataset`` or ``DataLoader`` (tuple items ``(x, y)`` or dict items / batches such as
``batch["label"]``) or an array of labels, and returns the counts the market's client handlers need.
Neither ``torch`` nor ``datasets`` is imported here: their objects are recognised by what they offer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["label_counts"]


def label_counts(data: Any, num_classes: int, *, label: str = "label") -> NDArray[np.int64]:
    """Return the per-class label counts of ``data``: the input of ``register_market_handlers``.

    Parameters
    ----------
    data : Any
        The client's training data, one of:

        * a Hugging Face ``datasets.Dataset`` (a ``flwr-datasets`` partition): the column ``label``
          is read directly, without the dataset's transform (no image is decoded);
        * a PyTorch ``DataLoader``: the labels of its ``dataset`` when the loader visits every item
          once (the default and ``shuffle=True`` samplers), otherwise of the batches it yields;
          a batch is a dict (``batch[label]``) or a sequence whose last element is the labels;
        * a PyTorch ``Dataset``: ``TensorDataset`` (its last tensor), ``Subset``, a dataset with
          ``targets`` (torchvision's), or any map-style dataset whose items are ``(x, y)`` tuples or
          dicts with the key ``label``;
        * an array, tensor or sequence of integer labels (shape ``(N,)`` or ``(N, 1)``).
    num_classes : int
        The number of classes ``C`` (the server's ``num_classes``); labels must lie in ``[0, C)``.
    label : str (default: "label")
        The label column of a Hugging Face dataset, or the key of dict items and batches.

    Returns
    -------
    NDArray[np.int64]
        Shape ``(num_classes,)``: how many samples of each class ``data`` holds.

    Raises
    ------
    ValueError
        If ``num_classes`` is not a positive int, the label column or key is missing, or a label is
        not an integer in ``[0, num_classes)``.
    TypeError
        If ``data`` is none of the kinds above.

    Examples
    --------
    In a quickstart-style ``ClientApp`` whose ``load_data`` returns ``(trainloader, testloader)``::

        register_market_handlers(app, lambda ctx: label_counts(load_data(...)[0], num_classes=10))
    """
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
    labels = _labels(data, label)
    return _count(labels, int(num_classes))


def _labels(data: Any, label: str) -> NDArray[Any]:
    """All labels held by ``data``, as a 1-D array (not yet checked)."""
    if _is_hugging_face_dataset(data):
        return _hugging_face_labels(data, label)
    if _is_data_loader(data):
        return _loader_labels(data, label)
    if _is_tensor(data) or isinstance(data, (np.ndarray, list, tuple, range)):
        return _as_array(data)
    if hasattr(data, "tensors") and isinstance(data.tensors, tuple) and data.tensors:  # TensorDataset
        return _as_array(data.tensors[-1])
    if hasattr(data, "dataset") and hasattr(data, "indices"):  # Subset
        return _labels(data.dataset, label)[np.asarray(data.indices, dtype=np.int64)]
    if hasattr(data, "targets"):  # torchvision datasets
        return _as_array(data.targets)
    if hasattr(data, "__getitem__") and hasattr(data, "__len__"):
        return _as_array([_item_label(data[i], label) for i in range(len(data))])
    raise TypeError(
        f"cannot read labels from a {type(data).__name__}: pass a Hugging Face Dataset, a PyTorch Dataset "
        "or DataLoader, or an array of labels"
    )


def _is_hugging_face_dataset(data: Any) -> bool:
    return hasattr(data, "column_names") and callable(getattr(data, "with_format", None))


def _hugging_face_labels(data: Any, label: str) -> NDArray[Any]:
    """The label column, read through no format or transform (``with_transform`` batches need every column)."""
    columns = list(data.column_names)
    if label not in columns:
        raise ValueError(f"the dataset has no label column {label!r} (its columns: {columns}); pass label=<column>")
    return _as_array(list(data.with_format(None)[label]))


def _is_data_loader(data: Any) -> bool:
    return all(hasattr(data, name) for name in ("dataset", "sampler", "batch_sampler")) and hasattr(data, "__iter__")


def _loader_labels(loader: Any, label: str) -> NDArray[Any]:
    """The dataset's labels when the loader visits each item once; otherwise those of the batches."""
    if _visits_every_item_once(loader):
        try:
            return _labels(loader.dataset, label)
        except TypeError:
            pass  # an iterable-style dataset, or items of an unknown kind: read the batches instead
    parts = [_as_array(_item_label(batch, label)).reshape(-1) for batch in loader]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _visits_every_item_once(loader: Any) -> bool:
    """Whether iterating ``loader`` yields each item of its dataset exactly once."""
    sampler, batch_sampler = loader.sampler, loader.batch_sampler
    if batch_sampler is not None and getattr(batch_sampler, "drop_last", False):
        return False
    if batch_sampler is not None and getattr(batch_sampler, "sampler", sampler) is not sampler:
        return False  # a user batch sampler
    kind = type(sampler).__name__
    if kind == "SequentialSampler":
        return True
    if kind == "RandomSampler":
        return not sampler.replacement and getattr(sampler, "_num_samples", None) is None
    return False


def _item_label(item: Any, label: str) -> Any:
    """The label of one dataset item or one batch: ``item[label]`` for a dict, else its last element."""
    if isinstance(item, Mapping):
        if label not in item:
            raise ValueError(f"the items have no key {label!r} (their keys: {list(item)}); pass label=<key>")
        return item[label]
    if isinstance(item, (tuple, list)) and len(item) >= 2:
        return item[-1]
    raise TypeError(f"cannot find the label in an item of type {type(item).__name__}: expected (x, y) or a dict")


def _is_tensor(data: Any) -> bool:
    return callable(getattr(data, "detach", None)) and callable(getattr(data, "cpu", None))


def _as_array(values: Any) -> NDArray[Any]:
    if _is_tensor(values):
        values = values.detach().cpu().numpy()
    elif isinstance(values, (list, tuple)) and values and _is_tensor(values[0]):
        values = [v.detach().cpu().numpy() for v in values]
    return np.asarray(values)


def _count(labels: NDArray[Any], num_classes: int) -> NDArray[np.int64]:
    """``bincount`` of checked integer labels."""
    labels = np.asarray(labels)
    if labels.ndim == 2 and labels.shape[1] == 1:  # a column of labels, as Keras' CIFAR-10 stores them
        labels = labels[:, 0]
    if labels.ndim != 1:
        raise ValueError(f"labels must form a 1-D sequence of class indices, got shape {labels.shape}")
    if labels.size == 0:
        return np.zeros(num_classes, dtype=np.int64)
    if labels.dtype == bool or not np.issubdtype(labels.dtype, np.number):
        raise ValueError(f"labels must be integer class indices, got dtype {labels.dtype}")
    as_int = labels.astype(np.int64)
    if not np.array_equal(as_int, labels):
        raise ValueError("labels must be integer class indices, got non-integer values")
    bad = as_int[(as_int < 0) | (as_int >= num_classes)]
    if bad.size:
        raise ValueError(
            f"label {int(bad[0])} is outside [0, {num_classes}): set num_classes to the number of classes "
            "(the server's num_classes)"
        )
    return np.bincount(as_int, minlength=num_classes).astype(np.int64)
