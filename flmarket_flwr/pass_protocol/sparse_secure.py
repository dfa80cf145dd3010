"""The sparse secure mode of PASS: its settings, each client's own draw of out-neighbours, and what it signs.

In this mode (docs/threat-model.md, "The sparse secure profile", rules 1-5) the buyer announces the session's
settings with the roster; each client refuses settings weaker than its own and any ``(k, t)`` other than what
:func:`~.graph_parameters.find_graph_parameters` gives for them at ``|U1|``; it then draws its ``k``
out-neighbours from ``U1`` with its own randomness (:func:`draw_out_neighbours`) and signs the draw, and later
signs the list of the neighbours it masked with. The rounds are :mod:`.sparse_client` and :mod:`.sparse_server`.
"""

from __future__ import annotations

import functools
import hashlib
import secrets
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from flmarket_flwr.pass_protocol.encoding import PassError
from flmarket_flwr.pass_protocol.graph_parameters import (
    DEFAULT_SECURITY_BITS,
    GraphParameters,
    find_graph_parameters,
)
from flmarket_flwr.pass_protocol.identity import _context, _field, _verify

_DRAW_LABEL: Final[bytes] = b"flmarket-pass/v2/sparse-secure/out-neighbours"
_SETTINGS_LABEL: Final[bytes] = b"flmarket-pass/v2/sparse-secure/settings"
_MASKED_WITH_LABEL: Final[bytes] = b"flmarket-pass/v2/sparse-secure/masked-with"
PPM: Final[int] = 1_000_000
"""The dropout travels and is stored in parts per million (records hold no floats)."""
DEFAULT_MARKETS: Final[int] = 65_536
"""The markets over a node's life the sparse mode's degrees are sized for (node config ``pass-markets``): ``reruns +
1`` placements each. A node that has drawn in ``(reruns + 1) x markets`` sessions refuses the mode for good; at one
market a ``pass-redraw-wait`` (an hour) a buyer that does nothing but abort needs 7.5 years to get there."""

SPARSE_NEIGHBOUR_SHARE_MAX: Final[float] = 0.5
"""Where the sparse mode costs less than the complete graph: a client's expected neighbours (out and in,
:func:`neighbour_share`) below this share of the other ``E - 1``. A neighbour costs the sparse mode more than the
complete graph (its draw and its masked-with list are signed and checked, and the market runs one more round), so
the crossover lies below 1; measured on the whole secure market (``benchmarks/RESULTS.md``, "the cheaper graph")."""

IndexDraw = Callable[[int], int]
"""``draw(n)``: a uniform integer in ``[0, n)``; :func:`secrets.randbelow` unless a test passes its own."""


