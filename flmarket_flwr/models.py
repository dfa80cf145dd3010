"""Models used by the FLMarket Flower app.

The default app trains :class:`DigitsCNN`, a small convolutional network for the
8x8 grey-scale images of scikit-learn's bundled ``digits`` data set. It has about
38k parameters and trains in milliseconds per batch on one CPU core.

Model weights travel between the ServerApp and the ClientApps as Flower
``ArrayRecord`` objects: use :func:`get_arrays` / :func:`set_arrays` (thin wrappers
around ``ArrayRecord(model.state_dict())`` and ``ArrayRecord.to_torch_state_dict()``).
"""


import torch
from flwr.app import ArrayRecord
from torch import nn

__all__ = ["DigitsCNN", "build_model", "count_parameters", "get_arrays", "set_arrays"]


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


def build_model(name: str = "digits-cnn", num_classes: int = 10) -> nn.Module:
    """Build a model by name.

    Parameters
    ----------
    name : str (default: "digits-cnn")
        Model name. Only ``"digits-cnn"`` is available in the embedded app.
    num_classes : int (default: 10)
        Number of output classes.

    Returns
    -------
    nn.Module
        A freshly initialised model (uses the global torch RNG: seed it first
        with ``torch.manual_seed`` for reproducible initial weights).
    """
    if name == "digits-cnn":
        return DigitsCNN(num_classes=num_classes)
    raise ValueError(f"Unknown model {name!r}; available: 'digits-cnn'.")


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
        Record built from a ``state_dict`` of the same architecture.
    """
    model.load_state_dict(arrays.to_torch_state_dict(), strict=True)
