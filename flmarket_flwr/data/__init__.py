"""Data sets and federated partitions.

* :mod:`flmarket_flwr.data.partition` — the paper's two-step partition: a globally
  imbalanced distribution ``d1`` ... ``d7``, then a per-class Dirichlet split.
* :mod:`flmarket_flwr.data.digits` — scikit-learn's bundled ``digits``, the offline
  default data set.
"""

from flmarket_flwr.data.digits import (
    DEFAULT_TEST_PER_CLASS,
    load_digits_arrays,
    train_test_split_balanced,
)
from flmarket_flwr.data.partition import (
    DEFAULT_ALPHA,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MIN_SAMPLES_PER_CLIENT,
    DISTRIBUTIONS,
    MIN_KEEP_RATIO,
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
    "DEFAULT_TEST_PER_CLASS",
    "DISTRIBUTIONS",
    "MIN_KEEP_RATIO",
    "Partition",
    "as_label_array",
    "dirichlet_split",
    "global_distribution_indices",
    "keep_fractions",
    "load_digits_arrays",
    "make_partition",
    "train_test_split_balanced",
]
