"""The ``result.json`` record of one experiment job: one shape for the Flower path and the in-process engine.

:func:`simulations.run.summarize` (a Flower run's outputs) and :func:`simulations.engine.run_engine` both
build their record here, so the reports (:mod:`simulations.report`, :mod:`simulations.stats`) read one format.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["IMBALANCED", "PRE_TRAINING_SELECTORS", "SELECTOR_LABELS", "TIMING_KEYS", "cohort", "job_record"]

PRE_TRAINING_SELECTORS = ("flmarket", "rs", "qbs", "dice", "dds")
"""The selectors a record may name that choose clients before training (the paper's comparison)."""
SELECTOR_LABELS = {
    "flmarket": "FLMarket",
    "rs": "RS",
    "qbs": "QBS",
    "dice": "DICE",
    "dds": "DDS",
    "sfedavg": "S-FedAvg",
}
"""How the reports name each selector."""
IMBALANCED = ("d4", "d5", "d6")
"""The distributions the paper singles out (its 81% on D4-D6)."""

TIMING_KEYS = ("job_wall_s", "selection_s", "training_s", "server_app_s", "overhead_s")
"""The timings every record carries, in seconds."""


def cohort(num_selected: int, num_clients: int, records: Iterable[Mapping[str, Any]]) -> str:
    """``"5 of 20"``, or in budget mode (``num_selected == 0``) the sizes the budget selected: ``"6-10 of 20"``."""
    if num_selected > 0:
        return f"{num_selected} of {num_clients}"
    sizes = sorted({len(r["selected_nodes"]) for r in records if r.get("selected_nodes") is not None})
    if not sizes:
        return f"budget-selected of {num_clients}"
    size = str(sizes[0]) if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}"
    return f"{size} of {num_clients} (by budget)"


# pylint: disable=too-many-arguments
def job_record(
    *,
    run_config: Mapping[str, Any],
    identity: Mapping[str, Any],
    rounds: Sequence[Mapping[str, Any]],
    final_accuracy: float,
    best_accuracy: float,
    selected_nodes: Sequence[int],
    selected_partitions: Sequence[int | None],
    label_counts: np.ndarray,
    trained_per_round: Mapping[int, Iterable[int]],
    timings: Mapping[str, float],
) -> dict[str, Any]:
    """One job's record.

    Parameters
    ----------
    run_config : Mapping[str, Any]
        The app's run config the job ran with (or the engine's config).
    identity : Mapping[str, Any]
        ``selector``, ``dataset``, ``model``, ``distribution``, ``num_clients``, ``num_selected``, ``seed``.
    rounds : sequence of mappings
        Per round: ``round``, ``accuracy``, ``loss`` and what else the runner measured.
    final_accuracy, best_accuracy : float
        The job's final accuracy (its protocol's definition) and the best round's.
    selected_nodes, selected_partitions : sequences
        The selected clients as node ids and as partition ids (``None`` where unknown).
    label_counts : numpy.ndarray
        ``(E, C)`` label counts of every partition.
    trained_per_round : Mapping[int, Iterable[int]]
        Partition ids trained in each round.
    timings : Mapping[str, float]
        Exactly :data:`TIMING_KEYS`.

    Returns
    -------
    dict
        JSON-ready.
    """
    if set(timings) != set(TIMING_KEYS):
        raise ValueError(f"timings must be exactly {TIMING_KEYS}, got {sorted(timings)}")
    counts = np.asarray(label_counts)
    selected_counts = [counts[p].tolist() if p is not None else None for p in selected_partitions]
    known = [c for c in selected_counts if c is not None]
    return {
        **{key: identity[key] for key in ("selector", "dataset", "model", "distribution")},
        **{key: int(identity[key]) for key in ("num_clients", "num_selected", "seed")},
        "final_accuracy": float(final_accuracy),
        "best_accuracy": float(best_accuracy),
        "final_loss": float(rounds[-1]["loss"]) if rounds else float("nan"),
        "rounds": [dict(r) for r in rounds],
        "selected_nodes": [int(n) for n in selected_nodes],
        "selected_partitions": list(selected_partitions),
        "selected_label_counts": selected_counts,
        "selected_class_totals": np.sum(known, axis=0).astype(int).tolist() if known else None,
        "pool_class_totals": counts.sum(axis=0).astype(int).tolist(),
        "all_label_counts": counts.tolist(),
        "trained_partitions_per_round": {str(r): sorted(p) for r, p in sorted(trained_per_round.items())},
        "timings": {key: float(timings[key]) for key in TIMING_KEYS},
        "run_config": dict(run_config),
    }
