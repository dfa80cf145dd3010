"""PASS v2, the server's state: where a session is (:class:`Step`) and what it has gathered (:class:`ServerState`).

:class:`~flmarket_flwr.pass_protocol.server.PassServer`'s rounds alone change it; :mod:`.reconstruction` reads it to
rebuild the sum.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from flmarket_flwr.pass_protocol.messages import Advertisement, MaskedInput


class Step(enum.IntEnum):
    """The server's next call in a session; each call runs only at its own step."""

    ADVERTISE = 0
    """:meth:`~.server.PassServer.advertise_requests`."""
    ADVERTISEMENTS = 1
    """:meth:`~.server.PassServer.receive_advertisements`."""
    SHARES = 2
    """:meth:`~.server.PassServer.receive_shares`."""
    MASKED = 3
    """:meth:`~.server.PassServer.receive_masked`."""
    UNMASK = 4
    """:meth:`~.server.PassServer.receive_signatures` (with a directory), then
    :meth:`~.server.PassServer.receive_unmask`."""
    FINISH = 5
    """:meth:`~.server.PassServer.finish`."""
    DONE = 6


@dataclass
class ServerState:
    """What one :class:`PassServer` session has gathered, round by round; keys are PASS indices."""

    masked_sum: npt.NDArray[np.uint64]
    """The survivors' masked inputs summed in ``Z_2^64`` (set when the inputs close)."""
    step: Step = Step.ADVERTISE
    awaiting_signatures: bool = False
    """The consistency round is open (a directory, after the masked inputs)."""
    # Round 1
    roster: bytes = b""
    """The roster fingerprint every advert binds."""
    node_of: dict[int, int] = field(default_factory=dict)
    index_of: dict[int, int] = field(default_factory=dict)
    excluded: dict[int, str] = field(default_factory=dict)
    """Each client that left the protocol, and why."""
    adverts: dict[int, Advertisement] = field(default_factory=dict)
    participants: bytes = b""
    """U1 as a roster bitmap."""
    graph: dict[int, tuple[int, ...]] = field(default_factory=dict)
    degree: int = 0
    threshold: int = 0
    in_graph: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """The sparse secure mode's directed graph: each participant's in-neighbours (``graph`` holds its
    out-neighbours, its share holders); empty in the other modes, whose graph is symmetric."""
    # Round 2
    thresholds: dict[int, int] = field(default_factory=dict)
    """Each dealer's own Shamir threshold (its split tolerance may raise it)."""
    u2: list[int] = field(default_factory=list)
    digests: dict[tuple[int, int], bytes] = field(default_factory=dict)
    """(dealer, holder): the dealer's share-pair digest."""
    ciphertexts: dict[tuple[int, int], tuple[bytes, bytes]] = field(default_factory=dict)
    """(dealer, holder): the ciphertext relayed and its signature."""
    # Round 3
    masked: dict[int, MaskedInput] = field(default_factory=dict)
    accusations: dict[tuple[int, int], bytes] = field(default_factory=dict)
    """(accuser, accused): the accuser's proof, or ``b""``."""
    masked_with: dict[int, frozenset[int]] = field(default_factory=dict)
    """The sparse secure mode: the neighbours each client that sent a masked input signed it masked with."""
    culprits: set[int] = field(default_factory=set)
    """Named by a judgement: their masked inputs are not used."""
    wronged: set[int] = field(default_factory=set)
    """Withdrew because every sender it accused was convicted."""
    cut: set[tuple[int, int]] = field(default_factory=set)
    """(holder, dealer): no mask and no shares on that edge."""
    survivors: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)
    commitments: dict[int, bytes] = field(default_factory=dict)
    transcript: bytes = b""
    # Round 4
    b_shares: dict[int, list[tuple[int, bytes]]] = field(default_factory=dict)
    s_shares: dict[int, list[tuple[int, bytes]]] = field(default_factory=dict)
