"""Tests of the app's data, training and evaluation helpers."""

import math

import numpy as np
import pytest
import torch

from flmarket_flwr.app.models import build_model
from flmarket_flwr.app.task import (
    DataConfig,
    all_label_counts,
    evaluate,
    load_partition,
    load_test_set,
    num_classes,
    partition_label_counts,
    resolve_device,
    train,
)

CONFIG = DataConfig(num_clients=5, distribution="d2", alpha=0.5, seed=3, test_per_class=20)


def test_data_config_from_run_config() -> None:
    """Run-config keys are read, missing ones keep their defaults."""
    run_config = {"num-clients": 7, "distribution": "d5", "alpha": 1, "seed": 4}
    config = DataConfig.from_run_config(run_config)
    assert config == DataConfig(num_clients=7, distribution="d5", alpha=1.0, seed=4)
    assert DataConfig.from_run_config({}) == DataConfig()


def test_node_config_num_partitions_wins() -> None:
    """A node's num-partitions overrides num-clients (all nodes cut the data alike)."""
    node_config = {"partition-id": 1, "num-partitions": 3}
    config = DataConfig.from_run_config({"num-clients": 20}, node_config)
    assert config.num_clients == 3


@pytest.mark.parametrize(
    "run_config",
    [{"dataset": "cifar10"}, {"num-clients": 0}, {"test-per-class": 0}],
)
def test_data_config_rejects_bad_values(run_config: dict) -> None:
    """Unsupported data sets and impossible sizes are clear errors."""
    with pytest.raises(ValueError):
        DataConfig.from_run_config(run_config)


def test_partitions_are_disjoint_and_match_label_counts() -> None:
    """Every client's tensors agree with its label counts; clients share no sample."""
    counts = all_label_counts(CONFIG)
    assert counts.shape == (CONFIG.num_clients, num_classes(CONFIG))
    seen: set[bytes] = set()
    for partition_id in range(CONFIG.num_clients):
        images, labels = load_partition(partition_id, CONFIG)
        assert images.shape[1:] == (1, 8, 8) and images.dtype == torch.float32
        assert labels.dtype == torch.int64 and len(images) == len(labels) > 0
        assert 0.0 <= float(images.min()) and float(images.max()) <= 1.0
        expected = partition_label_counts(partition_id, CONFIG)
        np.testing.assert_array_equal(np.bincount(labels.numpy(), minlength=10), expected)
        np.testing.assert_array_equal(expected, counts[partition_id])
        rows = {image.numpy().tobytes() + bytes([int(label)]) for image, label in zip(images, labels, strict=True)}
        assert not rows & seen
        seen |= rows


def test_partition_is_cached_and_reproducible() -> None:
    """The same config gives the same tensors (from the per-process cache)."""
    first = load_partition(0, CONFIG)
    assert load_partition(0, CONFIG) is first
    other_seed = DataConfig(**{**CONFIG.__dict__, "seed": 4})
    assert not np.array_equal(all_label_counts(CONFIG), all_label_counts(other_seed))


def test_partition_id_out_of_range() -> None:
    """A partition id outside [0, num_clients) is a clear error."""
    with pytest.raises(ValueError, match="partition-id"):
        load_partition(CONFIG.num_clients, CONFIG)
    with pytest.raises(ValueError, match="partition-id"):
        partition_label_counts(-1, CONFIG)


def test_test_set_is_balanced_and_held_out() -> None:
    """The server's test set has test_per_class images per class, none seen by a client."""
    images, labels = load_test_set(CONFIG)
    assert np.bincount(labels.numpy()).tolist() == [CONFIG.test_per_class] * 10
    test_rows = {image.numpy().tobytes() for image in images}
    for partition_id in range(CONFIG.num_clients):
        train_images, _ = load_partition(partition_id, CONFIG)
        assert not {image.numpy().tobytes() for image in train_images} & test_rows


def test_train_improves_accuracy_and_is_seeded() -> None:
    """Local training lowers the loss on the client's data, reproducibly."""
    device = torch.device("cpu")
    data = load_partition(0, CONFIG)
    results = []
    for _ in range(2):
        torch.manual_seed(0)
        model = build_model()
        loss_before, _ = evaluate(model, data, device)
        train_loss = train(model, data, epochs=5, lr=0.05, device=device, batch_size=8, seed=1)
        loss_after, accuracy = evaluate(model, data, device)
        results.append((train_loss, loss_after))
        assert loss_after < loss_before
        assert accuracy > 0.5
        assert math.isfinite(train_loss)
    assert results[0] == results[1]


def test_train_and_evaluate_on_empty_data() -> None:
    """No data: training is a no-op and both report nan."""
    empty = (torch.empty(0, 1, 8, 8), torch.empty(0, dtype=torch.int64))
    model = build_model()
    assert math.isnan(train(model, empty, epochs=1, lr=0.1, device=torch.device("cpu")))
    loss, accuracy = evaluate(model, empty, torch.device("cpu"))
    assert math.isnan(loss) and math.isnan(accuracy)


def test_evaluate_ranges() -> None:
    """Evaluation returns a positive loss and an accuracy in [0, 1]."""
    loss, accuracy = evaluate(build_model(), load_test_set(CONFIG), torch.device("cpu"))
    assert loss > 0 and 0.0 <= accuracy <= 1.0


def test_resolve_device() -> None:
    """'auto' picks CUDA only when available; explicit CUDA without a GPU is an error."""
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    assert resolve_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            resolve_device("cuda")
