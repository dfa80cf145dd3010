"""End-to-end: the FLMarket app in a real SuperLink / SuperNode deployment on loopback.

Starts ``flower-superlink --insecure`` and three ``flower-supernode --insecure``
processes (each with its own free port and ``--node-config "partition-id=i
num-partitions=3"``), writes a SuperLink connection into a temporary
``FLWR_HOME/config.toml`` and runs ``flwr run <app> <connection> --stream``.
Each of these processes spawns a ``flower-superexec`` child (which spawns the
ServerApp / ClientApp processes): the whole process tree is stopped by PID in a
``finally``, with bounded waits everywhere.
"""

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from processes import free_ports, is_alive, process_tree, stop_pids

PROJECT = Path(__file__).resolve().parents[1]
BIN_DIR = Path(sys.executable).parent
NUM_NODES = 3
STARTUP_TIMEOUT_S = 60
RUN_TIMEOUT_S = 400

pytestmark = pytest.mark.skipif(
    not (BIN_DIR / "flower-superlink").exists() or not Path("/proc").is_dir(),
    reason="needs Flower's executables next to the Python interpreter and /proc (Linux)",
)


# --- Process and port helpers ----------------------------------------------------------------
def stop_process_tree(processes: list[subprocess.Popen], grace_s: float = 10.0) -> None:
    """Stop ``processes`` and all their descendants by PID, then reap the ``Popen`` objects."""
    stop_pids(process_tree([proc.pid for proc in processes]), grace_s)
    for proc in processes:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def wait_for_health(port: int, process: subprocess.Popen, timeout_s: float) -> None:
    """Wait (bounded) until the SuperLink answers on ``/health``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"flower-superlink exited with code {process.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"SuperLink not healthy on port {port} after {timeout_s:g} s")


# --- The deployment --------------------------------------------------------------------------
class Deployment:
    """A SuperLink and ``NUM_NODES`` SuperNodes on loopback, with a private FLWR_HOME."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = root / "flwr-home"
        self.home.mkdir()
        ports = free_ports(NUM_NODES + 1)
        self.superlink_port, self.node_ports = ports[0], ports[1:]
        self.env = {
            **os.environ,
            "FLWR_HOME": str(self.home),
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "PATH": f"{BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        self.processes: list[subprocess.Popen] = []
        (self.home / "config.toml").write_text(
            "[superlink]\n"
            'default = "loopback"\n\n'
            "[superlink.loopback]\n"
            f'address = "127.0.0.1:{self.superlink_port}"\n'
            "insecure = true\n",
            encoding="utf-8",
        )

    def _spawn(self, name: str, command: list[str]) -> subprocess.Popen:
        log_file = (self.root / f"{name}.log").open("wb")
        process = subprocess.Popen(  # pylint: disable=consider-using-with
            command, cwd=self.root, env=self.env, stdout=log_file, stderr=subprocess.STDOUT
        )
        self.processes.append(process)
        return process

    def start(self) -> None:
        """Start the SuperLink, wait for it, then start the SuperNodes."""
        superlink = self._spawn(
            "superlink",
            [
                str(BIN_DIR / "flower-superlink"),
                "--insecure",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.superlink_port),
            ],
        )
        wait_for_health(self.superlink_port, superlink, STARTUP_TIMEOUT_S)
        for partition_id, port in enumerate(self.node_ports):
            self._spawn(
                f"supernode-{partition_id}",
                [
                    str(BIN_DIR / "flower-supernode"),
                    "--insecure",
                    "--superlink",
                    f"127.0.0.1:{self.superlink_port}",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--max-wait-time",
                    str(STARTUP_TIMEOUT_S),
                    "--node-config",
                    f"partition-id={partition_id} num-partitions={NUM_NODES}",
                ],
            )

    def flwr_run(self, run_config: str) -> str:
        """``flwr run <app> loopback --stream``; return the CLI's output."""
        completed = subprocess.run(
            [
                str(BIN_DIR / "flwr"),
                "run",
                str(PROJECT),
                "loopback",
                "--stream",
                "--run-config",
                run_config,
            ],
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
        output = completed.stdout + completed.stderr
        assert completed.returncode == 0, output[-5000:]
        return output

    def logs(self) -> str:
        """Tails of the SuperLink and SuperNode logs (for failure messages)."""
        parts = []
        for path in sorted(self.root.glob("*.log")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-1500:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        """Stop every started process and all its descendants, by PID."""
        stop_process_tree(self.processes)


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    """A running loopback deployment, stopped (by PID) afterwards whatever happens."""
    system = Deployment(tmp_path)
    try:
        system.start()
        yield system
    finally:
        system.stop()
        tree = process_tree([process.pid for process in system.processes])
        survivors = [pid for pid in tree if is_alive(pid)]
        assert not survivors, f"processes survived: {survivors}"


def test_market_then_fedavg_in_deployment(deployment: Deployment) -> None:
    """Three SuperNodes: the market picks winners within budget, only winners train."""
    results, train_log = deployment.root / "results", deployment.root / "train-log"
    budget, rounds = 2000.0, 2
    output = deployment.flwr_run(
        f"distribution='d1' budget={budget} num-server-rounds={rounds} "
        f"wait-for-nodes-timeout=60.0 results-dir='{results}' run-name='deploy' "
        f"train-log-dir='{train_log}'"
    )
    run_dir = results / "deploy"
    assert (run_dir / "market.json").is_file(), output[-4000:] + deployment.logs()

    market = json.loads((run_dir / "market.json").read_text())
    winners = {int(node) for node in market["winners"]}
    assert len(market["participants"]) == NUM_NODES
    assert not market["excluded"] and market["within_budget"]
    assert 0 < len(winners) < NUM_NODES
    assert market["total_payment"] <= budget

    # Only winners trained (checked from the client side), once per round each.
    records = [json.loads(p.read_text()) for p in sorted(train_log.glob("run-*/train-*.json"))]
    assert sorted((r["node_id"], r["server_round"]) for r in records) == sorted(
        (node, r) for node in winners for r in range(1, rounds + 1)
    )
    assert all(record["won"] for record in records)

    history = json.loads((run_dir / "history.json").read_text())
    accuracies = [row["accuracy"] for row in history["rounds"]]
    assert len(accuracies) == rounds + 1
    assert accuracies[-1] > accuracies[0] + 0.2, accuracies
    assert "FLMarket summary" in output
