"""The secure profile with a directory keyed by member (``identity_cli make --members``): what Flower's simulation
needs, whose node ids are drawn afresh each run while each node holds its partition. Each node proves which member
it is for this run and node id with that member's own key; the buyer binds and every node checks the bindings
itself, so a buyer that writes, swaps or skips them gets no count, and a member cannot sit under two node ids."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from adversary import make_counts
from flwr.app import Context, RecordDict
from test_secure_profile_market import drop_in_app, secure_config

from flmarket_flwr.market import MarketError, MarketPhase
from flmarket_flwr.market.buyer import server
from flmarket_flwr.market.node.node_config import NODE_CONFIG_ENV, node_config_of, read_node_settings
from flmarket_flwr.market.wire.messages import ACTION_BIND, ACTION_MASK
from flmarket_flwr.pass_protocol import IdentityDirectory, generate_identity, load_identity_key, save_identity_key
from flmarket_flwr.pass_protocol.identity import (
    bind_members,
    pack_member_bindings,
    sign_member_binding,
    unpack_member_bindings,
)
from flmarket_flwr.pass_protocol.identity_cli import main as identity_cli
from simulations.inprocess_grid import InProcessGrid

RUN = 1  # InProcessGrid's run id


@pytest.fixture(autouse=True)
def ledger_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "flmarket-home"
    monkeypatch.setenv("FLMARKET_HOME", str(home))
    return home


def consortium(folder: Path, members: int) -> tuple[IdentityDirectory, str]:
    """The consortium's steps, with the documented commands: a key per member, the directory keyed by member, its
    digest (what each node pins)."""
    entries = []
    for member in range(members):
        key = folder / f"member-{member}.pem"
        private, public = generate_identity()
        save_identity_key(private, key)
        entries.append(f"{member}={public.hex()}")
    assert identity_cli(["make", "--members", str(folder / "directory.json"), *entries]) == 0
    directory = IdentityDirectory.from_json(folder / "directory.json")
    return directory, directory.digest().hex()


def member_configs(folder: Path, nodes: list[int], digest: str, members: list[int] | None = None) -> dict:
    """Each node's node config: the profile, its member's key and number (node ``i`` is member ``i``)."""
    return {
        node: {
            "market-security": "malicious",
            "identity-key": str(folder / f"member-{member}.pem"),
            "identity-directory": str(folder / "directory.json"),
            "identity-directory-digest": digest,
            "identity-member": member,
        }
        for node, member in zip(nodes, members if members is not None else range(len(nodes)), strict=True)
    }


def test_the_directory_pins_its_keying_and_a_binding_is_the_members_own_for_one_run(tmp_path: Path) -> None:
    directory, digest = consortium(tmp_path, 3)
    assert directory.by_member and directory.members == 3
    by_node = IdentityDirectory(dict(directory))
    assert by_node.digest() != directory.digest()  # a node pinning the digest pins the keying too
    with pytest.raises(ValueError, match="bind its members"):
        directory.key_of(0)
    keys = {m: load_identity_key(tmp_path / f"member-{m}.pem") for m in range(3)}
    raw = bytes.fromhex(digest)
    bindings = {500 + m: (m, sign_member_binding(keys[m], RUN, 500 + m, m, raw)) for m in range(2)}
    bound = bind_members(directory, bindings, RUN)
    assert dict(bound) == {500: directory[0], 501: directory[1]} and bound.members == 3 and not bound.by_member
    assert unpack_member_bindings(pack_member_bindings(bindings)) == bindings
    with pytest.raises(ValueError, match="does not verify"):  # replayed into another run
        bind_members(directory, bindings, RUN + 1)
    with pytest.raises(ValueError, match="does not verify"):  # moved to another node id
        bind_members(directory, {777: bindings[500]}, RUN)
    twice = {**bindings, 502: (0, sign_member_binding(keys[0], RUN, 502, 0, raw))}
    with pytest.raises(ValueError, match="member 0 is bound to two node ids"):
        bind_members(directory, twice, RUN)
    with pytest.raises(ValueError, match="member 9, which the directory does not list"):
        bind_members(directory, {503: (9, bindings[500][1])}, RUN)


def test_a_market_binds_the_members_and_pays_its_winners(tmp_path: Path) -> None:
    counts = make_counts(8, seed=21)
    nodes = sorted(counts)
    directory, digest = consortium(tmp_path, len(nodes))
    grid = InProcessGrid(drop_in_app(counts), nodes, node_configs=member_configs(tmp_path, nodes, digest))
    outcome = MarketPhase(secure_config(directory)).run(grid)
    assert outcome.status == "succeeded" and outcome.winners and outcome.excluded == {}
    assert sorted(outcome.pass_participants) == nodes
    assert outcome.global_counts != [int(c) for c in np.sum([counts[n] for n in nodes], axis=0)]  # noise on
    binds = [m for m in grid.sent if m.metadata.message_type == f"query.{ACTION_BIND}"]
    assert len(binds) == 2 * len(nodes)  # asked, then sent every binding


def test_a_node_whose_key_is_not_its_members_and_a_member_claimed_twice_are_left_out(tmp_path: Path) -> None:
    counts = make_counts(9, seed=22)
    nodes = sorted(counts)
    directory, digest = consortium(tmp_path, len(nodes))
    members = list(range(len(nodes)))
    configs = member_configs(tmp_path, nodes, digest, members)
    configs[nodes[0]]["identity-member"] = 8  # claims member 8 with member 0's key: its binding does not verify
    configs[nodes[1]] |= {"identity-member": 2, "identity-key": str(tmp_path / "member-2.pem")}  # a second node-2
    grid = InProcessGrid(drop_in_app(counts), nodes, node_configs=configs)
    outcome = MarketPhase(secure_config(directory)).run(grid)
    assert outcome.status == "succeeded"
    assert outcome.excluded[nodes[0]].startswith(f"{ACTION_BIND}: binding of node {nodes[0]} to member 8")
    assert "member 2 is claimed by nodes" in outcome.excluded[nodes[1]]
    assert "member 2 is claimed by nodes" in outcome.excluded[nodes[2]]
    assert sorted(outcome.pass_participants) == nodes[3:]


def test_a_buyer_that_swaps_the_bindings_gets_no_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The buyer shows every node the bindings with two members' node ids swapped (it holds no member key to sign
    new ones): each node checks them itself and refuses; no PASS message follows."""
    counts = make_counts(7, seed=23)
    nodes = sorted(counts)
    directory, digest = consortium(tmp_path, len(nodes))
    grid = InProcessGrid(drop_in_app(counts), nodes, node_configs=member_configs(tmp_path, nodes, digest))

    def swapped(bindings: dict) -> bytes:
        a, b = nodes[0], nodes[1]
        return pack_member_bindings({**bindings, a: bindings[b], b: bindings[a]})

    monkeypatch.setattr(server, "pack_member_bindings", swapped)
    with pytest.raises(MarketError, match="the nodes that hold the bindings: only 0 client"):
        MarketPhase(secure_config(directory)).run(grid)
    assert not [m for m in grid.sent if m.metadata.message_type.startswith("query.market_advertise")]


