"""Models of the FLMarket Flower app, built by name with :func:`build_model`.

``digits_cnn`` (default), ``fmnist_cnn``, ``resnet56`` (the paper's, for CIFAR-10 and CINIC-10) and
``deap_cnn`` (the paper's, for DEAP). Weights travel as Flower ``ArrayRecord`` s through :func:`get_arrays` /
:func:`set_arrays`, which also restores the batch-norm counters FedAvg turns into floats.
"""

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord
from torch import nn

__all__ = [
    "MODEL_NAMES",
    "BasicBlock",
    "DeapCNN",
    "DigitsCNN",
    "FashionCNN",
    "ResNet56",
    "build_model",
    "count_parameters",
    "get_arrays",
    "set_arrays",
]


class DigitsCNN(nn.Module):
    """Small CNN for 8x8 single-channel digit images.

    Inputs in ``[0, 1]`` are first mapped to ``[-1, 1]`` (a fixed affine step, no
    parameters), then go through two 3x3 convolutions (padding 1) with ReLU, one
    2x2 max-pooling step and a two-layer classifier head. No batch normalisation:
    its running statistics average poorly over non-IID clients.

    Parameters
    ----------
    num_classes : int (default: 10)
        Number of output classes.
    in_channels : int (default: 1)
        Number of input channels.
    width : int (default: 16)
        Number of filters of the first convolution; the second has ``2 * width``.
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 1, width: int = 16):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(2 * width * 4 * 4, 64),
            nn.ReLU(),
            nn.Linear(64, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return class logits for a batch of shape ``(B, C, 8, 8)`` in ``[0, 1]``."""
        return self.classifier(self.features(2.0 * x - 1.0))


class FashionCNN(nn.Module):
    """Small CNN for 28x28 single-channel images (Fashion-MNIST).

    Inputs in ``[0, 1]`` are mapped to ``[-1, 1]`` (a fixed affine step, no parameters), then:

    ===========================================  =============
    layer                                        output
    ===========================================  =============
    Conv2d(1 -> 16, 5x5, stride 2, pad 2), ReLU  (16, 14, 14)
    Conv2d(16 -> 32, 3x3, stride 2, pad 1), ReLU (32, 7, 7)
    Linear(1568 -> 64), ReLU                     (64,)
    Linear(64 -> num_classes)                    (num_classes,)
    ===========================================  =============

    106,122 parameters for 10 classes. The strided convolutions do the down-sampling that max-pooling
    layers would: the same output sizes without the pooling kernels, which dominate a CPU step at 28x28.
    No batch normalisation, as :class:`DigitsCNN` (running statistics average poorly over non-IID clients).

    Parameters
    ----------
    num_classes : int (default: 10)
        Number of output classes.
    in_channels : int (default: 1)
        Number of input channels.
    width : int (default: 16)
        Filters of the first convolution; the second has ``2 * width``.
    hidden : int (default: 64)
        Width of the hidden linear layer.
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 1, width: int = 16, hidden: int = 64) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, kernel_size=5, stride=2, padding=2),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, kernel_size=3, stride=2, padding=1),
            nn.ReLU(),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(2 * width * 7 * 7, hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return class logits for a batch of shape ``(B, C, 28, 28)`` in ``[0, 1]``."""
        return self.classifier(self.features(2.0 * x - 1.0))


