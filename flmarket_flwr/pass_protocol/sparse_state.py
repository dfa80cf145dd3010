"""The sparse secure client's state: :mod:`.client_state`'s records with what the directed graph adds.

:class:`SparseAdvertised` (the settings the client accepted, then its signed draw) -> :class:`SparseShared` (its out-
and in-neighbours, ``t``) -> :class:`SparseMasked` (whom it told the server it masked with, and whom the server said
completed key sharing) -> :class:`~.client_state.Unmasked`; :data:`SPARSE_ROUNDS` reads them back from a record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from flmarket_flwr.pass_protocol.client_state import (
    Advertised,
    Closed,
    Fresh,
    Masked,
    RoundState,
    Shared,
    Stage,
    Unmasked,
    Withdrawn,
)
from flmarket_flwr.pass_protocol.sparse_secure import SparseSecureSettings


@dataclass(frozen=True, slots=True, kw_only=True)
class SparseAdvertised(Advertised):
    """After advertise: :class:`~.client_state.Advertised`, the session's settings as accepted, this client's own
    settings, and after the draw ``U1``, ``(k, t)`` and the out-neighbours it drew and signed."""

    stage: ClassVar[Stage] = Stage.ADVERTISED
    colluders: int
    roster_floor: int
    dropout_ppm: int
    reruns: int
    security_bits: int
    markets: int
    participants: bytes = b""
    roster_node_ids: bytes = b""
    """The roster's node ids in PASS-index order (big-endian uint64), checked against the roster fingerprint."""
    degree: int = 0
    threshold: int = 0
    in_degree_cap: int = 0
    out_neighbours: tuple[int, ...] = ()

    @property
    def settings(self) -> SparseSecureSettings:
        """The session's settings, as this client accepted them at advertise."""
        return SparseSecureSettings(
            self.colluders, self.roster_floor, self.dropout_ppm, self.reruns, self.security_bits, self.markets
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class SparseShared(Shared):
    """After share keys: :class:`~.client_state.Shared` over all its neighbours (``neighbours``: out- and
    in-neighbours, ascending), with the out-neighbours (its holders), the in-neighbours (its dealers) and ``t``."""

    stage: ClassVar[Stage] = Stage.SHARED
    threshold: int
    out_neighbours: tuple[int, ...]
    in_neighbours: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class SparseMasked(Masked):
    """After masked input: :class:`~.client_state.Masked` (``held_from``: the in-neighbours whose shares it holds),
    with its out-neighbours, ``t``, the neighbours the server said completed key sharing, and those it masked with
    (the list it signed)."""

    stage: ClassVar[Stage] = Stage.MASKED
    threshold: int
    out_neighbours: tuple[int, ...]
    completed: tuple[int, ...]
    masked_with: tuple[int, ...]


SparseRound = Fresh | SparseAdvertised | SparseShared | SparseMasked | Withdrawn | Unmasked | Closed
"""A sparse secure client's state at one stage of its session."""

SPARSE_ROUNDS: dict[Stage, type[RoundState]] = {
    state.stage: state for state in (Fresh, SparseAdvertised, SparseShared, SparseMasked, Withdrawn, Unmasked, Closed)
}
"""Each stage's state in the sparse secure mode, for :func:`~.client_state.read_state`."""
