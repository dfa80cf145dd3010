"""The node's settings are read once per message, and its key files once per process (again when they change)."""

from __future__ import annotations

from pathlib import Path

import pytest
from adversary import make_counts
from flwr.app import Context, RecordDict
from test_secure_profile_market import drop_in_app, profile_setup, secure_config

from flmarket_flwr.market import MarketPhase
from flmarket_flwr.market.node import node_config as node_config_module
from flmarket_flwr.market.node.node_config import NodeSettings, read_node_settings
from flmarket_flwr.pass_protocol import IdentityDirectory, generate_identity, save_identity_key
from simulations.inprocess_grid import InProcessGrid


@pytest.fixture(autouse=True)
def ledger_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "flmarket-home"
    monkeypatch.setenv("FLMARKET_HOME", str(home))
    return home


def test_an_honest_market_in_the_profile_reads_settings_once_per_message_and_each_key_file_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight nodes in the secure profile through the in-process grid (one process, as a simulation): each message
    reads the settings once, each node's PEM key is parsed once and the shared directory once."""
    reads: list[int] = []
    loads = {"identity-key": 0, "identity-directory": 0}
    real_read, real_key, real_directory = (
        node_config_module.read_node_settings,
        node_config_module.load_identity_key,
        node_config_module.load_directory,
    )

    def counted_read(context: Context, *args: object) -> NodeSettings:
        reads.append(int(context.node_id))
        return real_read(context, *args)  # type: ignore[arg-type]

    def counted_key(path: Path) -> object:
        loads["identity-key"] += 1
        return real_key(path)

    def counted_directory(path: Path, **pins: object) -> IdentityDirectory:
        loads["identity-directory"] += 1
        return real_directory(path, **pins)  # type: ignore[arg-type]

    monkeypatch.setattr(node_config_module, "read_node_settings", counted_read)
    monkeypatch.setattr(node_config_module, "load_identity_key", counted_key)
    monkeypatch.setattr(node_config_module, "load_directory", counted_directory)
    counts = make_counts(8, seed=41)
    nodes = sorted(counts)
    configs, directory = profile_setup(tmp_path, nodes)
    messages: list[int] = []

    def count(instruction, reply):  # type: ignore[no-untyped-def]
        if instruction.metadata.message_type != "query.market_award":  # the award keeps its receipt, no settings
            messages.append(instruction.metadata.dst_node_id)
        return reply

    grid = InProcessGrid(drop_in_app(counts), nodes, node_configs=configs, reply_hook=count)
    assert MarketPhase(secure_config(directory)).run(grid).status == "succeeded"
    assert sorted(reads) == sorted(messages) and len(messages) >= 5 * len(nodes)  # once per message, no more
    assert loads == {"identity-key": len(nodes), "identity-directory": 1}


def test_a_changed_key_file_is_read_again_and_an_unchanged_one_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed: list[Path] = []
    real_key = node_config_module.load_identity_key
    monkeypatch.setattr(node_config_module, "load_identity_key", lambda path: parsed.append(path) or real_key(path))
    first, first_public = generate_identity()
    pem = tmp_path / "node.pem"
    save_identity_key(first, pem)
    context = Context(1, 7, {"identity-key": str(pem)}, RecordDict(), {})
    key = read_node_settings(context).identity_key
    assert key is not None and key.public_key().public_bytes_raw() == first_public
    assert read_node_settings(context).identity_key is key and parsed == [pem]  # unchanged: kept
    second, second_public = generate_identity()
    save_identity_key(second, pem)
    changed = read_node_settings(context).identity_key
    assert changed is not None and changed.public_key().public_bytes_raw() == second_public
    assert parsed == [pem, pem]


def test_a_missing_key_file_is_refused_naming_the_key(tmp_path: Path) -> None:
    context = Context(1, 7, {"identity-key": str(tmp_path / "missing.pem")}, RecordDict(), {})
    with pytest.raises(ValueError, match="node-config identity-key: .*No such file"):
        read_node_settings(context)


def test_the_profile_has_one_spelling() -> None:
    for spelled in ("semi-honest", "semi_honest", "SEMI-HONEST"):
        context = Context(1, 7, {"market-security": spelled}, RecordDict(), {})
        assert read_node_settings(context).security == "semi-honest"
    with pytest.raises(TypeError, match="security must be one of"):
        NodeSettings(security="semi_honest")
