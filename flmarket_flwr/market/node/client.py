"""Client side of the market: the ``query`` handlers added to a ``ClientApp`` in one line.

Usage::

    app = ClientApp()
    register_market_handlers(app, my_label_counts, CostBasedBid(0.01))

(a ``client_fn`` app puts the same handlers in its mods: :func:`~flmarket_flwr.market.node.mod.market_mod`).

The client enforces its own disclosure rules whatever the server asks: it never sends its counts during
PASS, releases at most one sum per run, opens its counts only as a winner of an award it checked and
endorsed, and wipes its keys; the rules are listed in :func:`register_market_handlers` (tests:
docs/threat-model.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from logging import WARNING
from typing import TYPE_CHECKING, Any, Final

import numpy as np
from flwr.app import ConfigRecord, Context, Error, Message
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode
from flwr.supercore import log
from numpy.typing import NDArray

from flmarket_flwr.market.node.bidding import DEFAULT_COST_PER_SAMPLE, BidPolicy, CostBasedBid
from flmarket_flwr.market.wire.award import (
    Award,
    AwardTerms,
    SignedAward,
    binding_quorum,
    check_award,
    count_endorsements,
    opening_quorum,
    unpack_endorsements,
)
from flmarket_flwr.market.wire.ledger import LedgerError, PrivacyBudgetExhausted, ReleaseLedger
from flmarket_flwr.market.wire.messages import (
    ACTION_ADVERTISE,
    ACTION_AUDIT,
    ACTION_AWARD,
    ACTION_BID,
    ACTION_BIND,
    ACTION_DRAW,
    ACTION_ENDORSE,
    ACTION_MASK,
    ACTION_SHARE,
    ACTION_SURVIVORS,
    ACTION_TAGS,
    ACTION_UNMASK,
    KEY_AWARD,
    KEY_AWARD_SIGNATURE,
    KEY_PAYMENT,
    KEY_WON,
    LABEL_COUNTS_FAILED,
    LEDGER_REFUSED,
    PRIVACY_BUDGET_REFUSED,
    RECORD_KEY,
    REQUEST_REFUSED,
    AdvertiseTerms,
    AuditReply,
    AuditRequest,
    AwardReply,
    AwardRequest,
    BidReply,
    BidRequest,
    BindReply,
    BindRequest,
    EndorseReply,
    EndorseRequest,
    ReplyError,
    RosterNodeIds,
    RosterWanted,
    TagsReply,
    make_content,
    refusal_reason,
)
from flmarket_flwr.market.wire.records import config_record, set_values
from flmarket_flwr.pass_protocol import PassClient, PassError
from flmarket_flwr.pass_protocol.encoding import bitmap_bits, bitmap_to_indices, roster_fingerprint
from flmarket_flwr.pass_protocol.identity import (
    bind_members,
    sign_award_endorsement,
    sign_bid,
    sign_member_binding,
    unpack_member_bindings,
)
from flmarket_flwr.pass_protocol.primitives import validate_counts
from flmarket_flwr.pass_protocol.sparse_client import SparseSecureClient
from flmarket_flwr.pass_protocol.sparse_state import SparseAdvertised
from flmarket_flwr.pricing import score as compute_score

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from flmarket_flwr.market.node.node_config import NodeSettings
    from flmarket_flwr.pass_protocol.identity import IdentityDirectory
    from flmarket_flwr.pass_protocol.sparse_secure import SparseSecureSettings

__all__ = ["MarketAward", "market_handlers", "read_award", "register_market_handlers"]

_MAX_CAUSE_CHARS = 300

LabelCountsFn = Callable[[Context], NDArray[np.integer]]
SettingsFn = Callable[[Context], "NodeSettings"]
"""``context -> NodeSettings``: the node's settings at one message (default: its node config's)."""
SessionClient = PassClient | SparseSecureClient
"""A node's PASS client in either mode; the glue reads both through :class:`~.client_state.SessionView`."""
_SPARSE_REQUEST_KEY: Final = "dropout_ppm"
"""A key only the sparse secure mode's advertise request has (:class:`~.messages.SparseAdvertiseRequest`)."""

_PASS_PREFIX = "pass/"
_STAGE = "stage"
_STAGE_BID = "bid"
_STAGE_AUDITED = "audited"
_STAGE_CLOSED = "closed"
_LEDGER_ROSTER = "ledger-roster"
"""The roster's node ids in PASS-index order (big-endian uint64 words), from the share request (the sparse secure mode:
the draw request), checked against the roster fingerprint, for the ledger and the award's checks."""
_SPARSE = "pass-sparse"
"""Whether the PASS state under ``pass/`` is the sparse secure mode's (:class:`SparseSecureClient`)."""
_MARKET_SESSIONS = "pass-market-sessions"
"""The sparse secure sessions of the market under way in which this client drew out-neighbours (capped at its own
``pass-reruns + 1``)."""
_EARLIER_SESSIONS = "pass-earlier-sessions"
"""The PASS sessions of this run that this client left before it was asked to unmask, or that closed before a
re-launch (never joined again)."""
_ENDORSED = "endorsed-award"
_ENDORSED_SIGNATURE = "endorsed-award-signature"
_ENDORSED_WON = "endorsed-award-won"
_ENDORSED_PAYMENT = "endorsed-award-payment"
"""The award this client endorsed (one per session), the buyer's signature on it (what an audit must show), and what it
gives this client (read back when the final award is named by its digest, without decoding it again)."""
_OPENED = "opened-counts"
"""Whether this client opened its counts to the buyer in the market it last closed (kept with its receipt)."""
_EARLIER_AWARDS = "market-earlier-awards"
"""The receipts of this run's earlier markets (award, signature, award, signature, ...), kept across re-launches."""


class _RequestError(ValueError):
    """A market request the client refuses to serve; answered with a generic error reply."""


class _LabelCountsError(ValueError):
    """The app's ``get_label_counts`` raised; the reply names its exception."""


