"""The market's award: the buyer's one signed statement per PASS session of who won and what each is paid, and
its checks.

The buyer fixes its terms (:class:`AwardTerms`: budget ``R``, cohort cap, budget rule, its Ed25519 public key) in the
PASS advertisement, before any count is summed. After the auction it signs one :class:`Award`: run, session, PASS
transcript, terms, the root of a hash tree over every survivor's score and bid (:class:`BidsTree`), the *decisive
head* of the ranking (:func:`~flmarket_flwr.pricing.auction.decisive_head`: the bidders the outcome depends on, with
their payments and, where the bidders hold identity keys, each one's signature on its bid) and the winners. What a
client receives is ``O(head + log E)``, not ``O(E)``. Each bidder checks it (:func:`check_award`: its own score and bid
in the tree as sent, ranked after the head unless in it, every named bidder a survivor, the outcome exactly
:func:`~flmarket_flwr.pricing.run_auction` over the head, and, as a winner with a directory, every head row signed by
its bidder) and endorses its digest, **once per session**: the award is never re-issued. A winner opens its counts
only for the award it endorsed, and with a directory only when a quorum of survivors endorsed it too
(:func:`binding_quorum`), which no two awards can both reach; so the buyer opens at most the winners of one
budget-feasible award, and the signed award is each winner's receipt. The argument is in docs/threat-model.md.
Pure: no Flower.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from flmarket_flwr.pass_protocol.identity import (
    IDENTITY_KEY_LENGTH,
    SIGNATURE_LENGTH,
    ed25519_verifies,
    verify_award_endorsement,
    verify_bid,
)
from flmarket_flwr.pricing import BUDGET_RULES, run_auction
from flmarket_flwr.pricing.auction import decisive_head

__all__ = [
    "Award",
    "AwardError",
    "AwardTerms",
    "Bidder",
    "BidsTree",
    "SignedAward",
    "binding_quorum",
    "opening_quorum",
    "bid_leaf",
    "verify_bid_proof",
    "build_award",
    "check_award",
    "count_endorsements",
    "pack_endorsements",
    "settle",
    "sign_award",
    "unpack_endorsements",
]

_AWARD_LABEL: Final[bytes] = b"flmarket/v1/award"
_SIGNED_BIDS_LABEL: Final[bytes] = b"flmarket/v1/award/signed-bids"
"""The label of an award whose head rows carry their bidders' signatures (the secure profile); an award without
them keeps :data:`_AWARD_LABEL` and the bytes it always had."""
_SIGNATURE_LABEL: Final[bytes] = b"flmarket/v1/award-signature"
_ENDORSEMENT_BYTES: Final[int] = 8 + SIGNATURE_LENGTH
_LEAF_LABEL: Final[bytes] = b"flmarket/v1/award-bid"
_NO_BID_LABEL: Final[bytes] = b"flmarket/v1/award-no-bid"
_NODE_LABEL: Final[bytes] = b"flmarket/v1/award-tree"
_HASH_BYTES: Final[int] = 32
_BIDDER_ROW: Final = np.dtype([("node", ">u8"), ("score", ">f8"), ("bid", ">f8"), ("payment", ">f8")])
"""One bidder in the encoding: node id, score, bid, payment (big-endian uint64 and IEEE-754 doubles)."""
_SIGNED_BIDDER_ROW: Final = np.dtype([*_BIDDER_ROW.descr, ("signature", f"V{SIGNATURE_LENGTH}")])
"""One bidder of an award with signed bids: :data:`_BIDDER_ROW` and the bidder's 64-byte signature on its bid."""
_INCLUDED_ROW: Final = np.dtype([("node", ">u8"), ("payment", ">f8")])
"""One included node in the encoding: node id and its fixed payment."""
_WHOLE_RULE_BIT: Final[int] = 1 << 63
"""The budget rule in the terms' encoding: the cohort cap is below ``2**63``, so its word's top bit is free; it is set
for ``"whole"`` and clear for ``"half"``, whose terms therefore encode exactly as before the rule was a term."""
_PAYMENT_REL_TOL: Final[float] = 1e-9
"""A listed payment must equal the one recomputed here to this relative tolerance (floating-point paths may
differ between machines); the winners must be the same exactly, and the payments' sum at most ``R``."""


