"""Dropouts and malformed replies at each of the seven steps: the node is excluded with a logged reason,
the sum stays exact, and what cannot be recovered is a clear :class:`MarketError`.

Faults are injected on real replies of real ClientApps (``InProcessGrid.reply_hook``): a reply
is dropped (a timeout), replaced by an error reply, or replaced by a malformed one. PASS runs once:
a client lost at any of its four rounds is recovered inside the same session (its masks from the
Shamir shares of its neighbours), never by a second sum.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import pytest
from adversary import lying_client_app
from flwr.app import ConfigRecord, Error, Message, RecordDict
from flwr.common.constant import ErrorCode

from flmarket_flwr.market import CostBasedBid, MarketConfig, MarketError, MarketOutcome, MarketPhase
from flmarket_flwr.market.wire.award import Award
from flmarket_flwr.market.wire.messages import (
    ACTION_ADVERTISE,
    ACTION_AUDIT,
    ACTION_AWARD,
    ACTION_BID,
    ACTION_ENDORSE,
    ACTION_MASK,
    ACTION_SHARE,
    ACTION_UNMASK,
    KEY_AWARD,
    KEY_COUNTS,
    KEY_NONCE,
    RECORD_KEY,
    message_type,
)
from flmarket_flwr.pass_protocol.encoding import bitmap_to_indices
from flmarket_flwr.pricing import run_auction, score
from simulations.inprocess_grid import InProcessGrid, market_client_app

NUM_CLASSES = 6
COST, MARKUP = 0.05, 0.2
PASS_ROUNDS = (ACTION_ADVERTISE, ACTION_SHARE, ACTION_MASK, ACTION_UNMASK)
Corruption = Callable[[Message, Message], Message | None]


def make_counts(num_nodes: int, seed: int = 0) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {1000 + 17 * i: rng.integers(1, 40, size=NUM_CLASSES) for i in range(num_nodes)}


def config(**overrides: object) -> MarketConfig:
    values: dict[str, object] = {
        "budget": 60.0,
        "num_classes": NUM_CLASSES,
        "poll_interval": 0.001,
        "timeout": 0.5,
        "timeout_per_node": 0.0,
    }
    values.update(overrides)
    return MarketConfig(**values)  # type: ignore[arg-type]


# --- Corruptions ---------------------------------------------------------------------------------
def drop(instruction: Message, reply: Message) -> None:
    return None


def error_reply(instruction: Message, reply: Message) -> Message:
    return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason="boom"), reply_to=instruction)


def without_record(instruction: Message, reply: Message) -> Message:
    return Message(RecordDict({"other": ConfigRecord({"x": 1})}), reply_to=instruction)


def with_field(key: str, value: object) -> Corruption:
    """The genuine reply with one field replaced (or removed if ``value`` is None)."""

    def corrupt(instruction: Message, reply: Message) -> Message:
        record = ConfigRecord(dict(reply.content.config_records[RECORD_KEY]))
        if value is None:
            del record[key]
        else:
            record[key] = value  # type: ignore[assignment]
        return Message(RecordDict({RECORD_KEY: record}), reply_to=instruction)

    return corrupt


def with_change(key: str, change: Callable[[object], object]) -> Corruption:
    """The genuine reply with ``record[key] = change(record[key])``."""

    def corrupt(instruction: Message, reply: Message) -> Message:
        record = ConfigRecord(dict(reply.content.config_records[RECORD_KEY]))
        record[key] = change(record[key])  # type: ignore[assignment]
        return Message(RecordDict({RECORD_KEY: record}), reply_to=instruction)

    return corrupt


def flip_top_bit(data: object) -> bytes:
    """A masked vector of the right length whose first word is off by 2**63."""
    flipped = bytearray(data)  # type: ignore[arg-type]
    flipped[7] ^= 0x80
    return bytes(flipped)


class Faults:
    """Reply hook applying ``corruption`` to the replies of ``nodes`` for ``action``, ``times`` times each."""

    def __init__(self) -> None:
        self.rules: list[tuple[str, set[int], Corruption, dict[int, int]]] = []
        self.instructions: list[Message] = []
        self.replies: list[Message] = []

    def add(self, action: str, nodes: set[int], corruption: Corruption, times: int = 10**9) -> Faults:
        self.rules.append((message_type(action), set(nodes), corruption, {n: times for n in nodes}))
        return self

    def __call__(self, instruction: Message, reply: Message) -> Message | None:
        self.instructions.append(instruction)
        self.replies.append(reply)
        node = instruction.metadata.dst_node_id
        for kind, nodes, corruption, left in self.rules:
            if instruction.metadata.message_type == kind and node in nodes and left[node] > 0:
                left[node] -= 1
                return corruption(instruction, reply)
        return reply

    def sent(self, action: str) -> list[Message]:
        return [m for m in self.instructions if m.metadata.message_type == message_type(action)]


def run_market(
    counts: dict[int, np.ndarray], faults: Faults, **overrides: object
) -> tuple[MarketOutcome, InProcessGrid]:
    grid = InProcessGrid(market_client_app(counts, CostBasedBid(COST, markup=MARKUP)), list(counts), reply_hook=faults)
    return MarketPhase(config(**overrides)).run(grid), grid


def true_sum(counts: dict[int, np.ndarray], nodes: list[int]) -> list[int]:
    return [int(c) for c in np.sum([counts[n] for n in nodes], axis=0)]


def expected_auction(counts: dict[int, np.ndarray], pass_nodes: list[int], bidders: list[int], budget: float = 60.0):
    """Winners and payments of the auction on the bidders' true scores and bids, ``E = len(pass_nodes)``."""
    total = np.sum([counts[n] for n in pass_nodes], axis=0)
    scores = [score(counts[n], total, len(pass_nodes)) for n in bidders]
    bids = [COST * float(counts[n].sum()) * (1 + MARKUP) for n in bidders]
    result = run_auction(scores, bids, budget)
    return [bidders[i] for i in result.winners], {
        n: min(float(result.payments[i]), budget) for i, n in enumerate(bidders)
    }


