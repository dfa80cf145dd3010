"""FLMarket as a Flower strategy: the market phase, then any Message-API strategy on the winners only.

Usage, in a ``ServerApp``'s main::

    strategy = FLMarket(FedAvg(fraction_train=1.0), budget=600.0, num_classes=10)
    result = strategy.start(grid=grid, initial_arrays=arrays, num_rounds=3)
    strategy.market_outcome  # winners, payments, scores, bids

In a legacy ``ServerApp`` (``LegacyContext``, ``DefaultWorkflow``), the same market around the workflow::

    FLMarket(workflow, budget=600.0, num_classes=10)(grid, context)  # was: workflow(grid, context)

A strategy that wraps a strategy and composes with Flower's wrappers in either order (:class:`FLMarket`); what it does
not define is the wrapped strategy's.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any

import flwr
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord
from flwr.compat.server.typing import Workflow
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from flwr.supercore import log

from flmarket_flwr.market.buyer.config import MarketConfig, MarketOutcome
from flmarket_flwr.market.buyer.delivery import DeliveryLedger
from flmarket_flwr.market.buyer.errors import MarketError
from flmarket_flwr.market.buyer.grid_view import WinnersGrid
from flmarket_flwr.market.buyer.membership import Member
from flmarket_flwr.market.buyer.relaunch import RELAUNCH_METRIC, Commitment, RelaunchPolicy, budget_left
from flmarket_flwr.market.buyer.server import MarketPhase
from flmarket_flwr.market.wire.messages import ACTION_ADVERTISE, ERROR_PREFIX, PRIVACY_BUDGET_REFUSED
from flmarket_flwr.pass_protocol import IdentityDirectory
from flmarket_flwr.pricing.auction import VALUE_RANGE

__all__ = ["FLMarket", "MarketEntry", "log_market_outcome", "start_on_nodes"]

_MIN_NODE_SETTINGS = frozenset(
    {
        "min_available_nodes",
        "min_train_nodes",
        "min_evaluate_nodes",
        "min_available_clients",  # a legacy strategy's, in a workflow
        "min_fit_clients",
        "min_evaluate_clients",
    }
)


class FLMarket(Strategy):
    """Run the FLMarket market phase, then the wrapped strategy on the market's winners only.

    The market phase runs PASS (the server learns the sum of the clients' label counts, never one
    client's), collects each client's score and bid, runs the truthful budget-feasible reverse
    auction and sends the awards; the outcome is kept in :attr:`market_outcome`. Then the wrapped
    strategy sees only a :class:`~flmarket_flwr.market.WinnersGrid` of the winners and the nodes the buyer
    included (:attr:`MarketConfig.include`, :attr:`MarketOutcome.cohort`): no other node ever receives a
    train or evaluate message.

    The market runs in :meth:`start` when ``FLMarket`` is the outermost strategy, and in the first
    :meth:`configure_train` or :meth:`configure_evaluate` when another wrapper (Flower's
    differential-privacy strategies, say) sits outside it and drives the rounds with the inherited
    ``Strategy.start``: the guarantee holds in any nesting order, and the market runs once (again between
    rounds only with a ``relaunch`` policy).

    Parameters
    ----------
    strategy : Strategy or Workflow
        The strategy to run on the winners (``FedAvg``, ``FedProx``, ``FedAdam``, your own subclass, ...). Its
        ``min_available_nodes`` / ``min_train_nodes`` / ``min_evaluate_nodes`` are capped at the
        number of winners during :meth:`start`, and restored afterwards. Attributes and methods that ``FLMarket``
        does not define reach it through the wrapper (``strategy.set_save_path(...)`` on an ``FLMarket`` calls the
        wrapped strategy's method; setting one of its attributes sets the wrapped strategy's).
        Or a legacy workflow (``DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(...))``, driving a legacy strategy
        held in a ``LegacyContext``): then the ``FLMarket`` is itself a workflow, called in its place
        (:meth:`__call__`). A legacy strategy (``flwr.server.strategy``) is refused with what to do instead.
    budget : float, optional
        Budget ``R > 0``: what the buyer pays over the whole run, every market together (the first market's
        auction gets all of it; see ``relaunch``). Required unless ``market_config`` is given.
    num_classes : int, optional
        Number of classes ``C``. Required unless ``market_config`` is given.
    market_config : MarketConfig, optional
        Every market setting (cohort cap, timeouts, PASS graph, members, ...); then ``budget``, ``num_classes``,
        ``security``, ``directory``, ``pass_colluders``, ``include``, ``exclude``, ``allow`` and ``budget_rule`` must
        be left unset. Those are a drop-in's shorthand for ``MarketConfig(budget=..., num_classes=..., security=...,
        directory=..., pass_colluders=..., include=..., exclude=..., allow=..., budget_rule=...)``, the rest at its
        defaults.
    seed : int or None (default: 0)
        Seeds the wrapped strategy's node sampling among the winners (see ``WinnersGrid``).
    absent_timeout : float or None (default: 600.0)
        Seconds training may find no winner connected before it stops (see ``WinnersGrid``).
    settle_on_delivery : bool (default: False)
        Pay on delivery: each winner's award is settled pro rata to the train rounds it returned an
        update for, out of those it was asked to train (:class:`~flmarket_flwr.market.DeliveryLedger`).
        ``False``: the award is paid at selection, in full. Either way :meth:`delivery_report` records
        who delivered what.
    security : {"semi-honest", "malicious"}, optional
        The buyer's side of the secure profile (:attr:`MarketConfig.security`; default ``"semi-honest"``):
        ``FLMarket(FedAvg(), budget=..., num_classes=..., security="malicious")``, with node config
        ``market-security=malicious`` on each SuperNode (``docs/threat-model.md``).
    directory : IdentityDirectory, str or Path, optional
        The directory of the nodes' identity keys (or the path of its JSON file), the same one the nodes pin:
        with it the buyer checks the nodes' signatures and names those that break the protocol. Required by
        ``security="malicious"``.
    pass_colluders : int or "auto", optional
        The secure profile's stated number of colluding clients (:attr:`MarketConfig.pass_colluders`; default
        ``"auto"``, a fifth of the directory): the same number as each node's ``pass-colluders``.
    include : Mapping[int | str, float], optional
        Nodes that must train, node id or tag (node config ``market-tag``) -> fixed payment, outside the auction;
        the payments are charged against ``budget`` before it runs (:attr:`MarketConfig.include`).
    exclude : Iterable[int | str], optional
        Nodes never invited, by id or tag (:attr:`MarketConfig.exclude`).
    allow : Iterable[int], optional
        Allow-list-only mode: the only node ids ever sent a message (:attr:`MarketConfig.allow`).
    budget_rule : {"half", "whole"}, optional
        The auction's budget rule (:attr:`MarketConfig.budget_rule`; default ``"half"``, the paper's Algorithm 1,
        which pays at most ``R/2``): ``"whole"`` walks at the whole budget and pays up to ``R``, still truthful and
        individually rational (docs/mechanism.md).
    relaunch : RelaunchPolicy, optional
        Run the market again between rounds (:class:`~flmarket_flwr.market.buyer.relaunch.RelaunchPolicy`: every N
        rounds, on churn, on a shrunken cohort; a wrapped strategy may also ask, with the metric
        ``market-relaunch`` or :meth:`request_market`). FLMarket then drives the rounds itself (Flower's
        ``Strategy.start`` over these hooks) and the wrapped strategy goes on, on the same global model, with
        each new cohort. ``budget`` is for the whole run: a re-launch's auction gets what is left after the
        payments already committed (an earlier market's award as settled, pro rata on delivery with
        ``settle_on_delivery``; a cohort that goes on training, its whole award), and a market with nothing
        left to spend is skipped with that reason. Who is invited depends on the profile: without noise (the
        default profile) a node takes part in one market's PASS per run, so a re-launch invites only the nodes
        that have not (the newcomers) and its winners join the cohort that trains (the earlier winners keep
        their awards); with noise on the counts (the secure profile) every node is invited again, each release
        charged to its own privacy budget, and the new cohort replaces the old. Nodes that cannot take part are
        sent nothing, so a re-launch with too few of them is skipped before PASS, releasing nothing. When the nodes'
        privacy budgets are spent (or, by default, every node has released once), one line says so and
        re-launching stops until nodes that can take part connect. :attr:`markets` keeps every market, run or
        skipped, with why it ran, what it released and why it stopped. Its ``market_share`` caps what each
        market's auction may spend, as a share of ``budget`` (the first market's included): a policy with that
        alone, and no re-launch criterion, only caps the one market.

    Notes
    -----
    A :class:`~flmarket_flwr.market.MarketError` (too few clients connected, PASS failed, no valid
    bid, or nobody won the auction) is logged in one plain line and re-raised: there is nothing to
    train, and a run that trained nobody must not end as a success with an untrained model.

    A strategy that wraps a strategy, like Flower's ``DifferentialPrivacyServerSideFixedClipping``, and
    composes with those wrappers in either order: outermost, its ``start`` runs the market first; wrapped
    (``DifferentialPrivacyServerSideFixedClipping(FLMarket(FedAvg()), ...)``, whose inherited ``start``
    calls the per-round hooks), its first ``configure_train``/``configure_evaluate`` runs the market on
    the grid it is given. Either way the market runs once (without a ``relaunch`` policy) and only the cohort
    (winners and included nodes) is ever sent a train or evaluate message.
    """

    # pylint: disable=too-many-arguments
    def __init__(
        self,
        strategy: Strategy | Workflow,
        *,
        budget: float | None = None,
        num_classes: int | None = None,
        market_config: MarketConfig | None = None,
        seed: int | None = 0,
        absent_timeout: float | None = 600.0,
        settle_on_delivery: bool = False,
        security: str | None = None,
        directory: IdentityDirectory | str | Path | None = None,
        include: Mapping[Member, float] | None = None,
        exclude: Iterable[Member] | None = None,
        relaunch: RelaunchPolicy | None = None,
        allow: Iterable[int] | None = None,
        pass_colluders: int | str | None = None,
        budget_rule: str | None = None,
    ) -> None:
        super().__init__()
        strategy, workflow = _wrapped_parts(strategy)
        shorthand = {
            "budget": budget,
            "num_classes": num_classes,
            "security": security,
            "directory": directory,
            "include": include,
            "exclude": exclude,
            "allow": allow,
            "pass_colluders": pass_colluders,
            "budget_rule": budget_rule,
        }
        given = sorted(name for name, value in shorthand.items() if value is not None)
        if market_config is not None and given:
            raise ValueError(f"give either market_config or {given}, not both")
        if market_config is None:
            if budget is None or num_classes is None:
                raise ValueError("FLMarket needs budget and num_classes (or a market_config)")
            if isinstance(directory, (str, Path)):
                directory = IdentityDirectory.from_json(Path(directory))
            # One construction: the profile's "auto" values are derived once, from the settings given.
            profile = {"security": security, "pass_colluders": pass_colluders, "budget_rule": budget_rule}
            market_config = MarketConfig(
                budget,
                num_classes,
                directory=directory,
                include=dict(include or {}),
                exclude=tuple(exclude or ()),
                allow=tuple(allow or ()),
                **{name: value for name, value in profile.items() if value is not None},  # type: ignore[arg-type]
            )
        self.strategy = strategy
        self.market_config = market_config
        self.seed = seed
        self.absent_timeout = absent_timeout
        if not isinstance(settle_on_delivery, bool):
            raise TypeError(f"settle_on_delivery must be a bool, got {type(settle_on_delivery).__name__}")
        self.settle_on_delivery = settle_on_delivery
        if relaunch is not None and not isinstance(relaunch, RelaunchPolicy):
            raise TypeError(f"relaunch must be a RelaunchPolicy or None, got {type(relaunch).__name__}")
        self.relaunch = relaunch if relaunch is not None and relaunch.enabled else None
        self.market_share = 1.0 if relaunch is None else relaunch.market_share
        """The most one market's auction may spend, as a share of the run's budget (``RelaunchPolicy.market_share``)."""
        self.market_outcome: MarketOutcome | None = None
        self.delivery: DeliveryLedger | None = None
        self.markets: list[MarketEntry] = []
        """Every market of the run, in order: the first, then each re-launch (run, or skipped with its reason)."""
        self._winners_grid: WinnersGrid | None = None
        self._train_messages: dict[int, list[Message]] = {}
        self._requested = ""
        self._rounds_at_market = 0
        self._connected_at_market: set[int] = set()
        self._active: list[MarketEntry] = []
        self.dropped: dict[int, str] = {}
        """Nodes the buyer dropped mid-run (:meth:`drop_nodes`) -> why."""
        self._spent: dict[int, str] = {}
        self._rostered: set[int] = set()
        self._stopped = ""
        self._train_rounds = 0
        self.workflow: Workflow | None = workflow
        """The legacy workflow this market wraps (``FLMarket(workflow, ...)(grid, context)``), else ``None``."""
        _check_workflow_settings(self)
        self._transparent = True  # last: from here on, writes of the wrapped strategy's attributes reach it

    # pylint: disable=too-many-positional-arguments
    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
        should_stop: Callable[[int, Result], bool] | None = None,
        **newer: Any,
    ) -> Result:
        """Run the market phase, then the wrapped strategy's ``start`` on the winners.

        Parameters are those of ``Strategy.start``. ``should_stop`` (Flower 1.43: a predicate called after each
        round that ends training early) and any other keyword (``newer``) go to the wrapped strategy's ``start``
        as given (see :func:`start_on_nodes`).

        Returns
        -------
        Result
            The wrapped strategy's result.

        Raises
        ------
        TypeError
            If a keyword given (not ``None``) is one the wrapped strategy's ``start`` does not take (an older
            Flower's): raised before the market phase, so no market is run for a start that cannot happen.
        MarketError
            If the market phase cannot run, or nobody won the auction (logged first).
        """
        if self.workflow is not None:
            self.strategy.start(grid, initial_arrays)  # the stand-in's refusal: nothing is run
        driver: type[Strategy] = Strategy if self.relaunch is not None else type(self.strategy)  # type: ignore[type-abstract]
        keywords = _start_keywords(driver, {"should_stop": should_stop, **newer})
        log(INFO, "Starting FLMarket: market phase, then %s on the winners", type(self.strategy).__name__)
        self._new_run()
        if self.relaunch is not None:  # the rounds go through this strategy's hooks, which re-run the market
            return Strategy.start(
                self,
                grid=grid,
                initial_arrays=initial_arrays,
                num_rounds=num_rounds,
                timeout=timeout,
                train_config=train_config,
                evaluate_config=evaluate_config,
                evaluate_fn=evaluate_fn,
                **keywords,
            )
        view = self.winners_grid(grid)
        return start_on_nodes(
            self.strategy,
            view,
            initial_arrays=initial_arrays,
            num_rounds=num_rounds,
            timeout=timeout,
            train_config=train_config,
            evaluate_config=evaluate_config,
            evaluate_fn=evaluate_fn,
            **keywords,
        )

    def __call__(self, grid: Grid, context: Context) -> None:
        """Run the market phase, then the wrapped legacy workflow on the winners: a legacy ``ServerApp``'s
        ``workflow(grid, context)`` becomes ``FLMarket(workflow, budget=..., num_classes=...)(grid, context)``.

        The workflow (``DefaultWorkflow``, with ``SecAggPlusWorkflow`` as its fit workflow, say) gets the market's
        :meth:`winners_grid`, so its client manager holds the winners only and the legacy strategy in ``context``
        (``LegacyContext``) samples among them; that strategy's ``min_fit_clients`` / ``min_evaluate_clients`` /
        ``min_available_clients`` (and those of each strategy it wraps) are capped at the cohort meanwhile, as
        :meth:`start` caps a Message-API strategy's. A market run already on ``grid`` (:meth:`winners_grid` called
        first, to size a DP wrapper for the cohort) is not run again. Every train message the workflow sends is
        recorded in :meth:`delivery_report` (SecAgg+ sends several a round: one per stage).

        Parameters
        ----------
        grid : Grid
            The ``ServerApp``'s grid.
        context : Context
            The ``LegacyContext`` the workflow runs with.

        Raises
        ------
        TypeError
            If this ``FLMarket`` wraps a strategy (use :meth:`start`), or it is called from inside a running
            ``DefaultWorkflow`` (as its fit workflow): it must wrap the outermost workflow.
        MarketError
            If the market phase cannot run, or nobody won the auction (logged first).
        """
        if self.workflow is None:
            raise TypeError(
                f"this FLMarket wraps the strategy {type(self.strategy).__name__}: run it with "
                "strategy.start(grid=grid, initial_arrays=...), not as a workflow"
            )
        if _inside_a_legacy_round(context):
            raise TypeError(
                "FLMarket was called inside a running workflow (as DefaultWorkflow's fit_workflow?): wrap the "
                "outermost workflow instead, FLMarket(DefaultWorkflow(fit_workflow=...), budget=..., "
                "num_classes=...)(grid, context)"
            )
        if self._winners_grid is None or self._winners_grid.grid is not grid:
            self._new_run()
        log(INFO, "Starting FLMarket: market phase, then %s on the winners", type(self.workflow).__name__)
        view = self.winners_grid(grid)
        legacy_strategy = getattr(context, "strategy", None)
        with _capped_min_nodes(legacy_strategy, len(view.node_ids)):
            _warn_if_dp_sized_otherwise(legacy_strategy, len(view.node_ids))
            self.workflow(view, context)

    def _new_run(self) -> None:
        """Forget the markets of an earlier run: a new run starts with none."""
        self.market_outcome = None
        self._winners_grid = None
        self.markets = []
        self._active, self._spent, self._stopped, self._train_rounds = [], {}, "", 0
        self._rostered = set()
        self.dropped = {}

    def winners_grid(self, grid: Grid) -> WinnersGrid:
        """The view of ``grid`` that holds the market's winners only; runs the market phase the first time.

        Raises
        ------
        MarketError
            If the market phase cannot run, or nobody won the auction (logged first).
        """
        if self._winners_grid is not None:
            return self._winners_grid
        config = self.market_config
        if self.market_share < 1:  # the first market keeps the rest of the run's budget for later markets
            config = dataclasses.replace(config, budget=self.market_share * config.budget)
        phase = MarketPhase(config)
        try:
            outcome = self._run_market(grid, phase)
        except MarketError as err:
            if err.outcome is not None:  # the failed market's record: who was excluded at which step, and why
                self.market_outcome = err.outcome
                self.markets.append(MarketEntry(1, "the first market", err.outcome, None, phase.released))
            log(ERROR, "FLMarket: the market phase failed: %s", err)
            raise
        self._rounds_at_market = 0
        self._connected_at_market = set(grid.get_node_ids())
        self._note_spent(outcome, 1)
        return self._adopt(grid, MarketEntry(1, "the first market", outcome, None, phase.released))

    def drop_nodes(self, nodes: Iterable[int], reason: str = "dropped by the buyer") -> None:
        """Stop training ``nodes`` from the next round on, and invite them to no later market of the run.

        For a wrapped strategy that judges its nodes as it trains (Flower issue #1756: the exclude list is fixed
        for the run): it holds this ``FLMarket`` and calls this between rounds. The payment rule is the delivery
        rule, unchanged: a dropped node is settled on the train rounds it was asked, in full, or with
        ``settle_on_delivery`` pro rata to the updates it returned of those; dropping it never lowers what the
        buyer committed to, and the run's budget keeps counting it (:func:`~.relaunch.budget_left`).

        Raises
        ------
        RuntimeError
            Before the first market.
        ValueError
            A node not in the cohort in force, or every node of it (nothing would be left to train).
        """
        if self._winners_grid is None:
            raise RuntimeError("the market has not run yet: there is no cohort to drop nodes from")
        drop = list(dict.fromkeys(int(node) for node in nodes))
        cohort = self.cohort
        outside = [node for node in drop if node not in cohort]
        if outside:
            raise ValueError(f"node(s) {outside} are not in the cohort in force {cohort}: nothing to drop")
        if set(cohort) <= set(drop):
            raise ValueError(f"dropping {drop} leaves no node of the cohort {cohort} to train")
        self._winners_grid.drop(drop)
        for node in drop:
            self.dropped[node] = reason
            self._spent[node] = f"dropped by the buyer ({reason})"
        log(
            INFO,
            "FLMarket: node(s) %s dropped (%s): they train no more and are not invited again this run",
            drop,
            reason,
        )

    def request_market(self, reason: str = "requested") -> None:
        """Ask for a re-launch of the market before the next train round (with a :class:`RelaunchPolicy`)."""
        self._requested = reason or "requested"

    @property
    def cohort(self) -> list[int]:
        """The nodes that train now: the cohorts of the markets in force (one, or with newcomers' markets that
        joined it several), in order, each node once; ``[]`` before the first market."""
        nodes: list[int] = []
        for entry in self._active:
            nodes += [node for node in entry.outcome.cohort if node not in nodes and node not in self.dropped]
        return nodes

    def _run_market(self, grid: Grid, phase: MarketPhase) -> MarketOutcome:
        """Run one market; :class:`MarketError` (with the outcome) when it fails or selects nobody.

        A market that bought nobody is recorded as failed, with the reason and every score and bid it received
        (those of winners that did not endorse or failed their audit included)."""
        outcome = phase.run(grid)
        log_market_outcome(outcome)
        if not outcome.cohort:
            dropped = sorted(set(phase.bids) - set(outcome.participants))
            reason = (
                f"no client won the auction ({len(outcome.participants)} bidders, budget {outcome.budget:.4g}"
                + (f"; {len(dropped)} winner(s) {dropped} did not hold their award, see excluded" if dropped else "")
                + "): nothing to train. Raise the budget, or look at the bids in the market log"
            )
            err = MarketError(reason)
            err.outcome = dataclasses.replace(
                outcome,
                status="failed",
                reason=reason,
                scores={node: score for node, (score, _) in phase.bids.items()},
                bids={node: bid for node, (_, bid) in phase.bids.items()},
            )
            raise err
        return outcome

    def _adopt(self, grid: Grid, entry: MarketEntry) -> WinnersGrid:
        """Put ``entry``'s market in force, with its own delivery ledger: its cohort trains from its first round on,
        in place of the cohort before it or (``entry.joined``) beside it."""
        entry = dataclasses.replace(entry, delivery=DeliveryLedger(entry.outcome.cohort))
        self.market_outcome = entry.outcome
        self.delivery = entry.delivery
        self._active = [*self._active, entry] if entry.joined else [entry]
        self._winners_grid = WinnersGrid(
            grid, self.cohort, seed=self.seed, absent_timeout=self.absent_timeout, on_exchange=self._record_exchange
        )
        self.markets.append(entry)
        return self._winners_grid

    def _maybe_relaunch(self, server_round: int, grid: Grid) -> None:
        """Before train round ``server_round``: run the market again if the policy says so; skip it if it cannot run
        or fails (training goes on with the cohort in force)."""
        if self.relaunch is None or self.market_outcome is None:
            return
        connected = set(grid.get_node_ids())
        if self._stopped:
            if len(self._able(connected)) < self.market_config.min_clients:
                return
            log(INFO, "FLMarket: nodes that can take part in a market connected; re-launching resumes")
            self._stopped = ""
        reason = self.relaunch.reason(
            rounds_since=server_round - 1 - self._rounds_at_market,
            connected=connected,
            at_last_market=self._connected_at_market,
            cohort=self.cohort,
            requested=self._requested,
        )
        if not reason:
            return
        self._requested = ""
        self._rounds_at_market = server_round - 1
        self._connected_at_market = connected
        log(INFO, "FLMarket: re-launching the market before round %d (%s)", server_round, reason)
        joins = self.market_config.noise is None  # the default profile: one release per node per run
        committed = self._committed(keep_in_force=joins)
        config, skipped = self._relaunch_config(committed, joins, connected)
        if config is None:  # known before any message: nothing released, nobody contacted
            record = MarketOutcome.failed(skipped, self.market_config.budget - committed, [], {}, {}, status="skipped")
            self._skip(server_round, reason, record, committed, [], connected)
            return
        phase = MarketPhase(config, sit_out=self._sat_out(joins), relaunch=True)
        try:
            outcome = self._run_market(grid, phase)
        except MarketError as err:
            record = err.outcome or MarketOutcome.failed(str(err), config.budget, [], {}, {})
            self._note_spent(record, len(self.markets) + 1)
            self._skip(server_round, reason, record, committed, phase.released, connected)
            return
        self._note_spent(outcome, len(self.markets) + 1)
        self._adopt(grid, MarketEntry(server_round, reason, outcome, None, phase.released, committed, joins))

    def _relaunch_config(self, committed: float, joins: bool, connected: set[int]) -> tuple[MarketConfig | None, str]:
        """The re-launch's settings (its auction's budget: what is left of the run's), or ``None`` and why it cannot
        run: nothing left to spend, or too few connected nodes that can take part (known before any message)."""
        run_budget = self.market_config.budget
        left = run_budget - committed
        spent = f"{committed:.6g} of the run's budget {run_budget:.6g} is committed to earlier markets"
        if left <= max(run_budget * 1e-9, VALUE_RANGE[0]):
            return None, f"the run's budget is spent: {spent}"
        able = self._able(connected)
        if len(able) < self.market_config.min_clients:
            why = (
                "every other node has released its counts once this run (default profile: one release per run; "
                "the secure profile's privacy budgets allow more)"
                if joins
                else "the others' privacy budgets are spent"
            )
            return None, (
                f"only {len(able)} connected node(s) can take part, fewer than min_clients "
                f"{self.market_config.min_clients}: {why}"
            )
        try:
            include = {  # joining: the included nodes train already; a dropped node is never included again
                member: payment for member, payment in self.market_config.include.items() if member not in self.dropped
            }
            config = dataclasses.replace(
                self.market_config,
                expected_nodes=None,
                budget=min(self.market_share * run_budget, left),
                include={} if joins else include,
                exclude=(*self.market_config.exclude, *self.dropped),
            )
        except ValueError as err:  # the included nodes' payments leave nothing of what is left
            return None, f"{spent}, which leaves {left:.6g}: {err}"
        return config, ""

    def _committed(self, *, keep_in_force: bool) -> float:
        """What the markets of the run so far are committed to pay (:func:`~.relaunch.budget_left`'s rule)."""
        markets = [
            Commitment(
                awarded=math.fsum(entry.outcome.payments.values()),
                settled=math.fsum(
                    entry.delivery.settle(entry.outcome.payments, on_delivery=self.settle_on_delivery).values()
                ),
                in_force=any(entry is active for active in self._active),
            )
            for entry in self.markets
            if entry.delivery is not None
        ]
        return budget_left(self.market_config.budget, markets, keep_in_force=keep_in_force)[1]

    def _sat_out(self, joins: bool) -> dict[int, str]:
        """The nodes a re-launch does not invite, and why: those that cannot release again, and (when its cohort
        joins the one in force) those that train already."""
        training = dict.fromkeys(self.cohort if joins else (), "trains in the cohort in force")
        return {**training, **self._spent}

    def _able(self, connected: set[int]) -> set[int]:
        """The connected nodes a re-launch could invite: not spent, not in the cohort in force (default profile),
        not excluded by id."""
        out = set(self._spent) | set(self.cohort if self.market_config.noise is None else ())
        allowed = self.market_config.allow
        return {
            node
            for node in connected
            if node not in out and node not in self.market_config.exclude and (not allowed or node in allowed)
        }

    def _note_spent(self, outcome: MarketOutcome, market: int) -> None:
        """Record the nodes that market number ``market`` leaves unable to release again this run: without noise
        every node of its PASS sessions (a node takes part in one market per run), those that refused it for
        their privacy budget, and those that declined its invitation after taking part in an earlier market (a node
        without a privacy budget declines every re-launch; a newcomer that declines, or a silent node, may take
        part in the next)."""
        if self.market_config.noise is None:
            for session in outcome.pass_sessions:
                for node in session.roster:
                    self._spent.setdefault(node, f"took part in market {market}'s PASS (one release per run)")
        refusal = f"{ACTION_ADVERTISE}: error reply"  # the node's own handler declined the invitation
        for node, reason in outcome.excluded.items():
            if PRIVACY_BUDGET_REFUSED in reason:
                self._spent[node] = f"its privacy budget is spent (market {market})"
            elif node in self._rostered and reason.startswith(refusal) and ERROR_PREFIX + ACTION_ADVERTISE in reason:
                self._spent.setdefault(node, f"declined re-launched market {market} (its reason is in its own log)")
        self._rostered.update(node for session in outcome.pass_sessions for node in session.roster)

    def _skip(
        self,
        server_round: int,
        reason: str,
        record: MarketOutcome,
        committed: float,
        released: list[int],
        connected: set[int],
    ) -> None:
        """Record a re-launch that did not run or failed; stop re-launching when too few nodes can take part."""
        self.markets.append(MarketEntry(server_round, reason, record, None, released, committed))
        refused = sum(1 for why in record.excluded.values() if PRIVACY_BUDGET_REFUSED in why)
        log(
            WARNING,
            "FLMarket: market %d %s (%s%s); training goes on with the cohort in force %s",
            len(self.markets),
            "skipped" if record.status == "skipped" else "failed",
            record.reason,
            f"; {refused} node(s) refused it for their privacy budget" if refused else "",
            self.cohort,
        )
        able = self._able(connected)
        if len(able) >= self.market_config.min_clients:
            return
        spent = [node for node in sorted(connected) if node in self._spent]
        budgets = sum(1 for node in spent if "privacy budget" in self._spent[node])
        self._stopped = (
            f"the privacy budgets of {budgets} of the {len(connected)} connected nodes are spent"
            + (f" and {len(spent) - budgets} more have released once this run" if len(spent) > budgets else "")
            if budgets
            else f"{len(spent)} of the {len(connected)} connected nodes have released their counts once this run "
            "(default profile: one release per run; the secure profile's privacy budgets allow more)"
        )
        log(
            WARNING,
            "FLMarket: re-launching stops: %s, %d can take part; training goes on with %s (nodes that can take part "
            "re-open the market when they connect)",
            self._stopped,
            len(able),
            self.cohort,
        )

    def _record_exchange(
        self, messages: Iterable[Message], replies: Iterable[Message], server_round: int | None = None
    ) -> None:
        """Record one exchange in each market in force's delivery ledger (its own cohort's messages); warn when a
        train round got no update at all."""
        messages, replies = list(messages), list(replies)
        train = [message for message in messages if message.metadata.message_type == MessageType.TRAIN]
        if not train:
            return
        self._train_rounds += 1
        run_round = server_round or self._train_rounds  # the run's numbering, whichever market's cohort trains
        for entry in self._active:
            assert entry.delivery is not None
            cohort = set(entry.outcome.cohort)
            entry.delivery.record([m for m in train if m.metadata.dst_node_id in cohort], replies, run_round)
        warn_if_no_update(run_round, train, replies)

    def markets_report(self) -> list[dict[str, Any]]:
        """One entry per market of the run (``market.json``'s ``markets``), in order: :meth:`market_entry` of each."""
        return [self.market_entry(position) for position in range(1, len(self.markets) + 1)]

    def market_entry(self, position: int) -> dict[str, Any]:
        """The record of market number ``position`` (from 1) of the run: the one place that builds it.

        It says before which round (the run's numbering) it ran and why (``trigger``: the first market, or the
        re-launch policy's criterion); its own outcome (:meth:`MarketOutcome.to_dict`: ``status`` ``"succeeded"``
        when it bought a cohort, ``"failed"`` when it stopped or bought nobody, ``"skipped"`` when it never ran, and
        in ``reason`` why; the scores and bids it received, a failed market's too; ``budget``, its auction's); the
        run's budget and what earlier markets had committed of it; ``released``, the nodes whose counts went into a
        PASS sum the buyer could unmask, a failed market's included; whether its cohort joined the one in force;
        whether it is in force at the end; and its cohort's deliveries and settlement over the rounds it trained
        (failures named by the run's round; ``None`` for a market that bought nobody).
        """
        entry = self.markets[position - 1]
        return {
            "market": position,
            "before_round": entry.first_round,
            "trigger": entry.reason,
            **entry.outcome.to_dict(),
            "run_budget": self.market_config.budget,
            "committed_before": entry.committed_before,
            "released": sorted(entry.released),
            "cohort_joined": entry.joined,
            "in_force": any(entry is active for active in self._active),
            "delivery": None
            if entry.delivery is None
            else entry.delivery.to_dict(entry.outcome.payments, on_delivery=self.settle_on_delivery),
        }

    def run_report(self) -> dict[str, Any]:
        """The run's summary over every market (``market.json``'s ``run``): how many markets ran and how each ended,
        the cohort in force at the end and the markets it came from, the run's budget, what was awarded and what is
        owed over every market, the buyer's own include, exclude and allow lists, and the nodes dropped mid-run."""
        statuses = [entry.outcome.status for entry in self.markets]
        config = self.market_config
        return {
            "markets": len(self.markets),
            "succeeded": statuses.count("succeeded"),
            "failed": statuses.count("failed"),
            "skipped": statuses.count("skipped"),
            "in_force": [position for position, entry in enumerate(self.markets, 1) if entry in self._active],
            "cohort": self.cohort,
            "run_budget": config.budget,
            "total_awarded": math.fsum(math.fsum(entry.outcome.payments.values()) for entry in self.markets),
            "total_settled": math.fsum(self.settled_across_markets().values()),
            "include": {str(member): float(payment) for member, payment in config.include.items()},
            "exclude": [str(member) for member in config.exclude],
            "allow": [int(node) for node in config.allow],
            "dropped": {str(node): reason for node, reason in self.dropped.items()},
        }

    def settled_across_markets(self) -> dict[int, float]:
        """What each node is owed over every market of the run (each market settles its own awards)."""
        owed: dict[int, float] = {}
        for entry in self.markets:
            if entry.delivery is None:
                continue
            settled = entry.delivery.settle(entry.outcome.payments, on_delivery=self.settle_on_delivery)
            for node in entry.delivery.records:
                owed[node] = owed.get(node, 0.0) + settled.get(node, 0.0)
        return owed

    def delivery_report(self) -> dict[str, Any]:
        """Per node of the cohort in force: train messages sent, updates returned, why not, its award and what it is
        owed (over the markets in force).

        Raises
        ------
        RuntimeError
            If the market has not run yet.
        """
        if not self._active:
            raise RuntimeError("the market has not run yet")
        reports = [
            entry.delivery.to_dict(entry.outcome.payments, on_delivery=self.settle_on_delivery)
            for entry in self._active
            if entry.delivery is not None
        ]
        return {
            "settle_on_delivery": self.settle_on_delivery,
            "total_settled": math.fsum(report["total_settled"] for report in reports),
            "winners": {node: record for report in reports for node, record in report["winners"].items()},
        }

    def summary(self) -> None:
        """Log the market settings and the wrapped strategy's summary."""
        log(
            INFO,
            "\t├── FLMarket: budget %.4g for the run, %d classes",
            self.market_config.budget,
            self.market_config.num_classes,
        )
        self.strategy.summary()

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The wrapped strategy's train messages, addressed to winners only (the market runs first, and again
        when the :class:`RelaunchPolicy` says so)."""
        if self._winners_grid is not None and grid is not self._winners_grid:
            self._maybe_relaunch(server_round, grid)
        view = self._view_of(grid)
        with _capped_min_nodes(self.strategy, len(view.node_ids)):
            messages = list(self.strategy.configure_train(server_round, arrays, config, view))
        self._train_messages[server_round] = messages  # FLMarket is wrapped: its aggregate_train sees the replies
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Record the winners' deliveries of this round (when wrapped), then delegate to the wrapped strategy."""
        replies = list(replies)
        sent = self._train_messages.pop(server_round, None)
        if sent is not None:
            self._record_exchange(sent, replies, server_round)
        arrays, metrics = self.strategy.aggregate_train(server_round, replies)
        if metrics is not None and metrics.get(RELAUNCH_METRIC):
            self.request_market(f"the wrapped strategy's {RELAUNCH_METRIC} metric")
        return arrays, metrics

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The wrapped strategy's evaluate messages, addressed to winners only (the market runs first, once)."""
        view = self._view_of(grid)
        with _capped_min_nodes(self.strategy, len(view.node_ids)):
            return self.strategy.configure_evaluate(server_round, arrays, config, view)

    def _view_of(self, grid: Grid) -> WinnersGrid:
        """The winners' view for a round hook: ``grid`` itself when it already is one (``start`` made it)."""
        if self._winners_grid is not None and grid is self._winners_grid:
            return self._winners_grid
        return self.winners_grid(grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Delegate to the wrapped strategy."""
        return self.strategy.aggregate_evaluate(server_round, replies)

    # --- Transparent: the wrapped strategy's own attributes and methods ------------------------------
    def __getattr__(self, name: str) -> Any:
        """An attribute ``FLMarket`` does not have: the wrapped strategy's (or workflow's), as if unwrapped.

        Private names (``_...``) are not forwarded, nor is anything before ``__init__`` has set the wrapped
        object (unpickling, ``copy``): both raise ``AttributeError`` as usual.
        """
        wrapped = _wrapped_object(self.__dict__)
        if name.startswith("_") or wrapped is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        try:
            return getattr(wrapped, name)
        except AttributeError:
            raise AttributeError(
                f"neither {type(self).__name__!r} nor the {type(wrapped).__name__!r} it wraps has an attribute {name!r}"
            ) from None

    def __setattr__(self, name: str, value: Any) -> None:
        """Set an attribute; one that only the wrapped strategy has (``fraction_train``, your own) is set there."""
        state = self.__dict__
        if state.get("_transparent") and name not in state and not hasattr(type(self), name):
            wrapped = _wrapped_object(state)
            if not name.startswith("_") and hasattr(wrapped, name):
                setattr(wrapped, name, value)
                return
        super().__setattr__(name, value)


@dataclass(frozen=True, eq=False)
class MarketEntry:
    """One market of a run.

    Attributes
    ----------
    first_round : int
        The train round before which it ran.
    reason : str
        Why it ran (its trigger).
    outcome : MarketOutcome
        Its outcome (``status`` ``"failed"`` and the ``reason`` for a market that was skipped or failed).
    delivery : DeliveryLedger or None
        Its cohort's delivery ledger (``None`` for a market that was skipped or failed).
    released : list[int]
        The nodes whose counts went into a PASS sum the buyer could unmask (:attr:`MarketPhase.released`).
    committed_before : float
        What earlier markets of the run were committed to pay when it ran (its auction got the rest).
    joined : bool
        Whether its cohort trained beside the one in force (the default profile's newcomers) instead of replacing it.
    """

    first_round: int
    reason: str
    outcome: MarketOutcome
    delivery: DeliveryLedger | None
    released: list[int] = dataclasses.field(default_factory=list)
    committed_before: float = 0.0
    joined: bool = False


def start_on_nodes(strategy: Strategy, grid: WinnersGrid, **start_args: Any) -> Result:
    """Start ``strategy`` on ``grid`` with its minimum node counts capped at the grid's nodes.

    Parameters
    ----------
    strategy : Strategy
        Any Message-API strategy.
    grid : WinnersGrid
        The view of the selected nodes.
    **start_args
        ``Strategy.start``'s other arguments; those its ``start`` does not take are dropped when ``None``, refused
        otherwise (:func:`_start_keywords`).

    Returns
    -------
    Result
        What ``strategy.start`` returns.

    Raises
    ------
    TypeError
        If a keyword with a value other than ``None`` is one ``strategy.start`` does not take.
    """
    keywords = _start_keywords(type(strategy), start_args)
    with _capped_min_nodes(strategy, len(grid.node_ids)):
        return strategy.start(grid=grid, **keywords)


def _start_keywords(strategy_type: type[Strategy], keywords: dict[str, Any]) -> dict[str, Any]:
    """The keywords that ``strategy.start`` takes, out of ``keywords``.

    Flower adds keywords to ``Strategy.start`` over releases (``should_stop`` in 1.43). A keyword that the
    installed strategy's ``start`` lacks is dropped when its value is ``None`` (its default where it exists, so
    one call works on every Flower release), and refused otherwise: silently ignoring ``should_stop=...`` would
    train every round of a run that asked to stop early. A ``start`` that takes ``**kwargs`` takes everything.

    Parameters
    ----------
    strategy_type : type[Strategy]
        The type of the strategy whose ``start`` is to be called.
    keywords : dict[str, Any]
        Keyword arguments meant for it.

    Returns
    -------
    dict[str, Any]
        ``keywords`` less the ``None`` ones that ``strategy.start`` does not take.

    Raises
    ------
    TypeError
        If a keyword with a value other than ``None`` is one ``strategy.start`` does not take.
    """
    names, takes_any = _start_parameters(strategy_type)
    if takes_any:
        return dict(keywords)
    refused = sorted(name for name, value in keywords.items() if name not in names and value is not None)
    if refused:
        raise TypeError(
            f"{strategy_type.__name__}.start() takes no {', '.join(refused)} in the installed Flower "
            f"(flwr {flwr.__version__}): upgrade Flower, or leave {', '.join(refused)} unset"
        )
    return {name: value for name, value in keywords.items() if name in names}


@functools.cache
def _start_parameters(strategy_type: type[Strategy]) -> tuple[frozenset[str], bool]:
    """The keyword names that ``strategy_type.start`` takes, and whether it takes ``**kwargs`` (read once per type)."""
    parameters = inspect.signature(strategy_type.start).parameters.values()
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    names = frozenset(p.name for p in parameters if p.kind in named)
    return names, any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


@contextmanager
def _capped_min_nodes(strategy: object, num_nodes: int) -> Iterator[None]:
    """Cap the ``min_*_nodes`` of the strategy, and of each one it wraps (a DP wrapper's ``strategy``), at
    ``num_nodes`` (they would wait forever for more); restore after. A legacy strategy's ``min_*_clients`` alike.

    Only a strategy's own attributes are capped (an ``FLMarket`` in the chain forwards its wrapped strategy's, which
    the chain caps where they live)."""
    saved = [
        (each, name, value)
        for each in _strategy_chain(strategy)
        for name, value in getattr(each, "__dict__", {}).items()
        if name in _MIN_NODE_SETTINGS and isinstance(value, int)
    ]
    for each, name, value in saved:
        setattr(each, name, min(int(value), num_nodes))
    try:
        yield
    finally:
        for each, name, value in saved:
            setattr(each, name, value)


def _strategy_chain(strategy: object) -> list[object]:
    """``strategy`` and each strategy it wraps (a wrapper's ``strategy``), Message-API or legacy, outermost first."""
    from flwr.server.strategy import Strategy as LegacyStrategy  # pylint: disable=import-outside-toplevel

    chain: list[object] = []
    while isinstance(strategy, (Strategy, LegacyStrategy)) and all(strategy is not seen for seen in chain):
        chain.append(strategy)
        strategy = getattr(strategy, "__dict__", {}).get("strategy")
    return chain


def _wrapped_object(state: Mapping[str, Any]) -> object:
    """What an ``FLMarket`` whose ``__dict__`` is ``state`` wraps: its workflow, else its strategy (``None`` while
    unset)."""
    workflow = state.get("workflow")
    return workflow if workflow is not None else state.get("strategy")


def _wrapped_parts(wrapped: object) -> tuple[Strategy, Workflow | None]:
    """``(strategy, workflow)`` of what ``FLMarket`` was given: a Message-API strategy, or a legacy workflow (with a
    stand-in strategy that refuses the round hooks).

    Raises
    ------
    TypeError
        For a legacy strategy, a class instead of an instance, a legacy fit workflow on its own, or anything else,
        naming what to pass instead.
    """
    from flwr.server.strategy import Strategy as LegacyStrategy  # pylint: disable=import-outside-toplevel
    from flwr.server.workflow import SecAggPlusWorkflow, SecAggWorkflow  # pylint: disable=import-outside-toplevel

    name = getattr(wrapped, "__name__", type(wrapped).__name__)
    if isinstance(wrapped, Strategy):
        return wrapped, None
    if isinstance(wrapped, type):
        raise TypeError(f"strategy must be a strategy instance, got the class {name}: write {name}(...)")
    if isinstance(wrapped, LegacyStrategy):
        counterpart = f"flwr.serverapp.strategy.{name}" if hasattr(flwr.serverapp.strategy, name) else "a Message-API"
        raise TypeError(
            f"{name} is a legacy Flower strategy (flwr.server.strategy), driven by a legacy workflow: keep it in the "
            "LegacyContext and wrap the workflow instead, FLMarket(workflow, budget=..., num_classes=...)(grid, "
            f"context) in place of workflow(grid, context); or give FLMarket {counterpart} strategy "
            "(README: 'Adding the market to your own Flower app')"
        )
    if isinstance(wrapped, (SecAggPlusWorkflow, SecAggWorkflow)):
        raise TypeError(
            f"{name} is a fit workflow, which runs inside DefaultWorkflow: wrap the outermost workflow, "
            f"FLMarket(DefaultWorkflow(fit_workflow={name}(...)), budget=..., num_classes=...)(grid, context)"
        )
    if callable(wrapped):
        return _RunsAWorkflow(name), wrapped
    raise TypeError(
        f"strategy must be a flwr Strategy (flwr.serverapp.strategy) or a legacy workflow, got {type(wrapped).__name__}"
    )


class _RunsAWorkflow(Strategy):
    """The stand-in strategy of an ``FLMarket`` that wraps a legacy workflow: its hooks say how to run it instead."""

    def __init__(self, workflow: str) -> None:
        self.workflow = workflow

    def _refuse(self, *_: Any, **__: Any) -> Any:
        raise TypeError(
            f"this FLMarket wraps the legacy workflow {self.workflow}: run it as one, market(grid, context), "
            "in place of workflow(grid, context); the strategy hooks and start() are for a Message-API strategy"
        )

    configure_train = configure_evaluate = aggregate_train = aggregate_evaluate = start = _refuse

    def summary(self) -> None:
        """Log the workflow's name."""
        log(INFO, "\t├── then the legacy workflow %s on the winners", self.workflow)


def _check_workflow_settings(market: FLMarket) -> None:
    """Refuse the settings that a market around a legacy workflow cannot honour: re-launching (between rounds that
    the workflow drives) and pay on delivery (SecAgg+ sends several train messages a round, not one)."""
    if market.workflow is None:
        return
    if market.relaunch is not None:
        raise TypeError(
            "relaunch needs a Message-API strategy (FLMarket drives its rounds); a legacy workflow drives its own"
        )
    if market.settle_on_delivery:
        raise TypeError(
            "settle_on_delivery counts train rounds, which a legacy workflow does not show one message each (SecAgg+ "
            "sends one per stage): leave it False (the award is paid at selection; delivery_report still lists every "
            "train message)"
        )


def _inside_a_legacy_round(context: Context) -> bool:
    """Whether a legacy ``DefaultWorkflow`` is running a round in ``context`` (its round counter is set)."""
    from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, Key  # pylint: disable=import-outside-toplevel

    config = context.state.config_records.get(MAIN_CONFIGS_RECORD)
    return config is not None and Key.CURRENT_ROUND in config


def _warn_if_dp_sized_otherwise(strategy: object, cohort: int) -> None:
    """Warn, once before training, when a DP wrapper in the legacy strategy's chain sizes its noise for another
    number of clients than will train each round: what the innermost strategy samples from the cohort
    (``num_fit_clients``, its minimums capped), else the whole cohort."""
    chain = _strategy_chain(strategy)
    samplers = [each for each in chain if callable(getattr(each, "num_fit_clients", None))]
    per_round = int(samplers[-1].num_fit_clients(cohort)[0]) if samplers else cohort  # type: ignore[attr-defined]
    for each in chain:
        sampled = getattr(each, "__dict__", {}).get("num_sampled_clients")
        if isinstance(sampled, int) and sampled != per_round:
            log(
                WARNING,
                "FLMarket: %s adds noise for num_sampled_clients=%d, but %d of the cohort's %d node(s) train each "
                "round: build it for the cohort, after market.winners_grid(grid) (docs/drop-in.md)",
                type(each).__name__,
                sampled,
                per_round,
                cohort,
            )


def warn_if_no_update(server_round: int, messages: Iterable[Message], replies: Iterable[Message]) -> None:
    """Log a warning naming every node and why, when not one train message of ``messages`` got an update back (a
    reply with content): the round aggregates nothing and the model stays as it was."""
    sent = {
        m.metadata.message_id: m.metadata.dst_node_id for m in messages if m.metadata.message_type == MessageType.TRAIN
    }
    answered = {reply.metadata.reply_to_message_id: reply for reply in replies}
    if not sent or any(mid in answered and not answered[mid].has_error() for mid in sent):
        return
    lost = {
        node: "no reply within the round's timeout"
        if mid not in answered
        else f"error reply ({answered[mid].error.reason})"
        for mid, node in sent.items()
    }
    log(
        WARNING,
        "FLMarket: train round %d aggregated no update, the model is unchanged; every node was lost: %s",
        server_round,
        "; ".join(f"node {node}: {why}" for node, why in sorted(lost.items())),
    )


def log_market_outcome(outcome: MarketOutcome) -> None:
    """Log the auction's outcome as a tree: winners with score, bid and payment, and the total."""
    log(INFO, "")
    log(INFO, "FLMarket market phase finished in %.2fs", float(outcome.timings.get("total", 0.0)))
    log(
        INFO,
        "\t├── %d bidders, %d winners, %d excluded",
        len(outcome.participants),
        len(outcome.winners),
        len(outcome.excluded),
    )
    for node_id, payment in outcome.included.items():
        log(INFO, "\t│\t├── node %s: included, fixed payment %.2f", node_id, float(payment))
    for node_id in outcome.winners:
        log(
            INFO,
            "\t│\t├── node %s: score %.3f, bid %.2f, payment %.2f",
            node_id,
            float(outcome.scores.get(node_id, float("nan"))),
            float(outcome.bids.get(node_id, float("nan"))),
            float(outcome.payments.get(node_id, float("nan"))),
        )
    log(
        INFO,
        "\t└── total payment %.2f of budget %.2f (%.0f%%, budget rule %s)",
        float(outcome.total_payment),
        float(outcome.budget),
        100.0 * outcome.paid_share,
        outcome.budget_rule,
    )
