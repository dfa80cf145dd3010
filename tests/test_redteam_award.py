"""Red team against the binding award (issue 39), in the secure profile at its defaults: drop-in nodes, the real
handlers, the buyer deviating at full strength (with the profile's stated colluders where a test says so). Each test
asserts what the buyer gets. Three of them assert the documented limits of the claim (a colluder's signed head row,
the included nodes, the run's budget across re-launches), where the buyer gets no more than the threat model says;
leaving bidders out is in ``tests/test_signed_bids.py``."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from adversary import make_counts, market_config
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st
from test_award import MaliciousPhase, _AttackDone, award_for, endorse_requests, endorsed, fields_of, opened, send_all
from test_binding_award import BUDGET, NODES, _colluder_keys, play, profile_grid, signed_row
from test_secure_profile_market import drop_in_app, profile_setup

from flmarket_flwr.market import MarketPhase
from flmarket_flwr.market.node.client import read_award
from flmarket_flwr.market.wire.award import (  # _signed_message: the buyer signs raw bytes, as a deviating one can
    Award,
    AwardError,
    AwardTerms,
    Bidder,
    BidsTree,
    _signed_message,
    binding_quorum,
    build_award,
    check_award,
    head_of,
    pack_endorsements,
    settle,
    sign_award,
)
from flmarket_flwr.market.wire.messages import (
    ACTION_AUDIT,
    ACTION_AWARD,
    ACTION_ENDORSE,
    KEY_AWARD,
    KEY_AWARD_DIGEST,
    KEY_AWARD_SIGNATURE,
    KEY_BID_PROOF,
    KEY_ENDORSEMENTS,
    KEY_SESSION,
)
from flmarket_flwr.market.wire.profiles import PROFILE_COLLUDER_SHARE
from flmarket_flwr.pass_protocol.identity import sign_award_endorsement
from simulations.inprocess_grid import InProcessGrid

STATED = math.ceil(PROFILE_COLLUDER_SHARE * NODES)
QUORUM = binding_quorum(NODES, STATED)


@pytest.fixture(autouse=True)
def ledger_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "flmarket-home"
    monkeypatch.setenv("FLMARKET_HOME", str(home))
    return home


def _signed(phase: Any, award: Award) -> Any:
    return sign_award(award, phase._buyer_key)  # pylint: disable=protected-access


def _award_over(phase: Any, honest: Award, rows: list[tuple[int, float, float]]) -> Award:
    """``honest`` (its tree root, session, terms) with the head, winners and payments of the auction over ``rows``,
    every one of them recomputed exactly as a bidder recomputes them."""
    head, _ = head_of(phase.terms, rows)
    winners, payments = settle(phase.terms, rows)
    by_node = {node: (score, bid) for node, score, bid in rows}
    listed = tuple(Bidder(node, *by_node[node], payments[node]) for node in head)
    return dataclasses.replace(honest, head=listed, winners=winners)


# --- The head: rows the buyer writes ------------------------------------------------------------------------------
@pytest.mark.parametrize("colluder", [False, True], ids=["honest-id", "colluders-own-row"])
def test_a_head_row_under_an_honest_id_gets_nothing_and_a_colluders_signed_row_what_its_bid_would(
    tmp_path: Path, colluder: bool
) -> None:
    """The buyer takes the lowest-ranked loser ``L`` and lists under ``L``'s id a bid ``L`` never made: the winner's
    score with a bid 1e-4 above the winner's, ranked right after it, so the winner's critical value falls to (almost)
    its own bid. The bids tree holds every real leaf, so each bidder's own proof verifies. With ``L`` honest the row
    carries no signature of ``L``'s on that bid, and the winner, which checks every row, refuses it and opens nothing
    (before signed rows every bidder but ``L`` endorsed it, and the winner opened at less than the auction's payment).
    With ``L`` a colluder, whose key the buyer holds and signs the row with, it is a colluder's bid, which the profile
    allows (docs/threat-model.md, "The binding award", step (6)): every bidder endorses, the winner opens at a payment
    below the auction's over the honest bids, never below its bid, and the promises stay within R."""
    seen: dict[str, Any] = {}

    def attack(phase, grid, pass_result, bids):  # type: ignore[no-untyped-def]
        honest, tree = award_for(phase, grid, pass_result, bids)
        _, fair = settle(phase.terms, [(n, s, b) for n, (s, b) in bids.items()])
        winner = honest.winners[0]
        victim = min((n for n in bids if n not in honest.winners), key=lambda n: bids[n][0] / bids[n][1])
        score, bid = bids[winner]
        rows = [(n, s, b) for n, (s, b) in bids.items() if n != victim] + [(victim, score, bid * (1 + 1e-4))]
        forged = _award_over(phase, honest, rows)
        assert winner in forged.winners and forged.payments[winner] < fair[winner]
        key = _colluder_keys(tmp_path, [victim])[victim] if colluder else None
        head = tuple(
            signed_row(grid, pass_result, key, b.node_id, b.score, b.bid, b.payment) if b.node_id == victim and key
            else dataclasses.replace(b, signature=honest_signature(phase, b.node_id))
            for b in forged.head
        )  # fmt: skip
        forged = dataclasses.replace(forged, head=head)
        signed = _signed(phase, forged)
        ends = endorsed(send_all(phase, grid, ACTION_ENDORSE, endorse_requests(pass_result, signed, tree, bids)))
        if key is not None:  # the colluder endorses what the buyer asks
            ends[victim] = sign_award_endorsement(key, signed.digest)
        audits = send_all(phase, grid, ACTION_AUDIT, {w: fields_of(pass_result, signed, ends) for w in forged.winners})
        seen.update(endorsers=set(ends), opened=opened(audits), award=forged, winner=winner, fair=fair[winner],
                    bidders=set(bids))  # fmt: skip

    play(tmp_path, attack)
    award = seen["award"]
    if not colluder:
        assert not set(award.winners) & seen["endorsers"] and seen["opened"] == set()  # each winner checks every row
        return
    assert seen["endorsers"] == seen["bidders"] and seen["opened"] == set(award.winners)
    assert all(award.payments[n] >= award.bidder(n).bid for n in seen["opened"])
    assert math.fsum(award.payments[n] for n in seen["opened"]) <= BUDGET
    assert award.payments[seen["winner"]] < seen["fair"]  # the limit: what a colluding bidder's bid gives


def honest_signature(phase: Any, node: int) -> bytes:
    """The signature ``node`` sent with its bid (the buyer holds it), or any 64 bytes for a node that sent none."""
    return phase.bid_signatures.get(node, b"\0" * 64)


def test_a_head_row_with_a_bid_above_the_budget_is_endorsed_by_no_one(tmp_path: Path) -> None:
    """A colluder's row (node id of a real bidder) with a bid above ``R``, placed in the head; every figure
    recomputed with it. The auction ignores it, so it could only pad the head: every bidder refuses."""
    seen: dict[str, Any] = {}

    def attack(phase, grid, pass_result, bids):  # type: ignore[no-untyped-def]
        honest, tree = award_for(phase, grid, pass_result, bids)
        extra = next(n for n in sorted(bids) if honest.bidder(n) is None)
        key = _colluder_keys(tmp_path, [extra])[extra]  # a colluder signs the row: only the budget rule refuses it
        row = signed_row(grid, pass_result, key, extra, bids[extra][0], BUDGET * 2)
        head = sorted([*honest.head, row], key=lambda b: b.node_id)
        forged = dataclasses.replace(honest, head=tuple(head))
        signed = _signed(phase, forged)
        seen["endorsers"] = endorsed(
            send_all(phase, grid, ACTION_ENDORSE, endorse_requests(pass_result, signed, tree, bids))
        )

    play(tmp_path, attack)
    assert seen["endorsers"] == {}


def test_a_head_left_open_by_omitting_the_top_bidders_is_refused_by_them_only(tmp_path: Path) -> None:
    """The buyer leaves the top-ranked honest bidders out (the head over the rest is the auction's, recomputed),
    claiming in effect that they did not bid. Each of them refuses (it ranks inside), so the buyer gains what
    excluding them at the bid step gives (docs/threat-model.md concedes that) and nothing more: the winners it opens
    are the winners of that one award, within ``R``, each at least its bid, and the omitted bidders never open."""
    seen: dict[str, Any] = {}

    def attack(phase, grid, pass_result, bids):  # type: ignore[no-untyped-def]
        honest, tree = award_for(phase, grid, pass_result, bids)
        omitted = set(honest.winners) | {honest.head[0].node_id}
        rows = [(n, s, b) for n, (s, b) in bids.items() if n not in omitted]
        forged = _award_over(phase, honest, rows)
        signed = _signed(phase, forged)
        ends = endorsed(send_all(phase, grid, ACTION_ENDORSE, endorse_requests(pass_result, signed, tree, bids)))
        audits = send_all(phase, grid, ACTION_AUDIT, {n: fields_of(pass_result, signed, ends) for n in bids})
        seen.update(omitted=omitted, endorsers=set(ends), opened=opened(audits), award=forged)

    play(tmp_path, attack)
    award = seen["award"]
    assert not seen["omitted"] & seen["endorsers"] and not seen["omitted"] & seen["opened"]
    assert seen["opened"] <= set(award.winners)
    assert math.fsum(award.payments[n] for n in seen["opened"]) <= BUDGET
    assert all(award.bidder(n).payment >= award.bidder(n).bid for n in seen["opened"])  # type: ignore[union-attr]


def test_an_award_whose_head_is_not_closed_and_omits_a_bidder_ranked_after_it_is_refused_by_that_bidder(
    tmp_path: Path,
) -> None:
    """The buyer lists the first ``k`` ranked bidders only (recomputed as if they were everyone: not closed, every
    walk runs off the end). A bidder ranked after them that is left out checks that the head is closed and refuses;
    those listed endorse. With ``k`` below the quorum, nobody opens even with the stated colluders' endorsements."""
    seen: dict[str, Any] = {}

    def attack(phase, grid, pass_result, bids):  # type: ignore[no-untyped-def]
        honest, tree = award_for(phase, grid, pass_result, bids)
        ranked = sorted(bids, key=lambda n: (-bids[n][0] / bids[n][1], n))
        colluders = ranked[-STATED:]
        keys = _colluder_keys(tmp_path, colluders)
        listed = ranked[:2]
        forged = _award_over(phase, honest, [(n, *bids[n]) for n in listed])
        assert not head_of(phase.terms, [(n, *bids[n]) for n in listed])[1]  # not closed: a walk runs off the end
        signed = _signed(phase, forged)
        ends = endorsed(send_all(phase, grid, ACTION_ENDORSE, endorse_requests(pass_result, signed, tree, bids)))
        honest_ends = set(ends)
        ends |= {n: sign_award_endorsement(key, signed.digest) for n, key in keys.items()}
        audits = send_all(phase, grid, ACTION_AUDIT, {w: fields_of(pass_result, signed, ends) for w in forged.winners})
        seen.update(endorsers=honest_ends, opened=opened(audits), listed=set(listed), colluders=set(colluders))

    play(tmp_path, attack)
    assert seen["endorsers"] <= seen["listed"] | seen["colluders"]
    assert len(seen["endorsers"] | seen["colluders"]) < QUORUM and seen["opened"] == set()


# --- The tree: proofs, leaves and counts -----------------------------------------------------------------------
def _tree_attack(kind: str):  # type: ignore[no-untyped-def]
    def attack(phase, grid, pass_result, bids):  # type: ignore[no-untyped-def]
        honest, tree = award_for(phase, grid, pass_result, bids)
        survivors = sorted((index, node) for node, index in pass_result.indices.items())
        award, proofs = honest, {n: tree.proof(n) for n in bids}
        nodes = sorted(bids)
        if kind == "one-more-survivor":  # a phantom survivor appended: count, root and depth change consistently
            bigger = BidsTree([*survivors, (survivors[-1][0] + 1, 4242)], {**bids, 4242: (1.0, 1.0)})
            award = dataclasses.replace(honest, survivors=len(survivors) + 1, bids_root=bigger.root)
            proofs = {n: bigger.proof(n) for n in bids}
        elif kind == "proof-one-level-short":
            proofs = {n: p[:-32] for n, p in proofs.items()}
        elif kind == "proof-one-level-long":
            proofs = {n: p + p[-32:] for n, p in proofs.items()}
        elif kind == "a-neighbours-proof":
            proofs = {n: tree.proof(nodes[(i + 1) % len(nodes)]) for i, n in enumerate(nodes)}
        elif kind == "leaves-swapped":  # the tree lists the survivors in another order (a leaf at another index)
            swapped = [(i, n) for (i, _), (_, n) in zip(survivors, [*survivors[1:], survivors[0]], strict=True)]
            other = BidsTree(swapped, bids)
            award = dataclasses.replace(honest, bids_root=other.root)
            proofs = {n: other.proof(n) for n in bids}
        elif kind == "inner-node-as-leaf":  # a tree one level shorter whose 'leaves' are the honest inner nodes
            award = dataclasses.replace(honest, survivors=(len(survivors) + 1) // 2)
            proofs = {n: p[32:] for n, p in proofs.items()}
        signed = _signed(phase, award)
        requests = {n: fields_of(pass_result, signed) | {KEY_BID_PROOF: proofs[n]} for n in bids}
        attack.endorsers = endorsed(send_all(phase, grid, ACTION_ENDORSE, requests))  # type: ignore[attr-defined]

    return attack


@pytest.mark.parametrize(
    "kind",
    [
        "one-more-survivor",
        "proof-one-level-short",
        "proof-one-level-long",
        "a-neighbours-proof",
        "leaves-swapped",
        "inner-node-as-leaf",
    ],
)
def test_merkle_tricks_get_no_endorsement(tmp_path: Path, kind: str) -> None:
    """A survivor count one above the client's (and a tree over a phantom survivor), proofs of another length, a
    neighbour's proof, the survivors' leaves at other indices, and a shorter tree whose leaves are the honest inner
    nodes (a leaf/inner-node confusion): no bidder endorses any of them."""
    attack = _tree_attack(kind)
    play(tmp_path, attack)
    assert attack.endorsers == {}  # type: ignore[attr-defined]


@pytest.mark.parametrize("field", ["session", "transcript", "run_id", "budget", "cohort_cap"])
def test_an_award_under_another_session_transcript_run_or_terms_gets_no_endorsement(tmp_path: Path, field: str) -> None:
    """The honest award with one binding field changed (and every figure recomputed where the terms change)."""
    seen: dict[str, Any] = {}

    def attack(phase, grid, pass_result, bids):  # type: ignore[no-untyped-def]
        honest, tree = award_for(phase, grid, pass_result, bids)
        if field in ("budget", "cohort_cap"):
            terms = dataclasses.replace(phase.terms, **{field: 2 * BUDGET if field == "budget" else 1})
            award, tree = award_for(phase, grid, pass_result, bids, terms)
        elif field == "run_id":
            award = dataclasses.replace(honest, run_id=honest.run_id + 1)
        else:
            award = dataclasses.replace(honest, **{field: bytes(32)})
        signed = _signed(phase, award)
        seen["endorsers"] = endorsed(
            send_all(phase, grid, ACTION_ENDORSE, endorse_requests(pass_result, signed, tree, bids))
        )

    play(tmp_path, attack)
    assert seen["endorsers"] == {}


# --- Included nodes: the award's part that nobody checks -----------------------------------------------------------
def test_an_award_including_any_node_at_any_payment_opens_no_one_beyond_its_winners(tmp_path: Path) -> None:
    """The honest auction, plus ``included = ((4242, 1e6),)``: node 4242 is in no roster and its fixed payment is
    25,000 times ``R``. The receipt every bidder endorses then names a non-survivor and promises, in all, far more
    than the budget announced before PASS. It opens nobody extra (an included node is never audited), but it is
    the documented limit (docs/threat-model.md, "The binding award": the included nodes and their payments are
    the buyer's own word, set in its run config before PASS, and bind only the buyer). Asserted: what it opens is
    the award's winners, each at least at its bid, within the auction's budget; the included node is never asked."""
    seen: dict[str, Any] = {}

    def attack(phase, grid, pass_result, bids):  # type: ignore[no-untyped-def]
        honest, tree = award_for(phase, grid, pass_result, bids)
        forged = dataclasses.replace(honest, included=((4242, 1e6),))
        signed = _signed(phase, forged)
        ends = endorsed(send_all(phase, grid, ACTION_ENDORSE, endorse_requests(pass_result, signed, tree, bids)))
        audits = send_all(phase, grid, ACTION_AUDIT, {w: fields_of(pass_result, signed, ends) for w in forged.winners})
        seen.update(endorsers=set(ends), opened=opened(audits), award=forged)

    play(tmp_path, attack)
    assert seen["opened"] and seen["opened"] <= set(seen["award"].winners) and 4242 not in seen["opened"]
    assert math.fsum(seen["award"].payments.values()) <= BUDGET
    assert all(seen["award"].payments[n] >= seen["award"].bidder(n).bid for n in seen["opened"])


# --- The audit: endorsement sets the buyer assembles ---------------------------------------------------------------
@pytest.mark.parametrize(
    "padding",
    ["another-awards-endorsements", "a-non-directory-id", "the-winners-own-under-other-ids", "the-winners-own-twice"],
)
def test_an_audit_padded_to_the_quorum_with_endorsements_that_do_not_count_opens_nothing(
    tmp_path: Path, padding: str
) -> None:
    """The honest award is endorsed by its winners and the stated colluders only (below the quorum); the buyer pads
    the audit's endorsement set: with honest endorsements of another award of the session (the losers' own auction),
    with a colluder's valid signature under a node id outside the directory, with the winner's own endorsement
    copied under other survivors' ids, or listing the winner's own id. No winner opens."""
    seen: dict[str, Any] = {}

    def attack(phase, grid, pass_result, bids):  # type: ignore[no-untyped-def]
        honest, tree = award_for(phase, grid, pass_result, bids)
        ranked = sorted(bids, key=lambda n: (-bids[n][0] / bids[n][1], n))
        colluders = [n for n in ranked if n not in honest.winners][-STATED:]
        keys = _colluder_keys(tmp_path, colluders)
        signed = _signed(phase, honest)
        first = [*honest.winners]
        ends = endorsed(send_all(phase, grid, ACTION_ENDORSE, endorse_requests(pass_result, signed, tree, first)))
        ends |= {n: sign_award_endorsement(key, signed.digest) for n, key in keys.items()}
        others = [n for n in bids if n not in ends]
        if padding == "another-awards-endorsements":
            other, other_tree = award_for(phase, grid, pass_result, {n: bids[n] for n in others})
            other_signed = _signed(phase, other)
            extra = endorsed(
                send_all(phase, grid, ACTION_ENDORSE, endorse_requests(pass_result, other_signed, other_tree, others))
            )
            assert len(extra) == len(others)
        elif padding == "a-non-directory-id":
            extra = {2**40 + i: sign_award_endorsement(keys[colluders[0]], signed.digest) for i in range(len(others))}
        elif padding == "the-winners-own-under-other-ids":
            extra = {n: ends[honest.winners[0]] for n in others}
        else:
            extra = {}
        assert len(ends) < QUORUM <= len(ends) + len(extra) or padding == "the-winners-own-twice"
        packed = {**ends, **extra}
        audits = {}
        for winner in honest.winners:
            fields = fields_of(pass_result, signed, packed)
            if padding == "the-winners-own-twice":
                own = pack_endorsements({winner: ends[winner]})
                fields[KEY_ENDORSEMENTS] = own + fields[KEY_ENDORSEMENTS]
            audits |= send_all(phase, grid, ACTION_AUDIT, {winner: fields})
        seen["opened"] = opened(audits)

    play(tmp_path, attack)
    assert seen["opened"] == set()


def test_an_audit_showing_another_award_than_the_one_endorsed_opens_nothing(tmp_path: Path) -> None:
    """Winners endorse the honest award; the buyer audits them showing a second award (same session, its winners
    the same node, paid more), with a full quorum of colluder and honest endorsements of that second award."""
    seen: dict[str, Any] = {}

    def attack(phase, grid, pass_result, bids):  # type: ignore[no-untyped-def]
        honest, tree = award_for(phase, grid, pass_result, bids)
        signed = _signed(phase, honest)
        ends = endorsed(send_all(phase, grid, ACTION_ENDORSE, endorse_requests(pass_result, signed, tree, bids)))
        assert len(ends) == NODES
        again = signed
        other = dataclasses.replace(honest, included=((4242, 1.0),))
        other_signed = _signed(phase, other)
        keys = _colluder_keys(tmp_path, sorted(bids))  # every node's key: endorsements are not the question here
        other_ends = {n: sign_award_endorsement(k, other_signed.digest) for n, k in keys.items()}
        audits = send_all(
            phase, grid, ACTION_AUDIT, {w: fields_of(pass_result, other_signed, other_ends) for w in honest.winners}
        )
        seen["other"] = opened(audits)
        audits = send_all(phase, grid, ACTION_AUDIT, {w: fields_of(pass_result, again, ends) for w in honest.winners})
        seen["same"] = opened(audits)
        audits = send_all(phase, grid, ACTION_AUDIT, {w: fields_of(pass_result, again, ends) for w in honest.winners})
        seen.update(twice=opened(audits), award=honest)

    play(tmp_path, attack)
    assert seen["other"] == set()
    assert seen["same"] == set(seen["award"].winners)  # the award each endorsed opens its winners, once
    assert seen["twice"] == set()


# --- The closing message -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("named", ["another-digest-same-signature", "same-digest-another-signature", "no-award"])
def test_a_closing_message_naming_another_award_leaves_the_opened_winners_receipt(tmp_path: Path, named: str) -> None:
    """After the audit the buyer closes with the digest of another award (the held signature), the held digest
    with another award's signature, or no award at all (an abort): each opened winner keeps the award it endorsed."""
    seen: dict[str, Any] = {}

    def attack(phase, grid, pass_result, bids):  # type: ignore[no-untyped-def]
        honest, tree = award_for(phase, grid, pass_result, bids)
        signed = _signed(phase, honest)
        ends = endorsed(send_all(phase, grid, ACTION_ENDORSE, endorse_requests(pass_result, signed, tree, bids)))
        opened_now = opened(
            send_all(phase, grid, ACTION_AUDIT, {w: fields_of(pass_result, signed, ends) for w in honest.winners})
        )
        other = _signed(phase, dataclasses.replace(honest, winners=(), head=honest.head[:1]))
        fields: dict[str, Any] = {KEY_SESSION: pass_result.session}
        if named == "another-digest-same-signature":
            fields |= {KEY_AWARD_DIGEST: other.digest, KEY_AWARD_SIGNATURE: signed.signature}
        elif named == "same-digest-another-signature":
            fields |= {KEY_AWARD_DIGEST: signed.digest, KEY_AWARD_SIGNATURE: other.signature}
        closing = send_all(phase, grid, ACTION_AWARD, dict.fromkeys(bids, fields))
        seen.update(award=honest, opened=opened_now, closing=closing)

    grid = play(tmp_path, attack)
    award = seen["award"]
    assert seen["opened"] == set(award.winners)
    for winner in award.winners:
        assert seen["closing"][winner].has_error()
        receipt = read_award(grid.context(winner))
        assert receipt is not None and receipt.won and receipt.opened and receipt.award == award.encode()
        assert receipt.payment == award.payments[winner] >= receipt.bid  # type: ignore[operator]


# --- Float edge cases in the auction --------------------------------------------------------------------------
def test_ties_and_extreme_floats_give_the_same_head_and_outcome_to_the_buyer_and_each_bidder() -> None:
    """What the buyer builds (:func:`build_award` over all bids) and what each bidder recomputes from the head alone
    (:func:`settle`, :func:`head_of` over the listed rows, plus itself if unlisted) agree on ratio ties, exact score
    and bid ties, subnormal and huge scores, bids equal to ``R`` and to ``R / 2``: otherwise an honest award is
    refused, or a forged one passes where the full auction differs."""

    key = Ed25519PrivateKey.generate().public_key().public_bytes_raw()
    cases = {
        "ratio-ties": {1: (2.0, 1.0), 2: (4.0, 2.0), 3: (6.0, 3.0), 4: (8.0, 4.0), 5: (1.0, 0.5)},
        "exact-ties": {n: (3.0, 1.5) for n in range(1, 9)},
        "subnormal-score": {1: (5e-324, 1.0), 2: (1.0, 1.0), 3: (2.0, 1.0), 4: (1e-300, 1e-300)},
        "huge-score": {1: (1e300, 1.0), 2: (1e300, 1.0), 3: (1.0, 1.0)},
        "bid-at-budget": {1: (10.0, 8.0), 2: (10.0, 4.0), 3: (10.0, 8.0 * (1 - 2**-52))},
        "tiny-bids": {1: (1.0, 5e-324), 2: (1.0, 1e-308), 3: (1.0, 1.0)},
        "range-edges": {1: (1e-100, 1e-100), 2: (1e100, 1.0), 3: (1e100, 1.0), 4: (1.0, 4.0)},
    }
    failures, built = {}, set()
    for name, bids in cases.items():
        for cap in (0, 1, 2):
            terms = AwardTerms(8.0, cap, key)
            survivors = [(i + 1, n) for i, n in enumerate(sorted(bids))]
            try:
                award, tree = build_award(7, b"s", b"t", terms, survivors, bids)
            except AwardError as err:  # the auction's own input range (scores in [1e-100, 1e100]): nothing built
                assert "auction rejects" in str(err)
                continue
            built.add(name)
            _, fair = settle(terms, [(n, s, b) for n, (s, b) in bids.items()])
            assert all(math.isclose(award.payments[b.node_id], fair[b.node_id]) for b in award.head)
            assert math.fsum(fair.values()) <= terms.budget
            for rank, (index, node) in enumerate(survivors):
                try:
                    check_award(
                        award,
                        run_id=7,
                        session=b"s",
                        transcript=b"t",
                        terms=terms,
                        survivors=len(survivors),
                        rank=rank,
                        index=index,
                        node_id=node,
                        score=bids[node][0],
                        bid=bids[node][1],
                        proof=tree.proof(node),
                        survivor_nodes={n for _, n in survivors},
                    )
                except Exception as err:  # noqa: BLE001
                    failures[(name, cap, node)] = str(err)
    assert failures == {}, failures
    assert built == {"ratio-ties", "exact-ties", "bid-at-budget", "range-edges"}  # the others are outside the range


def test_the_stated_quorum_is_what_each_node_uses() -> None:
    """The red team's arithmetic: with E = 10 and the profile's colluder share the quorum is 7, and two awards
    would need 2 * 7 - 2 = 12 > 10 - 2 honest endorsers (what the split tests lean on)."""
    assert (STATED, QUORUM) == (2, 7) and 2 * QUORUM - STATED > NODES - STATED


# --- Re-launches in the same run ------------------------------------------------------------------------------
def test_relaunches_in_one_run_hold_the_buyer_to_r_per_market_not_over_the_run(
    tmp_path: Path,
) -> None:
    """The buyer runs the real market four times in one run (the nodes' release ledgers have the profile's privacy
    budget, so each re-launch is joined), announcing ``R`` every time instead of what earlier markets left. The
    second market leaves out the first winner and two others (the roster-change floor of 3 is met), so another
    bidder wins and opens; the third and fourth invite everyone again. The documented limit (docs/threat-model.md,
    "The binding award"; README's re-launch section): the nodes hold the buyer to ``R`` per market (per PASS
    session), the run's budget binds an honest buyer only. Asserted: every market alone stays within ``R`` with each
    opened winner paid at least its bid, and each release is charged to the nodes' budgets; over the run the buyer
    signed more than ``R`` to the bidders that opened."""
    grid, directory, counts = profile_grid(tmp_path)
    promised: list[tuple[int, float]] = []
    exclude: tuple[int, ...] = ()
    for market in range(4):
        config = market_config(security="malicious", directory=directory, budget=BUDGET, exclude=exclude)
        outcome = MarketPhase(config).run(grid)
        assert outcome.status == "succeeded" and outcome.total_payment <= BUDGET  # each market alone keeps to R
        promised += [(node, outcome.payments[node]) for node in outcome.audited]
        losers = [n for n in sorted(counts) if n not in outcome.winners]
        exclude = (*outcome.winners, *losers[:2]) if market == 0 else ()
    opened_nodes = {node for node, _ in promised}
    total = math.fsum(payment for _, payment in promised)
    assert len(opened_nodes) >= 2 and total > BUDGET  # the limit, as the docs state it


def test_an_endorsement_by_a_directory_member_outside_the_session_does_not_count(tmp_path: Path) -> None:
    """The pinned directory holds an eleventh member that never connects (its key the buyer's). The honest award is
    endorsed by its winners and the stated colluders, one short of the quorum; the outsider's valid endorsement
    would make it up, but it is no survivor of the session, so no winner opens; the same audit with one more
    honest endorser opens them (the quorum is the one the node computes, not more)."""
    counts = make_counts(NODES, seed=21)
    nodes = sorted(counts)
    outsider = max(nodes) + 1
    configs, directory = profile_setup(tmp_path, [*nodes, outsider])
    grid = InProcessGrid(drop_in_app(counts), nodes, node_configs={n: configs[n] for n in nodes})
    stated = math.ceil(PROFILE_COLLUDER_SHARE * (NODES + 1))
    quorum = binding_quorum(NODES, stated)
    seen: dict[str, Any] = {}

    def attack(phase, grid, pass_result, bids):  # type: ignore[no-untyped-def]
        honest, tree = award_for(phase, grid, pass_result, bids)
        signed = _signed(phase, honest)
        ranked = sorted(bids, key=lambda n: (-bids[n][0] / bids[n][1], n))
        colluders = [n for n in ranked if n not in honest.winners][-stated:]
        keys = _colluder_keys(tmp_path, [*colluders, outsider])
        spare = [n for n in ranked if n not in honest.winners and n not in colluders]
        short = quorum - 1 - len(honest.winners) - len(colluders)  # honest endorsers that leave it one short
        first = [*honest.winners, *spare[:short]]
        ends = endorsed(send_all(phase, grid, ACTION_ENDORSE, endorse_requests(pass_result, signed, tree, first)))
        ends |= {n: sign_award_endorsement(key, signed.digest) for n, key in keys.items()}
        assert len(ends) == quorum
        audit = {w: fields_of(pass_result, signed, ends) for w in honest.winners}
        seen["with_outsider"] = opened(send_all(phase, grid, ACTION_AUDIT, audit))
        more = endorsed(
            send_all(phase, grid, ACTION_ENDORSE, endorse_requests(pass_result, signed, tree, spare[short:][:1]))
        )
        audit = {w: fields_of(pass_result, signed, ends | more) for w in honest.winners}
        seen.update(with_one_more=opened(send_all(phase, grid, ACTION_AUDIT, audit)), winners=set(honest.winners))

    phase = MaliciousPhase(attack, security="malicious", directory=directory, budget=BUDGET)
    with pytest.raises(_AttackDone):
        phase.run(grid)
    assert seen["with_outsider"] == set()
    assert seen["with_one_more"] == seen["winners"]


def test_payments_within_the_listing_tolerance_are_endorsed_and_still_total_within_the_budget(tmp_path: Path) -> None:
    """The bidders accept a listed payment within 1e-9 (relative) of the one they recompute: the buyer inflates
    every payment by 0.9e-9 (endorsed, opened) and by 2e-9 (refused). The auction pays at most ``R / 2`` in all, so
    the slack never takes the opened winners' total past ``R``."""
    seen: dict[str, Any] = {}

    def attack(phase, grid, pass_result, bids):  # type: ignore[no-untyped-def]
        honest, tree = award_for(phase, grid, pass_result, bids)
        for factor in (1 + 2e-9, 1 + 0.9e-9):
            head = tuple(dataclasses.replace(b, payment=b.payment * factor) for b in honest.head)
            forged = dataclasses.replace(honest, head=head)
            signed = _signed(phase, forged)
            ends = endorsed(send_all(phase, grid, ACTION_ENDORSE, endorse_requests(pass_result, signed, tree, bids)))
            audits = send_all(
                phase, grid, ACTION_AUDIT, {w: fields_of(pass_result, signed, ends) for w in forged.winners}
            )
            seen[factor] = (set(ends), opened(audits), forged)

    play(tmp_path, attack)
    assert seen[1 + 2e-9][:2] == (set(), set())
    endorsers, opened_nodes, forged = seen[1 + 0.9e-9]
    assert len(endorsers) == NODES and opened_nodes == set(forged.winners)
    assert math.fsum(forged.payments[n] for n in opened_nodes) <= BUDGET / 2 * (1 + 1e-9)


def _raw(award: Award, **fields: Any) -> Award:
    """``award`` with ``fields`` set past its validation (what a buyer can still encode and sign)."""
    raw = object.__new__(Award)
    raw.__dict__.update({**award.__dict__, **fields})
    return raw


@pytest.mark.parametrize(
    "trick", ["negative-zero-payment", "duplicated-node-id", "trailing-bytes", "own-score-one-ulp-off", "nan-score"]
)
def test_encoding_and_float_tricks_in_the_signed_award_get_no_endorsement_from_the_bidders_they_touch(
    tmp_path: Path, trick: str
) -> None:
    """Signed by the buyer's real key: a loser's payment as ``-0.0`` (two encodings of one award), the head's first
    bidder listed twice, trailing bytes after the encoding, a NaN score for a listed bidder, and each listed
    bidder's score one ulp off (every figure recomputed). Whole-award tricks: no bidder endorses. The ulp: the bidder
    touched refuses, whatever the others do."""
    seen: dict[str, Any] = {}

    def attack(phase, grid, pass_result, bids):  # type: ignore[no-untyped-def]
        honest, tree = award_for(phase, grid, pass_result, bids)
        head = list(honest.head)
        loser = next(i for i, b in enumerate(head) if b.node_id not in honest.winners)
        touched: set[int] = set(bids)
        if trick == "negative-zero-payment":
            head[loser] = Bidder.__new__(Bidder)
            head[loser].__dict__.update({**honest.head[loser].__dict__, "payment": -0.0})
            encoded = _raw(honest, head=tuple(head)).encode()
        elif trick == "duplicated-node-id":
            encoded = _raw(honest, head=(head[0], *head)).encode()
        elif trick == "trailing-bytes":
            encoded = honest.encode() + b"\x00"
        elif trick == "nan-score":
            head[loser] = Bidder.__new__(Bidder)
            head[loser].__dict__.update({**honest.head[loser].__dict__, "score": math.nan})
            encoded = _raw(honest, head=tuple(head)).encode()
        else:
            refusals: dict[int, bool] = {}
            for bidder in honest.head:
                rows = [(n, s, b) for n, (s, b) in bids.items() if n != bidder.node_id]
                rows.append((bidder.node_id, float(np.nextafter(bidder.score, math.inf)), bidder.bid))
                forged = _award_over(phase, honest, rows)
                signed = _signed(phase, forged)
                reply = send_all(
                    phase, grid, ACTION_ENDORSE, endorse_requests(pass_result, signed, tree, [bidder.node_id])
                )
                refusals[bidder.node_id] = reply[bidder.node_id].has_error()
            seen["refusals"] = refusals
            return
        signature = phase._buyer_key.sign(_signed_message(encoded))  # pylint: disable=protected-access
        requests = {
            n: {**f, KEY_AWARD: encoded, KEY_AWARD_SIGNATURE: signature}
            for n, f in endorse_requests(pass_result, _signed(phase, honest), tree, touched).items()
        }
        seen["endorsers"] = endorsed(send_all(phase, grid, ACTION_ENDORSE, requests))

    play(tmp_path, attack)
    if trick == "own-score-one-ulp-off":
        assert seen["refusals"] and all(seen["refusals"].values())
    else:
        assert seen["endorsers"] == {}


_PRICES = st.sampled_from([0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 5.0, 6.0, 12.0])  # a coarse grid: ratio ties are common


@settings(max_examples=400, deadline=None)
@given(
    bids=st.lists(st.tuples(_PRICES, _PRICES), min_size=2, max_size=8),
    omitted=st.sets(st.integers(0, 7)),
    cap=st.sampled_from([0, 1, 2, 3]),
)
def test_omitting_bidders_that_all_pass_the_unlisted_check_never_changes_the_outcome(
    bids: list[tuple[float, float]], omitted: set[int], cap: int
) -> None:
    """The buyer lists the decisive head of any subset of the bids (budget 10, so bids of 5 sit on ``R / 2`` and
    12 is above ``R``), leaving the rest out. Whenever every bidder outside that head would pass the unlisted
    bidder's check of :func:`check_award` (the head closed, and unchanged with it), the head's winners and payments
    are exactly the full auction's: leaving bidders out gains the buyer nothing it could hide."""
    terms = AwardTerms(10.0, cap, Ed25519PrivateKey.generate().public_key().public_bytes_raw())
    rows = [(node, score, bid) for node, (score, bid) in enumerate(bids)]
    listed = [row for row in rows if row[0] not in omitted]
    if not listed:
        return
    head, closed = head_of(terms, listed)
    head_rows = [row for row in listed if row[0] in head]
    for node, score, bid in rows:
        if node in head or bid > terms.budget:
            continue
        with_it, still_closed = head_of(terms, [*head_rows, (node, score, bid)])
        if not (closed and still_closed and with_it == head):
            return  # that bidder refuses: the award is not endorsed by every bidder
    winners, payments = settle(terms, head_rows)
    all_winners, all_payments = settle(terms, rows)
    assert winners == all_winners
    assert all(math.isclose(payments[n], all_payments[n], rel_tol=1e-9, abs_tol=1e-12) for n in head)
