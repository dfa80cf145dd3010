"""Clients that leave at every step of the market: a correct outcome for the others, or a clear error.

Extends ``test_market_faults.py`` (which drops single replies on an instant grid) in two ways:

* a client here *leaves*: from its step on it answers nothing at all, as a crashed SuperNode;
* the grid delivers replies only when pulled, and the market waits for them the way it does on a
  real SuperLink (push, then pull until every reply is in or the step's timeout passes), so a
  missing reply really costs a wait; each test checks that every wait was bounded.

Steps: before connecting, at each of the four PASS rounds (one session: the departed are recovered
from their neighbours' shares, never by a second sum), at the bid, at the audit, at the award, and
during the training that follows.
"""

from __future__ import annotations

import itertools
import logging
import math
import re
import threading
import time
from collections.abc import Iterable

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg

from flmarket_flwr.market import (
    CostBasedBid,
    MarketConfig,
    MarketError,
    MarketPhase,
    NoWinnerConnectedError,
    WinnersGrid,
)
from flmarket_flwr.market.wire.messages import (
    ACTION_AUDIT,
    ACTION_BID,
    ACTION_BIND,
    ACTION_DRAW,
    ACTION_ENDORSE,
    ACTION_SURVIVORS,
    ACTION_TAGS,
    ACTION_UNMASK,
    ACTIONS,
)
from flmarket_flwr.pricing import run_auction, score
from simulations.inprocess_grid import InProcessGrid, market_client_app

NUM_CLASSES = 5
COST = 0.05
MARKUP = 0.2
TIMEOUT = 0.25  # seconds per message round: small, so that waiting for the departed stays cheap
SLACK = 1.0  # scheduling slack allowed on top of each bound (a loaded 2-core CI machine)
ROUND_SLACK = 2.0  # a market round, push to next push, also holds the in-process clients' own PASS work
STEPS = tuple(
    a for a in ACTIONS if a not in (ACTION_DRAW, ACTION_SURVIVORS, ACTION_TAGS, ACTION_BIND)
)  # advertise ... award (no tags step)


class PollingGrid(InProcessGrid):
    """A grid that records every wait: the market's rounds (push to next push) and ``send_and_receive``.

    ``send_and_receive`` (used by Flower's strategies) pushes, then pulls every ``pull_interval``
    seconds until each message has a reply or ``timeout`` has passed; a ``None`` timeout, which
    Flower treats as "wait forever", fails the test at once.
    """

    pull_interval = 0.005

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.waits: list[tuple[float, float]] = []  # (seconds waited, timeout given)
        self.pushes: list[float] = []

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        self.pushes.append(time.monotonic())
        return super().push_messages(messages)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        assert timeout is not None and math.isfinite(timeout) and timeout > 0, f"unbounded wait: {timeout!r}"
        started = time.monotonic()
        pending = set(self.push_messages(list(messages)))
        replies: list[Message] = []
        while pending and time.monotonic() < started + timeout:
            batch = self.pull_messages(pending)
            replies.extend(batch)
            pending.difference_update(reply.metadata.reply_to_message_id for reply in batch)
            if pending:
                time.sleep(self.pull_interval)
        self.waits.append((time.monotonic() - started, timeout))
        return replies


class Leave:
    """Reply hook: each node in ``plan`` answers nothing from its step on, and disconnects.

    ``plan`` maps node -> index in :data:`STEPS` of the first message it leaves unanswered
    (``len(STEPS)``: it stays for the whole market and leaves at its first ``train`` message).
    """

    def __init__(self, plan: dict[int, int]) -> None:
        self.plan = plan
        self.grid: InProcessGrid | None = None
        self.dropped: list[tuple[int, str]] = []

    def __call__(self, instruction: Message, reply: Message) -> Message | None:
        node = instruction.metadata.dst_node_id
        action = instruction.metadata.message_type.partition(".")[2] or instruction.metadata.message_type
        step = STEPS.index(action) if action in STEPS else len(STEPS)
        if node in self.plan and step >= self.plan[node]:
            self.dropped.append((node, action))
            if self.grid is not None and node in self.grid.connected:
                self.grid.connected.remove(node)  # the SuperLink notices the node is gone
            return None
        return reply


def make_counts(num_nodes: int, seed: int) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {7000 + 31 * i: rng.integers(1, 50, size=NUM_CLASSES) for i in range(num_nodes)}


def make_grid(counts: dict[int, np.ndarray], hook: Leave) -> PollingGrid:
    grid = PollingGrid(market_client_app(counts, CostBasedBid(COST, markup=MARKUP)), list(counts), reply_hook=hook)
    hook.grid = grid
    return grid


