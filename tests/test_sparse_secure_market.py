"""The sparse secure profile in the market (issue 40): drop-in nodes in the secure profile, configured by their node
config alone, meet a buyer whose profile picks the sparse secure mode of PASS by itself above the parameter finder's
threshold. An honest market runs it and pays its winners; a buyer that announces weaker settings, grinds placements
over more sessions than the settings' bound counts, or shows an award endorsed by a quorum of a survivor set instead
of the pinned directory, gets nothing from it."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from adversary import NUM_CLASSES, make_counts
from flwr.app import Message
from test_award import MaliciousPhase, _AttackDone, audit_oracle
from test_secure_profile_market import drop_in_app, profile_setup, secure_config

from flmarket_flwr.market import MarketConfig, MarketError, MarketPhase
from flmarket_flwr.market.buyer.transport import exchange
from flmarket_flwr.market.node.client import read_award
from flmarket_flwr.market.node.node_config import read_node_settings
from flmarket_flwr.market.wire import ledger as ledger_module
from flmarket_flwr.market.wire.award import binding_quorum, pack_endorsements, unpack_endorsements
from flmarket_flwr.market.wire.ledger import DrawAllowance
from flmarket_flwr.market.wire.messages import (
    ACTION_ADVERTISE,
    ACTION_AUDIT,
    ACTION_AWARD,
    ACTION_DRAW,
    ACTION_MASK,
    ACTION_SHARE,
    RECORD_KEY,
    AwardRequest,
    message_type,
    read_config,
)
from flmarket_flwr.market.wire.records import config_record
from flmarket_flwr.pass_protocol import IdentityDirectory, generate_identity
from flmarket_flwr.pass_protocol.messages import AdvertiseRequest
from flmarket_flwr.pass_protocol.server import PassServer
from flmarket_flwr.pass_protocol.sparse_secure import (
    SPARSE_NEIGHBOUR_SHARE_MAX,
    SparseSecureSettings,
    neighbour_share,
)
from flmarket_flwr.pass_protocol.sparse_server import SparseSecureServer
from simulations.inprocess_grid import InProcessGrid

NODES = 30
COLLUDERS = 1
"""At E = 30 with one colluder stated (floor 20, two thirds of the directory), the finder's out-degree is 26 of 29:
the smallest federation the sparse mode runs on at a test's cost. The profile's default, a fifth, needs the complete
graph up to E = 3,000 (docs/threat-model.md)."""


pytestmark = pytest.mark.usefixtures("ledger_home")


def sparse_federation(
    tmp_path: Path,
    num_nodes: int = NODES,
    seed: int = 40,
    grid_type: type[InProcessGrid] = InProcessGrid,
    **node_config: Any,
) -> tuple[Any, IdentityDirectory, dict[int, np.ndarray], dict[int, dict[str, Any]]]:
    """Drop-in nodes in the secure profile stating ``pass-colluders`` (and ``node_config``), the directory, their
    counts and their node configs."""
    counts = make_counts(num_nodes, seed=seed)
    configs, directory = profile_setup(tmp_path, sorted(counts))
    for config in configs.values():
        config.update({"pass-colluders": COLLUDERS, **node_config})
    grid = grid_type(drop_in_app(counts), sorted(counts), node_configs=configs)
    return grid, directory, counts, configs


def sparse_config(directory: IdentityDirectory, **overrides: Any) -> MarketConfig:
    """The buyer stating ``COLLUDERS`` and taking the sparse mode (``neighbours="sparse"``): at E = 30 it costs more
    than the complete graph (``k = 26`` of 29), so ``"auto"`` would not
    (``test_the_profile_picks_the_cheaper_graph``)."""
    return secure_config(directory, **({"pass_colluders": COLLUDERS, "neighbours": "sparse"} | overrides))


def sent_types(grid: InProcessGrid) -> Counter[str]:
    return Counter(m.metadata.message_type for m in grid.sent)


def test_the_profile_runs_the_sparse_mode_above_the_finders_threshold_and_pays_its_winners(tmp_path: Path) -> None:
    grid, directory, counts, _ = sparse_federation(tmp_path)
    config = sparse_config(directory)
    assert config.runs_sparse(NODES) and config.sparse_settings is not None
    k = config.sparse_settings.parameters(NODES).degree
    assert k < NODES - 1
    outcome = MarketPhase(config).run(grid)
    assert outcome.status == "succeeded" and outcome.winners and outcome.excluded == {}
    assert sent_types(grid)[message_type(ACTION_DRAW)] == NODES  # each client drew its own out-neighbours
    exact = np.sum([counts[node] for node in sorted(counts)], axis=0)
    assert outcome.global_counts != [int(c) for c in exact]  # each node added its noise
    assert np.all(np.abs(np.asarray(outcome.global_counts) - exact) <= config.noise_tolerance)
    for node in counts:
        award = read_award(grid.context(node))
        assert award is not None and award.award is not None  # every node holds the receipt
    winners = set(outcome.winners)
    assert winners == {m.metadata.dst_node_id for m in grid.sent if m.metadata.message_type.endswith("market_audit")}


def test_each_client_deals_shares_to_k_out_neighbours_only(tmp_path: Path) -> None:
    """The share replies carry one ciphertext per out-neighbour: ``k`` of them, not ``E - 1``."""
    grid, directory, _, _ = sparse_federation(tmp_path)
    config = sparse_config(directory)
    k = config.sparse_settings.parameters(NODES).degree  # type: ignore[union-attr]
    receivers = ReplyLog(grid, ACTION_SHARE)
    MarketPhase(config).run(grid)
    assert receivers.lengths("receivers") == [k] * NODES


def test_below_the_threshold_or_with_all_the_profile_keeps_the_complete_graph(tmp_path: Path) -> None:
    """At the profile's default colluders (a fifth) E = 12 needs the complete graph; ``neighbours='all'`` always
    takes it, and ``'auto'`` where the sparse mode would cost more: no draw request goes out, and the nodes, which
    accept both, take part."""
    for config_of in (
        lambda d: secure_config(d),  # the default colluders: the finder says complete
        lambda d: sparse_config(d, neighbours="all"),
        lambda d: sparse_config(d, neighbours="auto"),  # k = 9 of 11 at one colluder: dearer than the complete graph
    ):
        grid, directory, _, _ = sparse_federation(tmp_path, num_nodes=12, seed=41, **{"pass-colluders": 1})
        config = config_of(directory)
        assert not config.runs_sparse(12)
        outcome = MarketPhase(config).run(grid)
        assert outcome.status == "succeeded" and message_type(ACTION_DRAW) not in sent_types(grid)


def test_a_buyer_announcing_weaker_settings_than_the_nodes_gets_no_key(tmp_path: Path) -> None:
    """The nodes state two colluders; the buyer announces one (degrees too small for two): refused at advertise."""
    grid, directory, _, _ = sparse_federation(tmp_path, **{"pass-colluders": 2})
    with pytest.raises(MarketError):
        MarketPhase(sparse_config(directory)).run(grid)
    types = sent_types(grid)
    assert types[message_type(ACTION_ADVERTISE)] == NODES
    assert message_type(ACTION_DRAW) not in types and message_type(ACTION_MASK) not in types


def test_a_node_with_pass_complete_graph_refuses_the_sparse_mode(tmp_path: Path) -> None:
    grid, directory, _, _ = sparse_federation(tmp_path, **{"pass-complete-graph": True})
    assert read_node_settings(grid.context(next(iter(grid.get_node_ids())))).sparse is None
    with pytest.raises(MarketError):
        MarketPhase(sparse_config(directory)).run(grid)
    assert message_type(ACTION_DRAW) not in sent_types(grid)


def test_the_node_settings_of_the_sparse_mode(tmp_path: Path) -> None:
    """In the profile a node holds settings for the sparse mode (its colluders, floor, dropout, re-runs, security
    bits); ``pass-reruns`` defaults to its colluders, as the buyer's ``pass_reruns`` to its ``pass_colluders``."""
    grid, directory, _, _ = sparse_federation(tmp_path, num_nodes=12, seed=42)
    settings = read_node_settings(grid.context(grid.get_node_ids()[0]))
    assert settings.sparse == SparseSecureSettings.of(
        colluders=COLLUDERS, roster_floor=8, dropout=0.05, reruns=COLLUDERS, security_bits=40, markets=65_536
    )
    assert settings.draw_allowance == DrawAllowance(COLLUDERS + 1, (COLLUDERS + 1) * 65_536, 3600.0)
    config = sparse_config(directory)
    assert config.sparse_settings == settings.sparse and config.pass_reruns == COLLUDERS
    assert config.sparse_settings is not None and not config.sparse_settings.weaker_than(settings.sparse)


