"""End-to-end: the FLMarket app's ServerApp and ClientApp together.

``test_app_in_process`` runs ``server_app.main`` against the real ClientApp on an
in-process Grid (no Ray, no SuperLink: seconds), to catch app-level bugs fast.

The other tests run ``flwr run .`` in a local simulation. One local SuperLink
(started by the first ``flwr run``, on free ports, with its own temporary
``FLWR_HOME``) serves two runs over 6 simulated SuperNodes:

* budget mode: the auction picks the winners, the total payment stays within the
  budget, only the winners ever train (checked from the client side through the
  ``train-log-dir`` audit files), and the server-side accuracy rises;
* fixed-cohort mode (``num-selected``): exactly that many winners train.

The SuperLink and every process under it (``flower-superexec``, the simulation
process, Ray) are stopped by PID at the end.
"""

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
import tomllib
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict
from processes import pids_with_cmdline, stop_started

from flmarket_flwr.app import client_app, server_app
from flmarket_flwr.market import MarketError
from simulations.inprocess_grid import InProcessGrid

PROJECT = Path(__file__).resolve().parents[1]
BIN_DIR = Path(sys.executable).parent
FLWR = str(BIN_DIR / "flwr") if (BIN_DIR / "flwr").exists() else (shutil.which("flwr") or "flwr")
NUM_SUPERNODES = 6
RUN_TIMEOUT_S = 300
APP_CONFIG = tomllib.loads((PROJECT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
WAIT_FOR_NODES_S = float(APP_CONFIG["wait-for-nodes-timeout"])
"""The default wait for SuperNodes: a run that fails fast stops well before it."""

needs_flower_cli = pytest.mark.skipif(
    not Path(FLWR).exists() or not Path("/proc").is_dir(),
    reason="needs the flwr CLI and /proc (Linux)",
)


def app_run_config(**overrides: object) -> dict:
    """The app's ``[tool.flwr.app.config]`` with ``overrides`` (``_`` for ``-`` in keys)."""
    with (PROJECT / "pyproject.toml").open("rb") as file:
        config = tomllib.load(file)["tool"]["flwr"]["app"]["config"]
    config.update({key.replace("_", "-"): value for key, value in overrides.items()})
    return config


def test_app_in_process(tmp_path: Path) -> None:
    """ServerApp + ClientApp over an in-process Grid: results written, winners only trained."""
    node_ids = [101, 202, 303, 404, 505, 606]
    run_config = app_run_config(
        distribution="d1",
        budget=2500.0,
        num_server_rounds=2,
        fraction_evaluate=1.0,
        results_dir=str(tmp_path / "results"),
        run_name="inproc",
        train_log_dir=str(tmp_path / "train-log"),
    )
    grid = InProcessGrid(client_app.app, node_ids, run_config=run_config, run_id=7)
    server_app.main(grid, Context(7, 0, {}, RecordDict(), run_config))

    run_dir = tmp_path / "results" / "inproc"
    market = json.loads((run_dir / "market.json").read_text())
    winners = set(market["winners"])
    assert 0 < len(winners) < len(node_ids)
    assert market["total_payment"] <= 2500.0

    def receivers(message_type: str) -> set[int]:
        return {m.metadata.dst_node_id for m in grid.sent if m.metadata.message_type == message_type}

    assert receivers("train") == winners
    assert receivers("evaluate") == winners
    log = [json.loads(p.read_text()) for p in (tmp_path / "train-log" / "run-7").glob("*.json")]
    assert {entry["node_id"] for entry in log} == winners and len(log) == 2 * len(winners)
    history = json.loads((run_dir / "history.json").read_text())
    assert [row["round"] for row in history["rounds"]] == [0, 1, 2]
    assert history["winners"] == market["winners"]
    assert (run_dir / "history.csv").is_file() and (run_dir / "final_model.pt").is_file()


def test_app_with_no_winner_fails_with_the_reason(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A budget nobody can meet: the run fails saying why, keeps the market's record and the traceback in its folder
    (Flower gets the one-line error, not our frames), and no node trains."""
    run_config = app_run_config(budget=1e-6, num_server_rounds=2, results_dir=str(tmp_path), run_name="none")
    grid = InProcessGrid(client_app.app, [11, 22, 33, 44], run_config=run_config)
    with pytest.raises(MarketError, match="no client won the auction") as raised:
        server_app.main(grid, Context(3, 0, {}, RecordDict(), run_config))
    assert raised.value.__cause__ is None and raised.value.__suppress_context__
    assert len(traceback.extract_tb(raised.value.__traceback__)) <= 3  # pytest's call, main, run: none of ours below
    error_log = tmp_path / "none" / "error.log"
    assert "Traceback" in error_log.read_text() and "no client won the auction" in error_log.read_text()
    failed = [line for line in caplog.text.splitlines() if "FLMarket run FAILED: no client won the auction" in line]
    assert failed and failed[-1].endswith(f"(traceback in {error_log})"), failed
    assert not [m for m in grid.sent if m.metadata.message_type in ("train", "evaluate")]
    market = json.loads((tmp_path / "none" / "market.json").read_text())
    assert market["winners"] == [] and len(market["participants"]) == 4
    assert not (tmp_path / "none" / "history.json").exists()
    assert not (tmp_path / "none" / "final_model.pt").exists()
    assert "FLMarket run FAILED: no client won the auction" in caplog.text


# --- Process and port helpers ----------------------------------------------------------------
# --- Fixtures --------------------------------------------------------------------------------
def ports_in_range(count: int, low: int = 19100, high: int = 19199) -> list[int]:
    """``count`` ports in [low, high] that are free on 127.0.0.1 now (the range these tests may use)."""
    found: list[int] = []
    for port in random.Random(os.getpid()).sample(range(low, high + 1), high - low + 1):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        found.append(port)
        if len(found) == count:
            return found
    raise RuntimeError(f"fewer than {count} free ports in {low}-{high}")


class LocalFlower:
    """A private Flower CLI environment: own FLWR_HOME, own local SuperLink ports."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = root / "flwr-home"
        http_port, control_port = ports_in_range(2)
        self.env = {
            **os.environ,
            "FLWR_HOME": str(self.home),
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(http_port),
            "FLWR_LOCAL_CONTROL_API_PORT": str(control_port),
            # The CLI starts `flower-superlink`, which starts `flower-superexec`, by name.
            "PATH": f"{BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}",
        }

    def flwr(self, *args: str, app: Path = PROJECT) -> subprocess.CompletedProcess:
        """Run ``flwr run <app> --stream <args>``."""
        return subprocess.run(
            [FLWR, "run", str(app), "--stream", *args],
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )

    def run(self, name: str, run_config: str, supernodes: int = NUM_SUPERNODES) -> tuple[Path, str]:
        """``flwr run . --stream`` one app run; return its results folder and output."""
        results = self.root / "results"
        train_log = self.root / "train-log" / name
        overrides = f"{run_config} results-dir='{results}' run-name='{name}' train-log-dir='{train_log}'"
        completed = self.flwr("--federation-config", f"num-supernodes={supernodes}", "--run-config", overrides)
        output = completed.stdout + completed.stderr
        assert completed.returncode == 0, output[-5000:]
        return results / name, output

    def last_run_status(self) -> str:
        """``flwr ls``'s status of the latest run (e.g. ``finished:failed``)."""
        completed = subprocess.run(
            [FLWR, "ls", "--format", "json"],
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        runs = json.loads(completed.stdout)["runs"]
        return str(max(runs, key=lambda run: run["pending-at"])["status"])

    def stop(self) -> None:
        """Stop the local SuperLink of this FLWR_HOME, everything under it and every process carrying this
        FLWR_HOME (its SuperExec, a ServerApp), by PID; none may be left."""
        left = stop_started(pids_with_cmdline(str(self.home)), ("FLWR_HOME", str(self.home)))
        assert not left, f"processes of {self.home} survived: {left}"


@pytest.fixture(scope="module")
def flower(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFlower]:
    """A private Flower environment, torn down (by PID) after the module's tests."""
    env = LocalFlower(tmp_path_factory.mktemp("flwr-sim"))
    try:
        yield env
    finally:
        env.stop()
        assert not pids_with_cmdline(str(env.home)), "a SuperLink process survived"


def _train_log(flower: LocalFlower, name: str) -> list[dict]:
    """The audit records written by the ClientApps' train handler."""
    files = sorted((flower.root / "train-log" / name).glob("run-*/train-*.json"))
    return [json.loads(path.read_text()) for path in files]


def _explain(output: str) -> str:
    return "flwr run output (tail):\n" + output[-4000:]


# --- Tests -----------------------------------------------------------------------------------
@needs_flower_cli
def test_budget_mode_only_winners_train(flower: LocalFlower) -> None:
    """Auction winners within budget, then FedAvg over the winners only; accuracy rises."""
    rounds, budget = 4, 2500.0
    run_dir, output = flower.run(
        "budget",
        f"distribution='d1' budget={budget} num-server-rounds={rounds} fraction-evaluate=1.0",
    )
    assert (run_dir / "market.json").is_file(), _explain(output)

    market = json.loads((run_dir / "market.json").read_text())
    winners = {int(node) for node in market["winners"]}
    assert len(market["participants"]) == NUM_SUPERNODES
    assert 0 < len(winners) < NUM_SUPERNODES
    assert market["total_payment"] <= budget
    assert market["budget"] == budget
    for node in winners:
        assert market["payments"][str(node)] >= market["bids"][str(node)]
    assert sum(market["global_counts"]) > 0

    # Client-side audit: only winners trained, every winner in every round.
    log = _train_log(flower, "budget")
    assert {entry["node_id"] for entry in log} == winners
    assert all(entry["won"] is True for entry in log)
    assert sorted((e["node_id"], e["server_round"]) for e in log) == sorted(
        (node, r) for node in winners for r in range(1, rounds + 1)
    )
    assert len({entry["partition_id"] for entry in log}) == len(winners)

    history = json.loads((run_dir / "history.json").read_text())
    accuracies = [row["accuracy"] for row in history["rounds"]]
    assert [row["round"] for row in history["rounds"]] == list(range(rounds + 1))
    assert accuracies[-1] > accuracies[0] + 0.3, accuracies
    assert accuracies[-1] > 0.6, accuracies
    assert history["timings"]["market"]["total"] > 0
    assert all(row["round_time_s"] > 0 for row in history["rounds"][1:])
    csv_lines = (run_dir / "history.csv").read_text().strip().splitlines()
    assert csv_lines[0].startswith("round,accuracy,loss")
    assert len(csv_lines) == rounds + 2
    assert (run_dir / "final_model.pt").is_file()
    # Federated evaluation reached the winners only, without failures.
    assert f"aggregate_evaluate: Received {len(winners)} results and 0 failures" in output
    assert "FLMarket summary" in output
    assert f"FLMarket run succeeded: results in {run_dir}" in output


@needs_flower_cli
def test_fixed_cohort_mode(flower: LocalFlower) -> None:
    """num-selected > 0: exactly that many clients win and train."""
    run_dir, output = flower.run(
        "cohort",
        "num-selected=2 num-server-rounds=1",
    )
    market = json.loads((run_dir / "market.json").read_text())
    assert len(market["winners"]) == 2, _explain(output)
    assert market["num_winners"] == 2
    log = _train_log(flower, "cohort")
    assert {entry["node_id"] for entry in log} == {int(node) for node in market["winners"]}


@needs_flower_cli
def test_too_few_supernodes_fails_fast(flower: LocalFlower) -> None:
    """Flower's default federation (2 SuperNodes) cannot run PASS: the run stops at once, saying how to fix it."""
    started = time.monotonic()
    completed = flower.flwr("--run-config", f"results-dir='{flower.root / 'results'}' run-name='two'")
    elapsed = time.monotonic() - started
    output = completed.stdout + completed.stderr
    assert "FLMarket run FAILED: only 2 node(s) connected" in output, _explain(output)
    assert "num-supernodes=N" in output, _explain(output)
    assert elapsed < WAIT_FOR_NODES_S, elapsed  # stopped at once, not after waiting for nodes that never come
    # Flower 1.41: `flwr run` exits 0 whatever the ServerApp did; `flwr ls` records the failure.
    assert completed.returncode == 0
    assert flower.last_run_status() == "finished:failed"


@needs_flower_cli
def test_bad_config_fails_once_on_the_server(flower: LocalFlower) -> None:
    """distribution='d9': one error on the server, naming the key, before any client is asked anything."""
    started = time.monotonic()
    completed = flower.flwr(
        "--federation-config", f"num-supernodes={NUM_SUPERNODES}", "--run-config", "distribution='d9'"
    )
    elapsed = time.monotonic() - started
    output = completed.stdout + completed.stderr
    assert "FLMarket run FAILED: run-config key distribution='d9'" in output, _explain(output)
    assert output.count("distribution='d9'") <= 3  # the FAILED line and Flower's own report of it
    assert "ClientApp" not in output or "ClientApp raised" not in output
    assert elapsed < WAIT_FOR_NODES_S, elapsed  # refused before the market waits for any node
