"""The prepared GPU run (``benchmarks/gpu_path.sh``) and what it carries (``benchmarks/device_wheels.py``).

* the budget of what travels: the tree's files as git lists them (ignored ones left out), the carried paths counted
  once, the verdict against 64 MiB and the exit status of ``budget``;
* the training proof: the ClientApp's own train line, from a real run of the app's apps in process, read back by
  the parser, and every way the proof must fail (a winner or round missing, another device, no peak CUDA memory);
* the engine's GPU options: ``--device cuda`` without a GPU share is refused, a job records the device it ran on;
* the slim wheel: the dropped folders gone, a ``RECORD`` that matches the files, the published tags, the local
  version, the large members LZMA-compressed, and pip installs it;
* (slow) the script end to end on the CPU, where its CUDA checks read "no GPU".
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict
from processes import pids_with_env
from test_app_simulation import app_run_config

from benchmarks import device_wheels, gpu_path
from flmarket_flwr.app import client_app, server_app
from simulations import engine as engine_module
from simulations.engine import EngineConfig, run_engine
from simulations.inprocess_grid import InProcessGrid

PROJECT = Path(__file__).resolve().parents[1]


# --- What travels ----------------------------------------------------------------------------------------------------
def _git_tree(root: Path) -> None:
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / ".gitignore").write_text("/.whl/\n/ignored.bin\n")
    (root / "tracked.txt").write_bytes(b"t" * 1000)
    subprocess.run(["git", "-C", str(root), "add", ".gitignore", "tracked.txt"], check=True)
    (root / "untracked.txt").write_bytes(b"u" * 300)
    (root / "ignored.bin").write_bytes(b"i" * 5000)
    (root / ".whl").mkdir()
    (root / ".whl" / "a.whl").write_bytes(b"w" * 2000)


def test_the_budget_counts_git_s_files_and_each_carried_path_once(tmp_path: Path) -> None:
    _git_tree(tmp_path)
    gitignore = len((tmp_path / ".gitignore").read_bytes())
    budget = gpu_path.travel_bytes(tmp_path, [Path(".whl")])
    assert budget["tree"] == 1000 + 300 + gitignore  # not the ignored file, not .git
    assert budget["carried"] == {".whl": 2000}
    assert budget["total"] == 1000 + 300 + gitignore + 2000 and budget["within"]
    assert "within the 64 MiB limit" in gpu_path.describe_budget(budget)

    # A copy that arrived without .git: every file there travelled, the carried folder counted once.
    shutil.rmtree(tmp_path / ".git")
    arrived = gpu_path.travel_bytes(tmp_path, [Path(".whl")])
    assert arrived["tree"] == 1000 + 300 + gitignore + 5000 and arrived["total"] == arrived["tree"] + 2000


def test_the_budget_command_fails_over_64_mib(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _git_tree(tmp_path)
    with (tmp_path / ".whl" / "big.whl").open("wb") as big:
        big.truncate(gpu_path.TRAVEL_LIMIT_BYTES)  # sparse: its size, not its blocks, is what travels
    report = tmp_path / "budget.json"
    assert gpu_path.main(["budget", "--root", str(tmp_path), "--carry", ".whl", "--json", str(report)]) == 1
    assert "OVER the 64 MiB limit" in capsys.readouterr().out
    assert json.loads(report.read_text())["within"] is False
    (tmp_path / ".whl" / "big.whl").unlink()
    assert gpu_path.main(["budget", "--root", str(tmp_path), "--carry", ".whl"]) == 0


# --- The training proof ----------------------------------------------------------------------------------------------
def _line(node: int, server_round: int, device: str = "cuda:0 (NVIDIA H200)", peak: str = "31.5 MiB") -> str:
    return (
        f"INFO :      ClientApp node {node} (partition 3), round {server_round}: trained 75 examples on {device} in "
        f"0.41 s, peak CUDA memory {peak}"
    )


def test_the_proof_holds_only_when_every_winner_trained_on_the_gpu_in_every_round() -> None:
    winners, rounds = [11, 22], 2
    lines = [_line(node, r) for node in winners for r in (1, 2)]
    proof = gpu_path.training_proof("\n".join(lines + lines[:1]), winners, rounds, "cuda")  # a repeat counts once
    assert proof["ok"] and proof["logged"] == proof["expected"] == 4
    assert proof["devices"] == ["cuda:0"] and proof["peak_cuda_mib"] == [31.5, 31.5]

    missing = gpu_path.training_proof("\n".join(lines[:-1]), winners, rounds, "cuda")
    assert not missing["ok"] and missing["missing"] == [(22, 2)]
    on_cpu = [*lines[:-1], _line(22, 2, device="cpu", peak="none (CPU)")]
    wrong = gpu_path.training_proof("\n".join(on_cpu), winners, rounds, "cuda")
    assert not wrong["ok"] and wrong["wrong_device"] == ["node 22 round 2 on cpu"]
    no_memory = [*lines[:-1], _line(22, 2, peak="0.0 MiB")]
    assert not gpu_path.training_proof("\n".join(no_memory), winners, rounds, "cuda")["ok"]
    stranger = [*lines, _line(33, 1)]
    assert not gpu_path.training_proof("\n".join(stranger), winners, rounds, "cuda")["ok"]
    assert not gpu_path.training_proof("", [], rounds, "cuda")["ok"]  # no winner proves nothing


def test_the_client_app_logs_the_line_the_proof_reads(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The app's own ServerApp and ClientApp in process: one train line per winner and round, on the CPU here, and
    the audit record names the device and no peak CUDA memory."""
    rounds = 2
    run_config = app_run_config(
        distribution="d1",
        budget=2500.0,
        num_server_rounds=rounds,
        device="cpu",
        results_dir=str(tmp_path / "results"),
        run_name="proof",
        train_log_dir=str(tmp_path / "train-log"),
    )
    grid = InProcessGrid(client_app.app, [101, 202, 303, 404, 505, 606], run_config=run_config, run_id=9)
    with caplog.at_level("INFO", logger="flwr"):
        server_app.main(grid, Context(9, 0, {}, RecordDict(), run_config))
    winners = json.loads((tmp_path / "results" / "proof" / "market.json").read_text())["winners"]
    proof = gpu_path.training_proof(caplog.text, map(int, winners), rounds, "cpu")
    assert proof["ok"], proof
    assert proof["devices"] == ["cpu"] and proof["peak_cuda_mib"] is None
    assert not gpu_path.training_proof(caplog.text, map(int, winners), rounds, "cuda")["ok"]
    records = [json.loads(p.read_text()) for p in (tmp_path / "train-log" / "run-9").glob("*.json")]
    assert len(records) == rounds * len(winners)
    assert {(r["device"], r["peak_cuda_mib"]) for r in records} == {("cpu", None)}


