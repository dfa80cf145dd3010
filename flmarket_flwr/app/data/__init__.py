"""Data sets and federated partitions: one loader per data set, the paper's partition, one entry point.

:func:`~flmarket_flwr.app.data.registry.load_dataset` loads any data set by name (``digits``, the offline
default, ``digits_xl``, ``fashion_mnist``, ``cifar10``, ``cinic10``, ``deap``); nothing is downloaded.
:func:`~flmarket_flwr.app.data.partition.make_partition` splits a training pool over the clients the paper's
way (a global distribution ``d1`` ... ``d7``, then a per-class Dirichlet split).
"""

from flmarket_flwr.app.data.digits import (
    DEFAULT_TEST_PER_CLASS,
    load_digits_arrays,
    train_test_split_balanced,
)
from flmarket_flwr.app.data.partition import (
    DEFAULT_ALPHA,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MIN_SAMPLES_PER_CLIENT,
    DEFAULT_SCHEDULE,
    DISTRIBUTIONS,
    LINEAR_MIN_KEEP_RATIO,
    MIN_KEEP_RATIO,
    SCHEDULES,
    Partition,
    as_label_array,
    dirichlet_split,
    global_distribution_indices,
    keep_fractions,
    make_partition,
)

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_MIN_SAMPLES_PER_CLIENT",
    "DEFAULT_SCHEDULE",
    "DEFAULT_TEST_PER_CLASS",
    "DISTRIBUTIONS",
    "LINEAR_MIN_KEEP_RATIO",
    "MIN_KEEP_RATIO",
    "SCHEDULES",
    "Partition",
    "as_label_array",
    "dirichlet_split",
    "global_distribution_indices",
    "keep_fractions",
    "load_digits_arrays",
    "make_partition",
    "train_test_split_balanced",
]

from flmarket_flwr.app.data.cifar10 import (
    CIFAR10_CLASS_NAMES,
    CIFAR10_MEAN,
    CIFAR10_STD,
    load_cifar10,
    normalize_images,
)
from flmarket_flwr.app.data.cinic10 import CINIC10_CLASS_NAMES, CINIC10_MEAN, CINIC10_STD, load_cinic10
from flmarket_flwr.app.data.deap import (
    PERIPHERAL_CHANNEL_NAMES,
    QUADRANT_NAMES,
    DeapWindows,
    deap_train_test_split,
    load_deap,
    load_deap_windows,
)
from flmarket_flwr.app.data.digits_xl import DigitsXL, load_digits_xl
from flmarket_flwr.app.data.fashion_mnist import FASHION_MNIST_CLASS_NAMES, load_fashion_mnist
from flmarket_flwr.app.data.registry import DATASET_NAMES, LoadedDataset, load_dataset

__all__ += [
    "CIFAR10_CLASS_NAMES",
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "CINIC10_CLASS_NAMES",
    "CINIC10_MEAN",
    "CINIC10_STD",
    "DATASET_NAMES",
    "FASHION_MNIST_CLASS_NAMES",
    "PERIPHERAL_CHANNEL_NAMES",
    "QUADRANT_NAMES",
    "DeapWindows",
    "DigitsXL",
    "LoadedDataset",
    "deap_train_test_split",
    "load_cifar10",
    "load_cinic10",
    "load_dataset",
    "load_deap",
    "load_deap_windows",
    "load_digits_xl",
    "load_fashion_mnist",
    "normalize_images",
]
