"""Wire format of the market phase: message types, record keys, typed records, refusals and reply validation.

Every market message, in both directions, carries one ``ConfigRecord`` under :data:`RECORD_KEY`; each step is
a Flower ``query`` message ``query.<action>`` (:func:`message_type` lists the actions and what each carries).
The bid, endorse, audit and award steps and the nodes' replies are frozen records (:class:`BidRequest`, ...,
:class:`TagsReply`) beside PASS's (:mod:`flmarket_flwr.pass_protocol.messages`), each with one ``to_record`` and
one ``from_record``. A node's refusal is an error reply whose reason :func:`refusal_reason` writes and
:func:`label_counts_failure` reads. The helpers turn one reply into typed values or raise :class:`ReplyError`
with a reason that the server logs before excluding the node. Buyer and node meet here, never importing each
other.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Self

from flwr.app import ConfigRecord, Message, MessageType, RecordDict

__all__ = [
    "ACTIONS",
    "AdvertiseTerms",
    "AuditReply",
    "AuditRequest",
    "AwardReply",
    "AwardRequest",
    "BidReply",
    "BidRequest",
    "BindReply",
    "BindRequest",
    "EndorseReply",
    "EndorseRequest",
    "TagsReply",
    "ACTION_ADVERTISE",
    "ACTION_AUDIT",
    "ACTION_AWARD",
    "ACTION_BID",
    "ACTION_BIND",
    "ACTION_DRAW",
    "ACTION_ENDORSE",
    "ACTION_MASK",
    "ACTION_SHARE",
    "ACTION_SURVIVORS",
    "ACTION_TAGS",
    "ACTION_UNMASK",
    "ERROR_PREFIX",
    "KEY_ACCEPTED",
    "KEY_AWARD",
    "KEY_AWARD_DIGEST",
    "KEY_AWARD_SIGNATURE",
    "KEY_BID_PROOF",
    "KEY_BID",
    "KEY_BID_SIGNATURE",
    "KEY_BUDGET",
    "KEY_BUYER_KEY",
    "KEY_BUDGET_RULE",
    "KEY_COHORT_CAP",
    "KEY_COUNTS",
    "KEY_GLOBAL_COUNTS",
    "KEY_ENDORSEMENT",
    "KEY_ENDORSEMENTS",
    "KEY_NONCE",
    "KEY_NUM_CLIENTS",
    "KEY_PAYMENT",
    "KEY_ROSTER_NODE_IDS",
    "KEY_ROSTER_WANTED",
    "KEY_SCORE",
    "KEY_SESSION",
    "KEY_TRANSCRIPT",
    "KEY_WON",
    "LABEL_COUNTS_FAILED",
    "LEDGER_REFUSED",
    "PRIVACY_BUDGET_REFUSED",
    "REQUEST_REFUSED",
    "RECORD_KEY",
    "ReplyError",
    "RosterNodeIds",
    "RosterWanted",
    "TagsRequest",
    "label_counts_failure",
    "make_content",
    "message_type",
    "read_config",
    "refusal_reason",
]

# --- Actions (message type ``query.<action>``) -------------------------------------------------
ACTION_ADVERTISE: Final = "market_advertise"
ACTION_DRAW: Final = "market_draw"
"""The sparse secure mode only (docs/threat-model.md, "The sparse secure profile"): ``U1`` is fixed, each client draws
its own out-neighbours and signs the draw."""
ACTION_SHARE: Final = "market_share"
ACTION_MASK: Final = "market_mask"
ACTION_SURVIVORS: Final = "market_survivors"
ACTION_UNMASK: Final = "market_unmask"
ACTION_BID: Final = "market_bid"
ACTION_ENDORSE: Final = "market_endorse"
ACTION_AUDIT: Final = "market_audit"
ACTION_AWARD: Final = "market_award"
ACTION_TAGS: Final = "market_tags"
ACTION_BIND: Final = "market_bind"
"""With a directory keyed by member (``identity_cli make --members``): before PASS, each node proves which member it
is for this run, then every node is sent the bindings (:func:`~flmarket_flwr.pass_protocol.identity.bind_members`)."""
"""Before a market whose buyer includes or excludes nodes by tag: each connected node says its ``market-tag``."""
ACTIONS: Final = (
    ACTION_ADVERTISE,
    ACTION_DRAW,
    ACTION_SHARE,
    ACTION_MASK,
    ACTION_SURVIVORS,
    ACTION_UNMASK,
    ACTION_BID,
    ACTION_ENDORSE,
    ACTION_AUDIT,
    ACTION_AWARD,
    ACTION_TAGS,
    ACTION_BIND,
)

# --- Record keys ---------------------------------------------------------------------------------
RECORD_KEY: Final = "flmarket"
"""Key of the single ``ConfigRecord`` in every market message (and in the client's state).

The four PASS steps carry the fields of the :mod:`flmarket_flwr.pass_protocol.messages` dataclasses
(``to_record()``); every other item is a field of a record below, whose key is its field name. The ``KEY_``
names spell those keys for code that crafts or inspects raw records (tests, red-team apps); the records never
read them, and ``tests/test_market_messages.py`` checks that each names a record's field. :data:`KEY_WON` and
:data:`KEY_PAYMENT` are not on the wire: with the award and its signature they are the node's receipt in its
own state (:func:`~flmarket_flwr.market.read_award`)."""

KEY_ROSTER_NODE_IDS: Final = "roster-node-ids"
KEY_ROSTER_WANTED: Final = "roster-wanted"
"""Advertise and share steps: :class:`RosterWanted` and :class:`RosterNodeIds`."""
KEY_TAG: Final = "tag"
"""Tags step reply: the node's ``market-tag`` (``""``: none)."""
KEY_SESSION: Final = "session"
KEY_GLOBAL_COUNTS: Final = "global-counts"
KEY_NUM_CLIENTS: Final = "num-clients"
KEY_TRANSCRIPT: Final = "transcript"
KEY_SCORE: Final = "score"
KEY_BID: Final = "bid"
KEY_BID_SIGNATURE: Final = "bid-signature"
"""Bid reply, from a node with an identity key: its Ed25519 signature on its score and bid
(:func:`~flmarket_flwr.pass_protocol.identity.sign_bid`), which the award's head carries."""
KEY_COUNTS: Final = "counts"
KEY_NONCE: Final = "nonce"
KEY_WON: Final = "won"
KEY_PAYMENT: Final = "payment"
KEY_ACCEPTED: Final = "accepted"
KEY_BUDGET: Final = "terms-budget"
KEY_COHORT_CAP: Final = "terms-cohort-cap"
KEY_BUYER_KEY: Final = "terms-buyer-key"
KEY_BUDGET_RULE: Final = "terms-budget-rule"
"""Advertise step: the market's terms (:class:`~flmarket_flwr.market.wire.award.AwardTerms`), fixed before PASS (the
budget rule only when it is not the paper's ``"half"``)."""
KEY_AWARD: Final = "award"
KEY_AWARD_SIGNATURE: Final = "award-signature"
"""Endorse, audit and award steps: the award's canonical encoding and the buyer's signature on it."""
KEY_AWARD_DIGEST: Final = "award-digest"
"""Award step, to a client that endorsed the final award: its digest, in place of the award the client holds."""
KEY_BID_PROOF: Final = "bid-proof"
"""Endorse step: the bidder's path in the award's bids tree, its own score and bid under the signed root."""
KEY_ENDORSEMENT: Final = "endorsement"
KEY_ENDORSEMENTS: Final = "endorsements"
"""Endorse reply: one signature on the award's digest; audit request: all of them, packed
(:func:`~flmarket_flwr.market.wire.award.pack_endorsements`)."""


# --- Refusals: the reason of a node's error reply ----------------------------------------------------------------
ERROR_PREFIX: Final = "flmarket: "
"""Prefix of the reason of every error reply sent by the market handlers: ``flmarket: <action>: <detail>``."""
REQUEST_REFUSED: Final = "request refused"
"""The detail of a refusal whose reason stays in the node's own log."""
LEDGER_REFUSED: Final = "refused by the node's release ledger"
"""The detail of a refusal by the node's release ledger (the file and the sets stay in its log)."""
PRIVACY_BUDGET_REFUSED: Final = "refused by the node's privacy budget"
"""The detail of a refusal of a release past the node's privacy budget (the buyer stops re-launching on it)."""
LABEL_COUNTS_FAILED: Final = "get_label_counts raised "
"""Starts the detail of a refusal whose cause is the app's own label-count callback (then its exception)."""


def refusal_reason(action: str, detail: str) -> str:
    """The reason of a node's error reply to ``action``: ``flmarket: <action>: <detail>``."""
    return f"{ERROR_PREFIX}{action}: {detail}"


def label_counts_failure(reason: str) -> str | None:
    """The app's label-count exception named in an error reply's ``reason`` (``None`` if it names none).

    Flower's ``Error`` carries a code and a reason only, so the cause travels in the reason's text, as the node
    wrote it (:data:`LABEL_COUNTS_FAILED`).
    """
    start = reason.find(LABEL_COUNTS_FAILED)
    return None if start < 0 else reason[start:]


class ReplyError(ValueError):
    """A reply that cannot be used; ``str(error)`` is the reason logged by the server."""


# --- Typed records: the market steps' requests and replies beside PASS's ------------------------------------------
def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)  # type: ignore[arg-type]


