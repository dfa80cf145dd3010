"""Every command in the documents is run by a test, or checked here in a cheap form of its own text.

The fenced ``bash`` blocks of ``README.md``, ``docs/*.md`` and ``simulations/README.md`` are read at test time and
cut into commands (continuations joined, comments and shell glue dropped, ``a && b`` split). Each command must match
one rule of :data:`RULES`; a rule checks the command's own text cheaply (a run config through the app's schema, a
Hydra sweep composed job by job, a node config through the ClientApp's schema, a benchmark's flags against its
``--help``) and names the existing tests that run it for real, which must exist. A new documented command that no
rule covers fails :func:`test_every_documented_command_is_covered`.

The Ray sweep "without a launcher plugin" runs here, shrunk to two tiny jobs, on a Ray head of the test's own on
loopback (``tests/test_ray_cluster.py``'s fixture: own ports and temporary folder, stopped by PID, never
``ray stop``).
"""

from __future__ import annotations

import functools
import itertools
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from flwr.common.config import parse_config_args
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from omegaconf import DictConfig, OmegaConf
from processes import free_ports, pids_with_cmdline, process_tree, stop_pids
from test_ray_cluster import RAY, ray_head  # noqa: F401  (the fixture)
from test_simulations import TINY

from flmarket_flwr.app.run_config import DEFAULTS
from flmarket_flwr.app.server_app import ServerSettings, data_config_of
from simulations.apps import strategy_of
from simulations.config import CONF_DIR, to_run_config
from simulations.run_config import split_run_config

PROJECT = Path(__file__).resolve().parent.parent
DOCUMENTS = (PROJECT / "README.md", *sorted((PROJECT / "docs").glob("*.md")), PROJECT / "simulations" / "README.md")
GUIDE_SECTION = "## Recommended: TLS, SuperNode authentication and the secure profile"
"""docs/deployment.md's section that ``test_deployment.py`` runs block by block, as written."""
RUN_AS_WRITTEN = {
    GUIDE_SECTION: "test_deployment.py::test_the_guides_secure_sequence_runs_as_written",
    "## The secure profile in simulation": (
        "test_secure_simulation.py::test_forty_simulated_members_run_the_sparse_secure_mode_from_the_documented_directory"
    ),
}
"""docs/deployment.md's sections whose bash blocks a test runs as written, and that test."""
GLUE = re.compile(r"^(export |for |done\b|do\b|until |N=|NODE_IDS=|ENTRIES=|SUPERNODE_PIDS=|mkdir |cat > |EOF$|\[)")
"""Shell glue between commands: variables, loops, folders (the commands inside the loops are checked)."""


@dataclass(frozen=True)
class Command:
    """One documented command: where it is written and its text (continuations joined, no comment)."""

    document: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.document}:{self.line}"


def _logical_lines(block: str) -> Iterator[tuple[int, str]]:
    """``(offset, line)`` per command of a block: continuations joined, comments and empty lines dropped."""
    lines = block.splitlines()
    index = 0
    while index < len(lines):
        start, text = index, lines[index]
        while text.rstrip().endswith("\\") and index + 1 < len(lines):
            index += 1
            text = text.rstrip()[:-1].rstrip() + " " + lines[index].strip()
        index += 1
        text = re.sub(r"\s+#\s.*$", "", text).strip()  # a trailing comment (never inside these commands' quotes)
        if text and not text.startswith("#"):
            yield start, text


def documented_commands() -> list[Command]:
    """Every command of every fenced ``bash`` block of the documents, in order."""
    found = []
    for document in DOCUMENTS:
        text = document.read_text(encoding="utf-8")
        for title, runner in RUN_AS_WRITTEN.items() if document.name == "deployment.md" else ():
            _test_exists(runner)  # these sections run as written there
            head, rest = text.split(title, 1)
            section, tail = rest.split("\n## ", 1)
            text = head + title + re.sub(r"```bash\n.*?```", "```guide```", section, flags=re.S) + "\n## " + tail
        for match in re.finditer(r"^```bash\n(.*?)^```", text, flags=re.S | re.M):
            first = text[: match.start()].count("\n") + 2
            for offset, line in _logical_lines(match.group(1)):
                for part in re.split(r"\s&&\s", line):
                    name = str(document.relative_to(PROJECT))
                    found.append(Command(name, first + offset, part.strip().removesuffix("&").strip()))
    return found


