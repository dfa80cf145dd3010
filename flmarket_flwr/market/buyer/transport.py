"""How the market phase talks to the nodes: one request per node, replies matched and bounded in time.

:func:`exchange` pushes the requests of one step, pulls the replies until all have arrived or the
step's timeout has passed, and matches them to their nodes. A pull that blocks inside the
transport cannot hold the market past its deadline.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from logging import WARNING

from flwr.app import ConfigRecord, Message
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.serverapp import Grid
from flwr.supercore import log

from flmarket_flwr.market.wire.messages import make_content, message_type

__all__ = ["exchange", "send_and_receive_within"]

FIRST_PULL_DELAY_S = 0.001
"""Seconds between a step's push and its second pull; the wait doubles while no reply arrives."""
MAX_PULL_DELAY_S = 0.1
"""Longest wait between two pulls of replies."""
STUCK_PULL_S = 5.0
"""Seconds after which a pull of replies that has not returned counts as stuck in the transport."""
LAST_PULL_S = 1.0
"""Seconds the last pull of a step may take, even when the step's deadline has passed."""
_TRANSPORT_NODE_IDS = frozenset({SUPERLINK_NODE_ID})
"""Sender ids of the error replies that the SuperLink makes itself (a node's own error comes from its id)."""
PULL_BATCH = 256
"""Most message ids in one pull (but the last): reading back the replies of a whole large federation in one
pull can take longer than ``STUCK_PULL_S`` (10,000 replies through the wire format in process), which is
not a stuck transport."""


def exchange(
    grid: Grid, action: str, requests: Mapping[int, ConfigRecord], timeout: float, start_grace: float = 0.0
) -> dict[int, Message]:
    """Send one request per node and return ``{node: reply}`` received within ``timeout`` seconds.

    Replies are matched by ``reply_to_message_id``. An error reply that the transport made for a
    node (Flower's own, e.g. an upload that never completed) is kept as that node's reply, so its
    real reason is logged; other replies from an unexpected sender, and second replies, are ignored.

    Parameters
    ----------
    grid : Grid
        The ``Grid`` of the ``ServerApp``.
    action : str
        The ``query`` action of the step (the message type is ``query.<action>``).
    requests : Mapping[int, ConfigRecord]
        Node id -> the request's content.
    timeout : float
        Seconds the step may take from the end of the push.
    start_grace : float (default: 0.0)
        Seconds more the step may wait for its first reply (see :func:`send_and_receive_within`).

    Returns
    -------
    dict[int, Message]
        Node id -> its reply, for the replies that arrived in time.
    """
    messages = [
        Message(make_content(record), dst_node_id=node, message_type=message_type(action), group_id=action)
        for node, record in requests.items()
    ]
    replies = send_and_receive_within(grid, messages, timeout, start_grace)
    node_of = {msg.metadata.message_id: msg.metadata.dst_node_id for msg in messages}
    matched: dict[int, Message] = {}
    for reply in replies:
        node = node_of.get(reply.metadata.reply_to_message_id)
        if node is None:
            log(WARNING, "Market: %s: ignoring a reply to an unknown message", action)
            continue
        if reply.metadata.src_node_id != node and not reply.has_error():
            log(
                WARNING,
                "Market: %s: ignoring a reply to node %d sent by node %d",
                action,
                node,
                reply.metadata.src_node_id,
            )
            continue
        if node in matched:
            log(WARNING, "Market: %s: ignoring a second reply for node %d", action, node)
            continue
        matched[node] = reply
    return matched


