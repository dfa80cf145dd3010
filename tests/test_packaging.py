"""What a Flower user installs: a light plugin (Flower, numpy, cryptography, PyNaCl, dp-accounting; never torch or
Hydra), a wheel with its licence and type information and without the example app, and a FAB (``flwr build``) that
holds the app (and the plugin it imports) only."""

from __future__ import annotations

import functools
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest
from flwr.cli.build import build_fab_from_files

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "torchvision", "hydra", "matplotlib", "sklearn", "scipy", "ray")
PLUGIN = ("flmarket_flwr.pricing", "flmarket_flwr.pass_protocol", "flmarket_flwr.market")
NOT_THE_APP = ("benchmarks", "simulations", "results", "conf", "tests", "docs")
APACHE_2_0_SHA256 = (
    "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"  # apache.org/licenses/LICENSE-2.0.txt
)


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


# --- Licence, wheel and FAB ----------------------------------------------------------------------------------------
def test_the_licence_is_apache_2_0_verbatim_and_the_metadata_names_it() -> None:
    assert hashlib.sha256((ROOT / "LICENSE").read_bytes()).hexdigest() == APACHE_2_0_SHA256
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert (project["license"], project["license-files"]) == ("Apache-2.0", ["LICENSE"])
    assert "Typing :: Typed" in project["classifiers"]
    assert not [c for c in project["classifiers"] if c.startswith("License ::")]  # PEP 639: the expression only
    assert (ROOT / "flmarket_flwr" / "py.typed").is_file()


def test_the_wheel_carries_the_licence_py_typed_and_the_metadata(tmp_path: Path) -> None:
    source = tmp_path / "src"  # a copy: setuptools leaves build/ and *.egg-info in the tree it builds
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", *NOT_THE_APP))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(tmp_path / "dist"), "."],
        check=True,
        capture_output=True,
        text=True,
        cwd=source,
        env=_clean_env(),
    )
    (wheel,) = (tmp_path / "dist").glob("flmarket_flwr-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (licence,) = [name for name in names if name.endswith(".dist-info/licenses/LICENSE")]
        assert hashlib.sha256(archive.read(licence)).hexdigest() == APACHE_2_0_SHA256
        (metadata,) = [name for name in names if name.endswith(".dist-info/METADATA")]
        fields = archive.read(metadata).decode().split("\n\n", 1)[0].splitlines()
    assert "flmarket_flwr/py.typed" in names
    assert {name.split("/")[0] for name in names if ".dist-info/" not in name} == {"flmarket_flwr"}  # no experiments
    modules = {name for name in names if name.endswith(".py")}
    assert {name.split("/")[1] for name in modules} == {"__init__.py", "nodes.py", *(p.split(".")[1] for p in PLUGIN)}
    assert not [name for name in names if name.startswith("flmarket_flwr/app/")]  # the example app is the FAB's
    assert "License-Expression: Apache-2.0" in fields and "Classifier: Typing :: Typed" in fields
    assert any(field.startswith("Project-URL: Paper, ") for field in fields)


@functools.cache
def _fab_names() -> tuple[str, ...]:
    """The files of the FAB that ``flwr build`` makes of this project, built in-process by Flower's own function.

    The tree is collected as ``flwr build`` collects it, less ``.venv`` and ``.git`` (which its publish rules drop:
    walking them only costs seconds); Flower then applies ``.gitignore`` and ``[tool.flwr.app]``'s patterns.
    """
    files: dict[str, bytes | Path] = {}
    for folder, subfolders, filenames in os.walk(ROOT):
        subfolders[:] = [name for name in subfolders if name not in (".venv", ".git")]
        for filename in filenames:
            path = Path(folder) / filename
            files[path.relative_to(ROOT).as_posix()] = path
    fab, _ = build_fab_from_files(files)
    return tuple(zipfile.ZipFile(io.BytesIO(fab)).namelist())


@pytest.mark.filterwarnings("ignore:GitWildMatchPattern:DeprecationWarning")  # Flower's use of pathspec
def test_the_fab_packs_the_app_its_readme_and_licence_and_nothing_else() -> None:
    names = set(_fab_names())
    package = {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "flmarket_flwr").rglob("*.py")
        if "__pycache__" not in path.parts
    }
    assert {name for name in names if name.startswith("flmarket_flwr/")} == package  # every module the app imports
    assert names - package == {"pyproject.toml", "README.md", "LICENSE", ".info/CONTENT"}
    assert not [name for name in names if name.split("/")[0] in NOT_THE_APP]