def market_config(**overrides: object) -> MarketConfig:
    values: dict[str, object] = {
        "budget": 80.0,
        "num_classes": NUM_CLASSES,
        "timeout": TIMEOUT,
        "timeout_per_node": 0.0,
        "wait_for_nodes_timeout": 0.2,
        "poll_interval": 0.01,
    }
    values.update(overrides)
    return MarketConfig(**values)  # type: ignore[arg-type]


def run_bounded(phase: MarketPhase, grid: PollingGrid, bound: float):
    """Run the phase in a thread; fail if it is still running after ``bound`` seconds, or a round waited too long."""
    result: dict[str, object] = {}

    def target() -> None:
        try:
            result["outcome"] = phase.run(grid)
        except BaseException as err:  # noqa: BLE001 - handed to the test thread
            result["error"] = err

    started = time.monotonic()
    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(bound)
    ended = time.monotonic()
    assert not worker.is_alive(), f"the market phase still runs after {bound:.1f} s: a wait is unbounded"
    marks = [*grid.pushes, ended]
    for begin, end in itertools.pairwise(marks):  # each market round: from its push to the next push
        assert end - begin <= phase.config.timeout + ROUND_SLACK, f"a message round took {end - begin:.2f} s"
    for waited, timeout in grid.waits:
        assert waited <= timeout + SLACK, f"a message round waited {waited:.2f} s for a {timeout} s timeout"
    result["elapsed"] = ended - started
    return result


def expected_auction(
    counts: dict[int, np.ndarray],
    pass_nodes: list[int],
    bidders: list[int],
    budget: float,
    failing: frozenset[int] = frozenset(),
):
    """Winners and payments of the audited auction on the bidders' true scores and bids.

    Winners in ``failing`` do not endorse the award or fail their audit: they are left out unpaid and the award
    stands (it is never re-issued), so the other winners keep its payments and no bidder is promoted.
    """
    total = np.sum([counts[n] for n in pass_nodes], axis=0)
    scores = [score(counts[n], total, len(pass_nodes)) for n in bidders]
    bids = [COST * float(counts[n].sum()) * (1 + MARKUP) for n in bidders]
    result = run_auction(scores, bids, budget)
    awarded = [bidders[i] for i in result.winners]
    caught = {n for n in awarded if n in failing}
    winners = [n for n in awarded if n not in caught]
    payments = {n: min(float(result.payments[i]), budget) for i, n in enumerate(bidders) if n not in caught}
    return total, winners, payments, [n for n in bidders if n not in caught]


# --- One or two clients leave; the others get a correct market --------------------------------
@pytest.mark.parametrize("stage", range(len(STEPS)), ids=[f"at-{step}" for step in STEPS])
def test_clients_leaving_at_each_step_leave_a_correct_market_for_the_others(stage: int, caplog) -> None:
    counts = make_counts(7, seed=stage)
    nodes = sorted(counts)
    leavers = [nodes[1], nodes[5]]
    others = [n for n in nodes if n not in leavers]
    hook = Leave({node: stage for node in leavers})
    grid = make_grid(counts, hook)
    cfg = market_config()

    with caplog.at_level(logging.WARNING, logger="flwr"):
        result = run_bounded(MarketPhase(cfg), grid, bound=30.0)
    assert "error" not in result, result.get("error")
    outcome = result["outcome"]

    advertise = [m for m in grid.sent if m.metadata.message_type.endswith(STEPS[0])]
    assert len(advertise) == len(nodes), "one PASS session, never re-run"
    assert result["elapsed"] <= len(grid.pushes) * (TIMEOUT + ROUND_SLACK)

    step = STEPS[stage]
    failing: frozenset[int] = frozenset()
    if stage <= STEPS.index(ACTION_UNMASK) - 1:  # gone before their masked input: N_s and E are the others'
        pass_nodes, bidders = others, others
    elif step in (ACTION_UNMASK, ACTION_BID):  # their counts are in N_s (E = all seven), but they never bid
        pass_nodes, bidders = nodes, others
    else:  # they bid; a leaver that wins does not endorse (or fails its audit): left out unpaid, the award stands;
        # a losing leaver stays a (losing) bidder; a leaver left at the award is just not acknowledged
        pass_nodes, bidders = nodes, nodes
        failing = frozenset(leavers) if step in (ACTION_ENDORSE, ACTION_AUDIT) else frozenset()
    total, winners, payments, bidders = expected_auction(counts, pass_nodes, bidders, cfg.budget, failing)
    if step == STEPS[-1]:
        assert outcome.excluded == {}
        assert outcome.award_acknowledged == others
        for node in leavers:
            assert f"node {node} did not acknowledge its award" in caplog.text
    elif step == ACTION_AUDIT:
        caught = [n for n in leavers if n not in bidders]
        assert caught, "the instance must make a leaver win the first auction"
        assert set(outcome.excluded) == set(caught)
        for node in caught:
            assert outcome.excluded[node].startswith(ACTION_AUDIT) and f"excluding node {node}" in caplog.text
    else:
        assert set(outcome.excluded) == set(leavers)
        for node in leavers:
            assert outcome.excluded[node] == f"{step}: no reply within {TIMEOUT:g} s"
            assert f"excluding node {node}" in caplog.text
    assert outcome.pass_participants == pass_nodes
    assert outcome.global_counts == [int(c) for c in total]
    assert outcome.participants == bidders
    assert outcome.winners == winners
    assert outcome.payments == pytest.approx(payments, rel=1e-12)
    assert outcome.total_payment <= cfg.budget * (1 + 1e-12)