_FIELD_CHECKS: Final[dict[str, Callable[[Any], bool]]] = {
    "bool": lambda value: isinstance(value, bool),
    "bytes": lambda value: isinstance(value, bytes),
    "float": _is_number,
    "int": _is_int,
    "str": lambda value: isinstance(value, str),
    "list[int]": lambda value: isinstance(value, list) and all(_is_int(item) for item in value),
}


class _MarketRecord:
    """Dataclass mixin: a market record as the ``ConfigRecord`` items it travels as, and back.

    Each field travels under its name with ``_`` written ``-`` (``global_counts`` as ``global-counts``), in field
    order: the order of the record's items on the wire. An optional field (``bytes | None``) that is ``None``
    does not travel.
    """

    @classmethod
    def wire_keys(cls) -> tuple[str, ...]:
        """The keys of the record's items, in wire order."""
        return tuple(_wire_key(field.name) for field in dataclasses.fields(cls))  # type: ignore[arg-type]

    def to_record(self) -> dict[str, Any]:
        """The record's items, keyed as on the wire."""
        items = ((_wire_key(field.name), getattr(self, field.name)) for field in dataclasses.fields(self))  # type: ignore[arg-type]
        return {key: value for key, value in items if value is not None}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Self:
        """Parse and type-check the items of a record made by :meth:`to_record`.

        Raises
        ------
        ReplyError
            Naming the record and the key, if an item is missing or of the wrong type (a float item takes an int
            as a float; no item takes a bool for a number).
        """
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):  # type: ignore[arg-type]
            key, kind = _wire_key(field.name), str(field.type)
            optional = kind.endswith(" | None")
            kind = kind.removesuffix(" | None")
            if key not in record:
                if optional:
                    values[field.name] = None
                    continue
                raise ReplyError(f"{cls.__name__} lacks '{key}'")
            value = record[key]
            if not _FIELD_CHECKS[kind](value):
                raise ReplyError(f"{cls.__name__} '{key}' must be a finite {kind}" if kind == "float" else
                                 f"{cls.__name__} '{key}' must be {kind}, got {type(value).__name__}")  # fmt: skip
            values[field.name] = float(value) if kind == "float" else value
        return cls(**values)


