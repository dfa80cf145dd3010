"""The market's award: the buyer's signed statement of who bid, who won and what each is paid, and its checks.

The buyer fixes its terms (:class:`AwardTerms`: budget ``R``, cohort cap, its Ed25519 public key) in the PASS
advertisement, before any count is summed. After the auction it signs an :class:`Award` (run, session, PASS
transcript, terms, every bidder's score and bid, the winners and their payments) in one canonical encoding.
Each bidder checks it (:func:`check_award`: its own score and bid listed as sent, the outcome exactly
:func:`~flmarket_flwr.pricing.run_auction` over the listed bidders under the terms) and endorses its digest
with its identity key (:func:`~flmarket_flwr.pass_protocol.identity.sign_award_endorsement`); a winner opens
its counts only for the latest award it endorsed, and with a directory only when ``t`` other members endorsed
it too (:func:`count_endorsements`), so that the buyer cannot show different bidders different awards. The
signed award is the winner's receipt: the buyer has committed to pay it. Pure: no Flower.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from flmarket_flwr.pass_protocol.graph import share_threshold
from flmarket_flwr.pass_protocol.identity import IDENTITY_KEY_LENGTH, SIGNATURE_LENGTH, verify_award_endorsement
from flmarket_flwr.pricing import run_auction

__all__ = [
    "Award",
    "AwardError",
    "AwardTerms",
    "Bidder",
    "SignedAward",
    "build_award",
    "check_award",
    "count_endorsements",
    "endorsement_threshold",
    "pack_endorsements",
    "settle",
    "sign_award",
    "unpack_endorsements",
]

_AWARD_LABEL: Final[bytes] = b"flmarket/v1/award"
_SIGNATURE_LABEL: Final[bytes] = b"flmarket/v1/award-signature"
_ENDORSEMENT_BYTES: Final[int] = 8 + SIGNATURE_LENGTH
_BIDDER_ROW: Final = np.dtype([("node", ">u8"), ("score", ">f8"), ("bid", ">f8"), ("payment", ">f8")])
"""One bidder in the encoding: node id, score, bid, payment (big-endian uint64 and IEEE-754 doubles)."""
_INCLUDED_ROW: Final = np.dtype([("node", ">u8"), ("payment", ">f8")])
"""One included node in the encoding: node id and its fixed payment."""
_PAYMENT_REL_TOL: Final[float] = 1e-9
"""A listed payment must equal the one recomputed here to this relative tolerance (floating-point paths may
differ between machines); the winners must be the same exactly, and the payments' sum at most ``R``."""


class AwardError(ValueError):
    """An award that is malformed, not signed by the buyer, or not the one the rules give."""


@dataclass(frozen=True)
class AwardTerms:
    """The market's terms, announced before PASS: budget, cohort cap (``0``: none) and the buyer's key.

    Attributes
    ----------
    budget : float
        ``R > 0``, finite.
    cohort_cap : int
        At most this many winners; ``0`` for no cap.
    buyer_key : bytes
        The buyer's raw Ed25519 public key (32 bytes), which signs the award.
    """

    budget: float
    cohort_cap: int
    buyer_key: bytes

    def __post_init__(self) -> None:
        """Validate every field; :class:`AwardError` names the one that is wrong."""
        budget = self.budget
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not math.isfinite(budget) or budget <= 0:
            raise AwardError(f"terms: the budget must be a finite number > 0, got {budget!r}")
        object.__setattr__(self, "budget", float(budget))
        cap = self.cohort_cap
        if isinstance(cap, bool) or not isinstance(cap, int) or not 0 <= cap < 2**63:
            raise AwardError(f"terms: the cohort cap must be an int >= 0 (0: none), got {cap!r}")
        _public_key(self.buyer_key, "terms: the buyer key")

    def encode(self) -> bytes:
        """Canonical bytes: the budget (IEEE-754 double), the cap, the key."""
        return struct.pack(">dQ", self.budget, self.cohort_cap) + self.buyer_key


