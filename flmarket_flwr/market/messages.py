"""Wire format of the market phase: message types, record keys and reply validation.

Every market message, in both directions, carries one ``ConfigRecord`` under
:data:`RECORD_KEY`. The four steps are Flower ``query`` messages with these
actions (message type ``query.<action>``):

=================  ===========================================  ======================================
Action             Server -> client                             Client -> server (reply)
=================  ===========================================  ======================================
``market_keys``    ``pass-index`` int, ``session`` bytes,       ``public-key`` bytes (32)
                   ``num-classes`` int
``market_mask``    ``pass-index`` int, ``session`` bytes,       ``masked-counts`` bytes
                   ``indices`` list[int], ``public-keys``       (``C`` little-endian uint64 words)
                   list[bytes]
``market_bid``     ``global-counts`` list[int],                 ``score`` float, ``bid`` float
                   ``num-clients`` int
``market_award``   ``won`` bool, ``payment`` float              ``accepted`` bool
=================  ===========================================  ======================================

Masked counts travel as bytes because a ``ConfigRecord`` cannot hold integers
``>= 2**63`` and masked words are uniform in ``[0, 2**64)``.

The helpers below turn one reply into typed values or raise :class:`ReplyError`
with a reason that the server logs before excluding the node.
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np
from numpy.typing import NDArray

from flwr.app import ConfigRecord, Message, MessageType, RecordDict

from flmarket_flwr.pass_protocol import load_public_key

__all__ = [
    "ACTION_AWARD",
    "ACTION_BID",
    "ACTION_KEYS",
    "ACTION_MASK",
    "ACTIONS",
    "KEY_ACCEPTED",
    "KEY_BID",
    "KEY_GLOBAL_COUNTS",
    "KEY_INDICES",
    "KEY_MASKED_COUNTS",
    "KEY_NUM_CLASSES",
    "KEY_NUM_CLIENTS",
    "KEY_PASS_INDEX",
    "KEY_PAYMENT",
    "KEY_PUBLIC_KEY",
    "KEY_PUBLIC_KEYS",
    "KEY_SCORE",
    "KEY_SESSION",
    "KEY_WON",
    "MASK_WIRE_DTYPE",
    "PUBLIC_KEY_BYTES",
    "RECORD_KEY",
    "ReplyError",
    "decode_masked_counts",
    "encode_masked_counts",
    "make_content",
    "message_type",
    "read_config",
    "read_float",
    "read_masked_counts",
    "read_public_key",
]

# --- Actions (message type ``query.<action>``) -------------------------------------------------
ACTION_KEYS: Final = "market_keys"
ACTION_MASK: Final = "market_mask"
ACTION_BID: Final = "market_bid"
ACTION_AWARD: Final = "market_award"
ACTIONS: Final = (ACTION_KEYS, ACTION_MASK, ACTION_BID, ACTION_AWARD)

# --- Record keys ---------------------------------------------------------------------------------
RECORD_KEY: Final = "flmarket"
"""Key of the single ``ConfigRecord`` in every market message (and in the client's state)."""

KEY_PASS_INDEX: Final = "pass-index"
KEY_SESSION: Final = "session"
KEY_NUM_CLASSES: Final = "num-classes"
KEY_PUBLIC_KEY: Final = "public-key"
KEY_INDICES: Final = "indices"
KEY_PUBLIC_KEYS: Final = "public-keys"
KEY_MASKED_COUNTS: Final = "masked-counts"
KEY_GLOBAL_COUNTS: Final = "global-counts"
KEY_NUM_CLIENTS: Final = "num-clients"
KEY_SCORE: Final = "score"
KEY_BID: Final = "bid"
KEY_WON: Final = "won"
KEY_PAYMENT: Final = "payment"
KEY_ACCEPTED: Final = "accepted"

PUBLIC_KEY_BYTES: Final = 32
"""Length of a raw X25519 public key."""

MASK_WIRE_DTYPE: Final = np.dtype("<u8")
"""Encoding of masked count vectors on the wire: little-endian uint64."""


class ReplyError(ValueError):
    """A reply that cannot be used; ``str(error)`` is the reason logged by the server."""


def message_type(action: str) -> str:
    """Return the Flower message type ``query.<action>`` of a market action.

    Parameters
    ----------
    action : str
        One of :data:`ACTIONS`.

    Returns
    -------
    str
        The message type, e.g. ``"query.market_keys"``.
    """
    if action not in ACTIONS:
        raise ValueError(f"unknown market action {action!r}; expected one of {ACTIONS}")
    return f"{MessageType.QUERY}.{action}"


def make_content(config: ConfigRecord) -> RecordDict:
    """Wrap a market ``ConfigRecord`` into message content under :data:`RECORD_KEY`."""
    return RecordDict({RECORD_KEY: config})


def encode_masked_counts(masked: NDArray[np.uint64]) -> bytes:
    """Encode a masked count vector for the wire (``C`` little-endian uint64 words)."""
    return np.asarray(masked, dtype=np.uint64).astype(MASK_WIRE_DTYPE).tobytes()


def decode_masked_counts(data: bytes, num_classes: int) -> NDArray[np.uint64]:
    """Decode a masked count vector, checking its length.

    Parameters
    ----------
    data : bytes
        ``num_classes`` little-endian uint64 words.
    num_classes : int
        Expected number of classes ``C``.

    Returns
    -------
    NDArray[np.uint64]
        The vector, native-endian ``uint64``, shape ``(C,)``.

    Raises
    ------
    ReplyError
        If ``data`` is not bytes of length ``8 * num_classes``.
    """
    if not isinstance(data, bytes):
        raise ReplyError(f"'{KEY_MASKED_COUNTS}' must be bytes, got {type(data).__name__}")
    expected = num_classes * MASK_WIRE_DTYPE.itemsize
    if len(data) != expected:
        raise ReplyError(
            f"'{KEY_MASKED_COUNTS}' has {len(data)} bytes, expected {expected} "
            f"({num_classes} uint64 words)"
        )
    return np.frombuffer(data, dtype=MASK_WIRE_DTYPE).astype(np.uint64)


def read_config(reply: Message) -> ConfigRecord:
    """Return the market ``ConfigRecord`` of a reply.

    Raises
    ------
    ReplyError
        If the reply carries an error, has no content, or lacks the record.
    """
    if reply.has_error():
        raise ReplyError(f"error reply (code {reply.error.code}): {reply.error.reason}")
    if not reply.has_content():
        raise ReplyError("reply has neither content nor error")
    record = reply.content.config_records.get(RECORD_KEY)
    if record is None:
        raise ReplyError(f"reply has no ConfigRecord '{RECORD_KEY}'")
    return record


def read_public_key(reply: Message) -> bytes:
    """Return the 32-byte public key of a ``market_keys`` reply.

    Raises
    ------
    ReplyError
        If the key is missing, not bytes, not 32 bytes long, or a low-order point
        (unusable for the X25519 exchange).
    """
    value = read_config(reply).get(KEY_PUBLIC_KEY)
    if not isinstance(value, bytes):
        raise ReplyError(f"'{KEY_PUBLIC_KEY}' must be bytes, got {type(value).__name__}")
    if len(value) != PUBLIC_KEY_BYTES:
        raise ReplyError(f"'{KEY_PUBLIC_KEY}' has {len(value)} bytes, expected {PUBLIC_KEY_BYTES}")
    try:
        # A low-order point would make every peer's exchange fail, and so every honest
        # client refuse to mask: one such key must exclude its sender, not the others.
        load_public_key(value, index=0)
    except (TypeError, ValueError) as err:
        raise ReplyError(
            f"'{KEY_PUBLIC_KEY}' is not a usable X25519 public key (low-order point: every "
            "exchange with it gives an all-zero shared secret)"
        ) from err
    return value


def read_masked_counts(reply: Message, num_classes: int) -> NDArray[np.uint64]:
    """Return the masked count vector of a ``market_mask`` reply.

    Raises
    ------
    ReplyError
        If the vector is missing, not bytes, or of the wrong length.
    """
    return decode_masked_counts(read_config(reply).get(KEY_MASKED_COUNTS), num_classes)


def read_float(record: ConfigRecord, key: str) -> float:
    """Return a finite real number stored under ``key`` (an int is accepted, a bool is not).

    Raises
    ------
    ReplyError
        If the value is missing, not a number, or NaN/infinite.
    """
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ReplyError(f"'{key}' must be a float, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number):
        raise ReplyError(f"'{key}' must be finite, got {number}")
    return number
