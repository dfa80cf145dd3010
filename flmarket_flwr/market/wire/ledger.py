"""A node's release ledger: refuse a PASS sum that, differenced with one it already released, isolates a few clients.

:class:`ReleaseLedger` keeps, in the node's own directory, one write-ahead record per sum it released and the
privacy each release spent, and refuses a release that :func:`isolates_a_small_group` or that would exceed the
node's :class:`~flmarket_flwr.pass_protocol.noise.PrivacyBudget`; it fails closed. The buyer's side,
:class:`RosterHistory` and :func:`plan_roster`, leaves out the clients a ledger would refuse. Pure Python, no
Flower (docs/threat-model.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import math
import os
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NamedTuple

if TYPE_CHECKING:
    from flmarket_flwr.pass_protocol.noise import PrivacyBudget

__all__ = [
    "DEFAULT_MIN_ROSTER_CHANGE",
    "DEFAULT_REDRAW_WAIT",
    "DrawAllowance",
    "LEDGER_FILE",
    "PrivacyBudgetExhausted",
    "LedgerError",
    "PrivacySpend",
    "ReleaseLedger",
    "ReleaseRecord",
    "ReleaseRefused",
    "RosterHistory",
    "SessionCapReached",
    "isolates_a_small_group",
    "plan_roster",
]

LEDGER_FILE: Final = "release-ledger.json"
"""Name of the ledger file inside the node's ledger directory."""
DEFAULT_MIN_ROSTER_CHANGE: Final = 3
"""Smallest group two releases may differ by (each way): that of the smallest PASS session."""
_LOCK_FILE: Final = "release-ledger.lock"
_VERSION: Final = 1
"""Version of the buyer's roster history file."""
_LEDGER_VERSION: Final = 4
_READABLE_LEDGER_VERSIONS: Final = (1, 2, 3, 4)
"""Ledger files of version 1 (before privacy spends were recorded) are read as having spent nothing; of versions 1 and
2 (before the sparse secure mode's draws were recorded), as having drawn in no session; of version 3 (draws without
their time), as having drawn long ago."""
DEFAULT_REDRAW_WAIT: Final = 3600.0
"""Seconds after which a node whose draws brought no release draws again (node config ``pass-redraw-wait``)."""
_DIGEST_BYTES: Final = 16


class LedgerError(ValueError):
    """The ledger refuses the release, or cannot be read or written (fail closed); the message names the file."""


class ReleaseRefused(LedgerError):
    """The new member set, differenced with an earlier release, would isolate fewer than ``min_roster_change``."""


class SessionCapReached(LedgerError):
    """Drawing in another PASS session would exceed what the node's :class:`DrawAllowance` allows
    (:meth:`ReleaseLedger.record_draw`)."""


@dataclass(frozen=True)
class DrawAllowance:
    """How often a node draws out-neighbours in the sparse secure mode: every draw is a placement the buyer sees.

    Attributes
    ----------
    per_release : int
        ``reruns + 1``, the node's own ``pass-reruns``: the draws it makes with no release in between, within
        ``wait`` seconds (whatever re-runs a session announces).
    lifetime : int
        ``(reruns + 1) x markets``: the draws over the node's life, which its degrees are sized for
        (:attr:`~flmarket_flwr.pass_protocol.sparse_secure.SparseSecureSettings.placements`); past them it refuses
        the mode for good.
    wait : float
        Seconds (``pass-redraw-wait``): a draw older than this no longer counts against ``per_release``, so a buyer
        that stops its sessions after the draw locks the node out for at most this long after its last draw.
    """

    per_release: int
    lifetime: int
    wait: float = DEFAULT_REDRAW_WAIT

    def __post_init__(self) -> None:
        if isinstance(self.per_release, bool) or not isinstance(self.per_release, int) or self.per_release < 1:
            raise ValueError(f"per_release must be an int >= 1, got {self.per_release!r}")
        if isinstance(self.lifetime, bool) or not isinstance(self.lifetime, int) or self.lifetime < self.per_release:
            raise ValueError(f"lifetime must be an int >= per_release {self.per_release}, got {self.lifetime!r}")
        if not (isinstance(self.wait, int | float) and 0.0 <= self.wait < math.inf):
            raise ValueError(f"wait must be finite seconds >= 0, got {self.wait!r}")