class AwardError(ValueError):
    """An award that is malformed, not signed by the buyer, or not the one the rules give."""


@dataclass(frozen=True)
class AwardTerms:
    """The market's terms, announced before PASS: budget, cohort cap (``0``: none), the buyer's key and the
    auction's budget rule.

    Attributes
    ----------
    budget : float
        ``R > 0``, finite.
    cohort_cap : int
        At most this many winners; ``0`` for no cap.
    buyer_key : bytes
        The buyer's raw Ed25519 public key (32 bytes), which signs the award.
    budget_rule : str
        The auction's budget rule (:data:`~flmarket_flwr.pricing.BUDGET_RULES`): every bidder re-runs it when it
        checks the award.
    """

    budget: float
    cohort_cap: int
    buyer_key: bytes
    budget_rule: str = "half"

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
        if self.budget_rule not in BUDGET_RULES:
            raise AwardError(f"terms: the budget rule must be one of {list(BUDGET_RULES)}, got {self.budget_rule!r}")

    def encode(self) -> bytes:
        """Canonical bytes: the budget (IEEE-754 double), the cap with the rule in its top bit, the key."""
        rule = _WHOLE_RULE_BIT if self.budget_rule == "whole" else 0
        return struct.pack(">dQ", self.budget, self.cohort_cap | rule) + self.buyer_key

    @classmethod
    def decode_fields(cls, budget: float, cap_word: int, buyer_key: bytes) -> AwardTerms:
        """The terms whose :meth:`encode` gave ``budget``, the cap's word and the key."""
        rule = "whole" if cap_word & _WHOLE_RULE_BIT else "half"
        return cls(budget, cap_word & ~_WHOLE_RULE_BIT, buyer_key, rule)


