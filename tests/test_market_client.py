"""Client handlers: PASS v2 state in ``context.state``, one session per run, scoring, bidding, audits,
awards, generic refusals, and what the server can see."""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Any
from uuid import uuid4

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity

from flmarket_flwr.market import (
    CostBasedBid,
    MarketConfig,
    MarketPhase,
    NoBidError,
    SimulatedCostBid,
    read_award,
    register_market_handlers,
    simulated_cost_per_sample,
)
from flmarket_flwr.market.node.node_config import NodeSettings, read_node_settings
from flmarket_flwr.market.wire.award import AwardTerms, BidsTree, SignedAward, build_award, sign_award
from flmarket_flwr.market.wire.messages import (
    ACTION_ADVERTISE,
    ACTION_AUDIT,
    ACTION_AWARD,
    ACTION_BID,
    ACTION_ENDORSE,
    ACTION_MASK,
    ACTION_SHARE,
    ACTION_UNMASK,
    ACTIONS,
    ERROR_PREFIX,
    KEY_ACCEPTED,
    KEY_AWARD,
    KEY_AWARD_DIGEST,
    KEY_AWARD_SIGNATURE,
    KEY_BID,
    KEY_BID_PROOF,
    KEY_BUDGET,
    KEY_BUYER_KEY,
    KEY_COHORT_CAP,
    KEY_COUNTS,
    KEY_GLOBAL_COUNTS,
    KEY_NONCE,
    KEY_NUM_CLIENTS,
    KEY_SCORE,
    KEY_SESSION,
    KEY_TRANSCRIPT,
    RECORD_KEY,
    message_type,
)
from flmarket_flwr.pass_protocol import PassServer, SkellamNoise, counts_commitment
from flmarket_flwr.pass_protocol.messages import MaskedInput
from flmarket_flwr.pricing import score
from simulations.inprocess_grid import InProcessGrid, market_client_app

C = 5
SESSION = b"flmarket/test-session"
BOUND = 100
BUDGET = 1e6
SECRET_KEYS = ("pass/cipher_private_key", "pass/mask_private_key", "pass/self_seed", "pass/held_shares")


@pytest.fixture(autouse=True)
def _server_identity() -> None:
    TaskIdentity.task_id = 1
    TaskIdentity.run_id = 1
    TaskIdentity.node_id = SUPERLINK_NODE_ID


class Node:
    """One client: a ClientApp and a Context, called the way Flower's runtimes call them."""

    def __init__(
        self, counts, bid_policy=None, node_id: int = 7, node_config=None, audit: bool = True, noise=None
    ) -> None:
        self.counts = np.asarray(counts)
        self.app = ClientApp()
        register_market_handlers(
            self.app,
            lambda context: self.counts,
            bid_policy,
            settings=lambda context: replace(read_node_settings(context), audit=audit, noise=noise),
        )
        self.context = Context(1, node_id, dict(node_config or {"partition-id": 3}), RecordDict(), {})

    def call(self, action: str, **fields: object) -> Message:
        message = Message(
            RecordDict({RECORD_KEY: ConfigRecord(fields)}),  # type: ignore[arg-type]
            dst_node_id=self.context.node_id,
            message_type=message_type(action),
        )
        message.metadata.__dict__["_message_id"] = str(uuid4())
        reply = self.app(message, self.context)
        assert reply.metadata.reply_to_message_id == message.metadata.message_id
        return reply

    def state(self) -> ConfigRecord:
        return self.context.state.config_records[RECORD_KEY]

    def secrets(self) -> list[bytes]:
        state = self.state()
        found: list[bytes] = []
        for key in SECRET_KEYS:
            value = state.get(key)
            found.extend(value if isinstance(value, list) else [value] if isinstance(value, bytes) else [])
        return found


def record(reply: Message) -> ConfigRecord:
    assert not reply.has_error(), reply.error.reason
    return reply.content.config_records[RECORD_KEY]


def refused(reply: Message, action: str) -> str:
    """The reply is the generic refusal of ``action``, with no detail."""
    assert reply.has_error()
    assert reply.error.reason == f"{ERROR_PREFIX}{action}: request refused"
    return reply.error.reason


