"""The auction's budget rule through the whole market (issue 49): the rule is one of the terms fixed before PASS and
signed in the award, every node re-runs it when it checks the award, and the records say which rule ran and what
share of ``R`` it spent. The paper's rule stays the default and encodes as before."""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from adversary import NUM_CLASSES, honest_grid, make_counts, market_config
from flwr.app import Array, ArrayRecord, ConfigRecord, Message
from flwr.serverapp.strategy import FedAvg
from test_grid_view import training_app
from test_secure_profile_market import drop_in_app, profile_setup, secure_config

from flmarket_flwr.app.results import selection_of
from flmarket_flwr.app.run_config import APP_SCHEMA, relaunch_of
from flmarket_flwr.market import CostBasedBid, FLMarket, MarketConfig, MarketError, MarketPhase
from flmarket_flwr.market.buyer.relaunch import RelaunchPolicy
from flmarket_flwr.market.node.client import read_award
from flmarket_flwr.market.wire.award import Award, AwardError, AwardTerms, SignedAward
from flmarket_flwr.market.wire.messages import RECORD_KEY, AdvertiseTerms
from flmarket_flwr.pricing import BUDGET_RULES, run_auction
from simulations.inprocess_grid import InProcessGrid, market_client_app

KEY = bytes(range(32))


@pytest.fixture(autouse=True)
def ledger_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "flmarket-home"
    monkeypatch.setenv("FLMARKET_HOME", str(home))
    return home


def test_the_paper_s_rule_encodes_its_terms_as_before_and_the_whole_rule_in_the_cap_word_s_top_bit() -> None:
    half = AwardTerms(600.0, 3, KEY)
    assert half.budget_rule == "half" and half.encode() == struct.pack(">dQ", 600.0, 3) + KEY
    whole = AwardTerms(600.0, 3, KEY, "whole")
    assert whole.encode() == struct.pack(">dQ", 600.0, 3 | 1 << 63) + KEY
    for terms in (half, whole, AwardTerms(1.5, 0, KEY, "whole")):
        budget, word = struct.unpack(">dQ", terms.encode()[:16])
        assert AwardTerms.decode_fields(budget, word, KEY) == terms
    with pytest.raises(AwardError, match="budget rule must be one of"):
        AwardTerms(600.0, 0, KEY, "all")
    # The advertisement carries the rule only when it is not the paper's: the default terms' items are unchanged.
    assert "terms-budget-rule" not in AdvertiseTerms(600.0, 0, KEY).to_record()
    assert AdvertiseTerms(600.0, 0, KEY, "whole").to_record()["terms-budget-rule"] == "whole"


@pytest.mark.parametrize("rule", BUDGET_RULES)
def test_a_market_runs_its_rule_and_says_what_share_of_r_it_spent(rule: str) -> None:
    counts = make_counts(12, seed=49)
    outcome = MarketPhase(market_config(budget=20.0, budget_rule=rule)).run(honest_grid(counts))
    assert outcome.status == "succeeded" and outcome.budget_rule == rule
    nodes = sorted(outcome.participants)
    expected = run_auction([outcome.scores[n] for n in nodes], [outcome.bids[n] for n in nodes], 20.0, budget_rule=rule)
    assert outcome.winners == [nodes[int(i)] for i in expected.winners]
    assert outcome.total_payment == pytest.approx(expected.total_payment, rel=1e-12)
    record = outcome.to_dict()
    assert record["budget_rule"] == rule and record["paid_share"] == pytest.approx(outcome.total_payment / 20.0)
    assert outcome.paid_share <= (0.5 if rule == "half" else 1.0) * (1 + 1e-12)


def test_the_whole_budget_rule_buys_more_of_the_same_market_within_r() -> None:
    counts = make_counts(12, seed=49)
    half, whole = (
        MarketPhase(market_config(budget=20.0, budget_rule=r)).run(honest_grid(counts)) for r in BUDGET_RULES
    )
    assert len(whole.winners) > len(half.winners) and set(half.winners) < set(whole.winners)
    assert half.paid_share <= 0.5 < whole.paid_share <= 1.0 + 1e-12


