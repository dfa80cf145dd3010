"""Red team of the sparse secure mode's market wiring (issue 40): a buyer that drives the sparse rounds itself against
drop-in nodes of the secure profile (E = 30, one stated colluder, as tests/test_sparse_secure_market.py).

* A draw the buyer throws away must count against the ``reruns + 1`` placements the degrees were computed for, also
  when the buyer closes the market with an abort and re-launches it in the same run, or when the node restarts: the
  release ledger counted only the sessions a node *masked* in, so draws stopped before the mask were free.
* A draw request out of order (a node at another stage of its sparse session) is refused, not raised.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from adversary import NUM_CLASSES
from flwr.app import Message
from flwr.clientapp import ClientApp
from test_sparse_secure_market import drop_in_app, grinding_buyer

from flmarket_flwr.market.wire.messages import (
    ACTION_ADVERTISE,
    ACTION_DRAW,
    ACTION_SHARE,
    make_content,
    message_type,
)
from flmarket_flwr.market.wire.records import config_record
from flmarket_flwr.pass_protocol.sparse_server import SparseSecureServer
from simulations.inprocess_grid import InProcessGrid

pytestmark = pytest.mark.usefixtures("ledger_home")


def test_draws_thrown_away_before_the_mask_count_across_relaunches_in_the_run(tmp_path: Path) -> None:
    """The buyer draws in ``reruns + 1`` sessions, stops each before the mask (it saw every placement), aborts the
    market and re-launches it in the same run: no release was made, so every later draw is past the bound. Before the
    fix each re-launch gave ``reruns + 1`` fresh placements, without limit."""
    buyer, nodes, _, _ = grinding_buyer(tmp_path)
    per_market = buyer.settings.reruns + 1
    for _ in range(per_market):
        assert set(buyer.session(nodes, until="draw")) == set(nodes)
    assert buyer.abort(nodes) == len(nodes)  # the market closed: the nodes join a re-launch
    for _ in range(2):
        assert buyer.session(nodes, until="draw") == {}  # no node draws again in this run
        buyer.abort(nodes)


def test_draws_thrown_away_before_the_mask_count_after_a_restart(tmp_path: Path) -> None:
    """The buyer draws in ``reruns + 1`` sessions without masking in any, then the nodes restart (their run state
    gone): the ledger still holds the draws, and the next one is refused."""
    buyer, nodes, counts, configs = grinding_buyer(tmp_path)
    for _ in range(buyer.settings.reruns + 1):
        assert set(buyer.session(nodes, until="draw")) == set(nodes)
    for _ in range(2):
        buyer.grid = InProcessGrid(drop_in_app(counts), nodes, node_configs=configs)  # a restart: no state kept
        assert buyer.session(nodes, until="draw") == {}


def test_an_honest_market_still_draws_after_its_release(tmp_path: Path) -> None:
    """Control: draws are counted per market against the run's releases, so the cap leaves an honest market its
    ``reruns + 1`` sessions (here the first masks; the ledger's cap counts it once, drawn and masked)."""
    buyer, nodes, _, _ = grinding_buyer(tmp_path)
    assert set(buyer.session(nodes, until="mask")) == set(nodes)
    for _ in range(buyer.settings.reruns):
        assert set(buyer.session(nodes, until="draw")) == set(nodes)
    assert buyer.session(nodes, until="draw") == {}


def _raw_replies(grid: InProcessGrid, action: str, records: dict[int, Any]) -> list[Message | Exception]:
    """Deliver one request per node straight to the node's ``ClientApp`` (as the runtime would), keeping each reply
    or the exception it raised (the grid would turn one into an error reply)."""
    out: list[Message | Exception] = []
    app = grid._app if isinstance(grid._app, ClientApp) else grid._app()  # pylint: disable=protected-access
    for node, record in records.items():
        message = Message(make_content(record), dst_node_id=node, message_type=message_type(action), group_id=action)
        try:
            out.append(app(message, grid.context(node)))
        except Exception as err:  # noqa: BLE001  # pylint: disable=broad-exception-caught  # what the test is after
            out.append(err)
    return out


def test_a_draw_request_at_another_stage_is_refused_not_raised(tmp_path: Path) -> None:
    """The buyer sends the draw again to nodes that already shared (their sparse state is past the draw): each
    must answer a refusal. Before the fix the handler read ``reruns`` off the share stage's record and raised
    ``AttributeError`` (an exception, its text naming the node's stage, instead of the generic refusal)."""
    buyer, nodes, _, _ = grinding_buyer(tmp_path)
    server = SparseSecureServer(
        b"out-of-order", NUM_CLASSES, 10**9, settings=buyer.settings, directory=buyer.directory,
        run_id=int(buyer.grid.run.run_id),
    )  # fmt: skip
    replies = buyer._round(server, ACTION_ADVERTISE, server.advertise_requests(nodes))
    draws = server.receive_advertisements(replies)
    replies = buyer._round(server, ACTION_DRAW, draws)
    assert len(replies) == len(nodes)
    assert len(buyer._round(server, ACTION_SHARE, server.receive_draws(replies))) == len(nodes)
    records = {server.node_of[i]: config_record(r.to_record()) for i, r in draws.items()}
    answers = _raw_replies(buyer.grid, ACTION_DRAW, records)
    assert not [a for a in answers if isinstance(a, Exception)]
    assert all(isinstance(a, Message) and a.has_error() for a in answers)
    assert all("AttributeError" not in a.error.reason for a in answers)  # type: ignore[union-attr]


def test_draws_thrown_away_count_across_runs(tmp_path: Path) -> None:
    """The buyer draws in ``reruns + 1`` sessions of run 1 without masking, then starts run 2 over the same nodes:
    no release was made anywhere, so a further draw is past the placements the degrees bound: the ledger counts
    over the node's life, not per run."""
    buyer, nodes, counts, configs = grinding_buyer(tmp_path)
    for _ in range(buyer.settings.reruns + 1):
        assert set(buyer.session(nodes, until="draw")) == set(nodes)
    buyer.grid = InProcessGrid(drop_in_app(counts), nodes, node_configs=configs, run_id=2)  # a new run
    assert buyer.session(nodes, until="draw") == {}