@dataclass(frozen=True)
class Bidder:
    """One bidder of an award: its node id, the score and bid it sent, its payment (``0.0`` if it lost) and its
    Ed25519 signature on its bid (:func:`~flmarket_flwr.pass_protocol.identity.sign_bid`; ``b""`` where bidders hold
    no identity keys)."""

    node_id: int
    score: float
    bid: float
    payment: float
    signature: bytes = b""

    def __post_init__(self) -> None:
        """Validate every field."""
        if isinstance(self.node_id, bool) or not isinstance(self.node_id, int) or not 0 <= self.node_id < 2**64:
            raise AwardError(f"a bidder's node id must be an int in [0, 2**64), got {self.node_id!r}")
        for name in ("score", "bid", "payment"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise AwardError(f"node {self.node_id}: its {name} must be a finite number, got {value!r}")
            object.__setattr__(self, name, float(value) + 0.0)  # -0.0 becomes 0.0: one encoding per value
        if not isinstance(self.signature, bytes) or len(self.signature) not in (0, SIGNATURE_LENGTH):
            raise AwardError(f"node {self.node_id}: its signature must be b'' or {SIGNATURE_LENGTH} bytes")


@dataclass(frozen=True)
class Award:
    """The outcome of one auction, as the buyer signs it: once per PASS session.

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
    survivors : int
        ``|U3|``, the survivors of that session: the leaves of the bids tree, one per survivor in PASS-index order.
    bids_root : bytes
        The root of the :class:`BidsTree` over every survivor's score and bid (or its absence).
    head : tuple[Bidder, ...]
        The decisive head of the auction over all the bids (the bidders its outcome depends on), with their
        payments, ascending node id; every row signed by its bidder, or none.
    winners : tuple[int, ...]
        The winners' node ids, in selection order (all in the head).
    included : tuple[tuple[int, float], ...]
        The nodes the buyer included outside the auction and their fixed payments, ascending node id (none
        by default). They are no bidders; the terms' budget is what their payments left for the auction.
    """

    run_id: int
    session: bytes
    transcript: bytes
    terms: AwardTerms
    survivors: int
    bids_root: bytes
    head: tuple[Bidder, ...]
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
        count = self.survivors
        if isinstance(count, bool) or not isinstance(count, int) or not 0 < count < 2**32:
            raise AwardError(f"the award's survivor count must be an int in [1, 2**32), got {count!r}")
        if not isinstance(self.bids_root, bytes) or len(self.bids_root) != _HASH_BYTES:
            raise AwardError(f"the award's bids root must be {_HASH_BYTES} bytes")
        object.__setattr__(self, "head", tuple(self.head))
        object.__setattr__(self, "winners", tuple(self.winners))
        nodes = [bidder.node_id for bidder in self.head]
        if any(not isinstance(bidder, Bidder) for bidder in self.head) or nodes != sorted(set(nodes)):
            raise AwardError("the head must be Bidder entries in strictly ascending node id")
        if len({len(bidder.signature) for bidder in self.head}) > 1:
            raise AwardError("either every row of the head carries its bidder's signature or none does")
        if len(nodes) > count:
            raise AwardError("the head lists more bidders than the session has survivors")
        if len(set(self.winners)) != len(self.winners) or not set(self.winners) <= set(nodes):
            raise AwardError("the winners must be distinct bidders of the head")
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
        signed = self.signed_bids
        parts = [
            _field(_SIGNED_BIDS_LABEL if signed else _AWARD_LABEL),
            struct.pack(">Q", self.run_id),
            _field(self.session),
            _field(self.transcript),
            self.terms.encode(),
            struct.pack(">Q", self.survivors),
            self.bids_root,
            struct.pack(">Q", len(self.head)),
        ]
        if signed:
            rows = [(b.node_id, b.score, b.bid, b.payment, b.signature) for b in self.head]
            parts.append(np.array(rows, dtype=_SIGNED_BIDDER_ROW).tobytes())
        else:
            parts.append(np.array([(b.node_id, b.score, b.bid, b.payment) for b in self.head], _BIDDER_ROW).tobytes())
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
        label = reader.field()
        if label not in (_AWARD_LABEL, _SIGNED_BIDS_LABEL):
            raise AwardError("not an award (wrong label)")
        row = _SIGNED_BIDDER_ROW if label == _SIGNED_BIDS_LABEL else _BIDDER_ROW
        run_id = reader.unpack(">Q")[0]
        session, transcript = reader.field(), reader.field()
        budget, cap_word = reader.unpack(">dQ")
        terms = AwardTerms.decode_fields(budget, cap_word, reader.take(IDENTITY_KEY_LENGTH))
        survivors = int(reader.unpack(">Q")[0])
        bids_root = reader.take(_HASH_BYTES)
        table = np.frombuffer(reader.take(row.itemsize * reader.count(row.itemsize)), row)
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
            raise AwardError("the head must be in strictly ascending node id")
        if row is _SIGNED_BIDDER_ROW:
            if not nodes.size:
                raise AwardError("an award with signed bids lists at least one bidder")  # one encoding per award
            packed = table["signature"].tobytes()
            signatures = [packed[i : i + SIGNATURE_LENGTH] for i in range(0, len(packed), SIGNATURE_LENGTH)]
        else:
            signatures = [b""] * nodes.size
        columns = zip(nodes.tolist(), *numbers.tolist(), signatures, strict=True)
        head = tuple(_listed(*fields) for fields in columns)
        return cls(run_id, session, transcript, terms, survivors, bids_root, head, winners, included)

    def digest(self) -> bytes:
        """SHA-256 of the encoding: what the bidders endorse."""
        return hashlib.sha256(self.encode()).digest()

    @property
    def signed_bids(self) -> bool:
        """Whether the head's rows carry their bidders' signatures (the secure profile; all of them or none)."""
        return bool(self.head) and bool(self.head[0].signature)

    def bidder(self, node_id: int) -> Bidder | None:
        """The head's entry of ``node_id``, or ``None`` if it is not in the head (a loser, if it bid)."""
        return next((bidder for bidder in self.head if bidder.node_id == node_id), None)

    @property
    def payments(self) -> dict[int, float]:
        """Node id -> payment, for every bidder of the head (the others are paid 0; the included nodes' are in
        :attr:`included`)."""
        return {bidder.node_id: bidder.payment for bidder in self.head}


class BidsTree:
    """A binary SHA-256 hash tree over every survivor's score and bid, one leaf per survivor in PASS-index order.

    A leaf binds the survivor's PASS index and node id and either its score and bid or that it did not bid; the tree
    is padded with no-bid leaves to a power of two, and inner nodes are domain-separated from leaves. A survivor checks
    its own leaf against the signed root with ``log2 |U3|`` sibling hashes (:func:`verify_bid_proof`).

    Parameters
    ----------
    survivors : sequence of (int, int)
        ``(PASS index, node id)`` of every survivor, ascending PASS index.
    bids : mapping of int to (float, float)
        Node id -> ``(score, bid)`` of the survivors that bid.
    """

    def __init__(self, survivors: Sequence[tuple[int, int]], bids: Mapping[int, tuple[float, float]]) -> None:
        if not survivors:
            raise AwardError("a bids tree needs at least one survivor")
        indices = [index for index, _ in survivors]
        if indices != sorted(set(indices)):
            raise AwardError("the survivors must be in strictly ascending PASS index")
        listed = {node for _, node in survivors}
        if not set(bids) <= listed:
            raise AwardError(f"bidders {sorted(set(bids) - listed)[:5]} are not survivors of the session")
        leaves = [
            bid_leaf(index, node, *bids[node]) if node in bids else no_bid_leaf(index, node)
            for index, node in survivors
        ]
        self.rank = {node: rank for rank, (_, node) in enumerate(survivors)}
        width = 1 << max(0, (len(leaves) - 1).bit_length())
        leaves += [no_bid_leaf(0, 0)] * (width - len(leaves))
        self._levels = [leaves]
        while len(self._levels[-1]) > 1:
            level = self._levels[-1]
            self._levels.append([_inner(level[i], level[i + 1]) for i in range(0, len(level), 2)])

    @property
    def root(self) -> bytes:
        """The root hash the award signs."""
        return self._levels[-1][0]

    def proof(self, node_id: int) -> bytes:
        """The sibling hashes from ``node_id``'s leaf up to the root, concatenated (``32 log2 |U3|`` bytes)."""
        position, path = self.rank[node_id], []
        for level in self._levels[:-1]:
            path.append(level[position ^ 1])
            position //= 2
        return b"".join(path)


def bid_leaf(index: int, node_id: int, score: float, bid: float) -> bytes:
    """The leaf of a survivor that bid: its PASS index, node id, score and bid."""
    return hashlib.sha256(_field(_LEAF_LABEL) + struct.pack(">QQdd", index, node_id, score, bid)).digest()


def no_bid_leaf(index: int, node_id: int) -> bytes:
    """The leaf of a survivor that did not bid (and of the padding: index and node 0)."""
    return hashlib.sha256(_field(_NO_BID_LABEL) + struct.pack(">QQ", index, node_id)).digest()


def verify_bid_proof(root: bytes, survivors: int, rank: int, leaf: bytes, proof: object) -> bool:
    """Whether ``proof`` (:meth:`BidsTree.proof`) takes ``leaf`` at ``rank`` (0-based, among ``survivors``) to
    ``root``."""
    depth = max(0, (survivors - 1).bit_length())
    if not isinstance(proof, bytes) or len(proof) != _HASH_BYTES * depth or not 0 <= rank < survivors:
        return False
    node, position = leaf, rank
    for level in range(depth):
        sibling = proof[_HASH_BYTES * level : _HASH_BYTES * (level + 1)]
        node = _inner(node, sibling) if position % 2 == 0 else _inner(sibling, node)
        position //= 2
    return node == root


def _inner(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(_field(_NODE_LABEL) + left + right).digest()


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
        if not isinstance(self.encoded, bytes) or not isinstance(self.signature, bytes):
            raise AwardError("the award and its signature must be bytes")
        if len(self.signature) != SIGNATURE_LENGTH:
            raise AwardError(f"the award is not signed (a signature is {SIGNATURE_LENGTH} bytes)")
        award = Award.decode(self.encoded)
        if award.terms.buyer_key != buyer_key:
            raise AwardError("the award's terms name another buyer key")
        # the key is the terms', checked when the terms were read
        if not ed25519_verifies(buyer_key, self.signature, _signed_message(self.encoded)):
            raise AwardError("the award's signature does not verify under the buyer's key")
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
    """Winners (selection order) and payments of ``run_auction`` over ``(node, score, bid)`` under ``terms`` (its
    budget, cohort cap and budget rule).

    The bidders are taken in ascending node id (the auction's tie rule then favours the lower node id); a cohort cap
    larger than their number is lowered to it.

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
    try:
        result = run_auction(
            [s for _, s, _ in ordered],
            [b for _, _, b in ordered],
            terms.budget,
            num_winners=_cap(terms, len(nodes)),
            budget_rule=terms.budget_rule,
        )
    except ValueError as err:
        raise AwardError(f"the auction rejects the listed bids: {err}") from err
    payments.update({node: float(result.payments[position]) for position, node in enumerate(nodes)})
    return tuple(nodes[int(i)] for i in result.winners), payments


def head_of(terms: AwardTerms, bids: Sequence[tuple[int, float, float]]) -> tuple[list[int], bool]:
    """The decisive head of the auction over ``(node, score, bid)`` under ``terms`` (node ids, ascending), and
    whether it is closed (:func:`~flmarket_flwr.pricing.auction.decisive_head`)."""
    ordered = sorted(bids)
    if not ordered:
        return [], False
    try:
        positions, closed = decisive_head(
            [s for _, s, _ in ordered],
            [b for _, _, b in ordered],
            terms.budget,
            num_winners=_cap(terms, len(ordered)),
            budget_rule=terms.budget_rule,
        )
    except ValueError as err:
        raise AwardError(f"the auction rejects the listed bids: {err}") from err
    return sorted(ordered[int(i)][0] for i in positions), closed


def _cap(terms: AwardTerms, bidders: int) -> int | None:
    return None if terms.cohort_cap == 0 else min(terms.cohort_cap, bidders)


def build_award(
    run_id: int,
    session: bytes,
    transcript: bytes,
    terms: AwardTerms,
    survivors: Sequence[tuple[int, int]],
    bids: Mapping[int, tuple[float, float]],
    included: Mapping[int, float] | None = None,
    signatures: Mapping[int, bytes] | None = None,
) -> tuple[Award, BidsTree]:
    """The award of the auction over ``bids`` (node -> ``(score, bid)``), by :func:`settle`, and its bids tree.

    ``survivors`` are the session's ``(PASS index, node id)``, ascending index; every bidder must be one. The award
    lists the decisive head of the auction over all the bids (:func:`head_of`), each row with its bidder's signature
    on its bid where ``signatures`` (node -> 64 bytes) are given (then every bidder must have one), and records the
    ``included`` nodes (node -> fixed payment, outside the auction: ``terms.budget`` is what they left).
    """
    if signatures is not None and not set(bids) <= set(signatures):
        raise AwardError(f"bidders {sorted(set(bids) - set(signatures))[:5]} have no signature on their bids")
    tree = BidsTree(survivors, bids)
    rows = [(node, score, bid) for node, (score, bid) in bids.items()]
    winners, payments = settle(terms, rows)
    head, _ = head_of(terms, rows)
    fixed = tuple((node, float(payment)) for node, payment in sorted((included or {}).items()))
    award = Award(
        run_id,
        session,
        transcript,
        terms,
        len(survivors),
        tree.root,
        tuple(
            Bidder(node, *bids[node], payments[node], b"" if signatures is None else signatures[node]) for node in head
        ),
        winners,
        fixed,
    )
    return award, tree


def check_award(
    award: Award,
    *,
    run_id: int,
    session: bytes,
    transcript: bytes,
    terms: AwardTerms,
    survivors: int,
    rank: int,
    index: int,
    node_id: int,
    score: float,
    bid: float,
    proof: object,
    survivor_nodes: Collection[int] | None = None,
    bid_signers: Mapping[int, tuple[int, bytes]] | None = None,
) -> None:
    """A bidder's checks of an award before it endorses it.

    The run, session, transcript, terms and survivor count are its own; its own leaf (PASS ``index``, node, score and
    bid as it sent them) is in the signed bids tree at its ``rank`` among the survivors; if the head lists it, with
    its score and bid as sent, and if not, the head is closed and it ranks after the whole head (so it cannot change
    the outcome); the head is exactly its own decisive head, every entry eligible (bid within ``R``) and, where the
    client knows the survivors' node ids (``survivor_nodes``), a survivor; the winners and payments are :func:`settle`
    over the head (so the total is within ``R`` and every payment is a critical value); and, where the client holds
    the session's bidders' keys (``bid_signers``: node id -> its PASS index and Ed25519 public key, for every bidder
    the head names; the secure profile) and the award names it a winner, that every head row carries its bidder's
    signature on that bid in this run, session and transcript. Only a winner opens anything, and only for the award it
    endorsed, so a winner's check is what keeps a row its bidder did not sign from opening anyone; a loser's
    endorsement opens nothing and skips it (docs/threat-model.md, "The binding award", step (6)).

    Raises
    ------
    AwardError
        Naming the first check that fails.
    """
    if (award.run_id, award.session, award.transcript) != (run_id, session, transcript):
        raise AwardError("the award is not for this client's run, PASS session and transcript")
    if award.terms != terms:
        raise AwardError("the award's terms are not those announced at the advertisement")
    if award.survivors != survivors:
        raise AwardError("the award's survivor count is not that of the session this client took part in")
    if not verify_bid_proof(award.bids_root, survivors, rank, bid_leaf(index, node_id, score, bid), proof):
        raise AwardError("the award's bids tree does not hold this client's score and bid as it sent them")
    rows = [(b.node_id, b.score, b.bid) for b in award.head]
    if survivor_nodes is not None and not {node for node, _, _ in rows} <= set(survivor_nodes):
        raise AwardError("the award names a bidder that is not a survivor of the session")
    if any(row_bid > terms.budget for _, _, row_bid in rows):
        raise AwardError("the award's head lists a bid above the budget, which cannot take part in the auction")
    own = award.bidder(node_id)
    if own is not None and (own.score, own.bid) != (score, bid):
        raise AwardError("the award does not list this client's score and bid as it sent them")
    head, closed = head_of(terms, rows)
    if head != [node for node, _, _ in rows]:
        raise AwardError("the award's head is not the auction's decisive head")
    if own is None and bid <= terms.budget:
        with_own, still_closed = head_of(terms, [*rows, (node_id, score, bid)])
        if not (closed and still_closed and with_own == head):
            raise AwardError("this client ranks inside the award's head but is not listed there")
    winners, payments = settle(terms, rows)
    if winners != award.winners:
        raise AwardError("the award's winners are not the auction's over the listed bids")
    listed = np.array([bidder.payment for bidder in award.head])
    due = np.array([payments[bidder.node_id] for bidder in award.head])
    tolerance = np.maximum(_PAYMENT_REL_TOL * np.maximum(np.abs(listed), np.abs(due)), 1e-12)  # math.isclose's rule
    wrong = np.flatnonzero(np.abs(listed - due) > tolerance)
    if wrong.size:
        raise AwardError(f"node {award.head[int(wrong[0])].node_id}'s payment is not the auction's")
    if math.fsum(award.payments.values()) > terms.budget * (1.0 + 1e-12):
        raise AwardError("the award's payments exceed the budget")
    if bid_signers is not None and node_id in award.winners:
        for bidder in award.head:
            signer = bid_signers.get(bidder.node_id)
            if signer is None:
                raise AwardError(f"node {bidder.node_id} of the award's head has no key or PASS index in this session")
            try:
                verify_bid(
                    signer[1],
                    bidder.signature,
                    run_id=run_id,
                    session=session,
                    transcript=transcript,
                    index=signer[0],
                    node_id=bidder.node_id,
                    score=bidder.score,
                    bid=bidder.bid,
                )
            except ValueError as err:
                raise AwardError(
                    f"node {bidder.node_id}'s row in the award's head is not a bid it signed: {err}"
                ) from err


def binding_quorum(survivors: int, colluders: int) -> int:
    """Endorsements an award needs, the winner's own included, before a winner opens its counts.

    ``floor((|U3| + c) / 2) + 1`` distinct survivors: each honest survivor endorses one award per session and the
    ``c`` colluders may endorse every award, so two awards that both reached it would need ``2 * quorum - c > |U3| - c``
    honest endorsers, more than there are. Hence at most one award of a session opens anything.
    """
    if survivors < 1 or colluders < 0:
        raise AwardError(f"a quorum needs survivors >= 1 and colluders >= 0, got {survivors} and {colluders}")
    return (survivors + colluders) // 2 + 1


def opening_quorum(quorum: int, survivors: int, tolerance: int) -> int:
    """Endorsements a winner needs before it opens: the binding ``quorum`` and, with a ``tolerance`` ``d >= 0``
    (node config ``market-endorse-tolerance``), all but ``d`` of the award's ``survivors``.

    Every honest survivor that the buyer leaves out of an award it should be in (dropped from the head, or listed as
    a bid that never arrived) refuses to endorse it, and that refusal is the only trace: so a winner that needs
    ``S - d`` endorsements, counted over the survivors it was shown, opens only for an award that leaves at most ``d``
    of them out, whatever the buyer learned from the bids (docs/threat-model.md, "The binding award"). ``-1``: the
    quorum alone, which tolerates ``S - quorum`` refusals.
    """
    if tolerance < -1:
        raise AwardError(f"an endorsement tolerance is >= 0, or -1 for the quorum alone, got {tolerance}")
    return quorum if tolerance < 0 else max(quorum, survivors - tolerance)


def count_endorsements(
    digest: bytes,
    endorsements: Mapping[int, bytes],
    directory: Mapping[int, bytes],
    own_node: int,
    eligible: Collection[int] | None = None,
    enough: int | None = None,
) -> int:
    """How many of ``endorsements`` (node -> signature) are valid signatures on ``digest`` by directory members other
    than ``own_node`` (each node counted once), among the ``eligible`` nodes if given (the session's survivors).

    With ``enough``, the count stops there: a winner that needs ``q - 1`` others' endorsements verifies until it has
    them, not every one it is sent (the rest cannot change its decision).
    """
    valid = 0
    for node, signature in endorsements.items():
        if enough is not None and valid >= enough:
            break
        if node == own_node or node not in directory or (eligible is not None and node not in eligible):
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


def _listed(node_id: int, score: float, bid: float, payment: float, signature: bytes) -> Bidder:
    """A :class:`Bidder` whose fields were already checked, vectorised, while decoding."""
    bidder = object.__new__(Bidder)
    bidder.__dict__.update(node_id=node_id, score=score, bid=bid, payment=payment, signature=signature)
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
