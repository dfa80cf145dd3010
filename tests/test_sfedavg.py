"""Tests of S-FedAvg: the Shapley estimator, relevance-weighted sampling and the Flower strategy.

The strategy runs over :class:`~simulations.inprocess_grid.InProcessGrid` (a real
``ClientApp`` per node, messages through Flower's wire format) with toy clients whose
"models" are plain numpy vectors: relevant clients move the model towards a target vector,
noisy clients add large random noise; the validation score rewards closeness to the target.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
from collections.abc import Callable, Iterable
from fractions import Fraction

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import Result
from hypothesis import given, settings
from hypothesis import strategies as st

from flmarket_flwr.app.models import DigitsCNN, get_arrays
from flmarket_flwr.app.task import evaluate
from simulations.apps import make_validation_fn
from simulations.baselines import (
    SFedAvg,
    estimate_shapley,
    sample_without_replacement,
    softmax,
)
from simulations.inprocess_grid import InProcessGrid

TARGET = np.linspace(-1.0, 1.0, 16)
NODES = list(range(101, 111))
NOISY = {101, 104, 107, 110}


@pytest.fixture(autouse=True)
def _quiet_flower() -> Iterable[None]:
    """Keep Flower's per-round INFO logs out of the test output."""
    logger = logging.getLogger("flwr")
    level = logger.level
    logger.setLevel(logging.WARNING)
    yield
    logger.setLevel(level)


# --- Toy clients and games -----------------------------------------------------------------------
def reply(msg: Message, vector: np.ndarray, num_examples: int) -> Message:
    """A train reply carrying ``vector`` as the model and its example count."""
    content = RecordDict(
        {
            "arrays": ArrayRecord({"w": Array(np.asarray(vector, dtype=np.float64))}),
            "metrics": MetricRecord({"num-examples": num_examples}),
        }
    )
    return Message(content=content, reply_to=msg)


def noisy_vs_relevant_app(noisy: set[int]) -> ClientApp:
    """Relevant nodes step halfway to ``TARGET``; noisy nodes add N(0, 1) noise."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context) -> Message:  # type: ignore[no-untyped-def]
        w = msg.content.array_records["arrays"]["w"].numpy()
        server_round = int(msg.content.config_records["config"]["server-round"])
        rng = np.random.default_rng([context.node_id, server_round])
        if context.node_id in noisy:
            new = w + rng.normal(0.0, 1.0, w.shape)
        else:
            new = w + 0.5 * (TARGET - w) + rng.normal(0.0, 0.02, w.shape)
        return reply(msg, new, 10)

    return app


def fixed_vector_app(vectors: dict[int, np.ndarray], examples: dict[int, int]) -> ClientApp:
    """Each node returns its fixed vector, whatever it receives."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context) -> Message:  # type: ignore[no-untyped-def]
        return reply(msg, vectors[context.node_id], examples[context.node_id])

    return app


def closeness(arrays: ArrayRecord) -> float:
    """Validation score in (0, 1]: ``1 / (1 + ||w - TARGET||)``."""
    return float(1.0 / (1.0 + np.linalg.norm(arrays["w"].numpy() - TARGET)))


def zeros(dim: int = 16) -> ArrayRecord:
    """Initial model: the zero vector."""
    return ArrayRecord({"w": Array(np.zeros(dim))})


def run(strategy: SFedAvg, app: ClientApp, nodes: list[int], rounds: int, dim: int = 16) -> Result:
    """Run ``strategy`` over an in-process grid of ``nodes``."""
    grid = InProcessGrid(app, nodes)
    return strategy.start(grid=grid, initial_arrays=zeros(dim), num_rounds=rounds)


def subset_shapley(players: list[int], v: Callable[[frozenset[int]], Fraction]) -> dict[int, Fraction]:
    """Exact Shapley values by the subset formula (independent of the permutation code)."""
    k = len(players)
    values = {}
    for i in players:
        others = [p for p in players if p != i]
        total = Fraction(0)
        for size in range(k):
            weight = Fraction(math.factorial(size) * math.factorial(k - size - 1), math.factorial(k))
            for coalition in itertools.combinations(others, size):
                s = frozenset(coalition)
                total += weight * (v(s | {i}) - v(s))
        values[i] = total
    return values