# --- Placement ground over re-runs ---------------------------------------------------------------------------------
class SparseBuyer:
    """A buyer that drives the sparse mode's rounds itself, to stop each session where it likes and start another."""

    def __init__(self, grid: InProcessGrid, directory: IdentityDirectory, settings: SparseSecureSettings) -> None:
        self.grid, self.directory, self.settings = grid, directory, settings
        self.sessions = 0

    def session(self, nodes: list[int], until: str) -> dict[int, Any]:
        """One fresh session up to ``until`` (``draw`` or ``mask``); the replies of that round, by node id."""
        self.sessions += 1
        server = self.server(b"grind-%d" % self.sessions)
        requests: Mapping[int, Any] = server.advertise_requests(nodes)
        replies = self._round(server, ACTION_ADVERTISE, requests)
        requests = server.receive_advertisements(replies)
        replies = self._round(server, ACTION_DRAW, requests)
        if until == "draw":
            return {server.node_of[i]: reply for i, reply in replies.items()}
        requests = server.receive_shares(self._round(server, ACTION_SHARE, server.receive_draws(replies)))
        replies = self._round(server, ACTION_MASK, requests)
        return {server.node_of[i]: reply for i, reply in replies.items()}

    def server(self, session: bytes) -> SparseSecureServer:
        """The sparse mode's server for one session, at :attr:`settings`."""
        return SparseSecureServer(
            session,
            NUM_CLASSES,
            10**9,
            settings=self.settings,
            directory=self.directory,
            run_id=int(self.grid.run.run_id),
        )

    def abort(self, nodes: list[int]) -> int:
        """Close the market under way with an abort (an award message naming the last session, no award): the nodes
        that took it, each then free to join a re-launched market of the run."""
        session = b"grind-%d" % self.sessions
        records = {node: config_record(AwardRequest(session).to_record()) for node in nodes}
        replies = exchange(self.grid, ACTION_AWARD, records, timeout=30.0)
        return sum(not reply.has_error() for reply in replies.values())

    def _round(self, server: SparseSecureServer, action: str, requests: Mapping[int, Any]) -> dict[int, Any]:
        records = {server.node_of[i]: config_record(r.to_record()) for i, r in requests.items()}
        replies = exchange(self.grid, action, records, timeout=30.0)
        return {
            server.index_of[node]: dict(read_config(reply).items())
            for node, reply in replies.items()
            if not reply.has_error()
        }


