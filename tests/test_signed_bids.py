"""Signed bids in the award's head (issue 50): every row the outcome depends on carries its bidder's signature, and
every winner checks every row before it endorses (only a winner opens anything, and only for the award it endorsed).
The buyer's head-row attack (rows under other bidders' ids with worse bids, so that a chosen honest loser becomes a
"winner" and opens its counts) is played at full strength at the secure profile's defaults (E = 10) and in the sparse
secure mode (E = 60, three colluders stated), for every honest loser: no honest winner of the forged award endorses
it, nothing opens, and the honest award still opens exactly its winners. What signed rows leave the buyer,
leaving bidders out, is played too and its reach asserted to be exactly the stated bound (docs/threat-model.md, "The
binding award")."""

from __future__ import annotations

import dataclasses
import logging
import math
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from adversary import NUM_CLASSES, make_counts, market_config, signed_app
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_award import (
    TERMS,
    MaliciousPhase,
    _AttackDone,
    award_for,
    endorse_requests,
    endorsed,
    fields_of,
    opened,
    send_all,
)
from test_binding_award import NODES, _colluder_keys, play
from test_sparse_secure_market import sparse_federation

from flmarket_flwr.market import CostBasedBid, MarketPhase
from flmarket_flwr.market.buyer.pass_rounds import PassResult
from flmarket_flwr.market.wire import award as award_module
from flmarket_flwr.market.wire.award import (
    Award,
    AwardError,
    Bidder,
    binding_quorum,
    build_award,
    check_award,
    count_endorsements,
    head_of,
    settle,
    sign_award,
)
from flmarket_flwr.market.wire.messages import ACTION_AUDIT, ACTION_BID, ACTION_ENDORSE, KEY_BID_SIGNATURE, RECORD_KEY
from flmarket_flwr.market.wire.profiles import PROFILE_COLLUDER_SHARE
from flmarket_flwr.pass_protocol import generate_identity
from flmarket_flwr.pass_protocol.identity import (
    bid_message,
    sign_award_endorsement,
    sign_bid,
    verify_award_endorsement,
    verify_bid,
)
from simulations.inprocess_grid import InProcessGrid, market_client_app

STATED = math.ceil(PROFILE_COLLUDER_SHARE * NODES)
QUORUM = binding_quorum(NODES, STATED)
SPARSE_NODES = 60
SPARSE_COLLUDERS = 3
SPARSE_QUORUM = binding_quorum(SPARSE_NODES, SPARSE_COLLUDERS)
"""In the sparse mode a winner counts endorsements over the pinned directory (here the 60 nodes): 32."""
SPARSE_BUDGET = 100.0
NOT_SIGNED = "row in the award's head is not a bid it signed"

Rows = dict[int, tuple[float, float]]


@pytest.fixture(autouse=True)
def ledger_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "flmarket-home"
    monkeypatch.setenv("FLMARKET_HOME", str(home))
    return home


# --- The signed bid and the signed head ---------------------------------------------------------------------------
BID = {"run_id": 7, "session": b"s", "transcript": b"t", "index": 3, "node_id": 42, "score": 1.5, "bid": 2.0}


@pytest.mark.parametrize(
    "field, value",
    [("run_id", 8), ("session", b"s2"), ("transcript", b"t2"), ("index", 4), ("node_id", 43), ("score", 1.25),
     ("bid", 2.5)],
)  # fmt: skip
def test_a_bid_signature_binds_every_field(field: str, value: object) -> None:
    key, public = generate_identity()
    signature = sign_bid(key, **BID)  # type: ignore[arg-type]
    verify_bid(public, signature, **BID)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="does not verify"):
        verify_bid(public, signature, **(BID | {field: value}))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="does not verify"):  # nor is it an endorsement of anything
        verify_award_endorsement(public, signature, bid_message(**BID)[-32:])  # type: ignore[arg-type]


