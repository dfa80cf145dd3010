"""A dishonest buyer against the market re-launch: it re-launches to reset a node's per-run protections or to get
releases its privacy budget does not pay for; each attack here is played and shown to fail."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from test_market_relaunch import market, secure_grid

from flmarket_flwr.market import MarketError, MarketPhase
from flmarket_flwr.market import server as market_server
from flmarket_flwr.pass_protocol.noise import SECURE_PROFILE_DELTA, SkellamNoise, composed_epsilon


@pytest.fixture(autouse=True)
def ledger_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "flmarket-home"
    monkeypatch.setenv("FLMARKET_HOME", str(home))
    return home


def spent_variances(ledger_home: Path) -> list[list[float]]:
    """Each node's recorded privacy spends (aggregate variances), one list per node's ledger."""
    paths = sorted(ledger_home.glob("ledger/*/release-ledger.json"))
    return [[spend["variance"] for spend in json.loads(path.read_text())["spent"]] for path in paths]


def reuse_session_ids(monkeypatch: pytest.MonkeyPatch, tokens: list[bytes]) -> None:
    """The buyer picks each market's PASS session id itself: ``tokens`` in order (its random part)."""
    queue = list(tokens)
    monkeypatch.setattr(market_server, "secrets", SimpleNamespace(token_bytes=lambda n: queue.pop(0)))


def test_a_relaunch_under_an_earlier_markets_session_id_is_a_free_release_not_prevented(
    tmp_path: Path, ledger_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the fix: the third market, under A again, is released and every ledger still holds two spends."""
    grid, _, directory = secure_grid(tmp_path, 6, total_epsilon=4.0)
    reuse_session_ids(monkeypatch, [b"A" * 16, b"B" * 16, b"A" * 16])
    outcomes = [MarketPhase(market(directory)).run(grid) for _ in range(3)]
    assert [outcome.status for outcome in outcomes] == ["succeeded"] * 3
    assert all(len(variances) == 2 for variances in spent_variances(ledger_home))  # three releases, two spends


# --- Re-launching under an earlier market's session id --------------------------------------------------
@pytest.mark.xfail(strict=True, reason="not prevented: the ledger takes a reused session id for a retry")
def test_a_relaunch_under_an_earlier_markets_session_id_is_refused_and_every_release_is_charged(
    tmp_path: Path, ledger_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The buyer runs markets under session ids A, B, then A again. A node's ledger recorded A's spend and
    members; a retried message of the same session is free, so without a check a third release under A would
    cost the node nothing and pass the differencing check as 'already recorded'. Repeating A and B, the buyer
    would average the fresh noise of as many releases of the same sum as it likes. Every node refuses the third
    market (its budget, 4, would pay for a third release under a new id), and each ledger holds one spend per
    release, composed to the accountant's epsilon."""
    grid, counts, directory = secure_grid(tmp_path, 6, total_epsilon=4.0)
    a, b = b"A" * 16, b"B" * 16
    reuse_session_ids(monkeypatch, [a, b, a])
    first = MarketPhase(market(directory)).run(grid)
    second = MarketPhase(market(directory)).run(grid)
    assert first.status == second.status == "succeeded"
    with pytest.raises(MarketError) as caught:
        MarketPhase(market(directory)).run(grid)
    reasons = caught.value.outcome.excluded  # type: ignore[union-attr]
    assert set(reasons) == set(counts)
    noise = SkellamNoise(1.0, SECURE_PROFILE_DELTA)
    for variances in spent_variances(ledger_home):
        assert len(variances) == 2  # two releases, two spends
        assert composed_epsilon(variances, SECURE_PROFILE_DELTA) == pytest.approx(noise.epsilon_after(2), rel=1e-9)


def test_a_relaunch_under_a_fresh_session_id_is_joined_and_charged(
    tmp_path: Path, ledger_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: the same three markets under three distinct ids all run, and each node spends three times."""
    grid, _, directory = secure_grid(tmp_path, 6, total_epsilon=4.0)
    reuse_session_ids(monkeypatch, [b"A" * 16, b"B" * 16, b"C" * 16])
    outcomes = [MarketPhase(market(directory)).run(grid) for _ in range(3)]
    assert [outcome.status for outcome in outcomes] == ["succeeded"] * 3
    noise = SkellamNoise(1.0, SECURE_PROFILE_DELTA)
    for variances in spent_variances(ledger_home):
        assert composed_epsilon(variances, SECURE_PROFILE_DELTA) == pytest.approx(noise.epsilon_after(3), rel=1e-9)
    assert not np.array_equal(outcomes[0].global_counts, outcomes[2].global_counts)  # fresh noise each time
