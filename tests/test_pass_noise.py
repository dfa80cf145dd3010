"""Distributed differential privacy on N_s (issue 21, "no exact differencing across runs").

The accounting (:mod:`flmarket_flwr.pass_protocol.noise`) against a direct numeric Renyi divergence, the noise
through the ring (masks still cancel, the noise does not, negative sums decode), and the differencing attacks
of ``test_adversarial_runs.py`` / ``test_adversarial_views.py`` replayed with noise on: the recovered vector
is not the victim's counts, and its error has the spread the calibration predicts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from adversary import NUM_CLASSES, make_counts, market_config
from flwr.clientapp import ClientApp
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import logsumexp
from scipy.stats import skellam

from flmarket_flwr.market import CostBasedBid, MarketPhase, register_market_handlers
from flmarket_flwr.market.node.node_config import NodeSettings
from flmarket_flwr.market.wire.ledger import ReleaseLedger
from flmarket_flwr.pass_protocol import PassClient, PassError, PassServer, SkellamNoise
from flmarket_flwr.pass_protocol.noise import skellam_epsilon, skellam_rdp, skellam_variance_for
from simulations.inprocess_grid import InProcessGrid

# --- Accounting ----------------------------------------------------------------------------------


def exact_skellam_rdp(alpha: int, variance: float) -> float:
    """``D_alpha(Sk + 1 || Sk)`` for the symmetric Skellam law of ``variance``, summed over its support."""
    half = variance / 2.0
    span = int(40 * math.sqrt(variance)) + 40
    k = np.arange(-span, span)
    log_p, log_q = skellam.logpmf(k, half, half), skellam.logpmf(k - 1, half, half)
    finite = np.isfinite(log_p) & np.isfinite(log_q)
    return float(logsumexp(alpha * log_q[finite] + (1 - alpha) * log_p[finite]) / (alpha - 1))


@pytest.mark.parametrize("variance", [2.0, 10.0, 30.0, 300.0])
@pytest.mark.parametrize("alpha", [2, 5, 20])
def test_the_rdp_bound_lies_above_the_numeric_renyi_divergence_and_close_to_it(alpha: int, variance: float) -> None:
    exact, bound = exact_skellam_rdp(alpha, variance), skellam_rdp(alpha, variance)
    assert exact <= bound
    if variance == 2:  # composed_epsilon's docstring: "2 to 3.6 times the truth at variance 2"
        assert 2 * exact <= bound <= 3.6 * exact
    if variance >= 30:  # the discretisation surcharge fades: within 15% of the truth at 30, 1% at 300
        assert bound <= (1.15 if variance < 300 else 1.01) * exact


@given(st.floats(0.5, 1e6), st.floats(1.01, 4.0))
@settings(max_examples=60, deadline=None)
def test_more_noise_gives_a_smaller_epsilon(variance: float, factor: float) -> None:
    assert skellam_epsilon(variance * factor, 1e-6) < skellam_epsilon(variance, 1e-6)


@given(st.integers(1, 50))
@settings(max_examples=20, deadline=None)
def test_composition_grows_epsilon_and_the_calibration_meets_its_target(releases: int) -> None:
    variance = skellam_variance_for(1.0, 1e-6)
    assert skellam_epsilon(variance, 1e-6) <= 1.0 < skellam_epsilon(variance / 1.002, 1e-6)
    assert skellam_epsilon(variance, 1e-6, releases + 1) > skellam_epsilon(variance, 1e-6, releases)


def test_epsilon_matches_a_direct_conversion_at_two_points() -> None:
    """By hand: the Canonne-Kamath-Steinke conversion over the integer orders, below Mironov's plain one."""
    for variance, delta in ((30.0, 1e-6), (200.0, 1e-5)):
        rdp = [
            a / (2 * variance) + min((2 * a - 1 + 6) / (4 * variance**2), 3 / (2 * variance)) for a in range(2, 4097)
        ]
        orders = range(2, 4097)
        by_hand = min(r + math.log1p(-1 / a) - math.log(delta * a) / (a - 1) for r, a in zip(rdp, orders, strict=True))
        mironov = min(r + math.log(1 / delta) / (a - 1) for r, a in zip(rdp, orders, strict=True))
        assert skellam_epsilon(variance, delta) == pytest.approx(by_hand, rel=1e-3)
        assert skellam_epsilon(variance, delta) < 0.85 * mironov
    assert round(skellam_epsilon(30.0, 1e-6), 3) == 0.832  # the hand-written conversion said 0.994