class PrivacyBudgetExhausted(LedgerError):
    """The release would take the node's composed ``epsilon`` past its privacy budget (or it carries no noise)."""


@dataclass(frozen=True)
class ReleaseRecord:
    """One sum this node helped release.

    Attributes
    ----------
    run_id : int
        The Flower run id (the node's own ``context.run_id``).
    session : str
        The PASS session id, hex.
    members : frozenset[str]
        The keyed hashes (hex) of the members whose counts the sum holds (the survivors U3).
    """

    run_id: int
    session: str
    members: frozenset[str]

    def to_json(self) -> dict[str, Any]:
        """Plain-JSON form (members sorted)."""
        return {"run_id": self.run_id, "session": self.session, "members": sorted(self.members)}


@dataclass(frozen=True)
class PrivacySpend:
    """The privacy cost of one release this node's masked input went into.

    Attributes
    ----------
    run_id : int
        The Flower run id.
    session : str
        The PASS session id, hex.
    variance : float
        The aggregate per-class variance of the honest survivors' noise in the release: at mask the calibration's
        (:attr:`~flmarket_flwr.pass_protocol.noise.SkellamNoise.target_variance`), at unmask what the survivors give
        (:meth:`~flmarket_flwr.pass_protocol.noise.SkellamNoise.release_variance`); 0: no noise (exact counts).
    """

    run_id: int
    session: str
    variance: float

    def to_json(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return {"run_id": self.run_id, "session": self.session, "variance": self.variance}


def isolates_a_small_group(earlier: frozenset[str], new: frozenset[str], min_roster_change: int) -> bool:
    """Whether differencing the two sums isolates a non-empty group of fewer than ``min_roster_change`` members.

    ``sum(earlier) - sum(new) = sum(earlier - new) - sum(new - earlier)``: with the counts of one side known to
    the server, the other side's total is learnt, so each side must be empty or hold ``min_roster_change``.
    """
    return any(0 < len(side) < min_roster_change for side in (earlier - new, new - earlier))


def plan_roster(
    candidates: Iterable[int], releases: Iterable[Iterable[int]], min_roster_change: int = DEFAULT_MIN_ROSTER_CHANGE
) -> list[int]:
    """The buyer's side of the rule: a subset of ``candidates`` that no client's ledger refuses.

    ``releases`` are the member sets of the sums released before (the buyer knows them: each market's
    ``pass_participants``); one that shares no member with the roster is no client's concern. Greedy: against
    each release ``P`` that the roster ``N`` would differ from by a small group, the newcomers ``N - P`` sit
    out when there are fewer than ``min_roster_change`` of them, and when fewer than ``min_roster_change``
    members of ``P`` are missing, more of ``P`` sit out (the highest node ids) until that many are; repeated
    until no release objects (each pass removes a client, so it ends).
    The clients still check for themselves (their ledgers also hold other buyers' markets).

    Returns
    -------
    list[int]
        The roster, ascending; empty when fewer than 3 clients are left.
    """
    roster = {int(node) for node in candidates}
    earlier = [frozenset(int(node) for node in members) for members in releases]
    changed = True
    while changed and len(roster) >= 3:
        changed = False
        for members in earlier:
            if not members & roster:  # no client took part in both, so no ledger compares them
                continue
            joined, left = roster - members, members - roster
            if 0 < len(joined) < min_roster_change:
                roster -= joined
                changed = True
            elif 0 < len(left) < min_roster_change:
                kept = sorted(members & roster)
                roster -= set(kept[len(kept) - (min_roster_change - len(left)) :])
                changed = True
    return sorted(roster) if len(roster) >= 3 else []


class _LedgerFile(NamedTuple):
    """What a node's ledger file holds: the members' salt, the releases, the privacy spends, and the sparse secure
    mode's draws ``(run id, session hex, time)``, oldest first (the time: the node's own clock, seconds since the
    epoch)."""

    salt: bytes
    records: list[ReleaseRecord]
    spends: list[PrivacySpend]
    draws: list[tuple[int, str, float]]


class ReleaseLedger:
    r"""The releases of one node, persisted in ``directory`` (one directory per node, never shared).

    Parameters
    ----------
    directory : str or os.PathLike
        The node's own ledger directory (created, mode 0700, if missing).
    min_roster_change : int (default: 3)
        Smallest non-empty one-sided difference allowed between a new member set and any earlier one.
    privacy_budget : PrivacyBudget, optional
        The node's total ``(epsilon, delta)`` over all its releases; :meth:`spend` refuses a release past it.
        ``None``: spends are recorded, none is refused.

    Notes
    -----
    PASS releases one sum per run, but two runs are two sums: ``N_s(run 1) - N_s(run 2)`` is the total of the
    clients in one member set and not the other, and a victim present in run 1 and absent from run 2 is isolated
    exactly. The victim never sees run 2; the clients that take part in both do, and each keeps, in a directory of
    its own (:class:`ReleaseLedger`), one record per sum it helped release: the run id, the session and the
    hashed member set. Before it releases again it checks the new member set ``N`` against every earlier one
    ``P``: the difference of the two sums is ``sum(P \ N) - sum(N \ P)``, and a server that knows the counts of
    one side (sybils, colluders) learns the other side's total, so each one-sided difference must be empty or hold
    at least ``min_roster_change`` members (:func:`isolates_a_small_group`). Default 3, the smallest sum PASS
    releases at all.

    Writes are atomic (a temporary file, ``fsync``, ``os.replace``) and serialised between processes by a lock
    file; the record is written *before* the release (write-ahead), so a crash never loses one. A ledger that
    cannot be read or written fails closed: :class:`LedgerError` naming the file, and the node releases nothing.
    The buyer's side is :class:`RosterHistory`: the member sets of the sums its own markets released, from which
    :func:`plan_roster` leaves out the few clients whose presence would make some ledger refuse, so that a market
    under churn runs over fewer clients instead of being refused (``MarketConfig(roster_history=...)``).

    The ledger does not stop colluders: two clients of the server's that leave together with a victim make a
    one-sided change of 3, which the rule allows, and ``N_s(1) - N_s(2)`` minus their own counts is the victim's.
    What bounds that attack is the noise (:mod:`flmarket_flwr.pass_protocol.noise`), composed over releases: the
    ledger also records each release's privacy cost (:meth:`ReleaseLedger.spend`, write-ahead, when the client's
    masked input is about to leave) and, given the node's :class:`~flmarket_flwr.pass_protocol.noise.PrivacyBudget`,
    refuses the release that would take the composed ``epsilon`` past it (:class:`PrivacyBudgetExhausted`). At unmask,
    once the survivors are known, :meth:`ReleaseLedger.charge_release` sets that cost to what the release's honest
    noise gives: the survivors less the colluders its noise allows for (``pass-colluders``, or half the roster),
    adding none.
    Pure Python, no Flower, standard library only at import: the market client calls it
    (:func:`flmarket_flwr.market.register_market_handlers`); the privacy budget brings its own accountant.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        min_roster_change: int = DEFAULT_MIN_ROSTER_CHANGE,
        privacy_budget: PrivacyBudget | None = None,
    ):
        _check_min_roster_change(min_roster_change)
        self.directory = Path(directory).expanduser()
        self.min_roster_change = min_roster_change
        self.privacy_budget = privacy_budget

    @property
    def path(self) -> Path:
        """The ledger file."""
        return self.directory / LEDGER_FILE

    def records(self) -> list[ReleaseRecord]:
        """Every release recorded so far (``LedgerError`` if the file is unreadable)."""
        with self._locked():
            return self._read().records

    def spends(self) -> list[PrivacySpend]:
        """Every privacy spend recorded so far, oldest first (``LedgerError`` if the file is unreadable)."""
        with self._locked():
            return self._read().spends

    def epsilon_spent(self) -> float:
        """The composed ``epsilon`` of every recorded spend at the privacy budget's ``delta`` (``ValueError``
        without one)."""
        if self.privacy_budget is None:
            raise ValueError(f"release ledger {self.path} has no privacy budget to convert its spends at")
        return self.privacy_budget.spent([spend.variance for spend in self.spends()])

    def spend(self, run_id: int, session: bytes, variance: float) -> None:
        """Record the privacy cost of a release before the node's masked input leaves (write-ahead).

        Recording the same run and session with the same variance again is a no-op (a retried message).

        Parameters
        ----------
        run_id, session
            The release: Flower run id and PASS session id.
        variance : float
            The aggregate per-class variance the release counts on; 0 for a release without noise.

        Raises
        ------
        PrivacyBudgetExhausted
            With the new spend the composed ``epsilon`` would exceed :attr:`privacy_budget` (a release without noise
            always does), or the session was recorded with another variance. Nothing is recorded.
        LedgerError
            The ledger file cannot be read, parsed or written: nothing is released.
        """
        if not (math.isfinite(variance) and variance >= 0):
            raise ValueError(f"variance must be finite and >= 0, got {variance}")
        spend = PrivacySpend(int(run_id), session.hex(), float(variance))
        with self._locked():
            contents = self._read()
            spends = contents.spends
            for earlier in spends:
                if (earlier.run_id, earlier.session) == (spend.run_id, spend.session):
                    if earlier.variance == spend.variance:
                        return
                    raise PrivacyBudgetExhausted(
                        f"run {spend.run_id}, session {spend.session[:16]}: already recorded in {self.path} with "
                        f"variance {earlier.variance}, now {spend.variance}"
                    )
            if self.privacy_budget is not None:
                before = self.privacy_budget.spent([s.variance for s in spends])
                after = self.privacy_budget.spent([*(s.variance for s in spends), spend.variance])
                if after > self.privacy_budget.epsilon:
                    noise = "no noise" if spend.variance == 0 else f"aggregate variance {spend.variance:.4g}"
                    raise PrivacyBudgetExhausted(
                        f"run {spend.run_id}: a release with {noise} would take this node's composed epsilon from "
                        f"{before:.4g} to {after:.4g} at delta {self.privacy_budget.delta:g} ({len(spends)} releases "
                        f"recorded in {self.path}), past its total budget {self.privacy_budget.epsilon:g}: refused"
                    )
            self._write(contents._replace(spends=[*spends, spend]))

    def charge_release(self, run_id: int, session: bytes, variance: float) -> None:
        """At release time, set the session's charge to what its honest survivors' noise gives; refuse past the
        privacy budget.

        :meth:`spend` charged the release before the masked input left, at the noise's calibration (``h`` honest
        survivors). Once the survivors ``U3`` are known (the unmask request) the honest noise in the sum has
        variance at least ``variance`` (:meth:`~flmarket_flwr.pass_protocol.noise.SkellamNoise.release_variance`:
        ``|U3|`` less the colluders the calibration allows for): the same when every client survived, less when
        the server dropped some after the roster was fixed. A charge only rises: the session is recorded at the
        smaller of the two variances (a retried message records nothing new); a session never spent is charged
        here.

        Raises
        ------
        PrivacyBudgetExhausted
            With this charge the composed ``epsilon`` exceeds :attr:`privacy_budget`. The charge *is* recorded: the
            masked input has left and the neighbours' shares can release the sum without this node, so every later
            release is counted against it; the node only withholds its own shares.
        LedgerError
            The ledger file cannot be read, parsed or written.
        """
        if not (math.isfinite(variance) and variance >= 0):
            raise ValueError(f"variance must be finite and >= 0, got {variance}")
        charge = PrivacySpend(int(run_id), session.hex(), float(variance))
        with self._locked():
            contents = self._read()
            spends = contents.spends
            others = [s for s in spends if (s.run_id, s.session) != (charge.run_id, charge.session)]
            earlier = [s for s in spends if s not in others]
            if earlier and earlier[0].variance <= charge.variance:
                charge = earlier[0]  # charged as much already (a retried message): checked again below
            else:  # in the earlier one's place, oldest first
                kept = [charge if spend in earlier else spend for spend in spends] if earlier else [*spends, charge]
                self._write(contents._replace(spends=kept))
        if self.privacy_budget is not None:
            after = self.privacy_budget.spent([*(s.variance for s in others), charge.variance])
            if after > self.privacy_budget.epsilon:
                noise = "no noise" if charge.variance == 0 else f"honest aggregate variance {charge.variance:.4g}"
                raise PrivacyBudgetExhausted(
                    f"run {charge.run_id}: its survivors' release carries {noise}, which takes this node's composed "
                    f"epsilon to {after:.4g} at delta {self.privacy_budget.delta:g}, past its total budget "
                    f"{self.privacy_budget.epsilon:g} (recorded in {self.path}): this node withholds its shares"
                )

    def check_new_session(self, run_id: int, session: bytes) -> None:
        """Raise :class:`LedgerError` if this run and PASS session already spent or released here.

        Called when a session is joined: a retried message of one session is free (:meth:`spend`,
        :meth:`record_release`), so a server that opened a new session under an earlier one's id would get a
        release that no budget charges and that no differencing check sees. A readable ledger is required.
        """
        key = (int(run_id), session.hex())
        with self._locked():
            contents = self._read()
        seen = {(record.run_id, record.session) for record in contents.records}
        if key in seen | {(spend.run_id, spend.session) for spend in contents.spends}:
            raise LedgerError(
                f"run {run_id}, session {key[1][:16]}: already spent or released in {self.path}; a new session "
                "under its id is refused"
            )

    def check_session_cap(
        self, run_id: int, session: bytes, allowance: DrawAllowance, now: float | None = None
    ) -> None:
        """Raise :class:`SessionCapReached` if drawing in ``session`` now is past the node's ``allowance``.

        The sparse secure mode's degrees bound a victim's risk over every placement the buyer sees: each draw is one
        (the signed out-neighbours), which the buyer may keep, by running the session on to the mask round, or throw
        away, by stopping it. Counted over every session, of any run, that this node drew in (:meth:`record_draw`,
        write-ahead) or masked in (its spends), whatever the node's in-memory state (neither a re-launch, a restart
        nor a new Flower run starts a fresh count):

        * for good, past ``allowance.lifetime`` sessions: the placements its degrees were sized for;
        * for a while, past ``allowance.per_release`` draws since its last release (the last draw whose session it
          released), each counted for ``allowance.wait`` seconds after it was made: so a buyer sees at most
          ``per_release`` placements a release, or a ``wait`` without one, and a buyer that stops its sessions locks
          the node out for at most ``wait`` after its last draw.

        A session already counted is a retried message and passes. Records nothing. ``now``: the node's clock
        (:func:`time.time`) unless given.
        """
        with self._locked():
            contents = self._read()
        self._check_session_cap(contents, (int(run_id), session.hex()), allowance, _now(now))

    def record_draw(self, run_id: int, session: bytes, allowance: DrawAllowance, now: float | None = None) -> None:
        """Check the session cap (:meth:`check_session_cap`) and record the draw and its time, before it leaves
        (write-ahead).

        A draw that never reaches the mask round spends no privacy, so without this record a buyer could stop each
        session after the draw, close the market, re-launch it, restart the node or start another run, and draw
        again, past the placements the degrees were computed for. Recording the same run and session again is a
        no-op (a retried message).

        Raises
        ------
        SessionCapReached
            The ledger holds ``allowance.lifetime`` sessions, or ``allowance.per_release`` draws made within
            ``allowance.wait`` seconds and since the last release.
        LedgerError
            The ledger file cannot be read, parsed or written: nothing is drawn.
        """
        key, at = (int(run_id), session.hex()), _now(now)
        with self._locked():
            contents = self._read()
            if not self._check_session_cap(contents, key, allowance, at):
                self._write(contents._replace(draws=[*contents.draws, (*key, at)]))

    def _check_session_cap(
        self, contents: _LedgerFile, key: tuple[int, str], allowance: DrawAllowance, now: float
    ) -> bool:
        """:class:`SessionCapReached` past the allowance; ``True`` if the session ``key`` is already counted (a
        retry)."""
        drawn = [(run, session) for run, session, _ in contents.draws]
        counted = {(spend.run_id, spend.session) for spend in contents.spends} | set(drawn)
        if key in counted:
            return True
        if len(counted) >= allowance.lifetime:
            raise SessionCapReached(
                f"this node drew or masked in {len(counted)} PASS sessions ({self.path}), the {allowance.lifetime} "
                f"placements its sparse secure degrees are sized for: run {key[0]}'s further session is refused, as "
                "is every later one"
            )
        released = {(record.run_id, record.session) for record in contents.records}
        last = max((i for i, pair in enumerate(drawn) if pair in released), default=-1)
        pending = sorted(at for _, _, at in contents.draws[last + 1 :] if at > now - allowance.wait)
        if len(pending) >= allowance.per_release:
            free = pending[len(pending) - allowance.per_release] + allowance.wait
            raise SessionCapReached(
                f"this node drew in {len(pending)} PASS sessions within {allowance.wait:g} s and since its last "
                f"release ({self.path}), the {allowance.per_release} its settings allow: run {key[0]}'s further "
                f"session is refused; it draws again after a release or in {max(free - now, 0.0):.0f} s"
            )
        return False

    def check(self, run_id: int, session: bytes, members: Iterable[bytes]) -> None:
        """Raise :class:`ReleaseRefused` if releasing a sum over ``members`` now would be refused; record nothing.

        A readable ledger is required (``LedgerError`` otherwise).
        """
        with self._locked():
            contents = self._read()
            self._check(contents.records, self._record(contents.salt, run_id, session, members))

    def record_release(self, run_id: int, session: bytes, members: Iterable[bytes]) -> None:
        """Check ``members`` against every earlier release and record it, before the node releases anything.

        Recording the same run, session and members again is a no-op (a retried message).

        Raises
        ------
        ReleaseRefused
            The new set differs from an earlier one by a non-empty group of fewer than ``min_roster_change``
            members (either way), or the session was recorded with another member set.
        LedgerError
            The ledger file cannot be read, parsed or written: nothing is released.
        """
        with self._locked():
            contents = self._read()
            record = self._record(contents.salt, run_id, session, members)
            if not self._check(contents.records, record):
                self._write(contents._replace(records=[*contents.records, record]))

    @staticmethod
    def _record(salt: bytes, run_id: int, session: bytes, members: Iterable[bytes]) -> ReleaseRecord:
        return ReleaseRecord(int(run_id), session.hex(), frozenset(_member_hash(salt, m) for m in members))

    def _check(self, records: list[ReleaseRecord], record: ReleaseRecord) -> bool:
        """``ReleaseRefused`` unless ``record`` may be released; ``True`` if it is already recorded."""
        for earlier in records:
            if (earlier.run_id, earlier.session) == (record.run_id, record.session):
                if earlier.members == record.members:
                    return True
                raise ReleaseRefused(
                    f"run {record.run_id}, session {record.session[:16]}: already recorded in {self.path} "
                    "with another member set"
                )
            if isolates_a_small_group(earlier.members, record.members, self.min_roster_change):
                left, joined = len(earlier.members - record.members), len(record.members - earlier.members)
                raise ReleaseRefused(
                    f"the {len(record.members)} members of run {record.run_id} differ from those of run "
                    f"{earlier.run_id} (recorded in {self.path}) by {left} left and {joined} joined: a "
                    f"difference of the two sums would isolate fewer than {self.min_roster_change} clients"
                )
        return False

    # --- Storage -------------------------------------------------------------------------------
    def _locked(self) -> contextlib.AbstractContextManager[None]:
        """Hold the directory's lock file (exclusive, between processes) for one read-check-write."""
        return _locked(self.directory, _LOCK_FILE, f"release ledger {self.path}")

    def _read(self) -> _LedgerFile:
        """The file's contents; a missing file is an empty ledger with a fresh salt; anything else fails."""
        if not self.path.exists():
            return _LedgerFile(os.urandom(32), [], [], [])
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or data.get("version") not in _READABLE_LEDGER_VERSIONS:
                raise ValueError(f'not an object with "version" one of {_READABLE_LEDGER_VERSIONS}')
            salt = bytes.fromhex(data["salt"])
            spent = data["spent"] if data["version"] >= 2 else []
            drawn = data["drawn"] if data["version"] >= 3 else []
            if len(salt) != 32 or not all(isinstance(items, list) for items in (data["records"], spent, drawn)):
                raise ValueError("needs a 32-byte hex salt, a list of records, of spends (version 2), of draws (3)")
            return _LedgerFile(
                salt,
                [_parse_record(item) for item in data["records"]],
                [_parse_spend(item) for item in spent],
                [_parse_draw(item) for item in drawn],
            )
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise LedgerError(
                f"release ledger {self.path} is unreadable ({err}): this node releases nothing until the file is "
                "repaired or moved away (fail closed)"
            ) from err

    def _write(self, contents: _LedgerFile) -> None:
        """Replace the file atomically (:func:`_replace_atomically`)."""
        text = json.dumps(
            {
                "version": _LEDGER_VERSION,
                "salt": contents.salt.hex(),
                "records": [r.to_json() for r in contents.records],
                "spent": [s.to_json() for s in contents.spends],
                "drawn": [{"run_id": run, "session": session, "time": at} for run, session, at in contents.draws],
            },
            indent=1,
        )
        _replace_atomically(self.path, text, f"release ledger {self.path}")


