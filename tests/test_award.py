"""The binding award: its encoding and signature, its bids tree and quorum, the bidders' checks, and the buyer's
attacks played with the real client handlers (the audit oracle, forged and split awards, an award chain, an award
naming a non-survivor, malformed endorsements): the buyer opens at most the winners of one budget-feasible award."""

from __future__ import annotations

import dataclasses
import math
import struct
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import pytest
from adversary import make_counts, market_config, signed_app
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.app import Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from hypothesis import given, settings
from hypothesis import strategies as st

from flmarket_flwr.market import MarketError, MarketPhase, read_award, register_market_handlers
from flmarket_flwr.market.buyer.pass_rounds import PassResult
from flmarket_flwr.market.node.bidding import CostBasedBid
from flmarket_flwr.market.node.node_config import NodeSettings
from flmarket_flwr.market.wire.award import (
    Award,
    AwardError,
    AwardTerms,
    Bidder,
    BidsTree,
    SignedAward,
    binding_quorum,
    build_award,
    check_award,
    count_endorsements,
    pack_endorsements,
    settle,
    sign_award,
    unpack_endorsements,
)
from flmarket_flwr.market.wire.messages import (
    ACTION_AUDIT,
    ACTION_ENDORSE,
    KEY_AWARD,
    KEY_AWARD_SIGNATURE,
    KEY_BID_PROOF,
    KEY_COUNTS,
    KEY_ENDORSEMENT,
    KEY_ENDORSEMENTS,
    KEY_PAYMENT,
    KEY_SESSION,
    RECORD_KEY,
)
from flmarket_flwr.market.wire.records import config_record
from flmarket_flwr.pass_protocol import generate_identity
from flmarket_flwr.pass_protocol.identity import sign_award_endorsement
from flmarket_flwr.pricing import run_auction
from simulations.inprocess_grid import InProcessGrid, market_client_app

BUYER = Ed25519PrivateKey.generate()
BUYER_PUBLIC = BUYER.public_key().public_bytes_raw()
OTHER = Ed25519PrivateKey.generate()
TERMS = AwardTerms(100.0, 0, BUYER_PUBLIC)


# --- Encoding and signature ------------------------------------------------------------------------
finite = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False, allow_infinity=False)


@st.composite
def awards(draw: st.DrawFn) -> Award:
    nodes = sorted(draw(st.sets(st.integers(0, 2**64 - 1), max_size=6)))
    signed = draw(st.booleans())  # the secure profile's head: every row with its bidder's 64-byte signature
    signature = st.binary(min_size=64, max_size=64) if signed else st.just(b"")
    head = tuple(Bidder(node, draw(finite), draw(finite), draw(finite), draw(signature)) for node in nodes)
    winners = tuple(draw(st.permutations(nodes))[: draw(st.integers(0, len(nodes)))])
    terms = AwardTerms(
        draw(st.floats(min_value=1e-6, max_value=1e9)),
        draw(st.integers(0, 2**63 - 1)),
        draw(st.sampled_from([BUYER_PUBLIC, OTHER.public_key().public_bytes_raw()])),
    )
    return Award(
        draw(st.integers(0, 2**64 - 1)),
        draw(st.binary(min_size=1, max_size=40)),
        draw(st.binary(min_size=1, max_size=40)),
        terms,
        draw(st.integers(max(1, len(nodes)), 2**32 - 1)),
        draw(st.binary(min_size=32, max_size=32)),
        head,
        winners,
    )


def make_award(bids: Mapping[int, tuple[float, float]], terms: AwardTerms = TERMS) -> tuple[Award, BidsTree]:
    """The honest award over ``bids`` in run 1, session ``s``, transcript ``t``, every bidder a survivor (PASS index
    = its place in ascending node id)."""
    survivors = list(enumerate(sorted(bids), start=1)) or [(1, 0)]
    return build_award(1, b"s", b"t", terms, survivors, bids)


@settings(max_examples=200, deadline=None)
@given(awards(), awards())
def test_the_encoding_is_canonical_and_injective(first: Award, second: Award) -> None:
    assert Award.decode(first.encode()) == first
    assert (first.encode() == second.encode()) == (first == second)


