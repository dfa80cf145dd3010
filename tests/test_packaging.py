"""The plugin installs and imports light: Flower, numpy, cryptography, PyNaCl, dp-accounting; never torch or Hydra."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "torchvision", "hydra", "matplotlib", "sklearn", "scipy", "ray")
PLUGIN = ("flmarket_flwr.pricing", "flmarket_flwr.pass_protocol", "flmarket_flwr.market")


def _probe(python: str | Path) -> str:
    code = (
        f"import sys\nfor name in {PLUGIN!r}: __import__(name)\n"
        "from flmarket_flwr.market import FLMarket, MarketPhase, register_market_handlers\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    return subprocess.run(
        [str(python), "-I", "-c", code], check=True, capture_output=True, text=True, env=_clean_env()
    ).stdout.strip()


def _clean_env() -> dict[str, str]:
    """This process's environment without what would let another interpreter see this venv's packages."""
    return {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def test_the_core_requirements_are_flower_numpy_cryptography_pynacl_and_dp_accounting_with_ranges() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    names = sorted(requirement.split(">")[0].split("=")[0].split("[")[0] for requirement in project["dependencies"])
    assert names == ["cryptography", "dp-accounting", "flwr", "numpy", "pynacl"]
    assert not any("==" in requirement for requirement in project["dependencies"])


def test_importing_the_plugin_loads_no_heavy_module() -> None:
    assert _probe(sys.executable) == "[]"


def test_the_core_alone_installs_in_a_fresh_venv_and_imports_without_torch(tmp_path: Path) -> None:
    venv.create(tmp_path / "venv", with_pip=True)
    python = tmp_path / "venv" / "bin" / "python"
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-cache-dir",
            "-c",
            str(ROOT / "constraints.txt"),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_clean_env(),
    )
    missing = subprocess.run(
        [
            str(python),
            "-I",
            "-c",
            "import importlib.util as u; print([m for m in ('torch', 'hydra') if u.find_spec(m)])",
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_clean_env(),
    ).stdout.strip()
    assert missing == "[]"
    assert _probe(python) == "[]"
