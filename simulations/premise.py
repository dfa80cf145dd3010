"""Premise check for ``digits_xl`` and ``fashion_mnist``: does a small CNN's centralised learning curve
flatten at a few hundred images per class, as on CIFAR-10?

The score's ``phi`` stops rewarding a client's volume of a class at ``alpha`` samples; that only makes
sense where a model gains little from more than a few hundred images per class. For each deformation
strength (a factor on :data:`~flmarket_flwr.app.data.digits_xl.REFERENCE_STRENGTH`), each number of training
images per class and each seed, this trains the digits CNN centrally (``flmarket_flwr.app.task.train``, a
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

``--dataset fashion_mnist`` runs the same check on Fashion-MNIST with ``fmnist_cnn`` (no deformation
strengths: the images are real) and writes ``results/fashion_mnist/premise.csv`` and ``premise.png``;
command and curve: ``results/fashion_mnist/README.md``.
"""

from __future__ import annotations

import argparse
import csv
import math
import time
from functools import lru_cache
from pathlib import Path

import numpy as np

from flmarket_flwr.app.data.digits_xl import REFERENCE_STRENGTH, load_digits_xl
from flmarket_flwr.app.data.registry import load_dataset

__all__ = ["PREMISE_MODELS", "learning_curve_point", "main"]

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"
OUT_DIR = RESULTS_DIR / "digits_xl"

PREMISE_MODELS = {"digits_xl": "digits_cnn", "fashion_mnist": "fmnist_cnn"}
"""The data sets this check runs on, and the model each trains."""

DEFAULT_SIZES = {"digits_xl": [10, 30, 100, 300, 1000, 1488], "fashion_mnist": [10, 30, 100, 300, 1000, 3000, 6000]}
"""Training images per class of each curve, by default (the largest: about all of a class)."""

Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@lru_cache(maxsize=4)
def _arrays(dataset: str, factor: float | None) -> Arrays:
    """Training images and labels, test images and labels (``factor``: digits_xl's strength, else ``None``)."""
    if dataset == "digits_xl":
        if factor is None:
            raise ValueError("digits_xl needs a deformation strength factor")
        data = load_digits_xl(strength=REFERENCE_STRENGTH.scaled(factor))
        return data.train_images, data.train_labels, data.test_images, data.test_labels
    if factor is not None:
        raise ValueError(f"{dataset} has real images: no deformation strength (got {factor})")
    loaded = load_dataset(dataset)
    return loaded.train_images, loaded.train_labels, loaded.test_images, loaded.test_labels


def _subset(labels: np.ndarray, per_class: int, seed: int) -> np.ndarray:
    """``per_class`` random rows of every class (all of a class when it has fewer)."""
    rng = np.random.default_rng([seed, per_class])
    rows = [rng.permutation(np.flatnonzero(labels == c))[:per_class] for c in np.unique(labels)]
    return np.sort(np.concatenate(rows))


def learning_curve_point(  # pylint: disable=too-many-arguments,too-many-positional-arguments
    factor: float | None,
    per_class: int,
    seed: int,
    steps: int,
    lr: float,
    anneal_steps: int,
    dataset: str = "digits_xl",
    clip_norm: float = 0.0,
) -> dict[str, float]:
    """Train the data set's CNN on ``per_class`` images per class; return its test accuracy and loss.

    Parameters
    ----------
    factor : float or None
        ``digits_xl``: deformation strength, a factor on ``REFERENCE_STRENGTH`` (``digits_xl`` uses 0.75);
        ``None`` for ``fashion_mnist``.
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
    dataset : str, default "digits_xl"
        A key of :data:`PREMISE_MODELS`.
    clip_norm : float, default 0.0
        Clip every step's gradient norm at this value (0: none; the sweeps' engine clips at 5).
    """
    import torch  # pylint: disable=import-outside-toplevel

    from flmarket_flwr.app.models import build_model  # pylint: disable=import-outside-toplevel
    from flmarket_flwr.app.task import evaluate, train  # pylint: disable=import-outside-toplevel

    train_images, train_labels, test_images, test_labels = _arrays(dataset, factor)
    rows = _subset(train_labels, per_class, seed)
    x = torch.from_numpy(train_images[rows])
    y = torch.from_numpy(train_labels[rows])
    torch.manual_seed(seed)
    model = build_model(PREMISE_MODELS[dataset], num_classes=10)
    epochs = math.ceil(steps * 32 / len(rows))
    anneal_epochs = math.ceil(anneal_steps * 32 / len(rows))
    device = torch.device("cpu")
    started = time.perf_counter()
    for phase_epochs, phase_lr, phase_seed in ((epochs, lr, seed), (anneal_epochs, lr / 10, seed + 1)):
        # The second phase, at a tenth of the rate: the last iterate of plain SGD is too noisy to read a curve from.
        train(
            model,
            (x, y),
            epochs=phase_epochs,
            lr=phase_lr,
            device=device,
            batch_size=32,
            momentum=0.9,
            seed=phase_seed,
            clip_norm=clip_norm,
        )
    test = (torch.from_numpy(test_images), torch.from_numpy(test_labels))
    loss, accuracy = evaluate(model, test, device)
    return {"train_s": time.perf_counter() - started, "epochs": epochs, "test_loss": loss, "test_accuracy": accuracy}