class Session:
    """A PassServer driving the Nodes' handlers through the four PASS rounds."""

    def __init__(self, nodes: list[Node], session: bytes = SESSION, count_bound: int = BOUND) -> None:
        self.nodes = {node.context.node_id: node for node in nodes}
        self.server = PassServer(session, C, count_bound, run_id=1)  # the Nodes' run
        self.requests = self.server.advertise_requests(list(self.nodes))
        self.masked: dict[int, dict] = {}
        self.buyer = Ed25519PrivateKey.generate()
        self.terms = AwardTerms(BUDGET, 0, self.buyer.public_key().public_bytes_raw())
        self.trees: dict[bytes, BidsTree] = {}

    def node(self, index: int) -> Node:
        return self.nodes[self.server.node_of[index]]

    def round(self, action: str, requests: dict, drop: tuple[int, ...] = ()) -> dict[int, dict]:
        terms = self.terms_fields() if action == ACTION_ADVERTISE else {}
        return {
            index: dict(record(self.node(index).call(action, **request.to_record(), **terms)).items())
            for index, request in requests.items()
            if self.server.node_of[index] not in drop
        }

    def terms_fields(self) -> dict[str, object]:
        terms = self.terms
        return {KEY_BUDGET: terms.budget, KEY_COHORT_CAP: terms.cohort_cap, KEY_BUYER_KEY: terms.buyer_key}

    def sign(self, bids: dict[int, tuple[float, float]], key: Ed25519PrivateKey | None = None) -> SignedAward:
        """The buyer's signed award of the auction over ``bids`` (``key``: sign with another key, same terms), over
        the session's survivors once PASS has run (before that, over the bidders)."""
        if self.server.transcript:
            survivors = sorted((index, self.server.node_of[index]) for index in self.server.survivors)
        else:
            survivors = list(enumerate(sorted(bids), start=1))
        award, tree = build_award(1, self.server.session, self.server.transcript or b"-", self.terms, survivors, bids)
        signed = sign_award(award, self.buyer) if key is None else SignedAward(award.encode(), key.sign(award.encode()))
        self.trees[signed.digest] = tree
        return signed

    def award_fields(self, signed: SignedAward, node: Node | None = None, **changes: object) -> dict[str, object]:
        """The award's fields; with ``node``, its path in the award's bids tree (the endorse step)."""
        fields: dict[str, object] = {
            KEY_SESSION: self.server.session,
            KEY_AWARD: signed.encoded,
            KEY_AWARD_SIGNATURE: signed.signature,
        }
        if node is not None:
            fields[KEY_BID_PROOF] = self.trees[signed.digest].proof(node.context.node_id)
        fields.update(changes)
        return {k: v for k, v in fields.items() if v is not None}

    def run(self, drop_at_mask: tuple[int, ...] = ()) -> np.ndarray:
        server = self.server
        requests = server.receive_advertisements(self.round(ACTION_ADVERTISE, self.requests))
        requests = server.receive_shares(self.round(ACTION_SHARE, requests))
        self.masked = self.round(ACTION_MASK, requests, drop=drop_at_mask)
        requests = server.receive_masked(self.masked)
        server.receive_unmask(self.round(ACTION_UNMASK, requests))
        return server.finish()

    def bid_fields(self, node: Node | None = None, **changes: object) -> dict[str, object]:
        fields: dict[str, object] = {
            KEY_SESSION: self.server.session,
            KEY_GLOBAL_COUNTS: [int(c) for c in self.total],
            KEY_NUM_CLIENTS: len(self.server.survivors),
            KEY_TRANSCRIPT: self.server.transcript,
        }
        fields.update(changes)
        return {k: v for k, v in fields.items() if v is not None}

    @property
    def total(self) -> np.ndarray:
        return sum(self.nodes[self.server.node_of[u]].counts for u in self.server.survivors)


def three_nodes(**kwargs: object) -> list[Node]:
    counts = ([1, 2, 3, 4, 5], [10, 0, 7, 1, 2], [0, 9, 9, 9, 1])
    return [Node(c, node_id=7 + i, **kwargs) for i, c in enumerate(counts)]  # type: ignore[arg-type]


def completed(**kwargs: object) -> tuple[Session, list[Node]]:
    nodes = three_nodes(**kwargs)
    session = Session(nodes)
    session.run()
    return session, nodes


# --- PASS ----------------------------------------------------------------------------------------
def test_advertise_keeps_the_private_keys_in_state_and_replies_public_keys_only() -> None:
    node = Node([3, 1, 4, 1, 5])
    server = PassServer(SESSION, C, BOUND)
    request = server.advertise_requests([7, 8, 9])[1]
    reply = record(node.call(ACTION_ADVERTISE, **request.to_record()))

    assert set(reply.keys()) == {"cipher_public_key", "mask_public_key", "signature", "cipher_key_proof"}
    assert reply["signature"] == b""
    for kind in ("cipher", "mask"):
        private = X25519PrivateKey.from_private_bytes(node.state()[f"pass/{kind}_private_key"])  # type: ignore[arg-type]
        assert private.public_key().public_bytes_raw() == reply[f"{kind}_public_key"]
    assert node.state()["pass/session"] == SESSION


def test_a_session_through_the_handlers_unmasks_to_the_exact_sum() -> None:
    nodes = three_nodes()
    session = Session(nodes)

    total = session.run()

    np.testing.assert_array_equal(total, sum(node.counts for node in nodes))
    for index, reply in session.masked.items():
        masked = np.frombuffer(MaskedInput.from_record(reply).masked_counts, dtype="<u8")
        assert not np.array_equal(masked, session.node(index).counts)
    for node in nodes:
        assert node.state()["pass/transcript"] == session.server.transcript
        assert node.state()["pass/survivor_count"] == 3