def _mutations(award: Award) -> list[Award]:
    """``award`` with each field changed in turn (every field of the terms and of a head entry too)."""
    terms = award.terms
    other_key = OTHER.public_key().public_bytes_raw() if terms.buyer_key == BUYER_PUBLIC else BUYER_PUBLIC
    changed = [
        dataclasses.replace(award, run_id=(award.run_id + 1) % 2**64),
        dataclasses.replace(award, session=award.session + b"x"),
        dataclasses.replace(award, transcript=award.transcript[:-1] + bytes([award.transcript[-1] ^ 1])),
        dataclasses.replace(award, terms=dataclasses.replace(terms, budget=math.nextafter(terms.budget, math.inf))),
        dataclasses.replace(award, terms=dataclasses.replace(terms, cohort_cap=(terms.cohort_cap + 1) % 2**63)),
        dataclasses.replace(award, terms=dataclasses.replace(terms, buyer_key=other_key)),
    ]
    more = award.survivors + 1 if award.survivors < 2**32 - 1 else award.survivors - 1
    changed.append(dataclasses.replace(award, survivors=more))
    changed.append(dataclasses.replace(award, bids_root=bytes([award.bids_root[0] ^ 1]) + award.bids_root[1:]))
    if award.head:
        first, rest = award.head[0], award.head[1:]
        for name in ("score", "bid", "payment"):
            bumped = dataclasses.replace(first, **{name: math.nextafter(getattr(first, name), math.inf)})
            changed.append(dataclasses.replace(award, head=(bumped, *rest)))
        if first.signature:  # a signed head: each row's signature is bound too
            flipped = bytes([first.signature[0] ^ 1]) + first.signature[1:]
            changed.append(dataclasses.replace(award, head=(dataclasses.replace(first, signature=flipped), *rest)))
        if first.node_id not in award.winners:
            changed.append(dataclasses.replace(award, winners=(*award.winners, first.node_id)))
        dropped = [w for w in award.winners if w != first.node_id]
        changed.append(dataclasses.replace(award, head=rest, winners=tuple(dropped)))
    if len(award.winners) > 1:
        changed.append(dataclasses.replace(award, winners=award.winners[::-1]))
    return changed


@settings(max_examples=100, deadline=None)
@given(awards())
def test_the_signature_binds_every_field(award: Award) -> None:
    award = dataclasses.replace(award, terms=dataclasses.replace(award.terms, buyer_key=BUYER_PUBLIC))
    signed = sign_award(award, BUYER)
    assert signed.verify(BUYER_PUBLIC) == award
    for changed in _mutations(award):
        assert changed.encode() != award.encode()
        with pytest.raises(AwardError):
            SignedAward(changed.encode(), signed.signature).verify(BUYER_PUBLIC)


def test_only_the_buyer_key_of_the_terms_signs_and_verifies() -> None:
    award, _ = make_award({5: (2.0, 1.0), 6: (1.0, 1.0)})
    with pytest.raises(AwardError, match="not the buyer key"):
        sign_award(award, OTHER)
    forged = SignedAward(award.encode(), OTHER.sign(award.encode()))
    for signed in (forged, SignedAward(award.encode(), b""), SignedAward(award.encode(), b"\0" * 64)):
        with pytest.raises(AwardError):
            signed.verify(BUYER_PUBLIC)
    with pytest.raises(AwardError, match="another buyer key"):  # signed under the key it names, not the pinned one
        other_terms = dataclasses.replace(
            award, terms=dataclasses.replace(TERMS, buyer_key=OTHER.public_key().public_bytes_raw())
        )
        sign_award(other_terms, OTHER).verify(BUYER_PUBLIC)


@pytest.mark.parametrize(
    "mangle",
    [lambda b: b[:-1], lambda b: b + b"\0", lambda b: b"x" + b[1:], lambda b: b"", lambda b: b[:40]],
    ids=["truncated", "trailing", "label", "empty", "short"],
)
def test_a_malformed_encoding_is_refused_by_name(mangle: Callable[[bytes], bytes]) -> None:
    encoded = make_award({5: (2.0, 1.0), 6: (1.0, 1.0)})[0].encode()
    with pytest.raises(AwardError):
        Award.decode(mangle(encoded))


def test_endorsements_pack_and_unpack_and_count_only_valid_distinct_others() -> None:
    digest = make_award({5: (2.0, 1.0)})[0].digest()
    keys = {node: generate_identity() for node in (5, 6, 7, 8)}
    directory = {node: public for node, (_, public) in keys.items()}
    endorsements = {node: sign_award_endorsement(private, digest) for node, (private, _) in keys.items()}
    endorsements[8] = sign_award_endorsement(keys[8][0], bytes(32))  # on another award
    endorsements[9] = sign_award_endorsement(keys[5][0], digest)  # not in the directory
    assert unpack_endorsements(pack_endorsements(endorsements)) == endorsements
    assert count_endorsements(digest, endorsements, directory, own_node=5) == 2  # 6 and 7
    assert count_endorsements(digest, endorsements, directory, own_node=5, eligible={5, 6, 8}) == 1  # 7: no survivor
    with pytest.raises(AwardError):
        unpack_endorsements(pack_endorsements(endorsements)[:-1])
    packed = pack_endorsements({6: endorsements[6]})
    with pytest.raises(AwardError, match="once"):
        unpack_endorsements(packed + packed)