def _signed_award(bids: Rows, keys: Mapping[int, Ed25519PrivateKey]) -> tuple[Award, Any]:
    """The honest award over ``bids`` (run 1, session ``s``, transcript ``t``, PASS index = place in ascending node
    id), each row signed by its bidder."""
    survivors = list(enumerate(sorted(bids), start=1))
    signatures = {
        node: sign_bid(keys[node], run_id=1, session=b"s", transcript=b"t", index=index, node_id=node, score=s, bid=b)
        for index, node in survivors
        for s, b in [bids[node]]
    }
    return build_award(1, b"s", b"t", TERMS, survivors, bids, signatures=signatures)


BIDS: Rows = {11: (50.0, 3.0), 12: (40.0, 2.0), 13: (30.0, 4.0), 14: (20.0, 1.0), 15: (5.0, 9.0), 16: (1.0, 9.5)}
KEYS = {node: generate_identity()[0] for node in BIDS}


def _check(award: Award, tree: Any, node: int, signers: Mapping[int, tuple[int, bytes]] | None) -> None:
    score, bid = BIDS[node]
    index = sorted(BIDS).index(node) + 1
    check_award(
        award, run_id=1, session=b"s", transcript=b"t", terms=TERMS, survivors=len(BIDS), rank=index - 1,
        index=index, node_id=node, score=score, bid=bid, proof=tree.proof(node), survivor_nodes=set(BIDS),
        bid_signers=signers,
    )  # fmt: skip


def _signers() -> dict[int, tuple[int, bytes]]:
    return {node: (i, KEYS[node].public_key().public_bytes_raw()) for i, node in enumerate(sorted(BIDS), start=1)}


def test_a_signed_head_encodes_under_its_own_label_and_an_unsigned_one_keeps_its_bytes() -> None:
    signed, tree = _signed_award(BIDS, KEYS)
    unsigned = dataclasses.replace(signed, head=tuple(dataclasses.replace(b, signature=b"") for b in signed.head))
    assert signed.signed_bids and not unsigned.signed_bids
    assert Award.decode(signed.encode()) == signed and Award.decode(unsigned.encode()) == unsigned
    label = b"flmarket/v1/award"
    assert unsigned.encode()[: 8 + len(label)] == struct.pack(">Q", len(label)) + label  # the default profile's bytes
    longer = len(b"/signed-bids")
    assert len(signed.encode()) == len(unsigned.encode()) + longer + 64 * len(signed.head)  # 64 bytes a row
    with pytest.raises(AwardError, match="every row of the head carries its bidder's signature or none"):
        dataclasses.replace(signed, head=(dataclasses.replace(signed.head[0], signature=b""), *signed.head[1:]))
    signed_label = b"flmarket/v1/award/signed-bids"
    no_head = dataclasses.replace(unsigned, head=(), winners=()).encode()[8 + len(label) :]
    with pytest.raises(AwardError, match="at least one bidder"):  # one encoding per award: an empty head is unsigned
        Award.decode(struct.pack(">Q", len(signed_label)) + signed_label + no_head)
    with pytest.raises(AwardError, match="wrong label"):
        Award.decode(struct.pack(">Q", len(label)) + b"flmarket/v1/awarX" + no_head)


