"""PASS over Flower messages: the server's rounds of :class:`~flmarket_flwr.pass_protocol.PassServer`, or of the
sparse secure mode's :class:`~flmarket_flwr.pass_protocol.sparse_server.SparseSecureServer` where the secure profile
picks it (:meth:`MarketConfig.runs_sparse`).

:class:`PassRounds` sends each round's ``query`` message to every client (the protocol message's own
``ConfigRecord``) and feeds the valid replies back to the pure protocol object, which builds the next round.
A node whose reply is missing, an error or malformed leaves PASS at that round with a logged reason.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from flwr.app import ConfigRecord, Message
from flwr.serverapp import Grid
from numpy.typing import NDArray

from flmarket_flwr.market.buyer.config import MarketConfig, PassSession
from flmarket_flwr.market.buyer.errors import MarketError
from flmarket_flwr.market.wire.award import binding_quorum
from flmarket_flwr.market.wire.messages import (
    ACTION_ADVERTISE,
    ACTION_DRAW,
    ACTION_MASK,
    ACTION_SHARE,
    ACTION_SURVIVORS,
    ACTION_UNMASK,
    AdvertiseTerms,
    ReplyError,
    RosterNodeIds,
    RosterWanted,
    read_config,
)
from flmarket_flwr.market.wire.records import config_record
from flmarket_flwr.pass_protocol import PassError, PassServer
from flmarket_flwr.pass_protocol.sparse_server import SparseSecureServer

__all__ = ["PassResult", "PassRounds", "sessions_summary"]


@dataclass
class PassResult:
    """What PASS gave the market: the survivors, their summed counts, and what binds them.

    Attributes
    ----------
    participants : list[int]
        Node ids whose counts are in ``global_counts`` (the survivors U3), ascending.
    global_counts : NDArray[np.int64]
        ``N_s`` over the survivors (with ``MarketConfig.noise``: plus the clients' noise, clipped below at 0).
    session : bytes
        The PASS session id.
    transcript : bytes
        Hash of the session and the survivors, which every survivor recorded and checks at the bid step.
    indices : dict[int, int]
        Node id -> PASS index.
    commitments : dict[int, bytes]
        Node id -> the survivor's commitment to its counts (opened by winners in the audit).
    """

    participants: list[int]
    global_counts: NDArray[np.int64]
    session: bytes
    transcript: bytes
    indices: dict[int, int]
    commitments: dict[int, bytes]


class Messenger(Protocol):
    """What PASS needs from the market phase: message rounds, validation and exclusion."""

    def exchange(self, grid: Grid, action: str, requests: Mapping[int, ConfigRecord]) -> dict[int, Message]:
        """Send one request per node; return the replies received in time."""

    def validated(
        self, action: str, requests: Mapping[int, Any], replies: Mapping[int, Message], read: Any
    ) -> dict[int, Any]:
        """Read every reply; exclude the missing and malformed ones."""

    def exclude(self, node: int, action: str, reason: str) -> None:
        """Leave ``node`` out with a logged reason."""

    def require_enough(self, nodes: Sequence[int], where: str) -> None:
        """Raise ``MarketError`` if too few nodes are left."""

    def is_excluded(self, node: int) -> bool:
        """Whether ``node`` was already excluded (with its own reason)."""


class PassRounds:
    """Run one PASS session over a ``Grid`` for a :class:`~flmarket_flwr.market.buyer.server.MarketPhase`.

    Parameters
    ----------
    config : MarketConfig
        The market's settings (classes, count bound, neighbourhood, directory).
    messenger : Messenger
        The market phase, which sends the messages and keeps the exclusions.
    session : bytes
        A fresh, unpredictable session id.
    terms : AdvertiseTerms, optional
        The market's terms (budget, cohort cap, buyer key: :mod:`flmarket_flwr.market.wire.award`), sent with
        every advertise request so that they are fixed before any count is summed.

    Notes
    -----
    Each round sends one ``query`` message per client (``market_advertise``, in the sparse secure mode
    ``market_draw``, ``market_share``, ``market_mask``, with an identity directory the consistency round
    ``market_survivors``, and ``market_unmask``) whose ``ConfigRecord`` is the
    protocol message's own record, and feeds the valid replies back to the pure protocol object, which builds
    the next round. A node whose reply is missing, an error or malformed leaves PASS at that round with a
    logged reason; the dropped clients' masks are recovered from Shamir shares, never by a second sum, and a
    session that cannot finish safely stops with :class:`MarketError`. Whether it stopped before any unmask
    request went out (:attr:`PassRounds.unmask_requested`) decides whether the market phase may run a fresh
    session without the clients it named: no client has then released anything.
    """

    def __init__(
        self, config: MarketConfig, messenger: Messenger, session: bytes, terms: AdvertiseTerms | None = None
    ) -> None:
        self._messenger = messenger
        self._config = config
        self._session = session
        self._terms = {} if terms is None else terms.to_record()
        self._server: PassServer | SparseSecureServer = self._protocol(run_id=0)
        self.unmask_requested = False
        """Whether the unmask round was reached (some client may have sent shares): no second session then."""

    def _protocol(self, run_id: int, invited: int = 0) -> PassServer | SparseSecureServer:
        """The protocol object for this session over ``invited`` clients, bound to the run id: the sparse secure
        mode where :meth:`MarketConfig.runs_sparse` says so, else :class:`PassServer` (the secure profile: on the
        complete graph)."""
        config = self._config
        settings = config.sparse_settings
        if settings is not None and config.directory is not None and config.runs_sparse(invited):
            return SparseSecureServer(
                self._session,
                config.num_classes,
                config.count_bound,
                settings=settings,
                directory=config.directory,
                run_id=run_id,
            )
        neighbours = "all" if config.security == "malicious" else config.neighbours
        return PassServer(
            self._session,
            config.num_classes,
            config.count_bound,
            degree=_degree(neighbours),
            directory=config.directory,
            run_id=run_id,
        )

    def run(self, grid: Grid, nodes: Sequence[int]) -> PassResult:
        """Run the rounds over ``nodes`` and return the result.

        Raises
        ------
        MarketError
            Too few clients at some round, a secret without enough shares, or ``N_s`` out of its bounds.
        """
        server = self._server = self._protocol(int(grid.run.run_id), len(nodes))
        server.noise_slack = self._config.noise_tolerance
        try:
            if isinstance(server, SparseSecureServer):
                requests = self._sparse_keys_round(grid, server, nodes)
            else:
                requests = self._keys_round(grid, server, nodes)
            requests = server.receive_masked(self._round(grid, ACTION_MASK, requests))
            if server.directory is not None:
                requests = server.receive_signatures(self._round(grid, ACTION_SURVIVORS, requests))
            self.unmask_requested = True
            server.receive_unmask(self._round(grid, ACTION_UNMASK, requests))
            total = server.finish()
        except PassError as err:
            self._report_exclusions()
            raise MarketError(f"PASS stopped: {err}") from err
        self._report_exclusions()
        survivors = [server.node_of[index] for index in server.survivors]
        self._messenger.require_enough(survivors, "PASS")
        return PassResult(
            participants=sorted(survivors),
            global_counts=np.maximum(total, 0),  # noise can take a rare class below zero: clip, then score
            session=server.session,
            transcript=server.transcript,
            indices={server.node_of[index]: index for index in server.survivors},
            commitments={server.node_of[index]: server.commitments[index] for index in server.survivors},
        )

    def _keys_round(self, grid: Grid, server: PassServer, nodes: Sequence[int]) -> Mapping[int, Any]:
        """Advertise and share keys on the server's graph; the mask round's requests."""
        requests: Mapping[int, Any] = server.advertise_requests(list(nodes))
        adverts = self._round(grid, ACTION_ADVERTISE, requests, self._terms, to=set(requests))
        wanting = {index for index, advert in adverts.items() if _wants_roster(advert)}
        node_ids = [server.node_of[index] for index in sorted(server.node_of)]
        roster = RosterNodeIds(np.asarray(node_ids, dtype=">u8").tobytes()).to_record()  # one shared bytes object
        requests = server.receive_advertisements(adverts)
        return server.receive_shares(self._round(grid, ACTION_SHARE, requests, roster, to=wanting))

    def _sparse_keys_round(self, grid: Grid, server: SparseSecureServer, nodes: Sequence[int]) -> Mapping[int, Any]:
        """Advertise, draw (the clients' own out-neighbours) and share keys; the mask round's requests.

        With audited winners, the nodes count the award's endorsements over the pinned directory in this mode
        (:func:`~flmarket_flwr.market.wire.award.binding_quorum` of ``|D|`` and ``c``): a roster of fewer than that
        quorum plus the ``c`` colluders, who may withhold theirs, could leave the award short, so it is refused here,
        before any message.
        """
        config = self._config
        settings = server.settings
        if config.audit_winners and config.directory is not None:
            floor = binding_quorum(config.directory.members, settings.colluders) + settings.colluders
            if len(nodes) < floor:
                raise PassError(
                    f"the sparse secure mode over {len(nodes)} clients: the award's quorum over the directory of "
                    f"{config.directory.members} with {settings.colluders} colluders needs a roster of at least "
                    f"{floor} "
                    "(MarketConfig.pass_colluders; run config pass-colluders)"
                )
        requests: Mapping[int, Any] = server.advertise_requests(list(nodes))
        adverts = self._round(grid, ACTION_ADVERTISE, requests, self._terms, to=set(requests))
        requests = server.receive_advertisements(adverts)
        requests = server.receive_draws(self._round(grid, ACTION_DRAW, requests))
        return server.receive_shares(self._round(grid, ACTION_SHARE, requests))

    def _round(
        self,
        grid: Grid,
        action: str,
        requests: Mapping[int, Any],
        extra: Mapping[str, Any] | None = None,
        to: Collection[int] = (),
    ) -> dict[int, dict[str, Any]]:
        """Send each PASS index its request (and the indices in ``to`` the ``extra`` fields too); return
        ``{index: reply record}`` of the usable replies."""
        node_of = self._server.node_of
        fields = dict(extra or {})
        records = {
            node_of[i]: config_record({**request.to_record(), **(fields if i in to else {})})
            for i, request in requests.items()
        }
        replies = self._messenger.exchange(grid, action, records)
        valid = self._messenger.validated(action, records, replies, _reply_record)
        if records and not replies:  # say what happened: silence, not bad keys or shares
            timeout = self._config.step_timeout(len(records))
            raise PassError(f"no node answered {action} within {timeout:g} s ({len(records)} asked)")
        return {self._server.index_of[node]: record for node, record in valid.items()}

    @property
    def wronged(self) -> list[int]:
        """Node ids this session excluded only because convicted senders garbled their shares to them."""
        return sorted(self._server.node_of[index] for index in self._server.wronged)

    def _report_exclusions(self) -> None:
        """Hand the protocol's own exclusions (bad keys, shares, sizes) to the market's log, once each; a client
        convicted of a deviation is named for it even if the market had left it out as a dropout."""
        for index, reason in self._server.excluded.items():
            node = self._server.node_of[index]
            if not self._messenger.is_excluded(node) or index in self._server.culprits:
                self._messenger.exclude(node, "PASS", reason)


def sessions_summary(sessions: Sequence[PassSession], reruns: int) -> str:
    """How many PASS ``sessions`` ran of the ``reruns`` + 1 allowed, and whom each named, for an error message."""
    named = [node for session in sessions for node in session.named]
    each = ", ".join(f"session {number}: {session.named}" for number, session in enumerate(sessions, start=1))
    return (
        f"{len(sessions)} PASS session(s) ran, the first and {len(sessions) - 1} re-run(s) of at most {reruns} "
        f"(MarketConfig.pass_reruns; run config pass-reruns), naming {len(named)} client(s) {named} ({each})"
    )


def _wants_roster(advert: Mapping[str, Any]) -> bool:
    """Whether an advertisement asks for the roster's node ids (an unreadable :class:`RosterWanted`: no)."""
    try:
        return RosterWanted.from_record(advert).roster_wanted
    except ReplyError:
        return False


def _reply_record(reply: Message) -> dict[str, Any]:
    """The reply's market record as a plain dict (the protocol object type-checks every field)."""
    return dict(read_config(reply).items())


def _degree(neighbours: int | str) -> int | None:
    """``PassServer``'s degree for the ``neighbours`` setting (``None``: sized from the number of clients)."""
    if neighbours == "auto":
        return None
    if neighbours == "all":
        return 2**31  # capped at E - 1 by the server: the complete graph
    return int(neighbours)
