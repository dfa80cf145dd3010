"""Data, training and evaluation helpers of the FLMarket Flower app, free of any Flower message handling.

:class:`DataConfig` reads the data keys of the run config; :func:`load_partition`,
:func:`partition_label_counts`, :func:`load_test_set` and :func:`load_validation_set` turn it into tensors
and counts (cached per process); :func:`train` / :func:`evaluate` run mini-batch SGD and evaluation on
in-memory tensors. The data sets, the order of the splits and why ``torch`` is imported lazily are in
:class:`DataConfig`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from flmarket_flwr.app.data.digits import NUM_CLASSES as DIGITS_NUM_CLASSES
from flmarket_flwr.app.data.digits import train_test_split_balanced
from flmarket_flwr.app.data.partition import Partition, make_partition
from flmarket_flwr.app.data.registry import (
    DATASET_NAMES,
    DATASET_OPTIONS,
    LoadedDataset,
    canonical_dataset_name,
    load_dataset,
)
from flmarket_flwr.app.run_config import check_values, field_name, keys_read_by, settings_from
from flmarket_flwr.app.settings_fields import DataFields

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = [
    "DataConfig",
    "EMBEDDING_DIM",
    "TensorPair",
    "all_label_counts",
    "build_task_model",
    "configure_torch_threads",
    "data_embedding",
    "describe_device",
    "embed_inputs",
    "evaluate",
    "input_shape",
    "load_partition",
    "load_test_set",
    "load_validation_set",
    "num_classes",
    "partition_label_counts",
    "peak_memory_mib",
    "reset_peak_memory",
    "resolve_device",
    "train",
]

TensorPair = tuple["torch.Tensor", "torch.Tensor"]
"""Inputs (``(N, 1, 8, 8)`` for digits) float32 and labels ``(N,)`` int64."""

SUPPORTED_DATASETS = DATASET_NAMES

DATASETS_WITHOUT_FOLDER = ("digits", "digits_xl", "digits_xl_rgb32", "fashion_mnist")
"""Data sets that need no ``data-root``: bundled (digits), made from the bundled one (``data-root`` is
then an optional cache folder), or read from an installed package's folder (Fashion-MNIST, Debian's
``dataset-fashion-mnist``; ``data-root`` overrides it)."""

EMBEDDING_DIM = 16
"""Length of the DDS data embedding (:func:`data_embedding`)."""

EMBEDDING_FEATURES = 512
"""Width of the fixed random-feature extractor behind the DDS embedding (:func:`embed_inputs`)."""

_DIGITS_INPUT_SHAPE = (1, 8, 8)


_DATA_KEYS = keys_read_by("data")
"""The run-config keys of :class:`DataConfig` (all but ``num_clients``, which is the federation's)."""
DEFAULT_NUM_CLIENTS = 20
"""Partitions of the training pool when neither the node config (``num-partitions``) nor the caller says."""


@dataclasses.dataclass(frozen=True)
class DataConfig(DataFields):
    """How the data set is split between the server's test set and the clients.

    A field per ``data`` key of :data:`~flmarket_flwr.app.run_config.APP_KEYS` (``-`` there for ``_`` here; their
    defaults, checks and meanings are there), then ``num_clients``: the number of partitions ``E`` of the
    training pool (the federation's, node config ``num-partitions``), and ``val_per_class``: the server-side
    validation split held out of that pool (no run-config key: ``0`` in the app; the experiments' S-FedAvg and the
    runs compared with it set it).

    Notes
    -----
    Data sets come from :func:`flmarket_flwr.app.data.registry.load_dataset`: ``digits``
    (bundled, offline, the default), ``fashion_mnist`` (Debian's ``dataset-fashion-mnist``
    folder unless ``data-root`` names another), ``cifar10``, ``cinic10`` and ``deap`` (read
    from the local folder ``data-root``; nothing is downloaded). Images of CIFAR-10 and CINIC-10
    are standardised per channel with the registry's constants, once, at load time.

    Splits, in this order, all seeded by ``seed``:

    1. the data set's own held-out test set (digits: ``test-per-class`` per class);
    2. ``val_per_class`` samples per class of the training set become the server's
       validation split (``0``, the default: none, and the training pool is exactly
       the data set's training set). Every selector sees the same pool for a given
       ``val_per_class``: set the same value for runs that are compared;
    3. the rest, the training pool, is partitioned over the clients
       (:func:`~flmarket_flwr.app.data.partition.make_partition`).

    ``torch`` is imported inside the functions that need tensors, not at module level: in a deployment
    every message runs in a fresh ClientApp process, and the market messages only need the label counts.
    """

    num_clients: int = DEFAULT_NUM_CLIENTS
    val_per_class: int = 0

    @classmethod
    def from_run_config(
        cls,
        run_config: Mapping[str, Any],
        node_config: Mapping[str, Any] | None = None,
        val_per_class: int = 0,
    ) -> DataConfig:
        """Build the data config from a Flower run config (and node config).

        Parameters
        ----------
        run_config : Mapping[str, Any]
            The run config (``context.run_config``): its data keys, and ``num-clients`` when present.
        node_config : Mapping[str, Any], optional
            The node config (``context.node_config``) of a ClientApp. When it
            carries ``num-partitions`` (always the case in simulation, and in a
            deployment started with ``--node-config "... num-partitions=N"``) that
            value overrides ``num-clients``: every node must cut the data the
            same way.
        val_per_class : int (default: 0)
            The server-side validation split per class (``0``: none, the app's).

        Returns
        -------
        DataConfig
            The resolved, validated data config.
        """
        num_clients = int(run_config.get("num-clients", DEFAULT_NUM_CLIENTS))
        if node_config is not None and "num-partitions" in node_config:
            num_clients = int(node_config["num-partitions"])
        config: DataConfig = settings_from(cls, run_config, num_clients=num_clients, val_per_class=val_per_class)
        config = dataclasses.replace(config, distribution=config.distribution.lower())
        config.validate()
        return config

    def validate(self) -> None:
        """Raise ``ValueError`` on an unsupported data set or an invalid value."""
        try:
            name = canonical_dataset_name(self.dataset)
        except ValueError:
            raise ValueError(
                f"Unsupported dataset {self.dataset!r}: the Flower app supports {', '.join(SUPPORTED_DATASETS)}."
            ) from None
        if name not in DATASETS_WITHOUT_FOLDER and not self.data_root:
            raise ValueError(
                f"dataset {self.dataset!r} is read from a local folder: set data-root (nothing is "
                f"downloaded; 'digits' is bundled, 'fashion_mnist' defaults to Debian's package folder)."
            )
        if self.num_clients < 1:
            raise ValueError(f"num-clients must be >= 1, got {self.num_clients}")
        if self.val_per_class < 0:
            raise ValueError(f"val_per_class must be >= 0, got {self.val_per_class}")
        check_values({name: getattr(self, field_name(name)) for name in _DATA_KEYS})

    @property
    def dataset_name(self) -> str:
        """The canonical data set name (``"CIFAR-10"`` -> ``"cifar10"``)."""
        return canonical_dataset_name(self.dataset)


# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------


def _check_data_root(config: DataConfig) -> None:
    """Before loading: a ``data-root`` that names no folder is an error naming the key, for every data set.

    Digits reads no folder (a root that names none there can only be a typo); digits_xl's root is a cache
    folder, made on first use. (Checked at load time, not in :meth:`DataConfig.validate`, which also checks configs
    composed on a machine without the data.)
    """
    name = config.dataset_name
    if config.data_root and not name.startswith("digits_xl") and not Path(config.data_root).expanduser().is_dir():
        fix = (
            "digits is bundled: leave data-root empty (data-root='')"
            if name == "digits"
            else f"set data-root to the folder that holds the {name} files"
        )
        raise ValueError(f"data-root {config.data_root!r} is not a folder; {fix}")


def _dataset_key(config: DataConfig) -> tuple[str, str, int, int]:
    """Cache key of the raw data set: only the fields that change what is loaded.

    ``test-per-class`` only matters for the data sets that take it (digits, digits_xl), and the
    seed only where the test set is drawn (digits, DEAP): CIFAR-10 is not re-read for another seed.

    Raises
    ------
    ValueError
        If ``data-root`` names no folder (:func:`_check_data_root`).
    """
    _check_data_root(config)
    name = config.dataset_name
    return (
        name,
        "" if name == "digits" else config.data_root,
        config.test_per_class if "test_per_class" in DATASET_OPTIONS[name] else 0,
        config.seed if name in ("digits", "deap") else 0,
    )


@lru_cache(maxsize=2)
def _load(key: tuple[str, str, int, int]) -> LoadedDataset:
    """Load (once per process) a data set, its images standardised when it has constants."""
    name, root, test_per_class, seed = key
    options: dict[str, Any] = {"test_per_class": test_per_class} if "test_per_class" in DATASET_OPTIONS[name] else {}
    loaded = load_dataset(name, root or None, seed=seed, **options)
    if loaded.mean is None or loaded.std is None:
        return loaded
    shape = (1, -1) + (1,) * (loaded.train_images.ndim - 2)
    mean = np.asarray(loaded.mean, dtype=np.float32).reshape(shape)
    std = np.asarray(loaded.std, dtype=np.float32).reshape(shape)
    return LoadedDataset(
        **{
            **loaded.__dict__,
            "train_images": (loaded.train_images - mean) / std,
            "test_images": (loaded.test_images - mean) / std,
        }
    )


def _dataset(config: DataConfig) -> LoadedDataset:
    return _load(_dataset_key(config))


@lru_cache(maxsize=8)
def _splits(key: tuple[str, str, int, int], val_per_class: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(pool_idx, val_idx)``: indices into the training arrays."""
    labels = _load(key).train_labels
    if val_per_class == 0:
        return np.arange(labels.size, dtype=np.int64), np.empty(0, dtype=np.int64)
    return train_test_split_balanced(labels, test_per_class=val_per_class, seed=seed)


def _pool_and_val(config: DataConfig) -> tuple[np.ndarray, np.ndarray]:
    return _splits(_dataset_key(config), config.val_per_class, config.seed)


@lru_cache(maxsize=8)
def _partition(config: DataConfig) -> Partition:
    """Partition of the training pool over ``config.num_clients`` clients."""
    pool_idx, _ = _pool_and_val(config)
    return make_partition(
        _dataset(config).train_labels[pool_idx],
        num_clients=config.num_clients,
        distribution=config.distribution,
        alpha=config.alpha,
        seed=config.seed,
        num_classes=num_classes(config),
        schedule=config.schedule,
    )


def num_classes(config: DataConfig) -> int:
    """Number of classes of the configured data set (digits: without loading it)."""
    if config.dataset_name == "digits":
        return DIGITS_NUM_CLASSES
    return int(_dataset(config).num_classes)


def input_shape(config: DataConfig) -> tuple[int, ...]:
    """Shape of one input of the configured data set (digits: without loading it)."""
    if config.dataset_name == "digits":
        return _DIGITS_INPUT_SHAPE
    return tuple(_dataset(config).input_shape)


def build_task_model(name: str, config: DataConfig) -> nn.Module:
    """Build model ``name`` for the configured data set (classes, input channels).

    Uses the global torch RNG: seed it first for reproducible initial weights.
    """
    from flmarket_flwr.app.models import build_model  # pylint: disable=import-outside-toplevel

    options: dict[str, Any] = {}
    if name.strip().lower().replace("-", "_") == "deap_cnn":
        options["in_channels"] = int(input_shape(config)[0])
    return build_model(name, num_classes=num_classes(config), **options)


def _check_partition_id(partition_id: int, config: DataConfig) -> None:
    """Raise ``ValueError`` unless ``0 <= partition_id < num_clients``."""
    if not 0 <= partition_id < config.num_clients:
        raise ValueError(f"partition-id {partition_id} outside [0, {config.num_clients})")


def _to_tensors(images: np.ndarray, labels: np.ndarray) -> TensorPair:
    """Convert numpy arrays to contiguous float32 / int64 tensors."""
    import torch  # pylint: disable=import-outside-toplevel

    x = torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32))
    y = torch.from_numpy(np.ascontiguousarray(labels, dtype=np.int64))
    return x, y


def _partition_rows(partition_id: int, config: DataConfig) -> np.ndarray:
    """Rows of the training arrays that belong to one client."""
    _check_partition_id(partition_id, config)
    pool_idx, _ = _pool_and_val(config)
    return pool_idx[_partition(config).client_indices[partition_id]]


@lru_cache(maxsize=32)
def load_partition(partition_id: int, config: DataConfig) -> TensorPair:
    """Training tensors of one client.

    Parameters
    ----------
    partition_id : int
        Client index in ``[0, config.num_clients)``.
    config : DataConfig
        Data config shared by all clients of the run.

    Returns
    -------
    TensorPair
        ``(inputs, labels)``; cached per process, do not modify in place.
    """
    rows = _partition_rows(partition_id, config)
    data = _dataset(config)
    return _to_tensors(data.train_images[rows], data.train_labels[rows])


def partition_label_counts(partition_id: int, config: DataConfig) -> np.ndarray:
    """Per-class sample counts ``N_e`` of one client, shape ``(C,)``, int64."""
    _check_partition_id(partition_id, config)
    counts = _partition(config).label_counts[partition_id]
    return np.asarray(counts, dtype=np.int64).copy()


def all_label_counts(config: DataConfig) -> np.ndarray:
    """The ``(E, C)`` label-count matrix of all clients (for reports and tests)."""
    return np.asarray(_partition(config).label_counts, dtype=np.int64).copy()


@lru_cache(maxsize=4)
def load_test_set(config: DataConfig) -> TensorPair:
    """The server's held-out test set (digits: ``test_per_class`` samples per class)."""
    data = _dataset(config)
    return _to_tensors(data.test_images, data.test_labels)


@lru_cache(maxsize=4)
def load_validation_set(config: DataConfig) -> TensorPair:
    """The server's validation split: ``val_per_class`` training samples per class.

    Raises
    ------
    ValueError
        If ``config.val_per_class`` is 0 (no validation split configured).
    """
    if config.val_per_class == 0:
        raise ValueError("no validation split: set val_per_class > 0")
    _, val_idx = _pool_and_val(config)
    data = _dataset(config)
    return _to_tensors(data.train_images[val_idx], data.train_labels[val_idx])


@lru_cache(maxsize=8)
def _feature_extractor(input_size: int, dim: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The fixed weights of :func:`embed_inputs`: ``(input_size, EMBEDDING_FEATURES)`` and ``(.., dim)``."""
    rng = np.random.default_rng([seed, 0xDD5])
    features = rng.standard_normal((input_size, EMBEDDING_FEATURES)) / np.sqrt(input_size)
    projection = rng.standard_normal((EMBEDDING_FEATURES, dim)) / np.sqrt(dim)
    return features, projection


def embed_inputs(images: np.ndarray, dim: int = EMBEDDING_DIM, seed: int = 0) -> np.ndarray:
    """DDS's content embedding of a set of inputs, through a fixed (data-independent) feature extractor.

    ``z = mean_i relu(x_i W) P``: every flattened input goes through ``EMBEDDING_FEATURES`` random ReLU
    features (``W`` Gaussian, ``N(0, 1/d)``: the random-feature map of the degree-1 arc-cosine kernel,
    Cho and Saul, 2009), the features are averaged over the inputs (a kernel mean embedding: the
    distance between two clients' means estimates the MMD between their input distributions, not just
    the distance between their mean images) and projected to ``dim`` numbers by a fixed Gaussian ``P``
    (``N(0, 1/dim)``; Johnson-Lindenstrauss). ``W`` and ``P`` are drawn from ``seed``, the same for all.
    Limit: without offsets the features are positively homogeneous, so sets that differ only by how
    brightness is spread along one image direction (``{0, x}`` against ``{x/2, x/2}``) still embed alike.

    Returns
    -------
    numpy.ndarray
        ``(dim,)`` float64; zeros for an empty set.
    """
    size = int(np.prod(images.shape[1:]))
    if images.shape[0] == 0:
        return np.zeros(dim)
    features, projection = _feature_extractor(size, dim, seed)
    flat = images.reshape(images.shape[0], size).astype(np.float64)
    return np.maximum(flat @ features, 0.0).mean(axis=0) @ projection


def data_embedding(partition_id: int, config: DataConfig, dim: int = EMBEDDING_DIM, seed: int = 0) -> np.ndarray:
    """A small summary of one client's inputs, for the DDS baseline's content diversity.

    :func:`embed_inputs` of the client's (standardised where the data set has constants) inputs: a client
    sends ``dim`` numbers instead of its data. It is still a summary of the client's raw data: the DDS
    baseline has none of FLMarket's privacy (see :mod:`flmarket_flwr.app.server_app`).

    Returns
    -------
    numpy.ndarray
        ``(dim,)`` float64; zeros for a client without data.
    """
    rows = _partition_rows(partition_id, config)
    return embed_inputs(_dataset(config).train_images[rows], dim, seed)


# ---------------------------------------------------------------------------
# Training and evaluation
# ---------------------------------------------------------------------------


def resolve_device(name: str = "auto") -> torch.device:
    """Turn a device setting into a ``torch.device``.

    Parameters
    ----------
    name : str (default: "auto")
        ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"`` or
        ``"cuda:<index>"``.

    Returns
    -------
    torch.device
        The device to train on.
    """
    import torch  # pylint: disable=import-outside-toplevel

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available")
    return device


def describe_device(device: torch.device) -> str:
    """``device`` as a log names it: ``"cuda:0 (NVIDIA H200)"`` for a GPU (index and model), ``"cpu"``."""
    import torch  # pylint: disable=import-outside-toplevel

    if device.type != "cuda":
        return str(device)
    index = torch.cuda.current_device() if device.index is None else device.index
    return f"cuda:{index} ({torch.cuda.get_device_name(index)})"


def reset_peak_memory(device: torch.device) -> None:
    """Start counting ``device``'s peak CUDA memory afresh (:func:`peak_memory_mib`); nothing on the CPU."""
    import torch  # pylint: disable=import-outside-toplevel

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_mib(device: torch.device) -> float | None:
    """The most CUDA memory this process's tensors held on ``device`` since :func:`reset_peak_memory`, in MiB
    (``torch.cuda.max_memory_allocated``); ``None`` on the CPU."""
    import torch  # pylint: disable=import-outside-toplevel

    return float(torch.cuda.max_memory_allocated(device)) / 2**20 if device.type == "cuda" else None


def configure_torch_threads(num_threads: int) -> None:
    """Set torch's intra-op CPU threads (``<= 0`` leaves torch's default)."""
    import torch  # pylint: disable=import-outside-toplevel

    if num_threads > 0 and torch.get_num_threads() != num_threads:
        torch.set_num_threads(num_threads)


# pylint: disable=too-many-arguments,too-many-locals
def training_seed(seed: int, partition_id: int, server_round: int) -> int:
    """The seed of one client's local training in one round: its mini-batch order and torch's global draws.

    A function of the run's ``seed``, the client's partition and the round alone, so the Flower app's
    ClientApps and the experiments' in-process engine train a given client identically.
    """
    return seed * 1_000_003 + partition_id * 1_009 + server_round


def train(
    model: nn.Module,
    data: TensorPair,
    epochs: int,
    lr: float,
    device: torch.device,
    batch_size: int = 32,
    momentum: float = 0.5,
    seed: int | None = None,
    *,
    steps: int | None = None,
    clip_norm: float = 0.0,
) -> float:
    """Train ``model`` in place with mini-batch SGD on in-memory tensors.

    Parameters
    ----------
    model : nn.Module
        The model to train (moved to ``device``).
    data : TensorPair
        ``(images, labels)`` of the client.
    epochs : int
        Number of passes over the data (ignored when ``steps`` is given).
    lr : float
        SGD learning rate.
    device : torch.device
        Device to train on.
    batch_size : int (default: 32)
        Mini-batch size.
    momentum : float (default: 0.5)
        SGD momentum.
    seed : int, optional
        Seed of the mini-batch shuffling (unseeded when ``None``).
    steps : int, optional
        The training budget in mini-batches: train exactly this many instead of ``epochs`` passes, drawn from
        successive random permutations of the data (so a client with fewer than ``batch_size * steps`` samples
        passes over it more than once).
    clip_norm : float (default: 0.0)
        Clip the gradient norm of every step at this value (0: no clipping).

    Returns
    -------
    float
        Mean training loss over all mini-batches (``nan`` when the client has no data; non-finite if
        training diverged).
    """
    import torch  # pylint: disable=import-outside-toplevel
    from torch import nn  # pylint: disable=import-outside-toplevel,redefined-outer-name

    images, labels = data[0].to(device), data[1].to(device)
    num_samples = int(labels.shape[0])
    training_steps = steps if steps is not None else epochs * -(-num_samples // batch_size)
    if num_samples == 0 or training_steps <= 0:
        return float("nan")
    model.to(device)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    criterion = nn.CrossEntropyLoss()
    generator = torch.Generator()
    if seed is not None:
        generator.manual_seed(seed)
    total_loss, num_batches = 0.0, 0
    while num_batches < training_steps:
        order = torch.randperm(num_samples, generator=generator).to(device)
        for start in range(0, num_samples, batch_size):
            batch = order[start : start + batch_size]
            optimizer.zero_grad()
            loss = criterion(model(images[batch]), labels[batch])
            loss.backward()
            if clip_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
            optimizer.step()
            total_loss += float(loss.item())
            num_batches += 1
            if num_batches == training_steps:
                break
    return total_loss / num_batches


def evaluate(
    model: nn.Module,
    data: TensorPair,
    device: torch.device,
    batch_size: int = 512,
) -> tuple[float, float]:
    """Evaluate ``model`` on in-memory tensors.

    Parameters
    ----------
    model : nn.Module
        The model to evaluate (moved to ``device``).
    data : TensorPair
        ``(images, labels)`` to evaluate on.
    device : torch.device
        Device to evaluate on.
    batch_size : int (default: 512)
        Evaluation batch size.

    Returns
    -------
    tuple[float, float]
        Mean cross-entropy loss and accuracy (``(nan, nan)`` on empty data).
    """
    import torch  # pylint: disable=import-outside-toplevel
    from torch import nn  # pylint: disable=import-outside-toplevel,redefined-outer-name

    images, labels = data
    num_samples = int(labels.shape[0])
    if num_samples == 0:
        return float("nan"), float("nan")
    model.to(device)
    model.eval()
    criterion = nn.CrossEntropyLoss(reduction="sum")
    total_loss, correct = 0.0, 0
    with torch.no_grad():
        for start in range(0, num_samples, batch_size):
            x = images[start : start + batch_size].to(device)
            y = labels[start : start + batch_size].to(device)
            logits = model(x)
            total_loss += float(criterion(logits, y).item())
            correct += int((logits.argmax(dim=1) == y).sum().item())
    return total_loss / num_samples, correct / num_samples