def test_every_winner_checks_every_head_row_against_its_bidders_key() -> None:
    """The honest signed award passes every bidder's checks; one row re-signed by any other key, or a bidder without a
    key or PASS index in the session, is refused by every winner (not only by the bidder whose row it is); a loser,
    which opens nothing, does not check the rows."""
    award, tree = _signed_award(BIDS, KEYS)
    for node in BIDS:
        _check(award, tree, node, _signers())
    victim = next(b.node_id for b in award.head if b.node_id not in award.winners[:1])
    other = Ed25519PrivateKey.generate()
    forged_signature = sign_bid(
        other, run_id=1, session=b"s", transcript=b"t", index=sorted(BIDS).index(victim) + 1, node_id=victim,
        score=BIDS[victim][0], bid=BIDS[victim][1],
    )  # fmt: skip
    resigned = dataclasses.replace(award, head=(dataclasses.replace(award.head[0], signature=forged_signature),
                                                *award.head[1:]))  # fmt: skip
    without = {n: signer for n, signer in _signers().items() if n != victim}
    assert set(award.winners) - {victim} and set(BIDS) - set(award.winners)
    for node in BIDS:
        if node in award.winners:
            with pytest.raises(AwardError, match=f"node {victim}'s {NOT_SIGNED}"):
                _check(resigned, tree, node, _signers())
        else:
            _check(resigned, tree, node, _signers())  # a loser's endorsement opens nothing: it skips the rows
        if node in award.winners and node != victim:
            with pytest.raises(AwardError, match=f"node {victim} of the award's head has no key or PASS index"):
                _check(award, tree, node, without)
        if node != victim:
            _check(resigned, tree, node, None)  # without the keys (the default profile) rows are not checked


def test_a_head_row_under_a_bidders_id_with_another_bid_is_refused_by_every_winner_it_does_not_name() -> None:
    """The issue's head-row attack on the pure checks: the top bidder listed with a worse bid (under its own signature,
    on the bid it made), just below the last winner so that it stays in the head; every figure recomputed as a bidder
    recomputes it. Every winner of the forged award now refuses."""
    award, tree = _signed_award(BIDS, KEYS)
    top, last = award.winners[0], award.winners[-1]
    ratio = BIDS[last][0] / BIDS[last][1]
    rows = [(n, s, s / (ratio * 0.99) if n == top else b) for n, (s, b) in BIDS.items()]
    winners, payments = settle(TERMS, rows)
    head, _ = head_of(TERMS, rows)
    by_node = {n: (s, b) for n, s, b in rows}
    signature = {b.node_id: b.signature for b in award.head}
    signature |= {n: award.head[0].signature for n in BIDS if n not in signature}  # any 64 bytes the buyer has
    forged = dataclasses.replace(
        award,
        head=tuple(Bidder(n, *by_node[n], payments[n], signature[n]) for n in head),
        winners=winners,
    )
    assert forged.winners != award.winners and forged.bidder(top) is not None
    assert set(forged.winners) - {top}
    for node in set(forged.winners) - {top}:
        with pytest.raises(AwardError, match=NOT_SIGNED):
            _check(forged, tree, node, _signers())


@settings(max_examples=50, deadline=None)
@given(st.lists(st.booleans(), min_size=3, max_size=40), st.integers(1, 40))
def test_a_winner_verifies_endorsements_only_until_it_has_the_quorum(valid: list[bool], enough: int) -> None:
    """``count_endorsements`` with ``enough`` returns ``min(valid ones, enough)`` and stops verifying at ``enough``
    valid ones: at most ``enough + invalid ones before them`` verifications, never the rest."""
    keys = {node: generate_identity() for node in range(len(valid))}
    directory = {node: public for node, (_, public) in keys.items()}
    digest = b"d" * 32
    endorsements = {
        node: sign_award_endorsement(keys[node][0], digest if good else b"x" * 32) for node, good in enumerate(valid)
    }
    calls: list[int] = []
    original = award_module.verify_award_endorsement

    def counted(key: bytes, signature: bytes, what: bytes) -> None:
        calls.append(1)
        original(key, signature, what)

    award_module.verify_award_endorsement = counted  # type: ignore[assignment]
    try:
        counted_valid = count_endorsements(digest, endorsements, directory, own_node=-1, enough=enough)
    finally:
        award_module.verify_award_endorsement = original  # type: ignore[assignment]
    assert counted_valid == min(sum(valid), enough)
    stop = next((i + 1 for i in range(len(valid)) if sum(valid[: i + 1]) == enough), len(valid))
    assert len(calls) == stop
    assert count_endorsements(digest, endorsements, directory, own_node=-1) == sum(valid)