@dataclass(frozen=True)
class MarketAward:
    """What a client learnt from the market, as kept in its ``context.state``.

    Attributes
    ----------
    won : bool
        Whether the award names the client a winner.
    payment : float
        The payment the award promises it (``0.0`` for a loser); in a market that audits its winners, it is due
        once the client has opened its counts (``opened``), and then the client is asked to train.
    score : float or None
        The score it reported (``None`` if it never reached the bid step).
    bid : float or None
        The bid it reported.
    award : bytes or None
        The buyer-signed award's canonical encoding (:class:`~flmarket_flwr.market.wire.award.Award`), the client's
        receipt; ``None`` if the market closed without one.
    signature : bytes or None
        The buyer's Ed25519 signature on ``award``.
    buyer_key : bytes or None
        The buyer's Ed25519 public key (32 bytes) from the terms announced before PASS, which ``signature``
        verifies under (:meth:`~flmarket_flwr.market.wire.award.SignedAward.verify`).
    opened : bool
        Whether the client opened its counts to the buyer for this award (the winners' audit).
    """

    won: bool
    payment: float
    score: float | None
    bid: float | None
    award: bytes | None = None
    signature: bytes | None = None
    buyer_key: bytes | None = None
    opened: bool = False


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
    sent, terms = _sent_bid(record), _kept_terms(record)
    award, signature = record.get(KEY_AWARD), record.get(KEY_AWARD_SIGNATURE)
    return MarketAward(
        won=bool(record[KEY_WON]),
        payment=float(record.get(KEY_PAYMENT, 0.0)),  # type: ignore[arg-type]
        score=None if sent is None else sent[0],
        bid=None if sent is None else sent[1],
        award=award if isinstance(award, bytes) else None,
        signature=signature if isinstance(signature, bytes) else None,
        buyer_key=None if terms is None else terms.terms_buyer_key,
        opened=record.get(_OPENED) is True,
    )


def register_market_handlers(
    app: ClientApp,
    label_counts: LabelCountsFn,
    bid_policy: BidPolicy | None = None,
    *,
    settings: SettingsFn | None = None,
) -> None:
    """Add the market's ``query`` handlers to an existing ``ClientApp``.

    Registers ``query.market_advertise``, ``market_draw`` (the sparse secure mode), ``market_share``,
    ``market_mask``, ``market_survivors``, ``market_unmask`` (PASS), ``market_bid``, ``market_endorse``,
    ``market_audit``, ``market_award`` and ``market_tags`` (the node's ``market-tag``, for a buyer that includes or
    excludes nodes by tag).

    At each message the node's settings are read once, from its own node config
    (:func:`.node_config.read_node_settings`; ``python -m flmarket_flwr.market.node.node_config`` lists the keys):
    a SuperNode started with ``market-security='malicious'`` and its identity material runs the secure profile
    with no change to the app's code. A node config that cannot work is refused at every message.

    Parameters
    ----------
    app : ClientApp
        A ``ClientApp`` built with decorators (a ``client_fn`` app puts :func:`~.mod.market_mod` in its mods).
    label_counts : Callable[[Context], numpy.ndarray]
        Returns the client's per-class label counts ``N_e``: shape ``(C,)``, non-negative integers,
        the same every time. Called once per market message that needs them, possibly in a fresh process (as in a
        deployment): read them the way the app loads its partition, and cache them in ``context.state`` if that
        is slow.
    bid_policy : BidPolicy, optional
        The client's bid policy; defaults to ``CostBasedBid(DEFAULT_COST_PER_SAMPLE)``.
    settings : Callable[[Context], NodeSettings], optional
        The node's settings at one message, in place of the node config's
        (:class:`~flmarket_flwr.market.node.node_config.NodeSettings` lists them and what each guards against): for an
        app that reads something elsewhere, such as the run's announced noise
        (``lambda context: read_node_settings(context, announced_noise=...)``), or a test that hands a node its
        keys (``lambda context: NodeSettings(identity_key=..., directory=...)``).

    Raises
    ------
    ValueError
        If one of the actions is already registered on ``app``, or ``app`` uses a ``client_fn`` (such an app takes
        the market as a mod: :func:`~flmarket_flwr.market.node.mod.market_mod`).

    Notes
    -----
    The client enforces its own disclosure rules, whatever the server asks:

    * its label-count vector ``N_e`` is never sent during PASS (the server gets public keys, encrypted
      shares of other clients' secrets, and ``Y_e``, which is uniform on its own). It opens its counts
      commitment to the buyer once, for the audit of its score, and only as a *winner* of a signed award
      (:mod:`flmarket_flwr.market.wire.award`): the buyer's terms (the auction's budget, cohort cap, its Ed25519 key;
      with ``NodeSettings.buyer_key`` pinned by the node) come with the advertisement, before PASS; after the
      auction the client checks the buyer-signed award (its own score and bid in its bids tree as sent, every bidder it
      names a survivor, the winners and payments those of ``run_auction`` over the auction's decisive head
      under the terms) and endorses it, once per session: the award is never re-issued. It opens only for
      the award it endorsed, that pays it at least its bid, and with a directory that a quorum of the
      session's survivors endorsed (node config ``pass-colluders``: so the buyer cannot show different
      bidders different awards). The signed award is its receipt (:func:`read_award`), kept whatever the
      closing message says. ``NodeSettings(audit=False)`` makes it refuse, and then it cannot be paid.
      Its score and bid are functions of its counts and are sent: ``CostBasedBid`` reveals ``N_e`` to
      anyone who knows its cost (docs/threat-model.md);
    * at most one released PASS session per run: a client joins a fresh session of the same run (the
      server's re-run after a session failed before releasing anything) only if it was never asked to
      unmask nor to bid in that run, and after an unmask request it refuses every later session, so the
      server never gets two sums of one run to difference; each step is answered once, in order. The one
      exception: a market re-launched in the same run after the earlier one closed (``FLMarket``'s ``relaunch``)
      is joined by a client whose release ledger has a privacy budget (the secure profile), each release then
      charged to that privacy budget as below. Two runs are two sums:
      with a release ledger (:mod:`flmarket_flwr.market.wire.ledger`) the client records the members of
      every sum it releases, in its own directory, and refuses to unmask for a survivor set that,
      differenced with an earlier one, would isolate fewer than ``min_roster_change`` clients. That rule
      does not stop colluders who leave with a victim; the noise does: before its masked input leaves, the
      ledger records the release's privacy cost and refuses it past the node's privacy budget, if it has one;
    * with an identity key and a directory (the secure set-up) its advert is signed under the run,
      the session and the roster, its neighbours' adverts are checked the same way, and it unmasks only
      for the survivor set it signed, with ``t`` of its neighbours' signatures on it (the consistency
      round); without them the server is trusted to relay keys and sets (semi-honest server only);
    * in the secure profile it takes part on the complete graph, or in the sparse secure mode
      (docs/threat-model.md, "The sparse secure profile") under settings no weaker than its own
      (:attr:`NodeSettings.sparse`) and the ``(k, t)`` it computes for them: it draws its own out-neighbours,
      shares and masks on them only, draws in at most ``reruns + 1`` sessions (its own ``pass-reruns``) of a market,
      and, its release ledger holding the count, ``reruns + 1`` a release or a ``pass-redraw-wait`` and ``(reruns +
      1) x pass-markets`` over its life, and as a winner opens only with the endorsements of a quorum of the pinned
      directory;
    * a neighbour whose shares do not open is accused, not fatal: the client masks without it and sends
      that edge's channel secret with a proof of it, which opens the edge's two share pairs (both of which
      the accused holds) and nothing else; only when the accused proved possession of its cipher key, and
      with a directory only for a ciphertext its sender signed; left with fewer than ``t`` senders by its
      accusations it withdraws, sending them without a masked input;
    * it bids once, for the session whose sum it took part in, with that session's ``E`` and
      transcript hash; a global count below its own is refused (with noise: below its own by more than
      the noise's tail);
    * private key material lives only in ``context.state`` and is deleted once it has masked, on every
      refusal, and at the final award (which the server sends to every node it contacted);
    * error replies say only which step was refused; the details go to the client's own log. One
      exception: when the app's own ``label_counts`` callback raises, the reply names that exception (type and
      message), so the server can report the root cause instead of a protocol symptom.
    """
    for action, handler in market_handlers(label_counts, bid_policy, settings=settings).items():
        try:
            register = app.query(action)
        except ValueError as err:  # Flower's "Use either `@app.query()` or `client_fn`, but not both"
            raise ValueError(
                "this ClientApp is built with a client_fn, which takes no query handlers: put the market in its mods "
                "instead, ClientApp(client_fn=client_fn, mods=[market_mod(label_counts, ...)]) "
                "(flmarket_flwr.market.market_mod)"
            ) from err
        register(handler)


