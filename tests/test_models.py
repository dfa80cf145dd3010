"""Tests of the models (digits, Fashion-MNIST and DEAP CNNs, ResNet-56), the registry and the ArrayRecord helpers."""

import pytest
import torch
from flwr.app import ArrayRecord, MetricRecord, RecordDict
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords
from torch import nn

from flmarket_flwr.app.models import (
    MODEL_NAMES,
    DeapCNN,
    DigitsCNN,
    FashionCNN,
    ResNet56,
    build_model,
    count_parameters,
    get_arrays,
    set_arrays,
)


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


# --- ResNet-56 -----------------------------------------------------------------------------------
def test_resnet56_has_the_papers_parameter_count() -> None:
    """Option-A ResNet-56 for 10 classes has about 0.85 M parameters (853,018)."""
    model = ResNet56(num_classes=10)
    assert 840_000 <= count_parameters(model) <= 870_000
    assert count_parameters(model) == 853_018


def test_resnet56_option_b_adds_projection_parameters() -> None:
    """Option-B shortcuts add two 1x1 projections (and their batch norms)."""
    assert count_parameters(ResNet56(shortcut="B")) == 855_770


def test_resnet56_layout() -> None:
    """56 weighted layers: 1 + 3 x 9 x 2 convolutions and one linear layer."""
    model = ResNet56()
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert len(convs) + len(linears) == 56
    assert [len(stage) for stage in (model.layer1, model.layer2, model.layer3)] == [9, 9, 9]


def test_resnet56_forward_shape() -> None:
    """A (2, 3, 32, 32) batch gives (2, 10) logits, with both shortcut options."""
    x = torch.rand(2, 3, 32, 32)
    for shortcut in ("A", "B"):
        assert ResNet56(shortcut=shortcut)(x).shape == (2, 10)


def test_resnet56_rejects_unknown_shortcut() -> None:
    """Only options A and B exist."""
    with pytest.raises(ValueError, match="shortcut"):
        ResNet56(shortcut="C")


# --- DEAP CNN ------------------------------------------------------------------------------------
@pytest.mark.parametrize("num_classes", [2, 4])
@pytest.mark.parametrize("length", [128, 512])
def test_deap_cnn_forward_shape(num_classes: int, length: int) -> None:
    """(N, 8, L) peripheral-signal windows give (N, num_classes) logits for any window length."""
    model = DeapCNN(num_classes=num_classes)
    assert model(torch.randn(3, 8, length)).shape == (3, num_classes)


def test_deap_cnn_layer_sizes() -> None:
    """Three Conv1d blocks 8 -> 32 -> 64 -> 128, a linear head; 37,538 parameters for 2 classes."""
    model = DeapCNN(num_classes=2)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv1d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size[0]) for c in convs] == [
        (8, 32, 7),
        (32, 64, 5),
        (64, 128, 3),
    ]
    assert sum(isinstance(m, nn.BatchNorm1d) for m in model.modules()) == 3
    assert count_parameters(model) == 37_538
    assert count_parameters(DeapCNN(num_classes=4)) == 37_796


def test_fashion_cnn_layout_and_parameter_count() -> None:
    """Two stride-2 convolutions take 28x28 to 32 maps of 7x7; 106,122 parameters at the defaults."""
    model = FashionCNN()
    assert count_parameters(model) == (16 * 25 + 16) + (32 * 16 * 9 + 32) + (1568 * 64 + 64) + (64 * 10 + 10)
    assert count_parameters(model) == 106_122
    assert model.features(torch.rand(3, 1, 28, 28)).shape == (3, 32, 7, 7)
    assert model(torch.rand(3, 1, 28, 28)).shape == (3, 10)
    wide = FashionCNN(num_classes=5, width=8, hidden=32)
    assert count_parameters(wide) == (8 * 25 + 8) + (16 * 8 * 9 + 16) + (784 * 32 + 32) + (32 * 5 + 5)


def test_fashion_cnn_maps_inputs_to_minus_one_one() -> None:
    """The fixed first step is ``2 x - 1``: the first convolution sees ``[-1, 1]`` inputs."""
    torch.manual_seed(0)
    model = FashionCNN()
    x = torch.rand(2, 1, 28, 28)
    expected = model.classifier(model.features(2.0 * x - 1.0))
    torch.testing.assert_close(model(x), expected)
    assert not torch.allclose(model(x), model.classifier(model.features(x)))


