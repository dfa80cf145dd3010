"""The bytes of every market message, the buyer's requests and the nodes' replies, pinned in two deterministic
honest markets.

Every source of randomness (``os.urandom``, ``secrets.token_bytes``, X25519 key generation) is replaced by a
counter-seeded stream, the buyer's key is fixed, and the requests and the replies are hashed per message type in
the order the replies arrive: a refactoring of either side that changes one byte of one message changes a digest
here.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from adversary import make_counts
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from flwr.app import Message
from flwr.common.serde import recorddict_to_proto

from flmarket_flwr.market import CostBasedBid, MarketConfig, MarketPhase
from flmarket_flwr.pass_protocol import IdentityDirectory, save_identity_key
from simulations.inprocess_grid import InProcessGrid, market_client_app

SEMI_HONEST_DIGESTS = {
    "query.market_advertise": "798d32055321615d393f5c4b15d950368eb195b6934ca900fdcb08508c64ea72",
    "query.market_audit": "27ad7255da922edab3b42d4b64a790c8df06239af0d0afc671b4895836fd4511",
    "query.market_award": "34209e6b5dfad74fc201f55d91228cb2e1bb8a0f01c3924faaddcc7cd55fab3b",
    "query.market_bid": "ab7089df3a42be1515a7009a67fd4a8ffa7f6194ce8a86130993c5625a8b71d1",
    "query.market_endorse": "9286f28b51a619d69744108bf20afa95af13efdfe0ce844f454ddea393caa0fd",
    "query.market_mask": "48000a64b0a7d68db3e04ead5ba7ee27d235a3843d53f3934c1b543b7e7673f6",
    "query.market_share": "ebbeeb859c706894d5db489f6f87100213bfc477f999225572f41b2c07b13217",
    "query.market_unmask": "99a65bf39b9a1c16dc9bbd60604cdd1aedabd26a9abc8148d3147e33375ec429",
}
SEMI_HONEST_REQUEST_DIGESTS = {
    "query.market_advertise": "d4a81a6be125a06dbef113ce266e9d59dab7d484a831a0ff5b7b8702b94014d9",
    "query.market_audit": "b1455358c73dc99155bffccccc6dfa211db5f7d20eba509dee8ad56434401169",
    "query.market_award": "a9f948cb7699df6ae521a788fe8b77ce269876d04aa6fec7703299295ab5120d",
    "query.market_bid": "81675c961b85b7ce68c29f9f4077d48fff766f21560f3f2f28e516a132133280",
    "query.market_endorse": "028880e167918e24e602e8fa07f78e3613b43a1c837887ab317d4d264b54a98d",
    "query.market_mask": "73c57e1c95601cc71f79f8f139ea150069f278d6a38b9050cd8c8bd037e29776",
    "query.market_share": "c2fef94c831bac7c6235fc2e753014c2b8bfa89507820c7b628882faa0ade37d",
    "query.market_unmask": "8e1bda3177672aba9aee6e21a6c2852c990034074bbe3652a7264089d687afda",
}
SECURE_PROFILE_REQUEST_DIGESTS = {
    "query.market_advertise": "d4a81a6be125a06dbef113ce266e9d59dab7d484a831a0ff5b7b8702b94014d9",
    "query.market_audit": "babb7da696f49dcffef44782813f7a38ff81c906df3a6655987735cb675b4f39",
    "query.market_award": "47098bb43e718024299a37c2a73b9c6142f3a0a630deda7d3dc119ad6a886483",
    "query.market_bid": "3ddc44bbfb42eabda4e675c6507670bfcec3c6c284ddfd93abe082cdae7d920a",
    "query.market_endorse": "7949d84274728463d725795b5304d8db221688084cc85215d53a0971d7da3274",
    "query.market_mask": "f7de79681a8c7dea9dcc5903290a072b926f63fd2b771f0bf9ff63e8d3d83120",
    "query.market_share": "17cc8a6e75048b3a8ad7cd2260d96caa307d9183e576807c68e5a3832e1ceb71",
    "query.market_survivors": "59efdd992e90c47ba0b35bd46311964003bbf9856e6be2457843b6244f778ec0",
    "query.market_unmask": "9db4c03c3baa2afc42bb166ce262a9f0c22e0f5e6db0769542c60f90d7a23998",
}
SECURE_PROFILE_DIGESTS = {
    "query.market_advertise": "855a73f122bae543b2307b951783309b9cc5bbbb1a307180acc18b4f63336c6f",
    "query.market_audit": "9428752ec6701daa60ba71ed1eef92d79ce0b1e2f7c6e2fc716c27158d629b6d",
    "query.market_award": "34209e6b5dfad74fc201f55d91228cb2e1bb8a0f01c3924faaddcc7cd55fab3b",
    "query.market_bid": "4f0b10b5162b89f2a4827e7944df9863f8138c551df52d2dfafc2508404137d6",
    "query.market_endorse": "018381311647351eb9261c96311089ece78a4d7da89352f28d48ac482d4b86d6",
    "query.market_mask": "174dd231d2c3b07ef95cee359959706de5b43202632d1234a5d2461b2d87e265",
    "query.market_share": "7dc3cf53121173b52f00010e6bf662752c05770b6f66ba8c3da1581ff807a97f",
    "query.market_survivors": "198ec7057221af9e0a1d687305721e71b0433ab98d7aae269c2c42108dadd2cd",
    "query.market_unmask": "e7dfb52d84efedccb0bfad51d0305df04d952819fef24f33db3b81769c9b8aea",
}


def _stream(label: bytes) -> Callable[[int], bytes]:
    """``n -> n`` bytes of a SHA-256 counter stream: the same bytes in the same order at every run."""
    counter = iter(range(1 << 62))

    def draw(size: int) -> bytes:
        out = b""
        while len(out) < size:
            out += hashlib.sha256(label + next(counter).to_bytes(8, "big")).digest()
        return out[:size]

    return draw


def _fix_randomness(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every random draw of the market, server and nodes alike, from a fresh fixed stream."""
    draw = _stream(b"flmarket-wire-pin")
    monkeypatch.setattr(os, "urandom", draw)
    monkeypatch.setattr(secrets, "token_bytes", lambda size=32: draw(size))
    monkeypatch.setattr(
        X25519PrivateKey, "generate", classmethod(lambda cls: X25519PrivateKey.from_private_bytes(draw(32)))
    )


