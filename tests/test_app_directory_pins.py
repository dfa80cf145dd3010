"""The buyer plays the directory: it writes the identity directory each node reads and seats a victim among sybils.

Five nodes; node 101 is the victim, run by the app (``build_client_app``) with every roster defence on (complete
graph, a roster floor of the whole federation, a release ledger). The other node ids are the buyer's sybils: app
nodes whose identity keys and counts the buyer holds. With a directory the buyer wrote and the victim does not pin,
the market completes and ``N_s`` minus the sybils' counts is the victim's counts. A victim that pins the directory
it trusts (its digest, or the key of a third party that signs it) refuses the buyer's directory, and with the
honest directory in place it refuses the sybils' keys: either way it sends no share and no masked input.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from flmarket_flwr.app.client_app import build_client_app, label_counts
from flmarket_flwr.market import MarketConfig, MarketError, MarketOutcome, MarketPhase
from flmarket_flwr.pass_protocol import IdentityDirectory, generate_identity, save_identity_key
from simulations.inprocess_grid import InProcessGrid

NODES = [101, 202, 303, 404, 505]
VICTIM = 101
SYBILS = NODES[1:]


@dataclass
class Federation:
    """The honest nodes' keys and directory (signed by a third party), and the buyer's sybil keys and forgery."""

    tmp_path: Path
    honest: IdentityDirectory
    authority: bytes
    forged: IdentityDirectory
    buyer: bytes

    @property
    def path(self) -> Path:
        """The directory file each node's config names (what the buyer can write, unless pinned)."""
        return self.tmp_path / "directory.json"

    def pem(self, owner: str, node: int) -> str:
        return str(self.tmp_path / f"{owner}-{node}.pem")

    def node_config(self, node: int, owner: str, pins: dict[str, object]) -> dict[str, object]:
        """An honest node's config reads :attr:`path`; a sybil's reads the buyer's own copy of its forgery."""
        if owner == "buyer":
            (self.tmp_path / "buyer-directory.json").write_text(self.forged.to_json(), encoding="utf-8")
        return {
            "partition-id": NODES.index(node),
            "num-partitions": len(NODES),
            "identity-key": self.pem(owner, node),
            "identity-directory": str(self.tmp_path / "buyer-directory.json" if owner == "buyer" else self.path),
            **pins,
        }


def federation(tmp_path: Path) -> Federation:
    publics, sybil_publics = {}, {}
    for node in NODES:
        publics[node] = save_identity_key(generate_identity()[0], tmp_path / f"honest-{node}.pem")
        sybil_publics[node] = save_identity_key(generate_identity()[0], tmp_path / f"buyer-{node}.pem")
    authority, authority_public = generate_identity()
    buyer, buyer_public = generate_identity()
    honest = IdentityDirectory(publics).signed_by(authority)
    forged = IdentityDirectory({VICTIM: publics[VICTIM], **{node: sybil_publics[node] for node in SYBILS}})
    return Federation(tmp_path, honest, authority_public, forged.signed_by(buyer), buyer_public)


def victim_defences(tmp_path: Path) -> dict[str, object]:
    """Every roster defence of the victim's node config (docs/threat-model.md)."""
    return {
        "pass-complete-graph": True,
        "pass-min-participants": len(NODES),
        "market-ledger-dir": str(tmp_path / "victim-ledger"),
    }


def pins(fed: Federation, pin: str) -> dict[str, object]:
    if pin == "digest":
        return {"identity-directory-digest": fed.honest.digest().hex()}
    if pin == "signer":
        return {"identity-directory-signer": fed.authority.hex()}
    return {"identity-directory-unpinned": True}


def attack(fed: Federation, victim_pins: dict[str, object], written: IdentityDirectory) -> tuple[InProcessGrid, Any]:
    """The buyer's market: ``written`` in the directory file, the sybils under the other node ids."""
    fed.path.write_text(written.to_json(), encoding="utf-8")
    configs = {node: fed.node_config(node, "buyer", {"identity-directory-unpinned": True}) for node in SYBILS}
    configs[VICTIM] = fed.node_config(VICTIM, "honest", {**victim_defences(fed.tmp_path), **victim_pins})
    grid = InProcessGrid(build_client_app(), NODES, node_configs=configs)
    config = MarketConfig(budget=10_000.0, num_classes=10, directory=fed.forged, neighbours="all", poll_interval=0.01)
    try:
        return grid, MarketPhase(config).run(grid)
    except MarketError as error:  # fewer than PASS needs: nothing released
        return grid, error


