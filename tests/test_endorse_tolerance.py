"""The endorsement tolerance (node config ``market-endorse-tolerance``, issue 50's residual): a winner that sets
``d >= 0`` opens only with all but ``d`` of the award's survivors endorsing, so the one move signed rows leave the buyer
after it has seen the bids, leaving honest bidders out of the award, reaches ``d`` bidders and no further. Played with
the real handlers at the secure profile's defaults (E = 10, quorum 7, which alone tolerates 3 left out) and in the
sparse mode (E = 60, quorum 32 over the directory, which alone tolerates 28); an honest market with ``d = 0`` still
opens its winners."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import pytest
from flwr.app import Context, RecordDict
from hypothesis import given
from hypothesis import strategies as st
from test_award import _AttackDone
from test_binding_award import BUDGET, NODES, play, profile_grid
from test_secure_profile_market import profile_setup, secure_config
from test_signed_bids import (
    QUORUM,
    SPARSE_COLLUDERS,
    STATED,
    leaving_out_attack,
    sparse_phase,
)

from flmarket_flwr.market import MarketPhase
from flmarket_flwr.market.node.node_config import read_node_settings
from flmarket_flwr.market.wire.award import AwardError, opening_quorum
from flmarket_flwr.market.wire.messages import ACTION_ENDORSE

TOLERANCE = "market-endorse-tolerance"


@pytest.fixture(autouse=True)
def ledger_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "flmarket-home"
    monkeypatch.setenv("FLMARKET_HOME", str(home))
    return home


# --- The rule ------------------------------------------------------------------------------------------------------
@given(
    quorum=st.integers(1, 10_000),
    survivors=st.integers(1, 10_000),
    tolerance=st.integers(-1, 10_000),
)
def test_the_opening_quorum_is_the_binding_quorum_and_all_but_d_survivors(
    quorum: int, survivors: int, tolerance: int
) -> None:
    needed = opening_quorum(quorum, survivors, tolerance)
    assert needed >= quorum  # never below the quorum that makes the award unique
    if tolerance < 0:
        assert needed == quorum
    else:
        assert needed >= survivors - tolerance  # at most d survivors may refuse
        assert needed == quorum or needed == survivors - tolerance  # and no more is asked


def test_a_tolerance_below_minus_one_is_refused_by_name() -> None:
    with pytest.raises(AwardError, match="tolerance"):
        opening_quorum(7, 10, -2)


# --- The attack, at the profile's defaults (E = 10, c = 2, q = 7) ---------------------------------------------------
def _assert_left_out(seen: dict[str, Any], tolerance: int, opens: bool) -> None:
    left = len(seen["left_out"])
    assert seen["victim"] not in seen["honest_winners"]
    assert seen["endorsers"] == seen["bidders"] - seen["left_out"]  # each left-out bidder refuses, the rest endorse
    if opens:
        assert left <= tolerance and seen["victim"] in seen["opened"] == seen["winners"]
    else:
        assert left > tolerance and seen["opened"] == set()


@pytest.mark.parametrize(
    "tolerance, beyond", [(0, True), (1, False), (1, True), (2, False)], ids=["d0-one", "d1-one", "d1-two", "d2-two"]
)
def test_with_a_tolerance_d_leaving_bidders_out_opens_a_loser_only_within_d(
    tmp_path: Path, tolerance: int, beyond: bool
) -> None:
    """The loser that needs ``d`` honest bidders left out opens, the one that needs ``d + 1`` does not, while the
    quorum alone (``n - q = 3``) would have opened both (``test_signed_bids``)."""
    seen: dict[str, Any] = {}
    play(tmp_path, leaving_out_attack(seen, tmp_path, STATED, tolerance, beyond), node_config={TOLERANCE: tolerance})
    _assert_left_out(seen, tolerance, opens=not beyond)
    assert len(seen["left_out"]) <= NODES - QUORUM  # within what the quorum alone tolerates: the tolerance stops it
    print(f"d = {tolerance}: rank {seen['rank']} left out {len(seen['left_out'])} opened={bool(seen['opened'])}")


def test_with_no_tolerance_an_honest_market_in_the_profile_opens_its_winners(tmp_path: Path) -> None:
    grid, directory, _ = profile_grid(tmp_path, node_config={TOLERANCE: 0})
    outcome = MarketPhase(secure_config(directory, budget=BUDGET)).run(grid)
    assert outcome.status == "succeeded" and outcome.winners and outcome.excluded == {}
    assert sorted(outcome.audited) == sorted(outcome.winners)
    assert math.fsum(outcome.payments.values()) <= BUDGET


@pytest.mark.parametrize("tolerance", [-1, 0], ids=["quorum-alone", "no-tolerance"])
def test_with_no_tolerance_a_survivor_lost_after_the_unmask_stops_the_opening(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, tolerance: int
) -> None:
    """The price of ``d = 0``: one survivor whose endorsement never arrives, and no winner opens; the market pays no
    one. With the quorum alone (the default) the same market opens its winners."""
    caplog.set_level(logging.WARNING)
    grid, directory, _ = profile_grid(tmp_path, node_config={TOLERANCE: tolerance})
    silent = grid.node_ids[-1]

    def hook(instruction: Any, reply: Any) -> Any:
        endorse = instruction.metadata.message_type == f"query.{ACTION_ENDORSE}"
        return None if endorse and instruction.metadata.dst_node_id == silent else reply

    grid.reply_hook = hook
    outcome = MarketPhase(secure_config(directory, budget=BUDGET)).run(grid)
    assert outcome.excluded[silent].startswith(ACTION_ENDORSE)
    refusals = [r.getMessage() for r in caplog.records if f"{NODES} are needed" in r.getMessage()]
    if tolerance < 0:
        assert outcome.winners and sorted(outcome.audited) == sorted(outcome.winners) and not refusals
    else:
        assert outcome.winners == [] and outcome.audited == [] and outcome.total_payment == 0.0
        assert refusals and all(f"only {NODES - 1} survivors" in refusal for refusal in refusals)


def test_the_node_config_key_reaches_the_settings(tmp_path: Path) -> None:
    nodes = list(range(1, NODES + 1))
    configs, _ = profile_setup(tmp_path, nodes)
    for tolerance in (-1, 0, 2):
        context = Context(1, nodes[0], configs[nodes[0]] | {TOLERANCE: tolerance}, RecordDict(), {})
        assert read_node_settings(context).endorse_tolerance == tolerance
    assert read_node_settings(Context(1, nodes[0], configs[nodes[0]], RecordDict(), {})).endorse_tolerance == -1


# --- The sparse mode (E = 60, c = 3 stated, quorum 32 over the directory) -------------------------------------------
@pytest.mark.parametrize("beyond", [False, True], ids=["within-d", "one-more"])
def test_with_a_tolerance_the_sparse_mode_opens_a_left_out_loser_only_within_d(tmp_path: Path, beyond: bool) -> None:
    tolerance = 2
    seen: dict[str, Any] = {}
    attack = leaving_out_attack(seen, tmp_path, SPARSE_COLLUDERS, tolerance, beyond)
    grid, phase = sparse_phase(tmp_path, attack, **{TOLERANCE: tolerance})
    with pytest.raises(_AttackDone):
        phase.run(grid)
    _assert_left_out(seen, tolerance, opens=not beyond)