def test_a_dropout_after_sharing_is_recovered_in_the_same_session() -> None:
    nodes = [Node(np.arange(C) + i, node_id=20 + i) for i in range(5)]
    session = Session(nodes)

    total = session.run(drop_at_mask=(22,))

    assert session.server.dropped == [session.server.index_of[22]]
    np.testing.assert_array_equal(total, sum(n.counts for n in nodes if n.context.node_id != 22))


def test_private_keys_and_self_mask_are_wiped_once_masked() -> None:
    _, nodes = completed()
    for node in nodes:
        assert node.secrets() == []
        assert isinstance(node.state()["pass/nonce"], bytes)


def test_only_plain_values_live_in_the_client_state() -> None:
    """Each message may run in a fresh process: the state is a ConfigRecord of plain values after every round."""
    nodes = three_nodes()
    session = Session(nodes)
    server = session.server
    requests: dict = session.requests
    for action, receive in (
        (ACTION_ADVERTISE, server.receive_advertisements),
        (ACTION_SHARE, server.receive_shares),
        (ACTION_MASK, server.receive_masked),
        (ACTION_UNMASK, server.receive_unmask),
    ):
        requests = receive(session.round(action, requests))
        for node in nodes:
            for key, value in node.state().items():
                assert isinstance(value, (bytes, int, float, bool, str)) or (
                    isinstance(value, list) and all(isinstance(v, (bytes, int)) for v in value)
                ), (action, key)
    np.testing.assert_array_equal(server.finish(), sum(node.counts for node in nodes))


def test_each_pass_step_is_answered_once_and_a_refusal_closes_the_session(caplog) -> None:
    nodes = three_nodes()
    session = Session(nodes)
    share_requests = session.server.receive_advertisements(session.round(ACTION_ADVERTISE, session.requests))
    node = session.node(1)

    with caplog.at_level(logging.WARNING, logger="flwr"):
        refused(node.call(ACTION_ADVERTISE, **session.requests[1].to_record()), ACTION_ADVERTISE)
    assert "already advertised" in caplog.text  # the detail stays in the client's log
    assert node.secrets() == []  # the refusal wiped the session's keys
    refused(node.call(ACTION_SHARE, **share_requests[1].to_record()), ACTION_SHARE)
    record(session.node(2).call(ACTION_SHARE, **share_requests[2].to_record()))  # the others go on


def test_a_second_session_is_refused() -> None:
    """One PASS session per run: the server never gets two sums to difference."""
    _, nodes = completed()
    again = Session(nodes, session=b"flmarket/another-session")
    for index, request in again.requests.items():
        refused(again.node(index).call(ACTION_ADVERTISE, **request.to_record()), ACTION_ADVERTISE)


def test_steps_out_of_order_are_refused() -> None:
    nodes = three_nodes()
    refused(nodes[0].call(ACTION_MASK, senders=[], ciphertexts=[]), ACTION_MASK)
    refused(nodes[1].call(ACTION_UNMASK, survivors=[1, 2, 3], dropped=[]), ACTION_UNMASK)
    refused(nodes[2].call(ACTION_BID, **{KEY_SESSION: SESSION}), ACTION_BID)
    assert all(node.secrets() == [] for node in nodes)


@pytest.mark.parametrize(
    "change",
    [
        {"session": b""},
        {"num_classes": 0},
        {"count_bound": 0},
        {"graph_commitment": b"short"},
        {"index": 0},
        {"index": "1"},
        {"session": "text"},
    ],
)
def test_malformed_advertise_requests_are_refused(change: dict[str, object]) -> None:
    request = PassServer(SESSION, C, BOUND).advertise_requests([7, 8, 9])[1].to_record()
    request.update(change)
    refused(Node([1, 2, 3, 4, 5]).call(ACTION_ADVERTISE, **request), ACTION_ADVERTISE)


def test_a_request_without_the_market_record_is_refused() -> None:
    node = Node([1, 2, 3, 4, 5])
    message = Message(
        RecordDict({"other": ConfigRecord({"x": 1})}), dst_node_id=7, message_type=message_type(ACTION_ADVERTISE)
    )
    message.metadata.__dict__["_message_id"] = str(uuid4())
    refused(node.app(message, node.context), ACTION_ADVERTISE)


def test_label_counts_of_the_wrong_length_are_refused(caplog) -> None:
    node = Node([1, 2, 3])
    request = PassServer(SESSION, C, BOUND).advertise_requests([7, 8, 9])[1]
    with caplog.at_level(logging.WARNING, logger="flwr"):
        refused(node.call(ACTION_ADVERTISE, **request.to_record()), ACTION_ADVERTISE)
    assert "3 classes, the session has 5" in caplog.text


