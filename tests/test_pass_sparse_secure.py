"""The sparse secure mode of PASS (issue 40, rules 1-5 of docs/threat-model.md), against the real client and server.

An honest session first (the sum is exact at E = 30 and E = 200, with dropouts at every round); then the buyer plays
each attack at the PASS level: it cannot choose a victim's out-neighbours (a forged or altered draw is refused), it
cannot show clients different U1 or (k, t), nor a (k, t) below the finder's, nor replay a masked-with list, cut an edge
on one side, split the survivor views, flood a victim's in-degree, or isolate a victim by declaring its neighbours
dropped. Each test asserts what the buyer got.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from flmarket_flwr.pass_protocol import messages
from flmarket_flwr.pass_protocol.channel import rebuild_secret
from flmarket_flwr.pass_protocol.encoding import PassError, bitmap_to_indices, indices_to_bitmap
from flmarket_flwr.pass_protocol.graph import roster_digest
from flmarket_flwr.pass_protocol.identity import IdentityDirectory, public_key_of
from flmarket_flwr.pass_protocol.messages import (
    ConsistencyRequest,
    DrawRequest,
    OutNeighbourDraw,
    SparseAdvertiseRequest,
    SparseMaskedInput,
    SparseMaskRequest,
    SparseShareKeysRequest,
    SparseUnmaskRequest,
)
from flmarket_flwr.pass_protocol.sparse_client import SparseSecureClient
from flmarket_flwr.pass_protocol.sparse_secure import (
    SessionBinding,
    SparseSecureSettings,
    draw_out_neighbours,
    pack_indices,
    unpack_indices,
)
from flmarket_flwr.pass_protocol.sparse_server import SparseSecureServer

NUM_CLASSES, RUN_ID = 3, 11


def identity(node: int) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"sparse identity %d" % node).digest())


def settings_for(size: int) -> SparseSecureSettings:
    """5 % colluders (at least 1) over a floor of the whole roster, 5 % dropout, 2 re-runs, 2^-40."""
    return SparseSecureSettings.of(colluders=max(1, size // 20), roster_floor=size, dropout=0.05, reruns=2)


class SparseSession:
    """A SparseSecureServer and E SparseSecureClients, every message and state round-tripped through its record.

    Each step returns the requests of the next; ``drop`` leaves clients out of a step, ``tamper`` changes requests
    or replies in flight (the buyer's hand), and ``refused`` records each client's refusal.
    """

    def __init__(
        self, size: int, *, session: bytes = b"sparse-1", seed: int = 0, own: SparseSecureSettings | None = None
    ):
        self.rng = np.random.default_rng(seed)
        self.counts = self.rng.integers(0, 50, size=(size, NUM_CLASSES))
        self.nodes = [100 + i for i in range(size)]
        self.directory = IdentityDirectory({n: public_key_of(identity(n)) for n in self.nodes})
        self.settings = settings_for(size)
        self.own = own or self.settings
        self.server = SparseSecureServer(
            session, NUM_CLASSES, 1000, settings=self.settings, directory=self.directory, run_id=RUN_ID
        )
        self.states: dict[int, dict[str, Any]] = {}
        self.refused: dict[int, str] = {}
        self.draw_rng = random.Random(seed)

    def key(self, index: int) -> Ed25519PrivateKey:
        return identity(self.nodes[index - 1])

    def call(self, index: int, method: str, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        client = SparseSecureClient(self.states.get(index, {}), draw=self.draw_rng.randrange)
        try:
            return getattr(client, method)(*args, **kwargs).to_record()  # type: ignore[no-any-return]
        except PassError as error:
            self.refused[index] = str(error)
            return None
        finally:
            self.states[index] = client.to_record()

    def _round(
        self, requests: dict[int, Any], method: str, args: Callable[[int], tuple[Any, ...]], drop=(), tamper=None
    ):
        replies = {}
        for i, request in sorted(requests.items()):
            if i in drop:
                continue
            reply = self.call(i, method, request.to_record(), *args(i))
            if reply is not None:
                replies[i] = reply
        for i, change in (tamper or {}).items():
            replies[i] = change(replies[i])
        return replies

    def advertise(self, drop=()):
        requests = self.server.advertise_requests(self.nodes)
        replies = {}
        for i, request in requests.items():
            if i not in drop:
                reply = self.call(
                    i,
                    "advertise",
                    request.to_record(),
                    self.counts[i - 1],
                    identity_key=self.key(i),
                    settings=self.own,
                    run_id=RUN_ID,
                )
                if reply is not None:
                    replies[i] = reply
        return self.server.receive_advertisements(replies)

    def draw(self, requests, drop=(), tamper=None):
        return self.server.receive_draws(self._round(requests, "draw", lambda i: (self.key(i),), drop, tamper))

    def share(self, requests, drop=(), tamper=None):
        replies = self._round(requests, "share_keys", lambda i: (self.directory, self.key(i)), drop, tamper)
        return self.server.receive_shares(replies)

    def mask(self, requests, drop=(), tamper=None):
        return self.server.receive_masked(self._round(requests, "mask_input", lambda i: (self.key(i),), drop, tamper))

    def sign(self, requests, drop=()):
        return self.server.receive_signatures(self._round(requests, "sign_survivors", lambda i: (self.key(i),), drop))

    def unmask(self, requests, drop=()):
        self.server.receive_unmask(self._round(requests, "unmask", lambda i: (), drop))
        return self.server.finish()

    def run(self, drops: dict[str, tuple[int, ...]] | None = None) -> np.ndarray:
        drops = drops or {}
        requests = self.advertise(drops.get("advertise", ()))
        requests = self.draw(requests, drops.get("draw", ()))
        requests = self.share(requests, drops.get("share", ()))
        requests = self.mask(requests, drops.get("mask", ()))
        requests = self.sign(requests, drops.get("sign", ()))
        return self.unmask(requests, drops.get("unmask", ()))

    def expected(self) -> np.ndarray:
        return self.counts[[u - 1 for u in self.server.survivors]].sum(axis=0)


# The honest session ----------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "drops"),
    [
        (30, {}),
        (30, {"share": (4,), "mask": (9,), "unmask": (17,)}),
        pytest.param(200, {"draw": (3,), "share": (50,), "mask": (7, 120), "unmask": (199,)}, marks=pytest.mark.slow),
    ],
)
def test_an_honest_session_sums_exactly_over_the_survivors(size: int, drops: dict[str, tuple[int, ...]]) -> None:
    run = SparseSession(size)
    total = run.run(drops)
    assert not run.refused
    k = run.server.parameters.degree  # type: ignore[union-attr]
    assert k == settings_for(size).parameters(size).degree and k < size - 1  # the finder's degree, sparse
    gone = {i for step in drops.values() for i in step if step is not drops.get("unmask")}
    assert set(run.server.survivors) == set(range(1, size + 1)) - gone
    assert np.array_equal(total, run.expected())
    for u, out in run.server.state.graph.items():
        assert len(out) == k and u not in out
