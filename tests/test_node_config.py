"""The node-config schema: each market key's bad values named, unknown and run-config keys refused, the readers, the
printed table, and the app's mod that refuses a misconfigured node before it answers anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from flwr.app import Context, RecordDict
from hypothesis import given
from hypothesis import strategies as st

from flmarket_flwr.app.client_app import NODE_CONFIG, build_client_app
from flmarket_flwr.app.run_config import APP_KEYS
from flmarket_flwr.market import MarketConfig, MarketPhase
from flmarket_flwr.market.node.node_config import (
    MARKET_NODE_KEYS,
    MARKET_SCHEMA,
    NodeKey,
    check_noise_ceiling,
    read_node_settings,
)
from flmarket_flwr.pass_protocol import IdentityDirectory, SkellamNoise, generate_identity
from flmarket_flwr.pass_protocol.noise import PrivacyBudget
from simulations.inprocess_grid import InProcessGrid

KEY = generate_identity()[1].hex()
BAD_VALUES: dict[str, list[Any]] = {
    "market-security": ["paranoid", 1, True, "honest"],
    "identity-key": [5, True, 1.5],
    "identity-directory": [5, False],
    "identity-directory-digest": ["zz" * 32, "00" * 31, 7],
    "identity-directory-signer": ["00" * 31, "zz" * 32, f"0x{KEY}", 1],
    "identity-directory-unpinned": ["yes", 1, 0.0, "1"],
    "identity-member": [-2, "-2", "3.0", 1.5, True, "{partition-id}"],
    "market-buyer-key": ["00" * 33, "not hex", 0],
    "market-tag": [7, True],
    "market-endorse-tolerance": [-2, "-2", "1.0", 0.5, True],
    "pass-complete-graph": ["yes please", 1, None],
    "pass-min-participants": [2, "2", "ninety", 90.0, True, "-90", "٩٠"],
    "pass-split-tolerance": [-1, "-1", "2.0", 2.0, False],
    "pass-colluders": [-1, "-1", "2.0", 2.0, False],
    "pass-dropout": [-0.1, 1.0, "1", "half", True],
    "pass-reruns": [-2, "-2", "1.0", 1.5, False],
    "pass-security-bits": [0, "0", "40.0", 40.5, True],
    "pass-markets": [0, "0", "1.0", 2.5, True],
    "pass-redraw-wait": [-1.0, "-1", "nan", float("inf"), "an hour", False],
    "market-ledger-dir": [3, True],
    "market-min-roster-change": [0, "0", 1.0, "many"],
    "pass-dp-max-epsilon": [-0.5, "-1", "nan", "inf", float("inf"), "high", True],
    "pass-dp-total-epsilon": [-1, "nan", float("nan"), "lots", False],
    "pass-dp-total-delta": [0.0, 1.0, 2.0, "small"],
}
GOOD_VALUES: dict[str, list[tuple[Any, Any]]] = {
    "identity-key": [("/k.pem", "/k.pem"), (" /k.pem ", "/k.pem")],
    "identity-directory": [("d.json", "d.json")],
    "identity-directory-digest": [("ab" * 32, "ab" * 32), ("", "")],
    "identity-directory-signer": [(KEY, KEY), (f" {KEY} ", KEY)],
    "identity-directory-unpinned": [(True, True), ("false", False), (" TRUE ", True)],
    "identity-member": [(-1, -1), (0, 0), ("7", 7)],
    "market-buyer-key": [(KEY, KEY), ("", "")],
    "market-tag": [("partner", "partner"), (" site-a ", "site-a"), ("", "")],
    "market-endorse-tolerance": [(-1, -1), (0, 0), ("3", 3)],
    "pass-complete-graph": [(True, True), ("true", True), (False, False)],
    "pass-min-participants": [(90, 90), ("90", 90), (" 3 ", 3)],
    "pass-split-tolerance": [(0, 0), ("4", 4)],
    "pass-colluders": [(0, 0), ("3", 3)],
    "pass-dropout": [(0.05, 0.05), ("0", 0.0), (0.5, 0.5)],
    "pass-reruns": [(-1, -1), ("0", 0), (10, 10)],
    "pass-security-bits": [(40, 40), ("64", 64)],
    "pass-markets": [(1, 1), ("65536", 65536)],
    "pass-redraw-wait": [(0, 0.0), ("600", 600.0), (3600.0, 3600.0)],
    "market-ledger-dir": [("/l", "/l")],
    "market-min-roster-change": [(4, 4), ("1", 1)],
    "pass-dp-max-epsilon": [(1, 1.0), ("0.5", 0.5), (0.0, 0.0)],
    "pass-dp-total-epsilon": [(10, 10.0), ("2.5", 2.5)],
    "pass-dp-total-delta": [(1e-8, 1e-8), ("1e-5", 1e-5)],
    "market-security": [("malicious", "malicious"), ("semi-honest", "semi-honest"), ("semi_honest", "semi_honest")],
}


def context(node_config: dict[str, Any]) -> Context:
    return Context(1, 5, node_config, RecordDict(), {})


def test_every_market_key_has_its_bad_and_good_values_listed_here() -> None:
    assert set(BAD_VALUES) == set(GOOD_VALUES) == {key.name for key in MARKET_NODE_KEYS}


@pytest.mark.parametrize("name", sorted(BAD_VALUES))
def test_each_keys_bad_values_are_refused_by_name(name: str) -> None:
    for bad in BAD_VALUES[name]:
        with pytest.raises(ValueError, match=f"node-config key {name}=") as error:
            MARKET_SCHEMA.check({name: bad})
        assert "--node-config" in str(error.value) or "must be a" in str(error.value)
    for given_value, parsed in GOOD_VALUES[name]:
        assert MARKET_SCHEMA.check({name: given_value})[name] == parsed


def test_absent_keys_take_their_defaults() -> None:
    values = MARKET_SCHEMA.check({})
    assert values == {key.name: key.default for key in MARKET_NODE_KEYS}
    assert values["pass-min-participants"] == 3 and values["identity-directory-unpinned"] is False


@given(st.integers(3, 10**6), st.sampled_from(["{}", " {} ", "{} "]))
def test_an_int_key_reads_an_int_or_its_digits_alike(value: int, layout: str) -> None:
    """Property: a quoted node-config int reads as the int itself (and a bool key likewise)."""
    assert MARKET_SCHEMA.value({"pass-min-participants": layout.format(value)}, "pass-min-participants") == value
    assert MARKET_SCHEMA.value({"pass-min-participants": value}, "pass-min-participants") == value


def test_an_unknown_key_is_refused_by_name() -> None:
    config = {"partition-id": 0, "num-partitions": 3, "pass-min-particpants": 5}
    with pytest.raises(ValueError, match=r"unknown node-config key\(s\) \['pass-min-particpants'\]"):
        NODE_CONFIG.check(config)
    with pytest.raises(ValueError, match="unknown node-config key.*partition-id"):
        MARKET_SCHEMA.check({"partition-id": 0})  # the market alone does not know the app's keys


def test_a_run_config_key_given_as_node_config_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"\['data-root'\] are run-config keys.*--run-config"):
        NODE_CONFIG.check({"partition-id": 0, "num-partitions": 3, "data-root": "/data"})
    run_only = sorted({key.name for key in APP_KEYS} - {key.name for key in NODE_CONFIG.keys})
    with pytest.raises(ValueError, match="run-config keys"):
        NODE_CONFIG.check(dict.fromkeys(run_only, 1))
    # identity-directory names each side's own file: the buyer's (run config) and the node's (node config).
    assert NODE_CONFIG.check({"identity-directory": "d.json"})["identity-directory"] == "d.json"


def test_the_apps_keys_are_checked_too_and_an_app_can_declare_its_own() -> None:
    with pytest.raises(ValueError, match="node-config key partition-id=-1"):
        NODE_CONFIG.check({"partition-id": -1, "num-partitions": 3})
    with pytest.raises(ValueError, match="node-config key num-partitions='three'"):
        NODE_CONFIG.check({"partition-id": 0, "num-partitions": "three"})
    mine = MARKET_SCHEMA.extended([NodeKey("site", str, "eu", "where the node runs")], run_config_keys=["budget"])
    assert mine.check({"site": "us"})["site"] == "us"
    with pytest.raises(ValueError, match="run-config keys"):
        mine.check({"budget": 5.0})
    with pytest.raises(ValueError, match="share one name"):
        MARKET_SCHEMA.extended([NodeKey("identity-key", str, "", "again")])


def test_the_settings_read_the_pins_and_the_privacy_budget(tmp_path: Path) -> None:
    assert read_node_settings(context({})).buyer_key is None
    assert read_node_settings(context({"market-buyer-key": KEY})).buyer_key == bytes.fromhex(KEY)
    budgeted = read_node_settings(context({"pass-dp-total-epsilon": "3", "market-ledger-dir": str(tmp_path)}))
    assert budgeted.privacy_budget == PrivacyBudget(3.0, 1e-6)
    assert budgeted.release_ledger is not None and budgeted.release_ledger.privacy_budget == budgeted.privacy_budget
    with pytest.raises(ValueError, match="market-buyer-key"):
        read_node_settings(context({"market-buyer-key": KEY[:-2]}))


def test_a_pin_without_a_directory_or_a_directory_without_a_pin_is_refused(tmp_path: Path) -> None:
    directory = IdentityDirectory({7: generate_identity()[1]})
    (tmp_path / "d.json").write_text(directory.to_json())
    assert read_node_settings(context({})).directory is None
    with pytest.raises(ValueError, match="identity-directory-digest/-signer pin a directory"):
        read_node_settings(context({"identity-directory-digest": directory.digest().hex()}))
    with pytest.raises(ValueError, match="node-config identity-directory: .* is not pinned.*set identity-directory"):
        read_node_settings(context({"identity-directory": str(tmp_path / "d.json")}))
    pinned = {"identity-directory": str(tmp_path / "d.json"), "identity-directory-digest": directory.digest().hex()}
    assert read_node_settings(context(pinned)).directory == directory
    with pytest.raises(ValueError, match="node-config identity-directory-digest: .*No such file"):
        read_node_settings(context(pinned | {"identity-directory": str(tmp_path / "missing.json")}))


def test_the_noise_ceiling_refuses_weaker_noise_by_name() -> None:
    ceiling = 1.0
    assert check_noise_ceiling(None, read_node_settings(context({})).noise_ceiling) is None
    assert check_noise_ceiling(SkellamNoise(0.5), ceiling) == SkellamNoise(0.5)
    assert read_node_settings(context({"pass-dp-max-epsilon": 1.0}), SkellamNoise(0.5)).noise == SkellamNoise(0.5)
    with pytest.raises(ValueError, match="pass-dp-max-epsilon 1.0"):
        read_node_settings(context({"pass-dp-max-epsilon": 1.0}), SkellamNoise(2.0))
    for weaker in (None, SkellamNoise(2.0), SkellamNoise(1.0, delta=1e-3), SkellamNoise(1.0, honest_fraction=0.9)):
        with pytest.raises(ValueError, match="pass-dp-max-epsilon 1.0"):
            check_noise_ceiling(weaker, ceiling)


def test_the_printed_schema_lists_every_market_key_with_its_default() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "flmarket_flwr.market.node.node_config"], capture_output=True, text=True, check=True
    )
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines] == [key.name for key in MARKET_NODE_KEYS]
    assert "pass-min-participants        int    3" in result.stdout and not result.stderr


@pytest.mark.parametrize(
    ("extra", "logged"),
    [({"data-root": "/data"}, "['data-root'] are run-config keys"), ({"identity-dir": "d"}, "['identity-dir']")],
)
def test_the_app_refuses_a_misconfigured_node_at_its_first_message(
    extra: dict[str, Any], logged: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A SuperNode started with a run-config key or a typo answers nothing (silently ignored before); the market goes
    on without it; the reason stays in the node's log."""
    nodes = [11, 22, 33, 44]
    configs: dict[int, dict[str, Any]] = {n: {"partition-id": i, "num-partitions": 4} for i, n in enumerate(nodes)}
    configs[44] |= extra
    grid = InProcessGrid(build_client_app(), nodes, node_configs=configs)
    outcome = MarketPhase(MarketConfig(budget=10_000.0, num_classes=10, poll_interval=0.01)).run(grid)
    assert set(outcome.excluded) == {44} and outcome.excluded[44].startswith("market_advertise")
    assert "the node's config is refused" in outcome.excluded[44] and logged not in outcome.excluded[44]
    assert logged in caplog.text
    assert outcome.pass_participants == [11, 22, 33]


def test_the_schema_and_the_directory_tool_import_without_the_app_stack() -> None:
    """The core install reads node config: neither module pulls torch, scipy, Ray or the app's run config."""
    code = (
        "import sys, flmarket_flwr.market.node.node_config, flmarket_flwr.pass_protocol.identity_cli\n"
        "heavy = ('torch', 'scipy', 'sklearn', 'ray', 'hydra',\n"
        "         'flmarket_flwr.app.run_config', 'flmarket_flwr.app.task')\n"
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert result.stdout.strip() == "[]"
