"""Data, training and evaluation helpers of the FLMarket Flower app.

Everything a ClientApp or the ServerApp needs to turn the run config into tensors
and to train or evaluate a model lives here, free of any Flower message handling:

* :class:`DataConfig` collects the data keys of the run config (dataset, number of
  clients, global distribution, Dirichlet ``alpha``, seed, test-set size).
* :func:`load_partition` / :func:`partition_label_counts` give a client its
  training tensors and its per-class counts ``N_e`` (the market's input);
  :func:`load_test_set` gives the server its held-out, class-balanced test set.
  The raw data set, the train/test split and the partition are computed once per
  process and cached (a Ray actor, a SuperExec-spawned ClientApp process or the
  ServerApp process each keep their own copy).
* :func:`train` / :func:`evaluate` run plain mini-batch SGD and evaluation on
  in-memory tensors: no ``DataLoader``, no worker processes, which is the fastest
  option for data sets of this size on a CPU.

``torch`` is imported inside the functions that need tensors, not at module level:
in a deployment every message runs in a fresh ClientApp process, and the four
market messages only need the label counts. Skipping torch's import (about 2 s
on a 2-core CPU) there cut the market phase of the 3-node loopback deployment
test from 46 s to 34 s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

from flmarket_flwr.data.digits import (
    NUM_CLASSES as DIGITS_NUM_CLASSES,
    load_digits_arrays,
    train_test_split_balanced,
)
from flmarket_flwr.data.partition import Partition, make_partition

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = [
    "DataConfig",
    "TensorPair",
    "all_label_counts",
    "configure_torch_threads",
    "evaluate",
    "load_partition",
    "load_test_set",
    "num_classes",
    "partition_label_counts",
    "resolve_device",
    "train",
]

TensorPair = tuple["torch.Tensor", "torch.Tensor"]
"""Images ``(N, 1, 8, 8)`` float32 and labels ``(N,)`` int64."""

SUPPORTED_DATASETS = ("digits",)


@dataclass(frozen=True)
class DataConfig:
    """How the data set is split between the server's test set and the clients.

    Attributes
    ----------
    dataset : str
        Data set name; the embedded app supports ``"digits"``.
    num_clients : int
        Number of partitions ``E`` of the training pool.
    distribution : str
        Global label distribution, ``"d1"`` (balanced) ... ``"d7"``.
    alpha : float
        Dirichlet concentration of the per-class split over the clients.
    seed : int
        Seed of the train/test split and of the partition.
    test_per_class : int
        Samples per class held out for the server's balanced test set.
    """

    dataset: str = "digits"
    num_clients: int = 20
    distribution: str = "d4"
    alpha: float = 0.5
    seed: int = 0
    test_per_class: int = 30

    @classmethod
    def from_run_config(
        cls,
        run_config: Mapping[str, Any],
        node_config: Mapping[str, Any] | None = None,
    ) -> "DataConfig":
        """Build the data config from a Flower run config (and node config).

        Parameters
        ----------
        run_config : Mapping[str, Any]
            The run config (``context.run_config``); keys ``dataset``,
            ``num-clients``, ``distribution``, ``alpha``, ``seed`` and
            ``test-per-class`` are read when present.
        node_config : Mapping[str, Any], optional
            The node config (``context.node_config``) of a ClientApp. When it
            carries ``num-partitions`` (always the case in simulation, and in a
            deployment started with ``--node-config "... num-partitions=N"``) that
            value overrides ``num-clients``: every node must cut the data the
            same way.

        Returns
        -------
        DataConfig
            The resolved, validated data config.
        """
        defaults = cls()
        num_clients = int(run_config.get("num-clients", defaults.num_clients))
        if node_config is not None and "num-partitions" in node_config:
            num_clients = int(node_config["num-partitions"])
        config = cls(
            dataset=str(run_config.get("dataset", defaults.dataset)),
            num_clients=num_clients,
            distribution=str(run_config.get("distribution", defaults.distribution)),
            alpha=float(run_config.get("alpha", defaults.alpha)),
            seed=int(run_config.get("seed", defaults.seed)),
            test_per_class=int(
                run_config.get("test-per-class", defaults.test_per_class)
            ),
        )
        config.validate()
        return config

    def validate(self) -> None:
        """Raise ``ValueError`` on an unsupported data set or an invalid value."""
        if self.dataset not in SUPPORTED_DATASETS:
            raise ValueError(
                f"Unsupported dataset {self.dataset!r}: the Flower app embeds "
                f"{', '.join(SUPPORTED_DATASETS)}."
            )
        if self.num_clients < 1:
            raise ValueError(f"num-clients must be >= 1, got {self.num_clients}")
        if self.test_per_class < 1:
            raise ValueError(
                f"test-per-class must be >= 1, got {self.test_per_class}"
            )


# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------


@lru_cache(maxsize=4)
def _load_arrays(dataset: str) -> tuple[np.ndarray, np.ndarray]:
    """Load a whole data set once per process: ``(images, labels)``."""
    if dataset == "digits":
        return load_digits_arrays()
    raise ValueError(f"Unsupported dataset {dataset!r}")


@lru_cache(maxsize=8)
def _split(
    dataset: str, test_per_class: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Balanced train/test split of the data set: ``(train_idx, test_idx)``."""
    _, labels = _load_arrays(dataset)
    return train_test_split_balanced(labels, test_per_class=test_per_class, seed=seed)