def assert_excluded(outcome: MarketOutcome, node: int, caplog, steps: tuple[str, ...]) -> None:
    """``node`` is excluded, its reason names one of ``steps``, and the exclusion was logged at WARNING."""
    assert node in outcome.excluded
    assert outcome.excluded[node].startswith(tuple(f"{step}:" for step in steps)), outcome.excluded[node]
    assert f"excluding node {node}" in caplog.text
    assert node not in outcome.participants and node not in outcome.winners


# --- PASS: a dropout at each round, recovered in one session -------------------------------------
@pytest.mark.parametrize("corruption", [drop, error_reply, without_record], ids=["timeout", "error", "no-record"])
@pytest.mark.parametrize("action", PASS_ROUNDS)
def test_a_dropout_at_each_pass_round_is_recovered_with_the_exact_sum_in_one_session(
    action: str, corruption: Corruption, caplog
) -> None:
    counts = make_counts(6, seed=1)
    nodes = sorted(counts)
    culprit = nodes[2]
    faults = Faults().add(action, {culprit}, corruption)

    with caplog.at_level(logging.WARNING, logger="flwr"):
        outcome, _ = run_market(counts, faults)

    sessions = {m.content.config_records[RECORD_KEY]["session"] for m in faults.sent(ACTION_ADVERTISE)}
    assert len(sessions) == 1 and len(faults.sent(ACTION_ADVERTISE)) == len(nodes), "PASS ran once"
    others = [n for n in nodes if n != culprit]
    assert_excluded(outcome, culprit, caplog, (action,))
    if action == ACTION_UNMASK:
        # It sent its masked input: its counts are in N_s (E = all six); its missing shares are not needed.
        assert outcome.pass_participants == nodes
        assert outcome.global_counts == true_sum(counts, nodes)
        pass_nodes = nodes
    else:
        assert outcome.pass_participants == others
        assert outcome.global_counts == true_sum(counts, others)
        pass_nodes = others
    assert outcome.participants == others
    winners, payments = expected_auction(counts, pass_nodes, others)
    assert outcome.winners == winners
    assert outcome.payments == pytest.approx(payments, rel=1e-12)
    assert outcome.within_budget