def counts_of(node: int) -> np.ndarray:
    """A node's label counts, as its app computes them (the buyer knows its sybils')."""
    context = Context(1, node, {"partition-id": NODES.index(node), "num-partitions": len(NODES)}, RecordDict(), {})
    return np.asarray(label_counts(context), dtype=np.int64)


def pass_rounds_of_victim(grid: InProcessGrid) -> set[str]:
    """The PASS and bid rounds the victim answered without an error (the award names no counts)."""
    return {
        reply.metadata.message_type
        for reply in grid.received
        if reply.metadata.src_node_id == VICTIM and not reply.has_error()
    } - {"query.market_award"}


def test_without_a_pin_the_buyers_directory_seats_the_victim_among_sybils(tmp_path: Path) -> None:
    """The bug, reproduced: every roster defence on, and the buyer reads the victim's counts exactly."""
    fed = federation(tmp_path)
    _, outcome = attack(fed, pins(fed, "unpinned"), fed.forged)
    assert isinstance(outcome, MarketOutcome) and outcome.pass_participants == NODES
    recovered = np.asarray(outcome.global_counts) - sum(counts_of(node) for node in SYBILS)
    assert np.array_equal(recovered, counts_of(VICTIM))


@pytest.mark.parametrize("pin", ["digest", "signer"])
def test_a_node_that_pins_refuses_the_directory_the_buyer_wrote(
    tmp_path: Path, pin: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The buyer's directory (re-signed with its own key) fails the victim's pin: the victim reads the directory
    with its settings before its first step and leaves at the advertise round, before it makes a session key, so it
    never sends a key, a share or a masked input. Its own log names the pin."""
    fed = federation(tmp_path)
    grid, outcome = attack(fed, pins(fed, pin), fed.forged)
    assert isinstance(outcome, MarketOutcome)
    assert VICTIM not in outcome.pass_participants and outcome.excluded[VICTIM].startswith("market_advertise")
    assert pass_rounds_of_victim(grid) == set()
    assert f"node-config identity-directory-{pin}" in caplog.text and f"the pinned {pin} " in caplog.text
    assert "identity-directory" not in outcome.excluded[VICTIM]  # the server gets a generic reason


@pytest.mark.parametrize("pin", ["digest", "signer"])
def test_with_the_pinned_honest_directory_the_sybils_do_not_get_the_victims_counts(
    tmp_path: Path, pin: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The honest directory in place (the buyer cannot alter it unseen): the sybils' keys fail the victim's check of
    their signed adverts, so it sends no share; the same victim among the honest nodes takes part."""
    fed = federation(tmp_path)
    grid, outcome = attack(fed, pins(fed, pin), fed.honest)
    assert isinstance(outcome, MarketOutcome)
    assert VICTIM not in outcome.pass_participants and outcome.excluded[VICTIM].startswith("market_share")
    assert pass_rounds_of_victim(grid) == {"query.market_advertise"}
    assert "advertisement of node 202 (index 2) does not verify" in caplog.text

    fed.path.write_text(fed.honest.to_json(), encoding="utf-8")
    configs = {node: fed.node_config(node, "honest", pins(fed, pin)) for node in SYBILS}
    configs[VICTIM] = fed.node_config(VICTIM, "honest", {**victim_defences(tmp_path / "honest"), **pins(fed, pin)})
    honest_grid = InProcessGrid(build_client_app(), NODES, node_configs=configs)
    config = MarketConfig(budget=10_000.0, num_classes=10, directory=fed.honest, neighbours="all", poll_interval=0.01)
    honest = MarketPhase(config).run(honest_grid)
    assert honest.pass_participants == NODES and not honest.excluded
    assert np.array_equal(honest.global_counts, sum(counts_of(node) for node in NODES))