def market_handlers(
    label_counts: LabelCountsFn,
    bid_policy: BidPolicy | None = None,
    *,
    settings: SettingsFn | None = None,
) -> dict[str, Callable[[Message, Context], Message]]:
    """The market's handlers by ``query`` action: the one set that :func:`register_market_handlers` registers on a
    ``ClientApp`` and that :func:`~flmarket_flwr.market.node.mod.market_mod` answers with.

    Parameters are those of :func:`register_market_handlers`.

    Returns
    -------
    dict[str, Callable[[Message, Context], Message]]
        Action (``market_advertise``, ...) -> handler, each a ``ClientApp`` query function.
    """
    from flmarket_flwr.market.node import node_config  # here, so that `python -m ...node_config` runs it once

    handlers = _MarketHandlers(
        label_counts, bid_policy if bid_policy is not None else CostBasedBid(DEFAULT_COST_PER_SAMPLE)
    )
    read = settings if settings is not None else node_config.read_node_settings
    table: dict[str, Callable[[Message, Context], Message]] = {
        action: _WithSettings(action, handler, read)
        for action, handler in (
            (ACTION_ADVERTISE, handlers.advertise),
            (ACTION_DRAW, handlers.draw),
            (ACTION_SHARE, handlers.share),
            (ACTION_MASK, handlers.mask),
            (ACTION_SURVIVORS, handlers.survivors),
            (ACTION_UNMASK, handlers.unmask),
            (ACTION_BID, handlers.bid),
            (ACTION_ENDORSE, handlers.endorse),
            (ACTION_AUDIT, handlers.audit),
            (ACTION_TAGS, _tags),
            (ACTION_BIND, _bind),
        )
    }
    table[ACTION_AWARD] = handlers.award  # the receipt is kept whatever the node's settings say
    return table


class _WithSettings:
    """One market action: the node's settings read once, then the handler run with them.

    Settings that cannot be read (a node config the profile refuses, an unreadable key file) refuse the message;
    a PASS step's state is wiped then, and a refused bid closes the market for the node, as any refusal of those
    steps does. A module-level class, so that Ray can pickle the ``ClientApp`` that carries it.
    """

    def __init__(
        self,
        action: str,
        handler: Callable[[Message, Context, NodeSettings], Message],
        read: SettingsFn,
    ) -> None:
        self.action, self.handler, self.read = action, handler, read

    def __call__(self, message: Message, context: Context) -> Message:
        """Read the settings and run the handler, or refuse."""
        try:
            settings = self.read(context)
        except (ValueError, TypeError) as err:
            if self.action in _PASS_ACTIONS:
                _close_pass_state(_state_record(context))
            elif self.action == ACTION_BID:
                _state_record(context)[_STAGE] = _STAGE_CLOSED
            return _refusal(message, self.action, err)
        return self.handler(message, context, settings)


_PASS_ACTIONS: Final = frozenset(
    {ACTION_ADVERTISE, ACTION_DRAW, ACTION_SHARE, ACTION_MASK, ACTION_SURVIVORS, ACTION_UNMASK}
)
_TERMS_KEYS: Final = AdvertiseTerms.wire_keys()
"""The keys under which an advertise request carries the market's terms, and this client keeps them."""


def _tags(message: Message, context: Context, settings: NodeSettings) -> Message:
    """The tags step: reply with the node's ``market-tag`` (no market state is read or kept)."""
    return _reply(message, config_record(TagsReply(settings.tag).to_record()))


def _bind(message: Message, context: Context, settings: NodeSettings) -> Message:
    """The bind step (a directory keyed by member): sign which member this node is for this run and node id; given
    every node's binding, check them all against the pinned directory (each signed by its member's own key, no
    member or node twice, this node's own among them) and keep them for the run (:mod:`.node_config`: the handlers
    check the run's neighbours against the bound directory, an empty one before this step)."""
    from flmarket_flwr.market.node.node_config import IDENTITY_STATE_KEY  # pylint: disable=import-outside-toplevel

    pinned, key = settings.member_directory, settings.identity_key
    try:
        if pinned is None or key is None:
            raise _RequestError("this node pins no directory keyed by member (or has no identity key) to bind")
        request = BindRequest.from_record(_request(message))
        run_id, node_id = int(context.run_id), int(context.node_id)
        own = sign_member_binding(key, run_id, node_id, settings.member, pinned.digest())
        if request.bindings is not None:
            bindings = unpack_member_bindings(request.bindings)
            if bindings.get(node_id, (None, b""))[0] != settings.member:
                raise _RequestError("the bindings do not bind this node to its own member")
            bind_members(pinned, bindings, run_id)
            context.state[IDENTITY_STATE_KEY] = ConfigRecord(
                {"run-id": run_id, "directory-digest": pinned.digest(), "bindings": request.bindings}
            )
    except (ReplyError, ValueError) as err:
        return _refusal(message, ACTION_BIND, err)
    return _reply(message, config_record(BindReply(settings.member, own).to_record()))