@settings(max_examples=2000, deadline=None)
@given(st.integers(1, 3000), st.data())
def test_no_two_awards_reach_the_quorum_whatever_the_honest_endorsers_split(survivors: int, data) -> None:
    """Each honest survivor endorses one award; the ``c`` colluders endorse both. Two awards both at the quorum would
    need more honest endorsers than there are, for every split of the honest ones (the binding argument)."""
    colluders = data.draw(st.integers(0, survivors))
    quorum = binding_quorum(survivors, colluders)
    honest = survivors - colluders
    first = data.draw(st.integers(0, honest))  # honest endorsers of the first award; the rest may endorse the second
    assert not (first + colluders >= quorum and (honest - first) + colluders >= quorum)
    assert quorum - 1 <= (survivors + colluders) / 2  # and no larger than that needs: one award held by
    # the honest survivors and the colluders together reaches it whenever they are a majority with the colluders


def test_the_quorum_refuses_nonsense() -> None:
    assert binding_quorum(10, 2) == 7 and binding_quorum(9, 0) == 5
    with pytest.raises(AwardError):
        binding_quorum(0, 0)
    with pytest.raises(AwardError):
        binding_quorum(5, -1)


# --- The bidders' checks -------------------------------------------------------------------------
@st.composite
def bid_sets(draw: st.DrawFn) -> dict[int, tuple[float, float]]:
    nodes = draw(st.sets(st.integers(0, 10**6), min_size=1, max_size=12))
    scores = st.one_of(st.just(0.0), st.floats(min_value=1e-100, max_value=1e3))  # the auction's range
    bids = st.floats(min_value=1e-3, max_value=50.0)
    return {node: (draw(scores), draw(bids)) for node in nodes}


def _check(award: Award, tree: BidsTree, bids: Mapping[int, tuple[float, float]], node: int, **changes: Any) -> None:
    """``node``'s checks of ``award`` with its own score and bid from ``bids`` and its path in ``tree``."""
    rank = tree.rank[node]
    fields: dict[str, Any] = {
        "run_id": award.run_id,
        "session": award.session,
        "transcript": award.transcript,
        "terms": award.terms,
        "survivors": len(tree.rank),
        "rank": rank,
        "index": rank + 1,
        "node_id": node,
        "score": bids[node][0],
        "bid": bids[node][1],
        "proof": tree.proof(node),
        "survivor_nodes": set(tree.rank),
    }
    fields.update(changes)
    check_award(award, **fields)


@settings(max_examples=300, deadline=None)
@given(bid_sets(), st.integers(0, 5))
def test_an_honest_award_passes_every_bidders_checks_and_is_budget_feasible(bids, cap: int) -> None:
    terms = dataclasses.replace(TERMS, cohort_cap=cap)
    award, tree = make_award(bids, terms)
    for node in bids:
        _check(award, tree, bids, node)
    assert math.fsum(award.payments.values()) <= terms.budget * (1 + 1e-12)
    assert all(award.payments[w] >= award.bidder(w).bid for w in award.winners)  # type: ignore[union-attr]
    nodes = sorted(bids)
    result = run_auction(
        [bids[n][0] for n in nodes],
        [bids[n][1] for n in nodes],
        100.0,
        num_winners=cap and min(cap, len(nodes)) or None,
    )
    assert award.winners == tuple(nodes[int(i)] for i in result.winners)
    assert {n: award.payments.get(n, 0.0) for n in nodes} == {n: float(result.payments[i]) for i, n in enumerate(nodes)}


BIDS = {11: (50.0, 3.0), 12: (40.0, 2.0), 13: (30.0, 4.0), 14: (20.0, 1.0), 15: (5.0, 9.0), 16: (1.0, 9.5)}
SMALL = AwardTerms(10.0, 0, BUYER_PUBLIC)
"""A budget under which 12 and 14 win; the head ends before 15 and 16."""


def _honest() -> tuple[Award, BidsTree]:
    return make_award(BIDS, SMALL)


def _with(award: Award, **changes: Any) -> Award:
    return dataclasses.replace(award, **changes)


def _listing(award: Award, node: int, **changes: float) -> Award:
    head = tuple(dataclasses.replace(b, **changes) if b.node_id == node else b for b in award.head)
    return _with(award, head=head)


def test_the_honest_award_lists_only_the_decisive_head() -> None:
    award, tree = _honest()
    assert award.winners == (12, 14) and [b.node_id for b in award.head] == [11, 12, 13, 14]
    assert award.survivors == len(BIDS) and award.bids_root == tree.root
    for node in BIDS:
        _check(award, tree, BIDS, node)  # 15 and 16 rank after the head: they cannot change the outcome


