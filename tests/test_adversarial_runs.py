"""Differencing across runs (issue 21): two markets whose sums differ by one client give its exact counts.

Each test runs real client handlers (``InProcessGrid``, fresh-process semantics) whose nodes keep a release
ledger (:mod:`flmarket_flwr.market.wire.ledger`) in a directory of their own, and plays the server: run 1 with the
victim, run 2 without it (or with it dropped mid-session, or with sybils in its place). Without ledgers the
attack succeeds (``test_adversarial_views.py::test_two_markets_differenced_give_a_victims_counts_not_prevented``
and the first test here); with them run 2 releases nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest
from adversary import NUM_CLASSES, make_counts, market_config, record_of, send
from flwr.clientapp import ClientApp

from flmarket_flwr.market import CostBasedBid, MarketError, MarketPhase, register_market_handlers
from flmarket_flwr.market.node.node_config import NodeSettings
from flmarket_flwr.market.wire.ledger import LEDGER_FILE, ReleaseLedger, RosterHistory, isolates_a_small_group
from flmarket_flwr.market.wire.messages import KEY_ROSTER_NODE_IDS, KEY_ROSTER_WANTED, RECORD_KEY
from flmarket_flwr.pass_protocol import IdentityDirectory, PassServer, generate_identity
from simulations.inprocess_grid import InProcessGrid

LEDGER_REASON = "flmarket: market_mask: refused by the node's release ledger"


def ledger_app(
    counts: Mapping[int, np.ndarray], root: Path, *, signed: bool = False, ledgers: bool = True
) -> tuple[ClientApp, IdentityDirectory | None]:
    """Market handlers whose node ``n`` keeps its ledger in ``root/<n>`` (and, if ``signed``, identity keys)."""
    identities = {node: generate_identity() for node in counts} if signed else {}
    directory = IdentityDirectory({node: public for node, (_, public) in identities.items()}) if signed else None
    app = ClientApp()
    register_market_handlers(
        app,
        lambda context: counts[context.node_id],
        CostBasedBid(0.01),
        settings=lambda context: NodeSettings(
            identity_key=identities[context.node_id][0] if signed else None,
            directory=directory if signed else None,
            release_ledger=ReleaseLedger(root / str(context.node_id)) if ledgers else None,
        ),
    )
    return app, directory


def run(app: ClientApp, counts: Mapping[int, np.ndarray], run_id: int, directory=None, **grid_options):  # type: ignore
    """One market over ``counts``' nodes in Flower run ``run_id``."""
    grid = InProcessGrid(app, list(counts), run_id=run_id, **grid_options)
    return MarketPhase(market_config(directory=directory)).run(grid)


def total(counts: Mapping[int, np.ndarray]) -> list[int]:
    return [int(c) for c in np.sum(list(counts.values()), axis=0)]


def test_without_ledgers_two_runs_difference_to_the_victims_counts(tmp_path: Path) -> None:
    counts = make_counts(6, seed=21)
    victim = sorted(counts)[0]
    app, _ = ledger_app(counts, tmp_path, ledgers=False)
    first = run(app, counts, run_id=1)
    second = run(app, {n: c for n, c in counts.items() if n != victim}, run_id=2)
    assert np.array_equal(np.subtract(first.global_counts, second.global_counts), counts[victim])


@pytest.mark.parametrize("signed", [False, True], ids=["node-ids", "directory"])
def test_with_ledgers_run_two_without_the_victim_releases_nothing(tmp_path: Path, signed: bool) -> None:
    counts = make_counts(6, seed=22)
    victim = sorted(counts)[0]
    app, directory = ledger_app(counts, tmp_path, signed=signed)
    first = run(app, counts, run_id=1, directory=directory)
    assert first.global_counts == total(counts)
    others = {n: c for n, c in counts.items() if n != victim}
    with pytest.raises(MarketError, match="PASS stopped|only") as caught:
        run(app, others, run_id=2, directory=directory)
    assert "global_counts" not in str(caught.value)
    for node in others:  # every client that saw run 1 refused run 2 before its masked counts left
        assert len(ReleaseLedger(tmp_path / str(node)).records()) == 1
    assert len(ReleaseLedger(tmp_path / str(victim)).records()) == 1


