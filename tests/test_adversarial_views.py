"""A malicious server that shows clients different views (issue 21, items 1 and 4), against the real handlers.

Each test plays the server by hand through ``InProcessGrid`` (the real ``ClientApp``, fresh-process semantics):

* the split-views attack: the victim masks with only ``t`` peers; every client is shown the survivor set
  that serves the attack (the victim survived, so its self-mask shares come out; each peer dropped, so its
  mask key comes out). Without identity keys it recovers the victim's exact counts (the control, so the
  test can fail); with identity keys the consistency round stops it;
* adverts replayed from another run, and a victim shown a different roster, are refused.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from adversary import (
    NUM_CLASSES,
    client_secrets,
    honest_grid,
    make_counts,
    market_config,
    record_of,
    run_market,
    run_pass_rounds,
    send,
    signed_app,
)
from flwr.app import Message
from flwr.clientapp import ClientApp

from flmarket_flwr.market import CostBasedBid, MarketPhase, register_market_handlers
from flmarket_flwr.market.node.node_config import NodeSettings
from flmarket_flwr.pass_protocol import MIN_PARTICIPANTS, IdentityDirectory, PassError, PassServer, generate_identity
from flmarket_flwr.pass_protocol.channel import rebuild_secret, scalar_pair_mask
from flmarket_flwr.pass_protocol.encoding import roster_fingerprint
from flmarket_flwr.pass_protocol.graph import (
    derive_graph_seed,
    mask_graph,
    neighbourhood_size,
    roster_digest,
    share_threshold,
)
from flmarket_flwr.pass_protocol.messages import ConsistencyRequest, MaskRequest, UnmaskRequest
from flmarket_flwr.pass_protocol.primitives import expand_seed
from simulations.inprocess_grid import InProcessGrid

BOUND = 10**9

View = tuple[list[int], list[int]]


@dataclasses.dataclass
class SplitViews:
    """What the attacking server holds after the unmask round."""

    server: PassServer
    victim: int
    peers: list[int]
    masked: dict[int, np.ndarray]
    b_shares: list[tuple[int, bytes]]
    s_shares: dict[int, list[tuple[int, bytes]]]
    refusals: int


def _grid(counts: dict[int, np.ndarray], signed: bool) -> tuple[InProcessGrid, PassServer]:
    """Real clients (with identity keys and a directory if ``signed``) and a protocol object for rounds 1-2."""
    if signed:
        app, directory = signed_app(counts)
        grid = InProcessGrid(app, list(counts))
    else:
        grid, directory = honest_grid(counts), None
    server = PassServer(b"attack/split-views", NUM_CLASSES, BOUND, directory=directory, run_id=grid.run.run_id)
    return grid, server


def _views(graph: dict[int, tuple[int, ...]], victim: int, peers: list[int], t: int) -> dict[int, View]:
    """Each client's survivor/dropped split: the victim always survives; each peer is "dropped" for ``t`` of its
    neighbours, chosen so that every client keeps ``t`` surviving neighbours (so no client's own check fails)."""
    room = {w: len(graph[w]) - t for w in graph if w != victim}
    dropped: dict[int, set[int]] = {w: set() for w in room}
    for peer in peers:
        holders = sorted((w for w in graph[peer] if w != victim and room[w] > 0), key=lambda w: (-room[w], w))[:t]
        for w in holders:
            dropped[w].add(peer)
            room[w] -= 1
    everyone = sorted(graph)
    return {w: ([u for u in everyone if u not in gone], sorted(gone)) for w, gone in dropped.items()}


def _split_views_attack(counts: dict[int, np.ndarray], signed: bool) -> SplitViews:
    grid, server = _grid(counts, signed)
    requests = run_pass_rounds(grid, sorted(counts), server, upto=2)  # honest rounds 1-2: the mask requests
    victim, t = sorted(server.graph)[0], server.threshold
    peers = sorted(server.graph[victim])[:t]
    inbox = requests[victim]
    kept = [i for i, sender in enumerate(inbox.senders) if sender in peers]
    requests[victim] = MaskRequest(
        [inbox.senders[i] for i in kept],
        [inbox.ciphertexts[i] for i in kept],
        [inbox.share_digests[i] for i in kept],
        [inbox.signatures[i] for i in kept] if inbox.signatures else [],
    )
    replies = send(grid, "market_mask", {server.node_of[i]: r.to_record() for i, r in requests.items()})
    masked = {
        server.index_of[node]: np.frombuffer(record_of(reply)["masked_counts"], dtype="<u8").astype(np.uint64)
        for node, reply in replies.items()
    }
    views = _views(server.graph, victim, peers, t)
    unmask = {w: UnmaskRequest.of(*view) for w, view in views.items()}
    if signed:  # play the consistency round too, handing each client every matching signature there is
        shown = {server.node_of[w]: ConsistencyRequest(r.survivors, r.dropped).to_record() for w, r in unmask.items()}
        signed_replies = send(grid, "market_survivors", shown)
        signatures = {
            server.index_of[node]: reply.content.config_records["flmarket"]["signature"]
            for node, reply in signed_replies.items()
            if not reply.has_error()
        }
        for w in list(unmask):
            signers = [v for v in server.graph[w] if v in signatures and views.get(v) == views[w]]
            unmask[w] = UnmaskRequest.of(*views[w], signers, [signatures[v] for v in signers])
    answers = send(grid, "market_unmask", {server.node_of[w]: r.to_record() for w, r in unmask.items()})
    attack = SplitViews(server, victim, peers, masked, [], {}, 0)
    for node, reply in answers.items():
        if reply.has_error():
            attack.refusals += 1
            continue
        record, x = record_of(reply), server.index_of[node]
        if victim in record["survivor_indices"]:
            attack.b_shares.append((x, record["survivor_shares"][record["survivor_indices"].index(victim)]))
        for peer, share in zip(record["dropped_indices"], record["dropped_shares"], strict=True):
            attack.s_shares.setdefault(peer, []).append((x, share))
    return attack


def _rebuild(shares: list[tuple[int, bytes]], t: int) -> bytes:
    return rebuild_secret(shares[:t])


def _recover(attack: SplitViews) -> np.ndarray | None:
    """The victim's counts, if the attacker holds ``t`` shares of its self-mask seed and of every peer's mask key."""
    server, victim, t = attack.server, attack.victim, attack.server.threshold
    if len(attack.b_shares) < t or any(len(attack.s_shares.get(p, [])) < t for p in attack.peers):
        return None
    value = attack.masked[victim] - expand_seed(_rebuild(attack.b_shares, t), NUM_CLASSES)
    victim_key = server.adverts[victim].mask_public_key
    for peer in attack.peers:  # the peer's mask key rebuilt as a scalar: its exchange with the victim's key
        key = _rebuild(attack.s_shares[peer], t)
        value = value + scalar_pair_mask(key, victim_key, server.session, peer, victim, NUM_CLASSES)
    return value


@pytest.mark.parametrize("size", [10, 40, 100])
def test_split_views_recover_exact_counts_without_identity_keys(size: int) -> None:
    """The control: the attack is real. Without identity keys every client answers the view it is shown."""
    counts = make_counts(size, seed=size)
    attack = _split_views_attack(counts, signed=False)
    degree = attack.server.degree
    assert (degree == size - 1) == (size == 10)  # complete graph at 10, sparse at 40 and 100
    recovered = _recover(attack)
    assert recovered is not None
    assert np.array_equal(recovered, counts[attack.server.node_of[attack.victim]].astype(np.uint64))


@pytest.mark.parametrize("size", [10, 40, 100])
def test_split_views_recover_nothing_with_the_consistency_round(size: int) -> None:
    """With identity keys each client unmasks only for the set it signed, with ``t`` neighbours' signatures on it."""
    counts = make_counts(size, seed=size)
    attack = _split_views_attack(counts, signed=True)
    t = attack.server.threshold
    assert _recover(attack) is None
    assert len(attack.b_shares) < t or any(len(attack.s_shares.get(p, [])) < t for p in attack.peers)
    assert attack.refusals > 0


# --- The consistency round's client-side rules ----------------------------------------------------------
def _signed_to_consistency(size: int = 8):
    """Signed clients after the masked-input round with an honest server; returns grid, server and requests."""
    counts = make_counts(size, seed=5)
    grid, server = _grid(counts, signed=True)
    requests = run_pass_rounds(grid, sorted(counts), server, upto=3)
    return grid, server, requests


def _sign_all(grid: InProcessGrid, server: PassServer, requests: dict) -> dict[int, dict]:
    """Every survivor's consistency-round reply record, by PASS index."""
    replies = send(grid, "market_survivors", {server.node_of[i]: r.to_record() for i, r in requests.items()})
    return {server.index_of[node]: record_of(reply) for node, reply in replies.items()}


def test_a_client_shown_a_second_set_refuses() -> None:
    grid, server, requests = _signed_to_consistency()
    victim = server.survivors[0]
    signatures = _sign_all(grid, server, requests)
    unmask = server.receive_signatures(signatures)
    # A second set to sign is refused, and so is an unmask for any set but the one it signed.
    other = UnmaskRequest.of(server.survivors[1:], [victim])
    again = send(
        grid,
        "market_survivors",
        {server.node_of[server.survivors[1]]: ConsistencyRequest(other.survivors, other.dropped).to_record()},
    )
    assert all(reply.has_error() for reply in again.values())
    neighbour = server.graph[victim][0]
    switched = dataclasses.replace(unmask[neighbour], survivors=other.survivors, dropped=other.dropped)
    reply = send(grid, "market_unmask", {server.node_of[neighbour]: switched.to_record()})
    assert reply[server.node_of[neighbour]].has_error()


@pytest.mark.parametrize("tamper", ["none", "too-few", "forged", "forged-spare", "unsigned-first"])
def test_unmask_needs_t_valid_neighbour_signatures_on_the_signed_set(tamper: str) -> None:
    """``t`` valid signatures on the signed set are required and enough: a forged one among exactly ``t`` is
    refused; one forged beside ``t`` valid ones is skipped (a colluder cannot stop the unmask by signing badly)."""
    grid, server, requests = _signed_to_consistency()
    client = server.survivors[0]
    node = server.node_of[client]
    if tamper == "unsigned-first":  # straight to unmask, skipping the consistency round
        reply = send(grid, "market_unmask", {node: UnmaskRequest.of(server.survivors, server.dropped).to_record()})
        assert reply[node].has_error()
        return
    unmask = server.receive_signatures(_sign_all(grid, server, requests))[client]
    t = server.threshold
    if tamper == "too-few":
        unmask = dataclasses.replace(unmask, signers=unmask.signers[: t - 1], signatures=unmask.signatures[: t - 1])
    elif tamper in ("forged", "forged-spare"):
        kept = t if tamper == "forged" else t + 1
        assert len(unmask.signers) >= kept
        forged = bytes([unmask.signatures[0][0] ^ 1]) + unmask.signatures[0][1:]
        unmask = dataclasses.replace(
            unmask, signers=unmask.signers[:kept], signatures=[forged, *unmask.signatures[1:kept]]
        )
    reply = send(grid, "market_unmask", {node: unmask.to_record()})[node]
    assert reply.has_error() == (tamper not in ("none", "forged-spare"))


def test_a_signature_that_does_not_verify_excludes_its_sender_and_pass_finishes() -> None:
    grid, server, requests = _signed_to_consistency()
    signatures = _sign_all(grid, server, requests)
    liar = server.survivors[-1]
    signatures[liar] = {"signature": bytes(64)}
    unmask = server.receive_signatures(signatures)
    assert liar not in unmask and "survivor-set signature refused" in server.excluded[liar]
    replies = send(grid, "market_unmask", {server.node_of[i]: r.to_record() for i, r in unmask.items()})
    server.receive_unmask({server.index_of[n]: record_of(r) for n, r in replies.items()})
    total = server.finish()
    counts = make_counts(8, seed=5)
    assert np.array_equal(total, np.sum([counts[server.node_of[u]] for u in server.survivors], axis=0))


# --- Item 4: adverts bound to the run and the roster ----------------------------------------------------
def test_an_advert_replayed_from_another_run_is_refused_even_when_the_session_recurs() -> None:
    counts = make_counts(6)
    identities_app, directory = signed_app(counts)
    session = b"attack/recurring-session"
    old_grid = InProcessGrid(identities_app, list(counts), run_id=1)
    old = PassServer(session, NUM_CLASSES, BOUND, directory=directory, run_id=1)
    old_requests = run_pass_rounds(old_grid, sorted(counts), old, upto=1)
    new_grid = InProcessGrid(identities_app, list(counts), run_id=2)
    new = PassServer(session, NUM_CLASSES, BOUND, directory=directory, run_id=2)
    new_requests = run_pass_rounds(new_grid, sorted(counts), new, upto=1)
    victim = sorted(new_requests)[0]
    replayed = dataclasses.replace(
        new_requests[victim],
        cipher_public_keys=old_requests[victim].cipher_public_keys,
        mask_public_keys=old_requests[victim].mask_public_keys,
        signatures=old_requests[victim].signatures,
    )
    assert old_requests[victim].neighbours == new_requests[victim].neighbours
    reply = send(new_grid, "market_share", {new.node_of[victim]: replayed.to_record()})
    assert reply[new.node_of[victim]].has_error()
    # The control: the honest run-2 request is accepted by the same kind of client.
    fresh = send(
        new_grid, "market_share", {new.node_of[v]: r.to_record() for v, r in new_requests.items() if v != victim}
    )
    assert not any(r.has_error() for r in fresh.values())


def test_a_victim_shown_a_different_roster_is_refused_by_it_and_by_its_neighbours() -> None:
    counts = make_counts(40)  # a sparse graph: the victim's non-neighbours are the control
    app, _ = signed_app(counts)
    grid = InProcessGrid(app, list(counts))
    server = PassServer(b"attack/roster", NUM_CLASSES, BOUND, run_id=grid.run.run_id)  # relays, checks nothing
    requests = server.advertise_requests(sorted(counts))
    victim = 1
    other_roster = roster_fingerprint(grid.run.run_id, server.session, sorted(counts)[:3])  # the victim and two
    requests[victim] = dataclasses.replace(requests[victim], roster=other_roster)
    adverts = send(grid, "market_advertise", {server.node_of[i]: r.to_record() for i, r in requests.items()})
    share = server.receive_advertisements({server.index_of[n]: record_of(r) for n, r in adverts.items()})
    replies = send(grid, "market_share", {server.node_of[i]: r.to_record() for i, r in share.items()})
    refused = {server.index_of[node] for node, reply in replies.items() if reply.has_error()}
    assert refused == {victim, *server.graph[victim]}
    assert len(refused) < len(counts)


# --- The secure set-up end to end, and what it does not stop -------------------------------------------
def test_a_signed_market_with_a_survivor_leaving_at_the_consistency_round_completes() -> None:
    counts = make_counts(8, seed=9)
    app, directory = signed_app(counts)
    leaver = sorted(counts)[3]

    def leave(instruction, reply):
        dst, kind = instruction.metadata.dst_node_id, instruction.metadata.message_type
        return None if dst == leaver and kind == "query.market_survivors" else reply

    grid = InProcessGrid(app, list(counts), reply_hook=leave)
    outcome = MarketPhase(market_config(directory=directory, timeout=0.5)).run(grid)
    assert outcome.excluded[leaver].startswith("market_survivors")
    # Its masked input is in the sum (it is a survivor); its self-mask came back from its neighbours' shares.
    assert outcome.global_counts == [int(c) for c in np.sum(list(counts.values()), axis=0)]
    assert leaver not in outcome.participants


def test_two_markets_differenced_give_a_victims_counts_not_prevented() -> None:
    """Without release ledgers (the library's default): two runs give two sums. With them: test_adversarial_runs.py."""
    counts = make_counts(6, seed=11)
    victim = sorted(counts)[0]
    _, with_victim = run_market(counts)
    _, without = run_market({node: c for node, c in counts.items() if node != victim})
    difference = np.asarray(with_victim.global_counts) - np.asarray(without.global_counts)
    assert np.array_equal(difference, counts[victim])


@pytest.mark.parametrize(
    "signature",
    [b"", bytes(64), b"\x01" * 63, "a string", 5, [b"x" * 64], None],
    ids=["empty", "zeros", "short", "str", "int", "list", "missing"],
)
def test_a_malformed_survivor_set_signature_excludes_only_its_sender(signature: object) -> None:
    counts = make_counts(8, seed=12)
    app, directory = signed_app(counts)
    liar = sorted(counts)[4]

    def tamper(instruction, reply):
        if instruction.metadata.dst_node_id == liar and instruction.metadata.message_type == "query.market_survivors":
            record = reply.content.config_records["flmarket"]
            if signature is None:
                del record["signature"]
            else:
                record["signature"] = signature
        return reply

    outcome = MarketPhase(market_config(directory=directory)).run(InProcessGrid(app, list(counts), reply_hook=tamper))
    assert set(outcome.excluded) == {liar}
    assert outcome.excluded[liar].startswith("PASS: survivor-set signature refused")
    assert outcome.global_counts == [int(c) for c in np.sum(list(counts.values()), axis=0)]


# --- The server places a victim among colluders: not prevented (issue 21 review) -----------------------------
@pytest.mark.parametrize("signed", [False, True], ids=["no-directory", "directory"])
def test_a_server_that_places_a_victim_among_t_colluders_recovers_its_counts_not_prevented(signed: bool) -> None:
    """The graph is fixed by the server's own seed and the indices, and the server assigns the indices.

    Before anyone advertises it computes the graph its committed seed will give over indices ``1..E``, gives the
    victim index 1 and ``t`` colluding clients indices among index 1's neighbours. The colluders then pool the
    shares of the victim's two secrets they were dealt (no split, no unmask request): the victim's masked input
    opens to its exact counts. Here E = 100 (k = 30, t = 16): 16 colluders of 100 suffice, where a random
    placement would need about half the federation. With a directory too: the consistency round is not involved.
    """
    size = 100
    counts = make_counts(size, seed=41)
    grid, server = _grid(counts, signed)
    indices = list(range(1, size + 1))
    k = neighbourhood_size(size)
    t = share_threshold(k)
    planned = mask_graph(derive_graph_seed(server._server_seed, roster_digest(server.session, indices)), indices, k)
    victim, colluders = 1, sorted(planned[1])[:t]
    nodes = sorted(counts)
    placed = {victim: nodes[0], **dict(zip(colluders, nodes[1 : t + 1], strict=True))}
    rest = iter(nodes[t + 1 :])
    order = [placed[i] if i in placed else next(rest) for i in indices]
    requests = run_pass_rounds(grid, order, server, upto=2)  # rounds 1-2 as the protocol says, in that order
    assert server.graph[victim] == planned[victim] and len(planned[victim]) == k and k < size - 1
    replies = send(grid, "market_mask", {server.node_of[i]: r.to_record() for i, r in requests.items()})
    masked = np.frombuffer(record_of(replies[nodes[0]])["masked_counts"], dtype="<u8").astype(np.uint64)
    assert np.array_equal(_open_with_colluders(grid, server, victim, colluders, masked), counts[nodes[0]])


def _open_with_colluders(
    grid: InProcessGrid, server: PassServer, victim: int, colluders: list[int], masked: np.ndarray
) -> np.ndarray:
    """The victim's masked input opened with what ``t`` colluding neighbours hold of its two secrets (their state)."""
    t = server.threshold
    s_shares, b_shares = [], []
    for x in colluders:
        state = grid.context(server.node_of[x]).state.config_records["flmarket"]
        both = list(state["pass/held_shares"])[list(state["pass/held_from"]).index(victim)]
        s_shares.append((x, both[: len(both) // 2]))
        b_shares.append((x, both[len(both) // 2 :]))
    value = masked - expand_seed(_rebuild(b_shares, t), NUM_CLASSES)
    mask_key = _rebuild(s_shares, t)  # a scalar mod l
    for peer in server.graph[victim]:
        peer_key = server.adverts[peer].mask_public_key
        value = value - scalar_pair_mask(mask_key, peer_key, server.session, victim, peer, NUM_CLASSES)
    return value


def test_a_node_that_takes_part_only_on_the_complete_graph_cannot_be_placed_among_colluders() -> None:
    """The placement above against a victim whose node requires the complete graph (``complete_graph``, node
    config ``pass-complete-graph``): it refuses the sparse graph before it sends a share or a masked input, and
    keeps no secret. On the complete graph (the market's ``neighbours="all"``) such nodes take part as usual,
    and a client's secrets then need ``t`` colluders of the roster (more than half of it). The server also
    chooses the roster, so that is more than half of the federation only when the node's ``min_participants``
    is close to the federation's size (the roster tests below)."""
    size = 100
    counts = make_counts(size, seed=41)
    nodes = sorted(counts)
    app = ClientApp()
    register_market_handlers(
        app,
        lambda context: counts[context.node_id],
        CostBasedBid(0.01),
        settings=lambda c: NodeSettings(complete_graph=c.node_id == nodes[0]),
    )
    grid = InProcessGrid(app, nodes)
    server = PassServer(b"attack/placement", NUM_CLASSES, BOUND, run_id=grid.run.run_id)
    indices = list(range(1, size + 1))
    k = neighbourhood_size(size)
    planned = mask_graph(derive_graph_seed(server._server_seed, roster_digest(server.session, indices)), indices, k)
    victim, colluders = 1, sorted(planned[1])[: share_threshold(k)]
    placed = {victim: nodes[0], **dict(zip(colluders, nodes[1 : len(colluders) + 1], strict=True))}
    rest = iter(nodes[len(colluders) + 1 :])
    share_requests = run_pass_rounds(grid, [placed[i] if i in placed else next(rest) for i in indices], server, upto=1)
    replies = send(grid, "market_share", {server.node_of[i]: r.to_record() for i, r in share_requests.items()})
    assert replies[nodes[0]].has_error() and "market_share" in replies[nodes[0]].error.reason
    assert client_secrets(grid, nodes[0]) == {}  # wiped on refusal: no key, no seed, no counts left to open
    others = {server.index_of[node]: record_of(reply) for node, reply in replies.items() if node != nodes[0]}
    mask_requests = server.receive_shares(others)
    assert victim not in mask_requests and "no share-keys reply" in server.excluded[victim]

    small = make_counts(12, seed=43)
    every = ClientApp()
    register_market_handlers(
        every,
        lambda context: small[context.node_id],
        CostBasedBid(0.01),
        settings=lambda c: NodeSettings(complete_graph=True),
    )
    complete = MarketPhase(market_config(neighbours="all")).run(InProcessGrid(every, list(small)))
    assert sorted(complete.participants) == sorted(small) and not complete.excluded
    assert complete.global_counts == [int(c) for c in np.sum(list(small.values()), axis=0)]


# --- The server chooses the roster: the complete graph needs a roster floor (security review) -----------------
FEDERATION = 100


def _invite_a_colluding_majority(
    signed: bool, size: int, colluding: int, floor: int
) -> tuple[InProcessGrid, PassServer, list[int], dict[int, np.ndarray], dict[int, Message]]:
    """Of a federation of 100, the server invites only the victim (``nodes[0]``, which requires the complete
    graph and a roster of at least ``floor``), ``colluding`` colluders and honest nodes up to ``size``, on the
    complete graph; rounds 1 and 2 are played as the protocol says. Returns the grid, the server, the roster,
    the counts and the share-round replies."""
    counts = make_counts(FEDERATION, seed=41)
    nodes = sorted(counts)
    victim_node = nodes[0]
    options: dict[str, Any] = {}
    directory = None
    if signed:
        identities = {node: generate_identity() for node in nodes}
        directory = IdentityDirectory({node: public for node, (_, public) in identities.items()})
        options = {"identity_key": lambda c: identities[c.node_id][0], "directory": lambda c: directory}  # per node
    app = ClientApp()
    register_market_handlers(
        app,
        lambda context: counts[context.node_id],
        CostBasedBid(0.01),
        settings=lambda c: NodeSettings(
            complete_graph=c.node_id == victim_node,
            min_participants=floor if c.node_id == victim_node else MIN_PARTICIPANTS,
            **{name: read(c) for name, read in options.items()},
        ),
    )
    grid = InProcessGrid(app, nodes)
    roster = nodes[:size]  # the victim, its colluders, then honest nodes: the server chose who is in it
    server = PassServer(
        b"attack/roster", NUM_CLASSES, BOUND, degree=size - 1, directory=directory, run_id=grid.run.run_id
    )
    share_requests = run_pass_rounds(grid, roster, server, upto=1)
    assert server.threshold == share_threshold(size - 1) <= colluding  # the colluders are enough on this roster
    replies = send(grid, "market_share", {server.node_of[i]: r.to_record() for i, r in share_requests.items()})
    return grid, server, roster, counts, replies


ROSTERS = pytest.mark.parametrize(("size", "colluding"), [(30, 16), (3, 2)], ids=["E=30", "E=3"])
SIGNED = pytest.mark.parametrize("signed", [False, True], ids=["no-directory", "directory"])


@ROSTERS
@SIGNED
def test_a_server_that_invites_a_complete_graph_node_with_a_colluding_majority_recovers_its_counts_not_prevented(
    signed: bool, size: int, colluding: int
) -> None:
    """``complete_graph`` alone (the library's default roster floor, 3): the victim's checks all pass on a
    roster the server chose, the victim and ``t`` colluders among few others (E = 30, k = 29, t = 15 with 16
    colluders; E = 3 with 2), and the colluders pool their shares of its two secrets: its exact counts."""
    grid, server, roster, counts, replies = _invite_a_colluding_majority(signed, size, colluding, MIN_PARTICIPANTS)
    assert not any(reply.has_error() for reply in replies.values())
    mask_requests = server.receive_shares({server.index_of[node]: record_of(r) for node, r in replies.items()})
    masked_replies = send(grid, "market_mask", {server.node_of[i]: r.to_record() for i, r in mask_requests.items()})
    victim = server.index_of[roster[0]]
    assert server.graph[victim] == tuple(i for i in sorted(server.graph) if i != victim)  # the complete graph
    masked = np.frombuffer(record_of(masked_replies[roster[0]])["masked_counts"], dtype="<u8").astype(np.uint64)
    colluders = [server.index_of[node] for node in roster[1 : 1 + colluding]]
    assert np.array_equal(_open_with_colluders(grid, server, victim, colluders, masked), counts[roster[0]])


@ROSTERS
@SIGNED
def test_a_complete_graph_node_with_a_roster_floor_near_the_federation_refuses_a_hand_picked_roster(
    signed: bool, size: int, colluding: int
) -> None:
    """The same rosters against a victim that also sets ``min_participants`` to 90 of the 100 (node config
    ``pass-min-participants``): it refuses at the share round, before it sends a share or a masked input, and
    keeps no secret; the colluders hold no share of it and the server no masked input from it. A roster of 90
    needs ``t = 45`` colluders on the complete graph."""
    grid, server, roster, _, replies = _invite_a_colluding_majority(signed, size, colluding, floor=90)
    victim_node = roster[0]
    victim = server.index_of[victim_node]
    assert replies[victim_node].has_error() and "market_share" in replies[victim_node].error.reason
    assert client_secrets(grid, victim_node) == {}  # wiped on refusal: no key, no seed, no counts left to open
    others = {server.index_of[node]: record_of(reply) for node, reply in replies.items() if node != victim_node}
    if len(others) < MIN_PARTICIPANTS:  # E = 3: too few shared their keys, the session ends here
        with pytest.raises(PassError, match="shared their keys"):
            server.receive_shares(others)
    else:  # E = 30: the others go on without the victim, which sends no masked input
        mask_requests = server.receive_shares(others)
        assert victim not in mask_requests and "no share-keys reply" in server.excluded[victim]
        masked_replies = send(grid, "market_mask", {server.node_of[i]: r.to_record() for i, r in mask_requests.items()})
        assert victim_node not in masked_replies and not any(reply.has_error() for reply in masked_replies.values())
        for node in roster[1 : 1 + colluding]:  # each holds the shares of the 28 others, none of the victim's
            held_from = list(grid.context(node).state.config_records["flmarket"]["pass/held_from"])
            assert victim not in held_from and len(held_from) == size - 2