def test_a_bidder_refuses_an_award_that_misstates_it_or_breaks_the_auction() -> None:
    honest, tree = _honest()
    winner, in_head_loser, outside = 12, 11, 15
    lied = dict(BIDS) | {outside: (BIDS[outside][0], BIDS[outside][1] * 2)}
    lied_award, lied_tree = make_award(lied, SMALL)  # the tree holds another bid for 15
    cases = {
        "its score in the head": (_listing(honest, in_head_loser, score=1.0), tree, in_head_loser, "score and bid"),
        "its bid in the tree": (lied_award, lied_tree, outside, "bids tree"),
        "not run_auction": (_with(honest, winners=(12, 11)), tree, winner, "winners"),
        "a payment": (_listing(honest, winner, payment=honest.payments[winner] * 1.01), tree, winner, "payment"),
        "left out of the head": (
            _with(honest, head=tuple(b for b in honest.head if b.node_id != in_head_loser)),
            tree,
            in_head_loser,
            "ranks inside",
        ),
        "a head that is not decisive": (
            _with(honest, head=(*honest.head, Bidder(15, *BIDS[15], 0.0))),
            tree,
            16,
            "decisive head",
        ),
    }
    for name, (award, bids_tree, node, reason) in cases.items():
        with pytest.raises(AwardError, match=reason):
            _check(award, bids_tree, BIDS, node)
            pytest.fail(name)
    for field, value in (
        ("run_id", 4),
        ("session", b"other"),
        ("transcript", b"other"),
        ("terms", dataclasses.replace(SMALL, budget=101.0)),
        ("survivors", len(BIDS) + 1),
        ("proof", tree.proof(winner)),
        ("proof", b"garbage"),
    ):
        with pytest.raises(AwardError):
            _check(honest, tree, BIDS, outside, **{field: value})


def test_every_bidder_refuses_an_award_naming_a_bidder_that_is_not_a_survivor() -> None:
    """Issue 39 item 2: the buyer lists node 4242, in no roster, in the head (as a winner paid most of R)."""
    honest, tree = _honest()
    phantom = Bidder(4242, 1000.0, 1.0, 0.0)
    forged = _with(honest, head=tuple(sorted((*honest.head, phantom), key=lambda b: b.node_id)))
    for node in BIDS:
        with pytest.raises(AwardError, match="not a survivor|winners|payment|decisive|ranks inside"):
            _check(forged, tree, BIDS, node)
    winners, payments = settle(SMALL, [(b.node_id, b.score, b.bid) for b in forged.head])
    consistent = _with(
        forged, winners=winners, head=tuple(dataclasses.replace(b, payment=payments[b.node_id]) for b in forged.head)
    )  # the phantom made a winner, every payment recomputed: only the survivor check catches it
    for node in BIDS:
        with pytest.raises(AwardError, match="not a survivor"):
            _check(consistent, tree, BIDS, node)


def test_a_budget_infeasible_award_is_refused_even_if_its_winners_are_right() -> None:
    honest, tree = _honest()
    inflated = tuple(
        dataclasses.replace(b, payment=SMALL.budget) if b.node_id in honest.winners else b for b in honest.head
    )
    with pytest.raises(AwardError, match="payment"):
        _check(_with(honest, head=inflated), tree, BIDS, 15)


def test_settle_lowers_a_cap_above_the_bidders_and_takes_none_for_zero() -> None:
    capped = dataclasses.replace(TERMS, cohort_cap=50)  # above the bidders' number: no cap
    assert settle(capped, [(n, *v) for n, v in BIDS.items()]) == settle(TERMS, [(n, *v) for n, v in BIDS.items()])
    assert settle(TERMS, []) == ((), {})


# --- The attack, with the real client handlers -----------------------------------------------------
Attack = Callable[[MarketPhase, Grid, PassResult, Mapping[int, tuple[float, float]]], None]


class _AttackDone(MarketError):
    """Raised by the malicious phase once its attack has run (the market then closes)."""


class MaliciousPhase(MarketPhase):
    """The real server up to the bids (PASS, terms, scores); then ``attack`` sends whatever it likes."""

    def __init__(self, attack: Attack, **overrides: Any) -> None:
        super().__init__(market_config(**overrides))
        self.attack = attack

    def _audited_auction(self, grid, pass_result, bids):  # type: ignore[no-untyped-def]
        self.attack(self, grid, pass_result, bids)
        raise _AttackDone("attack done")


def award_for(
    phase: MarketPhase,
    grid: Grid,
    pass_result: PassResult,
    bids: Mapping[int, tuple[float, float]],
    terms: AwardTerms | None = None,
) -> tuple[Award, BidsTree]:
    """The honest award of the auction over ``bids`` in this PASS session (and its bids tree), each head row with its
    bidder's signature on its bid where the bidders signed theirs (the secure profile)."""
    survivors = sorted((index, node) for node, index in pass_result.indices.items())
    signatures = phase.bid_signatures if bids and set(bids) <= set(phase.bid_signatures) else None
    return build_award(
        int(grid.run.run_id),
        pass_result.session,
        pass_result.transcript,
        terms or phase.terms,
        survivors,
        bids,
        signatures=signatures,
    )