def grinding_buyer(tmp_path: Path) -> tuple[SparseBuyer, list[int], dict[int, np.ndarray], dict[int, dict[str, Any]]]:
    """The federation and a buyer that drives its sessions itself, at the settings a market would announce."""
    grid, directory, counts, configs = sparse_federation(tmp_path)
    settings = sparse_config(directory).sparse_settings
    assert settings is not None and not settings.parameters(NODES).complete
    return SparseBuyer(grid, directory, settings), sorted(counts), counts, configs


def test_a_buyer_grinding_placements_gets_no_draw_past_the_sessions_the_bound_counts(tmp_path: Path) -> None:
    """Each session is a fresh draw the buyer may keep or throw away; the degrees bound ``reruns + 1`` of them per
    market. The buyer starts more: every node draws in the first ``reruns + 1`` and refuses the next."""
    buyer, nodes, _, _ = grinding_buyer(tmp_path)
    for _ in range(buyer.settings.reruns + 1):
        assert set(buyer.session(nodes, until="draw")) == set(nodes)
    assert buyer.session(nodes, until="draw") == {}


def test_the_ledger_holds_the_cap_when_the_nodes_state_is_lost(tmp_path: Path) -> None:
    """The buyer masks in ``reruns + 1`` sessions, then restarts the nodes (their run state gone): each node's release
    ledger still counts the sessions it masked in this run, and the next draw is refused."""
    buyer, nodes, counts, configs = grinding_buyer(tmp_path)
    for _ in range(buyer.settings.reruns + 1):
        assert set(buyer.session(nodes, until="mask")) == set(nodes)
    buyer.grid = InProcessGrid(drop_in_app(counts), nodes, node_configs=configs)  # a restart: no state kept
    assert buyer.session(nodes, until="draw") == {}


