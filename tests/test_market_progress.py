"""The app's ``market.json`` exists from before the market starts and follows it step by step, so a run that Flower
ends (a lost ServerApp heartbeat, ``flwr stop``) still leaves how far the market got (issue 44, item 5)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from flwr.app import Context, Message, RecordDict
from test_app_simulation import app_run_config

from flmarket_flwr.app import client_app, server_app
from flmarket_flwr.app.market_progress import UNFINISHED
from simulations.inprocess_grid import InProcessGrid

NODES = [101, 202, 303, 404, 505, 606]


class Snapshots:
    """A reply hook that reads ``market.json`` when each node answers (what a kill at that moment would leave), and
    raises ``interrupt`` at the first reply to ``stop_at`` (Flower's SIGINT reaching the ServerApp)."""

    def __init__(self, path: Path, stop_at: str = "", interrupt: BaseException | None = None) -> None:
        self.path, self.stop_at, self.interrupt = path, stop_at, interrupt
        self.seen: dict[str, dict] = {}

    def __call__(self, instruction: Message, reply: Message) -> Message:
        kind = instruction.metadata.message_type
        if kind not in self.seen:
            self.seen[kind] = json.loads(self.path.read_text())
        if kind == self.stop_at and self.interrupt is not None:
            raise self.interrupt
        return reply


def run_app(tmp_path: Path, hook: Snapshots) -> None:
    run_config = app_run_config(
        distribution="d1", budget=2500.0, num_server_rounds=1, results_dir=str(tmp_path), run_name="progress"
    )
    grid = InProcessGrid(client_app.app, NODES, run_config=run_config, run_id=9, reply_hook=hook)
    server_app.main(grid, Context(9, 0, {}, RecordDict(), run_config))


def test_market_json_follows_the_market_and_ends_as_the_runs_record(tmp_path: Path) -> None:
    hook = Snapshots(tmp_path / "progress" / "market.json")
    run_app(tmp_path, hook)

    advertise = hook.seen["query.market_advertise"]
    assert advertise["status"] == "running" and advertise["step"] == "market_advertise"
    assert advertise["reason"] == UNFINISHED and advertise["budget"] == 2500.0
    bid = hook.seen["query.market_bid"]
    assert bid["step"] == "market_bid"
    assert [step["step"] for step in bid["steps"]][:4] == [
        "market_advertise",
        "market_share",
        "market_mask",
        "market_unmask",
    ]
    assert [s["at_s"] for s in bid["steps"]] == sorted(s["at_s"] for s in bid["steps"])
    trained = hook.seen["train"]  # the market is over when the first train message goes out: its outcome
    assert trained["status"] == "succeeded" and trained["winners"] and trained["steps"][-1]["step"] == "market_award"
    final = json.loads((tmp_path / "progress" / "market.json").read_text())
    assert final["status"] == "succeeded" and final["winners"] == trained["winners"] and "delivery" in final
    assert not list((tmp_path / "progress").glob("*.partial"))


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt(), SystemExit(1)], ids=["SIGINT", "exit"])
def test_a_serverapp_ended_mid_market_leaves_where_it_stopped(tmp_path: Path, interrupt: BaseException) -> None:
    hook = Snapshots(tmp_path / "progress" / "market.json", stop_at="query.market_mask", interrupt=interrupt)
    with pytest.raises(type(interrupt)):
        run_app(tmp_path, hook)

    market = json.loads((tmp_path / "progress" / "market.json").read_text())
    assert market["status"] == "ended" and market["step"] == "market_mask"
    assert market["reason"].startswith(f"the ServerApp stopped during market_mask ({type(interrupt).__name__}")
    assert [step["step"] for step in market["steps"]] == ["market_advertise", "market_share", "market_mask"]
    assert hook.seen["query.market_mask"]["status"] == "running"  # a hard kill here would have left this