# --- The estimator -------------------------------------------------------------------------------
HAND_GAME = {
    frozenset(): 0.0,
    frozenset("a"): 0.40,
    frozenset("b"): 0.60,
    frozenset("c"): 0.80,
    frozenset("ab"): 0.70,
    frozenset("ac"): 0.75,
    frozenset("bc"): 0.85,
    frozenset("abc"): 0.90,
}


def test_exact_shapley_matches_hand_computation() -> None:
    """k = 3 with num_permutations >= 3! enumerates all orders: the hand-computed values.

    phi_a = 1/3 (0.40 - 0) + 1/6 (0.70 - 0.60) + 1/6 (0.75 - 0.80) + 1/3 (0.90 - 0.85) = 19/120
    phi_b = 1/3 (0.60 - 0) + 1/6 (0.70 - 0.40) + 1/6 (0.85 - 0.80) + 1/3 (0.90 - 0.75) = 37/120
    phi_c = 1/3 (0.80 - 0) + 1/6 (0.75 - 0.40) + 1/6 (0.85 - 0.60) + 1/3 (0.90 - 0.70) = 52/120
    """
    names = {0: "a", 1: "b", 2: "c"}

    def v(coalition: frozenset[int]) -> float:
        return HAND_GAME[frozenset(names[p] for p in coalition)]

    estimate = estimate_shapley([0, 1, 2], v, num_permutations=6)
    assert estimate.exact
    assert estimate.num_permutations == 6
    assert estimate.num_evaluations == 8
    assert estimate.values == pytest.approx({0: 19 / 120, 1: 37 / 120, 2: 52 / 120}, abs=1e-12)


def test_monte_carlo_below_enumeration_threshold() -> None:
    """With fewer permutations than k!, the estimate is Monte-Carlo, still efficient."""
    names = {0: "a", 1: "b", 2: "c"}
    estimate = estimate_shapley(
        [0, 1, 2],
        lambda s: HAND_GAME[frozenset(names[p] for p in s)],
        num_permutations=5,
        rng=np.random.default_rng(0),
    )
    assert not estimate.exact
    assert estimate.num_permutations == 5
    assert sum(estimate.values.values()) == pytest.approx(0.90)