def test_the_refusal_reaches_the_server_as_a_ledger_reason(tmp_path: Path) -> None:
    counts = make_counts(7, seed=23)
    victim = sorted(counts)[0]
    app, _ = ledger_app(counts, tmp_path)
    run(app, counts, run_id=1)
    others = {n: c for n, c in counts.items() if n != victim}
    phase = MarketPhase(market_config())
    with pytest.raises(MarketError):
        phase.run(InProcessGrid(app, list(others), run_id=2))
    excluded = phase._excluded  # the reasons the server logged (a failed market returns no outcome)
    assert set(excluded) == set(others)
    # every client refused at mask, and all the server got from it is the generic refusal: no set, no file
    assert all(reason.startswith("market_mask") and reason.endswith(LEDGER_REASON) for reason in excluded.values())


def test_a_victim_dropped_mid_session_is_caught_at_unmask(tmp_path: Path) -> None:
    """Run 2 invites the victim (U1 is run 1's members) and then treats it as dropped: U3 is run 1 minus the victim."""
    counts = make_counts(6, seed=24)
    victim = sorted(counts)[2]
    app, _ = ledger_app(counts, tmp_path)
    run(app, counts, run_id=1)

    def drop_victims_mask(instruction, reply):  # type: ignore[no-untyped-def]
        dropped = instruction.metadata.dst_node_id == victim and instruction.metadata.message_type.endswith("mask")
        return None if dropped else reply

    phase = MarketPhase(market_config(timeout=0.5))
    with pytest.raises(MarketError):
        phase.run(InProcessGrid(app, list(counts), run_id=2, reply_hook=drop_victims_mask))
    refused = {node for node, reason in phase._excluded.items() if "market_unmask: refused by" in reason}
    assert refused == set(counts) - {victim}  # U1 passed the check at mask; U3 failed it at unmask
    for node in counts:
        assert len(ReleaseLedger(tmp_path / str(node)).records()) == 1  # nobody recorded (released) run 2


def test_sybils_in_the_victims_place_do_not_get_its_counts(tmp_path: Path) -> None:
    """Run 2 = run 1 minus the victim plus two nodes whose counts the server knows: the one-sided rule refuses.

    The symmetric difference is 3 (>= min_roster_change), so a rule on it would let this through.
    """
    counts = make_counts(6, seed=25)
    victim = sorted(counts)[0]
    sybils = {9001: np.full(NUM_CLASSES, 7), 9002: np.full(NUM_CLASSES, 5)}
    everyone = {**counts, **sybils}
    app, _ = ledger_app(everyone, tmp_path)
    run(app, counts, run_id=1)
    with pytest.raises(MarketError):
        run(app, {**{n: c for n, c in counts.items() if n != victim}, **sybils}, run_id=2)


def test_the_same_roster_again_and_a_roster_changed_by_three_each_way_are_released(tmp_path: Path) -> None:
    counts = make_counts(9, seed=26)
    nodes = sorted(counts)
    app, _ = ledger_app(counts, tmp_path)
    first = {n: counts[n] for n in nodes[:6]}
    assert run(app, first, run_id=1).global_counts == total(first)
    assert run(app, first, run_id=2).global_counts == total(first)  # the same sum again: nothing new
    moved = {n: counts[n] for n in nodes[:3] + nodes[6:]}  # 3 left, 3 joined: each side is a sum of 3
    assert run(app, moved, run_id=3).global_counts == total(moved)
    assert len(ReleaseLedger(tmp_path / str(nodes[0])).records()) == 3


def test_a_corrupt_ledger_fails_closed_and_keeps_that_node_out_of_the_sum(tmp_path: Path) -> None:
    counts = make_counts(6, seed=27)
    broken = sorted(counts)[1]
    (tmp_path / str(broken)).mkdir()
    (tmp_path / str(broken) / LEDGER_FILE).write_text('{"version": 1, "salt": "zz"', encoding="utf-8")
    app, _ = ledger_app(counts, tmp_path)
    phase = MarketPhase(market_config())
    outcome = phase.run(InProcessGrid(app, list(counts)))
    assert set(outcome.excluded) == {broken}
    assert "refused by the node's release ledger" in outcome.excluded[broken]
    assert outcome.excluded[broken].startswith("market_advertise")  # it refuses at the first step
    assert outcome.global_counts == total({n: c for n, c in counts.items() if n != broken})