class _MarketHandlers:
    """The market handlers, sharing the label-count source and the bid policy; each gets the node's settings."""

    def __init__(self, label_counts: LabelCountsFn, bid_policy: BidPolicy) -> None:
        self._get_label_counts = label_counts
        self._bid_policy = bid_policy

    # --- PASS ----------------------------------------------------------------------------------
    def advertise(self, message: Message, context: Context, settings: NodeSettings) -> Message:
        """PASS round 1: take the market's terms and make the session's key pairs (private halves stay local).

        A new session of the same run is joined only if this client released nothing in the earlier one
        (:func:`_leave_unreleased_session`).
        """
        state = _state_record(context)
        try:
            request = _request(message)
            _leave_unreleased_session(state, request, settings.release_ledger)
        except _RequestError as err:
            _close_pass_state(state)
            return _refusal(message, ACTION_ADVERTISE, err)
        if not any(key.startswith(_PASS_PREFIX) for key in state):  # a fresh session: its mode is the request's
            state[_SPARSE] = _SPARSE_REQUEST_KEY in request

        def step(client: SessionClient, request: dict[str, Any]) -> Mapping[str, Any]:
            terms = self._announced_terms(request, settings)
            counts = self._label_counts(context)
            if isinstance(client, SparseSecureClient):
                identity_key, _, own = _sparse_keys(settings)
                advert = client.advertise(
                    request, counts, identity_key=identity_key, settings=own, run_id=int(context.run_id)
                )
            else:
                advert = client.advertise(
                    request,
                    counts,
                    identity_key=settings.identity_key,
                    min_participants=settings.min_participants,
                    run_id=int(context.run_id),
                    complete_graph=settings.complete_graph,
                    split_tolerance=settings.split_tolerance,
                )
            reply = dict(advert.to_record())
            ledger = settings.release_ledger
            if ledger is not None:  # a ledger that cannot be read fails closed, before anything is sent
                ledger.check_new_session(int(context.run_id), client.state.session)
            wants_roster = ledger is not None or settings.directory is not None
            if wants_roster and isinstance(client, PassClient):  # the sparse mode's draw request carries it
                reply.update(RosterWanted(True).to_record())  # the roster's node ids come with the share request
            if terms is not None:
                set_values(_state_record(context), terms.to_record())
            return reply

        return self._pass_step(message, context, ACTION_ADVERTISE, step)

    def draw(self, message: Message, context: Context, settings: NodeSettings) -> Message:
        """The sparse secure mode's draw: ``U1`` and ``(k, t)`` checked, out-neighbours drawn here and signed; the
        roster's node ids, checked against the fingerprint this client signed, are kept for the ledger and the award."""

        def step(client: SessionClient, request: dict[str, Any]) -> Mapping[str, Any]:
            if not isinstance(client, SparseSecureClient) or not isinstance(client.round, SparseAdvertised):
                raise _RequestError("no sparse secure session at its draw to draw out-neighbours in")
            identity_key, _, _ = _sparse_keys(settings)
            self._count_sparse_session(context, client.round.session, settings)
            reply = client.draw(request, identity_key)
            _state_record(context)[_LEDGER_ROSTER] = client.round.roster_node_ids
            return reply.to_record()

        return self._pass_step(message, context, ACTION_DRAW, step)

    def share(self, message: Message, context: Context, settings: NodeSettings) -> Message:
        """PASS round 2: check the graph and the neighbours' keys, send encrypted shares of the secrets."""

        def step(client: SessionClient, request: dict[str, Any]) -> Mapping[str, Any]:
            if isinstance(client, SparseSecureClient):
                identity_key, directory, _ = _sparse_keys(settings)
                return client.share_keys(request, directory, identity_key).to_record()
            sent = RosterNodeIds.from_record(request).roster_node_ids  # checked by _checked_roster where needed
            if settings.release_ledger is not None or (sent is not None and settings.directory is not None):
                # the roster's node ids, checked against what it signed: for the ledger and the award's checks (a node
                # with a directory and no ledger that is not sent them cannot check an award: it refuses to endorse)
                _state_record(context)[_LEDGER_ROSTER] = _checked_roster(client, sent, context)
            return client.share_keys(request, settings.directory, settings.identity_key).to_record()

        return self._pass_step(message, context, ACTION_SHARE, step)

    def mask(self, message: Message, context: Context, settings: NodeSettings) -> Message:
        """PASS round 3: the masked counts and the counts commitment; the private keys are wiped."""

        def step(client: SessionClient, request: dict[str, Any]) -> Mapping[str, Any]:
            ledger, noise, drawn = settings.release_ledger, settings.noise, None
            if ledger is not None:  # before Y_e leaves: the participants U1 must pass already
                members = self._ledger_members(context, settings, client.state.participants)
                ledger.check(int(context.run_id), client.state.session, members)
                # write-ahead: the release's privacy cost, refused past the node's privacy budget (0: exact counts)
                ledger.spend(
                    int(context.run_id), client.state.session, noise.target_variance if noise is not None else 0.0
                )
            if noise is not None:  # calibrated on the roster U1 this client was shown
                drawn = noise.sample(client.state.num_classes, client.participant_count)
            if isinstance(client, SparseSecureClient):
                return client.mask_input(request, _sparse_keys(settings)[0], drawn).to_record()
            return client.mask_input(request, drawn).to_record()

        return self._pass_step(message, context, ACTION_MASK, step)

    def survivors(self, message: Message, context: Context, settings: NodeSettings) -> Message:
        """Consistency round (with identity keys): sign the survivor set shown, once."""

        def step(client: SessionClient, request: dict[str, Any]) -> Mapping[str, Any]:
            if isinstance(client, SparseSecureClient):
                return client.sign_survivors(request, _sparse_keys(settings)[0]).to_record()
            return client.sign_survivors(request, settings.identity_key).to_record()

        return self._pass_step(message, context, ACTION_SURVIVORS, step)

    def unmask(self, message: Message, context: Context, settings: NodeSettings) -> Message:
        """PASS round 4: shares for the survivors' self-masks and the dropped clients' keys, once."""

        def step(client: SessionClient, request: dict[str, Any]) -> Mapping[str, Any]:
            reply = client.unmask(request).to_record()
            ledger = settings.release_ledger
            if ledger is not None:  # write-ahead: the survivors U3 recorded before the shares leave
                members = self._ledger_members(context, settings, request["survivors"])
                ledger.record_release(int(context.run_id), client.state.session, members)
                noise = settings.noise
                if noise is not None:  # the release's cost: the noise its honest survivors carry, not the roster's
                    variance = noise.release_variance(client.participant_count, int(client.survivor_count or 0))
                    ledger.charge_release(int(context.run_id), client.state.session, variance)
            return reply

        return self._pass_step(message, context, ACTION_UNMASK, step)

    def _pass_step(
        self,
        message: Message,
        context: Context,
        action: str,
        step: Callable[[SessionClient, dict[str, Any]], Mapping[str, Any]],
    ) -> Message:
        """Run one PASS step on the client's stored protocol state; on any refusal wipe that state."""
        state = _state_record(context)
        client = _pass_client(state)
        try:
            request = dict(_request(message).items())
            reply = step(client, request)
        except (PassError, ValueError, TypeError, KeyError) as err:
            client.close()  # what the refused step marked (an unmask request) outlives the wipe
            _store_pass_client(state, client)
            return _refusal(message, action, err)
        _store_pass_client(state, client)
        return _reply(message, config_record(reply))

    # --- Market --------------------------------------------------------------------------------
    def bid(self, message: Message, context: Context, settings: NodeSettings) -> Message:
        """Score the local data against the session's ``N_s`` and ``E``, then bid (once); with an identity key, sign
        the score and bid for this run, session and transcript (every row of the award's head must carry its bidder's
        signature: docs/threat-model.md, "The binding award")."""
        state = _state_record(context)
        try:
            request = BidRequest.from_record(_request(message))
            client = _pass_client(state)
            _check_session(request.session, state)
            if client.transcript is None or state.get(_STAGE) is not None:
                raise _RequestError("no completed PASS session to bid for, or already bid")
            if request.transcript != client.transcript:
                raise _RequestError("the transcript hash is not that of the session this client took part in")
            if request.num_clients != client.survivor_count:
                raise _RequestError("E is not the number of survivors of the session")
            if not request.global_counts or min(request.global_counts) < 0:
                raise _RequestError("the global counts must be a non-empty list of non-negative ints")
            global_counts = np.asarray(request.global_counts, dtype=np.int64)
            counts = self._label_counts(context)
            noise = settings.noise
            tolerance = 0 if noise is None else noise.tail_bound()  # N_s is noisy: its classes move that far
            if global_counts.shape != counts.shape or np.any(global_counts + tolerance < counts):
                raise _RequestError("the global counts cannot be the sum this client took part in")
            num_clients = int(client.survivor_count or 0)  # the request named the same E (checked above)
            if int(global_counts.max()) > client.state.count_bound * num_clients + tolerance:
                raise _RequestError("the global counts exceed the session's declared bound")
            score = float(compute_score(counts, global_counts, num_clients, exact_global=noise is None)) + 0.0
            bid = _checked_bid(self._bid_policy(counts, score, context))
            signature = self._bid_signature(context, client, settings, score, bid)
        except (PassError, ValueError, TypeError, KeyError) as err:
            state[_STAGE] = _STAGE_CLOSED
            return _refusal(message, ACTION_BID, err)
        state[_STAGE] = _STAGE_BID
        own_bid = BidReply(score, bid, signature)
        set_values(state, own_bid.to_record())  # kept: the award must list the score and bid as sent
        return _reply(message, config_record(own_bid.to_record()))

    def endorse(self, message: Message, context: Context, settings: NodeSettings) -> Message:
        """Check the buyer-signed award against this client's own session, terms, score and bid; endorse it, once.

        A client endorses one award per PASS session: the buyer cannot re-issue it, so it opens at most the winners
        of that one award (docs/threat-model.md, "The binding award").
        """
        state = _state_record(context)
        try:
            request = EndorseRequest.from_record(_request(message))
            _check_session(request.session, state)
            if state.get(_STAGE) != _STAGE_BID or _endorsed_award(state) is not None:
                raise _RequestError("no bid of this client for an award to list, or it already endorsed this "
                                    "session's award (an award is never re-issued)")  # fmt: skip
            signed, award = _verified_award(request.award, request.award_signature, state)
            client = _pass_client(state)
            index, node_id = client.state.index, int(context.node_id)
            check_award(
                award,
                run_id=int(context.run_id),
                session=client.state.session,
                transcript=client.state.transcript,
                terms=_stored_terms(state),
                survivors=client.state.survivor_count,
                rank=_survivor_rank(client),
                index=index,
                node_id=node_id,
                score=_own_bid(state).score,
                bid=_own_bid(state).bid,
                proof=request.bid_proof,
                survivor_nodes=self._survivor_nodes(context, client, settings),
                bid_signers=self._bid_signers(state, award, settings),
            )
            identity_key = settings.identity_key
            endorsement = b"" if identity_key is None else sign_award_endorsement(identity_key, signed.digest)
        except (PassError, ValueError, TypeError, KeyError) as err:
            return _refusal(message, ACTION_ENDORSE, err)
        own = award.bidder(node_id)
        set_values(
            state,
            {
                _ENDORSED: signed.encoded,
                _ENDORSED_SIGNATURE: signed.signature,
                _ENDORSED_WON: own is not None and own.node_id in award.winners,
                _ENDORSED_PAYMENT: 0.0 if own is None else own.payment,
            },
        )
        return _reply(message, config_record(EndorseReply(endorsement).to_record()))

    def audit(self, message: Message, context: Context, settings: NodeSettings) -> Message:
        """As a winner of the award it endorsed, paid at least its bid, open the counts commitment, once.

        With a directory the award must also carry endorsements by a quorum of the session's survivors
        (:func:`~flmarket_flwr.market.wire.award.binding_quorum`, with this node's ``pass-colluders``): no other award
        of the session can have reached it. In the sparse secure mode, where the buyer may show different clients
        different survivor sets, the quorum is counted over the pinned directory instead (endorsers: members of the
        session's roster ``U1``), which every honest node shares before PASS.
        """
        state = _state_record(context)
        try:
            request = AuditRequest.from_record(_request(message))
            _check_session(request.session, state)
            if not settings.audit:
                raise _RequestError("this client does not open its counts for audits")
            if state.get(_STAGE) != _STAGE_BID:
                raise _RequestError("no bid to audit, or already audited")
            endorsed = _endorsed_award(state)
            if endorsed is None or request.award != endorsed.encoded:
                raise _RequestError("the audit does not show the award this client endorsed")
            award = Award.decode(endorsed.encoded)
            node_id = int(context.node_id)
            own = award.bidder(node_id)
            if own is None or node_id not in award.winners or own.payment < own.bid:
                raise _RequestError("this client is not a winner paid at least its bid in the award it endorsed")
            directory = settings.directory
            if directory is not None:
                client = _pass_client(state)
                endorsements = unpack_endorsements(request.endorsements)  # type: ignore[arg-type]  # None: refused
                # views of U3 may differ in the sparse mode: the quorum over the pinned directory, endorsers from U1
                sparse = isinstance(client, SparseSecureClient)
                counted_over = directory.members if sparse else client.state.survivor_count
                quorum = binding_quorum(counted_over, settings.colluders)
                needed = opening_quorum(quorum, award.survivors, settings.endorse_tolerance)
                if sparse and settings.endorse_tolerance < 0:
                    eligible: set[int] | None = _roster_nodes(state)
                else:  # the survivors this winner was shown (with a tolerance d: all but d of them must endorse)
                    eligible = self._survivor_nodes(context, client, settings)
                others = count_endorsements(endorsed.digest, endorsements, directory, node_id, eligible, needed - 1)
                valid = 1 + others  # the count stops at the quorum: the endorsements past it change nothing
                if valid < needed:
                    raise _RequestError(f"only {valid} survivors (this client among them) endorsed the award, "
                                        f"{needed} are needed")  # fmt: skip
            nonce = _pass_client(state).counts_nonce
            if not nonce:
                raise _RequestError("no counts commitment to open")
            counts = self._label_counts(context)
        except (PassError, ValueError, TypeError, KeyError) as err:
            return _refusal(message, ACTION_AUDIT, err)
        state[_STAGE] = _STAGE_AUDITED
        return _reply(message, config_record(AuditReply([int(c) for c in counts], nonce).to_record()))

    def award(self, message: Message, context: Context) -> Message:
        """Record the outcome from the buyer-signed final award (the receipt) and wipe what is left of PASS.

        A client that endorsed an award in this session keeps that award as its receipt, whatever the final message
        says: it must name that award (by its digest and signature, or in full), and a different award, or none
        (an abort after the endorsements), is refused while the client still records the award it holds. A client
        that endorsed none checks the award it is sent; without an award (the market aborted) it records that it
        lost.
        """
        state = _state_record(context)
        held = _endorsed_award(state)
        signed: SignedAward | None
        try:
            request = AwardRequest.from_record(_request(message))
            _check_session(request.session, state)
            if held is not None:
                _check_final_award(request, held)
                signed, won, payment = held, bool(state[_ENDORSED_WON]), float(state[_ENDORSED_PAYMENT])  # type: ignore[arg-type]
            else:
                signed, won, payment = self._final_award(request, state, context)
        except (ValueError, TypeError, KeyError) as err:
            if held is not None:  # the receipt stands: the buyer cannot take back the award this client endorsed
                self._record_receipt(state, held, bool(state[_ENDORSED_WON]), float(state[_ENDORSED_PAYMENT]))  # type: ignore[arg-type]
            else:
                _close_pass_state(state)
            return _refusal(message, ACTION_AWARD, err)
        self._record_receipt(state, signed, won, payment)
        return _reply(message, config_record(AwardReply(accepted=True).to_record()))

    @staticmethod
    def _final_award(
        request: AwardRequest, state: ConfigRecord, context: Context
    ) -> tuple[SignedAward | None, bool, float]:
        """The final award sent to a client that endorsed none, checked, and what it gives this client."""
        if request.award is None:
            if request.award_digest is not None:
                raise _RequestError("the award named by its digest is not one this client endorsed")
            return None, False, 0.0
        signed, award = _verified_award(request.award, request.award_signature, state)
        if (award.run_id, award.session) != (int(context.run_id), _pass_client(state).session):
            raise _RequestError("the award is not for this client's run and PASS session")
        if award.terms != _stored_terms(state):
            raise _RequestError("the award's terms are not those announced at the advertisement")
        own = award.bidder(int(context.node_id))
        if own is not None and (own.score, own.bid) != _sent_bid(state):
            raise _RequestError("the award does not list this client's score and bid as it sent them")
        won = own is not None and own.node_id in award.winners
        return signed, won, 0.0 if own is None else own.payment

    @staticmethod
    def _record_receipt(state: ConfigRecord, signed: SignedAward | None, won: bool, payment: float) -> None:
        """Keep the outcome and its receipt, note whether this client opened its counts, and close PASS."""
        _close_pass_state(state)
        state[_OPENED] = state.get(_STAGE) == _STAGE_AUDITED or state.get(_OPENED) is True  # a repeated close
        state[_STAGE] = _STAGE_CLOSED
        state[KEY_WON] = won
        state[KEY_PAYMENT] = float(payment)
        if signed is not None:
            state[KEY_AWARD] = signed.encoded
            state[KEY_AWARD_SIGNATURE] = signed.signature

    # --- Helpers -------------------------------------------------------------------------------
    @staticmethod
    def _bid_signature(
        context: Context, client: SessionClient, settings: NodeSettings, score: float, bid: float
    ) -> bytes | None:
        """This node's signature on its score and bid in this run, session and transcript; ``None`` without an identity
        key (the default profile)."""
        identity_key = settings.identity_key
        if identity_key is None:
            return None
        return sign_bid(
            identity_key,
            run_id=int(context.run_id),
            session=client.state.session,
            transcript=client.state.transcript,
            index=client.state.index,
            node_id=int(context.node_id),
            score=score,
            bid=bid,
        )

    @staticmethod
    def _bid_signers(state: ConfigRecord, award: Award, settings: NodeSettings) -> dict[int, tuple[int, bytes]] | None:
        """The PASS index (from the roster kept at the share step or the draw) and the pinned identity key of every
        bidder the award's head names, for :func:`check_award` to check each row's signature (a winner does); ``None``
        without a directory (the default profile: rows are not signed). A head bidder outside the roster or the
        directory is left out, so the check refuses it."""
        directory = settings.directory
        if directory is None:
            return None
        roster = _kept_roster(state)
        if roster is None:
            raise _RequestError("no roster of the session kept: the award's bids cannot be checked")
        named = np.fromiter((bidder.node_id for bidder in award.head), dtype=np.uint64, count=len(award.head))
        positions = np.flatnonzero(np.isin(roster, named))
        indices = dict(zip(roster[positions].tolist(), (positions + 1).tolist(), strict=True))
        return {node: (index, directory[node]) for node, index in indices.items() if node in directory}

    @staticmethod
    def _announced_terms(request: Mapping[str, Any], settings: NodeSettings) -> AdvertiseTerms | None:
        """The market's terms in an advertise request (``None`` if it has none), checked as an :class:`AwardTerms`;
        a pinned buyer key must match."""
        terms = None
        if any(key in request for key in _TERMS_KEYS):
            terms = AdvertiseTerms.from_record(request)
            _award_terms(terms)  # every field in its range, or refused here
        pinned = settings.buyer_key
        if pinned is not None and (terms is None or terms.terms_buyer_key != pinned):
            raise _RequestError("the market's terms do not name the buyer key this node pinned")
        return terms

    @staticmethod
    def _survivor_nodes(context: Context, client: SessionClient, settings: NodeSettings) -> set[int] | None:
        """The node ids of the session's survivors, from the roster kept at the share step (with a release ledger:
        always in the secure profile); ``None`` where no roster was kept. The secure profile requires it."""
        node_ids = _kept_roster(_state_record(context))
        if node_ids is None:
            if settings.colluders > 0 or settings.directory is not None:
                raise _RequestError("no roster of the session kept: the award's bidders cannot be checked")
            return None
        alive = bitmap_bits(client.state.survivors, node_ids.size)[: node_ids.size]
        return {int(node) for node in node_ids[alive]}

    @staticmethod
    def _ledger_members(context: Context, settings: NodeSettings, bitmap: object) -> list[bytes]:
        """The ledger's identities of the PASS indices in ``bitmap``: directory keys if any, else node ids."""
        node_ids = _kept_roster(_state_record(context))
        if node_ids is None or not isinstance(bitmap, bytes):
            raise _RequestError("no roster kept from the advertise step for the release ledger")
        nodes = [int(node_ids[index - 1]) for index in bitmap_to_indices(bitmap)]
        directory = settings.directory
        if directory is None:
            return [b"node:" + node.to_bytes(8, "big") for node in nodes]
        return [b"key:" + directory.key_of(node) for node in nodes]  # an unregistered node: refused

    @staticmethod
    def _count_sparse_session(context: Context, session: bytes, settings: NodeSettings) -> None:
        """Count this session among the sessions this client draws in; refuse past its own allowance.

        The degrees bound a victim's risk over every placement the buyer sees (docs/threat-model.md, rule 1), so the
        node counts its draws by its own settings, never a session's: at most ``reruns + 1`` sessions of a market
        (kept in the run's state) and, with a release ledger, ``reruns + 1`` since its last release within
        ``pass-redraw-wait`` and ``(reruns + 1) x markets`` over its life, each draw recorded before it leaves and
        checked against every session the ledger holds, of any run (:meth:`.ReleaseLedger.record_draw`): a draw the
        buyer throws away, by stopping the session, re-launching the market, restarting the node or starting another
        run, still counts.
        """
        allowance = settings.draw_allowance
        if allowance is None:
            raise _RequestError("this node does not take part in the sparse secure mode of PASS")
        state = _state_record(context)
        drawn = _kept_bytes(state, _MARKET_SESSIONS)
        if session not in drawn:
            if len(drawn) >= allowance.per_release:
                raise _RequestError(
                    f"this client drew in {len(drawn)} PASS sessions of this market, the {allowance.per_release} its "
                    "own pass-reruns allows: a further session is refused"
                )
            state[_MARKET_SESSIONS] = [*drawn, session]
        ledger = settings.release_ledger
        if ledger is not None:  # write-ahead: a draw the buyer throws away still counts, whatever the run state keeps
            ledger.record_draw(int(context.run_id), session, allowance)

    def _label_counts(self, context: Context) -> NDArray[np.int64]:
        """Fetch and validate the local label counts; a failing callback is reported as such."""
        try:
            counts = self._get_label_counts(context)
        except Exception as err:  # the app's own code: any failure is a refusal that names it
            cause = f"{type(err).__name__}: {err}"[:_MAX_CAUSE_CHARS]
            raise _LabelCountsError(f"{LABEL_COUNTS_FAILED}{cause}") from err
        return validate_counts(counts).astype(np.int64)