def test_counts_above_the_declared_bound_are_refused(caplog) -> None:
    node = Node([1, 2, 300, 4, 5])
    request = PassServer(SESSION, C, BOUND).advertise_requests([7, 8, 9])[1]
    with caplog.at_level(logging.WARNING, logger="flwr"):
        refused(node.call(ACTION_ADVERTISE, **request.to_record()), ACTION_ADVERTISE)
    assert "exceeds the declared count_bound" in caplog.text


@pytest.mark.parametrize("counts", [[1, -2, 3, 4, 5], [1.5, 2, 3, 4, 5], [[1, 2, 3, 4, 5]]])
def test_invalid_label_counts_are_refused(counts: object) -> None:
    request = PassServer(SESSION, C, BOUND).advertise_requests([7, 8, 9])[1]
    refused(Node(counts).call(ACTION_ADVERTISE, **request.to_record()), ACTION_ADVERTISE)


# --- Score and bid -------------------------------------------------------------------------------
def test_bid_handler_scores_locally_against_the_session_and_applies_the_policy() -> None:
    session, nodes = completed(bid_policy=CostBasedBid(0.5, markup=0.1))
    node = nodes[0]

    reply = record(node.call(ACTION_BID, **session.bid_fields()))

    assert reply[KEY_SCORE] == score(node.counts, session.total, 3)
    assert reply[KEY_BID] == pytest.approx(0.5 * 15 * 1.1)
    assert node.state()[KEY_SCORE] == reply[KEY_SCORE]
    refused(node.call(ACTION_BID, **session.bid_fields()), ACTION_BID)  # bids once


def test_a_client_without_data_cannot_bid(caplog) -> None:
    nodes = three_nodes()
    nodes[0].counts = np.zeros(C, dtype=np.int64)
    session = Session(nodes)
    session.run()
    with caplog.at_level(logging.WARNING, logger="flwr"):
        refused(nodes[0].call(ACTION_BID, **session.bid_fields()), ACTION_BID)
    assert "no data" in caplog.text


@pytest.mark.parametrize("bad_bid", [float("nan"), 0.0, -1.0, math.inf, "1.0", None])
def test_a_bid_policy_returning_an_invalid_bid_gives_an_error_reply(bad_bid: object) -> None:
    session, nodes = completed(bid_policy=lambda counts, s, context: bad_bid)
    refused(nodes[0].call(ACTION_BID, **session.bid_fields()), ACTION_BID)


BAD_BID_REQUESTS = {
    "counts-below-own": {KEY_GLOBAL_COUNTS: [1, 1, 1, 1, 1]},
    "wrong-classes": {KEY_GLOBAL_COUNTS: [50, 50, 50, 50]},
    "above-bound": {KEY_GLOBAL_COUNTS: [50, 50, 50, 50, 3 * BOUND + 1]},
    "negative": {KEY_GLOBAL_COUNTS: [50, 50, -1, 50, 50]},
    "wrong-E": {KEY_NUM_CLIENTS: 4},
    "zero-E": {KEY_NUM_CLIENTS: 0},
    "wrong-transcript": {KEY_TRANSCRIPT: bytes(32)},
    "wrong-session": {KEY_SESSION: b"flmarket/other"},
    "no-session": {KEY_SESSION: None},
    "no-counts": {KEY_GLOBAL_COUNTS: None},
    "no-E": {KEY_NUM_CLIENTS: None},
    "no-transcript": {KEY_TRANSCRIPT: None},
}


@pytest.mark.parametrize("change", BAD_BID_REQUESTS.values(), ids=BAD_BID_REQUESTS.keys())
def test_bid_requests_not_bound_to_the_session_are_refused_and_close_the_bid(change: dict[str, object]) -> None:
    session, nodes = completed()
    refused(nodes[0].call(ACTION_BID, **session.bid_fields(**change)), ACTION_BID)
    refused(nodes[0].call(ACTION_BID, **session.bid_fields()), ACTION_BID)  # answered once, even a refusal


class ZeroDraws(SkellamNoise):
    """The noise setting of epsilon 1 whose draws are all zero: the sum is exact, the client's checks are widened."""

    def sample(self, num_classes: int, roster_size: int) -> np.ndarray:
        return np.zeros(num_classes, dtype=np.int64)


TAIL = SkellamNoise(1.0).tail_bound()


