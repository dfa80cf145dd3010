"""docs/drop-in.md's diffs, applied to copies of three more of Flower's examples, one per kind of app.

``tests/advanced_app`` (advanced-pytorch: a custom strategy with methods of its own), ``tests/sklearn_app``
(quickstart-sklearn: a numpy app) and ``tests/dpsa_app`` (fl-dp-sa: a legacy ``client_fn`` app with ``secaggplus_mod``
and ``fixedclipping_mod``, a legacy DP strategy under ``DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(...))``) are
kept WITHOUT the market. Each test applies its example's diff exactly (every hunk must fit), counts its lines against
the target (at most 5 added, at most 1 of them replacing a line), and runs the result: in process on an
:class:`~simulations.inprocess_grid.InProcessGrid` (seconds), and under ``flwr run`` with 10 SuperNodes (slow).
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import sys
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict
from processes import pids_with_cmdline
from test_app_quickstart import apply_unified_diff
from test_app_simulation import LocalFlower, _explain, needs_flower_cli

from simulations.inprocess_grid import InProcessGrid

TESTS = Path(__file__).resolve().parent
PROJECT = TESTS.parent
DOC = PROJECT / "docs" / "drop-in.md"
MAX_ADDED_LINES = 5
MAX_CHANGED_LINES = 1
NUM_SUPERNODES = 10
ROUNDS = 3


@dataclass(frozen=True)
class Example:
    """One of Flower's examples: its copy under tests/, its package, and its section of docs/drop-in.md."""

    folder: str
    package: str
    heading: str
    winners: int

    @property
    def fixture(self) -> Path:
        return TESTS / self.folder


ADVANCED = Example("advanced_app", "pytorch_example", "## A custom strategy with methods of its own", 4)
SKLEARN = Example("sklearn_app", "sklearnexample", "## A numpy app", 4)
DPSA = Example("dpsa_app", "fl_dp_sa", "## A legacy app with SecAgg+ and central DP", 4)
EXAMPLES = (ADVANCED, SKLEARN, DPSA)


def doc_diff(example: Example) -> str:
    """The ```diff block of ``example``'s section of docs/drop-in.md."""
    text = DOC.read_text()
    assert example.heading in text, f"docs/drop-in.md has no section {example.heading!r}"
    section = text.split(example.heading, 1)[1].split("\n## ", 1)[0]
    found = re.search(r"```diff\n(.*?)```", section, flags=re.DOTALL)
    assert found, f"the section {example.heading!r} shows no ```diff block"
    return found.group(1)


def patched(example: Example, root: Path) -> Path:
    """A copy of the pristine example with its diff applied."""
    app = root / example.folder
    shutil.copytree(example.fixture, app, ignore=shutil.ignore_patterns("__pycache__"))
    apply_unified_diff(doc_diff(example), app)
    return app


def run_config_of(app: Path) -> dict:
    return dict(tomllib.loads((app / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"])


@pytest.fixture
def in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Example], InProcessGrid]]:
    """Import a patched example's apps and run its ServerApp against its ClientApp on 10 in-process nodes."""
    monkeypatch.chdir(tmp_path)  # the examples save models and results in their working directory
    loaded: list[str] = []

    def run(example: Example) -> InProcessGrid:
        app = patched(example, tmp_path / "apps")
        monkeypatch.syspath_prepend(str(app))
        loaded.append(example.package)
        client_app = importlib.import_module(f"{example.package}.client_app")
        server_app = importlib.import_module(f"{example.package}.server_app")
        run_config = run_config_of(app)
        nodes = [1000 + 7 * i for i in range(NUM_SUPERNODES)]
        configs = {node: {"partition-id": i, "num-partitions": NUM_SUPERNODES} for i, node in enumerate(nodes)}
        grid = InProcessGrid(client_app.app, nodes, node_configs=configs, run_config=run_config)
        server_app.main(grid, Context(1, 0, {}, RecordDict(), run_config))
        return grid

    yield run
    for name in [m for m in sys.modules if m.split(".")[0] in loaded]:
        del sys.modules[name]


# --- The diffs ---------------------------------------------------------------------------------
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.folder)
def test_the_fixture_is_pristine_and_its_diff_fits_the_target(example: Example, tmp_path: Path) -> None:
    sources = [example.fixture / "pyproject.toml", *sorted((example.fixture / example.package).glob("*.py"))]
    assert not [p.name for p in sources if "flmarket" in p.read_text() or "budget" in p.read_text()]

    lines = doc_diff(example).splitlines()
    added = [line for line in lines if line.startswith("+") and not line.startswith("+++")]
    removed = [line for line in lines if line.startswith("-") and not line.startswith("---")]
    assert 0 < len(added) <= MAX_ADDED_LINES, added
    assert len(removed) <= MAX_CHANGED_LINES, removed
    app = patched(example, tmp_path)
    for path in (app / example.package).glob("*.py"):
        compile(path.read_text(), str(path), "exec")
    assert re.search(r"^budget = \d", (app / "pyproject.toml").read_text(), flags=re.MULTILINE)