def test_the_readmes_numbers_at_epsilon_one() -> None:
    """docs/threat-model.md, "Differencing across any number of runs": the compositions, the spread, the tail, the
    three-run error."""
    noise = SkellamNoise(1.0, 1e-6)
    assert [round(noise.epsilon_after(k), 2) for k in (1, 2, 3, 10)] == [1.0, 1.45, 1.81, 3.51]
    assert round(noise.target_variance, 1) == 21.6  # 29.7 with Mironov's conversion: 27% less noise
    assert round(math.sqrt(2 * noise.target_variance), 1) == 6.6  # everyone honest: twice the target
    assert noise.tail_bound() == 80  # 12 standard deviations of the largest sum, plus one
    for x in range(3, 8):  # markets over X, Y and {v} + X + Y: the difference carries the noise of three sums
        for y in range(3, 8):
            spread = math.sqrt(sum(n * noise.client_variance(n) for n in (x, y, 1 + x + y)))
            assert 10.1 < spread < 11.3  # "10 to 11 samples a class"


def test_the_per_client_share_sums_to_the_target_over_the_honest_fraction() -> None:
    noise = SkellamNoise(1.0, 1e-6, honest_fraction=0.5)
    assert noise.honest_clients(20) == 10 and noise.honest_clients(7) == 4
    assert noise.client_variance(20) * 10 == pytest.approx(noise.target_variance)
    with pytest.raises(ValueError):
        SkellamNoise(0.0)
    with pytest.raises(ValueError):
        SkellamNoise(1.0, honest_fraction=0.0)


def test_the_noise_has_the_calibrated_variance() -> None:
    noise = SkellamNoise(1.0, rng=lambda: np.random.default_rng(7))
    draws = noise.sample(200_000, roster_size=10)
    assert draws.dtype == np.int64 and abs(draws.mean()) < 0.05
    assert draws.var() == pytest.approx(noise.client_variance(10), rel=0.02)


# --- Through the ring --------------------------------------------------------------------------------


def run_pass(counts: list[np.ndarray], noises: list[np.ndarray | None], slack: int = 0) -> np.ndarray:
    """One PASS session on the complete graph, each client adding its noise vector (or none)."""
    num_classes = len(counts[0])
    server = PassServer(b"noise-test", num_classes, count_bound=1000, degree=len(counts) - 1)
    server.noise_slack = slack
    clients = {i: PassClient() for i in range(1, len(counts) + 1)}
    requests = server.advertise_requests(list(range(101, 101 + len(counts))))
    adverts = {i: clients[i].advertise(r, counts[i - 1]).to_record() for i, r in requests.items()}
    shares = {i: clients[i].share_keys(r).to_record() for i, r in server.receive_advertisements(adverts).items()}
    masked_requests = server.receive_shares(shares)
    masked = {i: clients[i].mask_input(r, noise=noises[i - 1]).to_record() for i, r in masked_requests.items()}
    unmask = {i: clients[i].unmask(r).to_record() for i, r in server.receive_masked(masked).items()}
    server.receive_unmask(unmask)
    return server.finish()