@settings(max_examples=200, deadline=None)
@given(
    k=st.integers(1, 5),
    data=st.data(),
)
def test_enumeration_equals_subset_formula(k: int, data: st.DataObject) -> None:
    """For random games, enumerating k! orders equals the subset-formula Shapley value."""
    players = list(range(10, 10 + k))
    table = {
        frozenset(c): Fraction(data.draw(st.integers(-100, 100)), 100)
        for size in range(k + 1)
        for c in itertools.combinations(players, size)
    }
    estimate = estimate_shapley(players, lambda s: float(table[s]), num_permutations=math.factorial(k))
    expected = subset_shapley(players, lambda s: table[s])
    assert estimate.exact
    for player in players:
        assert estimate.values[player] == pytest.approx(float(expected[player]), abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(k=st.integers(2, 7), num_permutations=st.integers(1, 30), seed=st.integers(0, 2**32 - 1))
def test_monte_carlo_is_efficient_and_cached(k: int, num_permutations: int, seed: int) -> None:
    """Without truncation each order telescopes: values sum to v(N) - v(empty); no coalition twice."""
    players = list(range(k))
    weights = np.random.default_rng(seed).normal(size=k)
    calls: list[frozenset[int]] = []

    def v(coalition: frozenset[int]) -> float:
        calls.append(coalition)
        return float(np.tanh(sum(weights[p] for p in coalition)))

    estimate = estimate_shapley(players, v, num_permutations=num_permutations, rng=np.random.default_rng(seed))
    assert sum(estimate.values.values()) == pytest.approx(v(frozenset(players)) - v(frozenset()))
    calls = calls[:-2]  # the two calls above
    assert len(calls) == len(set(calls)) == estimate.num_evaluations
    assert estimate.num_evaluations <= min(estimate.num_permutations * (k - 1) + 2, 2**k)
    assert estimate.exact == (math.factorial(k) <= num_permutations)
    assert estimate.num_permutations == (math.factorial(k) if estimate.exact else num_permutations)


def test_null_and_symmetric_players() -> None:
    """A player that never changes the value gets 0; symmetric players get equal values."""

    def v(coalition: frozenset[int]) -> float:
        return float(len(coalition & {1, 2}) ** 2)  # player 3 is null, 1 and 2 symmetric

    estimate = estimate_shapley([1, 2, 3], v, num_permutations=6)
    assert estimate.values[3] == 0.0
    assert estimate.values[1] == pytest.approx(estimate.values[2]) == pytest.approx(2.0)


def test_truncation_skips_evaluations() -> None:
    """TMC: once a prefix is within tolerance of v(N), later players get 0 and are not evaluated."""
    players = list(range(8))

    def v(coalition: frozenset[int]) -> float:
        return 1.0 if coalition else 0.0  # the first player alone reaches v(N)

    plain = estimate_shapley(players, v, num_permutations=20, rng=np.random.default_rng(1))
    truncated = estimate_shapley(
        players, v, num_permutations=20, rng=np.random.default_rng(1), truncation_tolerance=0.01
    )
    assert plain.num_truncated == 0
    assert truncated.num_truncated == 20 * 7
    assert truncated.num_evaluations < plain.num_evaluations
    assert truncated.values == pytest.approx(plain.values)


def test_estimator_rejects_bad_input() -> None:
    """Duplicates, no permutations, negative tolerance and non-finite values are errors."""
    with pytest.raises(ValueError, match="distinct"):
        estimate_shapley([1, 1], lambda s: 0.0)
    with pytest.raises(ValueError, match="num_permutations"):
        estimate_shapley([1], lambda s: 0.0, num_permutations=0)
    with pytest.raises(ValueError, match="truncation_tolerance"):
        estimate_shapley([1], lambda s: 0.0, truncation_tolerance=-1.0)
    with pytest.raises(ValueError, match="not finite"):
        estimate_shapley([1, 2], lambda s: math.nan if s else 0.0)
    assert estimate_shapley([], lambda s: 0.0).values == {}


# --- Sampling ------------------------------------------------------------------------------------
def test_softmax_is_stable_and_shift_invariant() -> None:
    """Softmax of large values does not overflow; temperature sharpens."""
    probs = softmax(np.array([1000.0, 1001.0]))
    assert probs.sum() == pytest.approx(1.0)
    assert probs == pytest.approx(softmax(np.array([0.0, 1.0])))
    assert softmax(np.array([0.0, 1.0]), temperature=0.1)[1] > probs[1]


def test_sampling_follows_the_probabilities() -> None:
    """Single draws follow the probabilities; draws are distinct; underflow falls back to uniform."""
    rng = np.random.default_rng(0)
    probs = np.array([0.7, 0.2, 0.1])
    counts = np.bincount([sample_without_replacement(probs, 1, rng)[0] for _ in range(4000)], minlength=3)
    assert counts / 4000 == pytest.approx(probs, abs=0.03)
    assert sorted(sample_without_replacement(probs, 3, rng)) == [0, 1, 2]
    assert sorted(sample_without_replacement(np.array([1.0, 0.0, 0.0]), 2, rng))[0] == 0
    with pytest.raises(ValueError, match="distinct"):
        sample_without_replacement(probs, 4, rng)


# --- The strategy --------------------------------------------------------------------------------
def test_noisy_clients_lose_relevance() -> None:
    """With the paper's settings, every noisy node ends below every relevant node."""
    strategy = SFedAvg(closeness, num_train_nodes=5, seed=0, fraction_evaluate=0.0)
    run(strategy, noisy_vs_relevant_app(NOISY), NODES, rounds=30)
    relevance = strategy.relevance
    relevant = [n for n in NODES if n not in NOISY]
    assert max(relevance[n] for n in NOISY) < 0.0 < min(relevance[n] for n in relevant)
    noisy_sv = [r.shapley[n] for r in strategy.rounds for n in r.replied if n in NOISY]
    relevant_sv = [r.shapley[n] for r in strategy.rounds for n in r.replied if n not in NOISY]
    assert np.mean(noisy_sv) < 0.0 < np.mean(relevant_sv)
    assert np.mean(np.array(noisy_sv) < 0) > 0.8  # noisy updates almost always hurt


def test_noisy_clients_are_sampled_less() -> None:
    """With a sharper softmax, noisy nodes are soon rarely sampled and the model converges."""
    strategy = SFedAvg(closeness, num_train_nodes=5, seed=0, temperature=0.05, fraction_evaluate=0.0)
    result = run(strategy, noisy_vs_relevant_app(NOISY), NODES, rounds=30)
    late = range(11, 31)
    counts = {n: sum(n in strategy.selection_history[r] for r in late) for n in NODES}
    noisy_rate = np.mean([counts[n] for n in NOISY]) / len(late)
    relevant_rate = np.mean([counts[n] for n in NODES if n not in NOISY]) / len(late)
    assert noisy_rate < 0.25 < 0.6 < relevant_rate
    # Later rounds put more probability on relevant nodes than the first (uniform) round.
    first, last = strategy.rounds[0].probabilities, strategy.rounds[-1].probabilities
    assert sum(first[n] for n in NOISY) == pytest.approx(0.4)
    assert sum(last[n] for n in NOISY) < 0.1
    # FedAvg of the sampled (mostly relevant) nodes approaches the target.
    assert closeness(result.arrays) > 0.5


def test_plain_fedavg_sampling_would_not_converge_as_well() -> None:
    """Uniform sampling (a huge temperature) keeps noisy nodes in and ends farther from the target."""
    uniform = SFedAvg(closeness, num_train_nodes=5, seed=0, temperature=1e9, fraction_evaluate=0.0)
    sharp = SFedAvg(closeness, num_train_nodes=5, seed=0, temperature=0.05, fraction_evaluate=0.0)
    uniform_result = run(uniform, noisy_vs_relevant_app(NOISY), NODES, rounds=20)
    sharp_result = run(sharp, noisy_vs_relevant_app(NOISY), NODES, rounds=20)
    assert closeness(sharp_result.arrays) > closeness(uniform_result.arrays)


def test_exact_shapley_through_the_strategy() -> None:
    """One round with 3 nodes: exact Shapley values of the coalition game, and the relevance update.

    Nodes 1, 2, 3 return w = 1, 2, 4 with 1, 1, 2 examples; theta_1 = 0; v(w) = -|w - 3|.
    Coalition models (example-weighted means): {} 0, {1} 1, {2} 2, {3} 4, {1,2} 1.5,
    {1,3} 3, {2,3} 10/3, {1,2,3} 11/4; so v = -3, -2, -1, -1, -1.5, 0, -1/3, -1/4 and
    sv_1 = 4/9, sv_2 = 7/9, sv_3 = 55/36 (summing to v(N) - v({}) = 11/4).
    Relevance: 0.75 * 1/3 + 0.25 * sv.
    """
    vectors = {1: np.array([1.0]), 2: np.array([2.0]), 3: np.array([4.0])}
    examples = {1: 1, 2: 1, 3: 2}
    seen: list[float] = []

    def validation_fn(arrays: ArrayRecord) -> float:
        w = float(arrays["w"].numpy()[0])
        seen.append(w)
        return -abs(w - 3.0)

    strategy = SFedAvg(validation_fn, num_train_nodes=3, num_permutations=10, seed=0, fraction_evaluate=0.0)
    result = run(strategy, fixed_vector_app(vectors, examples), [1, 2, 3], rounds=1, dim=1)
    record = strategy.rounds[0]
    assert record.exact and record.num_permutations == 6
    assert record.shapley == pytest.approx({1: 4 / 9, 2: 7 / 9, 3: 55 / 36}, abs=1e-12)
    assert strategy.relevance_history[0] == pytest.approx({1: 1 / 3, 2: 1 / 3, 3: 1 / 3})
    expected = {n: 0.75 / 3 + 0.25 * sv for n, sv in {1: 4 / 9, 2: 7 / 9, 3: 55 / 36}.items()}
    assert strategy.relevance == pytest.approx(expected)
    assert strategy.relevance_history[1] == pytest.approx(expected)
    # The returned model is plain FedAvg of all replies.
    assert float(result.arrays["w"].numpy()[0]) == pytest.approx(11 / 4)
    # Coalition cache: 2**3 coalitions, each evaluated once.
    assert record.coalition_evaluations == 8
    assert sorted(seen) == pytest.approx(sorted([0.0, 1.0, 2.0, 4.0, 1.5, 3.0, 10 / 3, 11 / 4]))


def test_empty_coalition_value_option() -> None:
    """With v(empty) = 0 (the paper's convention) the values shift by v(theta_t) / k each."""
    vectors = {1: np.array([1.0]), 2: np.array([2.0]), 3: np.array([4.0])}
    examples = {1: 1, 2: 1, 3: 2}

    def validation_fn(arrays: ArrayRecord) -> float:
        return 10.0 - abs(float(arrays["w"].numpy()[0]) - 3.0)

    shifted = SFedAvg(validation_fn, num_train_nodes=3, empty_coalition_value=0.0, fraction_evaluate=0.0)
    run(shifted, fixed_vector_app(vectors, examples), [1, 2, 3], rounds=1, dim=1)
    record = shifted.rounds[0]
    assert record.coalition_evaluations == 7  # theta_t is not evaluated
    v_theta = 10.0 - 3.0
    expected = {1: 4 / 9 + v_theta / 3, 2: 7 / 9 + v_theta / 3, 3: 55 / 36 + v_theta / 3}
    assert record.shapley == pytest.approx(expected)


def test_coalition_cache_in_monte_carlo_rounds() -> None:
    """k = 5 and 10 permutations: no coalition model is evaluated twice in a round."""
    nodes = [1, 2, 3, 4, 5]
    vectors = {n: np.eye(5)[i] for i, n in enumerate(nodes)}  # each coalition has its own mean
    per_round: list[list[tuple[float, ...]]] = []

    def validation_fn(arrays: ArrayRecord) -> float:
        w = arrays["w"].numpy()
        per_round[-1].append(tuple(np.round(w, 9)))
        return float(-np.linalg.norm(w - 0.2))

    strategy = SFedAvg(validation_fn, num_train_nodes=5, num_permutations=10, seed=3, fraction_evaluate=0.0)
    grid = InProcessGrid(fixed_vector_app(vectors, dict.fromkeys(nodes, 1)), nodes)
    for server_round in (1, 2):
        per_round.append([])
        messages = list(strategy.configure_train(server_round, zeros(5), ConfigRecord(), grid))
        strategy.aggregate_train(server_round, grid.send_and_receive(messages))
    for calls, record in zip(per_round, strategy.rounds, strict=True):
        assert not record.exact and record.num_permutations == 10
        assert len(calls) == len(set(calls)) == record.coalition_evaluations
        assert record.coalition_evaluations <= 10 * (5 - 1) + 2


def test_sampling_is_reproducible_with_a_seed() -> None:
    """Same seed, same selections and relevance; another seed, other selections."""

    def histories(seed: int):  # type: ignore[no-untyped-def]
        strategy = SFedAvg(closeness, num_train_nodes=4, seed=seed, fraction_evaluate=0.0)
        run(strategy, noisy_vs_relevant_app(NOISY), NODES, rounds=8)
        return strategy.selection_history, strategy.relevance_history

    first, second, other = histories(7), histories(7), histories(8)
    assert first == second
    assert first[0] != other[0]
    assert all(len(sampled) == len(set(sampled)) == 4 for sampled in first[0].values())


def test_failed_and_disconnected_nodes() -> None:
    """A node that raises keeps its relevance; a disconnected node is never sampled."""
    inner = noisy_vs_relevant_app(set())
    app = ClientApp()

    @app.train()
    def train(msg: Message, context) -> Message:  # type: ignore[no-untyped-def]
        if context.node_id == 102:
            raise RuntimeError("boom")
        return inner(msg, context)

    grid = InProcessGrid(app, [101, 102, 103, 104])
    grid.connected = [101, 102, 103]
    strategy = SFedAvg(closeness, num_train_nodes=3, seed=0, fraction_evaluate=0.0, min_available_nodes=3)
    strategy.start(grid=grid, initial_arrays=zeros(), num_rounds=2)
    for record in strategy.rounds:
        assert sorted(record.sampled) == [101, 102, 103]
        assert record.replied == [101, 103]
        assert 104 not in record.probabilities
    assert strategy.relevance[102] == pytest.approx(1 / 3)
    assert strategy.relevance[101] != pytest.approx(1 / 3)


def test_waiting_for_nodes_is_bounded() -> None:
    """No node at all is an error after the bound; too few nodes proceed with those present."""
    grid = InProcessGrid(noisy_vs_relevant_app(set()), [1, 2, 3])
    grid.connected = []
    strategy = SFedAvg(closeness, num_train_nodes=2, wait_for_nodes_timeout=0.0, fraction_evaluate=0.0)
    with pytest.raises(RuntimeError, match="no node connected"):
        list(strategy.configure_train(1, zeros(), ConfigRecord(), grid))
    grid.connected = [2]
    messages = list(strategy.configure_train(1, zeros(), ConfigRecord(), grid))
    assert [m.metadata.dst_node_id for m in messages] == [2]


def test_federated_evaluation_does_not_wait_forever() -> None:
    """With fewer nodes than ``num_train_nodes``, both train and evaluate proceed after the bound."""
    grid = InProcessGrid(noisy_vs_relevant_app(set()), [1, 2, 3])
    strategy = SFedAvg(closeness, num_train_nodes=5, wait_for_nodes_timeout=0.0, seed=0)
    train = list(strategy.configure_train(1, zeros(), ConfigRecord(), grid))
    evaluate_messages = list(strategy.configure_evaluate(1, zeros(), ConfigRecord(), grid))
    assert sorted(m.metadata.dst_node_id for m in train) == [1, 2, 3]
    assert sorted(m.metadata.dst_node_id for m in evaluate_messages) == [1, 2, 3]
    assert all(m.metadata.message_type == "evaluate" for m in evaluate_messages)
    half = SFedAvg(closeness, num_train_nodes=2, fraction_evaluate=0.5, min_evaluate_nodes=1, seed=0)
    assert len(list(half.configure_evaluate(1, zeros(), ConfigRecord(), grid))) == 1


def test_history_is_json_ready() -> None:
    """``history()`` holds settings, per-round records and the relevance history, JSON-serialisable."""
    strategy = SFedAvg(closeness, num_train_nodes=3, seed=1, fraction_evaluate=0.0)
    run(strategy, noisy_vs_relevant_app(NOISY), NODES[:5], rounds=2)
    data = json.loads(json.dumps(strategy.history()))
    assert data["settings"]["beta"] == pytest.approx(0.25)
    assert [r["server_round"] for r in data["rounds"]] == [1, 2]
    assert set(data["relevance_history"]) == {"0", "1", "2"}
    assert data["rounds"][0]["valuation_time_s"] >= 0.0


def test_beta_and_alpha_settings() -> None:
    """``beta`` defaults to 1 - alpha_decay; invalid settings are clear errors."""
    assert SFedAvg(closeness, alpha_decay=0.9).beta == pytest.approx(0.1)
    assert SFedAvg(closeness, alpha_decay=0.75, beta=0.5).beta == 0.5
    for kwargs, match in [
        ({"num_train_nodes": 0}, "num_train_nodes"),
        ({"num_permutations": 0}, "num_permutations"),
        ({"alpha_decay": 0.0}, "alpha_decay"),
        ({"alpha_decay": 1.5}, "alpha_decay"),
        ({"beta": -0.1}, "beta"),
        ({"temperature": 0.0}, "temperature"),
        ({"truncation_tolerance": -1.0}, "truncation_tolerance"),
    ]:
        with pytest.raises(ValueError, match=match):
            SFedAvg(closeness, **kwargs)
    with pytest.raises(TypeError, match="callable"):
        SFedAvg("not a function")  # type: ignore[arg-type]


def test_make_validation_fn_scores_a_torch_model() -> None:
    """The helper loads the arrays into the model and returns its accuracy on the data."""
    torch.manual_seed(0)
    source, scratch = DigitsCNN(), DigitsCNN()
    data = (torch.rand(40, 1, 8, 8), torch.arange(40) % 10)
    validation_fn = make_validation_fn(scratch, data)
    accuracy = validation_fn(get_arrays(source))
    assert 0.0 <= accuracy <= 1.0
    assert accuracy == evaluate(source, data, torch.device("cpu"))[1]
    with pytest.raises(ValueError, match="empty"):
        make_validation_fn(scratch, (data[0][:0], data[1][:0]))