def _wire_key(name: str) -> str:
    return name.replace("_", "-")


@dataclass(frozen=True)
class AdvertiseTerms(_MarketRecord):
    """Advertise step, buyer -> node, beside PASS's advertise request: the market's terms
    (:class:`~flmarket_flwr.market.wire.award.AwardTerms`), fixed before PASS; a node keeps them in its state. The
    budget rule travels only when it is not the paper's (``None``: ``"half"``), so the default terms' items are as they
    were before the rule was a term."""

    terms_budget: float
    terms_cohort_cap: int
    terms_buyer_key: bytes
    terms_budget_rule: str | None = None


@dataclass(frozen=True)
class RosterWanted(_MarketRecord):
    """Advertise step, node -> buyer, beside PASS's advertisement: the node wants the roster's node ids."""

    roster_wanted: bool


@dataclass(frozen=True)
class RosterNodeIds(_MarketRecord):
    """Share step, buyer -> the nodes that asked (:class:`RosterWanted`), beside PASS's share request: the roster's
    node ids in PASS-index order as big-endian uint64 words (one item of ``8 E`` bytes, for Flower's record checks);
    their ``roster_fingerprint`` is the advertise request's ``roster``."""

    roster_node_ids: bytes | None = None


@dataclass(frozen=True)
class TagsRequest(_MarketRecord):
    """Tags step, buyer -> node: an empty request for the node's ``market-tag``."""


