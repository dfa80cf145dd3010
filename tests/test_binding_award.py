"""The binding award against a buyer that deviates at full strength, in the secure profile at its defaults: drop-in
nodes configured by their node config alone, the real handlers. Issue 39: an award chain, an award naming a node in
no roster, split awards with the stated colluders (and beyond them), a closing message that would take back a
receipt, and malformed endorsements. What the buyer gets is asserted exactly: which bidders opened and what it is
committed to pay them. The attacks on the award run under both budget rules (issue 49), and an award under another rule
than the one announced, or over the budget, is endorsed by no one."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from adversary import make_counts, market_config
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_award import (
    MaliciousPhase,
    _AttackDone,
    award_for,
    endorse_requests,
    endorsed,
    fields_of,
    opened,
    send_all,
)
from test_secure_profile_market import drop_in_app, profile_setup

from flmarket_flwr.market import MarketPhase
from flmarket_flwr.market.node.bidding import CostBasedBid
from flmarket_flwr.market.node.client import read_award
from flmarket_flwr.market.wire.award import Bidder, SignedAward, binding_quorum, settle, sign_award
from flmarket_flwr.market.wire.messages import (
    ACTION_AUDIT,
    ACTION_AWARD,
    ACTION_ENDORSE,
    KEY_ENDORSEMENT,
    RECORD_KEY,
)
from flmarket_flwr.market.wire.profiles import PROFILE_COLLUDER_SHARE
from flmarket_flwr.pass_protocol import load_identity_key
from flmarket_flwr.pass_protocol.identity import sign_award_endorsement, sign_bid
from flmarket_flwr.pricing import BUDGET_RULES
from simulations.inprocess_grid import InProcessGrid, market_client_app

NODES = 10
BUDGET = 40.0
rules = pytest.mark.parametrize("budget_rule", BUDGET_RULES)


@pytest.fixture(autouse=True)
def ledger_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "flmarket-home"
    monkeypatch.setenv("FLMARKET_HOME", str(home))
    return home


def profile_grid(
    tmp_path: Path, seed: int = 21, node_config: Mapping[str, Any] | None = None
) -> tuple[InProcessGrid, Any, dict[int, np.ndarray]]:
    """Ten drop-in nodes in the secure profile at its defaults (the issue's E = 10), each node config with
    ``node_config`` added, and the honest directory."""
    counts = make_counts(NODES, seed=seed)
    nodes = sorted(counts)
    configs, directory = profile_setup(tmp_path, nodes)
    configs = {node: {**config, **(node_config or {})} for node, config in configs.items()}
    return InProcessGrid(drop_in_app(counts), nodes, node_configs=configs), directory, counts


def play(
    tmp_path: Path, attack: Any, seed: int = 21, node_config: Mapping[str, Any] | None = None, **overrides: Any
) -> InProcessGrid:
    grid, directory, _ = profile_grid(tmp_path, seed, node_config)
    phase = MaliciousPhase(attack, security="malicious", directory=directory, budget=BUDGET, **overrides)
    with pytest.raises(_AttackDone):
        phase.run(grid)
    return grid


@rules
def test_an_award_chain_opens_only_the_winners_of_the_first_award_and_their_receipts_stand(
    tmp_path: Path, budget_rule: str
) -> None:
    """Issue 39 item 1: audit the endorsed award's winners, re-issue the award without them ("failed the audit"),
    have it endorsed, audit its winners, and so on. On main at b3b74f6 this opened 5 of 10 bidders with promises
    of 81.8 > R = 40, and closed with all five listed as losers paid 0."""
    seen: dict[str, Any] = {"awards": []}

    def attack(phase, grid, pass_result, bids):  # type: ignore[no-untyped-def]
        remaining = dict(bids)
        for _ in range(len(bids)):
            award, tree = award_for(phase, grid, pass_result, remaining)
            if not award.winners:
                break
            signed = sign_award(award, phase._buyer_key)  # pylint: disable=protected-access
            ends = endorsed(send_all(phase, grid, ACTION_ENDORSE, endorse_requests(pass_result, signed, tree, bids)))
            audits = send_all(
                phase, grid, ACTION_AUDIT, {w: fields_of(pass_result, signed, ends) for w in award.winners}
            )
            seen["awards"].append((award, set(ends), opened(audits)))
            for winner in award.winners:
                remaining.pop(winner)
        seen["bidders"] = set(bids)

    grid = play(tmp_path, attack, budget_rule=budget_rule)
    awards = seen["awards"]
    assert len(awards) >= 3  # the chain went on: the buyer tried at least two re-issues
    first, first_endorsers, first_opened = awards[0]
    assert first_endorsers == seen["bidders"] and first_opened == set(first.winners)
    assert all(not endorsers and not newly for _, endorsers, newly in awards[1:])  # nobody endorses a re-issue
    everyone_opened = set().union(*(newly for _, _, newly in awards))
    promised = math.fsum(award.payments[w] for award, _, newly in awards for w in newly)
    assert everyone_opened == set(first.winners) and promised <= BUDGET
    for winner in first.winners:  # the abort that follows the attack does not take the receipt back
        receipt = read_award(grid.context(winner))
        assert receipt is not None and receipt.won and receipt.opened
        assert receipt.payment == first.payments[winner] >= receipt.bid  # type: ignore[operator]
        assert SignedAward(receipt.award, receipt.signature).verify(receipt.buyer_key) == first  # type: ignore[arg-type]


@rules
def test_a_closing_award_other_than_the_endorsed_one_is_refused_and_the_receipt_kept(
    tmp_path: Path, budget_rule: str
) -> None:
    """After the audit the buyer closes with a second award listing the opened winner as a loser paid 0."""
    seen: dict[str, Any] = {}

    def attack(phase, grid, pass_result, bids):  # type: ignore[no-untyped-def]
        award, tree = award_for(phase, grid, pass_result, bids)
        signed = sign_award(award, phase._buyer_key)  # pylint: disable=protected-access
        ends = endorsed(send_all(phase, grid, ACTION_ENDORSE, endorse_requests(pass_result, signed, tree, bids)))
        opened_now = opened(
            send_all(phase, grid, ACTION_AUDIT, {w: fields_of(pass_result, signed, ends) for w in award.winners})
        )
        rest = {n: v for n, v in bids.items() if n not in award.winners}
        other, _ = award_for(phase, grid, pass_result, rest)
        second = sign_award(other, phase._buyer_key)  # pylint: disable=protected-access
        closing = send_all(phase, grid, ACTION_AWARD, {n: fields_of(pass_result, second) for n in bids})
        seen.update(first=award, opened=opened_now, closing=closing)

    grid = play(tmp_path, attack, budget_rule=budget_rule)
    assert seen["opened"] == set(seen["first"].winners)
    for winner in seen["first"].winners:
        assert seen["closing"][winner].has_error()  # refused ...
        receipt = read_award(grid.context(winner))  # ... and the endorsed award kept
        assert receipt is not None and receipt.won and receipt.opened
        assert receipt.payment == seen["first"].payments[winner]


@rules
def test_an_award_naming_a_node_in_no_roster_is_endorsed_by_no_one(tmp_path: Path, budget_rule: str) -> None:
    """Issue 39 item 2: node 4242, in no roster, made a winner with every payment recomputed (on main at b3b74f6 all
    10 honest bidders endorsed it)."""
    seen: dict[str, Any] = {}

    def attack(phase, grid, pass_result, bids):  # type: ignore[no-untyped-def]
        honest, tree = award_for(phase, grid, pass_result, bids)
        phantom = signed_row(
            grid, pass_result, Ed25519PrivateKey.generate(), 4242, max(s for s, _ in bids.values()) * 10, 1.0
        )
        rows = sorted([*honest.head, phantom], key=lambda b: b.node_id)
        winners, payments = settle(phase.terms, [(b.node_id, b.score, b.bid) for b in rows])
        forged = dataclasses.replace(
            honest, winners=winners, head=tuple(dataclasses.replace(b, payment=payments[b.node_id]) for b in rows)
        )
        assert 4242 in forged.winners
        signed = sign_award(forged, phase._buyer_key)  # pylint: disable=protected-access
        seen["endorsers"] = endorsed(
            send_all(phase, grid, ACTION_ENDORSE, endorse_requests(pass_result, signed, tree, bids))
        )

    play(tmp_path, attack, budget_rule=budget_rule)
    assert seen["endorsers"] == {}


@rules
def test_an_award_under_another_rule_or_over_the_budget_is_endorsed_by_no_one(tmp_path: Path, budget_rule: str) -> None:
    """The rule is one of the terms announced before PASS. The buyer signs (a) the other rule's award under the other
    rule's terms, (b) the other rule's outcome under the announced terms, (c) the announced rule's award with every
    payment doubled: each bidder re-runs the announced rule over the head and endorses none of them; the honest award
    is endorsed by every bidder."""
    other = next(rule for rule in BUDGET_RULES if rule != budget_rule)
    seen: dict[str, Any] = {}

    def attack(phase, grid, pass_result, bids):  # type: ignore[no-untyped-def]
        other_terms = dataclasses.replace(phase.terms, budget_rule=other)
        honest, tree = award_for(phase, grid, pass_result, bids)
        under_other, other_tree = award_for(phase, grid, pass_result, bids, terms=other_terms)
        assert under_other.payments != honest.payments  # the rules pay differently on this market
        relabelled = dataclasses.replace(under_other, terms=phase.terms)
        doubled = dataclasses.replace(
            honest, head=tuple(dataclasses.replace(b, payment=2 * b.payment) for b in honest.head)
        )
        forged = {"other rule": (under_other, other_tree), "relabelled": (relabelled, other_tree)}
        forged["doubled"] = (doubled, tree)
        for name, (award, award_tree) in forged.items():
            signed = sign_award(award, phase._buyer_key)  # pylint: disable=protected-access
            requests = endorse_requests(pass_result, signed, award_tree, bids)
            seen[name] = endorsed(send_all(phase, grid, ACTION_ENDORSE, requests))
        signed = sign_award(honest, phase._buyer_key)  # pylint: disable=protected-access
        seen["honest"] = endorsed(
            send_all(phase, grid, ACTION_ENDORSE, endorse_requests(pass_result, signed, tree, bids))
        )
        seen["bidders"] = set(bids)

    play(tmp_path, attack, budget_rule=budget_rule)
    assert seen["other rule"] == seen["relabelled"] == seen["doubled"] == {}
    assert set(seen["honest"]) == seen["bidders"]


def _colluder_keys(tmp_path: Path, colluders: list[int]) -> dict[int, Any]:
    return {node: load_identity_key(tmp_path / f"node-{node}.pem") for node in colluders}


def signed_row(
    grid: Any, pass_result: Any, key: Ed25519PrivateKey, node: int, score: float, bid: float, payment: float = 0.0
) -> Bidder:
    """A head row for ``node`` with ``score`` and ``bid``, signed with ``key`` (a colluder's, or any key the buyer
    holds) for this run, session and transcript at the node's PASS index (0 for a node in no roster)."""
    signature = sign_bid(
        key, run_id=int(grid.run.run_id), session=pass_result.session, transcript=pass_result.transcript,
        index=pass_result.indices.get(node, 0), node_id=node, score=score, bid=bid,
    )  # fmt: skip
    return Bidder(node, score, bid, payment, signature)


@pytest.mark.parametrize("extra", [0, 2], ids=["the-stated-colluders", "two-beyond-them"])
def test_split_awards_with_colluders_open_one_award_at_most_and_the_bound_is_the_stated_one(
    tmp_path: Path, extra: int
) -> None:
    """Two awards, each the auction over the bids of one group of honest bidders, the colluders endorsing both
    (they sign whatever the buyer asks). Every split of the honest bidders is tried. With the profile's stated
    colluders, ``ceil(0.2 x 10) = 2``, at most one award opens anyone; with two more than stated, both do: the
    guarantee is exactly as large as the parameter."""
    stated = math.ceil(PROFILE_COLLUDER_SHARE * NODES)
    assert binding_quorum(NODES, stated) == 7
    opened_both: dict[int, bool] = {}
    opened_any: dict[int, bool] = {}
    for size in range(1, NODES - stated - extra):  # every split, each in a fresh market (fresh ledgers and keys)
        root = tmp_path / f"split-{size}"
        root.mkdir()

        def attack(phase, grid, pass_result, bids, size=size, root=root):  # type: ignore[no-untyped-def]
            nodes = sorted(bids)
            colluders = nodes[: stated + extra]
            keys = _colluder_keys(root, colluders)
            honest = [n for n in nodes if n not in colluders]
            opened_by = []
            for group in (honest[:size], honest[size:]):
                award, tree = award_for(phase, grid, pass_result, {n: bids[n] for n in group})
                signed = sign_award(award, phase._buyer_key)  # pylint: disable=protected-access
                requests = endorse_requests(pass_result, signed, tree, group)
                ends = endorsed(send_all(phase, grid, ACTION_ENDORSE, requests))
                ends |= {n: sign_award_endorsement(key, signed.digest) for n, key in keys.items()}
                assert award.winners and set(award.winners) <= set(group)  # each award has honest winners to open
                audited = {w: fields_of(pass_result, signed, ends) for w in award.winners}
                opened_by.append(opened(send_all(phase, grid, ACTION_AUDIT, audited)))
            opened_both[size], opened_any[size] = all(opened_by), any(opened_by)

        play(root, attack)
    assert len(opened_both) == NODES - stated - extra - 1
    if extra == 0:
        assert not any(opened_both.values())  # at most one award of a session opens anyone ...
        assert any(opened_any.values())  # ... and one does, where its group and the colluders reach the quorum
    else:
        assert any(opened_both.values())  # beyond the stated colluders a split opens both awards' winners


MALFORMED = st.one_of(
    st.binary(max_size=130).filter(lambda b: len(b) not in (0, 64)),
    st.binary(min_size=64, max_size=64),  # 64 bytes that are no signature on the award
    st.integers(-(2**63), 2**63 - 1),  # what a ConfigRecord holds
    st.text(max_size=8),
    st.none(),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(endorsement=MALFORMED, with_directory=st.booleans())
def test_a_malformed_endorsement_excludes_its_sender_and_the_market_finishes(
    endorsement: object, with_directory: bool
) -> None:
    """Issue 39 item 8: one fuzzed ``market_endorse`` reply crashed the buyer (``AwardError`` in pack_endorsements);
    now it excludes that node, and the market finishes with the others."""
    counts = make_counts(8, seed=31)
    culprit = sorted(counts)[3]

    def hook(instruction: Any, reply: Any) -> Any:
        if (
            instruction.metadata.message_type == f"query.{ACTION_ENDORSE}"
            and instruction.metadata.dst_node_id == culprit
        ):
            record = reply.content.config_records[RECORD_KEY]
            if endorsement is None:
                del record[KEY_ENDORSEMENT]
            else:
                record[KEY_ENDORSEMENT] = endorsement  # type: ignore[assignment]
        return reply

    if with_directory:
        from adversary import signed_app

        app, directory = signed_app(counts)
        config = market_config(budget=60.0, directory=directory)
    else:
        app, config = market_client_app(counts, CostBasedBid(0.01)), market_config(budget=60.0)
    valid_without_directory = isinstance(endorsement, bytes) and len(endorsement) in (0, 64) and not with_directory
    outcome = MarketPhase(config).run(InProcessGrid(app, list(counts), reply_hook=hook))
    assert outcome.status == "succeeded" and outcome.total_payment <= 60.0
    if valid_without_directory:
        assert culprit not in outcome.excluded  # without a directory, 64 bytes are a well-formed (unchecked) reply
    else:
        assert outcome.excluded[culprit].startswith(ACTION_ENDORSE) and culprit not in outcome.winners


def test_without_a_directory_a_node_still_endorses_one_award_per_session() -> None:
    """The once-per-session rule holds in the default profile too: a re-issued award is refused by every node."""
    counts = make_counts(6, seed=32)
    seen: dict[str, Any] = {}

    def attack(phase, grid, pass_result, bids):  # type: ignore[no-untyped-def]
        award, tree = award_for(phase, grid, pass_result, bids)
        signed = sign_award(award, phase._buyer_key)  # pylint: disable=protected-access
        seen["first"] = endorsed(
            send_all(phase, grid, ACTION_ENDORSE, endorse_requests(pass_result, signed, tree, bids))
        )
        rest = {n: v for n, v in bids.items() if n not in award.winners}
        again, again_tree = award_for(phase, grid, pass_result, rest)
        resigned = sign_award(again, phase._buyer_key)  # pylint: disable=protected-access
        seen["second"] = endorsed(
            send_all(phase, grid, ACTION_ENDORSE, endorse_requests(pass_result, resigned, again_tree, rest))
        )

    grid = InProcessGrid(market_client_app(counts, CostBasedBid(0.01)), list(counts))
    with pytest.raises(_AttackDone):
        MaliciousPhase(attack, budget=60.0).run(grid)
    assert set(seen["first"]) == set(counts) and seen["second"] == {}
