"""Server side of the market: PASS, scores and bids, the audited reverse auction and the awards, over a ``Grid``.

:class:`MarketPhase` runs the steps, each a round of Flower ``query`` messages
(:mod:`flmarket_flwr.market.wire.messages`): PASS for the global counts, bids, the auction and its signed award,
the winners' audit, the final award. A node whose reply is missing, an error or malformed is excluded with a
logged reason; what cannot be recovered stops the phase with :class:`MarketError`. The steps are listed in
:class:`MarketPhase`; the threat model is in docs/threat-model.md.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from logging import ERROR, INFO, WARNING
from typing import Any, NoReturn

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.app import ConfigRecord, Message
from flwr.serverapp import Grid
from flwr.supercore import log

from flmarket_flwr.market.buyer.config import MarketConfig, MarketOutcome, PassSession
from flmarket_flwr.market.buyer.errors import MarketError
from flmarket_flwr.market.buyer.membership import MembershipPlan, auction_budget, names_a_tag, plan_membership
from flmarket_flwr.market.buyer.pass_rounds import PassResult, PassRounds, sessions_summary
from flmarket_flwr.market.buyer.replies import check_opening, highest_possible_score, read_score_and_bid
from flmarket_flwr.market.buyer.transport import exchange
from flmarket_flwr.market.wire.award import (
    Award,
    AwardTerms,
    BidsTree,
    SignedAward,
    build_award,
    pack_endorsements,
    sign_award,
)
from flmarket_flwr.market.wire.ledger import LedgerError
from flmarket_flwr.market.wire.messages import (
    ACTION_ADVERTISE,
    ACTION_AUDIT,
    ACTION_AWARD,
    ACTION_BID,
    ACTION_BIND,
    ACTION_ENDORSE,
    ACTION_TAGS,
    AdvertiseTerms,
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
    TagsReply,
    TagsRequest,
    label_counts_failure,
    read_config,
)
from flmarket_flwr.market.wire.records import config_record
from flmarket_flwr.nodes import wait_for_nodes
from flmarket_flwr.pass_protocol import MIN_PARTICIPANTS
from flmarket_flwr.pass_protocol.identity import (
    SIGNATURE_LENGTH,
    bind_members,
    pack_member_bindings,
    verify_award_endorsement,
    verify_bid,
)

__all__ = ["MarketConfig", "MarketError", "MarketOutcome", "MarketPhase"]


@dataclass
class _Outcome:
    """The audited auction's result: the session's one signed award, the winners that hold (endorsed it and, with
    audits, passed theirs), those audited, and the endorsers."""

    award: Award
    signed: SignedAward
    winners: list[int]
    audited: list[int]
    endorsers: set[int]


class MarketPhase:
    """The market phase of a ``ServerApp``: PASS, scores and bids, audited auction, awards.

    Parameters
    ----------
    config : MarketConfig
        Budget, number of classes, timeouts, and the other settings.
    sit_out : Mapping[int, str], optional
        Connected nodes not to invite, each with its reason (``FLMarket``'s re-launch: the nodes that have
        released their counts this run, or spent their privacy budget); they are sent nothing.
    relaunch : bool (default: False)
        Whether this market is a re-launch within a run (:attr:`relaunch`).

    Notes
    -----
    Steps (each a round of Flower ``query`` messages, see :mod:`flmarket_flwr.market.wire.messages`):

    1. Wait for the nodes (bounded), set aside the buyer's included and excluded nodes (:meth:`MarketPhase.admitted`;
       by tag, after asking every node its ``market-tag``), leave out those a ``roster_history`` says would make the
       clients' release ledgers refuse (:meth:`MarketPhase.planned_roster`), and run PASS over the rest
       (:mod:`flmarket_flwr.market.buyer.pass_rounds`): the server learns the global counts ``N_s`` and each
       survivor's commitment to its counts, once. A session that fails closed before any unmask request is
       run again without the clients it named (``pass_reruns`` times at most: ``c`` re-runs outlast ``c``
       deviating clients taking turns, while the nodes' roster floors and budgets allow); one that fails later
       stops the market (docs/threat-model.md, "Colluding clients that stop PASS").
    2. Broadcast ``N_s``, ``E`` and the session's transcript hash; each client returns its score and
       bid (``query.market_bid``). The market aborts if most PASS participants fail this step.
    3. Run the auction (:func:`flmarket_flwr.pricing.run_auction`, the product's one selection rule:
       the total payment is within the budget in every mode) and sign its award with the buyer key
       (:mod:`flmarket_flwr.market.wire.award`; the terms, budget, cohort cap and key, went out with the PASS
       advertisement): one award per PASS session, never re-issued. Every bidder checks and endorses it
       (``query.market_endorse``); every winner that endorsed it then opens its counts commitment to the buyer
       against the award and the endorsements (``query.market_audit``). A winner that does not endorse, or whose
       counts do not match its commitment, or whose claimed score is not the score of those counts, is excluded:
       not trained and not paid. Its share of the budget is left unspent in this market (a later market may buy
       with it); the award stands, so no other bidder is ever opened (docs/threat-model.md, "The binding award").
    4. Send every node that took part in any step the final signed award (``query.market_award``), its
       receipt of who won and what each is paid, which also makes each client wipe what is left of its PASS
       state.

    Every step is bounded by :meth:`MarketConfig.step_timeout` whatever the transport does underneath. A node
    whose reply is missing, an error or malformed is excluded with the reason logged at WARNING and kept in
    :attr:`MarketOutcome.excluded`; what cannot be recovered, or a thin market (fewer than ``min_participation`` of
    the invited nodes left as bidders; known at PASS's first round, before any sum, when too few accept the
    invitation), stops the phase with :class:`MarketError`, whose ``outcome`` records it.
    The threat model is in docs/threat-model.md and in :mod:`flmarket_flwr.market.buyer.pass_rounds`.
    """

    def __init__(
        self, config: MarketConfig, *, sit_out: Mapping[int, str] | None = None, relaunch: bool = False
    ) -> None:
        if not isinstance(config, MarketConfig):
            raise TypeError(f"config must be a MarketConfig, got {type(config).__name__}")
        self.config = config
        self._given = config  # a directory keyed by member: each run's config holds that run's bound directory
        self.sit_out = dict(sit_out or {})
        """Node id -> why it is not invited to this market (a node that may not release again this run): it is
        sent no market message, its reason kept in :attr:`MarketOutcome.excluded`."""
        self.relaunch = relaunch
        """A re-launch within a run: members of the include or exclude list that match no connected node are
        logged and skipped, not an error (:func:`~flmarket_flwr.market.buyer.membership.plan_membership`)."""
        self._thin = False
        self.bids: dict[int, tuple[float, float]] = {}
        """``{node: (score, bid)}``: the valid bids of the last :meth:`run` (kept if the market fails after them)."""
        self.bid_signatures: dict[int, bytes] = {}
        """``{node: signature}``: each bidder's signature on its bid in the last :meth:`run`, checked against the
        directory where there is one; the award's head carries them (docs/threat-model.md, "The binding award")."""
        self.released: list[int] = []
        """Node ids whose masked counts went into a sum the buyer could unmask in the last :meth:`run`: the
        survivors of the released session, or every node of a session that stopped after its unmask request."""
        self._excluded: dict[int, str] = {}
        self._contacted: set[int] = set()
        self._invited: list[int] = []
        self._session = b""
        self._included: dict[int, float] = {}
        self._listed_out: list[int] = []
        self._answered = False
        self._silent_start = ""
        self.pass_sessions: list[PassSession] = []
        """The PASS sessions of the last :meth:`run`, in order."""
        self._buyer_key = config.buyer_key if config.buyer_key is not None else Ed25519PrivateKey.generate()

    # --- Public API ----------------------------------------------------------------------------
    def run(self, grid: Grid) -> MarketOutcome:
        """Run the whole market phase on ``grid`` and return its outcome.

        Parameters
        ----------
        grid : Grid
            The ``Grid`` given to the ``ServerApp``'s main function.

        Returns
        -------
        MarketOutcome
            Winners, payments, global counts, exclusions and timings.

        Raises
        ------
        MarketError
            Too few nodes connected or left in PASS, PASS could not recover its dropouts, the
            global counts failed their bounds, or fewer than ``min_participation`` of the invited nodes
            are left as bidders. Every node contacted so far is told the market closed before the error
            is raised; the error's ``outcome`` is the failed market's record (who was excluded and why).
        """
        self.config = self._given
        self._excluded = {}
        self._contacted = set()
        self._invited = []
        self._session = b""
        self._included = {}
        self._listed_out = []
        self._answered = False
        self._silent_start = ""
        self.pass_sessions = []
        self.released = []
        self.bids = {}
        self._thin = False
        self._buyer_key = self.config.buyer_key if self.config.buyer_key is not None else Ed25519PrivateKey.generate()
        if self.config.buyer_key is None:
            log(
                INFO,
                "Market: buyer key of this market (fresh; MarketConfig.buyer_key keeps one): %s",
                self.terms.buyer_key.hex(),
            )
        timings: dict[str, float] = {}
        started = time.perf_counter()
        pass_result: PassResult | None = None
        try:
            connected = self._timed(timings, "wait_for_nodes", lambda: self.wait_for_nodes(grid))
            nodes = self.bound_roster(grid, self.planned_roster(self.admitted(grid, connected)))
            self._invited = list(nodes)
            log(INFO, "Market: %s", profile_line(self.config, len(nodes)))
            pass_result = self._timed(timings, "pass", lambda: self.run_pass(grid, nodes))
            self.released = list(pass_result.participants)
            self._record_release(pass_result.participants)
            bids = self._timed(timings, "bid", lambda: self.collect_bids(grid, pass_result))
            result = self._timed(timings, "auction", lambda: self._audited_auction(grid, pass_result, bids))
        except MarketError as stopped:
            err = MarketError(f"{self._silent_start}; {stopped}") if self._silent_start else stopped
            log(WARNING, "Market: aborted (%s)", err)
            self._close(grid, None, set())
            timings["total"] = time.perf_counter() - started
            err.outcome = MarketOutcome.failed(
                str(err),
                self.config.budget,
                self._invited,
                self._excluded,
                timings,
                budget_rule=self.config.budget_rule,
            )
            err.outcome.pass_sessions = list(self.pass_sessions)
            # A sum released before the market stopped: the record says whose (a session that stopped after its
            # unmask request counts as released), and what was bid on it.
            err.outcome.pass_participants = list(pass_result.participants if pass_result is not None else self.released)
            if pass_result is not None:
                err.outcome.global_counts = [int(c) for c in pass_result.global_counts]
            err.outcome.scores = {node: score for node, (score, _) in self.bids.items()}
            err.outcome.bids = {node: bid for node, (_, bid) in self.bids.items()}
            if err is stopped:
                raise
            raise err from stopped
        acknowledged = self._timed(
            timings, "award", lambda: self._close(grid, result.signed, result.endorsers, sorted(bids))
        )
        timings["total"] = time.perf_counter() - started

        award = result.award
        dropped = set(award.winners) - set(result.winners)  # winners that refused the award or failed their audit
        bidders = [node for node in sorted(bids) if node not in dropped]
        paid = {node: award.payments[node] for node in result.winners}  # winners that hold; the rest are paid 0
        payments = {**{node: 0.0 for node in bidders}, **paid, **self._included}
        outcome = MarketOutcome(
            winners=list(result.winners),
            participants=bidders,
            scores={node: bids[node][0] for node in bidders},
            bids={node: bids[node][1] for node in bidders},
            payments=payments,
            total_payment=math.fsum(payments.values()),  # exact, in any order
            budget=float(self.config.budget),
            global_counts=[int(c) for c in pass_result.global_counts],
            excluded=dict(self._excluded),
            timings=timings,
            pass_participants=list(pass_result.participants),
            num_winners=self.config.num_winners,
            award_acknowledged=acknowledged,
            audited=result.audited,
            invited=sorted(self._invited),
            pass_sessions=list(self.pass_sessions),
            award_digest=result.signed.digest,
            included=dict(self._included),
            budget_rule=self.config.budget_rule,
        )
        log(
            INFO,
            "Market: %d winners of %d bidders, %d included (%d invited, %d excluded%s), total payment %.4g "
            "(budget %.4g, rule %s: %.2f of it)",
            len(result.winners),
            len(bidders),
            len(self._included),
            len(self._invited),
            len(self._excluded),
            f": {outcome.exclusion_summary()}" if self._excluded else "",
            outcome.total_payment,
            outcome.budget,
            outcome.budget_rule,
            outcome.paid_share,
        )
        return outcome

    @property
    def terms(self) -> AwardTerms:
        """The market's terms, announced with the PASS advertisement: the auction's budget (``R`` less the included
        nodes' payments), cohort cap (0: none), buyer key, budget rule."""
        public = self._buyer_key.public_key().public_bytes_raw()
        budget = auction_budget(self.config.budget, self._included.values())
        return AwardTerms(budget, self.config.num_winners or 0, public, self.config.budget_rule)

    # --- Step 0: nodes -------------------------------------------------------------------------
    def wait_for_nodes(self, grid: Grid) -> list[int]:
        """Wait (bounded) until enough nodes are connected; return their ids, ascending.

        Raises
        ------
        MarketError
            If fewer than ``min_clients`` nodes are connected when the wait ends, or fewer than ``num_winners``.
        """
        cfg = self.config
        nodes = wait_for_nodes(
            grid,
            cfg.expected_nodes if cfg.expected_nodes is not None else cfg.min_clients,
            cfg.wait_for_nodes_timeout,
            poll_interval=cfg.poll_interval,
            settle=cfg.expected_nodes is None,
            stall_timeout=cfg.stall_timeout,
            who="Market",
        )
        if len(nodes) < cfg.min_clients:
            raise MarketError(
                f"only {len(nodes)} node(s) connected; the market needs at least {cfg.min_clients} (its secure sum, "
                f"PASS, with fewer than {MIN_PARTICIPANTS} would reveal a client's counts). In simulation pass "
                f'--federation-config "num-supernodes=N" with N >= {cfg.min_clients}; in a deployment start more '
                "SuperNodes"
            )
        if cfg.num_winners is not None and cfg.num_winners > len(nodes):
            raise MarketError(
                f"num_winners (run config: num-selected) is {cfg.num_winners} but only {len(nodes)} nodes are "
                "connected: the cohort cannot be larger than the candidates"
            )
        if cfg.expected_nodes is not None and len(nodes) < cfg.expected_nodes:
            log(
                WARNING,
                "Market: %d of %d expected nodes connected after %g s; going on with them",
                len(nodes),
                cfg.expected_nodes,
                cfg.wait_for_nodes_timeout,
            )
        return nodes

    def admitted(self, grid: Grid, nodes: Sequence[int]) -> list[int]:
        """``nodes`` less those not on the allow list (:attr:`MarketConfig.allow`, if any), the buyer's included and
        excluded nodes (:attr:`MarketConfig.include` / ``exclude``) and those that sit this market out
        (:attr:`sit_out`).

        The included nodes and their fixed payments are kept for the award (the auction's budget is what they
        leave). A node excluded by id, or sitting out, is sent no message of any kind (not even the tags query: a
        node sitting out matches no tag in this market); when a list names a tag, the other nodes are asked theirs
        first (:meth:`collect_tags`: a node excluded only by its tag hears this
        one query), and silent ones are left out. A list member that matches no connected node is an error at a
        run's first market and is logged in a re-launch (:func:`.membership.plan_membership`).

        Raises
        ------
        MarketError
            An unmatched member of either list (first market), or fewer than ``min_clients`` (or than
            ``num_winners``) nodes left for the auction; each names the run-config key or the reason.
        """
        cfg = self.config
        if cfg.allow:  # allow-list-only mode: the others are sent nothing at all
            outside = [node for node in nodes if node not in cfg.allow]
            if outside:
                log(INFO, "Market: %d connected node(s) are not on the allow list; sent nothing", len(outside))
            nodes = [node for node in nodes if node in cfg.allow]
        plan = MembershipPlan(included={}, invited=list(nodes), excluded=[])
        if cfg.include or cfg.exclude:
            by_id = [node for node in nodes if node in cfg.exclude]  # never messaged, not even for its tag
            silent = [node for node in nodes if node in self.sit_out and node not in by_id]  # nor are these
            tags = None
            if names_a_tag(cfg.include, cfg.exclude):
                tags = self.collect_tags(grid, [node for node in nodes if node not in by_id and node not in silent])
            known = list(nodes) if tags is None else sorted([*tags, *by_id, *silent])
            try:
                plan = plan_membership(known, cfg.include, cfg.exclude, cfg.budget, tags, strict=not self.relaunch)
            except ValueError as err:
                raise MarketError(str(err)) from err
        self._included = plan.included
        self._listed_out = list(plan.excluded)
        if plan.unmatched:
            log(WARNING, "Market: %s match no connected node in this re-launch; skipped", plan.unmatched)
        for node in plan.excluded:
            log(INFO, "Market: node %d is never invited (MarketConfig.exclude, run config market-exclude)", node)
        if plan.included:
            log(
                INFO,
                "Market: %d node(s) included outside the auction, paid %.4g in all; the auction's budget is %.4g",
                len(plan.included),
                math.fsum(plan.included.values()),
                self.terms.budget,
            )
        invited = [node for node in plan.invited if node not in self.sit_out]
        resting = sorted(set(plan.invited) - set(invited))
        for node in resting:
            self._excluded[node] = f"sit_out: {self.sit_out[node]}"
        if resting:
            log(INFO, "Market: %d node(s) not invited, sent nothing: %s", len(resting), _grouped(self.sit_out, resting))
        where = "the nodes left for the auction after market-include and market-exclude"
        if resting:
            where = f"the nodes left for the auction ({len(resting)} not invited: {_grouped(self.sit_out, resting)})"
        self.require_enough(invited, where)
        if cfg.num_winners is not None and cfg.num_winners > len(invited):
            raise MarketError(
                f"num_winners (run config: num-selected) is {cfg.num_winners} but only {len(invited)} nodes are "
                f"left for the auction after market-include and market-exclude (and {len(resting)} not invited)"
            )
        return invited

    def collect_tags(self, grid: Grid, nodes: Sequence[int]) -> dict[int, str]:
        """Ask ``nodes`` for their ``market-tag``; return ``{node: tag}`` of those that answer (``""``: none).

        A node that does not answer is excluded with the reason and left out of this market: an exclude by tag
        must not be dodged by staying silent.
        """

        def read(reply: Message) -> str:
            return TagsReply.from_record(read_config(reply)).tag.strip()

        requests = {node: config_record(TagsRequest().to_record()) for node in nodes}
        return dict(self.validated(ACTION_TAGS, requests, self.exchange(grid, ACTION_TAGS, requests), read))

    def planned_roster(self, nodes: Sequence[int]) -> list[int]:
        """``nodes`` less those that would let this sum be differenced to a small group (``roster_history``).

        Without a roster history, ``nodes`` unchanged. With one, :meth:`RosterHistory.plan`: each node left
        out is excluded with the reason logged and is sent nothing.

        Raises
        ------
        MarketError
            The history cannot be read (named), or fewer than ``min_clients`` nodes are left.
        """
        history = self.config.roster_history
        if history is None:
            return list(nodes)
        try:
            roster = history.plan(nodes)
        except LedgerError as err:
            raise MarketError(str(err)) from err
        for node in sorted(set(nodes) - set(roster)):
            self.exclude(
                node,
                "roster",
                f"sits out of this market: with it, this sum differenced with an earlier one in {history.path} "
                f"would isolate fewer than {history.min_roster_change} clients, and the clients' ledgers would refuse",
            )
        self.require_enough(roster, "the roster planned against the roster history")
        return roster

    def _record_release(self, members: Sequence[int]) -> None:
        """Add this market's PASS members to the roster history; a failed write is logged, the market goes on."""
        history = self.config.roster_history
        if history is None:
            return
        try:
            history.record(members)
        except LedgerError as err:  # the sum is already released: plan the next market without it
            log(ERROR, "Market: %s; the next market's roster will be planned without this one", err)

    # --- Step 1: PASS -------------------------------------------------------------------------
    def run_pass(self, grid: Grid, nodes: Sequence[int]) -> PassResult:
        """Run PASS over ``nodes`` and return ``N_s`` with the survivors and their commitments.

        A session that fails closed before any unmask request went out (nothing released: no client has sent
        a share of any secret) is run again as a fresh session without every client it named (but with those
        it excluded only because named senders garbled their shares to them), at most ``pass_reruns`` times
        and while ``min_clients`` are left; each session is kept in :attr:`pass_sessions`. A named client is in
        no later session: ``c`` re-runs outlast ``c`` deviating clients however they take turns, while each
        failed session names one of them (an honest dropout is named too, and uses a re-run as well).

        Raises
        ------
        MarketError
            Too few survivors, a secret without enough shares, or ``N_s`` out of its bounds, in the last
            session; or a failure after the unmask round began (a second sum would be a second release). Its
            message says how many sessions ran, of how many allowed, whom each named, and why none follows.
        """
        self._contacted.update(nodes)
        roster = sorted(nodes)
        reruns = int(self.config.pass_reruns)  # MarketConfig resolves "auto"
        while True:
            self._session = f"{self.config.session_label}/pass/".encode() + secrets.token_bytes(16)
            terms = self.terms
            rule = None if terms.budget_rule == "half" else terms.budget_rule  # the paper's rule: as before
            announced = AdvertiseTerms(terms.budget, terms.cohort_cap, terms.buyer_key, rule)
            rounds = PassRounds(self.config, self, self._session, announced)
            try:
                result = rounds.run(grid, roster)
            except MarketError as err:
                wronged = rounds.wronged  # excluded through no fault of their own: taken back
                named = [node for node in roster if self.is_excluded(node) and node not in wronged]
                self.pass_sessions.append(PassSession(self._session.hex(), roster, str(err), named))
                roster = [node for node in roster if node not in named]
                if rounds.unmask_requested:  # some client may have sent its shares: count the session as a release
                    self.released = list(self.pass_sessions[-1].roster)
                if rounds.unmask_requested:
                    why = "the unmask round had begun, and a second session would be a second sum"
                elif self._thin:
                    why = "fewer than min_participation of the invited nodes accepted the invitation"
                elif not named:
                    why = "it named no client"
                elif len(roster) < self.config.min_clients:
                    why = f"{len(roster)} client(s) would be left, fewer than min_clients {self.config.min_clients}"
                elif len(self.pass_sessions) > reruns:
                    why = "every re-run allowed is used"
                else:
                    why = ""
                if why:
                    self._raise_pass_failure(err, f"{sessions_summary(self.pass_sessions, reruns)}; no re-run: {why}")
                log(
                    WARNING,
                    "Market: PASS session %d stopped before any sum was released (%s); running a fresh session "
                    "without the %d client(s) it named: %s (re-run %d of at most %d)",
                    len(self.pass_sessions),
                    err,
                    len(named),
                    named,
                    len(self.pass_sessions),
                    reruns,
                )
                for node in wronged:  # they withdrew only because the named garbled their shares to them
                    log(INFO, "Market: node %d is taken back: its withdrawal was forced by the clients named", node)
                    self._excluded.pop(node, None)
                continue
            self.pass_sessions.append(PassSession(self._session.hex(), roster, "released", []))
            return result

    def bound_roster(self, grid: Grid, nodes: Sequence[int]) -> list[int]:
        """``nodes`` bound to the members of a directory keyed by member (``identity_cli make --members``); ``nodes``
        unchanged for a directory keyed by node id, or none.

        Each node is asked which member it is, with that member's signature over the run, its node id and the
        directory's digest (:func:`~flmarket_flwr.pass_protocol.identity.bind_members`); then every bound node is
        sent all the bindings, which it checks and keeps for the run. A node whose binding does not verify, or whose
        member another node claims too, or that refuses the bindings, is excluded with the reason. The rest of the
        market runs on the bound directory (node id -> key), as on a directory keyed by node id.

        Raises
        ------
        MarketError
            If fewer than ``min_clients`` nodes are bound.
        """
        directory = self._given.directory
        if directory is None or not directory.by_member:
            return list(nodes)
        run_id = int(grid.run.run_id)
        self._contacted.update(nodes)
        requests = {node: config_record(BindRequest().to_record()) for node in nodes}

        def read(reply: Message, node: int) -> tuple[int, bytes]:
            claim = BindReply.from_record(read_config(reply))
            try:
                bind_members(directory, {node: (claim.member, claim.member_signature)}, run_id)
            except ValueError as err:
                raise ReplyError(str(err)) from err
            return claim.member, claim.member_signature

        claims = self.validated(ACTION_BIND, requests, self.exchange(grid, ACTION_BIND, requests), read, pass_node=True)
        claimants: dict[int, list[int]] = {}
        for node, (member, _) in sorted(claims.items()):
            claimants.setdefault(member, []).append(node)
        for member, both in claimants.items():
            for node in both if len(both) > 1 else ():
                self.exclude(node, ACTION_BIND, f"member {member} is claimed by nodes {both}: none is taken")
        bindings = {node: claim for node, claim in claims.items() if not self.is_excluded(node)}
        self.require_enough(sorted(bindings), "the nodes bound to the directory's members")
        packed = pack_member_bindings(bindings)
        shared = {node: config_record(BindRequest(packed).to_record()) for node in bindings}
        replies = self.exchange(grid, ACTION_BIND, shared)
        kept = self.validated(ACTION_BIND, shared, replies, lambda reply: BindReply.from_record(read_config(reply)))
        self.config = dataclasses.replace(self._given, directory=bind_members(directory, bindings, run_id))
        log(INFO, "Market: %d node(s) bound to members of the directory (%d members)", len(kept), directory.members)
        self.require_enough(sorted(kept), "the nodes that hold the bindings")
        return sorted(kept)

    def _raise_pass_failure(self, err: MarketError, summary: str) -> NoReturn:
        """Raise ``err`` followed by the sessions' ``summary``, naming the root cause first when clients' own
        label-count callbacks failed."""
        cause = _label_count_failures(self._excluded)
        # name the root cause, not its symptom ("only 0 clients advertised valid keys")
        raise MarketError(f"{cause + '; ' if cause else ''}{err}; {summary}") from err

    def require_enough(self, nodes: Sequence[int], where: str) -> None:
        """Raise :class:`MarketError` if fewer than ``min_clients`` nodes are left."""
        if len(nodes) < self.config.min_clients:
            raise MarketError(
                f"{where}: only {len(nodes)} client(s) left, the market needs at least "
                f"{self.config.min_clients} (PASS with fewer than {MIN_PARTICIPANTS} would reveal "
                f"a client's counts); {self._left_out()}"
            )

    def _left_out(self) -> str:
        """Who this market has left out so far, and why: the buyer's exclude list, then each exclusion's reason."""
        parts = []
        if self._listed_out:
            parts.append(
                f"{len(self._listed_out)} node(s) left out by the exclude list (MarketConfig.exclude, run config "
                f"market-exclude: {list(self.config.exclude)}): {self._listed_out}"
            )
        if self._excluded:
            parts.append(f"excluded: {_grouped(self._excluded, sorted(self._excluded))}")
        return "; ".join(parts) if parts else "no node was excluded"

    # --- Step 2: scores and bids ---------------------------------------------------------------
    def collect_bids(self, grid: Grid, pass_result: PassResult) -> dict[int, tuple[float, float]]:
        """Broadcast ``N_s``, ``E`` and the transcript hash; return ``{node: (score, bid)}``.

        Each bidder's signature on its bid is kept in :attr:`bid_signatures`; with a directory a bid whose signature
        is missing or does not verify for this run, session, transcript and the bidder's PASS index excludes it (every
        endorser would refuse an award whose head carried it).

        Raises
        ------
        MarketError
            If ``N_s`` is all zero (no client can score), or most PASS participants failed.
        """
        record = BidRequest(
            session=pass_result.session,
            global_counts=[int(c) for c in pass_result.global_counts],
            num_clients=len(pass_result.participants),
            transcript=pass_result.transcript,
        ).to_record()
        # A survivor excluded at the unmask round stays in N_s and E, but is left out of the rest of the market.
        requests = {node: config_record(record) for node in pass_result.participants if not self.is_excluded(node)}
        highest = highest_possible_score(pass_result, self.config.noise_tolerance)
        replies = self.exchange(grid, ACTION_BID, requests)
        directory, run_id = self.config.directory, int(grid.run.run_id)

        def read(reply: Message, node: int) -> BidReply:
            bid = read_score_and_bid(reply, highest)
            if directory is not None:
                try:
                    verify_bid(
                        directory.key_of(node),
                        bid.bid_signature or b"",
                        run_id=run_id,
                        session=pass_result.session,
                        transcript=pass_result.transcript,
                        index=pass_result.indices[node],
                        node_id=node,
                        score=bid.score,
                        bid=bid.bid,
                    )
                except ValueError as err:
                    raise ReplyError(f"no valid signature on the bid: {err}") from err
            return bid

        replied = self.validated(ACTION_BID, requests, replies, read, pass_node=True)
        bids = {node: (bid.score, bid.bid) for node, bid in replied.items()}
        self.bid_signatures = {node: bid.bid_signature for node, bid in replied.items() if bid.bid_signature}
        self.bids = dict(bids)  # recorded even if the market stops now
        self.require_participation(len(bids))
        return bids

    def require_participation(self, num_bidders: int, *, accepted: bool = False) -> None:
        """Raise :class:`MarketError` if fewer than ``min_participation`` of the invited nodes are bidders.

        A thin market fails rather than buy from a minority: the error says how many were excluded at which
        step (the reasons are in :attr:`MarketOutcome.excluded` of the error's ``outcome``). With ``accepted``,
        ``num_bidders`` is the number that accepted the invitation (PASS's first round: the bidders can only be
        fewer), and a thin market stops there, before any sum is released and without a fresh PASS session.
        """
        invited = len(self._invited) or num_bidders
        needed = math.ceil(self.config.min_participation * invited - 1e-9)
        excluded = MarketOutcome.failed("", self.config.budget, [], self._excluded, {}).exclusion_summary()
        if num_bidders < needed and accepted:
            self._thin = True
            raise MarketError(
                f"a thin market: only {num_bidders} of the {invited} invited nodes accepted the invitation "
                f"({ACTION_ADVERTISE}), fewer than min_participation {self.config.min_participation:g} (run config: "
                f"market-min-participation); excluded {excluded}: the market stops before any sum is released (see "
                "the reasons)"
            )
        if num_bidders < needed:
            raise MarketError(
                f"a thin market: only {num_bidders} of the {invited} invited nodes are left as bidders, fewer than "
                f"min_participation {self.config.min_participation:g} (run config: market-min-participation); "
                f"excluded {excluded}: the market aborts rather than buy from a minority (see the reasons)"
            )

    # --- Step 3: audited auction ---------------------------------------------------------------
    def _audited_auction(
        self, grid: Grid, pass_result: PassResult, bids: Mapping[int, tuple[float, float]]
    ) -> _Outcome:
        """Sign the session's one award, have every bidder endorse it, audit the winners that did.

        The award is never re-issued (the clients refuse a second one): a winner that does not endorse it or fails
        its audit is excluded with the reason logged, and is neither trained nor paid.
        """
        award, tree = self._award(grid, pass_result, bids)
        signed = sign_award(award, self._buyer_key)
        endorsements = self._endorse(grid, signed, tree, [node for node in sorted(bids) if not self.is_excluded(node)])
        holding = [node for node in award.winners if node in endorsements]
        audited: list[int] = []
        if self.config.audit_winners and holding:
            honest = self._audit(grid, pass_result, signed, endorsements, holding, bids)
            audited = [node for node in holding if node in honest]
            holding = audited
        return _Outcome(award=award, signed=signed, winners=holding, audited=audited, endorsers=set(endorsements))

    def _award(
        self, grid: Grid, pass_result: PassResult, bids: Mapping[int, tuple[float, float]]
    ) -> tuple[Award, BidsTree]:
        """The award of the auction over ``bids`` under the market's terms, and its bids tree
        (:func:`.award.build_award`)."""
        cap = self.config.num_winners
        if cap is not None and bids and cap > len(bids):
            log(
                WARNING,
                "Market: %d bidders left for a cohort of %d; capping the cohort at %d",
                len(bids),
                cap,
                len(bids),
            )
        survivors = sorted((index, node) for node, index in pass_result.indices.items())
        signed = all(node in self.bid_signatures for node in bids)  # the secure profile: every bid signed
        try:
            return build_award(
                int(grid.run.run_id),
                pass_result.session,
                pass_result.transcript,
                self.terms,
                survivors,
                bids,
                self._included,
                self.bid_signatures if signed and bids else None,
            )
        except ValueError as err:  # every score and bid was validated on arrival; kept as a clear error all the same
            raise MarketError(f"the auction rejected its input: {err}") from err

    def _endorse(self, grid: Grid, signed: SignedAward, tree: BidsTree, bidders: Sequence[int]) -> dict[int, bytes]:
        """Send the signed award, with each bidder's path in its bids tree, to every bidder; return
        ``{node: endorsement}`` of those that endorse it (with a directory: a valid signature on its digest; without:
        an empty reply or a 64-byte signature). Anything else excludes its sender."""
        requests = {
            node: config_record(
                EndorseRequest(self._session, signed.encoded, signed.signature, tree.proof(node)).to_record()
            )
            for node in bidders
        }
        replies = self.exchange(grid, ACTION_ENDORSE, requests)

        def read(reply: Message, node: int) -> bytes:
            endorsement = EndorseReply.from_record(read_config(reply)).endorsement
            if len(endorsement) not in (0, SIGNATURE_LENGTH):
                raise ReplyError(f"the endorsement must be empty or a {SIGNATURE_LENGTH}-byte signature")
            directory = self.config.directory
            if directory is not None:
                try:
                    verify_award_endorsement(directory.key_of(node), endorsement, signed.digest)
                except ValueError as err:
                    raise ReplyError(f"no valid endorsement of the award: {err}") from err
            return endorsement

        return self.validated(ACTION_ENDORSE, requests, replies, read, pass_node=True)

    def _audit(
        self,
        grid: Grid,
        pass_result: PassResult,
        signed: SignedAward,
        endorsements: Mapping[int, bytes],
        winners: Sequence[int],
        bids: Mapping[int, tuple[float, float]],
    ) -> set[int]:
        """Ask each new winner to open its counts commitment against the award and its endorsements; return
        those that hold."""
        record = AuditRequest(
            session=pass_result.session,
            award=signed.encoded,
            award_signature=signed.signature,
            endorsements=pack_endorsements({node: sig for node, sig in endorsements.items() if sig}),
        ).to_record()
        requests = {node: config_record(record) for node in winners}
        replies = self.exchange(grid, ACTION_AUDIT, requests)

        def check(reply: Message, node: int) -> None:
            check_opening(reply, node, pass_result, self.config, claimed_score=bids[node][0])

        opened = self.validated(ACTION_AUDIT, requests, replies, check, pass_node=True)
        return set(opened)

    # --- Step 4: awards ------------------------------------------------------------------------
    def _close(
        self, grid: Grid, signed: SignedAward | None, endorsers: set[int], bids: Sequence[int] = ()
    ) -> list[int]:
        """Send every contacted node the final signed award (none if the market aborted; to its ``endorsers``,
        which hold it, only its digest); return the bidders that acknowledge it."""
        record = held = AwardRequest(self._session)
        bidders: list[int] = []
        if signed is not None:
            record = AwardRequest(self._session, award=signed.encoded, award_signature=signed.signature)
            held = AwardRequest(self._session, award_digest=signed.digest, award_signature=signed.signature)
            bidders = list(bids)
        requests = {
            node: config_record((held if node in endorsers else record).to_record()) for node in sorted(self._contacted)
        }
        if not requests:
            return []
        replies = self.exchange(grid, ACTION_AWARD, requests)
        acknowledged = []
        for node in bidders:
            reply = replies.get(node)
            try:
                if reply is None:
                    raise ReplyError("no reply")
                AwardReply.from_record(read_config(reply))
            except ReplyError as err:
                log(WARNING, "Market: node %d did not acknowledge its award (%s)", node, err)
                continue
            acknowledged.append(node)
        return acknowledged

    # --- Messaging -----------------------------------------------------------------------------
    def exchange(self, grid: Grid, action: str, requests: Mapping[int, ConfigRecord]) -> dict[int, Message]:
        """Send one request per node; return ``{node: reply}`` received within ``timeout`` (see :func:`exchange`).

        The first exchange of a run's first market that no node has answered yet may also wait up to
        ``wait_for_nodes_timeout`` for its first reply: connected nodes whose ClientApps are still starting (on a
        first run Flower installs the app's dependencies before they answer) are waited for as the market waits for
        nodes to connect. If none answers even then, the market's error says so first (:attr:`_silent_start`)."""
        timeout = self.config.step_timeout(len(requests))
        grace = 0.0 if self._answered or self.relaunch else float(self.config.wait_for_nodes_timeout)
        replies = exchange(grid, action, requests, timeout, start_grace=grace)
        if replies:
            self._answered = True
        elif grace > 0 and requests:
            self._silent_start = (
                f"no node answered its first market message ({action}, {len(requests)} asked) within "
                f"{timeout + grace:g} s ({grace:g} s for a first answer, then the step's {timeout:g} s): the nodes' "
                "ClientApps were still starting, most likely still installing the app's dependencies (Flower's "
                "runtime dependency installation runs uv sync of the app's [project] dependencies at launch: minutes "
                "for torch on a first run), or they cannot load the app. Install the dependencies beforehand and set "
                "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 where the SuperLink and SuperNodes start, or raise "
                "MarketConfig.wait_for_nodes_timeout (run config wait-for-nodes-timeout in the example app; README: "
                "'The plugin in the app's environment')"
            )
            log(WARNING, "Market: %s", self._silent_start)
        return replies

    def validated(
        self,
        action: str,
        requests: Mapping[int, Any],
        replies: Mapping[int, Message],
        read: Callable[..., Any],
        *,
        pass_node: bool = False,
    ) -> dict[int, Any]:
        """Apply ``read`` to the reply of every requested node; exclude missing or bad replies.

        With ``pass_node=True`` ``read`` is called as ``read(reply, node)``.
        """
        valid: dict[int, Any] = {}
        deadline = self.config.step_timeout(len(requests))
        for node in sorted(requests):
            reply = replies.get(node)
            if reply is None:
                self.exclude(node, action, f"no reply within {deadline:g} s")
                continue
            try:
                valid[node] = read(reply, node) if pass_node else read(reply)
            except ReplyError as err:
                self.exclude(node, action, str(err))
        if action == ACTION_ADVERTISE and len(valid) >= self.config.min_clients:  # fewer: PASS stops on its own
            self.require_participation(len(valid), accepted=True)  # who accepted: a thin market stops before any sum
        return valid

    def is_excluded(self, node: int) -> bool:
        """Whether ``node`` was excluded at some step."""
        return node in self._excluded

    def exclude(self, node: int, action: str, reason: str) -> None:
        """Leave ``node`` out of the rest of the market, logging and keeping the reason."""
        message = f"{action}: {reason}"
        log(WARNING, "Market: excluding node %d (%s)", node, message)
        self._excluded[node] = message

    @staticmethod
    def _timed(timings: dict[str, float], name: str, step: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        try:
            return step()
        finally:
            timings[name] = time.perf_counter() - started


def profile_line(config: MarketConfig, invited: int) -> str:
    """What is in effect for a market over ``invited`` clients, in one line: the profile, PASS's graph (complete, or
    the sparse secure mode with its ``k`` and ``t``), the noise on the counts and the colluders stated."""
    if config.security == "malicious":
        profile = f"secure profile (security='malicious', directory of {len(config.directory or {})} nodes)"
        colluders = f"pass-colluders {config.pass_colluders} stated, {config.pass_reruns} PASS re-run(s) at most"
    else:
        profile = "default profile (semi-honest)"
        colluders = "no colluders stated (the default profile assumes none)"
    sparse = config.sparse_settings
    if sparse is not None and config.runs_sparse(invited):
        graph = sparse.parameters(invited)
        layout = (
            f"a graph each client draws (the sparse secure mode): k={graph.degree} out-neighbours each, threshold "
            f"t={graph.threshold}"
        )
    elif config.security == "malicious" or config.neighbours == "all":
        layout = "the complete graph"
    elif config.neighbours == "auto":
        layout = "a graph the buyer places, its degree sized for the roster"
    else:
        layout = f"a graph the buyer places, degree {config.neighbours}"
    noise = "no noise on the counts"
    if config.noise is not None:
        epsilon, delta = config.noise.epsilon, config.noise.delta
        noise = f"Skellam noise on the counts, epsilon {epsilon:g} and delta {delta:g} per release"
    return f"{profile}; PASS over {invited} clients on {layout}; {noise}; {colluders}"


def _grouped(reasons: Mapping[int, str], nodes: Sequence[int]) -> str:
    """``"<reason>: [nodes]; ..."``, the ``nodes`` grouped by their reason in ``reasons``."""
    nodes_of: dict[str, list[int]] = {}
    for node in sorted(nodes):
        nodes_of.setdefault(reasons[node], []).append(node)
    return "; ".join(f"{reason}: {group}" for reason, group in nodes_of.items())


def _label_count_failures(excluded: Mapping[int, str]) -> str:
    """The clients whose own ``get_label_counts`` raised, grouped by exception ("" if none)."""
    nodes_of: dict[str, list[int]] = {}
    for node, reason in sorted(excluded.items()):
        cause = label_counts_failure(reason)
        if cause is not None:
            nodes_of.setdefault(cause, []).append(node)
    return "; ".join(
        f"the label-count callback failed on {len(nodes)} client(s) {nodes}: {cause}"
        for cause, nodes in nodes_of.items()
    )
