"""The app's clients sign their PASS keys and check their neighbours' when their node config names the files, take
part only in a roster of at least their node config's ``pass-min-participants``, and only under the buyer key their
node config's ``market-buyer-key`` pins."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from flmarket_flwr.app.client_app import build_client_app
from flmarket_flwr.market import MarketConfig, MarketPhase
from flmarket_flwr.market.wire.messages import RECORD_KEY
from flmarket_flwr.pass_protocol import IdentityDirectory, generate_identity, load_identity_key, save_identity_key
from simulations.inprocess_grid import InProcessGrid

NODES = [101, 202, 303, 404, 505]


def signed_federation(
    tmp_path: Path, unsigned: set[int] = frozenset(), extra: dict[int, dict[str, object]] | None = None
) -> tuple[InProcessGrid, IdentityDirectory]:
    """Nodes whose node config names a PEM identity key (except ``unsigned``) and the directory, pinned by its digest;
    ``extra`` adds node config keys to some nodes."""
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
            "identity-directory-digest": directory.digest().hex(),  # each node pins the directory it trusts
            **(extra or {}).get(node, {}),
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


def test_a_node_refuses_a_roster_below_its_pass_min_participants(tmp_path: Path) -> None:
    """Node 505 requires the complete graph and a roster of 6: the market of 5 goes on without it, refused at the
    share round (before it sends a share); at ``pass-min-participants=5`` it takes part. A bad value is refused at
    the advertisement."""
    config = MarketConfig(budget=10_000.0, num_classes=10, neighbours="all", poll_interval=0.01)

    def outcome(floor: object):  # type: ignore[no-untyped-def]
        extra = {505: {"pass-complete-graph": True, "pass-min-participants": floor}}
        grid, directory = signed_federation(tmp_path, extra=extra)
        return MarketPhase(dataclasses.replace(config, directory=directory)).run(grid)

    refused = outcome(6)
    assert set(refused.excluded) == {505} and refused.excluded[505].startswith("market_share")
    assert refused.pass_participants == NODES[:-1]
    taken_part = outcome(5)
    assert not taken_part.excluded and taken_part.pass_participants == NODES
    misconfigured = outcome("six")
    assert set(misconfigured.excluded) == {505} and misconfigured.excluded[505].startswith("market_advertise")


def test_a_node_pinning_the_buyer_key_takes_part_only_under_that_key(tmp_path: Path) -> None:
    """``market-buyer-key`` in a node's config: a market signed by that key goes on with it; a market under any
    other key (a fresh one here) goes on without it, refused at the advertisement; a malformed value too."""
    buyer, public = generate_identity()

    def outcome(pin: str, key: Ed25519PrivateKey | None):  # type: ignore[no-untyped-def]
        grid, directory = signed_federation(tmp_path, extra={505: {"market-buyer-key": pin}})
        config = MarketConfig(budget=10_000.0, num_classes=10, directory=directory, poll_interval=0.01, buyer_key=key)
        return MarketPhase(config).run(grid)

    assert not outcome(public.hex(), buyer).excluded
    for pin, key in ((public.hex(), None), ("ab" * 31, buyer), ("zz" * 32, buyer)):
        refused = outcome(pin, key)
        assert set(refused.excluded) == {505} and refused.excluded[505].startswith("market_advertise")


def test_the_server_app_reads_the_buyer_key_from_the_run_config(tmp_path: Path) -> None:
    from flmarket_flwr.app.server_app import ServerSettings, market_config_of
    from flmarket_flwr.app.task import DataConfig

    key, public = generate_identity()
    save_identity_key(key, tmp_path / "buyer.pem")
    settings = ServerSettings.from_run_config({"buyer-key": str(tmp_path / "buyer.pem")})
    config = market_config_of(settings, DataConfig.from_run_config({}), run_id=1)
    assert config.buyer_key is not None and config.buyer_key.public_key().public_bytes_raw() == public
    assert MarketPhase(config).terms.buyer_key == public
    default = market_config_of(ServerSettings.from_run_config({}), DataConfig.from_run_config({}), 1)
    assert default.buyer_key is None