# --- Request parsing -----------------------------------------------------------------------------
def _request(message: Message) -> ConfigRecord:
    record = message.content.get(RECORD_KEY) if message.has_content() else None
    if not isinstance(record, ConfigRecord):
        raise _RequestError(f"request has no ConfigRecord '{RECORD_KEY}'")
    return record


def _check_session(named: object, state: ConfigRecord) -> None:
    """``named`` must be the one PASS session this client took part in."""
    session = _pass_client(state).session
    if not session or named != session:
        raise _RequestError("the request is not for the PASS session this client took part in")


def _verified_award(encoded: bytes, signature: bytes | None, state: ConfigRecord) -> tuple[SignedAward, Award]:
    """The signed award a request carries, and the award itself, verified under the buyer key of the stored terms."""
    signed = SignedAward(encoded, signature)  # type: ignore[arg-type]  # no signature: refused by verify
    return signed, signed.verify(_stored_terms(state).buyer_key)


def _check_final_award(request: AwardRequest, held: SignedAward) -> None:
    """The final award must be the one this client endorsed: named by its digest and signature, or sent in full."""
    named = (request.award_digest, request.award_signature)
    sent = (request.award, request.award_signature)
    if named != (held.digest, held.signature) and sent != (held.encoded, held.signature):
        raise _RequestError("the final award is not the award this client endorsed, which it keeps as its receipt")


