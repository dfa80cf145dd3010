"""A one-line-per-job progress display for Hydra sweeps (a Hydra ``Callback``).

Registered in ``conf/config.yaml`` (``hydra.callbacks.progress``). Hydra's basic
launcher runs the jobs one after the other in the sweep's own process, so the callback
sees every job end and prints, to stderr::

    [  12/270] 0:02:31 elapsed, ETA 0:47:10 | distribution=d3 num_selected=10 selector=qbs seed=1 | acc 0.8733 | 8.4 s

The total is the product of the sizes of the sweep overrides on the command line
(``a=1,2 b=x,y,z`` -> 6 jobs), as Hydra's basic sweeper expands them; the ETA is the
mean time per finished job times the jobs left.
"""

from __future__ import annotations

import math
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

__all__ = ["SweepProgress", "count_jobs", "format_line"]


def count_jobs(overrides: list[str]) -> int:
    """Number of jobs Hydra's basic sweeper makes of these command-line overrides."""
    parser = OverridesParser.create()
    total = 1
    for override in parser.parse_overrides(list(overrides)):
        if override.is_sweep_override():
            total *= len(list(override.sweep_string_iterator()))
    return total


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    return str(timedelta(seconds=int(round(seconds))))


def format_line(  # pylint: disable=too-many-arguments
    *,
    index: int,
    total: int,
    elapsed_s: float,
    overrides: str,
    accuracy: float | None,
    job_s: float,
    failed: str | None = None,
) -> str:
    """One progress line (``index`` is 1-based)."""
    done = max(index, 1)
    eta = elapsed_s / done * max(total - index, 0)
    width = len(str(total))
    result = (
        f"FAILED ({failed})"
        if failed
        else ("acc n/a" if accuracy is None or not math.isfinite(accuracy) else f"acc {accuracy:.4f}")
    )
    return (
        f"[{index:>{width}}/{total}] {_duration(elapsed_s)} elapsed, ETA {_duration(eta)} | "
        f"{overrides or '(defaults)'} | {result} | {job_s:.1f} s"
    )


def _sweep_dir(config: DictConfig) -> str:
    """The sweep's output folder (``hydra.sweep.dir``), absolute."""
    folder = OmegaConf.select(config, "hydra.sweep.dir")
    return str(Path(str(folder)).resolve()) if folder else "?"


class SweepProgress(Callback):
    """Print one line per finished job: index/total, elapsed, ETA, final accuracy."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream
        self.total = 1
        self.started = time.perf_counter()
        self.finished = 0
        self._job_started = self.started
        self.sweep_dir = "?"

    def _print(self, line: str) -> None:
        print(line, file=self.stream or sys.stderr, flush=True)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Count the jobs of the sweep and start the clock."""
        self.started = time.perf_counter()
        self.finished = 0
        try:
            self.total = count_jobs(list(OmegaConf.select(config, "hydra.overrides.task") or []))
        except Exception:  # pylint: disable=broad-exception-caught
            self.total = 0
        self.sweep_dir = _sweep_dir(config)
        self._print(f"Sweep of {self.total} job(s) into {self.sweep_dir}; one line per finished job.")

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Say where the results went, and how to report them."""
        folder = _sweep_dir(config)
        self._print(f"Sweep finished: {self.finished} job(s), results in {folder}")
        self._print(f"Report: python -m simulations.report {folder} --out {folder}/report")

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """A single run: start the clock."""
        self.started = time.perf_counter()
        self.total = 1

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Remember when the job started."""
        self._job_started = time.perf_counter()

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        """Print the job's line."""
        self.finished += 1
        now = time.perf_counter()
        failed = None
        accuracy = None
        if job_return.status == JobStatus.COMPLETED:
            value = job_return.return_value
            if isinstance(value, dict):
                accuracy = value.get("final_accuracy")
        else:
            error = job_return._return_value  # pylint: disable=protected-access
            failed = f"{type(error).__name__}: {error}"[:200]
        overrides = " ".join(o for o in (job_return.overrides or []) if not o.startswith("hydra."))
        self._print(
            format_line(
                index=self.finished,
                total=max(self.total, self.finished),
                elapsed_s=now - self.started,
                overrides=overrides,
                accuracy=accuracy,
                job_s=now - self._job_started,
                failed=failed,
            )
        )