def fields_of(pass_result: PassResult, signed: SignedAward, endorsements: Mapping[int, bytes] | None = None) -> dict:
    fields: dict[str, Any] = {
        KEY_SESSION: pass_result.session,
        KEY_AWARD: signed.encoded,
        KEY_AWARD_SIGNATURE: signed.signature,
    }
    if endorsements is not None:
        fields[KEY_ENDORSEMENTS] = pack_endorsements({n: e for n, e in endorsements.items() if e})
    return fields


def endorse_requests(
    pass_result: PassResult, signed: SignedAward, tree: BidsTree, nodes: Iterable[int]
) -> dict[int, dict]:
    """The endorse step's request to each of ``nodes``: the award and the node's own path in its bids tree."""
    return {node: fields_of(pass_result, signed) | {KEY_BID_PROOF: tree.proof(node)} for node in nodes}


def send_all(
    phase: MarketPhase, grid: Grid, action: str, fields: Mapping[int, Mapping[str, Any]]
) -> dict[int, Message]:
    return phase.exchange(grid, action, {node: config_record(dict(f)) for node, f in fields.items()})


def opened(replies: Mapping[int, Message]) -> set[int]:
    """The nodes whose audit reply opened their counts."""
    return {
        node
        for node, reply in replies.items()
        if not reply.has_error() and KEY_COUNTS in reply.content.config_records[RECORD_KEY]
    }


def endorsed(replies: Mapping[int, Message]) -> dict[int, bytes]:
    return {n: r.content.config_records[RECORD_KEY][KEY_ENDORSEMENT] for n, r in replies.items() if not r.has_error()}  # type: ignore[misc]


def play(
    attack: Attack, counts: Mapping[int, np.ndarray] | None = None, app: Any = None, **overrides: Any
) -> InProcessGrid:
    counts = counts if counts is not None else make_counts(8, seed=5)
    grid = InProcessGrid(app or market_client_app(counts, CostBasedBid(0.01)), list(counts))
    with pytest.raises(_AttackDone):
        MaliciousPhase(attack, **overrides).run(grid)
    return grid


def audit_oracle(seen: dict[str, set[int]]) -> Attack:
    """Issue 29 item 1, the old audit oracle: audit every bidder with payment = bid (no award), then under a signed
    award naming everyone a winner, first unendorsed, then after asking everyone to endorse it. ``seen`` gets the
    bidders, the endorsers and who opened at each step."""

    def attack(phase, grid, pass_result, bids):  # type: ignore[no-untyped-def]
        seen["bidders"] = set(bids)
        old_style = {node: {KEY_SESSION: pass_result.session, KEY_PAYMENT: bid} for node, (_, bid) in bids.items()}
        seen["old"] = opened(send_all(phase, grid, ACTION_AUDIT, old_style))
        everyone, tree = award_for(phase, grid, pass_result, bids)
        everyone = dataclasses.replace(
            everyone,
            winners=tuple(sorted(bids)),
            head=tuple(Bidder(node, *bids[node], bids[node][1]) for node in sorted(bids)),
        )
        signed = sign_award(everyone, phase._buyer_key)  # pylint: disable=protected-access
        seen["unendorsed"] = opened(
            send_all(phase, grid, ACTION_AUDIT, {n: fields_of(pass_result, signed, {}) for n in bids})
        )
        seen["endorsers"] = set(
            endorsed(send_all(phase, grid, ACTION_ENDORSE, endorse_requests(pass_result, signed, tree, bids)))
        )
        seen["endorsed"] = opened(
            send_all(phase, grid, ACTION_AUDIT, {n: fields_of(pass_result, signed, {}) for n in bids})
        )

    return attack


def test_auditing_every_bidder_with_payment_equal_to_bid_opens_nothing() -> None:
    """No award, or an award no one endorsed: every bidder refuses."""
    seen: dict[str, set[int]] = {}
    play(audit_oracle(seen))
    assert seen.pop("bidders")
    assert seen == {"old": set(), "unendorsed": set(), "endorsers": set(), "endorsed": set()}