@pytest.mark.parametrize(
    ("crafted", "accepted"),
    [
        ({0: 100 - TAIL}, True),  # below the client's own 100 by the noise's tail: a noisy N_s can be that low
        ({0: 100 - TAIL - 1}, False),
        ({4: 3 * BOUND + TAIL}, True),  # above count_bound * E by the tail
        ({4: 3 * BOUND + TAIL + 1}, False),
    ],
    ids=["below-own-by-the-tail", "below-own-beyond-it", "above-bound-by-the-tail", "above-bound-beyond-it"],
)
def test_with_noise_a_crafted_global_count_is_refused_beyond_the_noises_tail(
    crafted: dict[int, int], accepted: bool
) -> None:
    """A server's crafted ``N_s`` in the bid request: the client's checks are widened by the tail, no further."""
    counts = ([100, 2, 3, 4, 5], [10, 0, 7, 1, 2], [0, 9, 9, 9, 1])
    nodes = [Node(c, CostBasedBid(0.01), node_id=7 + i, noise=ZeroDraws(1.0)) for i, c in enumerate(counts)]
    session = Session(nodes)
    session.run()
    node = next(n for n in nodes if n.counts[0] == 100)
    global_counts = [int(c) for c in session.total]
    for klass, value in crafted.items():
        global_counts[klass] = value
    reply = node.call(ACTION_BID, **session.bid_fields(**{KEY_GLOBAL_COUNTS: global_counts}))
    if accepted:
        assert record(reply)[KEY_BID] > 0
    else:
        refused(reply, ACTION_BID)


def test_simulated_cost_bid_reads_the_partition_id(caplog) -> None:
    policy = SimulatedCostBid(seed=3, low=1.0, high=2.0, markup=0.0)
    session, nodes = completed(bid_policy=policy, node_config={"partition-id": 4})
    reply = record(nodes[0].call(ACTION_BID, **session.bid_fields()))
    assert reply[KEY_BID] == pytest.approx(simulated_cost_per_sample(4, seed=3, low=1.0, high=2.0) * 15)

    session, nodes = completed(bid_policy=policy, node_config={"other": 1})
    with caplog.at_level(logging.WARNING, logger="flwr"):
        refused(nodes[0].call(ACTION_BID, **session.bid_fields()), ACTION_BID)
    assert "partition-id" in caplog.text


# --- Audit ---------------------------------------------------------------------------------------
def awarded(**kwargs: object) -> tuple[Session, list[Node], SignedAward]:
    """Three nodes that took part in PASS, bid, and endorsed the buyer's signed award (all three win)."""
    session, nodes = completed(bid_policy=CostBasedBid(0.5, markup=0.0), **kwargs)
    bids = {}
    for node in nodes:
        reply = record(node.call(ACTION_BID, **session.bid_fields()))
        bids[node.context.node_id] = (float(reply[KEY_SCORE]), float(reply[KEY_BID]))  # type: ignore[arg-type]
    signed = session.sign(bids)
    for node in nodes:
        record(node.call(ACTION_ENDORSE, **session.award_fields(signed, node)))
    return session, nodes, signed


def test_a_winner_of_the_award_it_endorsed_opens_its_counts_commitment_once() -> None:
    session, nodes, signed = awarded()
    node = nodes[1]
    assert node.context.node_id in signed.verify(session.terms.buyer_key).winners

    reply = record(node.call(ACTION_AUDIT, **session.award_fields(signed)))

    assert reply[KEY_COUNTS] == [int(c) for c in node.counts]
    index = session.server.index_of[node.context.node_id]
    assert counts_commitment(SESSION, index, reply[KEY_COUNTS], reply[KEY_NONCE]) == session.server.commitments[index]
    refused(node.call(ACTION_AUDIT, **session.award_fields(signed)), ACTION_AUDIT)


@pytest.mark.parametrize("change", ["other-session", "no-award", "other-award", "other-signature"])
def test_audit_requests_off_the_endorsed_award_or_off_session_are_refused(change: str) -> None:
    session, nodes, signed = awarded()
    node = nodes[1]
    other = session.sign({node.context.node_id: (1.0, 1.0), nodes[0].context.node_id: (2.0, 1.0)})
    changes: dict[str, object] = {
        "other-session": {KEY_SESSION: b"flmarket/other"},
        "no-award": {KEY_AWARD: None},
        "other-award": {KEY_AWARD: other.encoded, KEY_AWARD_SIGNATURE: other.signature},
        "other-signature": {KEY_AWARD: other.encoded},
    }[change]  # type: ignore[assignment]
    refused(node.call(ACTION_AUDIT, **session.award_fields(signed, **changes)), ACTION_AUDIT)
    record(node.call(ACTION_AUDIT, **session.award_fields(signed)))  # a refusal does not close it


def test_a_client_that_does_not_open_its_counts_refuses_every_audit() -> None:
    session, nodes, signed = awarded(audit=False)
    refused(nodes[1].call(ACTION_AUDIT, **session.award_fields(signed)), ACTION_AUDIT)


def test_no_audit_before_a_bid() -> None:
    session, nodes = completed()
    signed = session.sign({node.context.node_id: (1.0, 1.0) for node in nodes})
    refused(nodes[0].call(ACTION_ENDORSE, **session.award_fields(signed, nodes[0])), ACTION_ENDORSE)
    refused(nodes[0].call(ACTION_AUDIT, **session.award_fields(signed)), ACTION_AUDIT)