# --- The engine's GPU options ----------------------------------------------------------------------------------------
def test_the_engine_refuses_cuda_without_a_gpu_share(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        engine_module.main(["--out", str(tmp_path), "--device", "cuda"])
    assert "--device cuda needs --job-gpus > 0: Ray hides the GPUs" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        engine_module.main(["--out", str(tmp_path), "--job-gpus", "1.5"])
    assert "--job-gpus must be in [0, 1], got 1.5" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_an_engine_job_records_the_device_it_ran_on() -> None:
    cfg = EngineConfig(dataset="digits", test_per_class=30, distribution="d4", seed=0, num_selected=5, rounds=2)
    before = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    result = run_engine(cfg)
    assert result["engine"]["ran_on"] == {"device": "cpu", "peak_cuda_mib": None}
    assert result["engine"]["reproducibility"]["deterministic_warn_only"] is False  # strict on the CPU
    assert os.environ.get("CUBLAS_WORKSPACE_CONFIG") == before  # set for the job only (deterministic cuBLAS on a GPU)


# --- The slim wheel --------------------------------------------------------------------------------------------------
def _record_rows(archive: zipfile.ZipFile) -> dict[str, tuple[str, str]]:
    (record,) = [name for name in archive.namelist() if name.endswith(".dist-info/RECORD")]
    rows = csv.reader(io.StringIO(archive.read(record).decode()))
    return {row[0]: (row[1], row[2]) for row in rows}


def _toy_wheel(folder: Path) -> Path:
    """A published-looking wheel: a package with a folder to drop and a native program, whose WHEEL file names
    another platform tag than its file name (as Ray's do)."""
    root = folder / "toy-1.0"
    (root / "toy" / "drop").mkdir(parents=True)
    (root / "toy" / "__init__.py").write_text("VALUE = 7\n")
    (root / "toy" / "drop" / "big.py").write_text("x = 1\n" * 1000)
    shutil.copy(shutil.which("true") or "/bin/true", root / "toy" / "native")
    (root / "toy" / "native").chmod(0o755)
    info = root / "toy-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy\nVersion: 1.0\n")
    wheel_file = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: py3-none-linux_x86_64\n\n"
    (info / "WHEEL").write_text(wheel_file)
    subprocess.run([sys.executable, "-m", "wheel", "pack", "-d", str(folder), str(root)], check=True)
    shutil.rmtree(root)
    (built,) = folder.glob("*.whl")
    return built.rename(folder / "toy-1.0-py3-none-manylinux2014_x86_64.whl")