def test_the_roster_the_noise_is_sized_on_is_the_one_shown_at_share_keys() -> None:
    server = PassServer(b"noise-roster", 3, count_bound=1000, degree=3)
    clients = {i: PassClient() for i in range(1, 5)}
    requests = server.advertise_requests([101, 102, 103, 104])
    adverts = {i: clients[i].advertise(r, [1, 2, 3]).to_record() for i, r in requests.items()}
    with pytest.raises(PassError, match="U1 has not been shown"):
        _ = clients[1].participant_count
    for i, request in server.receive_advertisements(adverts).items():
        clients[i].share_keys(request)
    assert [client.participant_count for client in clients.values()] == [4, 4, 4, 4]


@given(
    st.lists(st.lists(st.integers(0, 1000), min_size=3, max_size=3), min_size=3, max_size=5),
    st.data(),
)
@settings(max_examples=15, deadline=None)
def test_the_sum_decodes_to_the_exact_counts_plus_the_summed_noise(counts: list[list[int]], data) -> None:  # type: ignore[no-untyped-def]
    """Masks cancel, noise does not: injected noise (any sign) comes out exactly, negative sums included."""
    noises = [np.asarray(data.draw(st.lists(st.integers(-5000, 5000), min_size=3, max_size=3))) for _ in counts]
    total = run_pass([np.asarray(c) for c in counts], noises, slack=5000 * len(counts))
    assert total.dtype == np.int64
    assert np.array_equal(total, np.sum(counts, axis=0) + np.sum(noises, axis=0))


def test_a_negative_sum_decodes_signed_and_a_sum_beyond_the_slack_is_refused() -> None:
    counts = [np.array([0, 5]), np.array([1, 0]), np.array([0, 0])]
    noises = [np.array([-10, 0]), np.array([0, 0]), np.array([-3, 2])]
    assert run_pass(counts, noises, slack=13).tolist() == [-12, 7]
    from flmarket_flwr.pass_protocol import PassError

    with pytest.raises(PassError, match="refused"):
        run_pass(counts, noises, slack=11)
    assert run_pass(counts, [None, None, None]).tolist() == [1, 5]


# --- The differencing attacks with noise on -------------------------------------------------------------


def noisy_app(counts: Mapping[int, np.ndarray], noise: SkellamNoise, ledgers: Path | None = None) -> ClientApp:
    """Market handlers adding ``noise``; with ``ledgers``, node ``n`` keeps a release ledger in ``ledgers/<n>``."""
    app = ClientApp()
    register_market_handlers(
        app,
        lambda context: counts[context.node_id],
        CostBasedBid(0.01),
        settings=lambda context: NodeSettings(
            noise=noise, release_ledger=ReleaseLedger(ledgers / str(context.node_id)) if ledgers else None
        ),
    )
    return app


def seeded(seed: int) -> SkellamNoise:
    """The recommended setting (epsilon 1, delta 1e-6, half honest) with a deterministic generator."""
    seeds = count(seed)
    return SkellamNoise(1.0, 1e-6, rng=lambda: np.random.default_rng(next(seeds)))


def market(  # type: ignore[no-untyped-def]
    counts: Mapping[int, np.ndarray], noise: SkellamNoise, run_id: int, ledgers: Path | None = None
):
    grid = InProcessGrid(noisy_app(counts, noise, ledgers), list(counts), run_id=run_id)
    return MarketPhase(market_config(noise=noise, budget=10**6)).run(grid)


def test_two_markets_differenced_no_longer_give_the_victims_counts() -> None:
    counts = make_counts(6, seed=11)
    victim = sorted(counts)[0]
    noise = seeded(100)
    with_victim = market(counts, noise, run_id=1)
    without = market({n: c for n, c in counts.items() if n != victim}, noise, run_id=2)
    difference = np.asarray(with_victim.global_counts) - np.asarray(without.global_counts)
    assert not np.array_equal(difference, counts[victim])
    assert with_victim.winners  # the market still selects