@dataclass(frozen=True)
class BindRequest(_MarketRecord):
    """Bind step, buyer -> node: first empty (the node's binding is asked for), then with every node's binding,
    packed (:func:`~flmarket_flwr.pass_protocol.identity.pack_member_bindings`), for the node to check and keep."""

    bindings: bytes | None = None


@dataclass(frozen=True)
class BindReply(_MarketRecord):
    """Bind step, node -> buyer: the member the node is and its signature binding it to the node id in this run."""

    member: int
    member_signature: bytes


@dataclass(frozen=True)
class BidRequest(_MarketRecord):
    """Bid step, buyer -> node: the session, its noisy or exact sum ``N_s``, its survivors ``E`` and transcript."""

    session: bytes
    global_counts: list[int]
    num_clients: int
    transcript: bytes


@dataclass(frozen=True)
class BidReply(_MarketRecord):
    """Bid step, node -> buyer: the node's score against ``N_s`` and its bid, and, from a node with an identity key,
    its signature on them in this run, session and transcript (absent without one: the default profile's bytes)."""

    score: float
    bid: float
    bid_signature: bytes | None = None


@dataclass(frozen=True)
class EndorseRequest(_MarketRecord):
    """Endorse step, buyer -> bidder: the buyer-signed award and the bidder's path in its bids tree."""

    session: bytes
    award: bytes
    award_signature: bytes
    bid_proof: bytes


@dataclass(frozen=True)
class EndorseReply(_MarketRecord):
    """Endorse step, node -> buyer: its Ed25519 endorsement of the award's digest (``b""`` without a key)."""

    endorsement: bytes


@dataclass(frozen=True)
class AuditRequest(_MarketRecord):
    """Audit step, buyer -> winner: the award it endorsed (the winner holds its signature already) and, with a
    directory, the endorsements it gathered (:func:`~flmarket_flwr.market.wire.award.pack_endorsements`)."""

    session: bytes
    award: bytes
    award_signature: bytes | None = None
    endorsements: bytes | None = None


@dataclass(frozen=True)
class AuditReply(_MarketRecord):
    """Audit step, winner -> buyer: its label counts and the nonce that opens its counts commitment."""

    counts: list[int]
    nonce: bytes


@dataclass(frozen=True)
class AwardRequest(_MarketRecord):
    """Award step, buyer -> every node it contacted: the final award and its signature (to a node that endorsed
    it, the award's digest in its place; neither if the market aborted)."""

    session: bytes
    award: bytes | None = None
    award_digest: bytes | None = None
    award_signature: bytes | None = None


@dataclass(frozen=True)
class AwardReply(_MarketRecord):
    """Award step, node -> buyer: the final award was taken (its receipt kept)."""

    accepted: bool


@dataclass(frozen=True)
class TagsReply(_MarketRecord):
    """Tags step, node -> buyer: the node's ``market-tag`` (``""``: none)."""

    tag: str