def test_a_buyer_that_skips_the_bind_step_gets_no_masked_count(tmp_path: Path) -> None:
    """The buyer writes its own node-id directory from the members' public keys and never binds: the nodes check
    their neighbours against an empty bound directory, refuse at the share round, and send no masked input."""
    counts = make_counts(7, seed=24)
    nodes = sorted(counts)
    directory, digest = consortium(tmp_path, len(nodes))
    written = IdentityDirectory({node: directory[member] for member, node in enumerate(nodes)})
    grid = InProcessGrid(drop_in_app(counts), nodes, node_configs=member_configs(tmp_path, nodes, digest))
    with pytest.raises(MarketError) as caught:
        MarketPhase(secure_config(written)).run(grid)
    assert not [m for m in grid.sent if m.metadata.message_type == f"query.{ACTION_BIND}"]
    assert not [m for m in grid.sent if m.metadata.message_type == f"query.{ACTION_MASK}"]
    outcome = caught.value.outcome
    assert outcome is not None and outcome.global_counts == [] and outcome.pass_participants == []
    assert all(reason.startswith("market_share") for reason in outcome.excluded.values()), outcome.excluded


def test_the_simulation_template_gives_each_node_its_member(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory, digest = consortium(tmp_path, 3)
    template = (
        f"market-security='malicious' identity-key='{tmp_path}/member-{{partition-id}}.pem' "
        f"identity-directory='{tmp_path}/directory.json' identity-directory-digest='{digest}' "
        "identity-member='{partition-id}' pass-colluders=1"
    )
    monkeypatch.setenv(NODE_CONFIG_ENV, template)
    context = Context(RUN, 42, {"partition-id": 2, "num-partitions": 3}, RecordDict(), {})
    assert node_config_of(context)["identity-key"] == f"{tmp_path}/member-2.pem"
    settings = read_node_settings(context)
    assert settings.secure and settings.member == 2 and settings.member_directory == directory
    assert settings.directory is not None and len(settings.directory) == 0 and settings.directory.members == 3
    assert settings.colluders == 1
    monkeypatch.setenv(NODE_CONFIG_ENV, "num-rounds=3")
    with pytest.raises(ValueError, match=r"names \['num-rounds'\], which are not market node-config keys"):
        read_node_settings(context)
    monkeypatch.setenv(NODE_CONFIG_ENV, "identity-key='{unknown}'")
    with pytest.raises(ValueError, match="is not in this node's node config"):
        read_node_settings(context)