def test_three_runs_over_a_partition_no_longer_isolate_a_client(tmp_path: Path) -> None:
    """``test_adversarial_runs.py``'s attack, every node keeping a release ledger (which passes all three runs)."""
    counts = make_counts(7, seed=29)
    victim, *rest = sorted(counts)
    x, y = rest[:3], rest[3:]
    noise = seeded(200)
    first = market({n: counts[n] for n in x}, noise, run_id=1, ledgers=tmp_path)
    second = market({n: counts[n] for n in y}, noise, run_id=2, ledgers=tmp_path)
    third = market(counts, noise, run_id=3, ledgers=tmp_path)
    assert third.pass_participants == sorted(counts)  # the ledgers released all three sums
    difference = np.subtract(np.subtract(third.global_counts, first.global_counts), second.global_counts)
    assert not np.array_equal(difference, counts[victim])


def test_the_differencing_error_has_the_predicted_spread() -> None:
    """Over many two-run attacks (at the PASS level, no clipping): error variance = the two sums' noise."""
    counts = make_counts(6, seed=5, high=50)
    nodes = sorted(counts)
    noise = SkellamNoise(1.0, 1e-6, rng=lambda: generator)
    generator = np.random.default_rng(12)
    errors = []
    for _ in range(60):
        both = [noise.sample(NUM_CLASSES, 6) for _ in nodes]
        rest = [noise.sample(NUM_CLASSES, 5) for _ in nodes[1:]]
        with_victim = run_pass([counts[n] for n in nodes], both, slack=noise.tail_bound())
        without = run_pass([counts[n] for n in nodes[1:]], rest, slack=noise.tail_bound())
        errors.append(with_victim - without - counts[nodes[0]])
    errors_array = np.asarray(errors, dtype=float)
    predicted = 6 * noise.client_variance(6) + 5 * noise.client_variance(5)
    assert abs(errors_array.mean()) < 3 * math.sqrt(predicted / errors_array.size)
    assert errors_array.var() == pytest.approx(predicted, rel=0.2)
    assert np.mean(errors_array == 0) < 0.15  # a class recovered exactly now and then, by chance, never a vector


def test_a_noisy_market_runs_end_to_end_and_its_winners_pass_the_audit() -> None:
    counts = make_counts(8, seed=3, high=40)
    noise = seeded(300)
    outcome = market(counts, noise, run_id=1)
    exact = np.sum(list(counts.values()), axis=0)
    assert outcome.excluded == {}
    assert outcome.winners and set(outcome.audited) == set(outcome.winners)
    assert np.all(np.asarray(outcome.global_counts) >= 0)
    assert np.max(np.abs(np.asarray(outcome.global_counts) - exact)) <= noise.tail_bound()
    assert outcome.global_counts != exact.tolist()