def test_auditing_every_bidder_under_an_endorsed_award_opens_its_winners_only() -> None:
    seen: dict[str, Any] = {}

    def attack(phase, grid, pass_result, bids):  # type: ignore[no-untyped-def]
        award, tree = award_for(phase, grid, pass_result, bids)
        signed = sign_award(award, phase._buyer_key)  # pylint: disable=protected-access
        endorsements = endorsed(
            send_all(phase, grid, ACTION_ENDORSE, endorse_requests(pass_result, signed, tree, bids))
        )
        replies = send_all(phase, grid, ACTION_AUDIT, {n: fields_of(pass_result, signed, endorsements) for n in bids})
        seen.update(award=award, endorsers=set(endorsements), opened=opened(replies), bidders=set(bids))
        seen["again"] = opened(
            send_all(phase, grid, ACTION_AUDIT, {n: fields_of(pass_result, signed, endorsements) for n in bids})
        )

    play(attack, budget=20.0)
    assert seen["endorsers"] == seen["bidders"]
    assert seen["award"].winners and set(seen["award"].winners) < seen["bidders"]
    assert seen["opened"] == set(seen["award"].winners)  # no loser opens
    assert seen["again"] == set()  # each winner opens once


@pytest.mark.parametrize(
    "forgery", ["other-key", "unsigned", "wrong-score", "wrong-bid", "infeasible", "not-the-auction", "other-terms"]
)
def test_no_bidder_endorses_or_opens_for_a_forged_or_wrong_award(forgery: str) -> None:
    seen: dict[str, Any] = {}

    def attack(phase, grid, pass_result, bids):  # type: ignore[no-untyped-def]
        honest, tree = award_for(phase, grid, pass_result, bids)
        losers = [node for node in bids if node not in honest.winners]
        victim = min(losers, key=lambda node: bids[node][1])  # the loser with the least bid: a higher score wins
        if forgery in ("wrong-score", "wrong-bid"):  # the victim listed with a score or bid it did not send: it wins
            field = "score" if forgery == "wrong-score" else "bid"
            factor = 100.0 if field == "score" else 0.01
            changed = dict(bids)
            score, bid = bids[victim]
            changed[victim] = (score * factor, bid) if field == "score" else (score, bid * factor)
            award, tree = award_for(phase, grid, pass_result, changed)
            assert victim in award.winners
        elif forgery == "infeasible":  # everyone wins, paid 1.5 x its bid: sum p > R
            award = dataclasses.replace(
                honest,
                winners=tuple(sorted(bids)),
                head=tuple(Bidder(node, *bids[node], 1.5 * bids[node][1]) for node in sorted(bids)),
            )
            assert math.fsum(award.payments.values()) > phase.terms.budget
        elif forgery == "not-the-auction":  # a loser swapped in for a winner, at the winner's payment
            swapped = honest.winners[0]
            rows = {b.node_id: b for b in honest.head}
            rows[victim] = Bidder(victim, *bids[victim], honest.payments[swapped])
            rows[swapped] = dataclasses.replace(rows[swapped], payment=0.0)
            award = dataclasses.replace(
                honest, winners=(victim, *honest.winners[1:]), head=tuple(rows[node] for node in sorted(rows))
            )
        elif forgery == "other-terms":  # a larger budget than announced, so that the victim wins
            terms = dataclasses.replace(phase.terms, budget=phase.terms.budget * 1e6)
            award, tree = award_for(phase, grid, pass_result, bids, terms)
            assert victim in award.winners
        else:
            award = honest
        if forgery == "other-key":
            signed = SignedAward(award.encode(), OTHER.sign(award.encode()))
        elif forgery == "unsigned":
            signed = SignedAward(award.encode(), b"")
        else:
            signed = sign_award(award, phase._buyer_key)  # pylint: disable=protected-access
        endorse = endorsed(send_all(phase, grid, ACTION_ENDORSE, endorse_requests(pass_result, signed, tree, bids)))
        audit = send_all(phase, grid, ACTION_AUDIT, {n: fields_of(pass_result, signed, endorse) for n in bids})
        seen.update(victim=victim, endorsers=set(endorse), opened=opened(audit))

    play(attack, budget=20.0)
    assert seen["victim"] not in seen["endorsers"]
    assert seen["victim"] not in seen["opened"]
    if forgery in ("other-key", "unsigned", "infeasible", "not-the-auction", "other-terms"):
        assert seen["endorsers"] == set() and seen["opened"] == set()