# --- The award's quorum over the directory -------------------------------------------------------------------------
class ReplyLog:
    """Record the replies to one action of a grid (wraps its ``pull_messages``)."""

    def __init__(self, grid: InProcessGrid, action: str) -> None:
        self.replies: list[Message] = []
        pull, kind = grid.pull_messages, message_type(action)
        sent = {}

        def pull_messages(message_ids: Iterable[str], *args: Any, **kwargs: Any) -> Any:
            ids = list(message_ids)
            replies = pull(ids, *args, **kwargs)
            for m in grid.sent:
                sent[m.metadata.message_id] = m.metadata.message_type
            self.replies += [r for r in replies if sent.get(r.metadata.reply_to_message_id) == kind]
            return replies

        grid.pull_messages = pull_messages  # type: ignore[method-assign]

    def lengths(self, field: str) -> list[int]:
        return [len(r.content.config_records[RECORD_KEY][field]) for r in self.replies if not r.has_error()]


class TrimmedAuditGrid(InProcessGrid):
    """A buyer that shows each winner only ``keep`` of the endorsements it gathered."""

    keep = 0

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        out = []
        for message in messages:
            if message.metadata.message_type == message_type(ACTION_AUDIT):
                record = message.content.config_records[RECORD_KEY]
                gathered = unpack_endorsements(record["endorsements"])  # type: ignore[arg-type]
                kept = dict(sorted(gathered.items())[: self.keep])
                record["endorsements"] = pack_endorsements(kept)
            out.append(message)
        return super().push_messages(out)


def test_an_award_endorsed_by_a_quorum_of_survivors_but_not_of_the_directory_opens_nothing(tmp_path: Path) -> None:
    """The buyer shows each winner as many endorsements as a quorum of a survivor set of ``|U3| = 20`` would need
    (the complete graph's rule), fewer than the directory's quorum: in the sparse mode no winner opens its counts."""
    grid, directory, counts, configs = sparse_federation(tmp_path, seed=43, grid_type=TrimmedAuditGrid)
    survivor_quorum, directory_quorum = binding_quorum(20, COLLUDERS), binding_quorum(NODES, COLLUDERS)
    assert survivor_quorum < directory_quorum
    grid.keep = survivor_quorum  # the winner's own endorsement among them, as the buyer gathered it
    audits = ReplyLog(grid, ACTION_AUDIT)
    outcome = MarketPhase(sparse_config(directory)).run(grid)
    assert audits.replies and all(reply.has_error() for reply in audits.replies)  # no winner opened its counts
    assert outcome.winners == [] and outcome.total_payment == 0  # each was excluded at the audit
    honest = TrimmedAuditGrid(drop_in_app(counts), sorted(counts), node_configs=configs)
    honest.keep = directory_quorum  # with the directory's quorum the same market opens its winners (control)
    audits = ReplyLog(honest, ACTION_AUDIT)
    outcome = MarketPhase(sparse_config(directory)).run(honest)
    assert outcome.status == "succeeded" and audits.replies and not any(r.has_error() for r in audits.replies)