def test_the_apps_clients_add_the_run_configs_noise_and_a_node_ceiling_refuses_a_larger_epsilon() -> None:
    """The Flower app path: ``pass-dp-epsilon`` in the run config; ``pass-dp-max-epsilon`` in a node's config."""
    from flmarket_flwr.app.client_app import build_client_app
    from flmarket_flwr.app.run_config import market_noise

    nodes = [101, 202, 303, 404, 505]
    configs = {node: {"partition-id": i, "num-partitions": len(nodes)} for i, node in enumerate(nodes)}

    def outcome(run_config: dict[str, float], ceiling: float = 0.0):  # type: ignore[no-untyped-def]
        node_configs = {node: dict(config) for node, config in configs.items()}
        node_configs[505]["pass-dp-max-epsilon"] = ceiling
        grid = InProcessGrid(build_client_app(run_config), nodes, node_configs=node_configs)
        noise = market_noise(run_config.get("pass-dp-epsilon", 0.0), 1e-6, 0.5)
        return MarketPhase(market_config(budget=10_000.0, noise=noise)).run(grid)

    exact = outcome({})
    noisy = outcome({"pass-dp-epsilon": 1.0})
    assert noisy.pass_participants == nodes and noisy.winners and not noisy.excluded
    assert noisy.global_counts != exact.global_counts
    deviation = np.abs(np.subtract(noisy.global_counts, exact.global_counts))
    assert deviation.max() <= SkellamNoise(1.0).tail_bound()
    refused = outcome({"pass-dp-epsilon": 1.0}, ceiling=0.5)
    assert 505 in refused.excluded and refused.excluded[505].startswith("market_advertise")
    assert refused.pass_participants == nodes[:-1]
    no_noise = outcome({}, ceiling=1.0)  # a run that announces no noise at all: refused by the same ceiling
    assert 505 in no_noise.excluded and no_noise.excluded[505].startswith("market_advertise")
    assert no_noise.pass_participants == nodes[:-1]
    assert not outcome({"pass-dp-epsilon": 1.0}, ceiling=1.0).excluded  # at the ceiling: taken part
    # Less noise at the same epsilon: a larger delta (13 times less variance at 0.9) or a roster assumed all honest
    # (half the variance per client). The ceiling is on the noise the node adds, so it refuses both.
    for weaker in ({"pass-dp-delta": 0.9}, {"pass-dp-honest-fraction": 1.0}):
        run_config = {"pass-dp-epsilon": 1.0, **weaker}
        assert market_noise(1.0, run_config.get("pass-dp-delta", 1e-6), 0.5) is not None
        refused = outcome(run_config, ceiling=1.0)
        assert 505 in refused.excluded and refused.excluded[505].startswith("market_advertise"), weaker


def test_a_noisy_market_with_a_client_dropping_at_the_mask_step_finishes_over_the_survivors() -> None:
    """The dropped client's masks are recovered from shares; its noise is simply not in the sum."""
    counts = make_counts(8, seed=4, high=60)
    leaver = sorted(counts)[2]
    noise = seeded(400)

    def drop(instruction, reply):  # type: ignore[no-untyped-def]
        dst, kind = instruction.metadata.dst_node_id, instruction.metadata.message_type
        return None if dst == leaver and kind == "query.market_mask" else reply

    grid = InProcessGrid(noisy_app(counts, noise), list(counts), reply_hook=drop)
    outcome = MarketPhase(market_config(noise=noise, budget=10**6, timeout=0.5)).run(grid)
    survivors = [n for n in counts if n != leaver]
    assert outcome.pass_participants == sorted(survivors) and outcome.winners
    exact = np.sum([counts[n] for n in survivors], axis=0)
    assert np.max(np.abs(np.asarray(outcome.global_counts) - exact)) <= noise.tail_bound()


@pytest.mark.parametrize("poison", [2**60, 2**63, 2**64 - 10**6])
def test_with_noise_on_a_poisoned_sum_is_still_refused_above_and_below(poison: int) -> None:
    """Signed decoding: a poison that wraps the class below zero is refused as surely as one far above."""
    from flmarket_flwr.market import MarketError

    counts = make_counts(6, seed=8)
    attacker = sorted(counts)[1]
    noise = seeded(500)

    def add_poison(instruction, reply):  # type: ignore[no-untyped-def]
        if instruction.metadata.dst_node_id == attacker and instruction.metadata.message_type == "query.market_mask":
            record = reply.content.config_records["flmarket"]
            words = np.frombuffer(record["masked_counts"], dtype="<u8").astype(np.uint64)
            with np.errstate(over="ignore"):  # the ring wraps, as the attacker means it to
                words[0] += np.uint64(poison)
            record["masked_counts"] = words.astype("<u8").tobytes()
        return reply

    grid = InProcessGrid(noisy_app(counts, noise), list(counts), reply_hook=add_poison)
    with pytest.raises(MarketError, match="exceeds count_bound"):
        MarketPhase(market_config(noise=noise, budget=10**6)).run(grid)


