"""A client's per-class label counts ``N_e`` from what a Flower app already holds.

``label_counts`` reads the labels of a Hugging Face / ``flwr-datasets`` partition (by column name), a
PyTorch ``Dataset`` or ``DataLoader`` (tuple items ``(x, y)`` or dict items / batches such as
``batch["label"]``), a plain list of dicts or of ``(x, y)`` pairs, or an array of labels, and returns the
counts the market's client handlers need. What it cannot read is refused with one error naming what it was
given and the ``label=`` argument. Neither ``torch`` nor ``datasets`` is imported here: their objects are
recognised by what they offer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["label_counts"]

_KINDS = (
    "pass a Hugging Face Dataset, a PyTorch Dataset or DataLoader, a list of dicts or of (x, y) pairs, or the "
    "array of labels"
)


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
        * a PyTorch ``Dataset``: ``TensorDataset`` (its last tensor), ``Subset``, ``ConcatDataset``, a
          torchvision dataset (its ``targets``, or ``labels`` as SVHN keeps them), or any map-style dataset
          whose items are ``(x, y)`` tuples or dicts with the key ``label``;
        * a list or tuple of dicts with the key ``label`` (Flower's quickstart partitions) or of ``(x, y)``
          pairs;
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
        If ``num_classes`` is not a positive int, the label column or key is missing, ``data`` is an array of
        more than one column (features, not labels: the error names its shape), or a label is not an integer in
        ``[0, num_classes)``.
    TypeError
        If ``data`` is none of the kinds above (the error names what it is).

    Examples
    --------
    In a quickstart-style ``ClientApp`` whose ``load_data`` returns ``(trainloader, testloader)``::

        register_market_handlers(app, lambda ctx: label_counts(load_data(...)[0], num_classes=10))
    """
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
    if not isinstance(label, str):
        raise TypeError(f"label must be the str key or column of the labels, got {type(label).__name__}")
    labels = _labels(data, label)
    return _count(labels, int(num_classes), data, label)


class _Unreadable(TypeError):
    """``data`` is of no kind the helper reads (a ``TypeError``, so a loader falls back to its batches)."""


def _labels(data: Any, label: str) -> NDArray[Any]:
    """All labels held by ``data``, as an array (not yet checked)."""
    if isinstance(data, Mapping) and data and all(_is_hugging_face_dataset(v) for v in data.values()):
        raise _Unreadable(  # a DatasetDict: the split is the user's to choose
            f"cannot read labels from {_describe(data)}: pass one split of it, e.g. data[{next(iter(data))!r}]"
        )
    if _is_hugging_face_dataset(data):
        return _hugging_face_labels(data, label)
    if _is_data_loader(data):
        return _loader_labels(data, label)
    if _is_tensor(data) or isinstance(data, (np.ndarray, range)):
        return _as_array(data)
    if isinstance(data, (list, tuple)):
        return _sequence_labels(data, label)
    if hasattr(data, "tensors") and isinstance(data.tensors, tuple) and data.tensors:  # TensorDataset
        return _as_array(data.tensors[-1])
    if hasattr(data, "dataset") and hasattr(data, "indices"):  # Subset
        return _labels(data.dataset, label)[np.asarray(data.indices, dtype=np.int64)]
    if isinstance(getattr(data, "datasets", None), Sequence) and hasattr(data, "cumulative_sizes"):  # ConcatDataset
        parts = [_labels(part, label).reshape(-1) for part in data.datasets]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    per_sample = _per_sample_attribute(data)
    if per_sample is not None:  # torchvision's datasets: targets (labels for SVHN, STL10)
        return _as_array(per_sample)
    if hasattr(data, "__getitem__") and hasattr(data, "__len__"):
        return _as_array([_item_label(data[i], label) for i in range(len(data))])
    raise _Unreadable(f"cannot read labels from {_describe(data)}: {_KINDS}")


def _sequence_labels(items: list[Any] | tuple[Any, ...], label: str) -> NDArray[Any]:
    """The labels of a list or tuple: of dicts (``item[label]``), of ``(x, y)`` pairs, or the labels themselves."""
    if not items:
        return np.zeros(0, dtype=np.int64)
    first = items[0]
    if isinstance(first, Mapping) or _is_pair(first):
        return _as_array([_item_label(item, label) for item in items])
    return _as_array(items)


def _is_pair(item: Any) -> bool:
    """Whether ``item`` is an ``(x, y)`` sample: a tuple, or a list whose first element is not a number."""
    if isinstance(item, tuple):
        return len(item) >= 2
    return isinstance(item, list) and len(item) >= 2 and not np.isscalar(item[0])


def _per_sample_attribute(data: Any) -> Any:
    """``data.targets`` (or ``data.labels``) when it holds one entry per sample, else ``None``."""
    size = len(data) if hasattr(data, "__len__") else None
    for name in ("targets", "labels"):
        values = getattr(data, name, None)
        if values is None or isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
            continue
        if (size is None or len(values) == size) and (name == "targets" or _numeric(values)):
            return values  # `labels` only when numeric: elsewhere it may name the classes
    return None


