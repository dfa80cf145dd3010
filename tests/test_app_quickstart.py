"""The README's drop-in, applied to a faithful copy of Flower's quickstart-pytorch (``tests/quickstart_app``).

The fixture is kept WITHOUT the market: the tests parse the unified diff that README.md shows in
"Adding the market to your own Flower app", check that it adds at most 5 lines, apply exactly that diff
to a copy of the fixture, and run the result under ``flwr run``: the market first (fewer than all
clients win at the budget read from the run config), then FedAvg on the winners only.

One ``flwr run`` with its own ``FLWR_HOME`` and local SuperLink ports; every process it started is
stopped by PID at the end.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import sys
import tomllib
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict
from processes import pids_with_cmdline
from test_app_simulation import LocalFlower, _explain, needs_flower_cli

from simulations.inprocess_grid import InProcessGrid

QUICKSTART = Path(__file__).resolve().parent / "quickstart_app"
PROJECT = QUICKSTART.parents[1]
README = PROJECT / "README.md"
SECTION = "## Adding the market to your own Flower app"
MAX_ADDED_LINES = 5
NUM_SUPERNODES = 5


def readme_diff() -> str:
    """The first ```diff block of the README's drop-in section."""
    text = README.read_text()
    assert SECTION in text, f"README.md has no section {SECTION!r}"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    found = re.search(r"```diff\n(.*?)```", section, flags=re.DOTALL)
    assert found, f"the README section {SECTION!r} shows no ```diff block"
    return found.group(1)


def apply_unified_diff(diff: str, root: Path) -> list[str]:
    """Apply ``diff`` (unified format, ``a/`` and ``b/`` prefixes) under ``root``, exactly.

    Every hunk must match the file at the line it names, context and removed lines included: a README
    diff that no longer fits the fixture fails here instead of being applied approximately.
    Returns the paths patched.
    """
    patched: list[str] = []
    lines = diff.splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].startswith("--- "):
            i += 1
            continue
        target = lines[i + 1]
        assert target.startswith("+++ b/"), f"expected '+++ b/<path>' after {lines[i]!r}, got {target!r}"
        path = root / target[len("+++ b/") :].split("\t")[0]
        content = path.read_text().splitlines()
        i += 2
        offset = 0
        while i < len(lines) and lines[i].startswith("@@"):
            header = re.match(r"@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@", lines[i])
            assert header, f"bad hunk header {lines[i]!r}"
            start = int(header.group(1)) - 1 + offset
            i += 1
            old: list[str] = []
            new: list[str] = []
            while i < len(lines) and lines[i][:1] in (" ", "+", "-", "") and not lines[i].startswith("--- "):
                tag, body = lines[i][:1], lines[i][1:]
                if tag in (" ", ""):
                    old.append(body)
                    new.append(body)
                elif tag == "-":
                    old.append(body)
                else:
                    new.append(body)
                i += 1
            assert content[start : start + len(old)] == old, f"hunk at line {start + 1} does not fit {path.name}"
            content[start : start + len(old)] = new
            offset += len(new) - len(old)
        path.write_text("\n".join(content) + "\n")
        patched.append(str(path.relative_to(root)))
    return patched


def patched_quickstart(root: Path) -> Path:
    """A copy of the pristine fixture with the README's diff applied."""
    app = root / "quickstart-pytorch"
    shutil.copytree(QUICKSTART, app, ignore=shutil.ignore_patterns("__pycache__"))
    apply_unified_diff(readme_diff(), app)
    return app


def test_the_fixture_is_pristine_and_the_readme_diff_is_small_and_exact(tmp_path: Path) -> None:
    sources = [QUICKSTART / "pyproject.toml", *sorted((QUICKSTART / "pytorchexample").glob("*.py"))]
    assert not [path.name for path in sources if "flmarket" in path.read_text() or "budget" in path.read_text()]

    diff = readme_diff()
    added = [line for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert 0 < len(added) <= MAX_ADDED_LINES, added
    app = patched_quickstart(tmp_path)
    for path in (app / "pytorchexample").glob("*.py"):
        compile(path.read_text(), str(path), "exec")
    assert 'budget=context.run_config["budget"]' in (app / "pytorchexample" / "server_app.py").read_text()
    assert re.search(r"^budget = \d", (app / "pyproject.toml").read_text(), flags=re.MULTILINE)


def test_the_patched_quickstart_runs_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The patched ServerApp against the patched ClientApp on an in-process Grid (no Ray): seconds."""
    app = patched_quickstart(tmp_path)
    monkeypatch.syspath_prepend(str(app))
    monkeypatch.chdir(tmp_path)  # the quickstart saves final_model.pt in its working directory
    for name in [m for m in sys.modules if m.split(".")[0] == "pytorchexample"]:
        monkeypatch.delitem(sys.modules, name)
    client_app = importlib.import_module("pytorchexample.client_app")
    server_app = importlib.import_module("pytorchexample.server_app")
    run_config = tomllib.loads((app / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    node_ids = [11, 22, 33, 44, 55]
    grid = InProcessGrid(client_app.app, node_ids, run_config=run_config)
    try:
        server_app.main(grid, Context(1, 0, {}, RecordDict(), run_config))
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] == "pytorchexample"]:
            del sys.modules[name]

    trained = [m.metadata.dst_node_id for m in grid.sent if m.metadata.message_type == "train"]
    winners = set(trained)
    assert len(winners) == 2  # the README's budget selects: "2 of the 5 clients win"
    assert len(trained) == run_config["num-server-rounds"] * len(winners)
    assert (tmp_path / "final_model.pt").is_file()


@needs_flower_cli
def test_the_readme_drop_in_runs_flowers_quickstart_under_flwr_run(tmp_path: Path) -> None:
    app = patched_quickstart(tmp_path)
    flower = LocalFlower(tmp_path)
    # The ServerApp and ClientApps import flmarket_flwr from this checkout, not from an installed copy.
    flower.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT), os.environ.get("PYTHONPATH")]))
    try:
        completed = flower.flwr("--federation-config", f"num-supernodes={NUM_SUPERNODES}", app=app)
    finally:
        flower.stop()
    output = completed.stdout + completed.stderr
    assert not pids_with_cmdline(str(flower.home)), "a SuperLink process survived"
    assert "FLMarket market phase finished" in output, _explain(output)
    market = re.search(r"(\d+) bidders, (\d+) winners", output)
    assert market, _explain(output)
    bidders, winners = int(market.group(1)), int(market.group(2))
    assert bidders == NUM_SUPERNODES and 0 < winners < bidders, _explain(output)
    # FedAvg trains the winners only, in each of the quickstart's 3 rounds.
    trained = [int(n) for n in re.findall(r"aggregate_train: Received (\d+) results", output)]
    assert trained == [winners] * 3, _explain(output)
    assert "Saving final model to disk" in output, _explain(output)
    assert "Traceback" not in output, _explain(output)