def test_the_server_apps_market_takes_the_noise_from_the_run_config() -> None:
    from flmarket_flwr.app.server_app import ServerSettings, data_config_of, market_config_of

    def noise_of(run_config: dict[str, float]) -> SkellamNoise | None:
        settings = ServerSettings.from_run_config(run_config)
        return market_config_of(settings, data_config_of(run_config), run_id=1).noise

    assert noise_of({}) is None
    assert noise_of({"pass-dp-epsilon": 2.0, "pass-dp-delta": 1e-7}) == SkellamNoise(2.0, 1e-7, 0.5)


# --- The noise's own claims, each played against the market (issue 21: docs/threat-model.md) -----------------


@dataclass(frozen=True)
class KeptNoise(SkellamNoise):
    """:class:`SkellamNoise` that keeps what each client drew (and, with ``fixed``, draws that value in every class)."""

    fixed: int | None = field(default=None, compare=False)
    drawn: list[tuple[int, np.ndarray]] = field(default_factory=list, compare=False, repr=False)

    def sample(self, num_classes: int, roster_size: int) -> npt.NDArray[np.int64]:
        if self.fixed is None:
            vector = super().sample(num_classes, roster_size)
        else:
            vector = np.full(num_classes, self.fixed, dtype=np.int64)
        self.drawn.append((roster_size, vector))
        return vector


def per_node_app(counts: Mapping[int, np.ndarray], noises: Mapping[int, SkellamNoise | None]) -> ClientApp:
    """Market handlers where node ``n`` adds ``noises[n]`` (``None``: no noise, as a server's sybil would)."""
    app = ClientApp()
    register_market_handlers(
        app,
        lambda context: counts[context.node_id],
        CostBasedBid(0.01),
        settings=lambda context: NodeSettings(noise=noises[context.node_id]),
    )
    return app


def test_the_noise_never_leaves_a_client_and_a_winners_audit_opens_its_exact_counts() -> None:
    """Every message the server got, but the audits, holds neither a client's noise nor its noisy counts."""
    from test_market_client import find_leaks, opened_counts

    counts = make_counts(6, seed=13)
    seeds = count(600)
    noises = {n: KeptNoise(1.0, rng=lambda: np.random.default_rng(next(seeds))) for n in counts}
    grid = InProcessGrid(per_node_app(counts, noises), list(counts))
    outcome = MarketPhase(market_config(noise=SkellamNoise(1.0), budget=10**6)).run(grid)
    assert all(len(noises[n].drawn) == 1 and np.any(noises[n].drawn[0][1]) for n in counts)
    drawn = {n: noises[n].drawn[0][1] for n in counts}
    assert find_leaks(grid, drawn, []) == []
    assert find_leaks(grid, {n: counts[n] + drawn[n] for n in counts}, []) == []
    opened = opened_counts(grid)  # the commitment binds the exact counts: that is what the audit opens and accepts
    assert outcome.winners and set(opened) == set(outcome.audited) == set(outcome.winners)
    assert all(opened[n] == [int(c) for c in counts[n]] for n in opened)


def test_the_server_decodes_a_negative_noisy_sum_signed_and_clips_it_at_zero_before_the_scores() -> None:
    """A class every client lacks comes out of PASS below zero (-76): N_s holds 0 there, and the market completes."""
    counts = make_counts(4, seed=14)
    for vector in counts.values():
        vector[0] = 0
    noises = {n: KeptNoise(1.0, fixed=-19) for n in counts}  # 4 x -19 = -76, within the 80 of the bound checks
    grid = InProcessGrid(per_node_app(counts, noises), list(counts))
    outcome = MarketPhase(market_config(noise=SkellamNoise(1.0), budget=10**6)).run(grid)
    exact = np.sum(list(counts.values()), axis=0)
    assert outcome.global_counts == np.maximum(exact - 76, 0).tolist() and outcome.global_counts[0] == 0
    assert outcome.winners and set(outcome.audited) == set(outcome.winners) and not outcome.excluded