@lru_cache(maxsize=8)
def _partition(config: DataConfig) -> Partition:
    """Partition of the training pool over ``config.num_clients`` clients."""
    _, labels = _load_arrays(config.dataset)
    train_idx, _ = _split(config.dataset, config.test_per_class, config.seed)
    return make_partition(
        labels[train_idx],
        num_clients=config.num_clients,
        distribution=config.distribution,
        alpha=config.alpha,
        seed=config.seed,
        num_classes=num_classes(config),
    )


def num_classes(config: DataConfig) -> int:
    """Number of classes of the configured data set (without loading it)."""
    if config.dataset == "digits":
        return DIGITS_NUM_CLASSES
    _, labels = _load_arrays(config.dataset)
    return int(labels.max()) + 1


def _check_partition_id(partition_id: int, config: DataConfig) -> None:
    """Raise ``ValueError`` unless ``0 <= partition_id < num_clients``."""
    if not 0 <= partition_id < config.num_clients:
        raise ValueError(
            f"partition-id {partition_id} outside [0, {config.num_clients})"
        )


def _to_tensors(images: np.ndarray, labels: np.ndarray) -> TensorPair:
    """Convert numpy arrays to contiguous float32 / int64 tensors."""
    import torch  # pylint: disable=import-outside-toplevel

    x = torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32))
    y = torch.from_numpy(np.ascontiguousarray(labels, dtype=np.int64))
    return x, y


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
        ``(images, labels)``; cached per process, do not modify in place.
    """
    _check_partition_id(partition_id, config)
    images, labels = _load_arrays(config.dataset)
    train_idx, _ = _split(config.dataset, config.test_per_class, config.seed)
    rows = train_idx[_partition(config).client_indices[partition_id]]
    return _to_tensors(images[rows], labels[rows])


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
    """The server's held-out test set (``test_per_class`` samples per class)."""
    images, labels = _load_arrays(config.dataset)
    _, test_idx = _split(config.dataset, config.test_per_class, config.seed)
    return _to_tensors(images[test_idx], labels[test_idx])


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


def configure_torch_threads(num_threads: int) -> None:
    """Set torch's intra-op CPU threads (``<= 0`` leaves torch's default)."""
    import torch  # pylint: disable=import-outside-toplevel

    if num_threads > 0 and torch.get_num_threads() != num_threads:
        torch.set_num_threads(num_threads)


# pylint: disable=too-many-arguments,too-many-locals
def train(
    model: nn.Module,
    data: TensorPair,
    epochs: int,
    lr: float,
    device: torch.device,
    batch_size: int = 32,
    momentum: float = 0.5,
    seed: int | None = None,
) -> float:
    """Train ``model`` in place with mini-batch SGD on in-memory tensors.

    Parameters
    ----------
    model : nn.Module
        The model to train (moved to ``device``).
    data : TensorPair
        ``(images, labels)`` of the client.
    epochs : int
        Number of passes over the data.
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

    Returns
    -------
    float
        Mean training loss over all mini-batches of all epochs (``nan`` when the
        client has no data).
    """
    import torch  # pylint: disable=import-outside-toplevel
    from torch import nn  # pylint: disable=import-outside-toplevel,redefined-outer-name

    images, labels = data[0].to(device), data[1].to(device)
    num_samples = int(labels.shape[0])
    if num_samples == 0 or epochs <= 0:
        return float("nan")
    model.to(device)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    criterion = nn.CrossEntropyLoss()
    generator = torch.Generator()
    if seed is not None:
        generator.manual_seed(seed)
    total_loss, num_batches = 0.0, 0
    for _ in range(epochs):
        order = torch.randperm(num_samples, generator=generator).to(device)
        for start in range(0, num_samples, batch_size):
            batch = order[start : start + batch_size]
            optimizer.zero_grad()
            loss = criterion(model(images[batch]), labels[batch])
            loss.backward()
            optimizer.step()
            total_loss += float(loss.item())
            num_batches += 1
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