def test_a_mask_dropout_is_unmasked_from_its_neighbours_shares() -> None:
    counts = make_counts(6, seed=2)
    nodes = sorted(counts)
    culprit = nodes[4]
    faults = Faults().add(ACTION_MASK, {culprit}, drop)

    outcome, _ = run_market(counts, faults)

    unmask_requests = faults.sent(ACTION_UNMASK)
    assert {m.metadata.dst_node_id for m in unmask_requests} == set(nodes) - {culprit}
    record = unmask_requests[0].content.config_records[RECORD_KEY]
    dropped, survivors = bitmap_to_indices(record["dropped"]), bitmap_to_indices(record["survivors"])
    assert len(dropped) == 1 and len(survivors) == 5
    for reply in faults.replies:
        if reply.metadata.reply_to_message_id in {m.metadata.message_id for m in unmask_requests}:
            fields = reply.content.config_records[RECORD_KEY]
            assert list(fields["dropped_indices"]) == dropped  # each holds a share of its key
    assert outcome.global_counts == true_sum(counts, [n for n in nodes if n != culprit])


def test_share_requests_list_only_the_advertisers() -> None:
    counts = make_counts(6, seed=3)
    nodes = sorted(counts)
    faults = Faults().add(ACTION_ADVERTISE, {nodes[0]}, drop)

    outcome, _ = run_market(counts, faults)

    shares = faults.sent(ACTION_SHARE)
    assert {m.metadata.dst_node_id for m in shares} == set(nodes[1:])
    for share in shares:
        record = share.content.config_records[RECORD_KEY]
        assert len(bitmap_to_indices(record["participants"])) == 5
        assert nodes[0] not in record["neighbour_node_ids"]
    assert outcome.global_counts == true_sum(counts, nodes[1:])
    assert "no reply" in outcome.excluded[nodes[0]]


# --- PASS: too many dropouts, a clean MarketError ------------------------------------------------
TOO_MANY = {
    "advertise": (ACTION_ADVERTISE, 4, 2, r"PASS stopped: only 2 clients advertised valid keys"),
    "share": (ACTION_SHARE, 4, 2, r"PASS stopped: only 2 clients shared their keys"),
    "mask-below-three": (ACTION_MASK, 5, 3, r"PASS stopped: only 2 clients sent masked input"),
    "mask-below-threshold": (ACTION_MASK, 6, 3, r"PASS stopped: client \d+ keeps only 2 surviving neighbours"),
    "unmask-below-threshold": (ACTION_UNMASK, 6, 4, r"PASS stopped: only \d shares of the self-mask seed"),
}


def test_dropouts_at_mask_past_a_threshold_are_left_out_of_a_fresh_session_that_finishes(caplog) -> None:
    """The "mask-below-threshold" case with the default re-runs: the session stops before any unmask request,
    and a fresh one over the three nodes that answered releases their exact sum."""
    counts = make_counts(6, seed=4)
    nodes = sorted(counts)
    faults = Faults().add(ACTION_MASK, set(nodes[:3]), drop)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        outcome, _ = run_market(counts, faults)
    assert "running a fresh session without the 3 client(s) it named" in caplog.text
    assert [session.named for session in outcome.pass_sessions] == [nodes[:3], []]
    assert outcome.pass_participants == nodes[3:]
    assert outcome.global_counts == [int(c) for c in np.sum([counts[n] for n in nodes[3:]], axis=0)]
    assert len(faults.sent(ACTION_UNMASK)) == 3, "the unmask round of the second session only"


@pytest.mark.parametrize("action, num_nodes, leaving, match", TOO_MANY.values(), ids=TOO_MANY.keys())
def test_too_many_dropouts_at_a_pass_round_are_a_clear_error(
    action: str, num_nodes: int, leaving: int, match: str, caplog
) -> None:
    counts = make_counts(num_nodes, seed=4)
    nodes = sorted(counts)
    faults = Faults().add(action, set(nodes[:leaving]), drop)

    with caplog.at_level(logging.WARNING, logger="flwr"), pytest.raises(MarketError, match=match):
        run_market(counts, faults, pass_reruns=0)  # one session: a re-run is tested below

    assert "Market: aborted" in caplog.text
    assert not faults.sent(ACTION_BID), "no sum, no bid"
    awards = faults.sent(ACTION_AWARD)  # every contacted node is told the market closed
    assert {m.metadata.dst_node_id for m in awards} == set(nodes)
    assert all(KEY_AWARD not in m.content.config_records[RECORD_KEY] for m in awards)  # closed, no award
    if action == ACTION_MASK:
        assert not faults.sent(ACTION_UNMASK), "the session stops before any share is requested"