def test_the_slim_wheel_drops_strips_records_and_installs(tmp_path: Path) -> None:
    original = _toy_wheel(tmp_path / "published")
    slim = device_wheels.slim_wheel(
        original, tmp_path / "slim", dropped=["toy/drop"], stripped=["toy/native"], lzma_from=1024
    )
    assert slim.name == "toy-1.0+slim-py3-none-manylinux2014_x86_64.whl"  # the published tags, a local version
    with zipfile.ZipFile(slim) as archive:
        names = archive.namelist()
        assert not [name for name in names if name.startswith("toy/drop")]
        rows = _record_rows(archive)
        files = [name for name in names if not name.endswith("RECORD")]
        assert sorted(rows) == sorted(names)  # every file listed, nothing more
        for name in files:
            data = archive.read(name)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert rows[name] == (f"sha256={digest}", str(len(data))), name
        native = archive.getinfo("toy/native")
        assert native.compress_type == zipfile.ZIP_LZMA and (native.external_attr >> 16) & 0o111
        assert archive.getinfo("toy/__init__.py").compress_type == zipfile.ZIP_DEFLATED
        assert "Tag: py3-none-manylinux2014_x86_64" in archive.read("toy-1.0+slim.dist-info/WHEEL").decode()
    with zipfile.ZipFile(original) as published:
        assert published.getinfo("toy/native").file_size >= native.file_size  # stripped
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target), str(slim)],
        check=True,
    )
    assert (target / "toy" / "__init__.py").read_text() == "VALUE = 7\n"
    assert subprocess.run([str(target / "toy" / "native")], check=False).returncode == 0
    assert not (target / "toy" / "drop").exists()


def test_a_folder_the_wheel_does_not_have_is_an_error(tmp_path: Path) -> None:
    original = _toy_wheel(tmp_path / "published")
    with pytest.raises(FileNotFoundError, match="toy-1.0-py3-none-manylinux2014_x86_64.whl has no folder toy/rllib"):
        device_wheels.slim_wheel(original, tmp_path / "slim", dropped=["toy/rllib"], stripped=[])


def test_every_carried_package_is_pinned_and_a_missing_pin_is_named(tmp_path: Path) -> None:
    pins = device_wheels.pinned_versions(PROJECT / "constraints.txt", device_wheels.CARRIED)
    assert pins["ray"] == "2.55.1" and pins["flwr"] and len(pins) == len(device_wheels.CARRIED)
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("flwr==1.42.0\n")
    with pytest.raises(ValueError, match="pins no version of ray"):
        device_wheels.pinned_versions(constraints, ["flwr", "ray"])


# --- The script end to end, on the CPU ------------------------------------------------------------------------------
def test_gpu_path_runs_end_to_end_on_the_cpu(tmp_path: Path) -> None:
    """Small settings (4 SuperNodes, 2 rounds, 2 engine rounds), no GPU: both arms train on the CPU and say so, the
    three engine jobs finish, and ``$OUT`` holds what a device call can bring back."""
    out = tmp_path / "out"
    out.mkdir()
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _toy_wheel(wheels)  # the install step runs (into SITE), as with the carried wheels
    work = Path(tempfile.mkdtemp(prefix="gp-", dir="/tmp"))  # short: Ray's socket paths live under it
    env = {
        **os.environ,
        "OUT": str(out),
        "PYTHON": sys.executable,
        "WHEELS": str(wheels),
        "SITE": str(tmp_path / "site"),
        "GPU_PATH_WORK": str(work),
        "SUPERNODES": "4",
        "ROUNDS": "2",
        "ENGINE_ROUNDS": "2",
        "PART_TIMEOUT": "900",  # a loaded 2-core machine
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    try:
        completed = subprocess.run(
            ["bash", str(PROJECT / "benchmarks" / "gpu_path.sh")],
            env=env,
            capture_output=True,
            text=True,
            timeout=1200,
            check=False,
        )
        left = [pid for arm in ("gpu", "cpu") for pid in pids_with_env("FLWR_HOME", str(work / f"flwr-{arm}"))]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-6000:]
    assert not left, f"processes of the script survived: {left}"
    assert (tmp_path / "site" / "toy" / "__init__.py").is_file()
    files = sorted(path.name for path in out.iterdir())
    assert files == ["accuracy.png", "engine.log", "main_cpu.log", "main_gpu.log", "results.json", "summary.txt"]
    summary = (out / "summary.txt").read_text()
    assert "GPU checks: no GPU (torch.cuda.is_available() is False)" in summary
    assert "within the 64 MiB limit" in summary and "all checks: ok" in summary
    result = json.loads((out / "results.json").read_text())
    for arm in ("gpu", "cpu"):
        main = result["main"][arm]
        assert main["ok"] and main["proof"]["devices"] == ["cpu"], main
        assert main["proof"]["logged"] == main["winners"] * 2 and len(main["accuracy"]) == 3
        assert main["market"].startswith("Market: ") and result["walls"][f"main_{arm}"]["exit"] == 0
    jobs = result["engine"]["jobs"]
    assert sorted(jobs) == ["dice", "flmarket", "rs"]
    assert {job["device"] for job in jobs.values()} == {"cpu"} and all(len(j["accuracy"]) == 3 for j in jobs.values())
    assert (out / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