def test_a_split_view_is_refused_with_identity_keys_and_a_directory() -> None:
    """Two halves shown two awards, each one the auction over the bids the half is shown: each half endorses its
    own, but neither award gathers the quorum of the survivors, so no winner of either opens."""
    counts = make_counts(8, seed=5)
    app, directory = signed_app(counts)
    seen: dict[str, Any] = {}

    def attack(phase, grid, pass_result, bids):  # type: ignore[no-untyped-def]
        nodes = sorted(bids)
        halves = (nodes[: len(nodes) // 2], nodes[len(nodes) // 2 :])
        built = [award_for(phase, grid, pass_result, {n: bids[n] for n in half}) for half in halves]
        awards = [award for award, _ in built]
        signed = [sign_award(award, phase._buyer_key) for award in awards]  # pylint: disable=protected-access
        endorsements: dict[int, bytes] = {}
        for half, one, (_, tree) in zip(halves, signed, built, strict=True):
            endorsements.update(
                endorsed(send_all(phase, grid, ACTION_ENDORSE, endorse_requests(pass_result, one, tree, half)))
            )
        per_half = [{n: endorsements[n] for n in half if n in endorsements} for half in halves]
        audits = {}
        for award, one, ends in zip(awards, signed, per_half, strict=True):
            audits.update(
                send_all(phase, grid, ACTION_AUDIT, {n: fields_of(pass_result, one, ends) for n in award.winners})
            )
        all_of_them = {}  # every endorsement the server holds, whichever award it was for
        for award, one in zip(awards, signed, strict=True):
            all_of_them.update(
                send_all(
                    phase, grid, ACTION_AUDIT, {n: fields_of(pass_result, one, endorsements) for n in award.winners}
                )
            )
        seen.update(
            halves=halves, awards=awards, endorsers=set(endorsements), opened=opened(audits) | opened(all_of_them)
        )

    play(attack, counts, app=app, budget=20.0, directory=directory)
    assert seen["endorsers"] == set(counts)  # each half endorsed the award it was shown
    assert all(award.winners for award in seen["awards"])
    assert seen["opened"] == set()


def test_one_award_for_everyone_opens_with_a_directory_and_too_few_endorsements_do_not() -> None:
    """Control of the split view: the same award to all gathers the quorum; one endorsement fewer is refused."""
    counts = make_counts(8, seed=5)
    app, directory = signed_app(counts)
    seen: dict[str, Any] = {}

    def attack(phase, grid, pass_result, bids):  # type: ignore[no-untyped-def]
        award, tree = award_for(phase, grid, pass_result, bids)
        signed = sign_award(award, phase._buyer_key)  # pylint: disable=protected-access
        endorsements = endorsed(
            send_all(phase, grid, ACTION_ENDORSE, endorse_requests(pass_result, signed, tree, bids))
        )
        winner = award.winners[0]
        others = [n for n in sorted(endorsements) if n != winner]
        needed = binding_quorum(len(bids), 0) - 1  # others, the winner's own endorsement counted by itself
        too_few = {n: endorsements[n] for n in others[: needed - 1]} | {winner: endorsements[winner]}
        seen["too_few"] = opened(send_all(phase, grid, ACTION_AUDIT, {winner: fields_of(pass_result, signed, too_few)}))
        enough = {n: endorsements[n] for n in others[:needed]}
        seen["enough"] = opened(send_all(phase, grid, ACTION_AUDIT, {winner: fields_of(pass_result, signed, enough)}))
        seen["winner"] = winner

    play(attack, counts, app=app, budget=20.0, directory=directory)
    assert seen["too_few"] == set() and seen["enough"] == {seen["winner"]}


# --- The honest market, end to end -------------------------------------------------------------------
def test_the_honest_market_pays_the_auctions_winners_and_every_node_holds_the_same_receipt() -> None:
    counts = make_counts(8, seed=5)
    grid = InProcessGrid(market_client_app(counts, CostBasedBid(0.01)), list(counts))
    outcome = MarketPhase(market_config(budget=20.0)).run(grid)
    nodes = outcome.participants
    result = run_auction([outcome.scores[n] for n in nodes], [outcome.bids[n] for n in nodes], 20.0)
    assert outcome.winners == [nodes[int(i)] for i in result.winners] and outcome.winners
    assert outcome.payments == {n: float(result.payments[i]) for i, n in enumerate(nodes)}
    assert outcome.audited == outcome.winners and not outcome.excluded
    assert outcome.to_dict()["award_digest"] == outcome.award_digest.hex() != ""
    for node in counts:
        receipt = read_award(grid.context(node))
        assert receipt is not None and receipt.award is not None and receipt.signature is not None
        signed = SignedAward(receipt.award, receipt.signature)
        assert signed.digest == outcome.award_digest
        listed = signed.verify(receipt.buyer_key).payments.get(node, 0.0)  # type: ignore[arg-type]
        assert listed == outcome.payments[node] == receipt.payment


def test_a_configured_buyer_key_signs_and_a_pinned_node_refuses_any_other() -> None:
    counts = make_counts(6, seed=3)
    pinned = next(iter(counts))

    def app_pinning(key: bytes) -> Any:
        """Every node runs the real handlers; ``pinned`` pins ``key`` in its own configuration."""
        app = ClientApp()
        register_market_handlers(
            app,
            lambda context: counts[context.node_id],
            CostBasedBid(0.01),
            settings=lambda context: NodeSettings(buyer_key=key if context.node_id == pinned else None),
        )
        return app

    outcome = MarketPhase(market_config(budget=20.0, buyer_key=BUYER)).run(
        InProcessGrid(app_pinning(BUYER_PUBLIC), list(counts))
    )
    assert pinned in outcome.participants and not outcome.excluded
    other = MarketPhase(market_config(budget=20.0, buyer_key=OTHER)).run(
        InProcessGrid(app_pinning(BUYER_PUBLIC), list(counts))
    )
    assert other.excluded[pinned].startswith("market_advertise") and pinned not in other.pass_participants
    fresh = MarketPhase(market_config(budget=20.0)).run(InProcessGrid(app_pinning(BUYER_PUBLIC), list(counts)))
    assert pinned in fresh.excluded


def _refusing(node_of: Callable[[Award], int]) -> Callable[[Message, Message], Message | None]:
    """A reply hook: the chosen bidder of the first award sent refuses to endorse it (and every later one)."""
    chosen: list[int] = []

    def hook(instruction: Message, reply: Message) -> Message | None:
        if instruction.metadata.message_type != f"query.{ACTION_ENDORSE}":
            return reply
        if not chosen:
            chosen.append(node_of(Award.decode(instruction.content.config_records[RECORD_KEY][KEY_AWARD])))  # type: ignore[arg-type]
        return None if instruction.metadata.dst_node_id == chosen[0] else reply

    hook.chosen = chosen  # type: ignore[attr-defined]
    return hook


def test_a_winner_that_does_not_endorse_is_left_out_unpaid_and_the_award_stands() -> None:
    counts = make_counts(8, seed=5)
    hook = _refusing(lambda award: award.winners[0])
    grid = InProcessGrid(market_client_app(counts, CostBasedBid(0.01)), list(counts), reply_hook=hook)
    reference = MarketPhase(market_config(budget=200.0)).run(
        InProcessGrid(market_client_app(counts, CostBasedBid(0.01)), list(counts))
    )
    assert len(reference.winners) >= 3
    outcome = MarketPhase(market_config(budget=200.0, timeout=0.5)).run(grid)
    refuser = hook.chosen[0]  # type: ignore[attr-defined]
    assert outcome.excluded[refuser].startswith(ACTION_ENDORSE)
    assert refuser not in outcome.participants and refuser not in outcome.winners and outcome.winners
    assert outcome.winners == [node for node in reference.winners if node != refuser]  # nobody promoted, none opened
    assert all(outcome.payments[n] == reference.payments[n] for n in outcome.winners)  # the one award's payments
    assert outcome.total_payment < reference.total_payment  # the refuser's share stays unspent
    receipt = read_award(grid.context(refuser))  # it endorsed; its reply was lost: the award still names it
    assert receipt is not None and receipt.won is True and receipt.opened is False  # never opened, never paid
    assert all(read_award(grid.context(node)).opened for node in outcome.winners)  # type: ignore[union-attr]


def test_a_loser_that_does_not_endorse_stays_a_losing_bidder() -> None:
    counts = make_counts(8, seed=5)
    hook = _refusing(lambda award: next(b.node_id for b in award.head if b.node_id not in award.winners))
    grid = InProcessGrid(market_client_app(counts, CostBasedBid(0.01)), list(counts), reply_hook=hook)
    reference = MarketPhase(market_config(budget=20.0)).run(
        InProcessGrid(market_client_app(counts, CostBasedBid(0.01)), list(counts))
    )
    outcome = MarketPhase(market_config(budget=20.0, timeout=0.5)).run(grid)
    refuser = hook.chosen[0]  # type: ignore[attr-defined]
    assert outcome.excluded[refuser].startswith(ACTION_ENDORSE)
    assert refuser in outcome.participants and outcome.payments[refuser] == 0.0
    assert (outcome.winners, outcome.payments) == (reference.winners, reference.payments)


@pytest.mark.parametrize("value", [math.nan, math.inf, -0.0], ids=["nan", "inf", "negative-zero"])
def test_an_encoding_listing_a_non_finite_or_non_canonical_number_is_refused(value: float) -> None:
    award, _ = make_award({5: (2.0, 1.0), 6: (1.0, 1.0)})
    assert len(award.head) == 2
    first_row = len(make_award({})[0].encode()) - 16  # less the winners' and included's counts
    encoded = bytearray(award.encode())
    encoded[first_row + 8 : first_row + 16] = struct.pack(">d", value)  # the first bidder's score
    with pytest.raises(AwardError, match="finite"):
        Award.decode(bytes(encoded))
    swapped = bytearray(award.encode())
    swapped[first_row : first_row + 64] = swapped[first_row + 32 : first_row + 64] + swapped[first_row : first_row + 32]
    with pytest.raises(AwardError, match="ascending"):
        Award.decode(bytes(swapped))