def _stored_terms(state: ConfigRecord) -> AwardTerms:
    """The terms announced at this client's advertisement."""
    terms = _kept_terms(state)
    if terms is None:
        raise _RequestError("no market terms were announced at the advertisement: no award can bind the buyer")
    return _award_terms(terms)


def _kept_terms(state: ConfigRecord) -> AdvertiseTerms | None:
    """The terms announced at this client's advertisement as it keeps them (``None``: none were announced)."""
    return AdvertiseTerms.from_record(state) if any(key in state for key in _TERMS_KEYS) else None


def _award_terms(terms: AdvertiseTerms) -> AwardTerms:
    """The award's terms that an advertise request announced (:class:`AwardError` names a field out of range)."""
    return AwardTerms(
        terms.terms_budget, terms.terms_cohort_cap, terms.terms_buyer_key, terms.terms_budget_rule or "half"
    )


def _own_bid(state: ConfigRecord) -> BidReply:
    """The score and bid this client sent at the bid step, as it keeps them."""
    return BidReply.from_record(state)


def _sent_bid(state: ConfigRecord) -> tuple[float, float] | None:
    """``(score, bid)`` this client sent at the bid step, ``None`` if it sent none."""
    try:
        own = _own_bid(state)
    except ReplyError:
        return None
    return own.score, own.bid


