"""Premise check for ``digits_xl``: does the digits CNN's centralised learning curve flatten at a few
hundred images per class, as on CIFAR-10?

The score's ``phi`` stops rewarding a client's volume of a class at ``alpha`` samples; that only makes
sense where a model gains little from more than a few hundred images per class. For each deformation
strength (a factor on :data:`~flmarket_flwr.data.digits_xl.REFERENCE_STRENGTH`), each number of training
images per class and each seed, this trains the digits CNN centrally (``flmarket_flwr.task.train``, a
fixed budget of SGD steps, then a short phase at a tenth of the rate) and evaluates it on the held-out real
originals. Writes
``results/digits_xl/premise.csv`` and ``premise.png``::

    python -m simulations.premise --factors 0.5 0.75 0.9 1.0 --sizes 10 30 100 300 1000 1488 --seeds 0 1

Chosen strength: 0.75 of the reference (rotation 9 deg, scale 9%, shear 0.11, shift 0.6 px, elastic
amplitude 0.75 px at sigma 1 px, noise 0.0375). There the mean test accuracy over two seeds rises from
0.75 (10 per class) to 0.89 (100) and 0.96 (300), then stays flat (0.97 at 1,000 and 1,488): the curve
flattens at a few hundred per class, as on CIFAR-10. At 0.5 it is flat from 100 per class on (the copies
add little over their originals); at 0.9 and 1.0 it flattens later and lower (from 300 to 1,000 per class:
+1.4 and +3.3 points; 0.96 and 0.95 at 1,488): the copies drift away from the real test digits. Measured
curves: ``results/digits_xl/README.md``.
"""

from __future__ import annotations

import argparse
import csv
import math
import time
from pathlib import Path

import numpy as np

from flmarket_flwr.data.digits_xl import REFERENCE_STRENGTH, load_digits_xl

__all__ = ["learning_curve_point", "main"]

OUT_DIR = Path(__file__).resolve().parents[1] / "results" / "digits_xl"


def _subset(labels: np.ndarray, per_class: int, seed: int) -> np.ndarray:
    """``per_class`` random rows of every class (all of a class when it has fewer)."""
    rng = np.random.default_rng([seed, per_class])
    rows = [rng.permutation(np.flatnonzero(labels == c))[:per_class] for c in np.unique(labels)]
    return np.sort(np.concatenate(rows))


def learning_curve_point(  # pylint: disable=too-many-arguments,too-many-positional-arguments
    factor: float, per_class: int, seed: int, steps: int, lr: float, anneal_steps: int
) -> dict[str, float]:
    """Train the digits CNN on ``per_class`` images per class; return its test accuracy and loss.

    Parameters
    ----------
    factor : float
        Deformation strength, a factor on ``REFERENCE_STRENGTH`` (``digits_xl`` uses 0.75).
    per_class : int
        Training images per class.
    seed : int
        Seed of the subset, the initial model and the mini-batch order.
    steps : int
        SGD steps (batch 32): at least this many, rounded up to whole epochs.
    lr : float
        Learning rate (momentum 0.9).
    anneal_steps : int
        Further steps at ``lr / 10`` (rounded up to whole epochs).
    """
    import torch  # pylint: disable=import-outside-toplevel

    from flmarket_flwr.models import build_model  # pylint: disable=import-outside-toplevel
    from flmarket_flwr.task import evaluate, train  # pylint: disable=import-outside-toplevel

    data = load_digits_xl(strength=REFERENCE_STRENGTH.scaled(factor))
    rows = _subset(data.train_labels, per_class, seed)
    x = torch.from_numpy(data.train_images[rows])
    y = torch.from_numpy(data.train_labels[rows])
    torch.manual_seed(seed)
    model = build_model("digits_cnn", num_classes=10)
    epochs = math.ceil(steps * 32 / len(rows))
    anneal_epochs = math.ceil(anneal_steps * 32 / len(rows))
    device = torch.device("cpu")
    started = time.perf_counter()
    train(model, (x, y), epochs=epochs, lr=lr, device=device, batch_size=32, momentum=0.9, seed=seed)
    # A short phase at a tenth of the rate: the last iterate of plain SGD is too noisy to read a curve from.
    train(model, (x, y), epochs=anneal_epochs, lr=lr / 10, device=device, batch_size=32, momentum=0.9, seed=seed + 1)
    test = (torch.from_numpy(data.test_images), torch.from_numpy(data.test_labels))
    loss, accuracy = evaluate(model, test, device)
    return {"train_s": time.perf_counter() - started, "epochs": epochs, "test_loss": loss, "test_accuracy": accuracy}


def _plot(rows: list[dict[str, float]], path: Path) -> None:
    import matplotlib  # pylint: disable=import-outside-toplevel

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    fig, axis = plt.subplots(figsize=(6, 4))
    for factor in sorted({row["factor"] for row in rows}):
        sizes = sorted({row["per_class"] for row in rows if row["factor"] == factor})
        means = [
            np.mean([r["test_accuracy"] for r in rows if r["factor"] == factor and r["per_class"] == size])
            for size in sizes
        ]
        axis.plot(sizes, means, marker="o", label=f"strength x{factor:g}")
    axis.set_xscale("log")
    axis.set_xlabel("training images per class")
    axis.set_ylabel("test accuracy (held-out real originals)")
    axis.set_title("digits_xl: centralised learning curve of the digits CNN")
    axis.grid(True, alpha=0.3)
    axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    """Run the grid of (strength, size, seed) points; write the CSV and the plot."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--factors", type=float, nargs="+", default=[0.5, 0.75, 0.9, 1.0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 30, 100, 300, 1000, 1488])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--anneal-steps", type=int, default=300)
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    import torch  # pylint: disable=import-outside-toplevel

    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, float]] = []
    for factor in args.factors:
        for size in args.sizes:
            for seed in args.seeds:
                point = learning_curve_point(factor, size, seed, args.steps, args.lr, args.anneal_steps)
                rows.append({"factor": factor, "per_class": size, "seed": seed, **point})
                print(
                    f"factor {factor:g} per_class {size:5d} seed {seed}: acc {point['test_accuracy']:.4f} "
                    f"({point['train_s']:.1f} s)",
                    flush=True,
                )
    with (args.out / "premise.csv").open("w", newline="", encoding="utf-8") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    _plot(rows, args.out / "premise.png")


if __name__ == "__main__":
    main()