class RosterHistory:
    """The buyer's record of the member sets its markets released, to plan a roster no client's ledger refuses.

    One JSON file (created with its directory, mode 0600) listing, per market, the node ids whose counts
    were in its ``N_s`` (``MarketOutcome.pass_participants``). The buyer knows these sets anyway; the file
    only lets it remember them across Flower runs. :meth:`plan` is :func:`plan_roster` over them: the clients
    still check for themselves (their ledgers may hold other buyers' markets, and they trust no plan).

    Parameters
    ----------
    path : str or os.PathLike
        The history file (its directory is created if missing). A file that exists but cannot be read
        raises :class:`LedgerError` naming it: the buyer then runs no market rather than one the clients refuse.
    min_roster_change : int (default: 3)
        The clients' ``market-min-roster-change``: the smallest one-sided difference between two releases.
    """

    def __init__(self, path: str | os.PathLike[str], *, min_roster_change: int = DEFAULT_MIN_ROSTER_CHANGE):
        _check_min_roster_change(min_roster_change)
        self.path = Path(path).expanduser()
        self.min_roster_change = min_roster_change

    def releases(self) -> list[frozenset[int]]:
        """The member sets recorded so far, oldest first (``LedgerError`` if the file is unreadable)."""
        with self._locked():
            return self._read()

    def plan(self, candidates: Iterable[int]) -> list[int]:
        """The roster to run: :func:`plan_roster` of ``candidates`` against every recorded release."""
        return plan_roster(candidates, self.releases(), self.min_roster_change)

    def record(self, members: Iterable[int]) -> None:
        """Append the member set of a sum just released (the same set as the last one is not repeated)."""
        release = frozenset(int(node) for node in members)
        with self._locked():
            releases = self._read()
            if releases and releases[-1] == release:
                return
            text = json.dumps({"version": _VERSION, "releases": [sorted(r) for r in [*releases, release]]})
            _replace_atomically(self.path, text, f"roster history {self.path}")

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        return _locked(self.path.parent, self.path.name + ".lock", f"roster history {self.path}")

    def _read(self) -> list[frozenset[int]]:
        if not self.path.exists():
            return []
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or data.get("version") != _VERSION:
                raise ValueError(f'not an object with "version": {_VERSION}')
            releases = data["releases"]
            if not isinstance(releases, list) or not all(
                isinstance(r, list) and all(isinstance(n, int) and not isinstance(n, bool) for n in r) for r in releases
            ):
                raise ValueError('"releases" must be a list of lists of node ids')
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise LedgerError(
                f"roster history {self.path} is unreadable ({err}): repair or move it away (the buyer cannot plan "
                "a roster the clients' ledgers accept without it)"
            ) from err
        return [frozenset(r) for r in releases]


