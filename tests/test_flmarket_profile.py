"""The secure profile from ``FLMarket``'s shorthand (``pass_colluders`` beside ``budget=``), clear errors for a bad
count, and the one line at the start of each market that says what is in effect."""

from __future__ import annotations

import logging

import pytest
from flwr.serverapp.strategy import FedAvg
from test_grid_view import make_counts, training_app

from flmarket_flwr.market import FLMarket, MarketConfig, MarketPhase
from flmarket_flwr.market.buyer.server import profile_line
from flmarket_flwr.pass_protocol import IdentityDirectory, generate_identity
from simulations.inprocess_grid import InProcessGrid


def directory_of(size: int) -> IdentityDirectory:
    return IdentityDirectory({node: generate_identity()[1] for node in range(1, size + 1)})


def test_the_shorthand_states_the_colluders_and_keeps_the_budget() -> None:
    directory = directory_of(12)
    strategy = FLMarket(
        FedAvg(), budget=600.0, num_classes=10, security="malicious", directory=directory, pass_colluders=3
    )
    config = strategy.market_config
    assert (config.budget, config.security, config.pass_colluders) == (600.0, "malicious", 3)
    assert config.pass_reruns == 3  # the profile's re-runs follow the stated colluders, as MarketConfig's own
    assert config == MarketConfig(600.0, 10, security="malicious", directory=directory, pass_colluders=3)
    auto = FLMarket(FedAvg(), budget=600.0, num_classes=10, security="malicious", directory=directory).market_config
    assert auto == MarketConfig(600.0, 10, security="malicious", directory=directory)  # "auto": derived once, alike
    with pytest.raises(ValueError, match=r"give either market_config or \['pass_colluders'\]"):
        FLMarket(FedAvg(), market_config=config, pass_colluders=2)


@pytest.mark.parametrize(
    ("value", "error"), [(None, TypeError), (-1, ValueError), ("many", ValueError), (2.5, TypeError), (True, TypeError)]
)
def test_a_bad_colluder_count_is_named_as_itself(value: object, error: type) -> None:
    with pytest.raises(error, match=r'pass_colluders must be an int >= 0 or "auto", got'):
        MarketConfig(100.0, 10, security="malicious", directory=directory_of(6), pass_colluders=value)  # type: ignore[arg-type]
    if value is not None:  # None is FLMarket's "not given"
        with pytest.raises(error, match="pass_colluders must be"):
            FLMarket(FedAvg(), budget=1.0, num_classes=2, security="malicious", directory=directory_of(6),
                     pass_colluders=value)  # type: ignore[arg-type]  # fmt: skip


@pytest.mark.parametrize("name", ["pass_reruns", "pass_min_participants"])
def test_the_other_counts_are_named_too(name: str) -> None:
    with pytest.raises(TypeError, match=rf"{name} must be an int"):
        MarketConfig(100.0, 10, **{name: None})  # type: ignore[arg-type]


def test_the_line_names_profile_graph_noise_and_colluders() -> None:
    default = profile_line(MarketConfig(100.0, 10), 8)
    assert default.startswith("default profile (semi-honest); PASS over 8 clients on a graph the buyer places")
    assert "no noise on the counts" in default and "no colluders stated" in default
    small = MarketConfig(100.0, 10, security="malicious", directory=directory_of(6), pass_colluders=1)
    line = profile_line(small, 6)
    assert "secure profile (security='malicious', directory of 6 nodes)" in line
    assert "on the complete graph" in line and "Skellam noise on the counts, epsilon 1 and delta 1e-06" in line
    assert "pass-colluders 1 stated, 1 PASS re-run(s) at most" in line
    large = MarketConfig(100.0, 10, security="malicious", directory=directory_of(400), pass_colluders=10)
    assert large.runs_sparse(400)
    degree = large.sparse_settings.parameters(400)  # type: ignore[union-attr]
    drawn = f"a graph each client draws (the sparse secure mode): k={degree.degree} out-neighbours each, threshold t="
    assert drawn in profile_line(large, 400)


def test_each_market_logs_the_line_once_at_its_start(caplog: pytest.LogCaptureFixture) -> None:
    counts = make_counts(5, seed=2)
    grid = InProcessGrid(training_app(counts), sorted(counts))
    config = MarketConfig(100.0, 4, poll_interval=0.001, timeout=5.0, timeout_per_node=0.0)
    with caplog.at_level(logging.INFO):
        MarketPhase(config).run(grid)
    lines = [r.getMessage() for r in caplog.records if "PASS over" in r.getMessage()]
    assert lines == [f"Market: {profile_line(config, 5)}"]