# --- Award ---------------------------------------------------------------------------------------
def test_the_final_award_is_recorded_with_its_receipt_and_pass_state_wiped() -> None:
    session, nodes, signed = awarded()
    node = nodes[0]
    award = signed.verify(session.terms.buyer_key)

    reply = record(node.call(ACTION_AWARD, **session.award_fields(signed)))

    assert reply[KEY_ACCEPTED] is True
    kept = read_award(node.context)
    assert kept is not None and kept.won is True and kept.payment == award.payments[node.context.node_id] > 0
    assert (kept.award, kept.signature, kept.buyer_key) == (signed.encoded, signed.signature, session.terms.buyer_key)
    assert SignedAward(kept.award, kept.signature).verify(kept.buyer_key) == award
    assert {k for k in node.state() if k.startswith("pass/")} == {"pass/session", "pass/stage", "pass/unmask_requested"}


def test_an_endorser_may_be_sent_the_final_awards_digest_only_and_takes_the_award_it_holds() -> None:
    session, nodes, signed = awarded()
    other = session.sign({node.context.node_id: (1.0, 1.0) for node in nodes})
    by_digest = {KEY_SESSION: SESSION, KEY_AWARD_DIGEST: signed.digest, KEY_AWARD_SIGNATURE: signed.signature}
    wrong = {**by_digest, KEY_AWARD_DIGEST: other.digest}
    refused(nodes[1].call(ACTION_AWARD, **wrong), ACTION_AWARD)  # not the award it endorsed
    record(nodes[0].call(ACTION_AWARD, **by_digest))
    kept = read_award(nodes[0].context)
    assert kept is not None and kept.won is True and kept.award == signed.encoded
    never_endorsed = three_nodes()
    fresh = Session(never_endorsed)
    fresh.round(ACTION_ADVERTISE, fresh.requests)
    refused(never_endorsed[0].call(ACTION_AWARD, **by_digest), ACTION_AWARD)


def test_an_award_without_this_client_is_recorded_as_lost_and_wipes_the_keys() -> None:
    nodes = three_nodes()
    session = Session(nodes)
    session.round(ACTION_ADVERTISE, session.requests)  # advertised, never masked: keys still held
    node = nodes[0]
    assert read_award(node.context) is None and len(node.secrets()) == 2
    signed = session.sign({8: (1.0, 1.0), 9: (2.0, 1.0)})

    record(node.call(ACTION_AWARD, **session.award_fields(signed)))

    award = read_award(node.context)
    assert award is not None and award.won is False and award.payment == 0.0 and award.award == signed.encoded
    assert {k for k in node.state() if k.startswith("pass/")} == {"pass/session", "pass/stage"}
    refused(node.call(ACTION_ADVERTISE, **session.requests[1].to_record()), ACTION_ADVERTISE)


def test_a_closed_market_without_an_award_is_recorded_as_lost() -> None:
    nodes = three_nodes()
    session = Session(nodes)
    session.round(ACTION_ADVERTISE, session.requests)
    record(nodes[0].call(ACTION_AWARD, **{KEY_SESSION: SESSION}))
    award = read_award(nodes[0].context)
    assert award is not None and award.won is False and award.award is None
    assert nodes[0].secrets() == []


@pytest.mark.parametrize("change", ["garbage", "other-key", "unsigned", "other-session", "empty"])
def test_malformed_awards_give_error_replies_and_still_wipe_the_keys(change: str) -> None:
    nodes = three_nodes()
    session = Session(nodes)
    session.round(ACTION_ADVERTISE, session.requests)
    signed = session.sign({8: (1.0, 1.0), 9: (2.0, 1.0)})
    forged = session.sign({8: (1.0, 1.0), 9: (2.0, 1.0)}, key=Ed25519PrivateKey.generate())
    fields = {
        "garbage": session.award_fields(signed, **{KEY_AWARD: b"garbage"}),
        "other-key": session.award_fields(forged),
        "unsigned": session.award_fields(signed, **{KEY_AWARD_SIGNATURE: b""}),
        "other-session": session.award_fields(signed, **{KEY_SESSION: b"flmarket/other"}),
        "empty": {},
    }[change]
    refused(nodes[0].call(ACTION_AWARD, **fields), ACTION_AWARD)
    assert nodes[0].secrets() == []
    assert read_award(nodes[0].context) is None


def test_register_refuses_a_second_registration() -> None:
    app = ClientApp()
    register_market_handlers(app, lambda context: np.ones(C))
    with pytest.raises(ValueError, match="already registered"):
        register_market_handlers(app, lambda context: np.ones(C))


def test_node_settings_refuse_a_complete_graph_setting_that_is_not_a_bool() -> None:
    with pytest.raises(TypeError, match="complete_graph must be a bool"):
        NodeSettings(complete_graph="false")  # type: ignore[arg-type]