def _endorsed_award(state: ConfigRecord) -> SignedAward | None:
    """The award this client endorsed in this session (verified then), or ``None``."""
    encoded = state.get(_ENDORSED)
    if not isinstance(encoded, bytes):
        return None
    return SignedAward(encoded, state[_ENDORSED_SIGNATURE])  # type: ignore[arg-type]


def _survivor_rank(client: SessionClient) -> int:
    """This client's place among the session's survivors, in PASS-index order (its leaf in the award's bids tree)."""
    survivors = bitmap_bits(client.state.survivors, client.state.index)
    if not survivors[client.state.index - 1]:
        raise _RequestError("this client is not a survivor of the session it took part in")
    return int(np.count_nonzero(survivors[: client.state.index - 1]))


def _checked_roster(client: PassClient, packed: bytes | None, context: Context) -> bytes:
    """The roster's node ids (as sent), checked against the fingerprint this client signed and its own place in it."""
    run_id, signed = int(context.run_id), client.state
    if packed is None or not packed or len(packed) % 8:
        raise _RequestError(
            f"'{RosterNodeIds.wire_keys()[0]}' must be node ids as uint64 words (needed by the release ledger)"
        )
    nodes = [int(node) for node in np.frombuffer(packed, dtype=">u8")]
    if roster_fingerprint(run_id, signed.session, nodes) != signed.roster:
        raise _RequestError("the roster's node ids do not match the roster fingerprint")
    index = signed.index
    if not 0 < index <= len(nodes) or nodes[index - 1] != signed.node_id or len(set(nodes)) != len(nodes):
        raise _RequestError("the roster does not list this client at its index, or repeats a node")
    return packed