@pytest.mark.parametrize("action", [ACTION_ADVERTISE, ACTION_MASK])
def test_a_round_nobody_answers_says_so(action: str, caplog) -> None:
    """Every node silent at a round (all timed out): the error says nobody answered and within how long, not that
    keys or inputs were bad; each node's own reason is still the timeout."""
    counts = make_counts(4, seed=6)
    faults = Faults().add(action, set(counts), drop)

    with caplog.at_level(logging.WARNING, logger="flwr"), pytest.raises(MarketError) as raised:
        run_market(counts, faults, timeout=0.3, timeout_per_node=0.05, wait_for_nodes_timeout=0.4)

    head = f"PASS stopped: no node answered {action} within 0.5 s (4 asked);"  # then the sessions' summary
    if action == ACTION_ADVERTISE:  # the market's first message: waited for as the nodes are, then said plainly
        start = "no node answered its first market message (market_advertise, 4 asked) within 0.9 s"
        assert str(raised.value).startswith(start) and "still installing the app's dependencies" in str(raised.value)
        assert "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1" in str(raised.value)
        head = f"; {head}"
    assert head in str(raised.value) and "no re-run: 0 client(s) would be left" in str(raised.value)
    assert caplog.text.count(f"{action}: no reply within 0.5 s") == 4
    assert not faults.sent(ACTION_BID)


def test_a_poisoned_masked_vector_is_refused_never_used() -> None:
    """A well-formed but false ``Y_e`` cannot be told from the truth; a sum out of its bounds is refused."""
    counts = make_counts(6, seed=5)
    faults = Faults().add(ACTION_MASK, {sorted(counts)[3]}, with_change("masked_counts", flip_top_bit))

    with pytest.raises(MarketError, match="exceeds count_bound"):
        run_market(counts, faults, count_bound=1000)
    assert not faults.sent(ACTION_BID)


# --- Malformed replies at each step --------------------------------------------------------------
KEY32 = b"\x01" * 32
MALFORMED = {
    # advertise
    "advertise/short-key": (ACTION_ADVERTISE, with_field("cipher_public_key", b"\x01" * 31)),
    "advertise/str-key": (ACTION_ADVERTISE, with_field("mask_public_key", "not bytes")),
    "advertise/missing-key": (ACTION_ADVERTISE, with_field("mask_public_key", None)),
    "advertise/low-order-key": (ACTION_ADVERTISE, with_field("cipher_public_key", bytes(32))),
    "advertise/same-keys": (
        ACTION_ADVERTISE,
        lambda i, r: with_field("mask_public_key", r.content.config_records[RECORD_KEY]["cipher_public_key"])(i, r),
    ),
    "advertise/list-signature": (ACTION_ADVERTISE, with_field("signature", [1, 2])),
    # share
    "share/missing-ciphertexts": (ACTION_SHARE, with_field("ciphertexts", None)),
    "share/short-ciphertext": (ACTION_SHARE, with_change("ciphertexts", lambda c: [x[:-1] for x in c])),  # type: ignore[attr-defined]
    "share/one-too-few": (ACTION_SHARE, with_change("ciphertexts", lambda c: list(c)[:-1])),  # type: ignore[call-overload]
    "share/wrong-receivers": (ACTION_SHARE, with_change("receivers", lambda r: list(reversed(r)))),  # type: ignore[call-overload]
    "share/str-receivers": (ACTION_SHARE, with_field("receivers", "all")),
    # mask
    "mask/short": (ACTION_MASK, with_field("masked_counts", b"\x00" * (8 * NUM_CLASSES - 8))),
    "mask/long": (ACTION_MASK, with_field("masked_counts", b"\x00" * (8 * NUM_CLASSES + 8))),
    "mask/int-list": (ACTION_MASK, with_field("masked_counts", [1] * NUM_CLASSES)),
    "mask/short-commitment": (ACTION_MASK, with_field("counts_commitment", b"\x00" * 31)),
    "mask/missing-commitment": (ACTION_MASK, with_field("counts_commitment", None)),
    # unmask
    "unmask/short-share": (ACTION_UNMASK, with_change("survivor_shares", lambda s: [x[:-1] for x in s])),  # type: ignore[attr-defined]
    "unmask/stranger": (ACTION_UNMASK, with_change("survivor_indices", lambda s: [*list(s)[:-1], 999])),  # type: ignore[call-overload]
    "unmask/duplicate": (ACTION_UNMASK, with_change("survivor_indices", lambda s: [s[0]] * len(s))),  # type: ignore[index]
    "unmask/uneven": (ACTION_UNMASK, with_change("survivor_shares", lambda s: list(s)[:-1])),  # type: ignore[call-overload]
    "unmask/missing": (ACTION_UNMASK, with_field("dropped_shares", None)),
}


