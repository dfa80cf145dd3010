"""PASS v2, the client's state: one frozen record per round, holding what the rounds after it may read.

Each round of :class:`~flmarket_flwr.pass_protocol.client.PassClient` reads the record the round before it
returned and returns the next: :class:`Fresh` -> :class:`Advertised` -> :class:`Shared` -> :class:`Masked` ->
:class:`Unmasked` (or :class:`Withdrawn`), and :class:`Closed` from any of them. A secret is in a record only while
a later round needs it: the private mask key leaves with share keys, the other keys, seeds and counts with
masked input, the held shares with unmask. :meth:`RoundState.to_record` and :func:`read_state` are the one place
a state becomes, and is read back from, a ``ConfigRecord``-compatible record, so that each round may run in a
fresh process.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from flmarket_flwr.pass_protocol.encoding import PassError, bitmap_bits
from flmarket_flwr.pass_protocol.messages import FIELD_CHECKS


class Stage(enum.IntEnum):
    """Where a client is in its one PASS session; each step runs only from the stage before it."""

    NEW = 0
    ADVERTISED = 1
    SHARED = 2
    MASKED = 3
    UNMASKED = 4
    WITHDRAWN = 5
    CLOSED = 99
    """Closed by :meth:`~flmarket_flwr.pass_protocol.client.PassClient.close`: no step runs again in this session."""


_RECORD_TYPES: dict[str, tuple[str, Any]] = {
    "bytes": ("bytes", b""),
    "int": ("int", 0),
    "bool": ("bool", False),
    "tuple[int, ...]": ("list[int]", ()),
    "tuple[bytes, ...]": ("list[bytes]", ()),
}
"""Each field annotation a state may use: its ``ConfigRecord`` value type (:data:`FIELD_CHECKS`) and its empty
value, which a record leaves out (a ``ConfigRecord`` list must not be empty) and which a missing key reads as."""


class RoundState:
    """What every round's record shares: its :class:`Stage` and its one record form."""

    __slots__ = ()
    stage: ClassVar[Stage]

    def to_record(self) -> dict[str, Any]:
        """The state as ``str -> bytes | int | bool | list[int] | list[bytes]``: the stage and every field that is
        not empty (a missing field reads back as empty).

        Holds private keys until they are wiped: store it only where the node keeps its own secrets.
        """
        record: dict[str, Any] = {"stage": int(self.stage)}
        for item in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, item.name)
            if value != _RECORD_TYPES[str(item.type)][1]:
                record[item.name] = list(value) if isinstance(value, tuple) else value
        return record


@dataclass(frozen=True, slots=True, kw_only=True)
class Fresh(RoundState):
    """A client that has not advertised: it holds nothing."""

    stage: ClassVar[Stage] = Stage.NEW