def test_with_noise_the_bound_check_gives_a_poisoner_the_noises_tail_of_room() -> None:
    """The widened check (``count_bound * |U3|`` + tail) lets a poisoned class through up to the tail, no further."""
    from flmarket_flwr.market import MarketError

    counts = make_counts(5, seed=15)
    attacker = sorted(counts)[1]
    bound = 1000
    tail = SkellamNoise(1.0).tail_bound()
    exact = int(sum(c[0] for c in counts.values()))

    def poisoned(to: int, noise: SkellamNoise | None):  # type: ignore[no-untyped-def]
        def add(instruction, reply):  # type: ignore[no-untyped-def]
            if (
                instruction.metadata.dst_node_id == attacker
                and instruction.metadata.message_type == "query.market_mask"
            ):
                record = reply.content.config_records["flmarket"]
                words = np.frombuffer(record["masked_counts"], dtype="<u8").astype(np.uint64)
                words[0] += np.uint64(to - exact)
                record["masked_counts"] = words.astype("<u8").tobytes()
            return reply

        noises = {n: (KeptNoise(1.0, fixed=0) if noise else None) for n in counts}  # zero draws: N_s is exact
        grid = InProcessGrid(per_node_app(counts, noises), list(counts), reply_hook=add)
        return MarketPhase(market_config(noise=noise, count_bound=bound, budget=10**6)).run(grid)

    assert poisoned(bound * 5 + tail, SkellamNoise(1.0)).global_counts[0] == bound * 5 + tail
    with pytest.raises(MarketError, match="exceeds count_bound"):
        poisoned(bound * 5 + tail + 1, SkellamNoise(1.0))
    with pytest.raises(MarketError, match="exceeds count_bound"):
        poisoned(bound * 5 + 1, None)  # without noise the same class is refused one above the bound


def test_a_server_that_pads_the_roster_with_sybils_shrinks_each_honest_clients_noise() -> None:
    """Not prevented: each client sizes its noise on the roster U1 it is shown, sybils included.

    3 honest clients among 10 (7 the server's own, adding nothing) each add ``target / 5``: the honest noise in
    ``N_s`` is 3/5 of the target, below what epsilon 1 needs (the guarantee holds only while ``ceil(f |U1|)``
    honest clients survive).
    """
    counts = make_counts(10, seed=16)
    honest = sorted(counts)[:3]
    noises: dict[int, SkellamNoise | None] = {n: KeptNoise(1.0) if n in honest else None for n in counts}
    outcome = MarketPhase(market_config(noise=SkellamNoise(1.0), budget=10**6)).run(
        InProcessGrid(per_node_app(counts, noises), list(counts))
    )
    assert outcome.pass_participants == sorted(counts)
    kept = [noise for noise in noises.values() if isinstance(noise, KeptNoise)]
    assert [size for noise in kept for size, _ in noise.drawn] == [10, 10, 10]  # sized on |U1|, sybils counted
    honest_variance = sum(noise.client_variance(10) for noise in kept)
    assert honest_variance == pytest.approx(0.6 * SkellamNoise(1.0).target_variance)
    assert skellam_epsilon(honest_variance, 1e-6) > 1.2  # the release is no longer (1, 1e-6)-DP


def test_the_default_noise_is_seeded_from_the_operating_system(monkeypatch: pytest.MonkeyPatch) -> None:
    """No seed a server could know (partition id, run id): two clients' default draws differ; os.urandom decides."""
    import flmarket_flwr.pass_protocol.noise as noise_module

    noise = SkellamNoise(1.0)
    assert not np.array_equal(noise.sample(50, 4), noise.sample(50, 4))
    monkeypatch.setattr(noise_module.os, "urandom", lambda n: bytes(n))  # a fixed "OS" source: fixed draws
    assert np.array_equal(noise.sample(50, 4), noise.sample(50, 4))