@dataclass(frozen=True)
class Bidder:
    """One bidder of an award: its node id, the score and bid it sent, and its payment (``0.0`` if it lost)."""

    node_id: int
    score: float
    bid: float
    payment: float

    def __post_init__(self) -> None:
        """Validate every field."""
        if isinstance(self.node_id, bool) or not isinstance(self.node_id, int) or not 0 <= self.node_id < 2**64:
            raise AwardError(f"a bidder's node id must be an int in [0, 2**64), got {self.node_id!r}")
        for name in ("score", "bid", "payment"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise AwardError(f"node {self.node_id}: its {name} must be a finite number, got {value!r}")
            object.__setattr__(self, name, float(value) + 0.0)  # -0.0 becomes 0.0: one encoding per value


@dataclass(frozen=True)
class Award:
    """The outcome of one auction, as the buyer signs it.

    Attributes
    ----------
    run_id : int
        The Flower run.
    session : bytes
        The PASS session whose sum the bids were made against.
    transcript : bytes
        That session's transcript hash (its survivors).
    terms : AwardTerms
        The terms announced at the advertisement.
    bidders : tuple[Bidder, ...]
        Every bidder of this auction, ascending node id.
    winners : tuple[int, ...]
        The winners' node ids, in selection order.
    included : tuple[tuple[int, float], ...]
        The nodes the buyer included outside the auction and their fixed payments, ascending node id (none
        by default). They are no bidders; the terms' budget is what their payments left for the auction.
    """

    run_id: int
    session: bytes
    transcript: bytes
    terms: AwardTerms
    bidders: tuple[Bidder, ...]
    winners: tuple[int, ...]
    included: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        """Validate the structure (not the auction: :func:`check_award` does that)."""
        if isinstance(self.run_id, bool) or not isinstance(self.run_id, int) or not 0 <= self.run_id < 2**64:
            raise AwardError(f"the run id must be an int in [0, 2**64), got {self.run_id!r}")
        for name in ("session", "transcript"):
            if not isinstance(getattr(self, name), bytes) or not getattr(self, name):
                raise AwardError(f"the award's {name} must be non-empty bytes")
        if not isinstance(self.terms, AwardTerms):
            raise AwardError("the award's terms must be AwardTerms")
        object.__setattr__(self, "bidders", tuple(self.bidders))
        object.__setattr__(self, "winners", tuple(self.winners))
        nodes = [bidder.node_id for bidder in self.bidders]
        if any(not isinstance(bidder, Bidder) for bidder in self.bidders) or nodes != sorted(set(nodes)):
            raise AwardError("the bidders must be Bidder entries in strictly ascending node id")
        if len(set(self.winners)) != len(self.winners) or not set(self.winners) <= set(nodes):
            raise AwardError("the winners must be distinct bidders")
        for node, payment in self.included:
            if isinstance(node, bool) or not isinstance(node, int) or not 0 <= node < 2**64:
                raise AwardError(f"an included node id must be an int in [0, 2**64), got {node!r}")
            if isinstance(payment, bool) or not isinstance(payment, (int, float)) or not 0 <= payment < math.inf:
                raise AwardError(f"included node {node}: its payment must be finite and >= 0, got {payment!r}")
        object.__setattr__(self, "included", tuple((node, float(pay) + 0.0) for node, pay in self.included))
        listed = [node for node, _ in self.included]
        if listed != sorted(set(listed)) or set(listed) & set(nodes):
            raise AwardError("the included nodes must be in strictly ascending node id, and no bidders")

    def encode(self) -> bytes:
        """The canonical encoding: fixed-width fields, length-prefixed bytes and counted lists (injective)."""
        parts = [
            _field(_AWARD_LABEL),
            struct.pack(">Q", self.run_id),
            _field(self.session),
            _field(self.transcript),
            self.terms.encode(),
            struct.pack(">Q", len(self.bidders)),
        ]
        rows = [(b.node_id, b.score, b.bid, b.payment) for b in self.bidders]
        parts.append(np.array(rows, dtype=_BIDDER_ROW).tobytes())
        parts.append(struct.pack(">Q", len(self.winners)))
        parts.append(np.array(self.winners, dtype=">u8").tobytes())
        parts.append(struct.pack(">Q", len(self.included)))
        parts.append(np.array(list(self.included), dtype=_INCLUDED_ROW).tobytes())
        return b"".join(parts)

    @classmethod
    def decode(cls, data: bytes) -> Award:
        """Parse :meth:`encode`'s bytes; :class:`AwardError` for anything else (trailing bytes included)."""
        if not isinstance(data, bytes):
            raise AwardError(f"an award must be bytes, got {type(data).__name__}")
        reader = _Reader(data)
        if reader.field() != _AWARD_LABEL:
            raise AwardError("not an award (wrong label)")
        run_id = reader.unpack(">Q")[0]
        session, transcript = reader.field(), reader.field()
        budget, cap = reader.unpack(">dQ")
        terms = AwardTerms(budget, cap, reader.take(IDENTITY_KEY_LENGTH))
        table = np.frombuffer(reader.take(_BIDDER_ROW.itemsize * reader.count(_BIDDER_ROW.itemsize)), _BIDDER_ROW)
        winners = tuple(np.frombuffer(reader.take(8 * reader.count(8)), dtype=">u8").tolist())
        rows = np.frombuffer(reader.take(_INCLUDED_ROW.itemsize * reader.count(_INCLUDED_ROW.itemsize)), _INCLUDED_ROW)
        if np.any(np.signbit(rows["payment"])):  # a negative payment, or a negative zero (one encoding per value)
            raise AwardError("the award lists an included node's payment below 0 (or a negative zero)")
        included = tuple(zip(rows["node"].tolist(), rows["payment"].tolist(), strict=True))
        reader.end()
        numbers = np.stack([table["score"], table["bid"], table["payment"]])
        if not np.isfinite(numbers).all() or np.any((numbers == 0) & np.signbit(numbers)):
            raise AwardError("the award lists a score, bid or payment that is not finite (or a negative zero)")
        nodes = table["node"]
        if not bool(np.all(nodes[1:] > nodes[:-1])):
            raise AwardError("the bidders must be in strictly ascending node id")
        bidders = zip(nodes.tolist(), *numbers.tolist(), strict=True)  # checked above, vectorised: no per-row checks
        return cls(run_id, session, transcript, terms, tuple(_listed(*row) for row in bidders), winners, included)

    def digest(self) -> bytes:
        """SHA-256 of the encoding: what the bidders endorse."""
        return hashlib.sha256(self.encode()).digest()

    def bidder(self, node_id: int) -> Bidder | None:
        """The entry of ``node_id``, or ``None`` if it is not a bidder."""
        return next((bidder for bidder in self.bidders if bidder.node_id == node_id), None)

    @property
    def payments(self) -> dict[int, float]:
        """Node id -> payment, for every bidder (the included nodes' are in :attr:`included`)."""
        return {bidder.node_id: bidder.payment for bidder in self.bidders}


@dataclass(frozen=True)
class SignedAward:
    """An award's canonical encoding and the buyer's Ed25519 signature on it (what travels and what is kept)."""

    encoded: bytes
    signature: bytes

    def verify(self, buyer_key: bytes) -> Award:
        """The award, if the signature verifies under ``buyer_key`` and the award names that key in its terms.

        Raises
        ------
        AwardError
            Malformed, unsigned, signed by another key, or naming other terms' key.
        """
        if not isinstance(self.signature, bytes) or len(self.signature) != SIGNATURE_LENGTH:
            raise AwardError(f"the award is not signed (a signature is {SIGNATURE_LENGTH} bytes)")
        award = Award.decode(self.encoded)
        if award.terms.buyer_key != buyer_key:
            raise AwardError("the award's terms name another buyer key")
        try:
            _public_key(buyer_key, "the buyer key").verify(self.signature, _signed_message(self.encoded))
        except InvalidSignature as err:
            raise AwardError("the award's signature does not verify under the buyer's key") from err
        return award

    @property
    def digest(self) -> bytes:
        """SHA-256 of the encoding (:meth:`Award.digest`)."""
        return hashlib.sha256(self.encoded).digest()


def sign_award(award: Award, buyer_key: Ed25519PrivateKey) -> SignedAward:
    """Sign ``award`` with the buyer's key (domain-separated); the key must be the one its terms name."""
    public = buyer_key.public_key().public_bytes_raw()
    if public != award.terms.buyer_key:
        raise AwardError("the signing key is not the buyer key the award's terms name")
    encoded = award.encode()
    return SignedAward(encoded, buyer_key.sign(_signed_message(encoded)))


def settle(terms: AwardTerms, bids: Sequence[tuple[int, float, float]]) -> tuple[tuple[int, ...], dict[int, float]]:
    """Winners (selection order) and payments of ``run_auction`` over ``(node, score, bid)`` under ``terms``.

    The bidders are taken in ascending node id; a cohort cap larger than their number is lowered to it.

    Raises
    ------
    AwardError
        If the auction rejects its input.
    """
    ordered = sorted(bids)
    nodes = [node for node, _, _ in ordered]
    payments = {node: 0.0 for node in nodes}
    if not nodes:
        return (), payments
    cap = None if terms.cohort_cap == 0 else min(terms.cohort_cap, len(nodes))
    try:
        result = run_auction([s for _, s, _ in ordered], [b for _, _, b in ordered], terms.budget, num_winners=cap)
    except ValueError as err:
        raise AwardError(f"the auction rejects the listed bids: {err}") from err
    payments.update({node: float(result.payments[position]) for position, node in enumerate(nodes)})
    return tuple(nodes[int(i)] for i in result.winners), payments


def build_award(
    run_id: int,
    session: bytes,
    transcript: bytes,
    terms: AwardTerms,
    bids: Mapping[int, tuple[float, float]],
    included: Mapping[int, float] | None = None,
) -> Award:
    """The award of the auction over ``bids`` (node -> ``(score, bid)``), by :func:`settle`, recording the
    ``included`` nodes (node -> fixed payment, outside the auction: ``terms.budget`` is what they left)."""
    winners, payments = settle(terms, [(node, score, bid) for node, (score, bid) in bids.items()])
    bidders = tuple(Bidder(node, *bids[node], payments[node]) for node in sorted(bids))
    fixed = tuple((node, float(payment)) for node, payment in sorted((included or {}).items()))
    return Award(run_id, session, transcript, terms, bidders, winners, fixed)


def check_award(
    award: Award,
    *,
    run_id: int,
    session: bytes,
    transcript: bytes,
    terms: AwardTerms,
    node_id: int,
    score: float,
    bid: float,
    previous: Award | None = None,
) -> None:
    """A bidder's checks of an award before it endorses it.

    The run, session, transcript and terms are its own; its score and bid are listed exactly as it sent
    them; the winners and payments are :func:`settle` over the listed bidders (so the total is within
    ``R`` and every payment is a critical value). A re-issued award (``previous``: the last one it
    endorsed) lists a strict subset of the previous bidders, leaves out only winners of it, and lists the same
    included nodes.

    Raises
    ------
    AwardError
        Naming the first check that fails.
    """
    if (award.run_id, award.session, award.transcript) != (run_id, session, transcript):
        raise AwardError("the award is not for this client's run, PASS session and transcript")
    if award.terms != terms:
        raise AwardError("the award's terms are not those announced at the advertisement")
    own = award.bidder(node_id)
    if own is None or (own.score, own.bid) != (score, bid):
        raise AwardError("the award does not list this client's score and bid as it sent them")
    winners, payments = settle(terms, [(b.node_id, b.score, b.bid) for b in award.bidders])
    if winners != award.winners:
        raise AwardError("the award's winners are not the auction's over the listed bids")
    listed = np.array([bidder.payment for bidder in award.bidders])
    due = np.array([payments[bidder.node_id] for bidder in award.bidders])
    tolerance = np.maximum(_PAYMENT_REL_TOL * np.maximum(np.abs(listed), np.abs(due)), 1e-12)  # math.isclose's rule
    wrong = np.flatnonzero(np.abs(listed - due) > tolerance)
    if wrong.size:
        raise AwardError(f"node {award.bidders[int(wrong[0])].node_id}'s payment is not the auction's")
    if math.fsum(award.payments.values()) > terms.budget * (1.0 + 1e-12):
        raise AwardError("the award's payments exceed the budget")
    if previous is not None:
        nodes, earlier = {b.node_id for b in award.bidders}, {b.node_id for b in previous.bidders}
        if not nodes < earlier or not earlier - nodes <= set(previous.winners):
            raise AwardError("a re-issued award must drop some winners of the previous one, and only winners")
        if award.included != previous.included:
            raise AwardError("a re-issued award must list the same included nodes and payments as the previous one")


def endorsement_threshold(degree: int, survivors: int) -> int:
    """Endorsements a winner needs from other members: the consistency round's ``t``, and at least half the sum's.

    ``t = k // 2 + 1`` (:func:`~flmarket_flwr.pass_protocol.graph.share_threshold`) is a majority on the complete
    graph; on a sparse graph it is local, so it is raised to ``E // 2``: two awards each endorsed by the
    winner and ``E // 2`` others need ``2 (E // 2 + 1) > E`` honest endorsers, more than the sum's members.
    """
    return max(share_threshold(degree), survivors // 2)


def count_endorsements(
    digest: bytes, endorsements: Mapping[int, bytes], directory: Mapping[int, bytes], own_node: int
) -> int:
    """How many of ``endorsements`` (node -> signature) are valid signatures on ``digest`` by directory members
    other than ``own_node`` (each node counted once)."""
    valid = 0
    for node, signature in endorsements.items():
        if node == own_node or node not in directory:
            continue
        try:
            verify_award_endorsement(directory[node], signature, digest)
        except ValueError:
            continue
        valid += 1
    return valid


def pack_endorsements(endorsements: Mapping[int, bytes]) -> bytes:
    """Node -> 64-byte signature as one bytes item: ``(node id, signature)`` pairs in ascending node id."""
    parts = []
    for node, signature in sorted(endorsements.items()):
        if not isinstance(signature, bytes) or len(signature) != SIGNATURE_LENGTH:
            raise AwardError(f"node {node}'s endorsement must be {SIGNATURE_LENGTH} bytes")
        parts.append(struct.pack(">Q", node) + signature)
    return b"".join(parts)


def unpack_endorsements(packed: bytes) -> dict[int, bytes]:
    """Inverse of :func:`pack_endorsements`; :class:`AwardError` if malformed or a node repeats."""
    if not isinstance(packed, bytes) or len(packed) % _ENDORSEMENT_BYTES:
        raise AwardError(f"endorsements must be bytes in {_ENDORSEMENT_BYTES}-byte entries")
    entries = [packed[i : i + _ENDORSEMENT_BYTES] for i in range(0, len(packed), _ENDORSEMENT_BYTES)]
    nodes = [struct.unpack(">Q", entry[:8])[0] for entry in entries]
    if nodes != sorted(set(nodes)):
        raise AwardError("endorsements must list each node once, ascending")
    return {node: entry[8:] for node, entry in zip(nodes, entries, strict=True)}


def _listed(node_id: int, score: float, bid: float, payment: float) -> Bidder:
    """A :class:`Bidder` whose fields were already checked, vectorised, while decoding."""
    bidder = object.__new__(Bidder)
    bidder.__dict__.update(node_id=node_id, score=score, bid=bid, payment=payment)
    return bidder


def _field(data: bytes) -> bytes:
    """Length-prefixed field (8-byte big-endian length)."""
    return struct.pack(">Q", len(data)) + data


def _signed_message(encoded: bytes) -> bytes:
    return _field(_SIGNATURE_LABEL) + encoded


def _public_key(key: object, what: str) -> Ed25519PublicKey:
    if not isinstance(key, bytes) or len(key) != IDENTITY_KEY_LENGTH:
        raise AwardError(f"{what} must be {IDENTITY_KEY_LENGTH} bytes")
    try:
        return Ed25519PublicKey.from_public_bytes(key)
    except ValueError as err:
        raise AwardError(f"{what} is not a valid Ed25519 key") from err


class _Reader:
    """Reads an award's encoding front to back; :class:`AwardError` on any shortfall."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._at = 0

    def take(self, size: int) -> bytes:
        if size < 0 or self._at + size > len(self._data):
            raise AwardError("the award is truncated")
        chunk = self._data[self._at : self._at + size]
        self._at += size
        return chunk

    def unpack(self, fmt: str) -> tuple[Any, ...]:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))

    def field(self) -> bytes:
        return self.take(int(self.unpack(">Q")[0]))

    def count(self, item_size: int) -> int:
        number = int(self.unpack(">Q")[0])
        if number * item_size > len(self._data) - self._at:
            raise AwardError("the award is truncated")
        return number

    def end(self) -> None:
        if self._at != len(self._data):
            raise AwardError("the award has trailing bytes")