@dataclass(frozen=True, slots=True, kw_only=True)
class Joined(RoundState):
    """What advertise fixed for the whole session (the server's terms as this client accepted them, and its own run
    id): every later round reads it, and so does the market after PASS."""

    session: bytes
    index: int
    node_id: int
    run_id: int
    roster: bytes
    """The roster fingerprint every signature of the session binds."""
    num_classes: int
    count_bound: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Advertised(Joined):
    """After advertise, for share keys: the key pairs, the counts, the graph commitment and this client's floors."""

    stage: ClassVar[Stage] = Stage.ADVERTISED
    graph_commitment: bytes
    counts: bytes
    """The label counts as little-endian uint64 words."""
    cipher_private_key: bytes
    cipher_public_key: bytes
    mask_private_key: bytes
    mask_public_key: bytes
    min_security_bits: int
    max_bad_fraction_ppm: int
    min_participants: int
    complete_graph: bool
    split_tolerance: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Shared(Joined):
    """After share keys, for masked input: the graph, the self-mask seed and each edge's secrets.

    The i-th entry of each per-neighbour column is ``neighbours[i]``'s. The cipher key pair stays for an
    accusation (the channel secret is proven with it); the mask key pair is gone, its shares dealt.
    """

    stage: ClassVar[Stage] = Stage.SHARED
    counts: bytes
    cipher_private_key: bytes
    cipher_public_key: bytes
    self_seed: bytes
    degree: int
    participants: bytes
    """U1 as a roster bitmap."""
    neighbours: tuple[int, ...]
    pair_seeds: tuple[bytes, ...]
    channel_secrets: tuple[bytes, ...]
    neighbour_cipher_keys: tuple[bytes, ...]
    neighbour_cipher_proofs: tuple[bytes, ...]
    identity_keys: tuple[bytes, ...]
    """The neighbours' identity keys (with a directory only): the client then requires the consistency round."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Masked(Joined):
    """After masked input, for the consistency round and unmask: the shares held, whom this client accused, and
    the counts commitment's nonce (kept for an audit).

    ``view_requested`` / ``unmask_requested`` are set as soon as such a request arrives, answered or refused: each
    is answered once. ``signed_survivors`` / ``signed_dropped`` are the set this client signed, the only one it
    unmasks for.
    """

    stage: ClassVar[Stage] = Stage.MASKED
    degree: int
    participants: bytes
    neighbours: tuple[int, ...]
    identity_keys: tuple[bytes, ...]
    nonce: bytes
    held_from: tuple[int, ...]
    held_shares: tuple[bytes, ...]
    """The share pair (mask key, then self-mask seed) each of ``held_from`` dealt to this client."""
    accused: tuple[int, ...]
    view_requested: bool = False
    signed_survivors: bytes = b""
    signed_dropped: bytes = b""
    unmask_requested: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Withdrawn(Joined):
    """Withdrew at masked input (fewer than ``t`` neighbours' shares opened), naming whom it accused."""

    stage: ClassVar[Stage] = Stage.WITHDRAWN
    accused: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Unmasked(Joined):
    """After unmask, for the market: the sum this client contributed to, and the nonce that opens its commitment."""

    stage: ClassVar[Stage] = Stage.UNMASKED
    participants: bytes
    nonce: bytes
    transcript: bytes
    """``survivor_transcript`` of U3."""
    survivor_count: int
    survivors: bytes
    """The survivor set U3 this client answered at unmask (a bitmap of PASS indices), which ``transcript`` binds."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Closed(RoundState):
    """Closed: every key, seed, share and count wiped; the session and whether an unmask was requested kept, so that
    no step of this session runs again and no later session is joined after an unmask request."""

    stage: ClassVar[Stage] = Stage.CLOSED
    session: bytes
    unmask_requested: bool


ClientRound = Fresh | Advertised | Shared | Masked | Withdrawn | Unmasked | Closed
"""A client's state at one stage of its session."""

ROUND_OF_STAGE: dict[Stage, type[RoundState]] = {
    state.stage: state for state in (Fresh, Advertised, Shared, Masked, Withdrawn, Unmasked, Closed)
}


def read_state(record: Mapping[str, Any], rounds: Mapping[Stage, type[RoundState]] = ROUND_OF_STAGE) -> Any:
    """Read a state written by :meth:`RoundState.to_record`; :class:`PassError` naming a key this stage's state
    does not have, or a mistyped value. ``rounds`` maps each stage to its state (another mode's, such as
    :mod:`.sparse_state`'s); by default the :data:`ClientRound` of :class:`~.client.PassClient`."""
    stage = record.get("stage", Stage.NEW)
    if isinstance(stage, bool) or stage not in set(Stage):
        raise PassError(f"the PASS client state's stage {stage!r} is not a stage")
    kind = rounds[Stage(stage)]
    types = {item.name: str(item.type) for item in dataclasses.fields(kind)}  # type: ignore[arg-type]
    for key in record:
        if key != "stage" and key not in types:
            raise PassError(f"the PASS client state at stage {Stage(stage).name} has no key {key!r}")
    values: dict[str, Any] = {}
    for name, annotation in types.items():
        check, empty = _RECORD_TYPES[annotation]
        value = record.get(name, empty)
        value = list(value) if isinstance(value, tuple) else value
        if name in record and not FIELD_CHECKS[check](value):
            raise PassError(f"the PASS client state's {name!r} must be {check}")
        values[name] = tuple(value) if isinstance(value, list) else value
    return kind(**values)


@dataclass(frozen=True, slots=True)
class SessionSummary:
    """What a client's session has established that is not secret, for the glue to read (empty where not yet):
    the terms fixed at advertise, the roster ``U1`` once shared, and the sum's survivors once unmasked."""

    stage: Stage
    session: bytes = b""
    index: int = 0
    node_id: int = 0
    run_id: int = 0
    roster: bytes = b""
    num_classes: int = 0
    count_bound: int = 0
    participants: bytes = b""
    survivors: bytes = b""
    survivor_count: int = 0
    transcript: bytes = b""

    @classmethod
    def of(cls, state: ClientRound) -> SessionSummary:
        """The summary of ``state`` (its secrets left out)."""
        names = [item.name for item in dataclasses.fields(cls)][1:]
        return cls(state.stage, **{name: getattr(state, name) for name in names if hasattr(state, name)})


StageState = TypeVar("StageState", bound=RoundState)


def require_stage(state: RoundState, kind: type[StageState], step: str) -> StageState:
    """``state`` as a ``kind``, or :class:`PassError` naming ``step`` unless the client is at that stage."""
    if not isinstance(state, kind):
        raise PassError(f"{step} is not allowed now (protocol stage {int(state.stage)}, need {int(kind.stage)})")
    return state


class SessionView:
    """What a client of either PASS mode shows of its session: read-only views of its round's record, and ``close``.

    :class:`~.client.PassClient` and :class:`~.sparse_client.SparseSecureClient` both build on it, so that the
    market's node side reads a session the same way whichever mode it runs; ``_round`` is the mode's own record.
    """

    _round: RoundState

    @classmethod
    def from_record(cls: type[_View], record: Mapping[str, Any]) -> _View:
        """Restore a client from its ``to_record()`` (a fresh process between rounds)."""
        return cls(record)  # type: ignore[call-arg]  # every mode's client takes its record first

    def to_record(self) -> dict[str, Any]:
        """The state as a record (:meth:`RoundState.to_record`); holds private keys until they are wiped."""
        return self._round.to_record()

    @property
    def state(self) -> SessionSummary:
        """What this client's session has established that is not secret (its terms, roster and survivors)."""
        return SessionSummary.of(self._round)  # type: ignore[arg-type]  # any mode's record: read by name

    @property
    def stage(self) -> Stage:
        """Where this client is in its session."""
        return self._round.stage

    @property
    def session(self) -> bytes | None:
        """The session this client advertised in (``None`` before it advertised)."""
        return getattr(self._round, "session", b"") or None

    @property
    def transcript(self) -> bytes | None:
        """``survivor_transcript`` of the sum this client contributed to (after unmask)."""
        return self._round.transcript if isinstance(self._round, Unmasked) else None

    @property
    def survivor_count(self) -> int | None:
        """``|U3|`` (after unmask)."""
        return self._round.survivor_count if isinstance(self._round, Unmasked) else None

    @property
    def participant_count(self) -> int:
        """``|U1|``, the roster this client was shown; :class:`PassError` before it was."""
        participants = getattr(self._round, "participants", b"")
        if not participants:
            raise PassError("no roster yet: U1 has not been shown to this client")
        return int(bitmap_bits(participants).sum())

    @property
    def counts_nonce(self) -> bytes | None:
        """Nonce of the counts commitment (kept private; revealed only for an audit)."""
        return self._round.nonce if isinstance(self._round, Masked | Unmasked) else None

    @property
    def unmask_requested(self) -> bool:
        """Whether this client was asked to unmask in its session (answered or refused): it joins no other."""
        state = self._round
        return isinstance(state, Unmasked) or (isinstance(state, Masked | Closed) and state.unmask_requested)

    def close(self) -> None:
        """End the session for this client: wipe every key, seed, share and count; keep only the session and
        whether an unmask was requested, so that no step of this session runs again."""
        self._round = Closed(session=self.session or b"", unmask_requested=self.unmask_requested)


_View = TypeVar("_View", bound=SessionView)