# --- In process: seconds ---------------------------------------------------------------------------
def test_a_custom_strategy_keeps_its_own_methods_and_start_on_the_winners(
    in_process: Callable[[Example], InProcessGrid], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    grid = in_process(ADVANCED)

    train = [m for m in grid.sent if m.metadata.message_type == "train"]
    winners = {m.metadata.dst_node_id for m in train}
    assert len(winners) == ADVANCED.winners and len(train) == ROUNDS * len(winners)
    evaluated = {m.metadata.dst_node_id for m in grid.sent if m.metadata.message_type == "evaluate"}
    assert evaluated and evaluated <= winners
    # CustomFedAvg's own configure_train halves the learning rate at round 2 (in the one train config, in place).
    assert [float(m.content["config"]["lr"]) for m in train] == [0.05] * len(train)
    assert caplog.text.count("Adjusted learning rate to 0.050000") == 1
    # set_save_path_and_run_dir, called on the FLMarket, reached CustomFedAvg: its own start saved there.
    (run_dir,) = [path.parent for path in tmp_path.glob("outputs/*/*/run_config.json")]
    assert [entry["round"] for entry in json.loads((run_dir / "results.json").read_text())] == [1, 2, 3]
    assert list(run_dir.glob("model_state_acc_*_round_1.pth"))
    assert (tmp_path / "final_model.pt").is_file()


def test_a_numpy_app_passes_its_label_array(in_process: Callable[[Example], InProcessGrid], tmp_path: Path) -> None:
    grid = in_process(SKLEARN)

    train = [m for m in grid.sent if m.metadata.message_type == "train"]
    winners = {m.metadata.dst_node_id for m in train}
    assert len(winners) == SKLEARN.winners and len(train) == ROUNDS * len(winners)
    assert (tmp_path / "logreg_model.pkl").is_file()


def test_a_legacy_app_runs_secagg_plus_and_central_dp_on_the_winners(
    in_process: Callable[[Example], InProcessGrid], caplog: pytest.LogCaptureFixture
) -> None:
    grid = in_process(DPSA)
    log = caplog.text

    market = [m for m in grid.sent if m.metadata.message_type.startswith("query.market_")]
    assert {m.metadata.dst_node_id for m in market} == set(grid.node_ids)  # the mod answered every node
    train = [m for m in grid.sent if m.metadata.message_type == "train"]
    winners = {m.metadata.dst_node_id for m in train}
    assert len(winners) == DPSA.winners
    # SecAgg+ runs on the winners only: each round's stages go to the winners, and nothing else is trained.
    stages = [m for m in train if "secaggplus_configs" in m.content.config_records]
    assert len(stages) == len(train) and len(train) % (ROUNDS * len(winners)) == 0
    assert log.count("Secure aggregation completed") == ROUNDS
    assert log.count(f"aggregate_fit: received {len(winners)} results and 0 failures") == ROUNDS
    assert log.count("central DP noise with") == ROUNDS  # the DP wrapper's noise, sized for the 4 winners
    assert "differs from the number of sampled clients" not in log and "num_sampled_clients=" not in log


# --- Under flwr run: slow ------------------------------------------------------------------------
def flwr_run(example: Example, tmp_path: Path) -> str:
    """``flwr run`` the patched example with 10 SuperNodes; its output (every process it started stopped)."""
    app = patched(example, tmp_path)
    flower = LocalFlower(tmp_path)
    flower.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT), os.environ.get("PYTHONPATH")]))
    try:
        completed = flower.flwr("--federation-config", f"num-supernodes={NUM_SUPERNODES}", app=app)
    finally:
        flower.stop()
    output = completed.stdout + completed.stderr
    assert not pids_with_cmdline(str(flower.home)), "a SuperLink process survived"
    assert "Traceback" not in output, _explain(output)
    market = re.search(r"(\d+) bidders, (\d+) winners", output)
    assert market, _explain(output)
    assert (int(market.group(1)), int(market.group(2))) == (NUM_SUPERNODES, example.winners), _explain(output)
    return output


@needs_flower_cli
def test_the_custom_strategy_example_runs_under_flwr_run(tmp_path: Path) -> None:
    output = flwr_run(ADVANCED, tmp_path)
    assert "then CustomFedAvg on the winners" in output, _explain(output)
    assert "Adjusted learning rate to 0.050000" in output, _explain(output)
    assert "Strategy execution finished" in output and "Saving final model to disk" in output, _explain(output)


@needs_flower_cli
def test_the_numpy_example_runs_under_flwr_run(tmp_path: Path) -> None:
    output = flwr_run(SKLEARN, tmp_path)
    trained = [int(n) for n in re.findall(r"aggregate_train: Received (\d+) results", output)]
    assert trained == [SKLEARN.winners] * ROUNDS, _explain(output)
    assert "Saving final model to disk" in output, _explain(output)


@needs_flower_cli
def test_the_legacy_secagg_dp_example_runs_under_flwr_run(tmp_path: Path) -> None:
    output = flwr_run(DPSA, tmp_path)
    assert "then DefaultWorkflow on the winners" in output, _explain(output)
    assert output.count("Secure aggregation completed") == ROUNDS, _explain(output)
    assert output.count(f"received {DPSA.winners} results and 0 failures") == ROUNDS, _explain(output)
    assert output.count("central DP noise with") == ROUNDS, _explain(output)
    assert f"Run finished {ROUNDS} round(s)" in output, _explain(output)
