"""A living federation: FLMarket re-runs the market between rounds, and each re-launch is charged to each node's
privacy budget; a buyer that re-launches to difference a victim meets the noise."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from adversary import ChangingAfterRound
from flwr.app import Array, ArrayRecord, ConfigRecord, MessageType, MetricRecord
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg
from test_grid_view import NUM_CLASSES, make_counts, training_app
from test_secure_profile_market import profile_setup
from test_strategy import receivers

from flmarket_flwr.app.results import selection_of
from flmarket_flwr.app.run_config import relaunch_of
from flmarket_flwr.app.server_app import ServerSettings
from flmarket_flwr.market import FLMarket, MarketConfig, MarketError, MarketPhase
from flmarket_flwr.market.buyer.relaunch import RELAUNCH_METRIC, RelaunchPolicy
from flmarket_flwr.pass_protocol import IdentityDirectory
from flmarket_flwr.pass_protocol.noise import SECURE_PROFILE_DELTA, SkellamNoise, composed_epsilon
from simulations.inprocess_grid import InProcessGrid

INITIAL = ArrayRecord({"w": Array(np.zeros(3))})
TRAIN = ConfigRecord({"lr": 0.1})


pytestmark = pytest.mark.usefixtures("ledger_home")  # tests/conftest.py: the nodes' ledgers, per test


def market(directory: IdentityDirectory | None = None, **overrides: object) -> MarketConfig:
    values: dict[str, object] = {
        "budget": 1000.0,
        "num_classes": NUM_CLASSES,
        "poll_interval": 0.001,
        "wait_for_nodes_timeout": 0.0,
        "timeout": 5.0,
        "timeout_per_node": 0.0,
    }
    if directory is not None:
        values |= {"security": "malicious", "directory": directory}
    return MarketConfig(**(values | overrides))  # type: ignore[arg-type]


def asked(entry) -> dict[int, int]:  # type: ignore[no-untyped-def]
    """How many train rounds a market's cohort was asked to train while that market held (its delivery ledger)."""
    return {node: record.asked for node, record in entry.delivery.records.items()}


def secure_grid(tmp_path: Path, num_nodes: int, total_epsilon: float, **node_extra: object):
    counts = make_counts(num_nodes, seed=7)
    nodes = sorted(counts)
    configs, directory = profile_setup(tmp_path, nodes)
    for node in nodes:
        configs[node] |= {"pass-dp-total-epsilon": total_epsilon, **node_extra}
    return InProcessGrid(training_app(counts), nodes, node_configs=configs), counts, directory


# --- The policy ----------------------------------------------------------------------------------
def test_the_policy_says_why_a_relaunch_is_due() -> None:
    policy = RelaunchPolicy(every_rounds=3, churn_fraction=0.25, min_cohort=2)
    base = {"rounds_since": 1, "connected": {1, 2, 3, 4}, "at_last_market": {1, 2, 3, 4}, "cohort": [1, 2]}
    assert policy.reason(**base) == ""
    assert "3 rounds since" in policy.reason(**(base | {"rounds_since": 3}))
    assert "2 node(s) joined and 0 left" in policy.reason(**(base | {"connected": {1, 2, 3, 4, 5, 6}}))
    assert policy.reason(**(base | {"connected": {1, 2, 3, 4, 5}})) == ""  # 1 of 4 is not more than 0.25
    shrunk = base | {"connected": {1, 3, 4}, "at_last_market": {1, 3, 4}}
    assert "1 of the cohort connected" in policy.reason(**shrunk)
    assert policy.reason(**base, requested="drift").startswith("requested: drift")
    assert not RelaunchPolicy().enabled


@pytest.mark.parametrize(
    "kwargs, field",
    [({"every_rounds": -1}, "every_rounds"), ({"min_cohort": 1.5}, "min_cohort"),
     ({"churn_fraction": -0.1}, "churn_fraction")],
)  # fmt: skip
def test_a_bad_policy_names_its_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        RelaunchPolicy(**kwargs)


@pytest.mark.parametrize("key, value", [("market-relaunch-every", -1), ("market-relaunch-min-cohort", -2),
                                        ("market-relaunch-churn", -0.1)])  # fmt: skip
def test_a_bad_relaunch_key_is_refused_naming_the_key(key: str, value: float) -> None:
    from flmarket_flwr.app.run_config import check_run_config

    with pytest.raises(ValueError, match=key):
        check_run_config({key: value})


