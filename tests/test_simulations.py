"""End-to-end: ``python -m simulations.run`` sweeps through ``flwr.simulation.run_simulation``.

Each test runs the harness in a subprocess (its own Ray instance, shut down when the
process exits) on 4 simulated clients for 1-2 rounds:

* a 2-job Hydra sweep writes every job's results, prints one progress line per job, and
  the baseline's trained clients are exactly its selection;
* one single job (Flower's own Ray start and shutdown, as for every job).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 300

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="the Ray simulation runtime is tested on Linux")


def run_harness(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m simulations.run <args>`` from the project root."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "FLWR_TELEMETRY_ENABLED": "0"}
    completed = subprocess.run(
        [sys.executable, "-m", "simulations.run", *args],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert completed.returncode == 0, (completed.stdout + completed.stderr)[-6000:]
    return completed


TINY = [
    "federation.num_clients=4",
    "num_server_rounds=2",
    "local_epochs=1",
    "distribution=d2",
    "budget=100000.0",  # FLMarket's budget must not bind: the cohort cap, 2 of 4, decides
    "sim.ray_num_cpus=2",
]


def test_tiny_sweep_end_to_end(tmp_path: Path) -> None:
    """Two jobs (FLMarket and QBS, 2 of 4 clients): results, progress, selected-only training."""
    sweep_dir = tmp_path / "sweep"
    completed = run_harness("-m", *TINY, "selector=flmarket,qbs", "num_selected=2", f"hydra.sweep.dir={sweep_dir}")
    progress = [line for line in completed.stderr.splitlines() if line.startswith("[")]
    assert any(line.startswith("[1/2]") for line in progress), completed.stderr[-3000:]
    assert any(line.startswith("[2/2]") for line in progress), completed.stderr[-3000:]
    assert all("acc 0." in line or "acc 1." in line for line in progress if "/2]" in line)

    job_dirs = sorted(path for path in sweep_dir.iterdir() if path.is_dir())
    assert len(job_dirs) == 2
    results = {}
    for job_dir in job_dirs:
        for name in ("result.json", "history.json", "selection.json", "flower.log", "run_config.json"):
            assert (job_dir / name).is_file(), f"{job_dir.name}: {name} missing"
        result = json.loads((job_dir / "result.json").read_text())
        results[result["selector"]] = result
        assert result["num_clients"] == 4 and result["num_selected"] == 2
        assert [r["round"] for r in result["rounds"]] == [0, 1, 2]
        assert 0.0 <= result["final_accuracy"] <= 1.0
        assert len(result["selected_nodes"]) == 2
        assert None not in result["selected_partitions"]
        assert len(result["selected_label_counts"]) == 2
        assert result["selected_class_totals"] == [
            sum(column) for column in zip(*result["selected_label_counts"], strict=True)
        ]
        # Only the selected clients trained, in every round.
        for partitions in result["trained_partitions_per_round"].values():
            assert sorted(partitions) == sorted(result["selected_partitions"])
        assert result["timings"]["job_wall_s"] > result["timings"]["training_s"] > 0
        assert result["run_config"]["results-dir"] == str(job_dir.parent)
    assert set(results) == {"flmarket", "qbs"}
    assert (
        0 < results["flmarket"]["market"]["total_payment"] <= 2 * results["flmarket"]["market"]["budget"]
    )  # 2 winners, each paid at most R
    # QBS picks the two largest clients, as its label counts say.
    sizes = sorted((sum(row) for row in results["qbs"]["all_label_counts"]), reverse=True)
    assert sorted(map(sum, results["qbs"]["selected_label_counts"]), reverse=True) == sizes[:2]


def test_single_job(tmp_path: Path) -> None:
    """One job outside a sweep writes its result where Hydra's run dir says."""
    run_dir = tmp_path / "single"
    run_harness(*TINY, "selector=rs", "num_selected=2", "num_server_rounds=1", f"hydra.run.dir={run_dir}")
    result = json.loads((run_dir / "result.json").read_text())
    assert result["selector"] == "rs" and len(result["selected_nodes"]) == 2
    assert [r["round"] for r in result["rounds"]] == [0, 1]
