"""The app's clients sign their PASS keys and check their neighbours' when their node config names the files."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from flmarket_flwr.client_app import build_client_app
from flmarket_flwr.market import MarketConfig, MarketPhase
from flmarket_flwr.market.inprocess import InProcessGrid
from flmarket_flwr.market.messages import RECORD_KEY
from flmarket_flwr.pass_protocol import IdentityDirectory, generate_identity, load_identity_key, save_identity_key

NODES = [101, 202, 303, 404, 505]


def signed_federation(tmp_path: Path, unsigned: set[int] = frozenset()) -> tuple[InProcessGrid, IdentityDirectory]:
    """Nodes whose node config names a PEM identity key (except ``unsigned``) and the buyer's directory."""
    publics = {}
    for node in NODES:
        key, publics[node] = generate_identity()
        assert save_identity_key(key, tmp_path / f"{node}.pem") == publics[node]
    directory = IdentityDirectory(publics)
    (tmp_path / "directory.json").write_text(directory.to_json(), encoding="utf-8")
    configs = {
        node: {
            "partition-id": i,
            "num-partitions": len(NODES),
            "identity-key": "" if node in unsigned else str(tmp_path / f"{node}.pem"),
            "identity-directory": str(tmp_path / "directory.json"),
        }
        for i, node in enumerate(NODES)
    }
    return InProcessGrid(build_client_app(), NODES, node_configs=configs), directory


def test_identity_keys_round_trip_through_pem(tmp_path: Path) -> None:
    key, public = generate_identity()
    save_identity_key(key, tmp_path / "k.pem")
    assert (tmp_path / "k.pem").stat().st_mode & 0o777 == 0o600
    assert load_identity_key(tmp_path / "k.pem").public_key().public_bytes_raw() == public


def test_signed_market_completes_and_every_advertisement_is_signed(tmp_path: Path) -> None:
    grid, directory = signed_federation(tmp_path)
    outcome = MarketPhase(MarketConfig(budget=10_000.0, num_classes=10, directory=directory, poll_interval=0.01)).run(
        grid
    )
    adverts = [r for r in grid.received if r.metadata.message_type == "query.market_advertise"]
    assert len(adverts) == len(NODES)
    assert all(len(r.content.config_records[RECORD_KEY]["signature"]) == 64 for r in adverts)
    assert outcome.pass_participants == NODES and not outcome.excluded
    assert np.sum(outcome.global_counts) > 0


def test_an_unsigned_node_is_left_out_by_the_server_with_a_directory(tmp_path: Path) -> None:
    grid, directory = signed_federation(tmp_path, unsigned={303})
    outcome = MarketPhase(MarketConfig(budget=10_000.0, num_classes=10, directory=directory, poll_interval=0.01)).run(
        grid
    )
    assert 303 in outcome.excluded and 303 not in outcome.pass_participants
    assert outcome.pass_participants == [n for n in NODES if n != 303]
