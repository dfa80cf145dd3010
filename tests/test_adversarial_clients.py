"""Dishonest clients against the real market: poisoned sums, false scores, shill bids, refused audits.

Each liar is a real client whose reply is altered on the way to the server (``InProcessGrid``'s reply hook),
so the server-side checks are exercised exactly as in a run; each test asserts the attack fails: the market
aborts cleanly, or the liar is excluded and not paid while the honest clients' auction goes on.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from adversary import (
    NUM_CLASSES,
    altering,
    client_secrets,
    honest_grid,
    lying_client_app,
    make_counts,
    market_config,
    signed_setup,
)
from flwr.clientapp import ClientApp

from flmarket_flwr.market import CostBasedBid, MarketError, MarketPhase, register_market_handlers
from flmarket_flwr.market.node.node_config import NodeSettings
from flmarket_flwr.market.wire.messages import RECORD_KEY
from flmarket_flwr.pass_protocol import PassClient
from flmarket_flwr.pass_protocol.encoding import bitmap_to_indices
from flmarket_flwr.pass_protocol.identity import sign_share_ciphertext, sign_survivor_set, verify_survivor_set
from flmarket_flwr.pass_protocol.messages import MaskRequest, UnmaskRequest
from flmarket_flwr.pricing import run_auction, score
from simulations.inprocess_grid import InProcessGrid

POLICY = CostBasedBid(0.01)


def honest_auction(counts: dict[int, np.ndarray], nodes: list[int], budget: float, num_winners=None):
    """Winners and payments of the auction over ``nodes`` with their true scores and bids."""
    total = np.sum(list(counts.values()), axis=0)
    scores = [score(counts[n], total, len(counts)) for n in nodes]
    bids = [POLICY(counts[n], s, None) for n, s in zip(nodes, scores, strict=True)]
    result = run_auction(scores, bids, budget, num_winners=num_winners)
    return [nodes[i] for i in result.winners], {n: float(result.payments[i]) for i, n in enumerate(nodes)}


# --- Attack 5: poisoning N_s -----------------------------------------------------------------------
@pytest.mark.parametrize("poison", [2**60, 2**63, 10**9 * 8 + 1])
def test_a_poisoned_masked_vector_aborts_the_market_cleanly(poison: int) -> None:
    counts = make_counts(8)
    attacker = sorted(counts)[2]

    def add_poison(record) -> None:
        words = np.frombuffer(record["masked_counts"], dtype="<u8").astype(np.uint64)
        words[0] += np.uint64(poison)
        record["masked_counts"] = words.astype("<u8").tobytes()

    grid = honest_grid(counts, reply_hook=altering(attacker, "market_mask", add_poison))
    phase = MarketPhase(market_config())
    with pytest.raises(MarketError, match="exceeds count_bound"):
        phase.run(grid)
    assert len(phase.pass_sessions) == 1, "refused after the unmask round: never a second session (a second sum)"
    # Nobody was scored or paid, and every client was told the market closed: no secret is left anywhere.
    for node in counts:
        assert client_secrets(grid, node) == {}
        assert grid.context(node).state.config_records[RECORD_KEY]["won"] is False


def test_a_poison_within_the_declared_bound_shifts_n_s_as_documented() -> None:
    """Out of scope (documented): a shift within ``count_bound * E`` is a lie about one's own counts."""
    counts = make_counts(8)
    attacker = sorted(counts)[2]

    def add_some(record) -> None:
        words = np.frombuffer(record["masked_counts"], dtype="<u8").astype(np.uint64)
        words[0] += np.uint64(50)
        record["masked_counts"] = words.astype("<u8").tobytes()

    grid = honest_grid(counts, reply_hook=altering(attacker, "market_mask", add_some))
    outcome = MarketPhase(market_config()).run(grid)
    assert outcome.global_counts[0] == int(sum(c[0] for c in counts.values())) + 50