def test_a_roster_below_the_awards_liveness_floor_is_refused_before_any_message(tmp_path: Path) -> None:
    """The nodes count the award's endorsements over the directory: with fewer invited than that quorum plus the
    colluders (here 30 connected of a directory of 60), the buyer stops before PASS rather than run a market whose
    winners could not open."""
    grid, directory, counts, _ = sparse_federation(tmp_path)
    absent = {9000 + node: generate_identity()[1] for node in range(NODES)}
    larger = IdentityDirectory({node: directory.key_of(node) for node in counts} | absent)
    floor = binding_quorum(len(larger), COLLUDERS) + COLLUDERS
    assert NODES < floor
    config = sparse_config(larger, pass_min_participants=20)
    assert config.runs_sparse(NODES)
    with pytest.raises(MarketError, match=f"needs a roster of at least {floor}"):
        MarketPhase(config).run(grid)
    assert message_type(ACTION_ADVERTISE) not in sent_types(grid)


def test_the_audit_oracle_against_nodes_in_the_sparse_mode_opens_nothing(tmp_path: Path) -> None:
    """The award issue's first attack, in the sparse mode: audit every bidder with payment = bid (no award), then
    under a signed award naming everyone a winner, unendorsed and then endorsed: no node opens its counts (the award
    is not the auction's, so no honest node endorses it)."""
    grid, directory, counts, _ = sparse_federation(tmp_path, seed=44)
    seen: dict[str, set[int]] = {}
    phase = MaliciousPhase(
        audit_oracle(seen),
        security="malicious",
        directory=directory,
        pass_colluders=COLLUDERS,
        neighbours="sparse",
        timeout_per_node=0.0,
        num_classes=NUM_CLASSES,
    )
    assert phase.config.runs_sparse(NODES)
    with pytest.raises(_AttackDone):
        phase.run(grid)
    assert message_type(ACTION_DRAW) in sent_types(grid)
    assert seen.pop("bidders") == set(counts)  # the nodes took part up to the bids
    assert seen == {"old": set(), "unendorsed": set(), "endorsers": set(), "endorsed": set()}


# --- Placements bounded by the node; the longest an aborting buyer locks it out --------------------------------------
class NodeClock:
    """The nodes' clock as their release ledgers read it (``time.time`` in :mod:`~flmarket_flwr.market.wire.ledger`),
    moved by the test: the wait is an hour, which a test does not sleep through."""

    def __init__(self, now: float = 1.8e9) -> None:
        self.now = now

    def time(self) -> float:
        return self.now


@pytest.fixture
def node_clock(monkeypatch: pytest.MonkeyPatch) -> NodeClock:
    clock = NodeClock()
    monkeypatch.setattr(ledger_module, "time", clock)
    return clock


def draws_until_refused(buyer: SparseBuyer, nodes: list[int]) -> int:
    """Sessions stopped after the draw, one after another, until no node draws; how many every node drew in."""
    drawn = 0
    while (replies := buyer.session(nodes, until="draw")) and drawn < 100:
        assert set(replies) == set(nodes)
        drawn += 1
    return drawn


def test_a_buyer_announcing_more_reruns_gets_no_draw_past_the_nodes_own(tmp_path: Path, node_clock: NodeClock) -> None:
    """The buyer announces 64 re-runs (stronger settings, which the nodes accept: their degrees are then sized for
    more placements); each node still draws in its own ``pass-reruns + 1`` sessions (here 2) and refuses the next,
    also after the market is aborted and re-launched within the wait."""
    buyer, nodes, _, _ = grinding_buyer(tmp_path)
    own = buyer.settings.reruns + 1
    buyer.settings = dataclasses.replace(buyer.settings, reruns=64)
    assert draws_until_refused(buyer, nodes) == own == 2
    assert buyer.abort(nodes) == len(nodes)
    node_clock.now += 3599.0
    assert draws_until_refused(buyer, nodes) == 0


