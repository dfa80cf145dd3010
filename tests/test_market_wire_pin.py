"""The bytes of every market message a node sends, pinned in two deterministic honest markets.

Every source of randomness (``os.urandom``, ``secrets.token_bytes``, X25519 key generation) is replaced by a
counter-seeded stream, the buyer's key is fixed, and the nodes' replies are hashed per message type in the order
they arrive: a refactoring of the node side that changes one byte of one reply changes a digest here.
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
from flmarket_flwr.market.inprocess import InProcessGrid, market_client_app
from flmarket_flwr.pass_protocol import IdentityDirectory, save_identity_key

SEMI_HONEST_DIGESTS = {
    "query.market_advertise": "798d32055321615d393f5c4b15d950368eb195b6934ca900fdcb08508c64ea72",
    "query.market_audit": "72c21e195719d30fbd5b9279dee13fd431fd7a86659f777e72361b0c0d07b2f9",
    "query.market_award": "34209e6b5dfad74fc201f55d91228cb2e1bb8a0f01c3924faaddcc7cd55fab3b",
    "query.market_bid": "7acbbe39e656dc1eb1d98d466b5ca31e529ce55f6cb331f9f846a2d0ba20b56a",
    "query.market_endorse": "9286f28b51a619d69744108bf20afa95af13efdfe0ce844f454ddea393caa0fd",
    "query.market_mask": "8ef01312a612ec2c0047ca401a78e26ee2725cc5c39e4bba16903b6fd2da4347",
    "query.market_share": "446577634391f003999b37af9092d2c12557b886273d1b575e15aa981daa57e2",
    "query.market_unmask": "e2f29530794607f7edbf55ab5e3930ae51765dc57bf3cfc9ae1b9104f9fbdb29",
}
SECURE_PROFILE_DIGESTS = {
    "query.market_advertise": "d3b805589febfef539a8b37d86f040d7dca97fb4332cfcb7e7608d26fd39a2d6",
    "query.market_audit": "5e5276ac68bb1032a6c1073f73f85fd97438f1653f434598b191170b716b74f7",
    "query.market_award": "34209e6b5dfad74fc201f55d91228cb2e1bb8a0f01c3924faaddcc7cd55fab3b",
    "query.market_bid": "b2537e4e015a9db4d2b10476030e5a5dbdd31c5c852d1da7b182eb0879c2130b",
    "query.market_endorse": "9b17e79deeaf06839897d623e1deaefe5c0d357e2cc39b11483801bc6b8a295c",
    "query.market_mask": "a12828e99a8a450cee10760996d41c22516f41116fece773539088ed0590c31d",
    "query.market_share": "d58649a8ce858369813e594029e987aee37d18fa03137367150767178611e494",
    "query.market_survivors": "198ec7057221af9e0a1d687305721e71b0433ab98d7aae269c2c42108dadd2cd",
    "query.market_unmask": "25bfc6d9e60b5c16a986ad49b9185f60d37182619832d9df2ba1af5fb8112d4e",
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


def _reply_digests(
    monkeypatch: pytest.MonkeyPatch, run: Callable[[Callable[[Message, Message], Message]], None]
) -> dict[str, str]:
    """SHA-256 per message type over the content bytes of every node reply, in the order the nodes sent them, in a
    market whose every random draw comes from a fixed stream."""
    _fix_randomness(monkeypatch)
    hashes: dict[str, Any] = defaultdict(hashlib.sha256)

    def record(instruction: Message, reply: Message) -> Message:
        kind = instruction.metadata.message_type
        body = (
            recorddict_to_proto(reply.content).SerializeToString(deterministic=True)
            if reply.has_content()
            else reply.error.reason.encode()
        )
        hashes[kind].update(instruction.metadata.dst_node_id.to_bytes(8, "big") + len(body).to_bytes(8, "big") + body)
        return reply

    run(record)
    return {kind: digest.hexdigest() for kind, digest in sorted(hashes.items())}


def _buyer_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"buyer").digest())


def test_the_replies_of_an_honest_semi_honest_market_keep_their_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    counts = make_counts(6, seed=41)

    def run(hook: Callable[[Message, Message], Message]) -> None:
        grid = InProcessGrid(market_client_app(counts, CostBasedBid(0.01)), list(counts), reply_hook=hook)
        config = MarketConfig(budget=100.0, num_classes=10, poll_interval=0.001, buyer_key=_buyer_key())
        assert MarketPhase(config).run(grid).status == "succeeded"

    assert _reply_digests(monkeypatch, run) == SEMI_HONEST_DIGESTS


def test_the_replies_of_an_honest_market_in_the_secure_profile_keep_their_bytes(
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

    assert _reply_digests(monkeypatch, run) == SECURE_PROFILE_DIGESTS


def test_the_pin_is_deterministic(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same market twice under the same stream gives the same bytes (so the digests above can pin them)."""
    counts = {node: np.asarray(value) for node, value in make_counts(4, seed=43).items()}

    def digests() -> dict[str, str]:
        def run(hook: Callable[[Message, Message], Message]) -> None:
            grid = InProcessGrid(market_client_app(counts, CostBasedBid(0.01)), list(counts), reply_hook=hook)
            MarketPhase(MarketConfig(budget=100.0, num_classes=10, poll_interval=0.001, buyer_key=_buyer_key())).run(
                grid
            )

        return _reply_digests(monkeypatch, run)

    assert digests() == digests()