# --- Attack 6: false scores, refused audits, shill bids -------------------------------------------
def test_a_loser_claiming_the_highest_score_is_caught_by_the_audit_and_not_paid() -> None:
    counts = make_counts(10, seed=5)
    budget = 30.0
    nodes = sorted(counts)
    honest_winners, _ = honest_auction(counts, nodes, budget)
    total = np.sum(list(counts.values()), axis=0)
    highest = score(total, total, len(nodes))
    true_scores = {n: score(counts[n], total, len(nodes)) for n in nodes}
    bids = {n: POLICY(counts[n], true_scores[n], None) for n in nodes}

    def wins_by_lying(node: int) -> bool:
        claimed = [highest if n == node else true_scores[n] for n in nodes]
        result = run_auction(claimed, [bids[n] for n in nodes], budget)
        return nodes.index(node) in result.winners

    liar = next(n for n in nodes if n not in honest_winners and wins_by_lying(n))

    grid = InProcessGrid(lying_client_app(counts, liar, highest, POLICY), list(counts))
    outcome = MarketPhase(market_config(budget=budget)).run(grid)

    assert liar not in outcome.winners
    assert outcome.payments.get(liar, 0.0) == 0.0
    assert "audit" in outcome.excluded[liar]
    # The award is never re-issued: the other winners are those of the one award (the liar's claim in it), at its
    # payments, and no bidder is promoted in the liar's place (nor opened).
    claimed = run_auction([highest if n == liar else true_scores[n] for n in nodes], [bids[n] for n in nodes], budget)
    awarded = [nodes[int(i)] for i in claimed.winners]
    assert liar in awarded and outcome.winners == [n for n in awarded if n != liar]
    assert {n: outcome.payments[n] for n in outcome.winners} == pytest.approx(
        {nodes[i]: float(claimed.payments[i]) for i in range(len(nodes)) if nodes[i] in outcome.winners}
    )
    assert outcome.total_payment <= budget


def test_opening_other_counts_than_committed_is_caught() -> None:
    counts = make_counts(6, seed=2)
    grid0 = honest_grid(counts)
    winner = MarketPhase(market_config()).run(grid0).winners[0]

    def other_counts(record) -> None:
        record["counts"] = [int(c) + 1 for c in record["counts"]]

    grid = honest_grid(counts, reply_hook=altering(winner, "market_audit", other_counts))
    outcome = MarketPhase(market_config()).run(grid)
    assert winner not in outcome.winners
    assert "commitment" in outcome.excluded[winner]
    assert outcome.payments.get(winner, 0.0) == 0.0


def test_a_winner_that_refuses_the_audit_is_not_paid() -> None:
    counts = make_counts(6, seed=2)
    winner = MarketPhase(market_config()).run(honest_grid(counts)).winners[0]

    refusing = ClientApp()
    register_market_handlers(
        refusing, lambda context: counts[context.node_id], POLICY, settings=lambda context: NodeSettings(audit=False)
    )
    grid = InProcessGrid(lambda: refusing, list(counts))  # every client refuses audits
    outcome = MarketPhase(market_config()).run(grid)
    assert outcome.winners == [] and outcome.total_payment == 0.0
    assert winner in outcome.excluded
    # With audits off at the market, the same clients win as without the liars' checks.
    unaudited = MarketPhase(market_config(audit_winners=False)).run(InProcessGrid(lambda: refusing, list(counts)))
    assert unaudited.winners[0] == winner


@pytest.mark.parametrize("num_winners", [None, 3])
def test_a_shill_bid_of_1e308_cannot_make_a_payment_infinite(num_winners) -> None:
    counts = make_counts(6, seed=4)
    shill = sorted(counts)[0]
    grid = honest_grid(counts, reply_hook=altering(shill, "market_bid", lambda r: r.__setitem__("bid", 1e308)))
    outcome = MarketPhase(market_config(budget=50.0, num_winners=num_winners)).run(grid)
    assert shill not in outcome.winners
    assert all(np.isfinite(p) and 0.0 <= p <= 50.0 for p in outcome.payments.values())


@pytest.mark.parametrize("bid", [1e200, 1e-200])
def test_a_bid_outside_the_auctions_range_excludes_its_client_and_the_market_finishes(bid: float) -> None:
    """Such a bid would make the auction refuse its whole input: it is refused on arrival instead, by name."""
    counts = make_counts(6, seed=4)
    shill = sorted(counts)[2]
    grid = honest_grid(counts, reply_hook=altering(shill, "market_bid", lambda r: r.__setitem__("bid", bid)))
    outcome = MarketPhase(market_config(budget=50.0)).run(grid)
    assert "the auction's range" in outcome.excluded[shill]
    assert shill not in outcome.participants and outcome.winners