@pytest.mark.parametrize("floor", ["90", 90.0, True], ids=["str", "float", "bool"])
def test_node_settings_refuse_a_roster_floor_that_is_not_an_int(floor: object) -> None:
    with pytest.raises(TypeError, match="min_participants must be an int"):
        NodeSettings(min_participants=floor)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="split_tolerance must be an int"):
        NodeSettings(split_tolerance=floor)  # type: ignore[arg-type]


def test_numpy_integer_settings_are_taken_and_settings_that_cannot_be_built_are_refused_at_advertise() -> None:
    request = PassServer(SESSION, C, BOUND).advertise_requests([7, 8, 9])[1].to_record()
    settings_and_outcomes: tuple[tuple[dict[str, Any], bool], ...] = (
        ({"min_participants": np.int64(3), "split_tolerance": np.int64(1)}, True),
        ({"min_participants": True}, False),
        ({"split_tolerance": True}, False),
    )
    for settings, taken in settings_and_outcomes:
        node = Node([3, 1, 4, 1, 5])
        node.app = ClientApp()
        register_market_handlers(
            node.app, lambda context, node=node: node.counts, settings=lambda context, s=settings: NodeSettings(**s)
        )
        reply = node.call(ACTION_ADVERTISE, **request)
        if taken:
            assert not reply.has_error()
        else:
            refused(reply, ACTION_ADVERTISE)
            assert node.secrets() == []


# --- Bid policies --------------------------------------------------------------------------------
def test_cost_based_bid() -> None:
    context = Context(1, 1, {}, RecordDict(), {})
    assert CostBasedBid(2.0)(np.array([1, 2, 3]), 0.0, context) == pytest.approx(2.0 * 6 * 1.2)
    assert CostBasedBid(2.0, markup=0.0)(np.array([1, 2, 3]), 0.0, context) == 12.0
    with pytest.raises(NoBidError):
        CostBasedBid(1.0)(np.zeros(3, dtype=np.int64), 0.0, context)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            CostBasedBid(bad)
    with pytest.raises(ValueError):
        CostBasedBid(1.0, markup=-0.1)
    with pytest.raises(TypeError):
        CostBasedBid("1.0")  # type: ignore[arg-type]


def test_simulated_cost_per_sample_is_deterministic_heterogeneous_and_in_range() -> None:
    costs = [simulated_cost_per_sample(p, seed=1, low=0.5, high=1.5) for p in range(200)]
    assert costs == [simulated_cost_per_sample(p, seed=1, low=0.5, high=1.5) for p in range(200)]
    assert all(0.5 <= c < 1.5 for c in costs)
    assert len(set(costs)) == 200
    assert np.std(costs) > 0.2
    assert costs != [simulated_cost_per_sample(p, seed=2, low=0.5, high=1.5) for p in range(200)]
    assert simulated_cost_per_sample(3, seed=0, low=2.0, high=2.0) == 2.0
    with pytest.raises(ValueError):
        simulated_cost_per_sample(0, low=2.0, high=1.0)
    with pytest.raises(TypeError):
        simulated_cost_per_sample(1.5)  # type: ignore[arg-type]


# --- Privacy ---------------------------------------------------------------------------------------
def _encodings(counts: np.ndarray) -> list[bytes]:
    """Every plausible binary encoding of a label-count vector."""
    out = []
    for dtype in ("<u8", ">u8", "<i8", "<u4", "<i4", "<f8", "<f4", "<u2"):
        out.append(np.asarray(counts).astype(dtype).tobytes())
    return out


def _values(config: ConfigRecord) -> list[object]:
    values: list[object] = []
    for value in config.values():
        values.append(value)
        if isinstance(value, list):
            values.extend(value)
    return values


def find_leaks(grid: InProcessGrid, counts: dict[int, np.ndarray], secrets: list[bytes]) -> list[str]:
    """Search every reply the server received (but the audits), and every message it sent, for counts and secrets.

    The audit is where a winner opens its counts to the buyer on purpose: it is checked apart.
    """
    leaks = []
    audit = message_type(ACTION_AUDIT)
    audited_ids = {m.metadata.message_id for m in grid.sent if m.metadata.message_type == audit}
    replies = [
        (reply, raw)
        for reply, raw in zip(grid.received, grid.received_wire, strict=True)
        if reply.metadata.reply_to_message_id not in audited_ids
    ]
    received = b"".join(raw for _, raw in replies)
    sent = b"".join(message.content.deflate() for message in grid.sent) + b"".join(
        record.deflate() for message in grid.sent for record in message.content.config_records.values()
    )
    for where, wire in (("received", received), ("sent", sent)):
        for node, vector in counts.items():
            if any(encoded in wire for encoded in _encodings(vector)):
                leaks.append(f"{where}: label counts of node {node} (raw bytes)")
        for key in secrets:
            if key in wire or key.hex().encode() in wire:
                leaks.append(f"{where}: a private key (raw bytes)")
    count_lists = {tuple(int(c) for c in vector) for vector in counts.values()}
    for reply, _ in replies:
        if reply.has_error():
            continue
        for config in reply.content.config_records.values():
            for value in _values(config):
                if isinstance(value, bytes) and value in secrets:
                    leaks.append("received: a private key (value)")
                if isinstance(value, list) and tuple(value) in count_lists:
                    leaks.append("received: label counts (list value)")
                if isinstance(value, bytes) and len(value) % 8 == 0 and value:
                    words = tuple(int(w) for w in np.frombuffer(value, dtype="<u8"))
                    if words in count_lists:
                        leaks.append("received: label counts (uint64 bytes)")
        if reply.content.array_records or reply.content.metric_records:
            leaks.append("received: unexpected array or metric records")
    return leaks