def message_type(action: str) -> str:
    """Return the Flower message type ``query.<action>`` of a market action.

    Parameters
    ----------
    action : str
        One of :data:`ACTIONS`.

    Returns
    -------
    str
        The message type, e.g. ``"query.market_bid"``.

    Notes
    -----
    Every market message, in both directions, carries one ``ConfigRecord`` under :data:`RECORD_KEY`. Each
    step is a Flower ``query`` message (message type ``query.<action>``):

    ====================  ==========================================  ==========================================
    Action                Server -> client                            Client -> server (reply)
    ====================  ==========================================  ==========================================
    ``market_advertise``  session, PASS index, ``C``, count bound,    cipher and mask public keys (32 bytes
                          graph-seed commitment, roster fingerprint;  each), Ed25519 signature (or empty);
                          the terms: budget, cohort cap, buyer key    with a release ledger: ``roster-wanted``
    ``market_share``      participants, graph seed, the neighbours'   one encrypted share pair per neighbour,
                          keys (and signatures, node ids); to the     and a digest of each pair
                          clients that asked, the roster's node ids
                          (in index order)
    ``market_mask``       the share ciphertexts addressed to it,      masked counts ``Y_e`` (``C`` little-endian
                          their digests and signatures                uint64 words), counts commitment, the
                                                                      senders whose shares did not open, each
                                                                      with the proven channel secret
    ``market_survivors``  survivors, dropped (only with an identity    Ed25519 signature on that set
                          directory: the consistency round)
    ``market_unmask``     survivors, dropped (and the neighbours'     self-mask shares of survivors, key
                          signatures on them)                         shares of the dropped
    ``market_bid``        session, ``N_s``, ``E``, transcript hash    score, bid (with an identity key: its
                                                                      Ed25519 signature on them)
    ``market_endorse``    session, the award and the buyer's          Ed25519 endorsement of the award's digest
                          signature on it                             (empty without an identity key)
    ``market_audit``      session, the award, its signature and the   the counts and the commitment nonce
                          endorsements (node id + signature each)
    ``market_award``      session, the final award and its            accepted
                          signature (to a client that endorsed it:
                          its digest instead of the award; none if
                          the market aborted)
    ====================  ==========================================  ==========================================
    """
    if action not in ACTIONS:
        raise ValueError(f"unknown market action {action!r}; expected one of {ACTIONS}")
    return f"{MessageType.QUERY}.{action}"


def make_content(config: ConfigRecord) -> RecordDict:
    """Wrap a market ``ConfigRecord`` into message content under :data:`RECORD_KEY`."""
    return RecordDict({RECORD_KEY: config})


def read_config(reply: Message) -> ConfigRecord:
    """Return the market ``ConfigRecord`` of a reply.

    Raises
    ------
    ReplyError
        If the reply carries an error, has no content, or lacks the record.
    """
    if reply.has_error():
        raise ReplyError(f"error reply (code {reply.error.code}): {reply.error.reason}{_no_handlers_hint(reply)}")
    if not reply.has_content():
        raise ReplyError("reply has neither content nor error")
    record = reply.content.get(RECORD_KEY)
    if not isinstance(record, ConfigRecord):
        raise ReplyError(f"reply has no ConfigRecord '{RECORD_KEY}'")
    return record


_NO_HANDLER_ERRORS: Final = ("No query function registered with name 'market_", "Invalid message type: query.market_")
"""Flower's own errors for a market message that no handler took: a Message-API app without the market's handlers, a
``client_fn`` app without the market's mod."""


def _no_handlers_hint(reply: Message) -> str:
    """What to do, when ``reply`` is Flower's error for a ``ClientApp`` that has no market handlers (else ``""``)."""
    reason = reply.error.reason or ""
    if not any(error in reason for error in _NO_HANDLER_ERRORS):
        return ""
    return (
        " (the node's ClientApp has no market handlers: register_market_handlers(app, label_counts) in a Message-API "
        "app, ClientApp(client_fn=..., mods=[market_mod(label_counts)]) in a client_fn app)"
    )
