"""Past one machine: the simulation on an existing Ray cluster (``RAY_ADDRESS``), and what goes with it.

* ``flwr run`` with ``RAY_ADDRESS`` set runs the ClientApps on a Ray head started here on loopback
  (its own temporary folder and ports; stopped by PID, never with a global ``ray stop``);
* ``sim.ray_num_cpus`` beside ``RAY_ADDRESS`` is refused before any Ray starts, with the fix;
* a Hydra sweep prints the folder its results go to.
"""

from __future__ import annotations

import io
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from processes import free_ports, pids_with_cmdline, process_tree, stop_pids
from test_app_simulation import BIN_DIR, LocalFlower, _explain, needs_flower_cli

from simulations.progress import SweepProgress
from simulations.run import _backend_config

RAY = BIN_DIR / "ray"


def sim_config(**overrides: object) -> object:
    values = {"client_num_cpus": 1, "client_num_gpus": 0.0, "ray_num_cpus": None, "verbose": False}
    return OmegaConf.create({**values, **overrides})


def test_ray_num_cpus_beside_ray_address_is_refused_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6390")
    with pytest.raises(ValueError, match=r"sim.ray_num_cpus=4 cannot apply: RAY_ADDRESS=127.0.0.1:6390") as raised:
        _backend_config(sim_config(ray_num_cpus=4))  # type: ignore[arg-type]
    assert "ray start --num-cpus=N" in str(raised.value) and "sim.ray_num_cpus=null" in str(raised.value)
    assert "num_cpus" not in _backend_config(sim_config())["init_args"]  # type: ignore[arg-type]

    monkeypatch.delenv("RAY_ADDRESS")
    assert _backend_config(sim_config(ray_num_cpus=4))["init_args"]["num_cpus"] == 4  # type: ignore[arg-type]


def test_a_sweep_prints_its_output_folder(tmp_path: Path) -> None:
    stream = io.StringIO()
    progress = SweepProgress(stream=stream)
    config = OmegaConf.create(
        {"hydra": {"sweep": {"dir": str(tmp_path / "multirun")}, "overrides": {"task": ["seed=0,1", "selector=rs"]}}}
    )
    progress.on_multirun_start(config)
    progress.on_multirun_end(config)
    lines = stream.getvalue().splitlines()
    folder = tmp_path / "multirun"
    assert lines[0] == f"Sweep of 2 job(s) into {folder}; one line per finished job."
    assert lines[1] == f"Sweep finished: 0 job(s), results in {folder}"
    assert lines[2] == f"Report: python -m simulations.report {folder} --out {folder}/report"


@pytest.fixture()
def ray_head() -> Iterator[tuple[str, Path]]:
    """A Ray head on loopback with 2 CPUs, its own temporary folder and free ports; stopped by PID."""
    # Ray's socket paths must stay short (AF_UNIX limit): a folder directly under the system temp.
    folder = Path(tempfile.mkdtemp(prefix="flm-ray-"))
    gcs, client, agent = free_ports(3)
    command = [
        str(RAY),
        "start",
        "--head",
        f"--port={gcs}",
        "--num-cpus=2",
        "--include-dashboard=false",
        "--node-ip-address=127.0.0.1",
        f"--ray-client-server-port={client}",
        f"--dashboard-agent-listen-port={agent}",
        f"--temp-dir={folder}",
        "--disable-usage-stats",
    ]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    started = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120, check=False)
    try:
        assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
        yield f"127.0.0.1:{gcs}", folder
    finally:
        stop_pids(process_tree(pids_with_cmdline(str(folder))))
        deadline = time.monotonic() + 10
        while pids_with_cmdline(str(folder)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not pids_with_cmdline(str(folder)), "a process of the test's Ray head survived"


@needs_flower_cli
@pytest.mark.skipif(not RAY.exists(), reason="needs the ray CLI of flwr[simulation] beside the Python running pytest")
def test_flwr_run_on_an_existing_ray_cluster(tmp_path: Path, ray_head: tuple[str, Path]) -> None:
    address, ray_folder = ray_head
    flower = LocalFlower(tmp_path)
    flower.env["RAY_ADDRESS"] = address  # before the local SuperLink starts: its simulation inherits it
    try:
        run_dir, output = flower.run(
            "on-cluster", "distribution='d1' budget=2500.0 num-server-rounds=1 local-epochs=1", supernodes=4
        )
    finally:
        flower.stop()
    assert not pids_with_cmdline(str(flower.home)), "a SuperLink process survived"
    assert (run_dir / "market.json").is_file() and (run_dir / "history.json").is_file(), _explain(output)
    # The ClientApps ran as actors of the test's head: their workers logged under its session folder.
    logs = list((ray_folder / "session_latest" / "logs").glob("*"))
    assert any("ClientAppActor" in path.read_text(errors="replace") for path in logs if path.is_file()), _explain(
        output
    )


@pytest.mark.parametrize(
    ("preset", "target"),
    [
        ("submitit_slurm", "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"),
        ("ray", "hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher"),
    ],
)
def test_launcher_presets_compose_with_the_experiment_config(preset: str, target: str) -> None:
    from hydra import compose, initialize_config_dir

    conf = Path(__file__).resolve().parents[1] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose("config", overrides=[f"hydra/launcher={preset}"], return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher["_target_"] == target
    if preset == "submitit_slurm":
        assert launcher.cpus_per_task == 8 and launcher.nodes == 1 and launcher.partition is None
        assert str(launcher.submitit_folder).endswith("/.submitit/%j")
    else:
        assert set(launcher.ray) == {"init", "remote"} and launcher.ray.remote.num_cpus == 2