def opened_counts(grid: InProcessGrid) -> dict[int, list[int]]:
    """Node -> the counts it opened in an audit reply."""
    node_of = {m.metadata.message_id: m.metadata.dst_node_id for m in grid.sent}
    audit = message_type(ACTION_AUDIT)
    kinds = {m.metadata.message_id: m.metadata.message_type for m in grid.sent}
    return {
        node_of[reply.metadata.reply_to_message_id]: list(reply.content.config_records[RECORD_KEY][KEY_COUNTS])
        for reply in grid.received
        if kinds[reply.metadata.reply_to_message_id] == audit and not reply.has_error()
    }


def run_recorded_market(app_factory):  # type: ignore[no-untyped-def]
    """Run a market where one client drops out before its masked input; harvest every secret of every client."""
    rng = np.random.default_rng(42)
    counts = {9000 + i: rng.integers(100, 10_000, size=10) for i in range(6)}
    secrets: list[bytes] = []
    dropped: list[int] = []

    def hook(instruction: Message, reply: Message) -> Message | None:
        kind = instruction.metadata.message_type
        if kind in (message_type(ACTION_ADVERTISE), message_type(ACTION_SHARE), message_type(ACTION_MASK)):
            # Right after each round, read the secrets the node holds in its local state.
            state = grid.context(instruction.metadata.dst_node_id).state.config_records[RECORD_KEY]
            for key in SECRET_KEYS:
                value = state.get(key)
                secrets.extend(value if isinstance(value, list) else [value] if isinstance(value, bytes) else [])
        if kind == message_type(ACTION_MASK) and not dropped:
            dropped.append(instruction.metadata.dst_node_id)
            return None
        return reply

    grid = InProcessGrid(app_factory(counts), list(counts), reply_hook=hook)
    outcome = MarketPhase(
        MarketConfig(budget=5000.0, num_classes=10, poll_interval=0.001, timeout=0.5, timeout_per_node=0.0)
    ).run(grid)
    assert outcome.pass_participants == sorted(n for n in counts if n not in dropped)
    assert len(set(secrets)) >= 3 * len(counts)
    return grid, counts, secrets, outcome


def test_no_message_reveals_label_counts_or_private_keys_but_a_winners_audit() -> None:
    grid, counts, secrets, outcome = run_recorded_market(lambda counts: market_client_app(counts, CostBasedBid(0.01)))
    assert len(grid.received) == len(grid.received_wire) >= 5 * len(counts) + 2  # 7 steps, one dropout
    assert find_leaks(grid, counts, secrets) == []
    opened = opened_counts(grid)
    assert outcome.winners and set(opened) == set(outcome.audited) == set(outcome.winners)
    for node, values in opened.items():
        assert values == [int(c) for c in counts[node]]


def test_the_leak_search_catches_a_leaky_client() -> None:
    """Negative control: a client that adds its counts and keys to its replies is caught."""

    def leaky_app(counts: dict[int, np.ndarray]) -> ClientApp:
        honest = market_client_app(counts, CostBasedBid(0.01))
        app = ClientApp()

        def leak(message: Message, context: Context) -> Message:
            reply = honest(message, context)
            state = context.state.config_records[RECORD_KEY]
            if reply.has_content() and message.metadata.message_type == message_type(ACTION_BID):
                reply.content.config_records[RECORD_KEY]["debug"] = counts[context.node_id].astype("<u8").tobytes()
            if reply.has_content() and message.metadata.message_type == message_type(ACTION_ADVERTISE):
                reply.content.config_records[RECORD_KEY]["debug-key"] = state["pass/mask_private_key"]
            return reply

        for action in ACTIONS:
            app.query(action)(leak)
        return app

    grid, counts, secrets, _ = run_recorded_market(leaky_app)
    leaks = find_leaks(grid, counts, secrets)
    assert any("label counts" in leak for leak in leaks)
    assert any("private key" in leak for leak in leaks)
