"""The README's drop-in, its environment section followed, on Flower's quickstart data shape, from a fresh
``FLWR_HOME``.

Flower's quickstart-pytorch holds each partition as a plain list of ``{"img": ..., "label": ...}`` dicts behind a
``DataLoader``: the copy of ``tests/quickstart_app`` here is made to hold it that way (its ``DictRows`` listed), the
README's diff is applied to it, and the README's "The plugin in the app's environment" section is followed as
written: the plugin importable where ``flwr`` runs (this checkout: what ``pip install -e`` gives) and the runtime
dependency installation turned off by the section's own ``export``. One ``flwr run`` from a ``FLWR_HOME`` that does
not exist yet; every process it started is stopped by PID.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

from processes import pids_with_cmdline
from test_app_quickstart import NUM_SUPERNODES, PROJECT, README, patched_quickstart
from test_app_simulation import LocalFlower, _explain, needs_flower_cli

SECTION = "### The plugin in the app's environment"
LOADER = "trainloader = DataLoader(DictRows(images[train], labels[train]), batch_size=batch_size, shuffle=True)"


def readme_environment() -> dict[str, str]:
    """The variables the README's environment section exports (its first ```bash block), as written."""
    text = README.read_text()
    assert SECTION in text, f"README.md has no section {SECTION!r}"
    section = text.split(SECTION, 1)[1].split("\n### ", 1)[0]
    block = re.search(r"^```bash\n(.*?)^```", section, flags=re.S | re.M)
    assert block, f"{SECTION!r} shows no bash block"
    exported: dict[str, str] = {}
    for line in block.group(1).splitlines():
        if line.startswith("export "):
            for word in shlex.split(line.split("#", 1)[0])[1:]:
                name, _, value = word.partition("=")
                exported[name] = value
    assert "pip install -e /path/to/flmarket-flwr" in block.group(1)
    return exported


def as_flowers_quickstart(app: Path) -> None:
    """Hold the training partition as Flower's quickstart does: a plain list of dicts behind the DataLoader."""
    task = app / "pytorchexample" / "task.py"
    source = task.read_text()
    assert LOADER in source, "the fixture's train loader changed: update this copy's edit"
    task.write_text(source.replace(LOADER, LOADER.replace("DataLoader(DictRows(", "DataLoader(list(DictRows(", 1)
                                   .replace("labels[train]),", "labels[train])),", 1)))  # fmt: skip


@needs_flower_cli
def test_the_readme_drop_in_runs_from_a_fresh_flwr_home_on_a_list_of_dicts(tmp_path: Path) -> None:
    app = patched_quickstart(tmp_path)
    as_flowers_quickstart(app)
    assert "DataLoader(list(DictRows(" in (app / "pytorchexample" / "task.py").read_text()
    flower = LocalFlower(tmp_path)
    assert not flower.home.exists()  # a fresh FLWR_HOME: Flower makes it on this first run
    del flower.env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"]  # the README's own export sets it
    exported = readme_environment()
    assert exported == {"FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}, exported
    flower.env.update(exported)
    # The plugin where flwr runs: this checkout (`pip install -e` of it in CI's environment; here on the path).
    flower.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT), os.environ.get("PYTHONPATH")]))
    try:
        completed = flower.flwr("--federation-config", f"num-supernodes={NUM_SUPERNODES}", app=app)
    finally:
        flower.stop()
    output = completed.stdout + completed.stderr
    assert not pids_with_cmdline(str(flower.home)), "a SuperLink process survived"
    assert "labels must be integer" not in output and "raised" not in output, _explain(output)
    market = re.search(r"(\d+) bidders, (\d+) winners", output)
    assert market, _explain(output)
    bidders, winners = int(market.group(1)), int(market.group(2))
    assert bidders == NUM_SUPERNODES and 0 < winners < bidders, _explain(output)
    trained = [int(n) for n in re.findall(r"aggregate_train: Received (\d+) results", output)]
    assert trained == [winners] * 3, _explain(output)
    assert "Saving final model to disk" in output and "Traceback" not in output, _explain(output)


def test_the_list_of_dicts_partition_is_counted_in_process(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The same copy's client-side line, without Flower: its label counts are the partition's."""
    import importlib
    import sys

    import numpy as np

    from flmarket_flwr.market import label_counts

    app = patched_quickstart(tmp_path)
    as_flowers_quickstart(app)
    monkeypatch.syspath_prepend(str(app))
    for name in [m for m in sys.modules if m.split(".")[0] == "pytorchexample"]:
        monkeypatch.delitem(sys.modules, name)
    task = importlib.import_module("pytorchexample.task")
    try:
        trainloader = task.load_data(1, NUM_SUPERNODES, 32)[0]
        assert isinstance(trainloader.dataset, list) and isinstance(trainloader.dataset[0], dict)
        expected = np.bincount([row["label"] for row in trainloader.dataset], minlength=10)
        assert label_counts(trainloader, num_classes=10).tolist() == expected.tolist()
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] == "pytorchexample"]:
            del sys.modules[name]