def _check_min_roster_change(value: object) -> None:
    """``ValueError`` unless ``value`` is an int >= 1 (the node's and the buyer's ``min_roster_change``)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"min_roster_change must be an int >= 1, got {value!r}")


@contextlib.contextmanager
def _locked(directory: Path, lock_name: str, what: str) -> Iterator[None]:
    """Hold ``directory/lock_name`` (exclusive ``flock``, between processes); ``LedgerError`` naming ``what``."""
    try:
        import fcntl  # pylint: disable=import-outside-toplevel  (POSIX only: the ledger, not the package)

        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        handle = open(directory / lock_name, "a+b")  # noqa: SIM115 (closed below)
    except ImportError as err:
        raise LedgerError(f"{what} needs POSIX file locks (fcntl): {err}") from err
    except OSError as err:
        raise LedgerError(f"{what} cannot be opened: {err}") from err
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        handle.close()  # releases the lock


def _replace_atomically(path: Path, text: str, what: str) -> None:
    """Replace ``path`` by ``text``: a temporary file beside it, fsync, rename, fsync the directory (mode 0600)."""
    temporary = None
    try:
        with tempfile.NamedTemporaryFile(
            "w", encoding="utf-8", dir=path.parent, prefix=f".{path.stem}-", suffix=".tmp", delete=False
        ) as handle:
            temporary = Path(handle.name)
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o600)
        os.replace(temporary, path)
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    except OSError as err:
        if temporary is not None:
            temporary.unlink(missing_ok=True)
        raise LedgerError(f"{what} cannot be written: {err}") from err


def _member_hash(salt: bytes, member: bytes) -> str:
    """HMAC-SHA256 of a member identity under the ledger's salt, truncated to 128 bits (hex)."""
    return hmac.new(salt, member, hashlib.sha256).digest()[:_DIGEST_BYTES].hex()


