"""One local SGD step of the sweeps' models on one CPU thread, and the ways tried to make it cheaper.

Run: ``.venv/bin/python -m benchmarks.bench_local_step`` (about 1 min; ``--resnet-steps 0`` skips ResNet-56).

The sweeps' cost is local training: a digits_xl job of ``k`` selected clients runs ``k * 20`` steps a round
for 30 to 100 rounds, so the time of one step (batch 32, SGD with momentum, gradient clipping at 5, exactly
as :func:`flmarket_flwr.app.task.train` does it) sets the sweep's wall time. Side by side, in one process:

* ``digits_cnn`` as the engine runs it (float32, PyTorch's default oneDNN convolutions);
* the same model in ``channels_last`` memory format;
* the same under ``torch.autocast("cpu", bfloat16)`` (AMX/AVX-512-BF16 where the processor has them);
* the same with oneDNN switched off (PyTorch's own convolution kernels);
* ``fmnist_cnn`` on 1x28x28 inputs (``dataset=fashion_mnist``), and beside it the same layers with
  conv + 2x2 max-pooling in place of its strided convolutions (the layout it was chosen over);
* ResNet-56 on 3x32x32 inputs (``dataset=digits_xl_rgb32``), float32 and bfloat16 autocast, and its
  forward pass on 100 images (one S-FedAvg coalition evaluation on a 10-per-class validation split).

Each figure is the median of ``--repeats`` timed blocks after a warm-up; ratios are against the first row.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import time
from collections.abc import Callable, Iterator

import torch
from torch import nn

from flmarket_flwr.app.models import build_model

BATCH = 32
CLIP_NORM = 5.0


@contextlib.contextmanager
def _onednn(enabled: bool) -> Iterator[None]:
    # torch annotates ``mkldnn.enabled`` as its ``ContextProp`` descriptor; the module's class turns it into a
    # bool property at run time, so reads give a bool and assigning a bool is right.
    previous = bool(torch.backends.mkldnn.enabled)
    torch.backends.mkldnn.enabled = enabled  # type: ignore[assignment]  # torch's stub: the descriptor, not the bool
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = previous  # type: ignore[assignment]  # as above


def _step_fn(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor, bf16: bool) -> Callable[[], None]:
    """One training step as ``flmarket_flwr.app.task.train`` takes it (optionally under bfloat16 autocast)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    criterion = nn.CrossEntropyLoss()

    def step() -> None:
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = criterion(model(inputs), labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
        optimizer.step()
        loss.item()

    return step


def _pooled_fashion_cnn() -> nn.Module:
    """``fmnist_cnn``'s maps (16x14x14, 32x7x7) and head, down-sampled by max-pooling instead of strides."""
    return nn.Sequential(
        nn.Conv2d(1, 16, kernel_size=5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 7 * 7, 64),
        nn.ReLU(),
        nn.Linear(64, 10),
    )


def _time(fn: Callable[[], None], calls: int, repeats: int) -> float:
    """Median seconds per call over ``repeats`` blocks of ``calls`` calls, after one untimed block."""
    for _ in range(calls):
        fn()
    blocks = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        blocks.append((time.perf_counter() - started) / calls)
    return statistics.median(blocks)


def main(argv: list[str] | None = None) -> None:
    """Print the step times and their ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="digits_cnn steps per timed block")
    parser.add_argument("--resnet-steps", type=int, default=4, help="ResNet-56 steps per timed block (0: skip)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 10, (BATCH,), generator=generator)
    digits = torch.rand(BATCH, 1, 8, 8, generator=generator)

    def digits_cnn(channels_last: bool = False) -> nn.Module:
        torch.manual_seed(0)
        model = build_model("digits_cnn", num_classes=10)
        return model.to(memory_format=torch.channels_last) if channels_last else model

    rows: list[tuple[str, float]] = []
    rows.append(
        (
            "digits_cnn, float32 (the engine)",
            _time(_step_fn(digits_cnn(), digits, labels, False), args.steps, args.repeats),
        )
    )
    last = digits.to(memory_format=torch.channels_last)
    rows.append(
        ("digits_cnn, channels_last", _time(_step_fn(digits_cnn(True), last, labels, False), args.steps, args.repeats))
    )
    rows.append(
        ("digits_cnn, bfloat16 autocast", _time(_step_fn(digits_cnn(), digits, labels, True), args.steps, args.repeats))
    )
    with _onednn(False):
        rows.append(
            ("digits_cnn, oneDNN off", _time(_step_fn(digits_cnn(), digits, labels, False), args.steps, args.repeats))
        )
    fashion = torch.rand(BATCH, 1, 28, 28, generator=generator)
    torch.manual_seed(0)
    rows.append(
        (
            "fmnist_cnn (1x28x28), float32",
            _time(_step_fn(build_model("fmnist_cnn"), fashion, labels, False), args.steps, args.repeats),
        )
    )
    torch.manual_seed(0)
    rows.append(
        (
            "fmnist_cnn layers with max-pooling instead of strides",
            _time(_step_fn(_pooled_fashion_cnn(), fashion, labels, False), args.steps, args.repeats),
        )
    )
    if args.resnet_steps > 0:
        torch.manual_seed(0)
        resnet = build_model("resnet56", num_classes=10)
        images = torch.rand(BATCH, 3, 32, 32, generator=generator)
        for name, bf16 in (("ResNet-56, float32", False), ("ResNet-56, bfloat16 autocast", True)):
            rows.append((name, _time(_step_fn(resnet, images, labels, bf16), args.resnet_steps, args.repeats)))
        resnet.eval()
        validation = torch.rand(100, 3, 32, 32, generator=generator)

        def forward() -> None:
            with torch.no_grad():
                resnet(validation)

        rows.append(("ResNet-56, forward of 100 images (one coalition value)", _time(forward, 1, args.repeats)))

    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, 1 thread, batch {BATCH}")
    reference = rows[0][1]
    for name, seconds in rows:
        print(f"{name:58s} {1e3 * seconds:9.2f} ms   {seconds / reference:7.2f}x")


if __name__ == "__main__":
    main()