def test_a_new_departure_at_every_pass_round_is_recovered_in_one_session() -> None:
    """One client leaves at each of the four PASS rounds: one session, the exact sum of the maskers."""
    counts = make_counts(9, seed=31)
    nodes = sorted(counts)
    plan = {nodes[0]: 0, nodes[3]: 1, nodes[5]: 2, nodes[8]: 3}
    grid = make_grid(counts, Leave(plan))

    result = run_bounded(MarketPhase(market_config()), grid, bound=30.0)

    outcome = result["outcome"]
    maskers = [n for n in nodes if plan.get(n, 9) >= 3]
    assert outcome.pass_participants == maskers
    assert outcome.global_counts == [int(c) for c in np.sum([counts[n] for n in maskers], axis=0)]
    assert set(outcome.excluded) == set(plan)
    assert outcome.participants == [n for n in nodes if n not in plan]
    assert len([m for m in grid.sent if m.metadata.message_type.endswith(STEPS[0])]) == len(nodes)


def test_a_client_that_never_connects_is_waited_for_within_the_bound(caplog) -> None:
    counts = make_counts(6, seed=11)
    nodes = sorted(counts)
    grid = make_grid(counts, Leave({}))
    grid.connected = nodes[1:]

    with caplog.at_level(logging.WARNING, logger="flwr"):
        result = run_bounded(MarketPhase(market_config(expected_nodes=6, wait_for_nodes_timeout=0.3)), grid, 20.0)

    outcome = result["outcome"]
    assert outcome.pass_participants == nodes[1:]
    _, winners, _, _ = expected_auction(counts, nodes[1:], nodes[1:], 80.0)
    assert outcome.winners == winners
    assert "5 of 6 expected nodes" in caplog.text


# --- Too many leave: a clear error, in bounded time -------------------------------------------
TOO_FEW = {
    "at-advertise": (0, 5, r"PASS stopped: only 2 clients advertised valid keys"),
    "at-share": (1, 5, r"PASS stopped: only 2 clients shared their keys"),
    "at-mask": (2, 4, r"PASS stopped: client \d+ keeps only 2 surviving neighbours, the threshold is 4"),
    "at-unmask": (3, 4, r"PASS stopped: only 3 shares of the self-mask seed .* threshold is 4"),
    "at-bid": (4, 4, r"thin market: only 3 of the 7 invited nodes are left as bidders"),
}


@pytest.mark.parametrize("stage, leaving, match", TOO_FEW.values(), ids=TOO_FEW.keys())
def test_too_few_clients_left_is_a_clear_error_in_bounded_time(stage: int, leaving: int, match: str) -> None:
    counts = make_counts(7, seed=20 + stage)
    nodes = sorted(counts)
    grid = make_grid(counts, Leave({node: stage for node in nodes[:leaving]}))

    result = run_bounded(MarketPhase(market_config(pass_reruns=0)), grid, bound=30.0)  # one session

    error = result.get("error")
    assert isinstance(error, MarketError), f"expected a MarketError, got {error!r}"
    assert re.search(match, str(error)), str(error)
    assert result["elapsed"] <= len(grid.pushes) * (TIMEOUT + ROUND_SLACK)
    awarded = {m.metadata.dst_node_id for m in grid.sent if m.metadata.message_type.endswith(STEPS[-1])}
    assert awarded == set(nodes), "every contacted node is told the market closed"


def test_clients_leaving_at_mask_past_a_threshold_leave_a_fresh_session_for_the_rest_in_bounded_time() -> None:
    """The "at-mask" case with the default re-runs: four of seven leave, the session stops before any unmask
    request, and a fresh session over the three left releases their exact sum, each round within its timeout.
    (Three bidders of seven invited is a thin market at the default participation floor of one half: the floor is
    lowered here, where the re-run is what is tested; the thin market's own test is in test_market_participation.)"""
    counts = make_counts(7, seed=22)
    nodes = sorted(counts)
    grid = make_grid(counts, Leave({node: 2 for node in nodes[:4]}))
    result = run_bounded(MarketPhase(market_config(min_participation=0.4)), grid, bound=30.0)
    outcome = result.get("outcome")
    assert outcome is not None, result.get("error")
    assert [session.roster for session in outcome.pass_sessions] == [nodes, nodes[4:]]
    assert outcome.global_counts == [int(c) for c in np.sum([counts[n] for n in nodes[4:]], axis=0)]
    assert result["elapsed"] <= len(grid.pushes) * (TIMEOUT + ROUND_SLACK)