def _words(text: str) -> list[str]:
    """The command's words without leading ``VAR=value`` assignments."""
    words = shlex.split(text)
    while words and re.match(r"^[A-Z_]+=", words[0]):
        words.pop(0)
    return words


def _option(words: list[str], name: str) -> str | None:
    return words[words.index(name) + 1] if name in words else None


def _test_exists(name: str) -> None:
    """``module.py::test_name`` is a test function of tests/ (the test that runs the command for real)."""
    module, test = name.split("::")
    source = (PROJECT / "tests" / module).read_text(encoding="utf-8")
    assert re.search(rf"^def {test}\(", source, flags=re.M), f"{name} is gone: what runs this command now?"


# --- the cheap checks, each on the command's own text ----------------------------------------------------------
def _placeholder_free(value: str) -> str:
    """A documented placeholder (``<sha256 hex>``, a loop's ``$i``) replaced by a value of its shape."""
    value = re.sub(r"<sha256[^>]*>", "0" * 64, value)
    return re.sub(r"\$\w+", "0", value)


def check_flwr_run(command: Command) -> None:
    """``flwr run``: the app is this project, its run config passes the app's schema, its federation config is
    Flower's; the real runs: the tests named in :data:`RULES`."""
    words = _words(command.text)
    assert words[:2] == ["flwr", "run"] and words[2] == ".", command.text
    run_config = parse_config_args([_option(words, "--run-config") or ""])
    ServerSettings.from_run_config(run_config)
    data_config_of(run_config)
    federation = parse_config_args([_option(words, "--federation-config") or ""])
    allowed = {"num-supernodes", "client-resources-num-cpus", "client-resources-num-gpus"}
    assert set(federation) <= allowed, f"{command}: federation-config keys {sorted(set(federation) - allowed)}"
    assert int(federation.get("num-supernodes", 2)) >= 1


def check_node_config(command: Command) -> None:
    """A SuperNode's ``--node-config``: every key and value passes the ClientApp's node-config schema."""
    from flmarket_flwr.app.client_app import NODE_CONFIG  # pylint: disable=import-outside-toplevel

    value = re.search(r"--node-config\s+\"([^\"]*)\"", command.text)
    assert value, f"{command}: no --node-config"
    NODE_CONFIG.check(parse_config_args([_placeholder_free(value.group(1))]))