def _wire_digests(
    monkeypatch: pytest.MonkeyPatch, run: Callable[[Callable[[Message, Message], Message]], None]
) -> tuple[dict[str, str], dict[str, str]]:
    """SHA-256 per message type over the content bytes of every buyer request and of every node reply, in the order
    the nodes replied, in a market whose every random draw comes from a fixed stream: ``(requests, replies)``.

    The market runs once first on real randomness, so that whatever draws once per process (a lazy import, a
    first use) has drawn before the stream starts: the pinned run then draws the same bytes in any test order.
    """
    run(lambda instruction, reply: reply)
    _fix_randomness(monkeypatch)
    requests: dict[str, Any] = defaultdict(hashlib.sha256)
    replies: dict[str, Any] = defaultdict(hashlib.sha256)

    def add(hashes: dict[str, Any], kind: str, node: int, body: bytes) -> None:
        hashes[kind].update(node.to_bytes(8, "big") + len(body).to_bytes(8, "big") + body)

    def record(instruction: Message, reply: Message) -> Message:
        kind, node = instruction.metadata.message_type, instruction.metadata.dst_node_id
        add(requests, kind, node, recorddict_to_proto(instruction.content).SerializeToString(deterministic=True))
        body = (
            recorddict_to_proto(reply.content).SerializeToString(deterministic=True)
            if reply.has_content()
            else reply.error.reason.encode()
        )
        add(replies, kind, node, body)
        return reply

    run(record)
    request_digests, reply_digests = (
        {kind: digest.hexdigest() for kind, digest in sorted(hashes.items())} for hashes in (requests, replies)
    )
    return request_digests, reply_digests


def _buyer_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"buyer").digest())


def test_the_requests_and_replies_of_an_honest_semi_honest_market_keep_their_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    counts = make_counts(6, seed=41)

    def run(hook: Callable[[Message, Message], Message]) -> None:
        grid = InProcessGrid(market_client_app(counts, CostBasedBid(0.01)), list(counts), reply_hook=hook)
        config = MarketConfig(budget=100.0, num_classes=10, poll_interval=0.001, buyer_key=_buyer_key())
        assert MarketPhase(config).run(grid).status == "succeeded"

    assert _wire_digests(monkeypatch, run) == (SEMI_HONEST_REQUEST_DIGESTS, SEMI_HONEST_DIGESTS)


def test_the_requests_and_replies_of_an_honest_market_in_the_secure_profile_keep_their_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLMARKET_HOME", str(tmp_path / "home"))
    counts = make_counts(6, seed=42)
    nodes = sorted(counts)
    publics = {}
    for node in nodes:
        private = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"node-%d" % node).digest())
        save_identity_key(private, tmp_path / f"node-{node}.pem")
        publics[node] = private.public_key().public_bytes_raw()
    directory = IdentityDirectory(publics)
    (tmp_path / "directory.json").write_text(directory.to_json())
    configs = {
        node: {
            "market-security": "malicious",
            "identity-key": str(tmp_path / f"node-{node}.pem"),
            "identity-directory": str(tmp_path / "directory.json"),
            "identity-directory-digest": directory.digest().hex(),
        }
        for node in nodes
    }

    def run(hook: Callable[[Message, Message], Message]) -> None:
        app = market_client_app(counts, CostBasedBid(0.01))
        grid = InProcessGrid(app, nodes, node_configs=configs, reply_hook=hook)
        config = MarketConfig(
            budget=100.0,
            num_classes=10,
            poll_interval=0.001,
            timeout_per_node=0.0,
            buyer_key=_buyer_key(),
            directory=directory,
            security="malicious",
        )
        assert MarketPhase(config).run(grid).status == "succeeded"

    assert _wire_digests(monkeypatch, run) == (SECURE_PROFILE_REQUEST_DIGESTS, SECURE_PROFILE_DIGESTS)


def test_the_pin_is_deterministic(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same market twice under the same stream gives the same bytes (so the digests above can pin them)."""
    counts = {node: np.asarray(value) for node, value in make_counts(4, seed=43).items()}

    def digests() -> tuple[dict[str, str], dict[str, str]]:
        def run(hook: Callable[[Message, Message], Message]) -> None:
            grid = InProcessGrid(market_client_app(counts, CostBasedBid(0.01)), list(counts), reply_hook=hook)
            MarketPhase(MarketConfig(budget=100.0, num_classes=10, poll_interval=0.001, buyer_key=_buyer_key())).run(
                grid
            )

        return _wire_digests(monkeypatch, run)

    assert digests() == digests()