@pytest.mark.parametrize("action, corruption", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_pass_reply_excludes_the_node_and_keeps_the_sum_exact(
    action: str, corruption: Corruption, caplog
) -> None:
    counts = make_counts(6, seed=7)
    nodes = sorted(counts)
    culprit = nodes[1]

    with caplog.at_level(logging.WARNING, logger="flwr"):
        outcome, _ = run_market(counts, Faults().add(action, {culprit}, corruption))

    others = [n for n in nodes if n != culprit]
    assert outcome.excluded.keys() == {culprit}
    assert_excluded(outcome, culprit, caplog, (action, "PASS"))
    in_sum = nodes if action == ACTION_UNMASK else others  # an unmask culprit's counts are already in Y
    assert outcome.pass_participants == in_sum
    assert outcome.global_counts == true_sum(counts, in_sum)
    assert outcome.participants == others


def test_duplicate_public_keys_exclude_both_holders() -> None:
    counts = make_counts(6, seed=8)
    nodes = sorted(counts)
    stolen: dict[str, bytes] = {}

    def copy_key(instruction: Message, reply: Message) -> Message:
        """The first of the two to answer keeps its key, the second sends the same one (any delivery order)."""
        key = reply.content.config_records[RECORD_KEY]["mask_public_key"]
        if "key" not in stolen:
            stolen["key"] = key  # type: ignore[assignment]
            return reply
        return with_field("mask_public_key", stolen["key"])(instruction, reply)

    grid = InProcessGrid(market_client_app(counts, CostBasedBid(COST)), nodes)
    grid.reply_hook = Faults().add(ACTION_ADVERTISE, {nodes[0], nodes[1]}, copy_key)
    outcome = MarketPhase(config()).run(grid)

    assert {nodes[0], nodes[1]} == outcome.excluded.keys()
    assert all("reuses a public key" in outcome.excluded[node] for node in nodes[:2])
    assert outcome.global_counts == true_sum(counts, nodes[2:])


MALFORMED_BIDS = {
    "timeout": drop,
    "error": error_reply,
    "no-record": without_record,
    "nan-bid": with_field("bid", float("nan")),
    "inf-bid": with_field("bid", float("inf")),
    "zero-bid": with_field("bid", 0.0),
    "negative-bid": with_field("bid", -3.0),
    "str-bid": with_field("bid", "12"),
    "missing-bid": with_field("bid", None),
    "nan-score": with_field("score", float("nan")),
    "negative-score": with_field("score", -1.0),
    "impossible-score": with_field("score", 1e12),
    "bool-score": with_field("score", True),
    "list-score": with_field("score", [1.0, 2.0]),
    "missing-score": with_field("score", None),
}


@pytest.mark.parametrize("corruption", MALFORMED_BIDS.values(), ids=MALFORMED_BIDS.keys())
def test_malformed_score_or_bid_leaves_the_node_out_of_the_auction(corruption: Corruption, caplog) -> None:
    counts = make_counts(6, seed=10)
    nodes = sorted(counts)
    culprit = nodes[4]

    with caplog.at_level(logging.WARNING, logger="flwr"):
        outcome, grid = run_market(counts, Faults().add(ACTION_BID, {culprit}, corruption))

    others = [n for n in nodes if n != culprit]
    assert outcome.excluded.keys() == {culprit}
    assert_excluded(outcome, culprit, caplog, (ACTION_BID,))
    assert outcome.participants == others
    assert outcome.pass_participants == nodes, "its counts are still in N_s"
    assert outcome.global_counts == true_sum(counts, nodes)
    assert culprit not in outcome.payments
    # The auction ran on the others' true scores and bids, with E = all PASS participants.
    winners, payments = expected_auction(counts, nodes, others)
    assert outcome.winners == winners
    assert outcome.payments == pytest.approx(payments, rel=1e-12)
    awards = {m.metadata.dst_node_id: m for m in grid.sent if m.metadata.message_type == message_type(ACTION_AWARD)}
    assert sorted(awards) == nodes  # the culprit too: its PASS state must be wiped
    final = Award.decode(awards[culprit].content.config_records[RECORD_KEY][KEY_AWARD])  # type: ignore[arg-type]
    assert final.bidder(culprit) is None and culprit not in final.winners


def test_most_pass_participants_failing_the_bid_step_is_a_clear_error() -> None:
    counts = make_counts(5, seed=12)
    failing = set(sorted(counts)[:3])
    with pytest.raises(MarketError, match="thin market: only 2 of the 5 invited nodes are left as bidders"):
        run_market(counts, Faults().add(ACTION_BID, failing, error_reply))


def test_half_the_pass_participants_failing_the_bid_step_is_survived() -> None:
    counts = make_counts(6, seed=12)
    nodes = sorted(counts)
    outcome, _ = run_market(counts, Faults().add(ACTION_BID, set(nodes[:3]), drop))
    assert outcome.participants == nodes[3:]
    winners, _ = expected_auction(counts, nodes, nodes[3:])
    assert outcome.winners == winners


MALFORMED_AUDITS = {
    "timeout": drop,
    "error": error_reply,
    "no-record": without_record,
    "other-counts": with_change(KEY_COUNTS, lambda c: [int(x) + 1 for x in c]),  # type: ignore[attr-defined]
    "other-nonce": with_field(KEY_NONCE, bytes(32)),
    "short-counts": with_change(KEY_COUNTS, lambda c: list(c)[:-1]),  # type: ignore[call-overload]
    "negative-counts": with_change(KEY_COUNTS, lambda c: [-1] * len(c)),  # type: ignore[arg-type]
    "str-nonce": with_field(KEY_NONCE, "nonce"),
    "missing-counts": with_field(KEY_COUNTS, None),
    "missing-nonce": with_field(KEY_NONCE, None),
}


@pytest.mark.parametrize("corruption", MALFORMED_AUDITS.values(), ids=MALFORMED_AUDITS.keys())
def test_a_winner_failing_its_audit_is_excluded_unpaid_and_the_award_stands(corruption: Corruption, caplog) -> None:
    """The award is never re-issued: the culprit is neither trained nor paid, every other winner keeps its payment
    under the one award, and no other bidder is promoted (and so opened)."""
    counts = make_counts(6, seed=13)
    nodes = sorted(counts)
    first_winners, first_payments = expected_auction(counts, nodes, nodes)
    culprit = first_winners[0]

    with caplog.at_level(logging.WARNING, logger="flwr"):
        faults = Faults().add(ACTION_AUDIT, {culprit}, corruption)
        outcome, _ = run_market(counts, faults)

    assert outcome.excluded.keys() == {culprit}
    assert_excluded(outcome, culprit, caplog, (ACTION_AUDIT,))
    assert outcome.pass_participants == nodes and outcome.global_counts == true_sum(counts, nodes)
    holders = [node for node in first_winners if node != culprit]
    assert outcome.winners == holders and sorted(outcome.audited) == sorted(holders)
    kept = {node: payment for node, payment in first_payments.items() if node != culprit}
    assert outcome.payments == pytest.approx(kept, rel=1e-12) and culprit not in outcome.payments
    assert {m.metadata.dst_node_id for m in faults.sent(ACTION_AUDIT)} == set(
        first_winners
    )  # audited once, no one else
    assert len(faults.sent(ACTION_ENDORSE)) == len(nodes)  # one award, endorsed once


def test_a_false_score_is_caught_by_the_audit() -> None:
    """A client that inflates its score (within the possible) wins the auction, fails its audit: not paid."""
    counts = make_counts(6, seed=14)
    nodes = sorted(counts)
    liar = nodes[0]
    total = np.sum(list(counts.values()), axis=0)
    inflated = 0.99 * score(total, total, len(nodes))
    faults = Faults()  # records what was sent; the liar stands by its score (it endorses the award that lists it)
    grid = InProcessGrid(
        lying_client_app(counts, liar, inflated, CostBasedBid(COST, markup=MARKUP)), list(counts), reply_hook=faults
    )
    outcome = MarketPhase(config()).run(grid)

    assert liar in [m.metadata.dst_node_id for m in faults.sent(ACTION_AUDIT)]
    assert "claimed score" in outcome.excluded[liar]
    assert liar not in outcome.winners and outcome.payments.get(liar, 0.0) == 0.0
    assert outcome.total_payment <= 60.0


@pytest.mark.parametrize("corruption", [drop, error_reply], ids=["timeout", "error"])
def test_unanswered_awards_are_logged_not_fatal(corruption: Corruption, caplog) -> None:
    counts = make_counts(5, seed=11)
    culprit = sorted(counts)[0]

    with caplog.at_level(logging.WARNING, logger="flwr"):
        outcome, _ = run_market(counts, Faults().add(ACTION_AWARD, {culprit}, corruption))

    assert outcome.award_acknowledged == sorted(counts)[1:]
    assert outcome.excluded == {}
    assert f"node {culprit} did not acknowledge its award" in caplog.text


def test_client_without_data_is_excluded_from_the_auction_only() -> None:
    counts = make_counts(5, seed=13)
    empty = sorted(counts)[2]
    counts[empty] = np.zeros(NUM_CLASSES, dtype=np.int64)

    outcome, _ = run_market(counts, Faults())

    assert empty in outcome.pass_participants
    assert empty not in outcome.participants
    assert outcome.excluded[empty].startswith(f"{ACTION_BID}: error reply")
    assert outcome.excluded[empty].endswith(f"flmarket: {ACTION_BID}: request refused")  # generic
    assert outcome.global_counts == true_sum(counts, sorted(counts))


def test_client_with_wrong_number_of_classes_is_excluded_at_advertise() -> None:
    counts = make_counts(5, seed=14)
    odd = sorted(counts)[0]
    counts[odd] = np.ones(NUM_CLASSES + 1, dtype=np.int64)

    outcome, _ = run_market(counts, Faults())

    assert outcome.excluded[odd].startswith(ACTION_ADVERTISE)
    assert outcome.excluded[odd].endswith(f"flmarket: {ACTION_ADVERTISE}: request refused")  # generic
    assert outcome.global_counts == true_sum(counts, sorted(counts)[1:])


def test_stray_and_duplicate_replies_are_ignored(caplog) -> None:
    counts = make_counts(5, seed=15)
    nodes = sorted(counts)

    class NoisyGrid(InProcessGrid):
        def pull_messages(self, message_ids):  # type: ignore[no-untyped-def]
            replies = super().pull_messages(message_ids)
            if not replies:
                return replies
            duplicate = replies[0]
            stray = Message(duplicate.content, reply_to=duplicate)  # replies to a reply: unknown id
            return [*replies, duplicate, stray]

    grid = NoisyGrid(market_client_app(counts, CostBasedBid(0.05)), nodes)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        outcome = MarketPhase(config()).run(grid)

    assert outcome.excluded == {}
    assert outcome.global_counts == true_sum(counts, nodes)
    assert "second reply" in caplog.text
    assert "unknown message" in caplog.text