# --- The attack, played with the real handlers --------------------------------------------------------------------
def _ranked(bids: Rows) -> list[int]:
    """The bidders in the auction's order: score over bid, descending."""
    return sorted(bids, key=lambda node: (-bids[node][0] / bids[node][1], node))


def _forged_award(phase: Any, honest: Award, rows: Rows, signatures: Mapping[int, bytes]) -> Award:
    """``honest`` with the head, winners and payments of the auction over ``rows``, every figure recomputed exactly as
    a bidder recomputes it, each row with the signature ``signatures`` gives its node."""
    listed = [(node, score, bid) for node, (score, bid) in rows.items()]
    head, _ = head_of(phase.terms, listed)
    winners, payments = settle(phase.terms, listed)
    entries = tuple(Bidder(node, *rows[node], payments[node], signatures[node]) for node in head)
    return dataclasses.replace(honest, head=entries, winners=winners)


def _demoted(terms: Any, bids: Rows, victim: int, honest: list[int]) -> tuple[Rows, list[int]]:
    """The head-row attack's rows: honest bidders ranked above ``victim`` listed one after another (in rank order)
    with a bid that ranks them just below it (so they stay in the head, as the next bidders after the winners), until
    ``victim`` wins the auction over the rows; and the bidders so listed."""
    ratio = bids[victim][0] / bids[victim][1]
    ranked = _ranked(bids)
    rows, listed = dict(bids), []
    for node in ranked[: ranked.index(victim)]:
        if node not in honest:
            continue  # a colluder's row stays the bid it signed: what the profile allows
        score, _ = bids[node]
        rows[node] = (score, score / (ratio * (1.0 - 1e-9 * (len(listed) + 1))))
        listed.append(node)
        if victim in settle(terms, [(n, s, b) for n, (s, b) in rows.items()])[0]:
            break
    return rows, listed


def head_row_attack(seen: dict[str, Any], key_root: Path, colluders: int, allowed: int, pick: int) -> Any:
    """Among the honest losers of the honest award that listing at most ``allowed`` (``n - q``) honest bidders with
    worse bids makes "winners" (those the attack opened before signed rows), take the ``pick``-th by rank: list the
    honest bidders ranked above it with worse bids (under their own ids and their own signatures, on the bids they
    made), have the forged award endorsed, add the ``colluders``' endorsements (the lowest-ranked bidders; the buyer
    holds their keys, under ``key_root``), and audit its winners. One try a market: a loser's endorsement is spent on
    the award it endorsed."""

    def attack(phase, grid, pass_result: PassResult, bids):  # type: ignore[no-untyped-def]
        keys = _colluder_keys(key_root, _ranked(bids)[len(bids) - colluders :])
        honest_award, _ = award_for(phase, grid, pass_result, bids)
        honest = [node for node in bids if node not in keys]
        reachable = []
        for victim in [n for n in _ranked(bids) if n in honest and n not in honest_award.winners]:
            rows, listed = _demoted(phase.terms, bids, victim, honest)
            forged = _forged_award(phase, honest_award, rows, phase.bid_signatures)
            if victim in forged.winners and len(listed) <= allowed and any(forged.bidder(n) for n in listed):
                reachable.append((victim, listed, forged))  # a listed row decides the outcome: a head-row attack
        victim, listed, forged = reachable[pick]
        _, tree = award_for(phase, grid, pass_result, bids)
        signed = sign_award(forged, phase._buyer_key)  # pylint: disable=protected-access
        ends = endorsed(send_all(phase, grid, ACTION_ENDORSE, endorse_requests(pass_result, signed, tree, bids)))
        honest_ends = set(ends)
        ends |= {node: sign_award_endorsement(key, signed.digest) for node, key in keys.items()}
        audits = send_all(phase, grid, ACTION_AUDIT, {w: fields_of(pass_result, signed, ends) for w in forged.winners})
        seen.update(victim=victim, rank=_ranked(bids).index(victim) + 1, listed=listed, endorsers=honest_ends,
                    endorsements=len(ends), opened=opened(audits), winners=set(forged.winners), honest=set(honest),
                    honest_winners=set(honest_award.winners), reachable=len(reachable))  # fmt: skip

    return attack