def test_in_the_secure_profile_every_node_checks_and_endorses_the_whole_rule_s_award(tmp_path: Path) -> None:
    counts = make_counts(8, seed=11)
    nodes = sorted(counts)
    configs, directory = profile_setup(tmp_path, nodes)
    grid = InProcessGrid(drop_in_app(counts), nodes, node_configs=configs)
    outcome = MarketPhase(secure_config(directory, budget_rule="whole")).run(grid)
    assert outcome.status == "succeeded" and outcome.winners and outcome.excluded == {}
    assert set(outcome.audited) == set(outcome.winners)  # every winner opened under the endorsed award
    for node in nodes:
        receipt = read_award(grid.context(node))
        assert receipt is not None and receipt.award is not None and receipt.signature is not None
        award = SignedAward(receipt.award, receipt.signature).verify(receipt.buyer_key)
        assert award.terms.budget_rule == "whole" and award.digest() == outcome.award_digest


class RuleRewritingGrid(InProcessGrid):
    """Rewrites the budget rule the buyer announces in every advertise request, on its way to the nodes."""

    def __init__(self, rule: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rule = rule

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        messages = list(messages)
        for message in messages:
            if message.metadata.message_type == "query.market_advertise":
                message.content.config_records[RECORD_KEY]["terms-budget-rule"] = self.rule
        return super().push_messages(messages)


@pytest.mark.parametrize("announced", ["whole", "half", "third"])
def test_a_node_checks_the_award_under_the_rule_announced_to_it_and_knows_no_third(announced: str) -> None:
    """The buyer runs "whole"; the nodes are told ``announced`` at the advertisement. Told "whole", every node takes
    part and the market buys; told "half", every node refuses the award (its terms are not those announced): nobody
    opens or is paid; told a rule that does not exist, every node refuses at the advertisement."""
    counts = make_counts(6, seed=3)
    grid = RuleRewritingGrid(announced, market_client_app(counts, CostBasedBid(0.01)), list(counts))
    phase = MarketPhase(market_config(budget=20.0, budget_rule="whole"))
    if announced == "third":
        with pytest.raises(MarketError) as caught:
            phase.run(grid)
        assert caught.value.outcome is not None and sorted(caught.value.outcome.excluded) == sorted(counts)
        assert all(reason.startswith("market_advertise") for reason in caught.value.outcome.excluded.values())
        return
    outcome = phase.run(grid)
    if announced == "whole":
        assert outcome.winners and outcome.excluded == {} and outcome.total_payment > 0
        return
    assert outcome.winners == [] and outcome.total_payment == 0.0 and sorted(outcome.excluded) == sorted(counts)
    assert all(reason.startswith("market_endorse") for reason in outcome.excluded.values())


def test_flmarket_takes_the_rule_as_a_shorthand_or_in_its_market_config() -> None:
    strategy = FLMarket(FedAvg(), budget=600.0, num_classes=NUM_CLASSES, budget_rule="whole")
    assert strategy.market_config.budget_rule == "whole"
    assert FLMarket(FedAvg(), budget=600.0, num_classes=NUM_CLASSES).market_config.budget_rule == "half"
    with pytest.raises(ValueError, match="budget_rule"):
        FLMarket(FedAvg(), market_config=MarketConfig(600.0, NUM_CLASSES), budget_rule="whole")
    with pytest.raises(ValueError, match=r"budget_rule must be one of \('half', 'whole'\)"):
        FLMarket(FedAvg(), budget=600.0, num_classes=NUM_CLASSES, budget_rule="most")
    with pytest.raises(ValueError, match="auction-budget-rule"):
        APP_SCHEMA.check_values({"auction-budget-rule": "most"})


def test_a_market_share_keeps_the_rest_of_the_budget_for_later_markets(tmp_path: Path) -> None:
    counts = make_counts(8, seed=5)
    grid = InProcessGrid(training_app(counts), sorted(counts))
    config = market_config(budget=40.0, budget_rule="whole", wait_for_nodes_timeout=0.0)
    strategy = FLMarket(FedAvg(fraction_evaluate=0.0), market_config=config, relaunch=RelaunchPolicy(market_share=0.5))
    assert strategy.relaunch is None  # no re-launch criterion: the share caps the one market
    strategy.start(
        grid=grid, initial_arrays=ArrayRecord({"w": Array(np.zeros(3))}), num_rounds=1, train_config=ConfigRecord()
    )
    outcome = strategy.market_outcome
    assert outcome is not None and outcome.budget == pytest.approx(20.0)
    assert outcome.total_payment <= 20.0 * (1 + 1e-12)
    entry = selection_of(strategy)[1]["market.json"]["markets"][0]
    assert entry["budget_rule"] == "whole" and entry["run_budget"] == 40.0 and entry["budget"] == pytest.approx(20.0)


@pytest.mark.parametrize("share", [0.0, -0.5, 1.5, float("nan"), True])
def test_a_bad_market_share_is_refused_naming_it(share: object) -> None:
    with pytest.raises(ValueError, match="market_share"):
        RelaunchPolicy(market_share=share)  # type: ignore[arg-type]


def test_the_run_config_s_share_alone_makes_a_policy() -> None:
    assert relaunch_of(0, 0.0, 0) is None
    assert relaunch_of(0, 0.0, 0, 0.5) == RelaunchPolicy(market_share=0.5)
    assert relaunch_of(5, 0.0, 0, 0.25) == RelaunchPolicy(every_rounds=5, market_share=0.25)


def test_an_award_decodes_to_the_rule_it_was_built_under() -> None:
    for rule in BUDGET_RULES:
        award = Award(1, b"s", b"t", AwardTerms(20.0, 2, KEY, rule), 1, bytes(32), (), ())
        assert Award.decode(award.encode()) == award and Award.decode(award.encode()).terms.budget_rule == rule


def test_the_budget_rules_benchmark_reads_an_archived_grid_and_prints_both_rules(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from benchmarks.bench_budget_rules import main

    archive = Path(__file__).resolve().parent.parent / "results" / "fashion_mnist_budget" / "raw.tar.gz"
    main(["--markets", "200", "--grid", str(archive)])
    lines = capsys.readouterr().out.splitlines()
    paid = {
        (line.split("|")[0].strip(), line.split("|")[1].strip()): float(line.split("paid / R mean ")[1].split()[0])
        for line in lines
        if "paid / R mean" in line
    }
    assert set(paid) == {(name, rule) for name in ("random markets", "fashion_mnist_budget/equal",
                                                   "fashion_mnist_budget/volume") for rule in BUDGET_RULES}  # fmt: skip
    for (name, rule), share in paid.items():
        assert share <= 0.5 if rule == "half" else share >= 0.9, (name, rule, share)


def test_re_launches_under_the_whole_rule_share_the_run_s_budget_and_never_pass_it(tmp_path: Path) -> None:
    """The secure profile re-invites every node; each market may spend half of the run's budget: the first gets R/2,
    the second what is left up to R/2, and every market's payments together stay within R."""
    from test_market_relaunch import market, secure_grid

    grid, _, directory = secure_grid(tmp_path, 6, total_epsilon=1.6)
    strategy = FLMarket(
        FedAvg(fraction_evaluate=0.0),
        market_config=market(directory, budget_rule="whole"),
        relaunch=RelaunchPolicy(every_rounds=1, market_share=0.5),
    )
    strategy.start(
        grid=grid, initial_arrays=ArrayRecord({"w": Array(np.zeros(3))}), num_rounds=3, train_config=ConfigRecord()
    )
    run_budget = strategy.market_config.budget
    ran = [entry for entry in strategy.markets if entry.outcome.status == "succeeded"]
    assert len(ran) == 2 and all(entry.outcome.budget_rule == "whole" for entry in ran)
    first, second = (entry.outcome for entry in ran)
    assert first.budget == pytest.approx(0.5 * run_budget)
    assert second.budget == pytest.approx(min(0.5 * run_budget, run_budget - first.total_payment))
    assert first.paid_share > 0.5  # the whole rule spends most of what each market may
    assert math.fsum(strategy.settled_across_markets().values()) <= run_budget * (1 + 1e-12)