def _hydra_jobs(overrides: list[str]) -> list[list[str]]:
    """The jobs of a Hydra command line: every combination of its sweep overrides (``a=1,2``), ``hydra`` ones out."""
    parsed = OverridesParser.create().parse_overrides([o for o in overrides if not o.startswith("hydra")])
    choices = [
        [f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override() else [o.input_line]
        for o in parsed
    ]
    return [list(job) for job in itertools.product(*choices)]


@functools.cache
def _parsed(override: str) -> Override:
    return OverridesParser.create().parse_override(override)


def check_simulations_run(command: Command) -> None:
    """``python -m simulations.run``: every job of the sweep composes and maps to a valid app run config (and, in
    process, to a valid engine config); a launcher preset it names exists."""
    from simulations.engine import config_from_hydra  # pylint: disable=import-outside-toplevel

    words = _words(command.text)
    overrides = [w for w in words[words.index("simulations.run") + 1 :] if w != "-m"]
    for launcher in (o.split("=", 1)[1] for o in overrides if o.startswith("hydra/launcher=")):
        assert (CONF_DIR / "hydra" / "launcher" / f"{launcher}.yaml").is_file(), f"{command}: no preset {launcher}"
    groups = {path.name for path in CONF_DIR.iterdir() if path.is_dir()}
    composed: dict[tuple[str, ...], DictConfig] = {}
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for job in _hydra_jobs(overrides):
            # Compose once per choice of config groups; the values on top, as Hydra would set them (typed).
            chosen = tuple(o for o in job if o.split("=", 1)[0] in groups)
            if chosen not in composed:
                composed[chosen] = compose(config_name="config", overrides=list(chosen))
            cfg = composed[chosen].copy()
            for value in (_parsed(o) for o in job if o not in chosen):
                OmegaConf.update(cfg, value.key_or_group, value.value())
            app, own = split_run_config(to_run_config(cfg))
            settings = ServerSettings.from_run_config(app)
            if cfg.sim.engine.name != "inprocess":  # the engine's budget mode takes a baseline without a cohort
                strategy_of(own.selector, settings.num_selected)
            if cfg.sim.engine.name == "inprocess":
                config_from_hydra(cfg)


def check_module_help(command: Command) -> None:
    """``python -m <module> [flags]``: the module answers ``--help`` and every flag written is one of its own."""
    words = _words(command.text)
    module = words[words.index("-m") + 1]
    helped = subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=PROJECT, capture_output=True, text=True, timeout=120, check=False
    )
    assert helped.returncode == 0, f"{command}: {module} --help failed\n{helped.stderr[-2000:]}"
    for flag in (w for w in words if w.startswith("--")):
        assert flag in helped.stdout, f"{command}: {module} has no {flag}"


def check_script(command: Command) -> None:
    """``bash <script>``: the script exists and parses (``bash -n``)."""
    script = PROJECT / _words(command.text)[1]
    assert script.is_file(), f"{command}: {script} missing"
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0, f"{command}: {script} invalid"