def test_too_few_connected_is_a_clear_error_in_bounded_time() -> None:
    counts = make_counts(5, seed=30)
    grid = make_grid(counts, Leave({}))
    grid.connected = sorted(counts)[:2]

    result = run_bounded(MarketPhase(market_config(expected_nodes=5, wait_for_nodes_timeout=0.3)), grid, 10.0)

    assert isinstance(result.get("error"), MarketError)
    assert "only 2 node(s) connected" in str(result["error"])
    assert grid.sent == []


# --- After the award: the training that follows ------------------------------------------------
def training_app(counts: dict[int, np.ndarray]):
    """Market handlers plus a numpy 'model': train adds the node's sample count to the weights."""
    app = market_client_app(counts, CostBasedBid(COST, markup=MARKUP))

    @app.train()
    def train(message: Message, context: Context) -> Message:
        weights = message.content["arrays"]["w"].numpy()
        examples = int(counts[context.node_id].sum())
        content = RecordDict(
            {
                "arrays": ArrayRecord({"w": Array(weights + examples)}),
                "metrics": MetricRecord({"num-examples": examples}),
            }
        )
        return Message(content, reply_to=message)

    return app


def run_market_then_fedavg(hook: Leave):
    counts = make_counts(7, seed=40)
    grid = PollingGrid(training_app(counts), list(counts), reply_hook=hook)
    hook.grid = grid
    outcome = MarketPhase(market_config(budget=60.0)).run(grid)
    assert len(outcome.winners) >= 2
    return counts, grid, outcome


def test_a_winner_leaving_after_its_award_does_not_stop_training() -> None:
    hook = Leave({})
    counts, grid, outcome = run_market_then_fedavg(hook)
    leaver = outcome.winners[0]
    hook.plan[leaver] = len(STEPS)  # answers its award, then never trains
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=1, min_available_nodes=1)

    started = time.monotonic()
    result = strategy.start(
        grid=WinnersGrid(grid, outcome.winners, seed=0, absent_timeout=2.0),
        initial_arrays=ArrayRecord({"w": Array(np.zeros(3))}),
        num_rounds=2,
        timeout=TIMEOUT,
    )

    assert (leaver, "train") in hook.dropped
    stayers = [n for n in outcome.winners if n != leaver]
    weights = result.arrays["w"].numpy()
    # Round 1 may still wait for the leaver (bounded by the round timeout); both rounds average the stayers.
    examples = np.array([counts[n].sum() for n in stayers], dtype=float)
    per_round = float(np.sum(examples * examples) / np.sum(examples))
    assert weights == pytest.approx(np.full(3, 2 * per_round))
    assert time.monotonic() - started <= 2 * (TIMEOUT + SLACK) + 2.0
    trained = {m.metadata.dst_node_id for m in grid.sent if m.metadata.message_type == "train"}
    assert trained <= set(outcome.winners)


def test_every_winner_leaving_after_the_award_stops_training_with_a_clear_error() -> None:
    """Flower's strategies wait forever for nodes; the winners' view turns that into a bounded wait."""
    hook = Leave({})
    _, grid, outcome = run_market_then_fedavg(hook)
    grid.connected = [n for n in grid.connected if n not in outcome.winners]
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=1, min_available_nodes=1)
    errors: list[BaseException] = []

    def train() -> None:
        try:
            strategy.start(
                grid=WinnersGrid(grid, outcome.winners, absent_timeout=0.5),
                initial_arrays=ArrayRecord({"w": Array(np.zeros(3))}),
                num_rounds=1,
                timeout=TIMEOUT,
            )
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    worker = threading.Thread(target=train, daemon=True)
    started = time.monotonic()
    worker.start()
    worker.join(15.0)
    assert not worker.is_alive(), "training still waits for winners that left"
    assert len(errors) == 1 and isinstance(errors[0], NoWinnerConnectedError), errors
    assert "none of the" in str(errors[0]) and "winner" in str(errors[0])
    assert time.monotonic() - started < 10.0
    assert not [m for m in grid.sent if m.metadata.message_type == "train"]


def test_winners_view_rejects_a_negative_absent_timeout() -> None:
    counts = make_counts(3, seed=41)
    grid = InProcessGrid(market_client_app(counts), list(counts))
    with pytest.raises(ValueError, match="absent_timeout"):
        WinnersGrid(grid, list(counts), absent_timeout=-1.0)
