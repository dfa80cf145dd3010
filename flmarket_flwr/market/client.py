"""Client side of the market: ``query`` handlers added to an existing ``ClientApp``.

Usage::

    from flwr.clientapp import ClientApp
    from flmarket_flwr.market import CostBasedBid, register_market_handlers

    app = ClientApp()

    @app.train()
    def train(msg, context): ...

    register_market_handlers(app, get_label_counts=my_label_counts, bid_policy=CostBasedBid(0.01))

What stays on the client
    The label counts ``N_e`` never leave the client: the server only receives the
    32-byte public key, the masked vector ``Y_e`` (uniform-looking on its own), the
    score and the bid. The X25519 private key lives only in ``context.state`` (a
    ``ConfigRecord`` under :data:`~flmarket_flwr.market.messages.RECORD_KEY`), keyed by
    the PASS session, because in deployment every message runs in a fresh process.
    The key is deleted as soon as it has masked the counts once, so one key can
    never mask two different participant sets (which would let the server strip
    the masks by subtraction); all PASS keys are purged when the award arrives.

Errors
    A request the client cannot serve (malformed request, label counts of the
    wrong length, unknown or already-used PASS session, no data to bid on, ...)
    is answered with an error reply (``ErrorCode.CLIENT_APP_RAISED_EXCEPTION``,
    reason prefixed with ``"flmarket: "``) and logged at WARNING on the client;
    the server excludes the node with that reason. Other exceptions propagate
    and Flower turns them into error replies as usual.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from logging import WARNING

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from numpy.typing import NDArray

from flwr.app import ConfigRecord, Context, Error, Message
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode
from flwr.common.logger import log

from flmarket_flwr.market.bidding import DEFAULT_COST_PER_SAMPLE, BidPolicy, CostBasedBid
from flmarket_flwr.market.messages import (
    ACTION_AWARD,
    ACTION_BID,
    ACTION_KEYS,
    ACTION_MASK,
    KEY_ACCEPTED,
    KEY_BID,
    KEY_GLOBAL_COUNTS,
    KEY_INDICES,
    KEY_MASKED_COUNTS,
    KEY_NUM_CLASSES,
    KEY_NUM_CLIENTS,
    KEY_PASS_INDEX,
    KEY_PAYMENT,
    KEY_PUBLIC_KEY,
    KEY_PUBLIC_KEYS,
    KEY_SCORE,
    KEY_SESSION,
    KEY_WON,
    RECORD_KEY,
    encode_masked_counts,
    make_content,
)
from flmarket_flwr.pass_protocol import PassParticipant, validate_counts
from flmarket_flwr.pricing import score as compute_score

__all__ = ["ERROR_PREFIX", "MarketAward", "read_award", "register_market_handlers"]

ERROR_PREFIX = "flmarket: "
"""Prefix of the reason of every error reply sent by the market handlers."""

_STATE_KEY_PREFIX = "pass-key/"
_STATE_INDEX_PREFIX = "pass-index/"

LabelCountsFn = Callable[[Context], NDArray[np.integer]]


class _RequestError(ValueError):
    """A market request the client refuses to serve; answered with an error reply."""


@dataclass(frozen=True)
class MarketAward:
    """What a client learnt from the market, as kept in its ``context.state``.

    Attributes
    ----------
    won : bool
        Whether the client won the auction (and will be asked to train).
    payment : float
        The payment it receives (``0.0`` for a loser).
    score : float or None
        The score it reported (``None`` if it never reached the bid step).
    bid : float or None
        The bid it reported.
    """

    won: bool
    payment: float
    score: float | None
    bid: float | None


def read_award(context: Context) -> MarketAward | None:
    """Return the market award stored in a client's ``context.state``, or ``None``.

    Parameters
    ----------
    context : Context
        The client's context (e.g. inside a ``train`` handler).

    Returns
    -------
    MarketAward or None
        ``None`` until the client has received its award message.
    """
    record = context.state.config_records.get(RECORD_KEY)
    if record is None or KEY_WON not in record:
        return None
    score = record.get(KEY_SCORE)
    bid = record.get(KEY_BID)
    return MarketAward(
        won=bool(record[KEY_WON]),
        payment=float(record.get(KEY_PAYMENT, 0.0)),  # type: ignore[arg-type]
        score=None if score is None else float(score),  # type: ignore[arg-type]
        bid=None if bid is None else float(bid),  # type: ignore[arg-type]
    )


def register_market_handlers(
    app: ClientApp,
    get_label_counts: LabelCountsFn,
    bid_policy: BidPolicy | None = None,
) -> None:
    """Add the market's ``query`` handlers to an existing ``ClientApp``.

    Registers ``query.market_keys``, ``query.market_mask``, ``query.market_bid``
    and ``query.market_award``.

    Parameters
    ----------
    app : ClientApp
        A ``ClientApp`` built with decorators (not with a legacy ``client_fn``).
    get_label_counts : Callable[[Context], numpy.ndarray]
        Returns the client's per-class label counts ``N_e`` (shape ``(C,)``,
        non-negative integers). Called once per market message, in a possibly
        fresh process: it must return the same counts every time.
    bid_policy : BidPolicy, optional
        The client's bid policy; defaults to
        ``CostBasedBid(DEFAULT_COST_PER_SAMPLE)`` (1.0 per sample, 20 % markup).

    Raises
    ------
    ValueError
        If one of the actions is already registered on ``app``, or ``app`` uses
        a ``client_fn`` (Flower's own checks).
    """
    handlers = _MarketHandlers(
        get_label_counts=get_label_counts,
        bid_policy=bid_policy if bid_policy is not None else CostBasedBid(DEFAULT_COST_PER_SAMPLE),
    )
    app.query(ACTION_KEYS)(handlers.keys)
    app.query(ACTION_MASK)(handlers.mask)
    app.query(ACTION_BID)(handlers.bid)
    app.query(ACTION_AWARD)(handlers.award)


class _MarketHandlers:
    """The four market handlers, sharing the label-count source and the bid policy."""

    def __init__(self, get_label_counts: LabelCountsFn, bid_policy: BidPolicy) -> None:
        self._get_label_counts = get_label_counts
        self._bid_policy = bid_policy

    # --- Handlers ------------------------------------------------------------------------------
    def keys(self, message: Message, context: Context) -> Message:
        """PASS round 1: make a fresh key pair, keep the private key locally, reply the public key."""
        try:
            request = _request(message)
            index = _int_field(request, KEY_PASS_INDEX, minimum=0)
            session = _session_field(request)
            counts = self._label_counts(context, _int_field(request, KEY_NUM_CLASSES, minimum=1))
            private_key = X25519PrivateKey.generate()
            participant = PassParticipant(index, counts, session, private_key=private_key)
        except (ValueError, TypeError, KeyError) as err:
            return _error_reply(message, ACTION_KEYS, err)
        state = _state_record(context)
        state[_STATE_KEY_PREFIX + session.hex()] = private_key.private_bytes_raw()
        state[_STATE_INDEX_PREFIX + session.hex()] = index
        return _reply(message, ConfigRecord({KEY_PUBLIC_KEY: participant.public_key}))

    def mask(self, message: Message, context: Context) -> Message:
        """PASS round 2: mask the label counts against every broadcast public key (once per key)."""
        state = _state_record(context)
        try:
            request = _request(message)
            index = _int_field(request, KEY_PASS_INDEX, minimum=0)
            session = _session_field(request)
            public_keys = _public_keys_field(request)
            private_key = _stored_private_key(state, session, index)
            counts = self._label_counts(context, None)
            participant = PassParticipant(index, counts, session, private_key=private_key)
            masked = participant.masked_counts(public_keys)
        except (ValueError, TypeError, KeyError) as err:
            return _error_reply(message, ACTION_MASK, err)
        _forget_session(state, session)
        return _reply(message, ConfigRecord({KEY_MASKED_COUNTS: encode_masked_counts(masked)}))

    def bid(self, message: Message, context: Context) -> Message:
        """Score the local data against the broadcast ``N_s`` and ``E``, then bid."""
        try:
            request = _request(message)
            global_counts = _int_list_field(request, KEY_GLOBAL_COUNTS)
            num_clients = _int_field(request, KEY_NUM_CLIENTS, minimum=1)
            counts = self._label_counts(context, len(global_counts))
            score = float(compute_score(counts, np.asarray(global_counts, dtype=np.int64), num_clients))
            bid = _checked_bid(self._bid_policy(counts, score, context))
        except (ValueError, TypeError, KeyError) as err:
            return _error_reply(message, ACTION_BID, err)
        state = _state_record(context)
        state[KEY_SCORE] = score
        state[KEY_BID] = bid
        return _reply(message, ConfigRecord({KEY_SCORE: score, KEY_BID: bid}))

    def award(self, message: Message, context: Context) -> Message:
        """Record the auction outcome in ``context.state`` and drop any PASS key left."""
        try:
            request = _request(message)
            won = request.get(KEY_WON)
            payment = request.get(KEY_PAYMENT)
            if not isinstance(won, bool):
                raise _RequestError(f"'{KEY_WON}' must be a bool, got {type(won).__name__}")
            if isinstance(payment, bool) or not isinstance(payment, (int, float)) or not math.isfinite(payment):
                raise _RequestError(f"'{KEY_PAYMENT}' must be a finite float, got {payment!r}")
        except (ValueError, TypeError, KeyError) as err:
            return _error_reply(message, ACTION_AWARD, err)
        state = _state_record(context)
        _forget_all_sessions(state)
        state[KEY_WON] = won
        state[KEY_PAYMENT] = float(payment)
        return _reply(message, ConfigRecord({KEY_ACCEPTED: True}))

    # --- Helpers -------------------------------------------------------------------------------
    def _label_counts(self, context: Context, num_classes: int | None) -> NDArray[np.int64]:
        """Fetch and validate the local label counts (length ``num_classes`` if given)."""
        counts = validate_counts(self._get_label_counts(context)).astype(np.int64)
        if num_classes is not None and counts.shape[0] != num_classes:
            raise _RequestError(
                f"the local label counts have {counts.shape[0]} classes, the market has {num_classes}"
            )
        return counts


# --- Request parsing -----------------------------------------------------------------------------
def _request(message: Message) -> ConfigRecord:
    if not message.has_content() or RECORD_KEY not in message.content.config_records:
        raise _RequestError(f"request has no ConfigRecord '{RECORD_KEY}'")
    return message.content.config_records[RECORD_KEY]


def _int_field(record: ConfigRecord, key: str, minimum: int) -> int:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _RequestError(f"'{key}' must be an int >= {minimum}, got {value!r}")
    return value


def _int_list_field(record: ConfigRecord, key: str) -> list[int]:
    value = record.get(key)
    if (
        not isinstance(value, list)
        or not value
        or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in value)
    ):
        raise _RequestError(f"'{key}' must be a non-empty list of non-negative ints")
    return value


def _session_field(record: ConfigRecord) -> bytes:
    value = record.get(KEY_SESSION)
    if not isinstance(value, bytes) or not value:
        raise _RequestError(f"'{KEY_SESSION}' must be non-empty bytes")
    return value


def _public_keys_field(record: ConfigRecord) -> dict[int, bytes]:
    indices = record.get(KEY_INDICES)
    keys = record.get(KEY_PUBLIC_KEYS)
    if not isinstance(indices, list) or not isinstance(keys, list) or len(indices) != len(keys):
        raise _RequestError(f"'{KEY_INDICES}' and '{KEY_PUBLIC_KEYS}' must be lists of equal length")
    if len(set(indices)) != len(indices):
        raise _RequestError(f"'{KEY_INDICES}' has duplicates")
    return dict(zip(indices, keys, strict=True))


def _checked_bid(bid: object) -> float:
    if isinstance(bid, bool) or not isinstance(bid, (int, float, np.integer, np.floating)):
        raise _RequestError(f"the bid policy returned {type(bid).__name__}, not a number")
    value = float(bid)
    if not math.isfinite(value) or value <= 0:
        raise _RequestError(f"the bid policy returned {value}; a bid must be finite and > 0")
    return value


# --- Local state ---------------------------------------------------------------------------------
def _state_record(context: Context) -> ConfigRecord:
    """The market's ``ConfigRecord`` in ``context.state`` (created on first use)."""
    if RECORD_KEY not in context.state.config_records:
        context.state[RECORD_KEY] = ConfigRecord()
    return context.state.config_records[RECORD_KEY]


def _stored_private_key(state: ConfigRecord, session: bytes, index: int) -> X25519PrivateKey:
    raw = state.get(_STATE_KEY_PREFIX + session.hex())
    if not isinstance(raw, bytes):
        raise _RequestError(
            "no unused PASS key for this session (never created, or already used to mask once)"
        )
    stored_index = state.get(_STATE_INDEX_PREFIX + session.hex())
    if stored_index != index:
        raise _RequestError(f"PASS index {index} differs from the index {stored_index} of this session")
    return X25519PrivateKey.from_private_bytes(raw)


def _forget_session(state: ConfigRecord, session: bytes) -> None:
    for prefix in (_STATE_KEY_PREFIX, _STATE_INDEX_PREFIX):
        state.pop(prefix + session.hex(), None)


def _forget_all_sessions(state: ConfigRecord) -> None:
    for key in [k for k in state if k.startswith((_STATE_KEY_PREFIX, _STATE_INDEX_PREFIX))]:
        del state[key]


# --- Replies -------------------------------------------------------------------------------------
def _reply(message: Message, record: ConfigRecord) -> Message:
    return Message(make_content(record), reply_to=message)


def _error_reply(message: Message, action: str, err: Exception) -> Message:
    reason = f"{ERROR_PREFIX}{action}: {err}"
    log(WARNING, "Market request refused (%s)", reason)
    return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=message)
