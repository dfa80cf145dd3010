"""The secure profile: ``MarketConfig(security="malicious")`` with its directory / run config ``market-security`` and
``identity-directory`` for the buyer, node config ``market-security=malicious`` with the node's identity key and pinned
directory for a SuperNode. Each defence it turns on, each weakening it refuses (naming the key), and the defaults it
picks."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from flwr.app import Context, RecordDict
from flwr.serverapp.strategy import FedAvg

from flmarket_flwr.market import FLMarket, MarketConfig
from flmarket_flwr.market.node.node_config import PROFILE_SPLIT_TOLERANCE, NodeSettings, read_node_settings
from flmarket_flwr.market.wire.profiles import PROFILE_COLLUDER_SHARE
from flmarket_flwr.pass_protocol import IdentityDirectory, SkellamNoise, generate_identity, save_identity_key
from flmarket_flwr.pass_protocol.noise import SECURE_PROFILE_EPSILON, SECURE_PROFILE_TOTAL_EPSILON, PrivacyBudget


def context(node_config: dict[str, Any]) -> Context:
    return Context(1, 5, node_config, RecordDict(), {})


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A node in the secure profile: its identity key and a pinned directory of 30 nodes (its own among them)."""
    monkeypatch.setenv("FLMARKET_HOME", str(tmp_path / "home"))
    private, public = generate_identity()
    save_identity_key(private, tmp_path / "node.pem")
    keys = {5: public, **{100 + i: generate_identity()[1] for i in range(29)}}
    directory = IdentityDirectory(keys)
    (tmp_path / "directory.json").write_text(directory.to_json())
    return {
        "market-security": "malicious",
        "identity-key": str(tmp_path / "node.pem"),
        "identity-directory": str(tmp_path / "directory.json"),
        "identity-directory-digest": directory.digest().hex(),
    }


def test_the_profile_turns_every_node_defence_on(node: dict[str, Any], tmp_path: Path) -> None:
    settings = read_node_settings(context(node))
    assert settings.security == "malicious" and settings.secure
    assert settings.identity_key is not None and len(settings.directory or {}) == 30
    assert settings.complete_graph is True
    assert settings.min_participants == math.ceil(2 / 3 * 30) == 20
    assert settings.split_tolerance == PROFILE_SPLIT_TOLERANCE == 2
    assert settings.colluders == math.ceil(PROFILE_COLLUDER_SHARE * 30) == 6  # a fifth of the directory
    assert settings.noise_ceiling == SECURE_PROFILE_EPSILON
    assert settings.privacy_budget == PrivacyBudget(SECURE_PROFILE_TOTAL_EPSILON)
    ledger = settings.release_ledger
    assert ledger is not None and ledger.privacy_budget == PrivacyBudget(SECURE_PROFILE_TOTAL_EPSILON)
    assert Path(ledger.directory).parent == tmp_path / "home" / "ledger"  # one folder per identity key


def test_a_node_in_the_profile_adds_noise_when_the_run_announces_none(node: dict[str, Any]) -> None:
    noise = read_node_settings(context(node), None).noise
    assert noise is not None and noise.epsilon == SECURE_PROFILE_EPSILON
    assert noise.colluders == 6  # sized for the node's pass-colluders: a fifth of the directory of 30
    stronger = SkellamNoise(0.5)
    assert read_node_settings(context(node), stronger).noise == SkellamNoise(0.5, colluders=6)
    more = SkellamNoise(0.5, colluders=9)
    assert read_node_settings(context(node), more).noise == more
    with pytest.raises(ValueError, match="pass-dp-max-epsilon"):
        read_node_settings(context(node), SkellamNoise(4.0))  # weaker than the profile's: refused


def test_without_the_profile_nothing_changes() -> None:
    assert read_node_settings(context({})) == NodeSettings()  # the semi-honest defaults, nothing loaded


@pytest.mark.parametrize(
    ("drop", "add", "message"),
    [
        ("identity-key", {}, "needs identity-key"),
        ("identity-directory", {}, "needs identity-directory"),
        ("identity-directory-digest", {}, "identity-directory-digest or identity-directory-signer"),
        (None, {"identity-directory-unpinned": True}, "identity-directory-unpinned is refused"),
        (None, {"pass-complete-graph": False}, "pass-complete-graph=false is refused"),
    ],
)
def test_the_profile_refuses_what_would_weaken_it_naming_the_key(
    node: dict[str, Any], drop: str | None, add: dict[str, Any], message: str
) -> None:
    config = {key: value for key, value in node.items() if key != drop} | add
    ctx = context(config)
    with pytest.raises(ValueError, match=message):
        read_node_settings(ctx)


def test_explicit_settings_within_the_profile_are_kept(node: dict[str, Any]) -> None:
    ctx = context(
        node
        | {"pass-min-participants": 28, "pass-split-tolerance": 3, "pass-dp-total-epsilon": 2.0, "pass-colluders": 9}
    )
    settings = read_node_settings(ctx)
    assert (settings.min_participants, settings.split_tolerance, settings.colluders) == (28, 3, 9)
    assert settings.privacy_budget == PrivacyBudget(2.0)


def test_the_buyers_side_runs_the_complete_graph_with_noise_against_the_pinned_directory(tmp_path: Path) -> None:
    directory = IdentityDirectory({node: generate_identity()[1] for node in (1, 2, 3)})
    secure = {"budget": 10.0, "num_classes": 3, "security": "malicious", "directory": directory}
    config = MarketConfig(**secure)
    assert config.noise is not None and config.noise.epsilon == SECURE_PROFILE_EPSILON
    assert config.neighbours == "auto" and not config.runs_sparse(3)  # the finder needs the complete graph here
    assert MarketConfig(**secure, neighbours="all").sparse_settings is None  # "all": always the complete graph
    own = SkellamNoise(0.5)
    assert MarketConfig(**secure, noise=own).noise is own
    assert MarketConfig(budget=10.0, num_classes=3).neighbours == "auto"  # the default profile is unchanged
    with pytest.raises(ValueError, match="graph the server places"):
        MarketConfig(**secure, neighbours=8)
    with pytest.raises(ValueError, match="needs the directory"):
        MarketConfig(budget=10.0, num_classes=3, security="malicious")
    with pytest.raises(ValueError, match="security must be one of"):
        MarketConfig(budget=10.0, num_classes=3, security="paranoid")
    (tmp_path / "directory.json").write_text(directory.to_json())
    strategy = FLMarket(
        FedAvg(), budget=10.0, num_classes=3, security="malicious", directory=str(tmp_path / "directory.json")
    )
    assert strategy.market_config.security == "malicious" and strategy.market_config.sparse_settings is not None
    assert strategy.market_config.directory is not None and strategy.market_config.directory.digest() == (
        directory.digest()
    )