def test_a_roster_list_that_does_not_match_the_signed_fingerprint_is_refused(tmp_path: Path) -> None:
    """A ledger client asks for the roster's node ids at advertise and refuses a list it did not sign, at share."""
    counts = make_counts(5, seed=28)
    nodes = sorted(counts)
    app, _ = ledger_app(counts, tmp_path)
    lie = [*nodes[:-1], 424242]  # the list names another node than the fingerprint was made of

    def packed(ids: list[int]) -> bytes:
        return np.asarray(ids, dtype=">u8").tobytes()

    def share_round(roster_ids: object) -> list:
        grid = InProcessGrid(app, nodes)
        server = PassServer(b"ledger/roster", NUM_CLASSES, 10**9, run_id=1)  # the grid's run
        requests = server.advertise_requests(nodes)
        replies = send(grid, "market_advertise", {server.node_of[i]: r.to_record() for i, r in requests.items()})
        adverts = {server.index_of[node]: record_of(reply) for node, reply in replies.items()}
        assert all(advert[KEY_ROSTER_WANTED] is True for advert in adverts.values())
        shares = server.receive_advertisements(adverts)
        extra = {} if roster_ids is None else {KEY_ROSTER_NODE_IDS: roster_ids}
        return list(
            send(
                grid, "market_share", {server.node_of[i]: {**r.to_record(), **extra} for i, r in shares.items()}
            ).values()
        )

    for bad in (packed(lie), nodes, None):
        assert all(reply.has_error() for reply in share_round(bad))
    for reply in share_round(packed(nodes)):
        record_of(reply)


def test_clients_without_a_ledger_are_not_sent_the_roster(tmp_path: Path) -> None:
    """The roster's node ids (8 E bytes) go only to the clients whose ledger asked for them: none here."""
    counts = make_counts(5, seed=29)
    app = ClientApp()
    register_market_handlers(app, lambda context: counts[context.node_id], CostBasedBid(1.0, 0.2))
    sent: list[dict] = []

    class Recording(InProcessGrid):
        def push_messages(self, messages):  # type: ignore[no-untyped-def]
            sent.extend(dict(m.content.config_records[RECORD_KEY]) for m in messages)
            return super().push_messages(messages)

    MarketPhase(market_config(budget=10**6)).run(Recording(app, sorted(counts)))
    assert sent and not any(KEY_ROSTER_NODE_IDS in record for record in sent)


def test_three_runs_over_a_partition_still_isolate_a_client_not_prevented(tmp_path: Path) -> None:
    """Not prevented (README): runs over X, over Y and over {v} + X + Y pass every client's pairwise check.

    Each X client saw runs 1 and 3 (3 left the other way: v and Y), each Y client runs 2 and 3; nobody saw all
    three, so no per-client rule can refuse. Noise on the counts makes the difference inexact:
    ``test_pass_noise.py::test_three_runs_over_a_partition_no_longer_isolate_a_client``.
    """
    counts = make_counts(7, seed=29)
    victim, *rest = sorted(counts)
    x, y = rest[:3], rest[3:]
    app, _ = ledger_app(counts, tmp_path)
    first = run(app, {n: counts[n] for n in x}, run_id=1)
    second = run(app, {n: counts[n] for n in y}, run_id=2)
    third = run(app, counts, run_id=3)
    difference = np.subtract(np.subtract(third.global_counts, first.global_counts), second.global_counts)
    assert np.array_equal(difference, counts[victim])