def _assert_the_head_row_attack_fails(seen: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    print(f"head-row attack: rank {seen['rank']}, {len(seen['listed'])} rows listed, {seen['endorsements']} "
          f"endorsements, opened {sorted(seen['opened'])}, {seen['reachable']} losers reachable before")  # fmt: skip
    assert seen["listed"] and seen["victim"] in seen["winners"] and seen["victim"] not in seen["honest_winners"]
    honest_winners = seen["winners"] & seen["honest"]
    assert not honest_winners & seen["endorsers"]  # every honest winner of the forged award refused it
    assert seen["endorsers"]  # the losers endorsed (a loser's endorsement opens nothing): the nodes were live
    assert seen["opened"] == set()
    refusals = [r.getMessage() for r in caplog.records if NOT_SIGNED in r.getMessage()]
    assert len(refusals) >= len(honest_winners - set(seen["listed"]))  # refused for the rows' signatures


@pytest.mark.parametrize("pick", [0, 1, -1], ids=["shallowest", "second", "deepest"])
def test_the_head_row_attack_opens_no_one_at_the_profiles_defaults(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, pick: int
) -> None:
    """E = 10, R = 40, the profile's defaults (``c = 2`` stated, the buyer holding both colluders' keys, the two
    lowest-ranked bidders). Before signed rows this attack opened the losers ranked 2nd and 4th."""
    caplog.set_level(logging.WARNING)
    seen: dict[str, Any] = {}
    play(tmp_path, head_row_attack(seen, tmp_path, STATED, NODES - QUORUM, pick), seed=21)
    _assert_the_head_row_attack_fails(seen, caplog)
    assert seen["reachable"] == 3  # ranks 2 to 4: listing three honest bidders at most, n - q = 3


def sparse_phase(tmp_path: Path, attack: Any, **node_config: Any) -> tuple[Any, Any]:
    """The E = 60 sparse federation (three colluders stated, ``node_config`` added to each node's) and the buyer
    that plays ``attack`` in the sparse mode."""
    grid, directory, _, _ = sparse_federation(
        tmp_path, num_nodes=SPARSE_NODES, seed=50, **{"pass-colluders": SPARSE_COLLUDERS, **node_config}
    )
    # At E = 60 the cost rule would keep the complete graph: the sparse mode is asked for.
    phase = MaliciousPhase(
        attack, security="malicious", directory=directory, pass_colluders=SPARSE_COLLUDERS, budget=SPARSE_BUDGET,
        num_classes=NUM_CLASSES, timeout_per_node=0.0, neighbours="sparse",
    )  # fmt: skip
    assert phase.config.runs_sparse(SPARSE_NODES)
    return grid, phase


@pytest.mark.parametrize("pick", [0, -1], ids=["shallowest", "deepest"])
def test_the_head_row_attack_opens_no_one_in_the_sparse_mode(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, pick: int
) -> None:
    """E = 60 in the sparse secure mode, three colluders stated (quorum 32 over the directory), the shallowest and the
    deepest loser the attack reached before signed rows (listing up to 28 honest bidders). Before, it opened the
    losers ranked 12th and 27th with 48 and 33 endorsements."""
    caplog.set_level(logging.WARNING)
    seen: dict[str, Any] = {}
    attack = head_row_attack(seen, tmp_path, SPARSE_COLLUDERS, SPARSE_NODES - SPARSE_QUORUM, pick)
    grid, phase = sparse_phase(tmp_path, attack)
    with pytest.raises(_AttackDone):
        phase.run(grid)
    _assert_the_head_row_attack_fails(seen, caplog)
    assert seen["reachable"] >= 20


# --- What signed rows leave the buyer: leaving bidders out ---------------------------------------------------------
def _left_out(terms: Any, bids: Rows, victim: int, honest: list[int]) -> list[int]:
    """The honest bidders ranked above ``victim`` the buyer leaves out, in rank order, until ``victim`` wins the
    auction over the bids it keeps (all of them above it if that never happens)."""
    ranked = _ranked(bids)
    kept, left = dict(bids), []
    for node in ranked[: ranked.index(victim)]:
        if victim in settle(terms, [(n, s, b) for n, (s, b) in kept.items()])[0]:
            break
        if node in honest:
            kept.pop(node)
            left.append(node)
    return left


def leaving_out_attack(seen: dict[str, Any], key_root: Path, colluders: int, allowed: int, beyond: bool) -> Any:
    """The buyer keeps every signed row it likes and leaves out the honest bidders ranked above a loser of its choice:
    the deepest-ranked honest loser it can reach by leaving out at most ``allowed`` (``n - q``) honest bidders, or,
    with ``beyond``, the first one that needs one more. The award is the auction over the bids it kept, every row
    signed; the colluders (the lowest-ranked) endorse it too; its winners are audited."""

    def attack(phase, grid, pass_result: PassResult, bids):  # type: ignore[no-untyped-def]
        ranked = _ranked(bids)
        keys = _colluder_keys(key_root, ranked[len(bids) - colluders :])
        honest_award, tree = award_for(phase, grid, pass_result, bids)
        honest = [node for node in bids if node not in keys]
        losers = [node for node in ranked if node in honest and node not in honest_award.winners]
        costs = {node: _left_out(phase.terms, bids, node, honest) for node in losers}
        if beyond:
            victim = next(node for node in losers if len(costs[node]) > allowed)
        else:
            victim = [node for node in losers if len(costs[node]) <= allowed][-1]
        kept = {node: bids[node] for node in bids if node not in costs[victim]}
        forged = _forged_award(phase, honest_award, kept, phase.bid_signatures)
        assert victim in forged.winners
        signed = sign_award(forged, phase._buyer_key)  # pylint: disable=protected-access
        ends = endorsed(send_all(phase, grid, ACTION_ENDORSE, endorse_requests(pass_result, signed, tree, bids)))
        honest_ends = set(ends)
        ends |= {node: sign_award_endorsement(key, signed.digest) for node, key in keys.items()}
        audits = send_all(phase, grid, ACTION_AUDIT, {w: fields_of(pass_result, signed, ends) for w in forged.winners})
        seen.update(victim=victim, rank=ranked.index(victim) + 1, left_out=set(costs[victim]), endorsers=honest_ends,
                    endorsements=len(ends), opened=opened(audits), winners=set(forged.winners),
                    honest_winners=set(honest_award.winners), bidders=set(bids), award=forged)  # fmt: skip

    return attack


def _assert_reach(seen: dict[str, Any], quorum: int, beyond: bool) -> None:
    assert seen["victim"] not in seen["honest_winners"]
    assert seen["endorsers"] == seen["bidders"] - seen["left_out"]  # each left-out bidder refuses, the rest endorse
    assert seen["endorsements"] == len(seen["bidders"]) - len(seen["left_out"])
    if beyond:
        assert seen["endorsements"] < quorum and seen["opened"] == set()
    else:
        assert seen["endorsements"] >= quorum and seen["victim"] in seen["opened"] == seen["winners"]
        award = seen["award"]  # the limit: a chosen loser opens, under the one award, paid at least its bid, within R
        assert all(award.payments[n] >= award.bidder(n).bid for n in seen["opened"])
        assert math.fsum(award.payments.values()) <= award.terms.budget


@pytest.mark.parametrize("beyond", [False, True], ids=["within-n-minus-q", "one-more"])
def test_leaving_bidders_out_opens_a_chosen_loser_only_within_n_minus_q_at_the_profiles_defaults(
    tmp_path: Path, beyond: bool
) -> None:
    """E = 10, ``c = 2``, ``q = 7``: the buyer may leave out ``n - q = 3`` honest bidders and open a loser it chose
    (the documented limit); a loser that needs a fourth left out does not open."""
    seen: dict[str, Any] = {}
    play(tmp_path, leaving_out_attack(seen, tmp_path, STATED, NODES - QUORUM, beyond), seed=21)
    _assert_reach(seen, QUORUM, beyond)
    assert (len(seen["left_out"]) > NODES - QUORUM) if beyond else (len(seen["left_out"]) <= NODES - QUORUM)
    print(f"E = {NODES}: rank {seen['rank']} opened={bool(seen['opened'])} left out {len(seen['left_out'])}")


@pytest.mark.parametrize("beyond", [False, True], ids=["within-n-minus-q", "one-more"])
def test_leaving_bidders_out_opens_a_chosen_loser_only_within_n_minus_q_in_the_sparse_mode(
    tmp_path: Path, beyond: bool
) -> None:
    """E = 60, three colluders stated, the quorum counted over the directory (32): up to 28 honest bidders may be left
    out, and a loser that needs a 29th does not open."""
    seen: dict[str, Any] = {}
    grid, phase = sparse_phase(
        tmp_path, leaving_out_attack(seen, tmp_path, SPARSE_COLLUDERS, SPARSE_NODES - SPARSE_QUORUM, beyond)
    )
    with pytest.raises(_AttackDone):
        phase.run(grid)
    _assert_reach(seen, SPARSE_QUORUM, beyond)
    print(f"E = {SPARSE_NODES}: rank {seen['rank']} opened={bool(seen['opened'])} left out {len(seen['left_out'])}")


# --- A malformed or wrong bid signature ----------------------------------------------------------------------------
BAD_SIGNATURES = st.one_of(
    st.binary(max_size=130).filter(lambda b: len(b) != 64),
    st.binary(min_size=64, max_size=64),  # 64 bytes that are no signature on this bid
    st.integers(-(2**63), 2**63 - 1),  # what a ConfigRecord holds
    st.text(max_size=8),
    st.none(),  # no signature at all
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(signature=BAD_SIGNATURES, with_directory=st.booleans())
def test_a_malformed_or_wrong_bid_signature_excludes_its_sender_and_the_market_finishes(
    signature: object, with_directory: bool
) -> None:
    """One node's ``market_bid`` reply carries a fuzzed signature, or none: with a directory the buyer excludes it at
    the bid step, naming the step, and the market finishes and pays its winners from the others (without one, 64
    bytes or none are a well-formed, unchecked reply)."""
    counts = make_counts(8, seed=33)
    culprit = sorted(counts)[2]

    def hook(instruction: Any, reply: Any) -> Any:
        if instruction.metadata.message_type == f"query.{ACTION_BID}" and instruction.metadata.dst_node_id == culprit:
            record = reply.content.config_records[RECORD_KEY]
            if signature is None:
                record.pop(KEY_BID_SIGNATURE, None)
            else:
                record[KEY_BID_SIGNATURE] = signature  # type: ignore[assignment]
        return reply

    if with_directory:
        app, directory = signed_app(counts)
        config = market_config(budget=60.0, directory=directory)
    else:
        app, config = market_client_app(counts, CostBasedBid(0.01)), market_config(budget=60.0)
    outcome = MarketPhase(config).run(InProcessGrid(app, list(counts), reply_hook=hook))
    assert outcome.status == "succeeded" and outcome.total_payment <= 60.0
    well_formed = signature is None or (isinstance(signature, bytes) and len(signature) == 64)
    if well_formed and not with_directory:
        assert culprit not in outcome.excluded
    else:
        assert outcome.excluded[culprit].startswith(ACTION_BID) and culprit not in outcome.winners