def _kept_roster(state: ConfigRecord) -> NDArray[np.uint64] | None:
    """The session's roster node ids in PASS-index order, as kept at the share step or the draw (checked against the
    roster fingerprint then); ``None`` where none was kept."""
    roster = state.get(_LEDGER_ROSTER)
    return np.frombuffer(roster, dtype=">u8") if isinstance(roster, bytes) else None


def _roster_nodes(state: ConfigRecord) -> set[int]:
    """The node ids of the session's roster (:func:`_kept_roster`); refused where none was kept."""
    node_ids = _kept_roster(state)
    if node_ids is None:
        raise _RequestError("no roster of the session kept: the award's endorsers cannot be checked")
    return {int(node) for node in node_ids}


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
    record = context.state.get(RECORD_KEY)
    if not isinstance(record, ConfigRecord):
        record = context.state[RECORD_KEY] = ConfigRecord()
    return record


def _pass_client(state: ConfigRecord) -> SessionClient:
    """The PASS client whose state is kept under ``pass/`` keys, in the mode :data:`_SPARSE` says (a fresh one if
    none)."""
    record = {key[len(_PASS_PREFIX) :]: value for key, value in state.items() if key.startswith(_PASS_PREFIX)}
    return SparseSecureClient(record) if state.get(_SPARSE) is True else PassClient(record)


def _store_pass_client(state: ConfigRecord, client: SessionClient | None) -> None:
    """Replace the PASS state by ``client``'s (keys the protocol wiped disappear); ``None`` leaves none."""
    for key in [k for k in state if k.startswith(_PASS_PREFIX) or k == _SPARSE]:
        del state[key]
    if client is not None:
        set_values(state, {_PASS_PREFIX + key: value for key, value in client.to_record().items()})
        state[_SPARSE] = isinstance(client, SparseSecureClient)


def _sparse_keys(settings: NodeSettings) -> tuple[Ed25519PrivateKey, IdentityDirectory, SparseSecureSettings]:
    """The identity key and the directory the sparse secure mode signs and checks with, and the node's settings for
    it; refused unless the node takes part in that mode (:attr:`NodeSettings.sparse`)."""
    if settings.sparse is None or settings.identity_key is None or settings.directory is None:
        raise _RequestError(
            "this node does not take part in the sparse secure mode of PASS (outside the secure profile, or "
            "pass-complete-graph set): refused"
        )
    return settings.identity_key, settings.directory, settings.sparse


def _leave_unreleased_session(state: ConfigRecord, request: ConfigRecord, ledger: ReleaseLedger | None) -> None:
    """Wipe the earlier PASS session of this run to join the new one ``request`` names, if that is safe.

    The server runs a fresh session when one failed before releasing anything. Two sums of one run
    differenced would open the counts of those in one and not the other, so a client joins a new session
    only while it has never been asked to unmask (the request may have come with others' shares already
    released) nor to bid; then the earlier session gave the server masked inputs under masks it never saw
    removed. A session once left is never joined again. The first session, or the same one again (which the
    protocol refuses as a second advertisement), passes through untouched.

    A market re-launched in the same run (the earlier market closed: its award, or its abort, received) is
    joined only by a node whose release ledger has a privacy budget: each release then carries the node's noise,
    is composed into its ``epsilon`` and refused past the privacy budget, and is checked against the earlier releases'
    members (:meth:`_MarketHandlers.mask`). The earlier market's receipt is kept (:data:`_EARLIER_AWARDS`).

    Raises
    ------
    _RequestError
        This client was asked to unmask or bid in this run and may not join a re-launch, or the session is one
        it left before.
    """
    earlier = _pass_client(state)
    session = request.get("session")  # PASS's advertise request: AdvertiseRequest.session
    if not earlier.session or session == earlier.session:
        return
    left = _kept_bytes(state, _EARLIER_SESSIONS)
    if session in left:
        raise _RequestError("a PASS session of this run that this client already left or closed")
    if earlier.unmask_requested or state.get(_STAGE) is not None:
        if state.get(_STAGE) == _STAGE_CLOSED and ledger is not None and ledger.privacy_budget is not None:
            _start_relaunched_market(state, [*left, earlier.session])
            return
        raise _RequestError(
            "asked to unmask or bid in an earlier PASS session of this run: a second sum could be differenced with it"
            " (a re-launched market is joined only with a release ledger and a privacy budget: the secure profile)"
        )
    _store_pass_client(state, None)  # the earlier keys, seeds and held shares go with it
    state[_EARLIER_SESSIONS] = [*left, earlier.session]


def _start_relaunched_market(state: ConfigRecord, sessions: list[bytes]) -> None:
    """Clear the closed market's state for a re-launched one; keep its receipt in :data:`_EARLIER_AWARDS` and this
    run's earlier PASS sessions (``sessions``, the closed one included) in :data:`_EARLIER_SESSIONS`, never joined
    again."""
    receipt = state.get(KEY_AWARD), state.get(KEY_AWARD_SIGNATURE)
    receipts = _kept_bytes(state, _EARLIER_AWARDS)
    if isinstance(receipt[0], bytes) and isinstance(receipt[1], bytes):
        receipts += [receipt[0], receipt[1]]
    for key in list(state):  # the PASS state and every other key of the closed market
        del state[key]
    if receipts:
        state[_EARLIER_AWARDS] = receipts
    state[_EARLIER_SESSIONS] = sessions


def _kept_bytes(state: ConfigRecord, key: str) -> list[bytes]:
    """The byte strings kept under ``key`` (an earlier market's sessions or receipts); ``[]`` if none."""
    kept = state.get(key, [])
    return [item for item in kept if isinstance(item, bytes)] if isinstance(kept, list) else []


def _close_pass_state(state: ConfigRecord) -> None:
    """Wipe every secret of the PASS session (:meth:`PassClient.close`); keep what refuses a second one."""
    client = _pass_client(state)
    client.close()
    _store_pass_client(state, client)


# --- Replies -------------------------------------------------------------------------------------
def _reply(message: Message, record: ConfigRecord) -> Message:
    return Message(make_content(record), reply_to=message)


def _refusal(message: Message, action: str, err: Exception) -> Message:
    """A generic error reply (the reason stays in the client's own log), or the label-count callback's failure."""
    log(WARNING, "Market request %s refused: %s", action, err)
    if isinstance(err, _LabelCountsError):
        detail = str(err)
    elif isinstance(err, PrivacyBudgetExhausted):  # the reason only; the spends and the privacy budget stay in the log
        detail = PRIVACY_BUDGET_REFUSED
    elif isinstance(err, LedgerError):  # the reason only; the file and the sets stay in the client's log
        detail = LEDGER_REFUSED
    else:
        detail = REQUEST_REFUSED
    reason = refusal_reason(action, detail)
    return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=message)