def test_most_clients_failing_the_bid_step_aborts_instead_of_paying_the_rest() -> None:
    counts = make_counts(7, seed=6)
    liars = sorted(counts)[:4]

    def hook(instruction, reply):
        if instruction.metadata.dst_node_id in liars and instruction.metadata.message_type == "query.market_bid":
            reply.content.config_records[RECORD_KEY]["score"] = -1.0
        return reply

    with pytest.raises(MarketError, match="thin market: only 3 of the 7 invited"):
        MarketPhase(market_config()).run(honest_grid(counts, reply_hook=hook))


def test_a_client_claiming_more_than_any_client_can_score_is_excluded() -> None:
    counts = make_counts(6, seed=1)
    liar = sorted(counts)[1]
    grid = honest_grid(counts, reply_hook=altering(liar, "market_bid", lambda r: r.__setitem__("score", 1e300)))
    outcome = MarketPhase(market_config()).run(grid)
    assert liar in outcome.excluded and liar not in outcome.participants


def test_a_client_with_counts_above_the_declared_bound_does_not_take_part() -> None:
    counts = make_counts(5, seed=1)
    big = sorted(counts)[0]
    counts[big] = counts[big].copy()
    counts[big][3] = 10**6
    outcome = MarketPhase(market_config(count_bound=10**5)).run(honest_grid(counts))
    assert big in outcome.excluded and big not in outcome.pass_participants
    assert outcome.global_counts == [int(c) for c in np.sum([counts[n] for n in counts if n != big], axis=0)]
    assert NUM_CLASSES == len(outcome.global_counts)


# --- Issue 21, item 3: one bad client should cost itself, not everyone -------------------------------
def _chained(*hooks):
    def hook(instruction, reply):
        for each in hooks:
            reply = each(instruction, reply)
        return reply

    return hook


def _flip_first_byte(record) -> None:
    record["survivor_shares"] = [bytes([share[0] ^ 1]) + share[1:] for share in record["survivor_shares"]]


@pytest.mark.parametrize("num_liars", [1, 2])
def test_corrupted_unmask_shares_exclude_their_senders_by_name_and_the_market_finishes(num_liars: int) -> None:
    counts = make_counts(10, seed=7)  # the complete graph: k = 9, t = 5, so 7 honest holders are left per secret
    liars = sorted(counts)[2 : 2 + num_liars]
    grid = honest_grid(counts, reply_hook=_chained(*(altering(n, "market_unmask", _flip_first_byte) for n in liars)))
    outcome = MarketPhase(market_config()).run(grid)
    assert set(outcome.excluded) == set(liars)
    for liar in liars:
        assert "corrupted share" in outcome.excluded[liar]
        assert liar not in outcome.participants
    # The liars sent their masked inputs: they are in N_s, which is exact.
    assert outcome.global_counts == [int(c) for c in np.sum(list(counts.values()), axis=0)]


def _garbled(ciphertext: bytes) -> bytes:
    """Well-formed garbage: the real ciphertext with its 16-byte authentication tag zeroed."""
    return ciphertext[:-16] + bytes(16)


def _garbage_body(record) -> None:
    record["ciphertexts"] = [_garbled(c) for c in record["ciphertexts"]]


def _garbage_all(record) -> None:
    """All-zero ciphertexts of the right length."""
    record["ciphertexts"] = [bytes(len(c)) for c in record["ciphertexts"]]


def _accusing(node: int, how_many: int):
    """A reply hook by which ``node`` accuses its first ``how_many`` senders (whose shares opened) with no proof."""

    def hook(instruction, reply):
        if (
            instruction.metadata.dst_node_id == node
            and instruction.metadata.message_type == "query.market_mask"
            and not reply.has_error()
        ):
            senders = list(instruction.content.config_records[RECORD_KEY]["senders"])[:how_many]
            record = reply.content.config_records[RECORD_KEY]
            record["accused"] = senders
            record["proofs"] = [b""] * len(senders)
        return reply

    return hook