# --- ResNet-56 (CIFAR variant) -------------------------------------------------------------------
class BasicBlock(nn.Module):
    """Residual block of two 3x3 convolutions, each followed by batch normalisation.

    ``out = relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))``.

    Parameters
    ----------
    in_planes : int
        Number of input channels.
    planes : int
        Number of output channels.
    stride : int (default: 1)
        Stride of the first convolution (2 at the first block of stages 2 and 3).
    shortcut : str (default: "A")
        How the identity path changes shape when ``stride != 1`` or
        ``in_planes != planes``: ``"A"`` subsamples by ``stride`` and zero-pads the new
        channels (no parameters, He et al.'s option A, used for CIFAR);
        ``"B"`` uses a 1x1 convolution with stride and batch normalisation (option B).
    """

    def __init__(self, in_planes: int, planes: int, stride: int = 1, shortcut: str = "A") -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut: nn.Module = _make_shortcut(in_planes, planes, stride, shortcut)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the block."""
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class _ZeroPadShortcut(nn.Module):
    """Option-A shortcut: spatial subsampling by ``stride`` and zero-padding of the channels."""

    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        extra = planes - in_planes
        self.pad_before = extra // 2
        self.pad_after = extra - extra // 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Subsample and pad ``x`` to the block's output shape."""
        x = x[:, :, :: self.stride, :: self.stride]
        return F.pad(x, (0, 0, 0, 0, self.pad_before, self.pad_after))


def _make_shortcut(in_planes: int, planes: int, stride: int, shortcut: str) -> nn.Module:
    """Return the identity path of a :class:`BasicBlock`."""
    if shortcut not in ("A", "B"):
        raise ValueError(f"shortcut must be 'A' or 'B', got {shortcut!r}")
    if stride == 1 and in_planes == planes:
        return nn.Identity()
    if shortcut == "A":
        if planes < in_planes:
            raise ValueError("option-A shortcuts cannot reduce the number of channels")
        return _ZeroPadShortcut(in_planes, planes, stride)
    return nn.Sequential(
        nn.Conv2d(in_planes, planes, kernel_size=1, stride=stride, bias=False),
        nn.BatchNorm2d(planes),
    )


