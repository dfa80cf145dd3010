"""Every PASS message pinned byte for byte: two deterministic sessions, their whole transcript hashed.

The randomness (``os.urandom``, ``secrets.token_bytes``, X25519 key generation, the server's probe key) is drawn
from one seeded stream and Ed25519 signs deterministically, so a session run twice sends the same bytes; the
hashes below are those of the sessions as PASS v2 has sent them. A refactoring of the client or the server that
changes one byte of one message, or the order of the random draws, fails here.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from flmarket_flwr.pass_protocol import IdentityDirectory, PassClient, PassServer, primitives
from flmarket_flwr.pass_protocol.identity import public_key_of

NUM_CLIENTS, NUM_CLASSES, RUN_ID = 6, 4, 7
COUNTS = np.arange(NUM_CLIENTS * NUM_CLASSES).reshape(NUM_CLIENTS, NUM_CLASSES) % 9
FLOOR = {"security_bits": 0, "bad_fraction": 0.01}

SIGNED_SESSION = "fb3932bc65520ffef9b29aa2c84002d7a54c216029dfc0f87311924e3b378107"
"""Identity keys, the consistency round, noise, a dropout at the masked input."""
ACCUSED_SESSION = "abb7a0ebf63febdcfca60b8f833102338834f63337ba61e6fe6314b54a1c247d"
"""No identity keys; one dealer sends one neighbour garbage, is accused with a proof and named."""


@pytest.fixture
def seeded(monkeypatch: pytest.MonkeyPatch) -> Callable[[bytes], None]:
    """Route every random draw of PASS through one SHAKE-256 stream; call it with a seed to (re)start."""
    stream: dict[str, Iterator[bytes]] = {}

    def restart(seed: bytes) -> None:
        def blocks() -> Iterator[bytes]:
            counter = 0
            while True:
                yield hashlib.shake_256(seed + counter.to_bytes(8, "little")).digest(64)
                counter += 1

        stream["blocks"] = blocks()
        primitives._probe_key.cache_clear()  # the server's probe key, drawn once per process: once per session here

    def draw(size: int) -> bytes:
        out = b""
        while len(out) < size:
            out += next(stream["blocks"])
        return out[:size]

    monkeypatch.setattr(os, "urandom", draw)
    monkeypatch.setattr(secrets, "token_bytes", draw)
    monkeypatch.setattr(
        X25519PrivateKey, "generate", staticmethod(lambda: X25519PrivateKey.from_private_bytes(draw(32)))
    )
    return restart


def _identity(node: int) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"identity %d" % node).digest())


class Transcript:
    """The PASS messages of one session in the order sent, and the clients' states between rounds."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, int, dict[str, Any]]] = []
        self.states: dict[int, dict[str, Any]] = {}

    def note(self, step: str, replies: dict[int, Any]) -> dict[int, dict[str, Any]]:
        records = {i: (r if isinstance(r, dict) else r.to_record()) for i, r in sorted(replies.items())}
        self.messages.extend((step, i, record) for i, record in records.items())
        return records

    def call(self, index: int, method: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        client = PassClient.from_record(self.states.get(index, {}))
        try:
            return getattr(client, method)(*args, **kwargs).to_record()  # type: ignore[no-any-return]
        finally:
            self.states[index] = client.to_record()

    def digest(self) -> str:
        text = repr([(step, i, sorted(record.items())) for step, i, record in self.messages])
        return hashlib.sha256(text.encode()).hexdigest()


def _signed_session() -> tuple[Transcript, list[int]]:
    nodes = [1000 + i for i in range(NUM_CLIENTS)]
    directory = IdentityDirectory({node: public_key_of(_identity(node)) for node in nodes})
    server = PassServer(b"pinned-1", NUM_CLASSES, 10, directory=directory, run_id=RUN_ID)
    server.noise_slack = 4
    log = Transcript()
    requests: Any = log.note("advertise", server.advertise_requests(nodes))
    replies = {
        i: log.call(i, "advertise", r, COUNTS[i - 1], identity_key=_identity(r["node_id"]), run_id=RUN_ID, **FLOOR)
        for i, r in requests.items()
    }
    requests = log.note("share", server.receive_advertisements(log.note("advert", replies)))
    replies = {i: log.call(i, "share_keys", r, directory, _identity(server.node_of[i])) for i, r in requests.items()}
    requests = log.note("mask", server.receive_shares(log.note("shared", replies)))
    noise = [1, -1, 0, 2]
    replies = {i: log.call(i, "mask_input", r, noise) for i, r in requests.items() if i != NUM_CLIENTS}
    requests = log.note("view", server.receive_masked(log.note("masked", replies)))
    replies = {i: log.call(i, "sign_survivors", r, _identity(server.node_of[i])) for i, r in requests.items()}
    requests = log.note("unmask", server.receive_signatures(log.note("signed", replies)))
    replies = {i: log.call(i, "unmask", r) for i, r in requests.items()}
    server.receive_unmask(log.note("unmasked", replies))
    return log, server.finish().tolist()


def _accused_session() -> tuple[Transcript, list[int]]:
    server = PassServer(b"pinned-2", NUM_CLASSES, 10, run_id=RUN_ID)
    log = Transcript()
    requests: Any = log.note("advertise", server.advertise_requests([2000 + i for i in range(NUM_CLIENTS)]))
    replies = {i: log.call(i, "advertise", r, COUNTS[i - 1], run_id=RUN_ID, **FLOOR) for i, r in requests.items()}
    requests = log.note("share", server.receive_advertisements(log.note("advert", replies)))
    replies = {i: log.call(i, "share_keys", r) for i, r in requests.items()}
    garbled = list(replies[2]["ciphertexts"])  # dealer 2 sends its first neighbour garbage
    garbled[0] = bytes(len(garbled[0]))
    replies[2] = {**replies[2], "ciphertexts": garbled}
    requests = log.note("mask", server.receive_shares(log.note("shared", replies)))
    replies = {i: log.call(i, "mask_input", r) for i, r in requests.items()}
    assert [len(proof) for reply in replies.values() for proof in reply["proofs"]] == [128]  # one proven accusation
    requests = log.note("unmask", server.receive_masked(log.note("masked", replies)))
    assert server.culprits == {2}
    replies = {i: log.call(i, "unmask", r) for i, r in requests.items()}
    server.receive_unmask(log.note("unmasked", replies))
    return log, server.finish().tolist()


@pytest.mark.parametrize(
    ("session", "pinned", "total"),
    [
        (_signed_session, SIGNED_SESSION, (COUNTS[:-1].sum(axis=0) + 5 * np.array([1, -1, 0, 2])).tolist()),
        (_accused_session, ACCUSED_SESSION, COUNTS[[0, 2, 3, 4, 5]].sum(axis=0).tolist()),
    ],
)
def test_a_seeded_session_sends_the_pinned_bytes(
    seeded: Callable[[bytes], None], session: Callable[[], tuple[Transcript, list[int]]], pinned: str, total: list[int]
) -> None:
    seeded(b"pass wire bytes")
    log, result = session()
    assert result == total
    seeded(b"pass wire bytes")
    again, _ = session()
    assert again.digest() == log.digest()  # the seed alone decides every byte: the pin below means something
    assert log.digest() == pinned


def test_another_seed_sends_other_bytes(seeded: Callable[[bytes], None]) -> None:
    """The keys, seeds and nonces do come from the stream: another seed changes the transcript."""
    seeded(b"one")
    first, _ = _accused_session()
    seeded(b"two")
    second, _ = _accused_session()
    assert first.digest() != second.digest()
