"""The sparse secure mode of PASS (issue 40, rules 1-5 of docs/threat-model.md), against the real client and server.

An honest session first (the sum is exact at E = 30 and E = 200, with dropouts at every round); then the buyer plays
each attack at the PASS level: it cannot choose a victim's out-neighbours (a forged or altered draw is refused), it
cannot show clients different U1 or (k, t), nor a (k, t) below the finder's, nor replay a masked-with list, cut an edge
on one side, split the survivor views, flood a victim's in-degree, or isolate a victim by declaring its neighbours
dropped. Each test asserts what the buyer got.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from flmarket_flwr.pass_protocol import messages
from flmarket_flwr.pass_protocol.encoding import PassError, indices_to_bitmap, roster_fingerprint
from flmarket_flwr.pass_protocol.graph import roster_digest
from flmarket_flwr.pass_protocol.identity import IdentityDirectory, public_key_of, sign_advertisement
from flmarket_flwr.pass_protocol.messages import (
    ConsistencyRequest,
    DrawRequest,
    OutNeighbourDraw,
    SparseAdvertiseRequest,
    SparseShareKeysRequest,
    SparseUnmaskRequest,
)
from flmarket_flwr.pass_protocol.sparse_client import SparseSecureClient
from flmarket_flwr.pass_protocol.sparse_secure import (
    SessionBinding,
    SparseSecureSettings,
    draw_out_neighbours,
    pack_indices,
    unpack_indices,
)
from flmarket_flwr.pass_protocol.sparse_server import SparseSecureServer

NUM_CLASSES, RUN_ID = 3, 11


def identity(node: int) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"sparse identity %d" % node).digest())


def packed(node_ids):
    """Node ids as the draw request carries them: big-endian uint64 words."""
    return np.asarray(node_ids, dtype=">u8").tobytes()


def settings_for(size: int) -> SparseSecureSettings:
    """5 % colluders (at least 1) over a floor of the whole roster, 5 % dropout, 2 re-runs, 2^-40, the degrees sized
    for one market's three draws (what a node counts over its life: tests/test_sparse_secure_market.py)."""
    return SparseSecureSettings.of(colluders=max(1, size // 20), roster_floor=size, dropout=0.05, reruns=2, markets=1)


class SparseSession:
    """A SparseSecureServer and E SparseSecureClients, every message and state round-tripped through its record.

    Each step returns the requests of the next; ``drop`` leaves clients out of a step, ``tamper`` changes requests
    or replies in flight (the buyer's hand), and ``refused`` records each client's refusal.
    """

    def __init__(
        self, size: int, *, session: bytes = b"sparse-1", seed: int = 0, own: SparseSecureSettings | None = None
    ):
        self.rng = np.random.default_rng(seed)
        self.counts = self.rng.integers(0, 50, size=(size, NUM_CLASSES))
        self.nodes = [100 + i for i in range(size)]
        self.directory = IdentityDirectory({n: public_key_of(identity(n)) for n in self.nodes})
        self.settings = settings_for(size)
        self.own = own or self.settings
        self.server = SparseSecureServer(
            session, NUM_CLASSES, 1000, settings=self.settings, directory=self.directory, run_id=RUN_ID
        )
        self.states: dict[int, dict[str, Any]] = {}
        self.refused: dict[int, str] = {}
        self.draw_rng = random.Random(seed)

    def key(self, index: int) -> Ed25519PrivateKey:
        return identity(self.nodes[index - 1])

    def call(self, index: int, method: str, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        client = SparseSecureClient(self.states.get(index, {}), draw=self.draw_rng.randrange)
        try:
            return getattr(client, method)(*args, **kwargs).to_record()  # type: ignore[no-any-return]
        except PassError as error:
            self.refused[index] = str(error)
            return None
        finally:
            self.states[index] = client.to_record()

    def _round(
        self, requests: dict[int, Any], method: str, args: Callable[[int], tuple[Any, ...]], drop=(), tamper=None
    ):
        replies = {}
        for i, request in sorted(requests.items()):
            if i in drop:
                continue
            reply = self.call(i, method, request.to_record(), *args(i))
            if reply is not None:
                replies[i] = reply
        for i, change in (tamper or {}).items():
            replies[i] = change(replies[i])
        return replies

    def advertise(self, drop=()):
        requests = self.server.advertise_requests(self.nodes)
        replies = {}
        for i, request in requests.items():
            if i not in drop:
                reply = self.call(
                    i,
                    "advertise",
                    request.to_record(),
                    self.counts[i - 1],
                    identity_key=self.key(i),
                    settings=self.own,
                    run_id=RUN_ID,
                )
                if reply is not None:
                    replies[i] = reply
        return self.server.receive_advertisements(replies)

    def draw(self, requests, drop=(), tamper=None):
        return self.server.receive_draws(self._round(requests, "draw", lambda i: (self.key(i),), drop, tamper))

    def share(self, requests, drop=(), tamper=None):
        replies = self._round(requests, "share_keys", lambda i: (self.directory, self.key(i)), drop, tamper)
        return self.server.receive_shares(replies)

    def mask(self, requests, drop=(), tamper=None):
        return self.server.receive_masked(self._round(requests, "mask_input", lambda i: (self.key(i),), drop, tamper))

    def sign(self, requests, drop=()):
        return self.server.receive_signatures(self._round(requests, "sign_survivors", lambda i: (self.key(i),), drop))

    def unmask(self, requests, drop=()):
        self.server.receive_unmask(self._round(requests, "unmask", lambda i: (), drop))
        return self.server.finish()

    def run(self, drops: dict[str, tuple[int, ...]] | None = None) -> np.ndarray:
        drops = drops or {}
        requests = self.advertise(drops.get("advertise", ()))
        requests = self.draw(requests, drops.get("draw", ()))
        requests = self.share(requests, drops.get("share", ()))
        requests = self.mask(requests, drops.get("mask", ()))
        requests = self.sign(requests, drops.get("sign", ()))
        return self.unmask(requests, drops.get("unmask", ()))

    def expected(self) -> np.ndarray:
        return self.counts[[u - 1 for u in self.server.survivors]].sum(axis=0)


# The honest session ----------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "drops"),
    [
        (30, {}),
        (30, {"share": (4,), "mask": (9,), "unmask": (17,)}),
        pytest.param(200, {"draw": (3,), "share": (50,), "mask": (7, 120), "unmask": (199,)}, marks=pytest.mark.slow),
    ],
)
def test_an_honest_session_sums_exactly_over_the_survivors(size: int, drops: dict[str, tuple[int, ...]]) -> None:
    run = SparseSession(size)
    total = run.run(drops)
    assert not run.refused
    k = run.server.parameters.degree  # type: ignore[union-attr]
    assert k == settings_for(size).parameters(size).degree and k < size - 1  # the finder's degree, sparse
    gone = {i for step in drops.values() for i in step if step is not drops.get("unmask")}
    assert set(run.server.survivors) == set(range(1, size + 1)) - gone
    assert np.array_equal(total, run.expected())
    for u, out in run.server.state.graph.items():
        assert len(out) == k and u not in out


# The buyer's hand ------------------------------------------------------------

View = tuple[list[int], list[int]]


def relay(run: SparseSession, u: int, out: tuple[int, ...], draws: dict[int, tuple[tuple[int, ...], bytes]]) -> dict:
    """The share-keys request the buyer builds for ``u`` from any draws it likes (``draws``: the in-neighbours')."""
    adverts = run.server.state.adverts
    union = sorted(set(out) | set(draws))
    return SparseShareKeysRequest(
        out_neighbours=list(out),
        neighbours=union,
        neighbour_node_ids=[run.nodes[v - 1] for v in union],
        cipher_public_keys=[adverts[v].cipher_public_key for v in union],
        mask_public_keys=[adverts[v].mask_public_key for v in union],
        signatures=[adverts[v].signature for v in union],
        cipher_key_proofs=[adverts[v].cipher_key_proof for v in union],
        in_neighbours=sorted(draws),
        in_draws=[pack_indices(draws[v][0]) for v in sorted(draws)],
        in_draw_signatures=[draws[v][1] for v in sorted(draws)],
    ).to_record()


def binding(run: SparseSession, participants: list[int], session: bytes = b"sparse-1") -> SessionBinding:
    return SessionBinding(RUN_ID, session, run.server.state.roster, roster_digest(session, participants))


@dataclasses.dataclass
class Unmasked:
    """What the buyer holds after playing the consistency and unmask rounds by hand."""

    replies: dict[int, dict[str, Any]]
    refused: dict[int, str]

    def shares(self, victim: int, kind: str) -> list[tuple[int, bytes]]:
        """The shares of ``victim``'s self-mask seed (``"b"``) or mask key (``"s"``) the buyer received."""
        indices, shares = (
            ("survivor_indices", "survivor_shares") if kind == "b" else ("dropped_indices", "dropped_shares")
        )
        return [
            (j, reply[shares][reply[indices].index(victim)])
            for j, reply in sorted(self.replies.items())
            if victim in reply[indices]
        ]


def play_views(run: SparseSession, masked: dict[int, dict[str, Any]], views: dict[int, View]) -> Unmasked:
    """Show each client its view, collect its signature, then hand it every signature of an out-neighbour shown the
    same view and every surviving dealer's signed masked-with list (more than the rules let the buyer give)."""
    for i in views:
        run.refused.pop(i, None)
    signatures = {}
    for i, (alive, gone) in sorted(views.items()):
        request = ConsistencyRequest(indices_to_bitmap(alive), indices_to_bitmap(gone)).to_record()
        reply = run.call(i, "sign_survivors", request, run.key(i))
        if reply is not None:
            signatures[i] = reply["signature"]
    graph, ins = run.server.state.graph, run.server.state.in_graph
    replies = {}
    for u, (alive, gone) in sorted(views.items()):
        if u not in signatures:
            continue
        signers = [v for v in graph[u] if v in signatures and views[v] == views[u]]
        dealers = [v for v in ins[u] if v in masked and masked[v]["masked_counts"] and v in alive]
        request = SparseUnmaskRequest(
            indices_to_bitmap(alive),
            indices_to_bitmap(gone),
            signers,
            [signatures[v] for v in signers],
            dealers,
            [pack_indices(masked[v]["masked_with"]) for v in dealers],
            [masked[v]["masked_with_signature"] for v in dealers],
        ).to_record()
        reply = run.call(u, "unmask", request)
        if reply is not None:
            replies[u] = reply
    return Unmasked(replies, {i: run.refused[i] for i in views if i in run.refused})


def to_masking(run: SparseSession, drops: dict[str, tuple[int, ...]] | None = None) -> dict[int, Any]:
    """An honest session up to the mask requests."""
    drops = drops or {}
    requests = run.advertise()
    requests = run.draw(requests, drops.get("draw", ()))
    return run.share(requests, drops.get("share", ()))


def masked_inputs(run: SparseSession, requests: dict[int, Any], tamper=None) -> dict[int, dict[str, Any]]:
    """Every client's masked input, the buyer keeping them rather than handing them to the server's checks."""
    tamper = tamper or {}
    replies = {}
    for i, request in sorted(requests.items()):
        record = tamper.get(i, lambda r: r)(request.to_record())
        reply = run.call(i, "mask_input", record, run.key(i))
        if reply is not None:
            replies[i] = reply
    return replies


# Rule 1: placement, settings and (k, t) ----------------------------------------


def test_the_buyer_cannot_place_a_victim_an_altered_or_forged_draw_is_refused() -> None:
    """The draw request carries no neighbour: the buyer's only hand is the relay. An out-neighbour list rewritten to
    seat the victim among chosen clients, a draw altered in flight, or one signed by another key, is refused: by the
    server's own check, by the victim (before it deals a share), and by the drawer (its own draw echoed otherwise)."""
    run = SparseSession(30)
    requests = run.advertise()
    assert set(requests[1].to_record()) == {"participants", "degree", "threshold", "node_ids"}  # no neighbour in it
    replies = {i: run.call(i, "draw", r.to_record(), run.key(i)) for i, r in requests.items()}
    victim, drawer = 1, 2
    out = tuple(replies[drawer]["out_neighbours"])
    if victim in out:  # make the altered draw name the victim where the honest one did not
        drawer = next(d for d in range(3, 31) if victim not in replies[d]["out_neighbours"])
        out = tuple(replies[drawer]["out_neighbours"])
    altered = tuple(sorted((set(out) - {out[0]}) | {victim}))
    forged_key = identity(9999)
    forged = binding(run, list(range(1, 31))).sign_draw(
        forged_key, drawer, altered, len(out), run.settings.parameters(30).threshold
    )
    honest = run.server.receive_draws(
        {**replies, drawer: OutNeighbourDraw(list(altered), replies[drawer]["signature"]).to_record()}
    )
    assert drawer not in honest and "draw refused" in run.server.excluded[drawer]  # the server's own check
    k, t = run.server.parameters.degree, run.server.parameters.threshold  # type: ignore[union-attr]
    draws = {
        v: (tuple(r["out_neighbours"]), r["signature"]) for v, r in replies.items() if victim in r["out_neighbours"]
    }
    victim_out = tuple(replies[victim]["out_neighbours"])
    for signature in (replies[drawer]["signature"], forged):
        state = dict(run.states[victim])
        reply = run.call(
            victim,
            "share_keys",
            relay(run, victim, victim_out, {**draws, drawer: (altered, signature)}),
            run.directory,
            run.key(victim),
        )
        assert reply is None and f"in-neighbour {drawer} refused" in run.refused[victim]
        run.states[victim] = state  # the victim, as it was: it dealt nothing
    colluders = tuple(range(2, 2 + k))  # seat the victim's shares with clients of the buyer's choosing
    state = dict(run.states[victim])
    assert run.call(victim, "share_keys", relay(run, victim, colluders, draws), run.directory, run.key(victim)) is None
    assert "not the ones this client drew" in run.refused[victim]
    run.states[victim] = state
    reply = run.call(victim, "share_keys", relay(run, victim, victim_out, draws), run.directory, run.key(victim))
    assert reply is not None and reply["receivers"] == list(victim_out) and reply["threshold"] == t  # its own draw


def test_the_buyer_cannot_put_a_colluder_behind_an_index_the_victim_drew() -> None:
    """The victim draws indices; the buyer relays the keys behind them. A colluder's keys and advert, signed by the
    colluder for the drawn index, are refused: the roster's node ids came with the draw request, checked against the
    roster fingerprint the victim signed (and node ids that do not match it are refused at the draw)."""
    run = SparseSession(30)
    requests = run.advertise()
    victim, colluder = 1, 30
    shuffled = dataclasses.replace(requests[victim], node_ids=packed(run.nodes[::-1]))
    assert run.call(victim, "draw", shuffled.to_record(), run.key(victim)) is None
    assert "do not match the roster fingerprint" in run.refused[victim]
    replies = {i: run.call(i, "draw", r.to_record(), run.key(i)) for i, r in requests.items()}
    victim_out = tuple(replies[victim]["out_neighbours"])
    slot = next(v for v in victim_out if v != colluder)
    draws = {
        v: (tuple(r["out_neighbours"]), r["signature"]) for v, r in replies.items() if victim in r["out_neighbours"]
    }
    record = relay(run, victim, victim_out, draws)
    at = record["neighbours"].index(slot)
    advert = run.server.state.adverts[colluder]
    record["neighbour_node_ids"][at] = run.nodes[colluder - 1]
    record["cipher_public_keys"][at] = advert.cipher_public_key
    record["mask_public_keys"][at] = advert.mask_public_key
    record["signatures"][at] = sign_advertisement(
        run.key(colluder),
        b"sparse-1",
        slot,
        run.nodes[colluder - 1],
        advert.cipher_public_key,
        advert.mask_public_key,
        run_id=RUN_ID,
        roster=run.server.state.roster,
        mode=run.server.settings.digest(),
    )
    assert run.call(victim, "share_keys", record, run.directory, run.key(victim)) is None
    assert "not the one the roster fingerprint puts at its index" in run.refused[victim]


def test_one_colluder_in_several_roster_slots_is_refused_at_the_draw() -> None:
    """The buyer builds the roster: node 999 (a colluder) at indices 38, 39 and 40 would count as three colluders
    in every draw and three members against each client's floor. Every honest client refuses at the draw, before it
    names an out-neighbour (red-team finding: distinct node ids, and a client's own at its index)."""
    size, colluder, slots = 40, 999, (38, 39, 40)
    run = SparseSession(size)
    nodes = [colluder if i + 1 in slots else 100 + i for i in range(size)]
    run.nodes = nodes
    run.directory = IdentityDirectory({n: public_key_of(identity(n)) for n in set(nodes)})
    server = run.server
    server.directory = server.core.directory = run.directory
    requests = server.core.advertise_requests([100 + i for i in range(size)])  # distinct, then the buyer's roster
    roster = roster_fingerprint(RUN_ID, b"sparse-1", nodes)
    server.core.state.node_of = {i + 1: n for i, n in enumerate(nodes)}
    server.core.state.roster = roster
    s = run.settings
    replies = {}
    for i in requests:
        request = SparseAdvertiseRequest(
            b"sparse-1", i, nodes[i - 1], NUM_CLASSES, 1000, roster, s.colluders, s.roster_floor, s.dropout_ppm,
            s.reruns, s.security_bits, s.markets,
        )  # fmt: skip
        reply = run.call(
            i, "advertise", request.to_record(), run.counts[i - 1], identity_key=run.key(i), settings=run.own,
            run_id=RUN_ID,
        )  # fmt: skip
        if reply is not None:
            replies[i] = reply
    draw_requests = server.receive_advertisements(replies)
    honest = [i for i in draw_requests if nodes[i - 1] != colluder]
    assert len(honest) == size - len(slots)
    draws = {i: run.call(i, "draw", draw_requests[i].to_record(), run.key(i)) for i in honest}
    assert all(draw is None for draw in draws.values())
    assert all("holds two roster slots" in run.refused[i] for i in honest)


def test_out_of_range_integers_and_index_0_are_refused_cleanly() -> None:
    """Negative or 2^64-sized node ids and indices are refused by the message parser, and an in-neighbour at index
    0 by the client, each as a PassError (no OverflowError or struct.error from deeper down)."""
    run = SparseSession(32)  # a whole number of bitmap bytes: index 0 would wrap round to slot 32, a member
    draw_requests = run.advertise()
    victim = next(iter(draw_requests))
    for bad in (-1, 2**64):
        record = dict(draw_requests[victim].to_record())
        record["degree"] = bad
        with pytest.raises(PassError, match=r"in \[0, 2\^64\)"):
            DrawRequest.coerce(record)
    other = SparseSession(32)
    ragged = {i: dataclasses.replace(r, node_ids=r.node_ids[:-3]) for i, r in other.advertise().items()}
    assert other.call(victim, "draw", ragged[victim].to_record(), other.key(victim)) is None
    assert "whole big-endian uint64 words" in other.refused[victim]
    share_requests = run.draw(draw_requests)
    share = dict(share_requests[victim].to_record())  # index 0 would alias the last slot (node_ids[-1])
    share["in_neighbours"] = [0, *share["in_neighbours"]]
    share["in_draws"] = [b"", *share["in_draws"]]
    share["in_draw_signatures"] = [b"", *share["in_draw_signatures"]]
    share["neighbours"] = [0, *share["neighbours"]]
    share["neighbour_node_ids"] = [run.nodes[-1], *share["neighbour_node_ids"]]
    for column in ("cipher_public_keys", "mask_public_keys", "signatures", "cipher_key_proofs"):
        share[column] = [share[column][0], *share[column]]
    assert run.call(victim, "share_keys", share, run.directory, run.key(victim)) is None
    assert "the in-neighbours must be other members of U1" in run.refused[victim]


def test_weaker_settings_or_another_k_t_are_refused_before_any_key_or_share() -> None:
    """Settings weaker than the node's own are refused at advertise (no key made); a (k, t) below the finder's, or
    any other than it, at the draw: no client draws, signs or deals anything."""
    own = settings_for(30)
    weaker = {
        "colluders": dataclasses.replace(own, colluders=own.colluders - 1),
        "floor": dataclasses.replace(own, roster_floor=own.roster_floor + 1),
        "dropout": dataclasses.replace(own, dropout_ppm=own.dropout_ppm - 1),
        "reruns": dataclasses.replace(own, reruns=own.reruns - 1),
        "bits": dataclasses.replace(own, security_bits=own.security_bits - 1),
    }
    for name, session_settings in weaker.items():
        run = SparseSession(30, own=own)
        run.server.settings = session_settings
        with pytest.raises(PassError, match="advertised valid keys"):
            run.advertise()
        assert len(run.refused) == 30 and all("weaker than this node's" in why for why in run.refused.values()), name
        assert all(SparseSecureClient(s).stage == 0 for s in run.states.values())  # nothing made
    wanted = own.parameters(30)
    for k, t in (
        (wanted.degree - 2, wanted.threshold - 1),
        (wanted.degree, wanted.threshold - 1),
        (wanted.degree + 1, wanted.threshold),
    ):
        run = SparseSession(30)
        requests = run.advertise()
        low = {i: DrawRequest(r.participants, k, t, r.node_ids) for i, r in requests.items()}
        share_requests = run.draw(low)
        assert share_requests == {} and len(run.refused) == 30
        assert all("is not the finder's" in why for why in run.refused.values())
        assert all(not SparseSecureClient(s).out_neighbours for s in run.states.values())


def test_different_u1_or_k_t_shown_to_one_client_is_refused_by_its_holders() -> None:
    """The buyer shows one client another U1 (same size) or, after stronger settings it accepts, another (k, t): its
    signed draw carries them, and every out-neighbour it names refuses it before dealing a share."""
    run = SparseSession(32)
    run.settings = settings_for(32)
    run.own = dataclasses.replace(run.settings, roster_floor=30)
    run.server.settings = run.own
    requests = run.advertise(drop=(31, 32))  # U1 = 1..30; the buyer shows client 5 U1' = 1..29 + {31}
    members = list(range(1, 31))
    replies = {i: run.call(i, "draw", r.to_record(), run.key(i)) for i, r in requests.items() if i != 5}
    other = [*range(1, 30), 31]
    shown = DrawRequest(indices_to_bitmap(other), requests[5].degree, requests[5].threshold, requests[5].node_ids)
    client5 = SparseSecureClient(run.states[5], draw=lambda n: 0)  # a draw that happens to avoid the outsider 31
    replies[5] = client5.draw(shown, run.key(5)).to_record()  # a client cannot tell: its holders can
    out5 = tuple(replies[5]["out_neighbours"])
    assert set(out5) <= set(members)
    holder = out5[0]
    draws = {
        v: (tuple(r["out_neighbours"]), r["signature"]) for v, r in replies.items() if holder in r["out_neighbours"]
    }
    holder_out = tuple(replies[holder]["out_neighbours"])
    assert run.call(holder, "share_keys", relay(run, holder, holder_out, draws), run.directory, run.key(holder)) is None
    assert "in-neighbour 5 refused: out-neighbour draw of client 5 does not verify" in run.refused[holder]
    # Another (k, t): client 6 accepts stronger settings (one more colluder) and signs the finder's (k', t') for them.
    stronger = dataclasses.replace(run.own, colluders=run.own.colluders + 1)
    assert stronger.parameters(30).degree != run.own.parameters(30).degree
    session = SparseSession(30)
    session.own = run.own
    session.server.settings = run.own
    requests = session.advertise()
    replies = {i: session.call(i, "draw", r.to_record(), session.key(i)) for i, r in requests.items()}
    fresh = SparseSecureClient()
    advert_request = SparseAdvertiseRequest(
        b"sparse-1",
        6,
        session.nodes[5],
        NUM_CLASSES,
        1000,
        session.server.state.roster,
        stronger.colluders,
        stronger.roster_floor,
        stronger.dropout_ppm,
        stronger.reruns,
        stronger.security_bits,
        stronger.markets,
    )
    fresh.advertise(advert_request, session.counts[5], identity_key=session.key(6), settings=session.own, run_id=RUN_ID)
    wanted = stronger.parameters(30)
    draw6 = fresh.draw(
        DrawRequest(indices_to_bitmap(range(1, 31)), wanted.degree, wanted.threshold, packed(session.nodes)),
        session.key(6),
    )
    holder = draw6.out_neighbours[0]
    draws = {
        v: (tuple(r["out_neighbours"]), r["signature"])
        for v, r in replies.items()
        if holder in r["out_neighbours"] and v != 6
    }
    draws[6] = (tuple(draw6.out_neighbours), draw6.signature)
    holder_out = tuple(replies[holder]["out_neighbours"])
    got = session.call(
        holder, "share_keys", relay(session, holder, holder_out, draws), session.directory, session.key(holder)
    )
    assert got is None and "in-neighbour 6 is not 26 members" in session.refused[holder]  # k' = 27 draws


# Rule 3: the masked-with lists -------------------------------------------------


def everyone(run: SparseSession, masked: dict[int, dict[str, Any]]) -> dict[int, View]:
    """The honest view: every client that sent a masked input survived, the others of U2 dropped."""
    alive = sorted(i for i, r in masked.items() if r["masked_counts"])
    gone = sorted(set(run.server.state.u2) - set(alive))
    return {i: (alive, gone) for i in alive}


def test_a_masked_with_list_replayed_from_another_session_is_refused() -> None:
    """The buyer hands a holder its dealer's signed list from an earlier session (same clients, same keys): the
    signature binds the session, the run, the roster and U1, so the holder refuses to unmask and reveals nothing."""
    first = SparseSession(30, session=b"sparse-0")
    first.run()
    old_lists = dict(first.server.lists)
    run = SparseSession(30)
    masked = masked_inputs(run, to_masking(run))
    victim = 1
    holder = run.server.state.graph[victim][0]
    assert holder in old_lists[victim][0]  # the old list names the holder too: only its binding differs
    masked[victim] = {
        **masked[victim],
        "masked_with": list(old_lists[victim][0]),
        "masked_with_signature": old_lists[victim][1],
    }
    got = play_views(run, masked, everyone(run, masked))
    assert holder not in got.replies and "masked-with list of dealer 1 refused" in got.refused[holder]
    assert all(j not in got.replies for j in run.server.state.graph[victim])  # every holder of the victim refuses
    assert got.shares(victim, "b") == []


def test_a_one_sided_edge_gets_no_self_mask_share() -> None:
    """The buyer tells the victim that holder j never completed key sharing (j is told the victim did): the victim's
    signed list omits j, so j does not reveal its share of the victim's self-mask seed, while it answers for every
    dealer whose list names it. Told the other way round (j told the victim never completed), j's own list omits the
    victim, and j answers no view in which the victim is a survivor or dropped."""
    run = SparseSession(30)
    requests = to_masking(run)
    victim = 1
    j = run.server.state.graph[victim][0]
    cut = {victim: lambda r: {**r, "completed": [v for v in r["completed"] if v != j]}}
    masked = masked_inputs(run, requests, tamper=cut)
    assert j not in masked[victim]["masked_with"] and victim in masked[j]["masked_with"]
    got = play_views(run, masked, everyone(run, masked))
    assert j in got.replies and victim not in got.replies[j]["survivor_indices"]
    assert len(got.replies[j]["survivor_indices"]) == len(run.server.state.in_graph[j]) - 1  # all the others
    assert len(got.shares(victim, "b")) == len(run.server.state.graph[victim]) - 1  # every holder but j
    # The other way round: j is told the victim never completed; it keeps the victim's shares but masked without it.
    run = SparseSession(30)
    requests = to_masking(run)
    j = run.server.state.graph[victim][0]
    cut = {j: lambda r: {**r, "completed": [v for v in r["completed"] if v != victim]}}
    masked = masked_inputs(run, requests, tamper=cut)
    assert victim not in masked[j]["masked_with"]
    alive, gone = everyone(run, masked)[j]
    without = [v for v in alive if v != victim]
    for view in ((alive, gone), (without, sorted([*gone, victim]))):  # the victim a survivor, then dropped
        saved = dict(run.states[j])
        got = play_views(run, masked, {j: view})
        assert j not in got.replies and "do not match the neighbours that completed" in got.refused[j]
        run.states[j] = saved


# Rule 4: one survivor set, signed by t out-neighbours ----------------------------


@pytest.mark.parametrize("dropped_side", [2, 15, 27])
def test_split_survivor_views_never_open_both_secrets_of_a_victim(dropped_side: int) -> None:
    """The buyer shows the victim and some clients "everyone survived" and the others (``dropped_side`` of them) "the
    victim dropped", to get its self-mask seed from the first and its mask key from the second. A holder unmasks only
    with ``t`` signatures of its own out-neighbours on its own set: a side too small for that refuses, and the buyer
    never holds ``t`` shares of both secrets."""
    run = SparseSession(30)
    masked = masked_inputs(run, to_masking(run))
    victim, t = 1, run.server.parameters.threshold  # type: ignore[union-attr]
    honest = everyone(run, masked)[victim]
    split = ([v for v in honest[0] if v != victim], sorted([*honest[1], victim]))
    others = [i for i in honest[0] if i != victim]
    side = set(random.Random(dropped_side).sample(others, dropped_side))
    views = {i: (split if i in side else honest) for i in honest[0]}
    got = play_views(run, masked, views)
    b, s = got.shares(victim, "b"), got.shares(victim, "s")
    assert not (len(b) >= t and len(s) >= t)
    graph = run.server.state.graph
    for j in views:  # whoever answered had t out-neighbours shown its own set; whoever lacked them refused
        same = sum(1 for v in graph[j] if views[v] == views[j])
        assert (j in got.replies) == (same >= t), (j, same, got.refused.get(j))
        if same < t:
            assert "out-neighbour" in got.refused[j] and (
                "signed this survivor set" in got.refused[j] or "signatures" in got.refused[j]
            )
    if dropped_side == 2:  # the large side unmasks as usual: the victim's self-mask seed, never its mask key
        assert len(b) >= t and len(s) == 0
    if dropped_side == 15:  # two halves: neither side has t signatures, the buyer gets nothing
        assert got.replies == {}


# In-degree and isolation (E = 80, where the graph is sparser) ---------------------


def test_an_in_degree_over_the_cap_is_refused_before_any_share() -> None:
    """Colluders (here every other client, re-signing its draw to name the victim) flood the victim's in-degree: at the
    finder's cap the victim still deals its shares, one above it it refuses before dealing any."""
    run = SparseSession(80)
    requests = run.advertise()
    replies = {i: run.call(i, "draw", r.to_record(), run.key(i)) for i, r in requests.items()}
    victim = 1
    wanted = run.settings.parameters(80)
    assert wanted.in_degree_cap < 79
    seal = binding(run, list(range(1, 81)))
    draws = {}
    for v, reply in replies.items():
        out = tuple(reply["out_neighbours"])
        if v != victim and victim not in out:
            out = tuple(sorted((set(out) - {out[0]}) | {victim}))
        draws[v] = (out, seal.sign_draw(run.key(v), v, out, wanted.degree, wanted.threshold))
    victim_out = tuple(replies[victim]["out_neighbours"])
    flood = {v: draws[v] for v in sorted(draws) if v != victim}
    at_cap = dict(list(flood.items())[: wanted.in_degree_cap])
    saved = dict(run.states[victim])
    over = run.call(victim, "share_keys", relay(run, victim, victim_out, flood), run.directory, run.key(victim))
    assert (
        over is None
        and f"{len(flood)} in-neighbours, above the in-degree cap {wanted.in_degree_cap}" in run.refused[victim]
    )
    run.states[victim] = saved
    reply = run.call(victim, "share_keys", relay(run, victim, victim_out, at_cap), run.directory, run.key(victim))
    assert reply is not None and reply["receivers"] == list(victim_out)  # its shares go to its own draw only


def test_declaring_every_neighbour_of_a_victim_dropped_gets_no_self_mask_share() -> None:
    """To read the victim's input alone, the buyer declares all its out- and in-neighbours dropped and shows everyone
    that one set: its out-neighbours, listed as dropped, refuse; the victim, with fewer than ``t`` out-neighbours
    alive, refuses; the buyer gets no share of the victim's self-mask seed."""
    run = SparseSession(80)
    masked = masked_inputs(run, to_masking(run))
    victim = 1
    graph, ins = run.server.state.graph, run.server.state.in_graph
    around = set(graph[victim]) | set(ins[victim])
    alive, gone = everyone(run, masked)[victim]
    assert len(around) < 79  # not everyone: the set has survivors besides the victim
    isolating = ([v for v in alive if v not in around], sorted(set(gone) | (around & set(alive))))
    got = play_views(run, masked, {i: isolating for i in alive})
    assert got.shares(victim, "b") == []
    assert "out-neighbours survived" in got.refused[victim]
    assert all("not listed as a survivor" in got.refused[j] for j in graph[victim])


# The messages and the pieces -----------------------------------------------------

SPARSE_MESSAGES = (
    messages.SparseAdvertiseRequest,
    messages.DrawRequest,
    messages.OutNeighbourDraw,
    messages.SparseShareKeysRequest,
    messages.SparseMaskRequest,
    messages.SparseMaskedInput,
    messages.SparseUnmaskRequest,
)
VALUES = {
    "int": st.integers(0, 2**63 - 1),
    "bytes": st.binary(max_size=80),
    "list[int]": st.lists(st.integers(0, 2**31), max_size=6),
    "list[bytes]": st.lists(st.binary(max_size=40), max_size=6),
}


@st.composite
def sparse_message(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(SPARSE_MESSAGES))
    return kind(**{f.name: draw(VALUES[str(f.type)]) for f in dataclasses.fields(kind)})


@given(sparse_message())
@settings(max_examples=300, deadline=None)
def test_every_sparse_message_round_trips_through_its_record(message: Any) -> None:
    record = message.to_record()
    assert type(message).from_record(record) == message
    assert type(message).coerce(record) == message
    name = dataclasses.fields(message)[0].name
    with pytest.raises(PassError, match=name):
        type(message).from_record({k: v for k, v in record.items() if k != name})
    with pytest.raises(PassError, match=name):
        type(message).from_record({**record, name: 1.5})


@given(st.sets(st.integers(1, 2**32 - 1), max_size=40))
def test_packed_index_lists_round_trip_and_refuse_what_is_not_ascending(indices: set[int]) -> None:
    ordered = sorted(indices)
    assert unpack_indices(pack_indices(ordered)) == tuple(ordered)
    if len(ordered) > 1:
        with pytest.raises(PassError, match="increasing"):
            unpack_indices(pack_indices(ordered[::-1]))
    with pytest.raises(PassError, match="whole 4-byte words"):
        unpack_indices(pack_indices(ordered) + b"\x00")


@given(st.integers(3, 60), st.data())
def test_a_draw_is_k_distinct_others(size: int, data: st.DataObject) -> None:
    own = data.draw(st.integers(1, size))
    k = data.draw(st.integers(1, size - 1))
    rng = random.Random(data.draw(st.integers(0, 2**32)))
    out = draw_out_neighbours(range(1, size + 1), own, k, rng.randrange)
    assert len(out) == k == len(set(out)) and own not in out and list(out) == sorted(out)
    assert set(out) <= set(range(1, size + 1))


def test_a_draw_is_uniform_over_the_others() -> None:
    """Each other participant is drawn with probability k / (n - 1): 20,000 draws of 3 among 9, within 4 sd."""
    rng = random.Random(7)
    hits = np.zeros(11, dtype=int)
    for _ in range(20_000):
        for v in draw_out_neighbours(range(1, 11), 5, 3, rng.randrange):
            hits[v] += 1
    expected, sd = 20_000 * 3 / 9, np.sqrt(20_000 * (3 / 9) * (6 / 9))
    assert hits[5] == 0 and all(abs(hits[v] - expected) < 4 * sd for v in range(1, 11) if v != 5)


def test_settings_name_each_way_they_are_weaker() -> None:
    own = SparseSecureSettings.of(colluders=5, roster_floor=100, dropout=0.05, reruns=2)
    assert own.weaker_than(own) == [] and own.dropout_ppm == 50_000
    stronger = SparseSecureSettings(6, 90, 60_000, 3, 41)
    assert stronger.weaker_than(own) == []
    assert len(SparseSecureSettings(4, 101, 49_999, 1, 39).weaker_than(own)) == 5
    # placements are counted whole: more re-runs over fewer markets is weaker where it covers fewer placements
    assert SparseSecureSettings(5, 100, 50_000, 5, 40, own.markets // 2).weaker_than(own) == []  # 6 x m/2 = 3 x m
    (fewer,) = SparseSecureSettings(5, 100, 50_000, 4, 40, own.markets // 2).weaker_than(own)
    assert fewer.startswith(f"degrees sized for {5 * own.markets // 2:,} placements")
    assert own.placements == 3 * 65_536 and own.parameters(100).reruns == own.placements - 1  # the finder's bound
    with pytest.raises(PassError, match="dropout_ppm"):
        SparseSecureSettings(1, 10, 1_000_000, 0)
    with pytest.raises(PassError, match="colluders"):
        SparseSecureSettings(-1, 10, 0, 0)
    with pytest.raises(PassError, match="no sparse secure degree"):
        own.parameters(50)  # a roster below the floor: the finder refuses it
