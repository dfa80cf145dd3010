"""Tests of the digits CNN and its ArrayRecord helpers."""

import pytest
import torch
from flwr.app import ArrayRecord

from flmarket_flwr.models import DigitsCNN, build_model, count_parameters, get_arrays, set_arrays


def test_forward_shape_and_dtype() -> None:
    """A batch of 8x8 images gives one logit per class."""
    model = DigitsCNN(num_classes=10)
    logits = model(torch.rand(5, 1, 8, 8))
    assert logits.shape == (5, 10)
    assert logits.dtype == torch.float32


def test_model_is_small() -> None:
    """The default model stays small enough to train fast on a CPU."""
    assert 10_000 < count_parameters(build_model()) < 100_000


def test_build_model_rejects_unknown_name() -> None:
    """An unknown model name is a clear error."""
    with pytest.raises(ValueError, match="Unknown model"):
        build_model("resnet-56")


def test_arrays_round_trip() -> None:
    """Weights survive a trip through a Flower ArrayRecord."""
    torch.manual_seed(0)
    source = build_model()
    torch.manual_seed(1)
    target = build_model()
    x = torch.rand(3, 1, 8, 8)
    assert not torch.allclose(source(x), target(x))

    record = get_arrays(source)
    assert isinstance(record, ArrayRecord)
    set_arrays(target, record)
    assert torch.equal(source(x), target(x))


def test_same_seed_same_initial_weights() -> None:
    """The server's initial model is reproducible from the seed."""
    torch.manual_seed(42)
    first = get_arrays(build_model()).to_torch_state_dict()
    torch.manual_seed(42)
    second = get_arrays(build_model()).to_torch_state_dict()
    assert all(torch.equal(first[key], second[key]) for key in first)