def test_the_apps_clients_keep_the_ledger_named_by_their_node_config(tmp_path: Path) -> None:
    """The Flower app path: ``market-ledger-dir`` in each SuperNode's node config turns the ledger on."""
    from flmarket_flwr.app.client_app import build_client_app

    nodes = [101, 202, 303, 404, 505]

    def grid(members: list[int], run_id: int) -> InProcessGrid:
        configs = {
            node: {
                "partition-id": nodes.index(node),
                "num-partitions": len(nodes),
                "market-ledger-dir": str(tmp_path / f"ledger-{node}"),
            }
            for node in members
        }
        return InProcessGrid(build_client_app(), members, node_configs=configs, run_id=run_id)

    first = MarketPhase(market_config(budget=10_000.0)).run(grid(nodes, run_id=1))
    assert first.pass_participants == nodes
    phase = MarketPhase(market_config(budget=10_000.0))
    with pytest.raises(MarketError):
        phase.run(grid(nodes[1:], run_id=2))
    assert all(LEDGER_REASON in reason for reason in phase._excluded.values())
    for node in nodes:
        assert len(ReleaseLedger(tmp_path / f"ledger-{node}").records()) == 1


def test_a_buyer_that_plans_its_roster_gets_run_two_released_over_fewer_clients(tmp_path: Path) -> None:
    """The honest buyer's side: with a roster history, run 2 leaves out the victim's group of 3, not the market."""
    counts = make_counts(8, seed=30)
    victim = sorted(counts)[0]
    app, _ = ledger_app(counts, tmp_path / "nodes")
    history = RosterHistory(tmp_path / "buyer" / "history.json")
    first = MarketPhase(market_config(roster_history=history)).run(InProcessGrid(app, list(counts), run_id=1))
    assert history.releases() == [frozenset(first.pass_participants)]
    others = [n for n in counts if n != victim]
    phase = MarketPhase(market_config(roster_history=history))
    second = phase.run(InProcessGrid(app, others, run_id=2))
    assert len(second.pass_participants) == len(others) - 2  # the victim and two more: a group of 3
    left_out = sorted(set(others) - set(second.pass_participants))
    assert all(phase._excluded[node].startswith("roster: sits out") for node in left_out)
    assert second.global_counts == total({n: counts[n] for n in second.pass_participants})
    assert not isolates_a_small_group(frozenset(first.pass_participants), frozenset(second.pass_participants), 3)
    assert history.releases() == [frozenset(first.pass_participants), frozenset(second.pass_participants)]
    for node in left_out:  # they were sent nothing: their ledgers still hold run 1 only
        assert [r.run_id for r in ReleaseLedger(tmp_path / "nodes" / str(node)).records()] == [1]


def test_without_a_roster_history_the_same_run_two_is_refused(tmp_path: Path) -> None:
    """The history is what turns the refusal into clients left out (the same nodes and ledgers as above)."""
    counts = make_counts(8, seed=30)
    app, _ = ledger_app(counts, tmp_path)
    run(app, counts, run_id=1)
    with pytest.raises(MarketError):
        run(app, {n: c for n, c in counts.items() if n != sorted(counts)[0]}, run_id=2)


def test_an_unreadable_roster_history_stops_the_market_before_any_message(tmp_path: Path) -> None:
    counts = make_counts(5, seed=31)
    app, _ = ledger_app(counts, tmp_path / "nodes")
    path = tmp_path / "history.json"
    path.write_text("{not json", encoding="utf-8")
    grid = InProcessGrid(app, list(counts), run_id=1)
    with pytest.raises(MarketError, match="roster history .*history.json is unreadable"):
        MarketPhase(market_config(roster_history=RosterHistory(path))).run(grid)
    for node in counts:  # nobody was asked for anything, so nobody recorded a release
        assert ReleaseLedger(tmp_path / "nodes" / str(node)).records() == []


def test_the_server_app_reads_the_roster_history_from_the_run_config(tmp_path: Path) -> None:
    from flmarket_flwr.app.server_app import ServerSettings, market_config_of
    from flmarket_flwr.app.task import DataConfig

    path = tmp_path / "history.json"
    settings = ServerSettings.from_run_config({"roster-history": str(path)})
    config = market_config_of(settings, DataConfig.from_run_config({}), run_id=1)
    assert isinstance(config.roster_history, RosterHistory) and config.roster_history.path == path
    default = market_config_of(ServerSettings.from_run_config({}), DataConfig.from_run_config({}), 1)
    assert default.roster_history is None