def _lying_receiver(monkeypatch, node: int, how_many: int) -> None:
    """Make ``node``'s real client accuse its first ``how_many`` senders, whose shares opened, with VALID proofs.

    The strongest false accuser: it proves the true channel secret of each edge (it holds its own cipher key),
    so only the server's opening of its relayed copy can tell that the shares were fine.
    """
    honest_mask_input = PassClient.mask_input

    def mask_input(self, request, noise=None):
        if self.state.node_id != node:
            return honest_mask_input(self, request, noise)
        senders = MaskRequest.coerce(request).senders[:how_many]
        proofs = [self._prove_channel(v) for v in senders]  # before the honest step wipes the cipher key
        reply = honest_mask_input(self, request, noise)
        return type(reply)(reply.masked_counts, reply.counts_commitment, senders, proofs)

    monkeypatch.setattr(PassClient, "mask_input", mask_input)


@pytest.mark.parametrize(("num_nodes", "num_attackers"), [(8, 1), (8, 2), (40, 1), (40, 2)])
def test_garbage_share_ciphertexts_name_their_senders_and_the_market_finishes(num_nodes, num_attackers) -> None:
    """Issue 21, item 3: each receiver accuses with the proven channel secret, which convicts the sender.

    E = 8 is the complete graph (k = 7, t = 4), E = 40 a sparse one (k = 28 of 39, t = 15).
    """
    counts = make_counts(num_nodes, seed=3)
    attackers = sorted(counts)[2 : 2 + num_attackers]
    garbles = (_garbage_body, _garbage_all)[:num_attackers]
    hooks = [altering(n, "market_share", garble) for n, garble in zip(attackers, garbles, strict=True)]
    outcome = MarketPhase(market_config()).run(honest_grid(counts, reply_hook=_chained(*hooks)))
    assert set(outcome.excluded) == set(attackers)
    for attacker in attackers:
        assert "garbage shares" in outcome.excluded[attacker]
        assert attacker not in outcome.participants
    honest = [n for n in counts if n not in attackers]
    assert sorted(outcome.participants) == sorted(honest)
    assert outcome.global_counts == [int(c) for c in np.sum([counts[n] for n in honest], axis=0)]


def _garbling_to(victim: int, index_of: dict[int, int]):
    """A change to a share-keys reply: garble only the ciphertext to ``victim`` (its PASS index learnt below)."""

    def change(record) -> None:
        at = list(record["receivers"]).index(index_of[victim])
        record["ciphertexts"] = [_garbled(c) if i == at else c for i, c in enumerate(record["ciphertexts"])]

    return change


def _learning_index(node: int, index_of: dict[int, int]):
    """A reply hook that reads ``node``'s PASS index off the advertise request the server sends it."""

    def hook(instruction, reply):
        kind = instruction.metadata.message_type
        if instruction.metadata.dst_node_id == node and kind == "query.market_advertise":
            index_of[node] = instruction.content.config_records[RECORD_KEY]["index"]
        return reply

    return hook


def test_colluders_who_garble_their_shares_to_one_receiver_below_its_threshold_are_named_not_it(caplog) -> None:
    """``k - t + 1`` clients garble only their shares to one honest receiver (E = 8, complete: k = 7, t = 4, so 4
    of them), leaving it fewer than ``t`` openable senders. It cannot mask with so few: it withdraws and sends its
    accusations with their proofs instead of a bare refusal, and the four are named ("garbage shares") while it
    leaves as a dropout with its reason. With five of eight gone no survivor keeps ``t`` holders of its
    self-mask seed, so the session fails closed before any unmask request, and the market runs a fresh session
    without the four it named (the receiver, wronged, is taken back), which releases the exact sum of the four
    others."""
    counts = make_counts(8, seed=3)
    nodes = sorted(counts)
    victim, attackers = nodes[0], nodes[1:5]
    index_of: dict[int, int] = {}
    hooks = [altering(n, "market_share", _garbling_to(victim, index_of)) for n in attackers]
    grid = honest_grid(counts, reply_hook=_chained(_learning_index(victim, index_of), *hooks))
    with caplog.at_level(logging.WARNING, logger="flwr"):
        outcome = MarketPhase(market_config()).run(grid)
    first, second = outcome.pass_sessions
    assert "keeps only 2 surviving" in first.result and first.named == attackers
    named = [line for line in caplog.text.splitlines() if "garbage shares" in line]
    for attacker in attackers:
        assert any(f"node {attacker}" in line and f"client {index_of[victim]}" in line for line in named)
    assert any(f"node {victim}" in line and "withdrew" in line for line in caplog.text.splitlines())
    rest = [n for n in nodes if n not in attackers]
    assert second.roster == rest and outcome.pass_participants == rest and victim not in outcome.excluded
    assert client_secrets(grid, victim) == {}  # its first session's secrets went when it joined the second
    assert outcome.global_counts == [int(c) for c in np.sum([counts[n] for n in rest], axis=0)]


