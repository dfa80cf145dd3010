"""Make the test oracles in tests/ and the repository's top-level packages (simulations,
benchmarks) importable however pytest is started; let each test play a ServerApp process; a fresh ledger home;
list the slow tests."""

import pathlib
import sys
from collections.abc import Iterator

import pytest

TESTS = pathlib.Path(__file__).resolve().parent
for folder in (TESTS, TESTS.parent):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))


@pytest.fixture(autouse=True)
def _plays_the_serverapp() -> Iterator[None]:
    """Each test plays a ServerApp process: Flower's ``Message(...)`` needs the identity its runtime would set
    (``simulations.inprocess_grid.serverapp_identity``, put back after the test; the grid leaves it alone)."""
    from simulations.inprocess_grid import serverapp_identity  # pylint: disable=import-outside-toplevel

    with serverapp_identity():
        yield


@pytest.fixture
def ledger_home(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """A fresh ``FLMARKET_HOME`` for the test (the nodes' release ledgers live under it); a module whose in-process
    nodes keep ledgers uses it with ``pytestmark = pytest.mark.usefixtures("ledger_home")``."""
    home = tmp_path / "flmarket-home"
    monkeypatch.setenv("FLMARKET_HOME", str(home))
    return home


# --- The slow tests: one list ----------------------------------------------------------------------
# `python -m pytest -m "not slow"` is the fast suite (README); `.ci/run` runs everything. A test is slow here when it
# starts Flower's Ray simulation or a `flwr run`, a deployment, a sweep in subprocesses, a fresh virtual
# environment, or runs long randomised property checks over the whole market. Measured on the shared 2-core machine
# (2026-11-25, .ci/run from a fresh clone at f2cfa74, the machine quiet): the fast suite 2 min 24 s (1,226 tests),
# the slow one 9 min 44 s (693 tests).
SLOW_MODULES = {
    "test_app_reproducibility.py",  # two Ray simulations
    "test_deployment.py",  # SuperLink + SuperNodes on loopback
    "test_local_superlink.py",  # docs/usage.md's local SuperLink started by hand
    # one flwr run on a loopback SuperLink, 6 + 3 SuperNodes, two markets: 390-498 s at load 5-12 (2026-11-27)
    "test_federation_deployment.py",
    "test_federation_ray.py",  # a re-launching market on Ray: 34 s at load 8-12 (2026-11-27)
    "test_market_simulation.py",  # Ray
    "test_report_archives.py",  # extracts each committed run archive and renders its report (six archives)
    "test_robustness_fuzz.py",  # fuzzed replies at each of the seven steps
    "test_robustness_truthful.py",  # random markets with a lying client, through Flower messages
    "test_simulations.py",  # Hydra sweeps, each in its own Ray instance
    "test_secure_simulation.py",  # docs/deployment.md's secure profile in simulation: 40 nodes under flwr run
}
SLOW_TESTS = {
    "test_gpu_path.py::test_gpu_path_runs_end_to_end_on_the_cpu",  # two flwr runs and three engine jobs
    "test_adversarial_runs.py::test_the_apps_clients_keep_the_ledger_named_by_their_node_config",  # 7.5 s, digits
    "test_app_quickstart.py::test_the_readme_drop_in_runs_flowers_quickstart_under_flwr_run",
    # docs/drop-in.md's examples: torch training in process (about 20 s each), and each under `flwr run` with 10 nodes
    "test_app_dropin_examples.py::test_a_custom_strategy_keeps_its_own_methods_and_start_on_the_winners",
    "test_app_dropin_examples.py::test_a_legacy_app_runs_secagg_plus_and_central_dp_on_the_winners",
    "test_app_dropin_examples.py::test_the_custom_strategy_example_runs_under_flwr_run",
    "test_app_dropin_examples.py::test_the_numpy_example_runs_under_flwr_run",
    "test_app_dropin_examples.py::test_the_legacy_secagg_dp_example_runs_under_flwr_run",
    "test_app_quickstart_fresh.py::test_the_readme_drop_in_runs_from_a_fresh_flwr_home_on_a_list_of_dicts",
    "test_app_simulation.py::test_budget_mode_only_winners_train",
    "test_app_simulation.py::test_fixed_cohort_mode",
    "test_app_simulation.py::test_too_few_supernodes_fails_fast",
    "test_app_simulation.py::test_bad_config_fails_once_on_the_server",
    "test_engine_sweep.py::test_grid_runs_on_workers_writes_every_job_and_resumes",
    "test_engine_sweep.py::test_grid_reruns_only_the_missing_job",
    "test_packaging.py::test_the_core_alone_installs_in_a_fresh_venv_and_imports_without_torch",
    "test_venv_layout.py::test_the_readme_set_up_puts_the_venv_where_flwr_build_never_walks",  # a fresh venv
    "test_packaging.py::test_the_wheel_carries_the_licence_py_typed_and_the_metadata",  # pip builds in isolation
    "test_ray_cluster.py::test_flwr_run_on_an_existing_ray_cluster",
    # docs/deployment.md's secure sequence, six SuperNodes (the module is slow already): 3 min 48 s, 4 min 9 s at load 7
    "test_deployment.py::test_the_guides_secure_sequence_runs_as_written",
    "test_deployment.py::test_a_deviating_buyer_gets_no_counts_in_the_secure_profile",
    # the market re-launched in a secure loopback deployment: 6 SuperNodes, 3 join, a winner killed; 13 min 11 s and
    # 10 min 59 s at load 5-19 (benchmarks beside it)
    "test_relaunch_deployment.py::test_a_relaunch_in_a_deployment_invites_the_joined_nodes_and_drops_a_killed_winner",
    # every job of each documented Hydra sweep composed (about 50 s in all); the Ray sweep on a local head
    "test_doc_commands.py::test_every_job_of_the_documented_sweep_composes",
    "test_doc_commands.py::test_the_ray_sweep_without_a_launcher_runs_on_a_local_head",
    "test_doc_commands.py::test_the_documented_ray_head_starts_and_stops_by_its_folder",
}


def pytest_collection_modifyitems(config, items):  # type: ignore[no-untyped-def]
    """Mark the tests listed above ``slow``; a listed name that matches nothing is an error (renamed test)."""
    unmatched = set(SLOW_TESTS)
    for item in items:
        module = item.path.name
        name = f"{module}::{item.originalname}"
        if module in SLOW_MODULES or name in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
            unmatched.discard(name)
    collected = {item.path.name for item in items}
    stale = sorted(name for name in unmatched if name.split("::")[0] in collected)
    if stale:
        raise pytest.UsageError(f"tests/conftest.py lists slow tests that no longer exist: {stale}")