def test_the_release_is_recorded_before_the_unmask_shares_leave_and_a_failed_write_sends_none(tmp_path: Path) -> None:
    """Write-ahead: when a node's unmask reply leaves, its ledger already holds the release; if the write fails
    the node refuses (no shares), and PASS finishes without its shares."""
    from flmarket_flwr.market.wire.ledger import LedgerError

    counts = make_counts(6, seed=32)
    full = sorted(counts)[2]

    class FullDisk(ReleaseLedger):
        def record_release(self, run_id: int, session: bytes, members) -> None:  # type: ignore[no-untyped-def]
            raise LedgerError(f"{self.path}: no space left on device")

    app = ClientApp()
    register_market_handlers(
        app,
        lambda context: counts[context.node_id],
        CostBasedBid(0.01),
        settings=lambda context: NodeSettings(
            release_ledger=(FullDisk if context.node_id == full else ReleaseLedger)(tmp_path / str(context.node_id))
        ),
    )
    recorded_when_sent: dict[int, bool] = {}

    def watch(instruction, reply):  # type: ignore[no-untyped-def]
        node = instruction.metadata.dst_node_id
        if instruction.metadata.message_type == "query.market_unmask" and not reply.has_error():
            recorded_when_sent[node] = [r.run_id for r in ReleaseLedger(tmp_path / str(node)).records()] == [7]
        return reply

    phase = MarketPhase(market_config())
    outcome = phase.run(InProcessGrid(app, list(counts), run_id=7, reply_hook=watch))
    assert recorded_when_sent == {node: True for node in counts if node != full}
    assert outcome.excluded[full].startswith("market_unmask") and set(outcome.excluded) == {full}
    assert outcome.global_counts == total(counts)  # its masked input is in; its self-mask came from the others


@pytest.mark.parametrize("signed", [False, True], ids=["node-ids", "directory"])
def test_a_sybil_under_the_victims_node_id_passes_the_ledgers_only_without_a_directory(
    tmp_path: Path, signed: bool
) -> None:
    """Members are labels: without a directory the server (it runs the SuperLink) can present a node of its own
    under the victim's node id in run 2; the ledgers see run 1's members again and release, and the difference
    is the victim's counts minus the sybil's, which the server knows. With a directory the sybil lacks the
    victim's identity key: its advert is refused and the ledgers refuse run 2."""
    counts = make_counts(6, seed=33)
    victim = sorted(counts)[0]
    sybil_counts = np.full(NUM_CLASSES, 9)
    identities = {node: generate_identity() for node in counts}
    directory = IdentityDirectory({node: public for node, (_, public) in identities.items()})
    impostor_key, _ = generate_identity()

    def app_for(run: int) -> ClientApp:
        def is_sybil(context) -> bool:  # type: ignore[no-untyped-def]
            return run == 2 and context.node_id == victim

        app = ClientApp()
        register_market_handlers(
            app,
            lambda context: sybil_counts if is_sybil(context) else counts[context.node_id],
            CostBasedBid(0.01),
            settings=lambda c: NodeSettings(
                identity_key=(impostor_key if is_sybil(c) else identities[c.node_id][0]) if signed else None,
                directory=directory if signed else None,
                release_ledger=None if is_sybil(c) else ReleaseLedger(tmp_path / str(c.node_id)),
            ),
        )
        return app

    first = run(app_for(1), counts, run_id=1, directory=directory if signed else None)
    if not signed:
        second = run(app_for(2), counts, run_id=2)
        assert second.pass_participants == first.pass_participants  # "the same members again": released
        difference = np.subtract(first.global_counts, second.global_counts) + sybil_counts
        assert np.array_equal(difference, counts[victim])
    else:
        phase = MarketPhase(market_config(directory=directory))
        with pytest.raises(MarketError):
            phase.run(InProcessGrid(app_for(2), list(counts), run_id=2))
        assert "does not verify" in phase._excluded[victim]  # the impostor's advert
        others = {reason for node, reason in phase._excluded.items() if node != victim}
        assert others and all(reason.endswith(LEDGER_REASON) for reason in others)