# --- Nodes outside the secure profile decline a second release: the market is skipped ---------------
def test_nodes_without_a_privacy_budget_decline_a_relaunch_and_training_goes_on_with_the_previous_cohort() -> None:
    counts = make_counts(6, seed=3)
    grid = InProcessGrid(training_app(counts), list(counts))
    strategy = FLMarket(
        FedAvg(fraction_evaluate=0.0), market_config=market(num_winners=3), relaunch=RelaunchPolicy(every_rounds=2)
    )
    strategy.start(grid=grid, initial_arrays=INITIAL, num_rounds=4, train_config=TRAIN)

    first = strategy.markets[0].outcome
    assert [entry.first_round for entry in strategy.markets] == [1, 3]
    skipped = strategy.markets[1]
    assert skipped.outcome.status == "skipped" and skipped.delivery is None and "rounds since" in skipped.reason
    assert strategy.market_outcome is first
    assert sorted(receivers(grid, MessageType.TRAIN)) == sorted(first.cohort * 4)  # the previous cohort trained on
    assert asked(strategy.markets[0]) == dict.fromkeys(first.cohort, 4)
    report = strategy.markets_report()
    assert [entry["status"] for entry in report] == ["succeeded", "skipped"]
    assert report[0]["delivery"]["winners"][str(first.winners[0])]["asked"] == 4


# --- The secure profile: re-launches run, each charged to each node's budget -------------------------
def test_a_relaunch_picks_a_new_cohort_and_each_node_spends_what_the_accountant_says(
    tmp_path: Path, ledger_home: Path
) -> None:
    grid, counts, directory = secure_grid(tmp_path, 6, total_epsilon=1.6)
    strategy = FLMarket(
        FedAvg(fraction_evaluate=0.0),
        market_config=market(directory, num_winners=2),
        relaunch=RelaunchPolicy(every_rounds=1),
    )
    result = strategy.start(grid=grid, initial_arrays=INITIAL, num_rounds=3, train_config=TRAIN)

    # Markets before rounds 1 and 2 run; the third would take each node past 1.6 (1.81 after 3): it declines,
    # the market is skipped and round 3 trains the cohort of market 2.
    statuses = [entry.outcome.status for entry in strategy.markets]
    assert statuses == ["succeeded", "succeeded", "failed"]
    assert asked(strategy.markets[0]) == dict.fromkeys(strategy.markets[0].outcome.cohort, 1)
    assert asked(strategy.markets[1]) == dict.fromkeys(strategy.markets[1].outcome.cohort, 2)
    expected = strategy.markets[0].outcome.cohort + strategy.markets[1].outcome.cohort * 2
    assert sorted(receivers(grid, MessageType.TRAIN)) == sorted(expected)
    assert "privacy budget" in json.dumps(strategy.markets[2].outcome.excluded)
    assert not np.allclose(result.arrays["w"].numpy(), 0.0)
    # Each node's ledger: one spend per release it took part in; composed, exactly the accountant's epsilon.
    noise = SkellamNoise(1.0, SECURE_PROFILE_DELTA)
    ledgers = sorted(ledger_home.glob("ledger/*/release-ledger.json"))
    assert len(ledgers) == len(counts)
    for path in ledgers:
        variances = [spend["variance"] for spend in json.loads(path.read_text())["spent"]]
        assert len(variances) == 2
        assert composed_epsilon(variances, SECURE_PROFILE_DELTA) == pytest.approx(noise.epsilon_after(2), rel=1e-9)
        assert noise.epsilon_after(2) <= 1.6 < noise.epsilon_after(3)
    # market.json: one entry per market, and settlement across them.
    selection, files = selection_of(strategy)
    entries = files["market.json"]["markets"]
    assert [entry["market"] for entry in entries] == [1, 2, 3]
    owed = strategy.settled_across_markets()
    paid = {**strategy.markets[0].outcome.payments}
    for node, payment in strategy.markets[1].outcome.payments.items():
        paid[node] = paid.get(node, 0.0) + payment
    assert owed == pytest.approx({node: paid[node] for node in owed})
    assert selection["selected"] == strategy.market_outcome.cohort


def test_the_wrapped_strategy_can_ask_for_a_relaunch(tmp_path: Path) -> None:
    class Drifting(FedAvg):
        def aggregate_train(self, server_round, replies):  # type: ignore[no-untyped-def]
            arrays, metrics = super().aggregate_train(server_round, replies)
            return arrays, MetricRecord({**(metrics or {}), RELAUNCH_METRIC: float(server_round == 1)})

    grid, _, directory = secure_grid(tmp_path, 6, total_epsilon=4.0)
    strategy = FLMarket(
        Drifting(fraction_evaluate=0.0), market_config=market(directory), relaunch=RelaunchPolicy(every_rounds=100)
    )
    strategy.start(grid=grid, initial_arrays=INITIAL, num_rounds=3, train_config=TRAIN)
    ran = [(entry.first_round, entry.outcome.status) for entry in strategy.markets]
    assert ran == [(1, "succeeded"), (2, "succeeded")]
    assert strategy.markets[1].reason.startswith("requested")


