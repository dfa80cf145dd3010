"""Every committed report with an archive of its runs regenerates byte for byte by the command its documents give:
the command is read from the document, run verbatim in a copy of the report's folder, and every file it writes must
equal the committed one (REPORT.md, the CSVs and the plots)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parent.parent


def _from_archive_on(document: Path, folder: str) -> str:
    """The lines of ``document``'s fenced bash block from the one that extracts ``folder``'s archive to its end."""
    extract = f"tar -xzf results/{folder}/raw.tar.gz"
    for block in re.findall(r"^```bash\n(.*?)^```$", document.read_text(encoding="utf-8"), re.M | re.S):
        if extract in block:
            return block[block.index(extract) :]
    raise AssertionError(f"{document} has no bash block that runs {extract!r}")


def _main_grid_command(folder: str) -> str:
    text = (PROJECT / f"results/{folder}/REPORT.md").read_text(encoding="utf-8")
    found = re.search(r"Regenerate \(after `(tar [^`]+)`\): `(python -m simulations\.main_grid [^`]+)`", text)
    assert found, f"results/{folder}/REPORT.md does not say how to regenerate it"
    return f"{found[1]} && {found[2]}"


COMMANDS = {
    "digits_xl": lambda: _from_archive_on(PROJECT / "results/digits_xl/README.md", "digits_xl"),
    "fashion_mnist": lambda: _from_archive_on(PROJECT / "results/fashion_mnist/REPORT.md", "fashion_mnist"),
    "fashion_mnist_main": lambda: _main_grid_command("fashion_mnist_main"),
    "fashion_mnist_c100": lambda: _main_grid_command("fashion_mnist_c100"),
    "fashion_mnist_budget": lambda: _main_grid_command("fashion_mnist_budget"),
    "fashion_mnist_budget_rule": lambda: _main_grid_command("fashion_mnist_budget_rule"),
    "fashion_mnist_pilot": lambda: _from_archive_on(PROJECT / "simulations/PILOT.md", "fashion_mnist_pilot"),
}


@pytest.mark.parametrize("folder", sorted(COMMANDS))
def test_a_committed_report_regenerates_byte_for_byte_by_its_documented_command(tmp_path: Path, folder: str) -> None:
    committed = PROJECT / "results" / folder
    assert (committed / "raw.tar.gz").is_file()
    sandbox = tmp_path / "results" / folder
    shutil.copytree(committed, sandbox)  # the folder as committed: what the command reads beside raw/ stays there
    before = {p: p.stat().st_mtime_ns for p in sandbox.rglob("*") if p.is_file()}
    command = COMMANDS[folder]()
    environment = {**os.environ, "PYTHONPATH": str(PROJECT), "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", "-c", f'python() {{ "$PYTHON" "$@"; }}\nset -e\n{command}'],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"

    written = sorted(
        p.relative_to(sandbox)
        for p in sandbox.rglob("*")
        if p.is_file() and "raw" not in p.relative_to(sandbox).parts and before.get(p) != p.stat().st_mtime_ns
    )
    assert written, f"{command!r} wrote nothing into results/{folder}"
    for name in written:
        assert (committed / name).is_file(), f"{command!r} writes {name}, which is not committed"
        assert (sandbox / name).read_bytes() == (committed / name).read_bytes(), f"{name} differs from the committed"