class ResNet56(nn.Module):
    """ResNet-56 for 32x32 images (the CIFAR variant of He et al., 2016).

    Layout (``n = 9`` blocks per stage, ``6n + 2 = 56`` weighted layers):

    =====================  =================  ====================
    layer                  output (C, H, W)   blocks
    =====================  =================  ====================
    3x3 conv 16, BN, ReLU  (16, 32, 32)
    stage 1                (16, 32, 32)       9 x BasicBlock(16)
    stage 2 (stride 2)     (32, 16, 16)       9 x BasicBlock(32)
    stage 3 (stride 2)     (64, 8, 8)         9 x BasicBlock(64)
    global average pool    (64,)
    linear                 (num_classes,)
    =====================  =================  ====================

    Weights use Kaiming-normal initialisation (convolutions and the linear layer).
    With option-A shortcuts (default) the model has 853,018 parameters for 10 classes;
    with option B, 855,770.

    Parameters
    ----------
    num_classes : int (default: 10)
        Number of output classes.
    in_channels : int (default: 3)
        Number of input channels.
    shortcut : str (default: "A")
        ``"A"`` (zero-padding identity shortcuts, as in the paper's CIFAR experiments)
        or ``"B"`` (1x1 convolution projections); see :class:`BasicBlock`.
    blocks_per_stage : int (default: 9)
        ``n``; 9 gives ResNet-56 (3 gives ResNet-20, 5 ResNet-32, ...).
    """

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 3,
        shortcut: str = "A",
        blocks_per_stage: int = 9,
    ) -> None:
        super().__init__()
        if blocks_per_stage < 1:
            raise ValueError(f"blocks_per_stage must be >= 1, got {blocks_per_stage}")
        self.conv1 = nn.Conv2d(in_channels, 16, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self._in_planes = 16
        self.layer1 = self._make_stage(16, blocks_per_stage, stride=1, shortcut=shortcut)
        self.layer2 = self._make_stage(32, blocks_per_stage, stride=2, shortcut=shortcut)
        self.layer3 = self._make_stage(64, blocks_per_stage, stride=2, shortcut=shortcut)
        self.linear = nn.Linear(64, num_classes)
        self._init_weights()

    def _make_stage(self, planes: int, num_blocks: int, stride: int, shortcut: str) -> nn.Sequential:
        """Return one stage: a block with ``stride``, then ``num_blocks - 1`` blocks with stride 1."""
        blocks = []
        for block_stride in [stride] + [1] * (num_blocks - 1):
            blocks.append(BasicBlock(self._in_planes, planes, block_stride, shortcut))
            self._in_planes = planes
        return nn.Sequential(*blocks)

    def _init_weights(self) -> None:
        """Kaiming-normal weights for convolutions and the linear layer (as the reference)."""
        for module in self.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(module.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return class logits for a batch of shape ``(B, C, 32, 32)``."""
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer3(self.layer2(self.layer1(out)))
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.linear(out)


# --- DEAP 1-D CNN --------------------------------------------------------------------------------
class DeapCNN(nn.Module):
    """Three-layer 1-D CNN for DEAP's peripheral physiological signals.

    Input: ``(N, in_channels, L)``, by default the 8 peripheral channels of DEAP (hEOG,
    vEOG, zEMG, tEMG, GSR, respiration belt, plethysmograph, temperature) over a window
    of ``L`` samples (e.g. 512 = 4 s at DEAP's down-sampled 128 Hz). Any ``L >= 8`` works:
    a global average pool ends the feature extractor.

    Layer sizes with the defaults (``channels=(32, 64, 128)``, ``kernel_sizes=(7, 5, 3)``)
    and ``L = 512``:

    ==============================================================  ==============
    block                                                           output (C, L)
    ==============================================================  ==============
    Conv1d(8 -> 32, k=7, pad 3), BatchNorm1d, ReLU, MaxPool1d(2)    (32, 256)
    Conv1d(32 -> 64, k=5, pad 2), BatchNorm1d, ReLU, MaxPool1d(2)   (64, 128)
    Conv1d(64 -> 128, k=3, pad 1), BatchNorm1d, ReLU, MaxPool1d(2)  (128, 64)
    AdaptiveAvgPool1d(1), Dropout(dropout)                          (128,)
    Linear(128 -> num_classes)                                      (num_classes,)
    ==============================================================  ==============

    37,538 parameters for 2 classes (37,796 for 4). The paper only says "a three-layer CNN";
    these sizes are this project's choice.

    Parameters
    ----------
    num_classes : int (default: 2)
        Number of output classes: 2 (e.g. high/low valence) or 4 (valence x arousal quadrants).
    in_channels : int (default: 8)
        Number of signal channels.
    channels : Sequence[int] (default: (32, 64, 128))
        Output channels of the three convolutions.
    kernel_sizes : Sequence[int] (default: (7, 5, 3))
        Kernel sizes of the three convolutions (odd; "same" padding).
    dropout : float (default: 0.0)
        Dropout probability before the linear layer.
    """

    def __init__(  # pylint: disable=too-many-arguments
        self,
        num_classes: int = 2,
        in_channels: int = 8,
        channels: Sequence[int] = (32, 64, 128),
        kernel_sizes: Sequence[int] = (7, 5, 3),
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if len(channels) != 3 or len(kernel_sizes) != 3:
            raise ValueError("DeapCNN has exactly three convolution blocks: give 3 channels and 3 kernel sizes")
        blocks: list[nn.Module] = []
        previous = in_channels
        for width, kernel in zip(channels, kernel_sizes, strict=True):
            blocks += [
                nn.Conv1d(previous, width, kernel_size=kernel, padding=kernel // 2),
                nn.BatchNorm1d(width),
                nn.ReLU(),
                nn.MaxPool1d(2),
            ]
            previous = width
        self.features = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool1d(1)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(previous, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return class logits for a batch of shape ``(N, in_channels, L)``."""
        out = self.pool(self.features(x)).flatten(1)
        return self.classifier(self.dropout(out))


# --- Registry ------------------------------------------------------------------------------------
_REGISTRY: dict[str, Callable[..., nn.Module]] = {
    "digits_cnn": DigitsCNN,
    "resnet56": ResNet56,
    "deap_cnn": DeapCNN,
    "fmnist_cnn": FashionCNN,
}

MODEL_NAMES: tuple[str, ...] = tuple(_REGISTRY)
"""Names accepted by :func:`build_model`."""


def _canonical_name(name: str) -> str:
    """Lower-case ``name`` and read ``-`` as ``_`` (so the older ``"digits-cnn"`` still works)."""
    return name.strip().lower().replace("-", "_")


def build_model(name: str = "digits_cnn", num_classes: int = 10, **options: object) -> nn.Module:
    """Build a model by name.

    Parameters
    ----------
    name : str (default: "digits_cnn")
        One of :data:`MODEL_NAMES`: ``"digits_cnn"``, ``"resnet56"``, ``"deap_cnn"``, ``"fmnist_cnn"``.
        Case and ``-`` versus ``_`` do not matter (``"digits-cnn"`` is accepted).
    num_classes : int (default: 10)
        Number of output classes (for ``"deap_cnn"``, pass 2 or 4).
    **options
        Further keyword arguments of the model's constructor, e.g. ``shortcut="B"`` for
        :class:`ResNet56` or ``dropout=0.2`` for :class:`DeapCNN`.

    Returns
    -------
    nn.Module
        A freshly initialised model (uses the global torch RNG: seed it first
        with ``torch.manual_seed`` for reproducible initial weights).

    Raises
    ------
    ValueError
        If ``name`` is not a known model, or ``num_classes < 1``.

    Notes
    -----
    Four architectures, built by name with :func:`build_model`:

    ``"digits_cnn"`` (default) -- :class:`DigitsCNN`
        A small CNN for the 8x8 grey-scale images of scikit-learn's bundled ``digits``
        data set (the embedded app that runs everywhere offline). About 38k parameters.
    ``"fmnist_cnn"`` -- :class:`FashionCNN`
        A small CNN for 28x28 grey-scale images (Fashion-MNIST, ``dataset=fashion_mnist``): two
        strided convolutions and a two-layer head, 106,122 parameters for 10 classes.
    ``"resnet56"`` -- :class:`ResNet56`
        The CIFAR variant of ResNet-56 (He et al., 2016, section 4.2) used by the paper
        for CIFAR-10 and CINIC-10 (3x32x32 images, 10 classes). With the default option-A
        shortcuts it has 853,018 parameters, the paper's "0.85 M".
    ``"deap_cnn"`` -- :class:`DeapCNN`
        The three-layer 1-D CNN the paper trains on the peripheral physiological signals
        of DEAP (8 channels, a window of ``L`` samples; 2 or 4 classes). About 37k parameters.
    """
    key = _canonical_name(name)
    if key not in _REGISTRY:
        known = ", ".join(repr(known_name) for known_name in MODEL_NAMES)
        raise ValueError(f"Unknown model {name!r}; known models: {known}.")
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    return _REGISTRY[key](num_classes=num_classes, **options)


# --- Helpers -------------------------------------------------------------------------------------
def count_parameters(model: nn.Module) -> int:
    """Return the number of trainable parameters of ``model``."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def get_arrays(model: nn.Module) -> ArrayRecord:
    """Return the model's ``state_dict`` as a Flower ``ArrayRecord``."""
    return ArrayRecord(model.state_dict())


def set_arrays(model: nn.Module, arrays: ArrayRecord) -> None:
    """Load the weights carried by a Flower ``ArrayRecord`` into ``model``.

    Parameters
    ----------
    model : nn.Module
        Model whose parameters are replaced in place.
    arrays : ArrayRecord
        Record built from a ``state_dict`` of the same architecture. Values are cast to
        the dtype of the model's own tensors (FedAvg turns integer buffers into floats).

    Notes
    -----
    Batch normalisation
        :class:`ResNet56` and :class:`DeapCNN` use batch normalisation (as the originals do);
        its running statistics are buffers of the ``state_dict``, so they travel in the
        ``ArrayRecord`` and FedAvg averages them like the weights. Flower's averaging turns the
        integer ``num_batches_tracked`` buffers into floats; :func:`set_arrays` casts them back
        (``load_state_dict`` copies into the existing buffers).
    """
    model.load_state_dict(arrays.to_torch_state_dict(), strict=True)