@dataclass(frozen=True)
class SparseSecureSettings:
    """The settings a sparse secure session is run under; a node holds its own and refuses weaker ones.

    Attributes
    ----------
    colluders : int
        ``c``, colluding clients assumed (more is stronger).
    roster_floor : int
        ``F``, the least roster (lower is stronger: colluders are counted against it).
    dropout_ppm : int
        ``delta`` in parts per million (more is stronger).
    reruns : int
        PASS re-runs after the first session that a market may draw in: a node draws in at most ``reruns + 1``
        sessions a release (its own ``reruns``, whatever a session announces).
    security_bits : int
        The security target ``2^-security_bits`` (more is stronger).
    markets : int
        The markets over a node's life the degrees are sized for, ``reruns + 1`` placements each
        (:attr:`placements`, more is stronger).
    """

    colluders: int
    roster_floor: int
    dropout_ppm: int
    reruns: int
    security_bits: int = DEFAULT_SECURITY_BITS
    markets: int = DEFAULT_MARKETS

    def __post_init__(self) -> None:
        for name in ("colluders", "roster_floor", "dropout_ppm", "reruns", "security_bits", "markets"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise PassError(f"sparse secure setting {name} must be an int >= 0, got {value!r}")
        if self.dropout_ppm >= PPM:
            raise PassError(f"sparse secure setting dropout_ppm must be below {PPM}, got {self.dropout_ppm}")
        if self.markets < 1:
            raise PassError(f"sparse secure setting markets must be >= 1, got {self.markets}")

    @property
    def placements(self) -> int:
        """``(reruns + 1) x markets``: the placements of one node a buyer may see over the node's life, which the
        finder's union bounds cover (a node draws no more: :class:`~flmarket_flwr.market.wire.ledger.DrawAllowance`)."""
        return (self.reruns + 1) * self.markets

    def digest(self) -> bytes:
        """SHA-256 of these settings under the mode's label: what every advert of a sparse secure session signs in
        place of a graph commitment (:func:`~.identity.advertisement_message`'s ``mode``), so a node never takes a
        neighbour that joined the session in another mode or under other settings."""
        body = struct.pack(
            ">QQQQQQ",
            self.colluders,
            self.roster_floor,
            self.dropout_ppm,
            self.reruns,
            self.security_bits,
            self.markets,
        )
        return hashlib.sha256(_field(_SETTINGS_LABEL) + body).digest()

    @classmethod
    def of(
        cls,
        *,
        colluders: int,
        roster_floor: int,
        dropout: float,
        reruns: int,
        security_bits: int = DEFAULT_SECURITY_BITS,
        markets: int = DEFAULT_MARKETS,
    ) -> SparseSecureSettings:
        """The settings with ``dropout`` as a probability."""
        return cls(colluders, roster_floor, round(dropout * PPM), reruns, security_bits, markets)

    def weaker_than(self, own: SparseSecureSettings) -> list[str]:
        """What makes these settings weaker than ``own``, one phrase each (empty: at least as strong)."""
        reasons = []
        if self.colluders < own.colluders:
            reasons.append(f"{self.colluders} colluders, fewer than {own.colluders}")
        if self.roster_floor > own.roster_floor:
            reasons.append(f"a roster floor of {self.roster_floor}, above {own.roster_floor}")
        if self.dropout_ppm < own.dropout_ppm:
            reasons.append(f"dropout {self.dropout_ppm} ppm, below {own.dropout_ppm}")
        if self.placements < own.placements:
            reasons.append(
                f"degrees sized for {self.placements:,} placements ({self.reruns} re-runs x {self.markets:,} markets), "
                f"fewer than {own.placements:,}"
            )
        if self.security_bits < own.security_bits:
            reasons.append(f"{self.security_bits} security bits, fewer than {own.security_bits}")
        return reasons

    def parameters(self, roster: int) -> GraphParameters:
        """:func:`~.graph_parameters.find_graph_parameters` for these settings at a roster of ``roster``;
        ``PassError`` naming what is out of range."""
        try:
            return _parameters(roster, self)
        except ValueError as error:
            raise PassError(f"no sparse secure degree for a roster of {roster}: {error}") from error


@functools.lru_cache(maxsize=64)
def _parameters(roster: int, settings: SparseSecureSettings) -> GraphParameters:
    """The finder, once per roster and settings in a process (every client of an in-process session asks it); its
    union bounds over ``reruns + 1`` draws taken over every placement of the node's life (:attr:`placements`)."""
    return find_graph_parameters(
        roster,
        roster_floor=settings.roster_floor,
        colluders=settings.colluders,
        dropout=settings.dropout_ppm / PPM,
        reruns=settings.placements - 1,
        security_bits=settings.security_bits,
    )


def neighbour_share(roster: int, degree: int) -> float:
    """A client's expected neighbours in the sparse mode over the ``E - 1`` others: its ``k`` out-neighbours and its
    in-neighbours (each other client draws it with probability ``k / (E - 1)``), less those that are both,
    ``(2k - k^2 / (E - 1)) / (E - 1)``; 1 on the complete graph."""
    if roster < 2 or not 1 <= degree <= roster - 1:
        raise ValueError(f"a degree in [1, {roster - 1}] on a roster of {roster} >= 2, got {degree}")
    others = roster - 1
    return (2 * degree - degree * degree / others) / others


def sparse_costs_less(roster: int, degree: int) -> bool:
    """Whether the sparse mode at out-degree ``degree`` costs less than the complete graph on a roster of ``E``:
    :func:`neighbour_share` below :data:`SPARSE_NEIGHBOUR_SHARE_MAX` (both modes' other work grows with ``E`` alike,
    so the crossover is a share, the same at every ``E``)."""
    return degree < roster - 1 and neighbour_share(roster, degree) < SPARSE_NEIGHBOUR_SHARE_MAX


def draw_out_neighbours(
    participants: Sequence[int] | np.ndarray, own: int, k: int, draw: IndexDraw = secrets.randbelow
) -> tuple[int, ...]:
    """``k`` distinct members of ``participants`` other than ``own``, uniformly, sorted.

    A partial Fisher-Yates shuffle over the others driven by ``draw`` (the OS's randomness by default): the
    server never sees the randomness, only the signed result.
    """
    others = [int(v) for v in participants if int(v) != own]
    if not 1 <= k <= len(others):
        raise PassError(f"cannot draw {k} out-neighbours from {len(others)} other participants")
    for i in range(k):
        j = i + draw(len(others) - i)
        others[i], others[j] = others[j], others[i]
    return tuple(sorted(others[:k]))


def pack_indices(indices: Sequence[int]) -> bytes:
    """PASS indices as big-endian uint32 words (a list of indices inside one record field)."""
    return np.asarray(list(indices), dtype=">u4").tobytes()


def unpack_indices(data: bytes) -> tuple[int, ...]:
    """Inverse of :func:`pack_indices`; ``PassError`` unless whole words, strictly increasing."""
    if len(data) % 4:
        raise PassError("a packed index list must be whole 4-byte words")
    words = np.frombuffer(data, dtype=">u4").astype(np.int64)
    if words.size and (words[0] < 1 or bool((np.diff(words) <= 0).any())):
        raise PassError("a packed index list must hold distinct PASS indices in increasing order")
    return tuple(words.tolist())


@dataclass(frozen=True)
class SessionBinding:
    """What every sparse secure signature binds besides its content: the run, session, roster fingerprint, ``U1``."""

    run_id: int
    session: bytes
    roster: bytes
    u1_digest: bytes

    def context(self) -> bytes:
        """The binding as one injective byte string."""
        return _context(self.run_id, self.session, self.roster) + _field(self.u1_digest)

    def sign_draw(self, key: Ed25519PrivateKey, index: int, out: Sequence[int], k: int, t: int) -> bytes:
        """Ed25519 signature over :func:`draw_message`."""
        return key.sign(draw_message(self, index, out, k, t))

    def verify_draw(self, public_key: bytes, signature: bytes, index: int, out: Sequence[int], k: int, t: int) -> None:
        """``ValueError`` unless ``signature`` is ``index``'s on this draw, ``(k, t)`` and binding."""
        _verify(public_key, signature, draw_message(self, index, out, k, t), f"out-neighbour draw of client {index}")

    def sign_masked_with(self, key: Ed25519PrivateKey, index: int, masked_with: Sequence[int]) -> bytes:
        """Ed25519 signature over :func:`masked_with_message`."""
        return key.sign(masked_with_message(self, index, masked_with))

    def verify_masked_with(self, public_key: bytes, signature: bytes, index: int, masked_with: Sequence[int]) -> None:
        """``ValueError`` unless ``signature`` is ``index``'s on this masked-with list and binding."""
        message = masked_with_message(self, index, masked_with)
        _verify(public_key, signature, message, f"masked-with list of client {index}")


def draw_message(binding: SessionBinding, index: int, out_neighbours: Sequence[int], k: int, t: int) -> bytes:
    """The bytes a client signs for its draw: the binding (run, session, roster fingerprint, ``U1``'s digest), its
    index, ``(k, t)`` and its out-neighbours."""
    body = struct.pack(">QQQ", index, k, t) + _field(pack_indices(out_neighbours))
    return _field(_DRAW_LABEL) + binding.context() + body


def masked_with_message(binding: SessionBinding, index: int, masked_with: Sequence[int]) -> bytes:
    """The bytes a client signs for the list of neighbours it masked with: the binding, its index and the list."""
    body = struct.pack(">Q", index) + _field(pack_indices(masked_with))
    return _field(_MASKED_WITH_LABEL) + binding.context() + body