@pytest.mark.parametrize(("num_nodes", "how_many"), [(8, 1), (40, 2)])
def test_an_accuser_without_a_proof_is_named_and_the_accused_stays(num_nodes: int, how_many: int) -> None:
    """An accusation that does not prove the channel secret names the accuser; the accused is not touched."""
    counts = make_counts(num_nodes, seed=5)
    liar = sorted(counts)[1]
    outcome = MarketPhase(market_config()).run(honest_grid(counts, reply_hook=_accusing(liar, how_many)))
    assert set(outcome.excluded) == {liar}
    assert "without a valid proof" in outcome.excluded[liar]
    honest = [n for n in counts if n != liar]
    assert sorted(outcome.participants) == sorted(honest)
    assert outcome.global_counts == [int(c) for c in np.sum([counts[n] for n in honest], axis=0)]


@pytest.mark.parametrize(("num_nodes", "how_many"), [(8, 1), (40, 2)])
def test_a_false_accuser_with_valid_proofs_is_named_and_the_accused_stay(monkeypatch, num_nodes, how_many) -> None:
    """An accuser that proves the true channel secrets is named when the server's copies open under them."""
    counts = make_counts(num_nodes, seed=5)
    liar = sorted(counts)[1]
    _lying_receiver(monkeypatch, liar, how_many)
    outcome = MarketPhase(market_config()).run(honest_grid(counts))
    assert set(outcome.excluded) == {liar}
    assert "false accusation" in outcome.excluded[liar]
    honest = [n for n in counts if n != liar]
    assert sorted(outcome.participants) == sorted(honest)
    assert outcome.global_counts == [int(c) for c in np.sum([counts[n] for n in honest], axis=0)]


class _SigningLiar:
    """A reply hook for a client with an identity key whose share ciphertexts are garbage, each validly signed
    by it (so only the receivers' proven channel secrets can convict it; it knows its own context)."""

    def __init__(self, node: int, identity_key) -> None:
        self.node, self.key = node, identity_key
        self.context: dict = {}

    def __call__(self, instruction, reply):
        if instruction.metadata.dst_node_id != self.node or reply.has_error():
            return reply
        sent = instruction.content.config_records[RECORD_KEY]
        record = reply.content.config_records[RECORD_KEY]
        kind = instruction.metadata.message_type
        where = {"run_id": int(instruction.metadata.run_id)}
        if kind == "query.market_advertise":
            self.context = {"index": sent["index"], "session": sent["session"], "roster": sent["roster"]}
        where.update(session=self.context.get("session"), roster=self.context.get("roster"))
        if kind == "query.market_share":
            record["ciphertexts"] = [_garbled(c) for c in record["ciphertexts"]]
            record["signatures"] = [
                sign_share_ciphertext(self.key, self.context["index"], v, c, d, **where)
                for v, c, d in zip(record["receivers"], record["ciphertexts"], record["share_digests"], strict=True)
            ]
        return reply


@pytest.mark.parametrize("resign", [True, False])
def test_with_identity_keys_a_garbage_sender_is_named_whether_or_not_it_signs_its_garbage(resign: bool) -> None:
    """Signed garbage is convicted by the receivers' proven secrets; unsigned garbage by the server's own copy."""
    counts = make_counts(10, seed=11)
    app, directory, keys = signed_setup(counts)
    attacker = sorted(counts)[4]
    if resign:
        hook = _SigningLiar(attacker, keys[attacker])
    else:
        hook = altering(attacker, "market_share", _garbage_body)
    outcome = MarketPhase(market_config(directory=directory)).run(InProcessGrid(app, list(counts), reply_hook=hook))
    assert set(outcome.excluded) == {attacker}
    reason = "do not open under the proven secret" if resign else "is not signed by it"
    assert reason in outcome.excluded[attacker]
    honest = [n for n in counts if n != attacker]
    assert outcome.global_counts == [int(c) for c in np.sum([counts[n] for n in honest], axis=0)]