@pytest.mark.parametrize("aborted", [1, 3])
def test_a_buyer_that_aborts_locks_the_nodes_out_for_at_most_the_redraw_wait(
    tmp_path: Path, node_clock: NodeClock, aborted: int
) -> None:
    """The buyer runs ``aborted`` markets, each stopped after the draw and aborted (it sees every placement and
    releases nothing): the first takes the nodes' ``reruns + 1`` draws, the later ones get none. One
    ``pass-redraw-wait`` (an hour) after the last draw an honest buyer's market runs in the sparse mode and pays its
    winners, however many markets were aborted; a second before it, no node draws."""
    buyer, nodes, _, _ = grinding_buyer(tmp_path)
    per_release = buyer.settings.reruns + 1
    for market in range(aborted):
        assert draws_until_refused(buyer, nodes) == (per_release if market == 0 else 0)
        assert buyer.abort(nodes) == len(nodes)
        node_clock.now += 60.0  # a minute between markets
    last_draw = node_clock.now - 60.0 * aborted
    node_clock.now = last_draw + 3599.0
    assert buyer.session(nodes, until="draw") == {}
    buyer.abort(nodes)
    node_clock.now = last_draw + 3600.0
    outcome = MarketPhase(sparse_config(buyer.directory)).run(buyer.grid)
    assert outcome.status == "succeeded" and outcome.winners and outcome.excluded == {}
    assert message_type(ACTION_DRAW) in sent_types(buyer.grid)


def test_a_release_gives_the_nodes_their_draws_back_at_once(tmp_path: Path, node_clock: NodeClock) -> None:
    """An honest market that releases its sum: the nodes' next market draws at once, with no wait (the draws before a
    release are that release's)."""
    buyer, nodes, _, _ = grinding_buyer(tmp_path)
    assert draws_until_refused(buyer, nodes) == buyer.settings.reruns + 1
    buyer.abort(nodes)
    node_clock.now += 3600.0
    assert MarketPhase(sparse_config(buyer.directory)).run(buyer.grid).status == "succeeded"
    assert draws_until_refused(buyer, nodes) == buyer.settings.reruns + 1  # no clock moved since the release


def test_past_their_lifetime_placements_the_nodes_refuse_the_sparse_mode_for_good(
    tmp_path: Path, node_clock: NodeClock
) -> None:
    """Nodes sized for one market's placements (``pass-markets=1``: ``reruns + 1`` draws over their life, the degrees
    sized for that many) draw in two sessions, then never again, however long the buyer waits."""
    grid, directory, _, _ = sparse_federation(tmp_path, **{"pass-markets": 1})
    settings = sparse_config(directory, pass_markets=1).sparse_settings
    assert settings is not None and settings.placements == 2
    buyer, nodes = SparseBuyer(grid, directory, settings), sorted(grid.get_node_ids())
    assert draws_until_refused(buyer, nodes) == 2
    for _ in range(3):
        buyer.abort(nodes)
        node_clock.now += 10 * 3600.0
        assert buyer.session(nodes, until="draw") == {}


def test_the_degrees_are_sized_for_every_placement_of_a_nodes_life() -> None:
    """The finder's union bounds count ``(reruns + 1) x markets`` placements (``reruns`` the colluders): what that
    costs in ``k`` against one market's ``reruns + 1`` at E = 30 and 60 (one and three colluders) and at E = 1,000 with
    5 % colluders stated (floor two thirds)."""
    for roster, floor, colluders, per_market_k, lifetime_k in (
        (30, 20, 1, 26, 26),
        (60, 40, 3, 37, 38),
        (1000, 667, 50, 101, 110),
    ):
        life = SparseSecureSettings.of(
            colluders=colluders, roster_floor=floor, dropout=0.05, reruns=colluders, markets=65_536
        )
        one = dataclasses.replace(life, markets=1)
        assert one.parameters(roster).degree == per_market_k and life.parameters(roster).degree == lifetime_k
        assert life.parameters(roster).reruns + 1 == (colluders + 1) * 65_536


