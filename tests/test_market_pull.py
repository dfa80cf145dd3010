"""The market's pull loop against a transport where one reply never finishes arriving.

A SuperNode cut off while uploading its reply leaves the SuperLink with the reply registered and
its objects missing: ``grid.pull_messages`` then blocks (Flower retries the objects until the
upload session expires, minutes later). The SuperLink hands a reply out only once: a pull that
returned it consumed it, and asking again for that id gives an error reply. The fake grid below
behaves that way; the end-to-end case is ``tests/test_deployment.py`` (a SuperNode killed mid-upload).
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode

from flmarket_flwr.market.buyer import transport


class CutOffGrid:
    """Replies become available at given times; a pull that returns the cut-off reply blocks."""

    def __init__(self, available_after: dict[str, float], cut_off: str) -> None:
        self.available_after = available_after
        self.cut_off = cut_off
        self.consumed: set[str] = set()
        self.release = threading.Event()
        self._lock = threading.Lock()
        self._start = time.monotonic()

    def push_messages(self, messages: list[str]) -> list[str]:
        self._start = time.monotonic()
        return list(messages)

    def pull_messages(self, ids: list[str]) -> list[SimpleNamespace]:
        now = time.monotonic() - self._start
        with self._lock:
            again = [i for i in ids if i in self.consumed]
            ready = [i for i in ids if i not in self.consumed and now >= self.available_after[i]]
            self.consumed.update(ready)
        if self.cut_off in ready:
            self.release.wait()  # retrying the missing objects, for minutes
        return [_reply(i, error=False) for i in ready] + [_reply(i, error=True) for i in again]


def _reply(message_id: str, error: bool) -> SimpleNamespace:
    """The node's reply, or the SuperLink's "message unavailable" error for an id already handed out."""
    metadata = SimpleNamespace(reply_to_message_id=message_id, src_node_id=SUPERLINK_NODE_ID if error else 7)
    code = SimpleNamespace(code=ErrorCode.MESSAGE_UNAVAILABLE) if error else None
    return SimpleNamespace(metadata=metadata, error=code, has_error=lambda: error)


@pytest.fixture(autouse=True)
def quick_stuck_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport, "STUCK_PULL_S", 0.5)


def test_a_cut_off_reply_does_not_swallow_the_replies_after_it() -> None:
    ids = [f"m{i}" for i in range(6)]
    grid = CutOffGrid({"m0": 0.0, **{i: 0.3 for i in ids[1:]}}, cut_off="m0")
    try:
        started = time.monotonic()
        replies = transport.send_and_receive_within(grid, ids, timeout=2.0)
        elapsed = time.monotonic() - started
    finally:
        grid.release.set()
    good = {r.metadata.reply_to_message_id for r in replies if not r.has_error()}
    assert good == set(ids[1:]), replies
    # The cut-off reply was consumed by the stuck pull; asking for it alone gives the transport's error, and its id
    # waits for the stuck pull (it might still bring the reply) until the step's deadline, not longer.
    assert {r.metadata.reply_to_message_id for r in replies if r.has_error()} == {"m0"}
    assert 2.0 <= elapsed < 3.5, elapsed


def test_replies_pulled_together_with_the_cut_off_one_are_reported_lost() -> None:
    grid = CutOffGrid({"m0": 0.0, "m1": 0.0}, cut_off="m0")
    try:
        replies = transport.send_and_receive_within(grid, ["m0", "m1"], timeout=5.0)
    finally:
        grid.release.set()
    # m1 came in the same pull as m0 and is gone with it: both get the transport's error reply, at once.
    assert sorted((r.metadata.reply_to_message_id, r.has_error()) for r in replies) == [("m0", True), ("m1", True)]


def test_a_pull_stuck_until_the_deadline_is_abandoned() -> None:
    grid = CutOffGrid({"m0": 0.0}, cut_off="m0")
    try:
        started = time.monotonic()
        replies = transport.send_and_receive_within(grid, ["m0"], timeout=1.5)
        elapsed = time.monotonic() - started
    finally:
        grid.release.set()
    assert replies == []
    assert 1.5 <= elapsed < 2.5, elapsed


def test_healthy_replies_come_in_one_pull_each_round() -> None:
    ids = [f"m{i}" for i in range(20)]
    grid = CutOffGrid({i: 0.2 for i in ids}, cut_off="none")
    calls: list[list[str]] = []
    pull = grid.pull_messages

    def counting_pull(message_ids: list[str]) -> list[SimpleNamespace]:
        calls.append(list(message_ids))
        return pull(message_ids)

    grid.pull_messages = counting_pull  # type: ignore[method-assign]
    replies = transport.send_and_receive_within(grid, ids, timeout=5.0)
    assert {r.metadata.reply_to_message_id for r in replies} == set(ids)
    assert all(len(call) == len(ids) for call in calls), "no one-by-one pulls without a stuck pull"


class CountingGrid:
    """Every reply is ready at once; records the ids of each pull."""

    def __init__(self) -> None:
        self.pulls: list[list[str]] = []

    def push_messages(self, messages: list[str]) -> list[str]:
        return list(messages)

    def pull_messages(self, ids: list[str]) -> list[SimpleNamespace]:
        self.pulls.append(list(ids))
        return [_reply(i, error=False) for i in ids]


def test_many_replies_are_pulled_in_batches_one_after_the_other() -> None:
    ids = [f"m{i:04d}" for i in range(2 * transport.PULL_BATCH + 7)]
    grid = CountingGrid()
    replies = transport.send_and_receive_within(grid, ids, timeout=30.0)  # type: ignore[arg-type]
    assert sorted(reply.metadata.reply_to_message_id for reply in replies) == ids
    assert [len(pull) for pull in grid.pulls] == [transport.PULL_BATCH, transport.PULL_BATCH, 7]


class SlowGrid:
    """A starved transport: the first pull takes ``slow_s`` and then returns every reply it took, as a slow
    SuperLink does; the SuperLink hands each reply out once, so re-pulling an id it took gives an error."""

    def __init__(self, ids: list[str], slow_s: float, duplicate: bool = False) -> None:
        self.ids = ids
        self.slow_s = slow_s
        self.duplicate = duplicate
        self.consumed: set[str] = set()
        self.pulls = 0
        self._lock = threading.Lock()

    def push_messages(self, messages: list[str]) -> list[str]:
        return list(messages)

    def pull_messages(self, ids: list[str]) -> list[SimpleNamespace]:
        with self._lock:
            self.pulls += 1
            first = self.pulls == 1
            again = [i for i in ids if i in self.consumed]
            ready = [i for i in ids if i not in self.consumed]
            self.consumed.update(ready)
        if first:
            time.sleep(self.slow_s)
        replies = [_reply(i, error=False) for i in reversed(ready)] + [_reply(i, error=True) for i in again]
        if self.duplicate:
            replies += [_reply(i, error=False) for i in ready[:2]] + [_reply(i, error=True) for i in ready[:2]]
        return replies


@pytest.mark.parametrize("duplicate", [False, True])
def test_replies_of_a_slow_pull_are_kept_over_the_errors_of_the_re_pulls(duplicate: bool) -> None:
    """The deployment failure at N = 30: a slow batch pull counted as stuck, the one-by-one re-pulls got
    "message unavailable" for the ids it had taken, and those errors displaced the real replies."""
    ids = [f"m{i}" for i in range(12)]
    grid = SlowGrid(ids, slow_s=1.2, duplicate=duplicate)
    replies = transport.send_and_receive_within(grid, ids, timeout=5.0)  # type: ignore[arg-type]
    by_id = {r.metadata.reply_to_message_id: r for r in replies}
    assert len(replies) == len(ids) and set(by_id) == set(ids)
    assert not any(r.has_error() for r in replies), "every node replied: none may be reported missing"
    assert grid.pulls > 1, "the slow pull was meant to be taken for a stuck one"


def test_an_unavailable_error_never_displaces_a_reply_and_a_node_error_is_kept() -> None:
    best: dict[str, SimpleNamespace] = {}
    real, unavailable = _reply("m0", error=False), _reply("m0", error=True)
    assert transport._keep_best(best, unavailable, {})  # type: ignore[arg-type]
    assert transport._keep_best(best, real, {})  # type: ignore[arg-type]
    assert not transport._keep_best(best, _reply("m0", error=True), {})  # type: ignore[arg-type]
    assert best["m0"] is real
    node_error = SimpleNamespace(
        metadata=SimpleNamespace(reply_to_message_id="m1", src_node_id=7),
        error=SimpleNamespace(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION),
        has_error=lambda: True,
    )
    assert transport._keep_best(best, node_error, {})  # type: ignore[arg-type]
    assert not transport._keep_best(best, _reply("m1", error=True), {})  # type: ignore[arg-type]
    assert best["m1"] is node_error


def test_a_reply_from_another_node_never_displaces_the_addressed_nodes_reply() -> None:
    stray = SimpleNamespace(
        metadata=SimpleNamespace(reply_to_message_id="m0", src_node_id=99), error=None, has_error=lambda: False
    )
    genuine = SimpleNamespace(
        metadata=SimpleNamespace(reply_to_message_id="m0", src_node_id=7), error=None, has_error=lambda: False
    )
    best: dict[str, SimpleNamespace] = {}
    assert transport._keep_best(best, stray, {"m0": 7})  # type: ignore[arg-type]
    assert transport._keep_best(best, genuine, {"m0": 7})  # type: ignore[arg-type]
    assert not transport._keep_best(best, stray, {"m0": 7})  # type: ignore[arg-type]
    assert best["m0"] is genuine


class GivenUpGrid:
    """A transport that has given up: every pull raises, as Flower's does once the SuperLink ended the run."""

    def __init__(self) -> None:
        self.pulls = 0

    def push_messages(self, messages: list[str]) -> list[str]:
        return list(messages)

    def pull_messages(self, ids: list[str]) -> list[SimpleNamespace]:
        self.pulls += 1
        raise RuntimeError("Runtime task-token authentication failed")