@pytest.mark.parametrize("proven", [True, False])
def test_with_identity_keys_a_false_accusation_names_the_accuser(monkeypatch, proven: bool) -> None:
    """With or without a valid proof of the channel secrets, an accusation of validly signed shares that open
    names the accuser."""
    counts = make_counts(10, seed=13)
    app, directory, _ = signed_setup(counts)
    liar = sorted(counts)[6]
    hook = None
    if proven:
        _lying_receiver(monkeypatch, liar, 2)
    else:
        hook = _accusing(liar, 2)
    outcome = MarketPhase(market_config(directory=directory)).run(InProcessGrid(app, list(counts), reply_hook=hook))
    assert set(outcome.excluded) == {liar}
    assert ("false accusation" if proven else "without a valid proof") in outcome.excluded[liar]
    honest = [n for n in counts if n != liar]
    assert outcome.global_counts == [int(c) for c in np.sum([counts[n] for n in honest], axis=0)]


def test_garbage_to_more_than_k_minus_t_neighbours_but_not_all_is_named_and_pass_runs_again_without_it(caplog):
    """Four of seven receivers get garbage (E = 8, t = 4): three good holders cannot rebuild its mask key, so the
    session fails closed naming the sender, and a fresh session without it releases the others' exact sum."""
    counts = make_counts(8, seed=17)
    attacker = sorted(counts)[3]

    def garbage_to_four(record) -> None:
        sent = record["ciphertexts"]
        record["ciphertexts"] = [_garbled(c) if i < 4 else c for i, c in enumerate(sent)]

    grid = honest_grid(counts, reply_hook=altering(attacker, "market_share", garbage_to_four))
    with caplog.at_level(logging.WARNING, logger="flwr"):
        outcome = MarketPhase(market_config()).run(grid)
    assert f"node {attacker}" in caplog.text and "garbage shares" in caplog.text
    assert "keeps only 3 surviving" in outcome.pass_sessions[0].result
    assert set(outcome.excluded) == {attacker}
    honest = [n for n in counts if n != attacker]
    assert outcome.global_counts == [int(c) for c in np.sum([counts[n] for n in honest], axis=0)]


def test_a_survivor_that_signs_another_set_with_its_own_key_is_excluded_and_pass_finishes() -> None:
    """Not garbage: a valid signature under the liar's own identity key, on a set with one survivor moved to dropped."""
    counts = make_counts(8, seed=17)
    app, directory, keys = signed_setup(counts)
    liar = sorted(counts)[5]

    def sign_another_set(instruction, reply):  # type: ignore[no-untyped-def]
        if instruction.metadata.dst_node_id != liar or instruction.metadata.message_type != "query.market_survivors":
            return reply
        shown = instruction.content.config_records[RECORD_KEY]
        survivors, dropped = bitmap_to_indices(shown["survivors"]), bitmap_to_indices(shown["dropped"])
        other = UnmaskRequest.of(survivors[1:], sorted([*dropped, survivors[0]]))
        state = grid.context(liar).state.config_records[RECORD_KEY]
        where = {
            "run_id": int(state["pass/run_id"]),
            "session": state["pass/session"],
            "roster": state["pass/roster"],
            "participants": state["pass/participants"],
        }
        signature = sign_survivor_set(keys[liar], other.survivors, other.dropped, **where)
        verify_survivor_set(directory.key_of(liar), signature, other.survivors, other.dropped, **where)  # valid
        reply.content.config_records[RECORD_KEY]["signature"] = signature
        signed.append(liar)
        return reply

    signed: list[int] = []
    grid = InProcessGrid(app, list(counts), reply_hook=sign_another_set)
    outcome = MarketPhase(market_config(directory=directory)).run(grid)
    assert signed == [liar] and set(outcome.excluded) == {liar}
    assert outcome.excluded[liar].startswith("PASS: survivor-set signature refused")
    # its masked input stays in the sum (it survived); its self-mask came back from its neighbours' shares
    assert outcome.global_counts == [int(c) for c in np.sum(list(counts.values()), axis=0)]