def _parse_record(item: Any) -> ReleaseRecord:
    if not isinstance(item, dict):
        raise ValueError("a record must be an object")
    run_id, session, members = item["run_id"], item["session"], item["members"]
    if isinstance(run_id, bool) or not isinstance(run_id, int) or not isinstance(session, str):
        raise ValueError("a record needs an int run_id and a str session")
    bytes.fromhex(session)
    if not isinstance(members, list) or not all(isinstance(m, str) and len(m) == 2 * _DIGEST_BYTES for m in members):
        raise ValueError("a record's members must be a list of hex digests")
    return ReleaseRecord(run_id, session, frozenset(members))


def _parse_draw(item: Any) -> tuple[int, str, float]:
    """A draw ``(run id, session hex, time)``; a draw of version 3, without its time, was made long ago (0)."""
    if not isinstance(item, dict):
        raise ValueError("a draw must be an object")
    run_id, session, at = item["run_id"], item["session"], item.get("time", 0.0)
    if isinstance(run_id, bool) or not isinstance(run_id, int) or not isinstance(session, str):
        raise ValueError("a draw needs an int run_id and a str session")
    if isinstance(at, bool) or not isinstance(at, int | float) or not math.isfinite(at):
        raise ValueError("a draw's time must be a finite number of seconds")
    bytes.fromhex(session)
    return run_id, session, float(at)


def _now(now: float | None) -> float:
    """``now``, or the node's clock."""
    return time.time() if now is None else float(now)


def _parse_spend(item: Any) -> PrivacySpend:
    if not isinstance(item, dict):
        raise ValueError("a spend must be an object")
    run_id, session, variance = item["run_id"], item["session"], item["variance"]
    if isinstance(run_id, bool) or not isinstance(run_id, int) or not isinstance(session, str):
        raise ValueError("a spend needs an int run_id and a str session")
    bytes.fromhex(session)
    if isinstance(variance, bool) or not isinstance(variance, int | float) or not 0 <= variance < math.inf:
        raise ValueError("a spend's variance must be a finite number >= 0")
    return PrivacySpend(run_id, session, float(variance))