def _numeric(values: Any) -> bool:
    try:
        return bool(np.issubdtype(_as_array(values).dtype, np.number))
    except (TypeError, ValueError):
        return False


def _is_hugging_face_dataset(data: Any) -> bool:
    return hasattr(data, "column_names") and callable(getattr(data, "with_format", None))


def _hugging_face_labels(data: Any, label: str) -> NDArray[Any]:
    """The label column, read through no format or transform (``with_transform`` batches need every column)."""
    columns = list(data.column_names or [])
    if label not in columns:
        raise ValueError(f"the dataset has no label column {label!r} (its columns: {columns}); pass label=<column>")
    return _as_array(list(data.with_format(None)[label]))


def _is_data_loader(data: Any) -> bool:
    return all(hasattr(data, name) for name in ("dataset", "sampler", "batch_sampler")) and hasattr(data, "__iter__")


def _loader_labels(loader: Any, label: str) -> NDArray[Any]:
    """The dataset's labels when the loader visits each item once; otherwise those of the batches."""
    unread: _Unreadable | None = None
    if _visits_every_item_once(loader):
        try:
            return _labels(loader.dataset, label)
        except _Unreadable as err:  # items of a kind read only once collated: read the batches instead
            unread = err
    try:
        parts = [_as_array(_item_label(batch, label)).reshape(-1) for batch in loader]
    except (TypeError, RuntimeError) as err:  # the loader cannot collate them either: say what the items are
        if unread is not None:
            raise unread from err
        raise
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
    if isinstance(item, (int, np.integer)) or (_is_tensor(item) and getattr(item, "ndim", None) == 0):
        return item  # a dataset of labels
    raise _Unreadable(
        f"cannot find the label in an item of type {type(item).__name__}: expected an (x, y) pair or a dict with "
        f"the key label={label!r}"
    )


def _is_tensor(data: Any) -> bool:
    return callable(getattr(data, "detach", None)) and callable(getattr(data, "cpu", None))


def _as_array(values: Any) -> NDArray[Any]:
    if _is_tensor(values):
        values = values.detach().cpu().numpy()
    elif isinstance(values, (list, tuple)) and values and _is_tensor(values[0]):
        values = [v.detach().cpu().numpy() for v in values]
    try:
        return np.asarray(values)
    except ValueError:  # ragged rows: numpy refuses them
        return np.asarray(values, dtype=object)


def _describe(data: Any) -> str:
    """What ``data`` is, in a few words, for an error: its kind, size and what its items look like."""
    kind = type(data).__name__
    if isinstance(data, Mapping):
        return f"a {kind} with keys {list(data)[:6]}"
    shape = getattr(data, "shape", None)
    if shape is not None and not callable(shape):
        return f"a {kind} of shape {tuple(shape)}"
    if isinstance(data, (list, tuple)):
        if not data:
            return f"an empty {kind}"
        return f"a {kind} of {len(data)} {_item_kind(data[0])}"
    inner = getattr(data, "dataset", None)
    if inner is not None and _is_data_loader(data):
        return f"a {kind} over {_describe(inner)}"
    size = f" of {len(data)}" if hasattr(data, "__len__") else ""
    return f"a {kind}{size}"


def _item_kind(item: Any) -> str:
    """The kind of a sequence's items, plural: ``dicts with keys ['img', 'label']``, ``tuples of 2``, ..."""
    if isinstance(item, Mapping):
        return f"dicts with keys {list(item)[:6]}"
    if isinstance(item, (tuple, list)):
        return f"{type(item).__name__}s of {len(item)}"
    shape = getattr(item, "shape", None)
    if shape is not None and not callable(shape) and len(tuple(shape)) > 0:
        return f"{type(item).__name__}s of shape {tuple(shape)}"
    return f"{type(item).__name__} values"


def _count(labels: NDArray[Any], num_classes: int, data: Any, label: str) -> NDArray[np.int64]:
    """``bincount`` of checked integer labels (``data`` and ``label`` name the source in an error)."""
    labels = np.asarray(labels)
    if labels.ndim == 2 and labels.shape[1] == 1:  # a column of labels, as Keras' CIFAR-10 stores them
        labels = labels[:, 0]
    if labels.ndim != 1:
        raise ValueError(
            f"labels must be one class index per sample, but {_describe(data)} gives labels of shape "
            f"{labels.shape}: features rather than labels? Pass the array of labels (y_train, not X_train), or "
            f"name the label of dict items, batches or columns with label=<key> (now {label!r})"
        )
    if labels.size == 0:
        return np.zeros(num_classes, dtype=np.int64)
    if labels.dtype == bool or not np.issubdtype(labels.dtype, np.number):
        example = labels.reshape(-1)[0]
        raise ValueError(
            f"labels must be integer class indices, got dtype {labels.dtype} from {_describe(data)} (such as a "
            f"{type(example).__name__} {_short(example)}): pass the array of labels, or name the label of dict "
            f"items, batches or columns with label=<key> (now {label!r})"
        )
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


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
