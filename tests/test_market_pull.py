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

from flmarket_flwr.market import transport


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
    return SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=message_id), error=error)


@pytest.fixture(autouse=True)
def quick_stuck_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport, "STUCK_PULL_S", 0.5)


def test_a_cut_off_reply_does_not_swallow_the_replies_after_it() -> None:
    ids = [f"m{i}" for i in range(6)]
    grid = CutOffGrid({"m0": 0.0, **{i: 0.3 for i in ids[1:]}}, cut_off="m0")
    try:
        started = time.monotonic()
        replies = transport.send_and_receive_within(grid, ids, timeout=5.0)
        elapsed = time.monotonic() - started
    finally:
        grid.release.set()
    good = {r.metadata.reply_to_message_id for r in replies if not r.error}
    assert good == set(ids[1:]), replies
    # The cut-off reply was consumed by the stuck pull; asking for it alone gives the transport's error.
    assert {r.metadata.reply_to_message_id for r in replies if r.error} == {"m0"}
    assert elapsed < 2.0, elapsed


def test_replies_pulled_together_with_the_cut_off_one_are_reported_lost() -> None:
    grid = CutOffGrid({"m0": 0.0, "m1": 0.0}, cut_off="m0")
    try:
        replies = transport.send_and_receive_within(grid, ["m0", "m1"], timeout=5.0)
    finally:
        grid.release.set()
    # m1 came in the same pull as m0 and is gone with it: both get the transport's error reply, at once.
    assert sorted((r.metadata.reply_to_message_id, r.error) for r in replies) == [("m0", True), ("m1", True)]


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