def _plot(rows: list[dict[str, float]], path: Path, dataset: str) -> None:
    import matplotlib  # pylint: disable=import-outside-toplevel

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    fig, axis = plt.subplots(figsize=(6, 4))
    factors: list[float | None] = [None]
    if "factor" in rows[0]:
        factors = [factor for factor in sorted({row["factor"] for row in rows})]
    for factor in factors:
        curve = [row for row in rows if row.get("factor") == factor]
        sizes = sorted({row["per_class"] for row in curve})
        means = [np.mean([r["test_accuracy"] for r in curve if r["per_class"] == size]) for size in sizes]
        label = PREMISE_MODELS[dataset] if factor is None else f"strength x{factor:g}"
        axis.plot(sizes, means, marker="o", label=label)
    axis.set_xscale("log")
    axis.set_xlabel("training images per class")
    if dataset == "digits_xl":
        axis.set_ylabel("test accuracy (held-out real originals)")
    else:
        axis.set_ylabel("test accuracy (official test set)")
    axis.set_title(f"{dataset}: centralised learning curve of {PREMISE_MODELS[dataset]}")
    axis.grid(True, alpha=0.3)
    axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    """Run the grid of (strength, size, seed) points; write the CSV and the plot."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", choices=sorted(PREMISE_MODELS), default="digits_xl")
    parser.add_argument("--factors", type=float, nargs="+", help="digits_xl only (default: 0.5 0.75 0.9 1.0)")
    parser.add_argument("--sizes", type=int, nargs="+", help="default: DEFAULT_SIZES of the data set")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--anneal-steps", type=int, default=300)
    parser.add_argument("--clip-norm", type=float, default=0.0, help="gradient-norm clipping (0: none)")
    parser.add_argument("--out", type=Path, help="default: results/<dataset>")
    args = parser.parse_args(argv)
    if args.dataset != "digits_xl" and args.factors:
        parser.error("--factors (deformation strengths) apply to digits_xl only")
    import torch  # pylint: disable=import-outside-toplevel

    torch.set_num_threads(1)
    out = args.out or RESULTS_DIR / args.dataset
    out.mkdir(parents=True, exist_ok=True)
    factors = (args.factors or [0.5, 0.75, 0.9, 1.0]) if args.dataset == "digits_xl" else [None]
    rows: list[dict[str, float]] = []
    for factor in factors:
        for size in args.sizes or DEFAULT_SIZES[args.dataset]:
            for seed in args.seeds:
                point = learning_curve_point(
                    factor, size, seed, args.steps, args.lr, args.anneal_steps, args.dataset, args.clip_norm
                )
                strength = {} if factor is None else {"factor": factor}
                rows.append({**strength, "per_class": size, "seed": seed, **point})
                print(
                    f"{args.dataset} {'' if factor is None else f'factor {factor:g} '}per_class {size:5d} "
                    f"seed {seed}: acc {point['test_accuracy']:.4f} ({point['train_s']:.1f} s)",
                    flush=True,
                )
    with (out / "premise.csv").open("w", newline="", encoding="utf-8") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    _plot(rows, out / "premise.png", args.dataset)


if __name__ == "__main__":
    main()