def send_and_receive_within(
    grid: Grid, messages: list[Message], timeout: float, start_grace: float = 0.0
) -> list[Message]:
    """Push ``messages`` and pull their replies until all arrived or ``timeout`` seconds passed.

    The deadline counts from the end of the push (a grid that computes the replies inside the push, as an
    in-process test grid does, is not charged for that work). With ``start_grace``, a step that has no reply yet
    when its deadline passes waits up to ``start_grace`` seconds more for its first one (nodes whose ClientApps are
    still starting: installing the app's dependencies on a first run), and once it arrives the others have
    ``timeout`` seconds from then; the step is bounded by ``timeout + start_grace`` all the same.
    The first pull follows the push at once; while replies are missing the wait between pulls
    doubles from ``FIRST_PULL_DELAY_S`` to ``MAX_PULL_DELAY_S`` and starts again after every pull that
    brought a reply, so a fast step costs milliseconds and a slow one a pull every 0.1 s. While a pull is
    under way (and not stuck) the loop waits on it rather than sleeping, so a long pull (many replies
    read back through the transport) is followed at once by the next step.

    Unlike ``Grid.send_and_receive``, a pull that blocks inside the transport cannot hold the market
    past its deadline: each pull runs in a daemon thread that is abandoned when the deadline passes.
    One last pull is always made (bounded by ``LAST_PULL_S``). A pull stuck in the transport (a node
    cut off while uploading its reply: Flower retries that reply's objects until the SuperLink's
    upload session expires, minutes later; or merely a starved machine) would also hold every reply that
    arrives after it, so once a pull is stuck the others are pulled one message id at a time. Until then
    replies are pulled ``PULL_BATCH`` ids at a time, one pull after the other (the last pull asks for all
    that are left), so that a pull that merely reads back many replies does not pass for a stuck one.

    A pull that raises ends the exchange with its error, as a failed push does: Flower's transport retries
    what may pass and raises only once it has given up, e.g. after the SuperLink ended the run and revoked the
    ServerApp's token (a starved ServerApp whose heartbeats lapsed, or ``flwr stop``).

    No reply that arrived is dropped. The SuperLink hands a reply out once: asking again for an id that a
    slower pull already took gives Flower's "message unavailable" error, which never displaces a reply
    and does not settle its id while a pull that may still bring the real reply is under way (that id
    then waits, up to the deadline, for that pull). Each id keeps its best reply: the node's reply (or
    its error), then any other error, then "message unavailable".
    """
    pushed = list(grid.push_messages(messages))
    pending = set(pushed)
    sender_of = {  # who must answer each message (a reply from another node never displaces its reply)
        message_id: message.metadata.dst_node_id
        for message_id, message in zip(pushed, messages, strict=False)
        if isinstance(message, Message)
    }
    deadline = time.monotonic() + timeout
    grace_end = deadline + max(0.0, start_grace)
    first_wait = start_grace > 0  # no reply yet: the step may wait until grace_end for the first one
    best: dict[str, Message] = {}
    pulls: list[_Pull] = []
    one_by_one = False
    delay = FIRST_PULL_DELAY_S
    while pending:
        end = grace_end if first_wait else deadline
        last = time.monotonic() >= end
        busy = {message_id for pull in pulls if len(pull.ids) == 1 or not pull.stuck for message_id in pull.ids}
        idle = sorted(pending - busy - set(best))  # an id with an "unavailable" reply waits for its pull instead
        if idle and one_by_one:
            pulls.extend(_Pull(grid, [message_id]) for message_id in idle)
        elif idle and (last or not any(not pull.done and not pull.stuck for pull in pulls)):
            pulls.append(_Pull(grid, idle if last else idle[:PULL_BATCH]))  # one batch at a time
        _wait_for(pulls, LAST_PULL_S if last else min(MAX_PULL_DELAY_S, max(0.0, end - time.monotonic())))
        arrived = 0
        for pull in [pull for pull in pulls if pull.done]:
            pulls.remove(pull)
            if pull.error is not None:  # the transport gave up (e.g. Flower ended the run): so does the market
                raise pull.error
            arrived += sum(_keep_best(best, reply, sender_of) for reply in pull.replies)
        if first_wait and best:  # the first reply: the others get the step's timeout from now (never less)
            first_wait = False
            deadline = end = max(deadline, time.monotonic() + timeout)
        outstanding = {message_id for pull in pulls for message_id in pull.ids}
        pending = {
            message_id
            for message_id in pending
            if message_id not in best
            or _rank(best[message_id], sender_of) < 0
            or (_rank(best[message_id], sender_of) == 0 and message_id in outstanding)
        }
        if last:
            break
        if not one_by_one and any(pull.stuck for pull in pulls):
            one_by_one = True
            log(WARNING, "Market: a pull of replies is stuck in the transport; pulling the others one by one")
        if pending:
            delay = FIRST_PULL_DELAY_S if arrived else min(2.0 * delay, MAX_PULL_DELAY_S)
            if not any(not pull.done and not pull.stuck for pull in pulls):  # else _wait_for waits on that pull
                time.sleep(min(delay, max(0.0, end - time.monotonic())))
    if pending and pulls:
        log(WARNING, "Market: pulling replies did not return within the step's timeout; going on without them")
    return list(best.values())


def _rank(reply: Message, sender_of: Mapping[str, int]) -> int:
    """How much a reply tells: 2 the node's reply or its error, 1 another error, 0 Flower's "message unavailable",
    -1 a reply from a node other than the one addressed (kept only to be reported, if nothing else comes)."""
    if not reply.has_error():
        expected = sender_of.get(reply.metadata.reply_to_message_id)
        return -1 if expected is not None and reply.metadata.src_node_id != expected else 2
    if reply.error.code == ErrorCode.MESSAGE_UNAVAILABLE:
        return 0
    return 1 if reply.metadata.src_node_id in _TRANSPORT_NODE_IDS else 2


def _keep_best(best: dict[str, Message], reply: Message, sender_of: Mapping[str, int]) -> bool:
    """Keep ``reply`` as its id's reply unless a better (or equal) one is kept; return whether it was kept."""
    message_id = reply.metadata.reply_to_message_id
    kept = best.get(message_id)
    rank = _rank(reply, sender_of)
    if kept is not None and _rank(kept, sender_of) >= rank:
        if rank == 2:
            log(WARNING, "Market: ignoring a second reply to message %s", message_id)
        return False
    best[message_id] = reply
    return True


class _Pull:
    """One ``grid.pull_messages(ids)`` call in a daemon thread, abandoned if it never returns."""

    def __init__(self, grid: Grid, ids: list[str]) -> None:
        self.ids = ids
        self.replies: list[Message] = []
        self.error: Exception | None = None
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._pull, args=(grid,), name="flmarket-pull", daemon=True)
        self._thread.start()

    def _pull(self, grid: Grid) -> None:
        try:
            self.replies = list(grid.pull_messages(self.ids))
        except Exception as err:  # pylint: disable=broad-exception-caught  # handed to the market's loop
            self.error = err

    @property
    def done(self) -> bool:
        """Whether the call returned (or failed)."""
        return not self._thread.is_alive()

    def wait(self, seconds: float) -> None:
        """Wait at most ``seconds`` for the call to return."""
        self._thread.join(max(seconds, 0.0))

    @property
    def stuck(self) -> bool:
        """Whether the call has been running longer than a pull of replies takes unless the transport is stuck."""
        return not self.done and time.monotonic() - self._started > STUCK_PULL_S


def _wait_for(pulls: list[_Pull], seconds: float) -> None:
    """Wait at most ``seconds`` in all for the pulls that are not stuck to return."""
    end = time.monotonic() + seconds
    for pull in pulls:
        if not pull.stuck:
            pull.wait(end - time.monotonic())