def check_pip_install(command: Command) -> None:
    """``pip install -c constraints.txt -e ".[extras]"``: the constraints file and every extra exist."""
    words = _words(command.text)
    assert (PROJECT / (_option(words, "-c") or "constraints.txt")).is_file()
    target = _option(words, "-e") or "."
    extras = re.findall(r"[\w-]+", target.split("[", 1)[1]) if "[" in target else []
    optional = tomllib.loads((PROJECT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras) <= set(optional), f"{command}: extras {sorted(set(extras) - set(optional))} missing"


def check_plugin_install(command: Command) -> None:
    """``pip install -e <checkout>``: the checkout is this project, an installable distribution named flmarket-flwr."""
    project = tomllib.loads((PROJECT / "pyproject.toml").read_text())["project"]
    assert project["name"] == _words(command.text)[-1].rsplit("/", 1)[-1] == "flmarket-flwr", command.text


def check_archive(command: Command) -> None:
    """``tar -xzf <archive> -C <folder>``: the archive is a real gzip tarball (not a pointer) and the folder exists."""
    words = _words(command.text)
    archive, folder = PROJECT / words[2], PROJECT / words[4]
    listed = subprocess.run(["tar", "-tzf", str(archive)], capture_output=True, text=True, timeout=120, check=False)
    assert listed.returncode == 0 and listed.stdout, f"{command}: {archive} is not a tarball"
    assert folder.is_dir()


def check_pytest(command: Command) -> None:
    """``pytest -m "not slow"``: the marker is registered (the slow list lives in tests/conftest.py)."""
    markers = tomllib.loads((PROJECT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert any(marker.startswith("slow:") for marker in markers) and "not slow" in command.text


def nothing(_: Command) -> None:
    """Covered only by the named tests (a process to start or stop: the tests start and stop their own)."""


@dataclass(frozen=True)
class Rule:
    """Commands whose text matches ``pattern``: the cheap check run here, and the tests that run them for real."""

    pattern: str
    check: Callable[[Command], None]
    tests: tuple[str, ...]


RULES = (
    Rule(
        r"^(\S+=\S+ )*flwr run \. ",
        check_flwr_run,
        (
            "test_app_simulation.py::test_budget_mode_only_winners_train",
            "test_app_simulation.py::test_fixed_cohort_mode",
        ),
    ),
    Rule(
        r"--node-config ",
        check_node_config,
        (
            "test_deployment.py::test_market_then_fedavg_in_deployment",
            "test_deployment.py::test_the_guides_secure_sequence_runs_as_written",
        ),
    ),
    Rule(
        r"^(\S+=\S+ )*(\.venv/bin/)?python -m simulations\.run\b",
        check_simulations_run,
        (
            "test_simulations.py::test_tiny_sweep_end_to_end",
            "test_simulations.py::test_single_job",
            "test_doc_commands.py::test_the_ray_sweep_without_a_launcher_runs_on_a_local_head",
            "test_doc_commands.py::test_every_job_of_the_documented_sweep_composes",
        ),
    ),
    Rule(
        r"^(\.venv/bin/)?python -m simulations\.report ",
        check_module_help,
        (
            "test_report_small_sweeps.py::test_a_two_selector_engine_sweep_shows_what_ran",
            "test_engine_sweep.py::test_sweep_report_counts_divergence_and_tests_the_pairs",
        ),
    ),
    Rule(r"^\.venv/bin/python -m benchmarks\.\w+", check_module_help, ()),
    Rule(
        r"^(\.venv/bin/)?python -m flmarket_flwr\.pass_protocol\.graph_parameters\b",
        check_module_help,
        ("test_graph_parameters.py::test_the_threat_models_table_is_the_commands_output",),
    ),
    Rule(
        r"^bash simulations/\w+\.sh \d+$",
        check_script,
        ("test_engine_sweep.py::test_grid_runs_on_workers_writes_every_job_and_resumes",),
    ),
    Rule(
        r"^bash tests/install_test_data\.sh$",
        check_script,
        ("test_fashion_mnist.py::test_missing_folder_names_the_package_and_data_root",),
    ),
    Rule(r"^tar -xzf \S+\.tar\.gz -C \S+$", check_archive, ()),
    Rule(
        r'^python3 -m venv "\.\./\$\{PWD##\*/\}\.venv"$|^ln -sfn "\.\./\$\{PWD##\*/\}\.venv" \.venv$',
        nothing,
        (
            "test_venv_layout.py::test_the_readme_set_up_puts_the_venv_where_flwr_build_never_walks",
            "test_venv_layout.py::test_ci_makes_the_environment_as_the_readme_does",
        ),
    ),
    Rule(
        r"^\.venv/bin/pip install -c constraints\.txt -e ",
        check_pip_install,
        ("test_packaging.py::test_the_core_alone_installs_in_a_fresh_venv_and_imports_without_torch",),
    ),
    Rule(r"^\.venv/bin/python -m pytest -q -m \"not slow\"$", check_pytest, ()),
    Rule(
        r"^pip install -e /path/to/flmarket-flwr$",
        check_plugin_install,
        ("test_app_quickstart_fresh.py::test_the_readme_drop_in_runs_from_a_fresh_flwr_home_on_a_list_of_dicts",),
    ),
    Rule(
        r"^flower-superlink --insecure --simulation |^mv \"\$FLWR_HOME/local-superlink/state\.db\" ",
        nothing,
        (
            "test_local_superlink.py::test_a_superlink_started_by_hand_is_the_one_flwr_uses",
            "test_local_superlink.py::test_a_half_made_state_db_is_refused_until_moved_aside",
        ),
    ),
    Rule(r"^flower-superlink --insecure", nothing, ("test_deployment.py::test_market_then_fedavg_in_deployment",)),
    Rule(
        r"^ray start --head |^pids=\$\(pgrep -f -- \"/tmp/ray-|^kill -TERM \$pids; sleep",
        nothing,
        (
            "test_doc_commands.py::test_the_documented_ray_head_starts_and_stops_by_its_folder",
            "test_ray_cluster.py::test_flwr_run_on_an_existing_ray_cluster",
        ),
    ),
    Rule(
        r"^(pgrep -P |kill -TERM |pid=\$\(pgrep -f -- )",
        nothing,
        (
            "test_deployment.py::test_market_then_fedavg_in_deployment",
            "test_app_simulation.py::test_too_few_supernodes_fails_fast",
        ),
    ),
    Rule(GLUE.pattern, nothing, ()),
)


def rule_of(command: Command) -> Rule | None:
    """The first rule whose pattern matches the command."""
    return next((rule for rule in RULES if re.search(rule.pattern, command.text)), None)


COMMANDS = documented_commands()


def test_the_documents_have_commands_and_the_guide_runs_as_written() -> None:
    assert len(COMMANDS) > 30, [str(c) for c in COMMANDS]
    _test_exists("test_deployment.py::test_the_guides_secure_sequence_runs_as_written")


def test_every_documented_command_is_covered() -> None:
    uncovered = [f"{command}: {command.text}" for command in COMMANDS if rule_of(command) is None]
    assert not uncovered, "documented commands no rule covers (add one to tests/test_doc_commands.py):\n" + "\n".join(
        uncovered
    )


def _is_sweep(command: Command) -> bool:
    return "simulations.run -m " in command.text


@pytest.mark.parametrize("command", [c for c in COMMANDS if not _is_sweep(c)], ids=str)
def test_the_documented_command_passes_its_check(command: Command) -> None:
    _passes_its_check(command)


@pytest.mark.parametrize("command", [c for c in COMMANDS if _is_sweep(c)], ids=str)
def test_every_job_of_the_documented_sweep_composes(command: Command) -> None:
    """Hundreds of jobs each (a few seconds per sweep: slow)."""
    _passes_its_check(command)


def _passes_its_check(command: Command) -> None:
    rule = rule_of(command)
    assert rule is not None, f"{command}: {command.text}"
    for name in rule.tests:
        _test_exists(name)
    rule.check(command)


def test_the_run_config_check_is_not_a_no_op() -> None:
    """The rule for ``flwr run`` refuses what the app refuses: a misspelt key (named, with the closest valid key),
    a bad value. (``flwr run`` itself refuses an unknown key before the app runs, naming nothing.)"""
    with pytest.raises(ValueError, match=r"key\(s\) \['budgett'\]; 'budgett': did you mean 'budget'"):
        check_flwr_run(Command("test", 0, 'flwr run . --run-config "budgett=400.0"'))
    with pytest.raises(ValueError, match="distribution='d9'"):
        check_flwr_run(Command("test", 0, "flwr run . --run-config \"distribution='d9'\""))
    assert "budget" in DEFAULTS


def test_the_sweep_check_composes_every_job() -> None:
    """A sweep whose second job is invalid fails the check (the Ray sweeps once failed on their ``rs`` job)."""
    assert len(_hydra_jobs(["-m", "selector=flmarket,rs", "seed=0,1,2"][1:])) == 6
    with pytest.raises(Exception, match="num"):
        check_simulations_run(Command("test", 0, "python -m simulations.run -m selector=flmarket,rs num_selected=0"))


def _ray_command() -> Command:
    (found,) = [c for c in COMMANDS if c.text.startswith("RAY_ADDRESS=") and "hydra/launcher" not in c.text]
    return found


@pytest.mark.skipif(not RAY.exists(), reason="needs the ray CLI of flwr[simulation] beside the Python running pytest")
def test_the_ray_sweep_without_a_launcher_runs_on_a_local_head(
    tmp_path: Path,
    ray_head: tuple[str, Path],  # noqa: F811
) -> None:
    """docs/experiments.md's "Ray without a launcher plugin", its selectors as written, one seed, a tiny federation,
    on the test's own Ray head."""
    address, _ = ray_head
    words = _words(_ray_command().text)
    overrides = [w for w in words[words.index("simulations.run") + 1 :] if w != "-m"]
    selectors = next(o for o in overrides if o.startswith("selector="))
    tiny = [o for o in TINY if not o.startswith("sim.ray_num_cpus")]  # the cluster has its CPUs
    sweep = tmp_path / "sweep"
    env = {**os.environ, "RAY_ADDRESS": address, "RAY_USAGE_STATS_ENABLED": "0", "FLWR_TELEMETRY_ENABLED": "0"}
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "simulations.run",
            "-m",
            *tiny,
            selectors,
            "num_selected=2",
            "seed=0",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert completed.returncode == 0, (completed.stdout + completed.stderr)[-6000:]
    assert len(list(sweep.glob("*/result.json"))) == len(selectors.split("=", 1)[1].split(","))


def test_a_command_no_rule_knows_is_uncovered() -> None:
    """What makes a new documented command fail :func:`test_every_documented_command_is_covered`."""
    assert rule_of(Command("test", 0, "flwr new-thing --now")) is None
    assert rule_of(Command("test", 0, ".venv/bin/python -m simulations.something_new")) is None
    commands = list(_logical_lines("# a comment\nflwr run . \\\n    --stream   # streamed\n\nexport X=1\n"))
    assert commands == [(1, "flwr run . --stream"), (4, "export X=1")]


def _usage_line(prefix: str) -> Command:
    (found,) = [c for c in COMMANDS if c.document == "docs/usage.md" and c.text.startswith(prefix)]
    return found


@pytest.mark.skipif(not RAY.exists(), reason="needs the ray CLI of flwr[simulation] beside the Python running pytest")
def test_the_documented_ray_head_starts_and_stops_by_its_folder(tmp_path: Path) -> None:
    """docs/usage.md's ``ray start --head ... --temp-dir=<folder>`` and its stop (``pgrep -f -- <folder>``, SIGTERM,
    SIGKILL), as written but on loopback with free ports and a folder of the test's own: nothing of the head
    survives."""
    start, find, stop = (_usage_line(p) for p in ("ray start --head", "pids=$(pgrep -f", "kill -TERM $pids"))
    documented = re.search(r"--temp-dir=(\S+)", start.text)
    assert documented and documented.group(1) in find.text, "the stop must name the head's folder"
    folder = Path(tempfile.mkdtemp(prefix="flm-rh-"))  # Ray's socket paths must stay short (AF_UNIX)
    gcs, client, agent = free_ports(3)
    loopback = (
        f" --include-dashboard=false --node-ip-address=127.0.0.1 --ray-client-server-port={client}"
        f" --dashboard-agent-listen-port={agent} --disable-usage-stats"
    )
    script = tmp_path / "head.sh"  # run from a file: a `bash -c` naming the folder would match its own pgrep
    found = tmp_path / "head.pids"
    script.write_text(
        "set -e\n"
        + start.text.replace("ray start", str(RAY) + " start", 1)
        .replace("--port=6379", f"--port={gcs}")
        .replace(documented.group(1), str(folder))
        + loopback
        + "\nsleep 2\n"
        + find.text.replace(documented.group(1), str(folder))
        + f'\necho "$pids" > {found}\n'
        + stop.text
        + "\n"
    )
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    try:
        done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=180, check=False)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert len(found.read_text().split()) >= 3, "the head's gcs_server, raylet and monitor were not found"
        deadline = time.monotonic() + 15
        while pids_with_cmdline(str(folder)) and time.monotonic() < deadline:
            time.sleep(0.2)
        survivors = pids_with_cmdline(str(folder))
        assert not survivors, f"processes of the head survived the documented stop: {survivors}"
    finally:
        stop_pids(process_tree(pids_with_cmdline(str(folder))))