# --- A buyer that re-launches to difference a victim ---------------------------------------------
def test_a_buyer_differencing_two_markets_does_not_recover_the_victims_counts_beyond_the_noise(
    tmp_path: Path,
) -> None:
    """The buyer re-launches with the victim left out (colluders leaving with it would look the same to the
    ledgers, so the nodes' roster floor is set to 1 here): N_s1 - N_s2 is the victim's counts plus two releases'
    noise, never the counts themselves."""
    grid, counts, directory = secure_grid(tmp_path, 7, total_epsilon=4.0, **{"market-min-roster-change": 1})
    nodes = sorted(counts)
    victim = nodes[0]
    first = MarketPhase(market(directory)).run(grid)
    second = MarketPhase(market(directory, exclude=(victim,))).run(grid)
    assert first.status == second.status == "succeeded" and victim not in second.pass_participants
    estimate = np.array(first.global_counts) - np.array(second.global_counts)
    error = estimate - counts[victim]
    assert np.any(error != 0)  # not recovered
    noise = SkellamNoise(1.0, SECURE_PROFILE_DELTA)
    spread = np.sqrt(2 * noise.target_variance / noise.honest_fraction)  # both releases' noise, every node honest
    rms = float(np.sqrt(np.mean(error.astype(float) ** 2)))
    assert 0.3 * spread < rms < 3 * spread  # the error is the noise's: differencing gains nothing beyond it


def test_with_the_default_roster_floor_the_nodes_ledgers_refuse_the_differencing_market(tmp_path: Path) -> None:
    grid, counts, directory = secure_grid(tmp_path, 7, total_epsilon=4.0)
    nodes = sorted(counts)
    MarketPhase(market(directory)).run(grid)
    with pytest.raises(MarketError) as caught:
        MarketPhase(market(directory, exclude=(nodes[0],))).run(grid)
    reasons = caught.value.outcome.excluded  # type: ignore[union-attr]
    assert set(reasons) == set(nodes[1:]) and all("refused by the node's release ledger" in r for r in reasons.values())


def test_on_churn_the_relaunch_invites_the_nodes_that_joined_and_replaces_a_winner_that_left(tmp_path: Path) -> None:
    """Nodes join after round 2 and a winner is killed (its replies lost, it leaves the grid): the churn policy
    re-launches before round 3, over the new federation, and the cohort is whole again. The nodes' roster floor
    is 1 here: a departure between two releases is what their ledgers refuse by default (the noise composes)."""
    grid, counts, directory = secure_grid(tmp_path, 9, total_epsilon=4.0, **{"market-min-roster-change": 1})
    nodes = sorted(counts)
    grid.connected = nodes[:6]
    killed: set[int] = set()
    grid.reply_hook = lambda message, reply: None if message.metadata.dst_node_id in killed else reply

    def churn() -> None:
        winner = strategy.markets[0].outcome.winners[0]
        killed.add(winner)
        grid.connected = [node for node in nodes if node != winner]

    strategy = FLMarket(
        ChangingAfterRound(2, churn, fraction_evaluate=0.0), market_config=market(directory, num_winners=3),
        relaunch=RelaunchPolicy(churn_fraction=0.3), absent_timeout=None,
    )  # fmt: skip
    strategy.start(grid=grid, initial_arrays=INITIAL, num_rounds=4, train_config=TRAIN, timeout=5.0)

    first, second = (entry.outcome for entry in strategy.markets)
    assert strategy.markets[1].first_round == 3 and "3 node(s) joined and 1 left" in strategy.markets[1].reason
    assert set(first.invited) == set(nodes[:6])
    assert set(second.invited) == set(nodes) - killed and set(nodes[6:]) <= set(second.pass_participants)
    assert len(second.cohort) == 3 and not killed & set(second.cohort)
    assert asked(strategy.markets[1]) == dict.fromkeys(second.cohort, 2)


def test_the_run_config_keys_make_the_policy() -> None:
    assert relaunch_of(0, 0.0, 0) is None
    assert relaunch_of(5, 0.25, 2) == RelaunchPolicy(every_rounds=5, churn_fraction=0.25, min_cohort=2)
    settings = ServerSettings.from_run_config({"market-relaunch-every": 4, "market-include": "7", "budget": 50.0})
    assert (settings.market_relaunch_every, settings.market_include) == (4, "7")


def test_a_relaunch_works_inside_a_dp_wrapper(tmp_path: Path) -> None:
    """DP(FLMarket(FedAvg)): the outer wrapper drives the rounds; FLMarket's hooks re-run the market all the same."""
    grid, _, directory = secure_grid(tmp_path, 6, total_epsilon=4.0)
    market_strategy = FLMarket(
        FedAvg(fraction_evaluate=0.0), market_config=market(directory, num_winners=3), relaunch=RelaunchPolicy(1)
    )
    outer = DifferentialPrivacyServerSideFixedClipping(
        market_strategy, noise_multiplier=0.1, clipping_norm=10.0, num_sampled_clients=3
    )
    outer.start(grid=grid, initial_arrays=INITIAL, num_rounds=2, train_config=TRAIN)
    assert [entry.outcome.status for entry in market_strategy.markets] == ["succeeded", "succeeded"]
    expected = market_strategy.markets[0].outcome.cohort + market_strategy.markets[1].outcome.cohort
    assert sorted(receivers(grid, MessageType.TRAIN)) == sorted(expected)