# --- The mode in the advert's signature ------------------------------------------------------------------------------
def test_a_buyer_mixing_modes_in_one_session_gets_no_share_and_charges_no_ledger(tmp_path: Path) -> None:
    """The buyer asks one node to advertise for the complete graph (a graph commitment, no sparse settings) and the
    rest for the sparse mode, in one session and roster, and relays that node's advert as if it were the sparse
    mode's. Every node that drew it as an out-neighbour refuses at the share round, its advert signed under another
    mode: none deals a share, and none is charged a privacy spend for the session."""
    buyer, nodes, _, _ = grinding_buyer(tmp_path)
    session, outsider = b"mixed", nodes[-1]
    server = buyer.server(session)
    requests: dict[int, Any] = dict(server.advertise_requests(nodes))
    index = server.index_of[outsider]
    sparse = requests[index]
    complete = PassServer(session, NUM_CLASSES, 10**9, directory=buyer.directory, run_id=int(buyer.grid.run.run_id))
    requests[index] = AdvertiseRequest(
        session, index, outsider, NUM_CLASSES, sparse.count_bound, complete.graph_commitment, sparse.roster
    )
    adverts = buyer._round(server, ACTION_ADVERTISE, requests)
    assert set(adverts) == set(server.node_of)  # the outsider advertised, in the complete graph's mode
    server.core.directory = None  # the buyer takes every advert as it came
    draws = buyer._round(server, ACTION_DRAW, server.receive_advertisements(adverts))
    server.core.directory = buyer.directory
    holders = {i for i, reply in draws.items() if index in reply["out_neighbours"]}
    assert index not in draws and holders  # the outsider has no sparse session to draw in; others drew it
    shares = buyer._round(server, ACTION_SHARE, server.receive_draws(draws))
    assert holders.isdisjoint(shares) and set(shares) == set(draws) - holders
    for i in holders:
        ledger = read_node_settings(buyer.grid.context(server.node_of[i])).release_ledger
        assert ledger is not None and session.hex() not in {spend.session for spend in ledger.spends()}


# --- The cheaper graph ----------------------------------------------------------------------------------------------
def test_the_profile_picks_the_cheaper_graph() -> None:
    """``neighbours="auto"``: the sparse mode only where a client's out- and in-neighbours stay below the measured
    crossover, half the roster. At the profile's default colluders (a fifth of the directory) the sparse mode would
    cost more at E = 300 and 1,000 (neighbour shares 0.96 and 0.93): the complete graph. At 5 % it costs less (0.38 and
    0.19): the sparse mode; at 15 % (0.86 and 0.72) the complete graph again. ``"sparse"`` takes it regardless."""
    directories = {
        size: IdentityDirectory({node: generate_identity()[1] for node in range(1, size + 1)}) for size in (300, 1000)
    }
    assert SPARSE_NEIGHBOUR_SHARE_MAX == 0.5
    for size, directory in directories.items():
        default = secure_config(directory)
        settings = default.sparse_settings
        assert settings is not None
        assert neighbour_share(size, settings.parameters(size).degree) > 0.9 and not default.runs_sparse(size)
        assert secure_config(directory, neighbours="sparse").runs_sparse(size)  # forced: k < E - 1 still
        for share, sparse in ((0.05, True), (0.15, False)):
            config = secure_config(directory, pass_colluders=math.ceil(share * size))
            assert config.runs_sparse(size) is sparse
    assert neighbour_share(1000, 999) == 1.0 and neighbour_share(1000, 292) < 0.5 < neighbour_share(1000, 293)