def test_deap_cnn_rejects_other_depths() -> None:
    """The DEAP model has exactly three blocks."""
    with pytest.raises(ValueError, match="three"):
        DeapCNN(channels=(16, 32))


# --- Registry ------------------------------------------------------------------------------------
def test_build_model_names() -> None:
    """Every registered name builds its class; the default is the digits CNN."""
    assert MODEL_NAMES == ("digits_cnn", "resnet56", "deap_cnn", "fmnist_cnn")
    assert isinstance(build_model("digits_cnn"), DigitsCNN)
    assert isinstance(build_model("fmnist_cnn"), FashionCNN)
    assert isinstance(build_model("resnet56"), ResNet56)
    assert isinstance(build_model("deap_cnn", num_classes=2), DeapCNN)
    assert isinstance(build_model(num_classes=10), DigitsCNN)


def test_build_model_accepts_old_and_cased_spellings() -> None:
    """The older ``digits-cnn`` spelling and other case/hyphen variants still work."""
    assert isinstance(build_model("digits-cnn"), DigitsCNN)
    assert isinstance(build_model("ResNet56"), ResNet56)
    assert isinstance(build_model("DEAP-CNN", num_classes=4), DeapCNN)
    assert isinstance(build_model("FMNIST-CNN"), FashionCNN)


def test_build_model_passes_num_classes_and_options() -> None:
    """``num_classes`` and constructor options reach the model."""
    model = build_model("resnet56", num_classes=7, shortcut="B")
    assert model(torch.rand(1, 3, 32, 32)).shape == (1, 7)
    assert count_parameters(model) == 855_770 - 3 * 65
    deap = build_model("deap_cnn", num_classes=4, dropout=0.3)
    assert deap.dropout.p == 0.3


def test_build_model_error_lists_known_names() -> None:
    """The error for an unknown name lists the known ones."""
    with pytest.raises(ValueError, match="Unknown model 'vgg16'.*'digits_cnn', 'resnet56', 'deap_cnn', 'fmnist_cnn'"):
        build_model("vgg16")
    with pytest.raises(ValueError, match="num_classes"):
        build_model("resnet56", num_classes=0)


# --- Training and FedAvg round trips -------------------------------------------------------------
CASES = {
    "digits_cnn": (dict(num_classes=10), (1, 8, 8), 10),
    "resnet56": (dict(num_classes=10), (3, 32, 32), 10),
    "deap_cnn": (dict(num_classes=4), (8, 256), 4),
    "fmnist_cnn": (dict(num_classes=10), (1, 28, 28), 10),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_training_steps_reduce_loss(name: str) -> None:
    """A few Adam steps on one tiny batch reduce its training loss."""
    options, shape, classes = CASES[name]
    torch.manual_seed(0)
    model = build_model(name, **options)
    x = torch.rand(8, *shape)
    y = torch.arange(8) % classes
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss()
    model.train()
    losses = []
    for _ in range(4):
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    with torch.no_grad():
        final = float(criterion(model(x), y))
    assert final < losses[0]


@pytest.mark.parametrize("name", ["resnet56", "deap_cnn"])
def test_fedavg_average_of_batchnorm_models_loads_back(name: str) -> None:
    """Flower's FedAvg turns ``num_batches_tracked`` into floats; ``set_arrays`` still loads it."""
    options, shape, _ = CASES[name]
    models = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = build_model(name, **options)
        model.train()
        model(torch.rand(4, *shape))  # update the running statistics
        models.append(model)
    replies = [
        RecordDict({"arrays": get_arrays(m), "metrics": MetricRecord({"num-examples": n})})
        for m, n in zip(models, (1, 3), strict=True)
    ]
    averaged = aggregate_arrayrecords(replies, "num-examples")
    target = build_model(name, **options)
    set_arrays(target, averaged)
    state = target.state_dict()
    first, second = (m.state_dict() for m in models)
    for key, value in state.items():
        if value.is_floating_point():
            torch.testing.assert_close(value, 0.25 * first[key] + 0.75 * second[key])
        else:
            assert value.dtype == torch.int64
