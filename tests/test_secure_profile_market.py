"""The secure profile end to end, with the client side as a drop-in app writes it (one registration call, no
options): every node is configured by its node config alone (``market-security='malicious'`` and its identity
material), and a buyer in the profile, honest or deviating, meets the real handlers."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from adversary import NUM_CLASSES, make_counts
from flwr.clientapp import ClientApp
from test_award import MaliciousPhase, _AttackDone, audit_oracle

from flmarket_flwr.market import CostBasedBid, MarketConfig, MarketError, MarketPhase, register_market_handlers
from flmarket_flwr.market.node.client import read_award
from flmarket_flwr.market.wire.award import SignedAward
from flmarket_flwr.pass_protocol import IdentityDirectory, generate_identity
from simulations.inprocess_grid import InProcessGrid, secure_profile_setup


def drop_in_app(counts: Mapping[int, np.ndarray]) -> ClientApp:
    """A ClientApp that adds the market the way the README's drop-in does: one call, no options."""
    app = ClientApp()
    register_market_handlers(app, lambda context: counts[context.node_id], CostBasedBid(0.01))
    return app


def profile_setup(
    tmp_path: Path, nodes: list[int], directory_keys: Mapping[int, bytes] | None = None
) -> tuple[dict, IdentityDirectory]:
    """Each node's node config in the secure profile and the honest directory
    (:func:`simulations.inprocess_grid.secure_profile_setup`)."""
    return secure_profile_setup(tmp_path, nodes, directory_keys)


@pytest.fixture(autouse=True)
def ledger_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "flmarket-home"
    monkeypatch.setenv("FLMARKET_HOME", str(home))
    return home


def secure_config(directory: IdentityDirectory, **overrides: Any) -> MarketConfig:
    values: dict[str, Any] = {
        "directory": directory,
        "budget": 100.0,
        "num_classes": NUM_CLASSES,
        "poll_interval": 0.001,
        "timeout": 5.0,
        "timeout_per_node": 0.0,
        "security": "malicious",
    }
    return MarketConfig(**(values | overrides))


def test_an_honest_market_in_the_profile_pays_its_winners_under_a_receipt_with_noise_and_a_spent_budget(
    tmp_path: Path, ledger_home: Path
) -> None:
    counts = make_counts(8, seed=11)
    nodes = sorted(counts)
    configs, directory = profile_setup(tmp_path, nodes)
    grid = InProcessGrid(drop_in_app(counts), nodes, node_configs=configs)
    outcome = MarketPhase(secure_config(directory)).run(grid)
    assert outcome.status == "succeeded" and outcome.winners and outcome.excluded == {}
    exact = np.sum([counts[n] for n in nodes], axis=0)
    assert outcome.global_counts != [int(c) for c in exact]  # each node added its own noise
    for node in nodes:
        award = read_award(grid.context(node))
        assert award is not None and award.award is not None and award.signature is not None
        assert SignedAward(award.award, award.signature).digest == outcome.award_digest
    ledgers = list(ledger_home.glob("ledger/*/release-ledger.json"))
    assert len(ledgers) == len(nodes)  # one ledger per identity, each with this release's spend
    assert all(json.loads(path.read_text())["spent"] for path in ledgers)


def test_the_audit_oracle_against_nodes_in_the_profile_opens_nothing(tmp_path: Path) -> None:
    """Issue 29 item 1, against drop-in nodes configured by the profile alone."""
    counts = make_counts(8, seed=12)
    nodes = sorted(counts)
    seen: dict[str, set[int]] = {}
    configs, directory = profile_setup(tmp_path, nodes)
    grid = InProcessGrid(drop_in_app(counts), nodes, node_configs=configs)
    with pytest.raises(_AttackDone):
        MaliciousPhase(audit_oracle(seen), security="malicious", directory=directory, timeout_per_node=0.0).run(grid)
    assert seen.pop("bidders") == set(nodes)  # the nodes took part up to the bids
    assert seen == {"old": set(), "unendorsed": set(), "endorsers": set(), "endorsed": set()}


def test_nodes_in_the_profile_refuse_a_directory_the_buyer_wrote(tmp_path: Path) -> None:
    """The buyer maps two node ids to keys it holds; the nodes pin the honest digest and take no part."""
    counts = make_counts(6, seed=13)
    nodes = sorted(counts)
    sybil_keys = {node: generate_identity()[1] for node in nodes}
    configs, _ = profile_setup(tmp_path, nodes, directory_keys=sybil_keys)  # the file on disk is the buyer's
    grid = InProcessGrid(drop_in_app(counts), nodes, node_configs=configs)
    with pytest.raises(MarketError) as caught:
        MarketPhase(secure_config(IdentityDirectory(sybil_keys))).run(grid)
    assert caught.value.outcome is not None and set(caught.value.outcome.excluded) == set(nodes)
    assert not any(m.metadata.message_type.endswith("market_audit") for m in grid.sent)


def test_nodes_in_the_profile_refuse_a_sparse_graph(tmp_path: Path) -> None:
    """A buyer outside the profile asks for a sparse graph (where it could seat a victim among colluders)."""
    counts = make_counts(12, seed=14)
    nodes = sorted(counts)
    configs, directory = profile_setup(tmp_path, nodes)
    grid = InProcessGrid(drop_in_app(counts), nodes, node_configs=configs)
    with pytest.raises(MarketError):
        MarketPhase(secure_config(directory, security="semi-honest", neighbours=4)).run(grid)
    assert not any(m.metadata.message_type.endswith("market_mask") for m in grid.sent)