def test_a_pull_that_raises_ends_the_exchange_with_its_error_at_once() -> None:
    """The error is not swallowed in the pull's thread: the market does not poll a dead run until its deadline."""
    grid = GivenUpGrid()
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="token authentication failed"):
        transport.send_and_receive_within(grid, ["m0", "m1"], timeout=30.0)
    assert time.monotonic() - started < 2.0
    assert grid.pulls == 1


def test_a_start_grace_waits_for_the_first_reply_then_gives_the_others_the_steps_timeout() -> None:
    """ClientApps still starting (a first run's dependency installation): the first reply comes after the step's
    timeout but within the grace; the others then have the step's timeout from it, and one later than that is lost."""
    grid = CutOffGrid({"m0": 0.8, "m1": 0.9, "m2": 2.5}, cut_off="none")
    started = time.monotonic()
    replies = transport.send_and_receive_within(grid, ["m0", "m1", "m2"], timeout=0.4, start_grace=3.0)
    elapsed = time.monotonic() - started
    assert {r.metadata.reply_to_message_id for r in replies} == {"m0", "m1"}
    assert 1.1 <= elapsed < 2.0, elapsed  # the first reply at 0.8 s, then 0.4 s for the others: m2 is late
    # Without a grace the same step ends at its timeout with nothing; with one, silence ends at timeout + grace.
    assert transport.send_and_receive_within(CutOffGrid({"m0": 0.8}, "none"), ["m0"], timeout=0.4) == []
    started = time.monotonic()
    assert transport.send_and_receive_within(CutOffGrid({"m0": 9.0}, "none"), ["m0"], 0.3, start_grace=0.5) == []
    assert 0.8 <= time.monotonic() - started < 1.5
