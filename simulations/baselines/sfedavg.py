"""S-FedAvg: Shapley-value-based client sampling, the paper's in-training baseline, as a Flower strategy.

A reconstruction of Nagalapatti & Narayanam (AAAI 2021). :class:`SFedAvg` samples nodes by relevance, values each
round's replies with estimated Shapley values on a
server-side validation set (:func:`estimate_shapley`) and aggregates with FedAvg. The algorithm, the
estimator's cost and the deviations from the paper are in :class:`SFedAvg`.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords
from flwr.supercore import log

from flmarket_flwr.nodes import wait_for_nodes

__all__ = [
    "RelevanceSampler",
    "SFedAvg",
    "SFedAvgRound",
    "ShapleyEstimate",
    "estimate_shapley",
    "sample_without_replacement",
    "softmax",
]

ValidationFn = Callable[[ArrayRecord], float]
"""``arrays -> validation score`` (e.g. accuracy on a server-side validation set)."""


# --- Pure math -----------------------------------------------------------------------------------
def softmax(values: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Return ``softmax(values / temperature)``, computed stably.

    Parameters
    ----------
    values : numpy.ndarray
        One-dimensional, finite values.
    temperature : float (default: 1.0)
        Positive temperature; lower values sharpen the distribution.

    Returns
    -------
    numpy.ndarray
        Probabilities (non-negative, summing to 1).
    """
    scaled = np.asarray(values, dtype=np.float64) / temperature
    exps = np.exp(scaled - scaled.max())
    return exps / exps.sum()


def sample_without_replacement(probabilities: np.ndarray, size: int, rng: np.random.Generator) -> list[int]:
    """Draw ``size`` distinct indices by successive draws proportional to ``probabilities``.

    Each draw picks among the indices not drawn yet, with the given probabilities
    renormalised over them (uniformly if they all underflowed to 0).

    Parameters
    ----------
    probabilities : numpy.ndarray
        Non-negative weights, one per index.
    size : int
        Number of indices to draw, ``0 <= size <= len(probabilities)``.
    rng : numpy.random.Generator
        Source of randomness.

    Returns
    -------
    list[int]
        The drawn indices, in drawing order.
    """
    weights = np.asarray(probabilities, dtype=np.float64)
    if not 0 <= size <= len(weights):
        raise ValueError(f"cannot draw {size} distinct indices out of {len(weights)}")
    remaining = list(range(len(weights)))
    drawn: list[int] = []
    for _ in range(size):
        pool = weights[remaining]
        total = pool.sum()
        p = pool / total if total > 0 else np.full(len(remaining), 1.0 / len(remaining))
        drawn.append(remaining.pop(int(rng.choice(len(remaining), p=p))))
    return drawn


@dataclass(frozen=True)
class ShapleyEstimate:
    """Result of :func:`estimate_shapley`.

    Attributes
    ----------
    values : dict[int, float]
        Player -> estimated Shapley value.
    exact : bool
        ``True`` when all ``k!`` permutations were enumerated (no truncation).
    num_permutations : int
        Number of permutations walked.
    num_evaluations : int
        Number of distinct coalitions whose value was computed (calls of the value function).
    num_truncated : int
        Number of marginal contributions set to 0 by truncation.
    """

    values: dict[int, float]
    exact: bool
    num_permutations: int
    num_evaluations: int
    num_truncated: int


def _distinct_permutations(players: Sequence[int], count: int, rng: np.random.Generator) -> list[tuple[int, ...]]:
    """Draw ``count < len(players)!`` distinct uniformly random permutations of ``players``."""
    seen: set[tuple[int, ...]] = set()
    orders: list[tuple[int, ...]] = []
    while len(orders) < count:
        order = tuple(int(players[i]) for i in rng.permutation(len(players)))
        if order not in seen:
            seen.add(order)
            orders.append(order)
    return orders


def estimate_shapley(
    players: Sequence[int],
    value_fn: Callable[[frozenset[int]], float],
    *,
    num_permutations: int = 10,
    rng: np.random.Generator | None = None,
    truncation_tolerance: float = 0.0,
) -> ShapleyEstimate:
    """Estimate Shapley values by (truncated) Monte-Carlo permutation sampling.

    ``phi_i = E_pi[ v(pre_pi(i) | {i}) - v(pre_pi(i)) ]`` over uniformly random orders
    ``pi`` of the players, ``pre_pi(i)`` the players before ``i``. If
    ``len(players)! <= num_permutations`` every order is enumerated and the result is
    exact; otherwise ``num_permutations`` distinct random orders are averaged, each walk
    truncated (remaining contributions 0) once ``|v(N) - v(prefix)| <=
    truncation_tolerance * |v(N)|`` (Ghorbani & Zou 2019; ``0`` disables truncation).

    ``value_fn`` is called at most once per coalition (values are cached), so at most
    ``min(num_permutations * (k - 1) + 2, 2**k)`` times for ``k`` players.

    Parameters
    ----------
    players : Sequence[int]
        Distinct player ids.
    value_fn : Callable[[frozenset[int]], float]
        Characteristic function ``v``; called with the empty set too.
    num_permutations : int (default: 10)
        Number of sampled permutations (``R``), or the enumeration threshold.
    rng : numpy.random.Generator, optional
        Source of the permutations; a fresh unseeded one if ``None``.
    truncation_tolerance : float (default: 0.0)
        Relative truncation tolerance (ignored when enumerating exactly).

    Returns
    -------
    ShapleyEstimate
        The values and the estimator's cost.

    Raises
    ------
    ValueError
        On duplicate players, ``num_permutations < 1``, a negative tolerance, or a
        non-finite value from ``value_fn``.
    """
    ordered = [int(p) for p in players]
    if len(set(ordered)) != len(ordered):
        raise ValueError("players must be distinct")
    if num_permutations < 1:
        raise ValueError(f"num_permutations must be >= 1, got {num_permutations}")
    if truncation_tolerance < 0:
        raise ValueError(f"truncation_tolerance must be >= 0, got {truncation_tolerance}")
    if not ordered:
        return ShapleyEstimate({}, True, 0, 0, 0)

    cache: dict[frozenset[int], float] = {}

    def value(coalition: frozenset[int]) -> float:
        if coalition not in cache:
            result = float(value_fn(coalition))
            if not math.isfinite(result):
                raise ValueError(f"value of coalition {sorted(coalition)} is not finite: {result}")
            cache[coalition] = result
        return cache[coalition]

    exact = math.factorial(len(ordered)) <= num_permutations
    if exact:
        orders = list(itertools.permutations(sorted(ordered)))
        tolerance = 0.0
    else:
        orders = _distinct_permutations(ordered, num_permutations, rng or np.random.default_rng())
        tolerance = truncation_tolerance

    empty_value = value(frozenset())
    grand_value = value(frozenset(ordered)) if tolerance > 0 else math.nan
    totals = dict.fromkeys(ordered, 0.0)
    truncated = 0
    for order in orders:
        prefix: frozenset[int] = frozenset()
        previous = empty_value
        for position, player in enumerate(order):
            if tolerance > 0 and abs(grand_value - previous) <= tolerance * abs(grand_value):
                truncated += len(order) - position
                break
            prefix = prefix | {player}
            current = value(prefix)
            totals[player] += current - previous
            previous = current
    values = {player: total / len(orders) for player, total in totals.items()}
    return ShapleyEstimate(values, exact, len(orders), len(cache), truncated)


class RelevanceSampler:
    """S-FedAvg's per-client relevance: sampling by it, valuing a round's updates, updating it.

    Steps 1, 3 and 4 of the algorithm (:class:`SFedAvg`) without Flower, over any integer ids
    (:class:`SFedAvg` uses node ids; the sweeps' in-process engine uses partition ids).

    Parameters
    ----------
    num_permutations : int (default: 10)
        Monte-Carlo permutations per valuation (see :func:`estimate_shapley`).
    alpha_decay : float (default: 0.75)
        Weight of the past relevance.
    beta : float, optional
        Weight of the round's Shapley value; ``1 - alpha_decay`` if ``None``.
    temperature : float (default: 1.0)
        Softmax temperature of the sampling distribution.
    truncation_tolerance : float (default: 0.0)
        TMC truncation tolerance (0: none).
    initial_relevance : float, optional
        Relevance of an id seen for the first time; ``1 / K`` if ``None``, ``K`` the number of
        ids in the first call that registers any.
    sampling_seed, shapley_seed : numpy.random.SeedSequence or int, optional
        Seeds of the sampling and the permutation generators (unseeded if ``None``).
    """

    # pylint: disable=too-many-arguments
    def __init__(
        self,
        *,
        num_permutations: int = 10,
        alpha_decay: float = 0.75,
        beta: float | None = None,
        temperature: float = 1.0,
        truncation_tolerance: float = 0.0,
        initial_relevance: float | None = None,
        sampling_seed: np.random.SeedSequence | int | None = None,
        shapley_seed: np.random.SeedSequence | int | None = None,
    ) -> None:
        self.num_permutations = int(num_permutations)
        self.alpha_decay = float(alpha_decay)
        self.beta = 1.0 - self.alpha_decay if beta is None else float(beta)
        self.temperature = float(temperature)
        self.truncation_tolerance = float(truncation_tolerance)
        self.initial_relevance = initial_relevance
        self._sampling_rng = np.random.default_rng(sampling_seed)
        self._shapley_rng = np.random.default_rng(shapley_seed)
        self._relevance: dict[int, float] = {}
        self._initial_value: float | None = None

    @property
    def relevance(self) -> dict[int, float]:
        """Current relevance of every known id (a copy)."""
        return dict(self._relevance)

    def register(self, ids: Sequence[int]) -> None:
        """Give ids seen for the first time the initial relevance (fixed at the first call)."""
        new = [int(i) for i in ids if int(i) not in self._relevance]
        if not new:
            return
        if self._initial_value is None:
            initial = self.initial_relevance
            self._initial_value = float(initial) if initial is not None else 1.0 / len(ids)
        for i in new:
            self._relevance[i] = self._initial_value

    def probabilities(self, ids: Iterable[int]) -> dict[int, float]:
        """Return ``softmax(phi / temperature)`` over ``ids`` (sorted; unknown ids registered first)."""
        ordered = sorted({int(i) for i in ids})
        self.register(ordered)
        if not ordered:
            return {}
        probs = softmax(np.array([self._relevance[i] for i in ordered]), self.temperature)
        return dict(zip(ordered, (float(p) for p in probs), strict=True))

    def sample(self, probabilities: Mapping[int, float], size: int) -> list[int]:
        """Draw ``min(size, len(probabilities))`` distinct ids of ``probabilities``, in drawing order."""
        ids = list(probabilities)
        weights = np.array([probabilities[i] for i in ids])
        return [ids[index] for index in sample_without_replacement(weights, min(size, len(ids)), self._sampling_rng)]

    def estimate(self, players: Sequence[int], value_fn: Callable[[frozenset[int]], float]) -> ShapleyEstimate:
        """Estimate the players' Shapley values in the game ``value_fn`` (:func:`estimate_shapley`)."""
        self.register(players)
        return estimate_shapley(
            players,
            value_fn,
            num_permutations=self.num_permutations,
            rng=self._shapley_rng,
            truncation_tolerance=self.truncation_tolerance,
        )

    def update(self, shapley: Mapping[int, float]) -> None:
        """``phi_e <- alpha * phi_e + beta * sv_e`` for the valued ids."""
        for i, value in shapley.items():
            self._relevance[i] = self.alpha_decay * self._relevance[i] + self.beta * value


# --- Flower strategy -----------------------------------------------------------------------------
@dataclass
class SFedAvgRound:  # pylint: disable=too-many-instance-attributes
    """What :class:`SFedAvg` did in one round (for reports).

    Attributes
    ----------
    server_round : int
        The round.
    probabilities : dict[int, float]
        Sampling probability of every connected node (``softmax(phi / temperature)``).
    sampled : list[int]
        Nodes sent a training instruction, in drawing order.
    replied : list[int]
        Nodes whose reply was used (no error, in time), sorted.
    shapley : dict[int, float]
        Estimated Shapley value of each node in ``replied``.
    relevance : dict[int, float]
        Every known node's relevance after this round's update.
    exact : bool
        Whether the Shapley values were enumerated exactly.
    num_permutations : int
        Permutations walked.
    coalition_evaluations : int
        Calls of ``validation_fn`` this round (distinct coalitions, the empty one included
        unless ``empty_coalition_value`` is given).
    valuation_time_s : float
        Seconds spent valuing the replies (aggregations and ``validation_fn`` calls).
    """

    server_round: int
    probabilities: dict[int, float]
    sampled: list[int]
    replied: list[int] = field(default_factory=list)
    shapley: dict[int, float] = field(default_factory=dict)
    relevance: dict[int, float] = field(default_factory=dict)
    exact: bool = False
    num_permutations: int = 0
    coalition_evaluations: int = 0
    valuation_time_s: float = 0.0


# pylint: disable=too-many-instance-attributes
class SFedAvg(FedAvg):
    """Shapley-value-based Federated Averaging (Nagalapatti & Narayanam, AAAI 2021).

    Samples ``num_train_nodes`` nodes per round with probabilities ``softmax(phi /
    temperature)`` of their relevance ``phi``, aggregates their models with FedAvg, and
    updates the relevance of the nodes that replied with their estimated Shapley value in
    the round's coalition game (see the notes below for the algorithm, the
    estimator's cost and the deviations from the paper).

    Parameters
    ----------
    validation_fn : Callable[[ArrayRecord], float]
        Scores a model (given as the ``ArrayRecord`` FedAvg produces) on a server-side
        validation set, higher is better (the paper: accuracy). Called up to
        ``min(num_permutations * (k - 1) + 2, 2**k)`` times per round; see
        :func:`simulations.apps.make_validation_fn` for PyTorch models.
    num_train_nodes : int (default: 5)
        Nodes sampled for training each round (the paper's ``m``).
    num_permutations : int (default: 10)
        Monte-Carlo permutations per round (the paper's ``R``); if the ``k`` replying
        nodes have ``k! <= num_permutations``, the Shapley values are computed exactly.
    alpha_decay : float (default: 0.75)
        Weight ``alpha`` of the past relevance, in ``(0, 1]``.
    beta : float, optional
        Weight of the round's Shapley value; ``1 - alpha_decay`` if ``None`` (the paper:
        ``alpha = 0.75``, ``beta = 0.25``).
    temperature : float (default: 1.0)
        Softmax temperature of the sampling distribution (the paper: 1).
    truncation_tolerance : float (default: 0.0)
        TMC truncation tolerance (0: none, the paper's estimator).
    empty_coalition_value : float, optional
        ``v(empty)``; if ``None``, ``validation_fn`` of the round's global model.
    initial_relevance : float, optional
        Relevance of a node seen for the first time; ``1 / K`` if ``None`` (``K`` the
        number of nodes connected when the strategy first samples).
    seed : int, optional
        Seed of the training-sampling, permutation and evaluation-sampling generators
        (three independent streams).
    min_available_nodes : int, optional
        Nodes to wait for before sampling; ``num_train_nodes`` if ``None``.
    wait_for_nodes_timeout : float (default: 120.0)
        Seconds to wait for ``min_available_nodes``; after that, sample from those
        connected (at least one is needed, else ``RuntimeError``).
    fraction_evaluate, min_evaluate_nodes, weighted_by_key, arrayrecord_key,
    configrecord_key, train_metrics_aggr_fn, evaluate_metrics_aggr_fn
        As in :class:`flwr.serverapp.strategy.FedAvg`. Federated evaluation samples nodes
        uniformly as FedAvg does, but seeded and with the bounded wait.

    Attributes
    ----------
    rounds : list[SFedAvgRound]
        One record per training round.
    relevance_history : dict[int, dict[int, float]]
        Round -> every known node's relevance after it (``0``: initial values).
    selection_history : dict[int, list[int]]
        Round -> nodes sampled.

    Notes
    -----
    **The algorithm, round ``t``.**

    1. **Sample.** The server keeps a relevance value ``phi_e`` per node, initially uniform
       (``1 / K``, ``K`` the number of nodes when the strategy first sees them). It samples
       ``m = num_train_nodes`` distinct nodes with probabilities
       ``P_phi = softmax(phi / temperature)`` over the connected nodes (the paper: plain
       ``softmax(phi)``, i.e. ``temperature = 1``), by successive draws without replacement
       from a seeded ``numpy.random.Generator``.
    2. **Train.** The sampled nodes train locally and reply, as in FedAvg.
    3. **Value.** A cooperative game whose players are the replying nodes' updates: the
       value ``v(X)`` of a coalition ``X`` is ``validation_fn`` (accuracy on a server-side
       validation set) of the model obtained by FedAvg-averaging only the models of ``X``,
       weighted by their example counts; ``v(empty)`` is the value of the round's global
       model ``theta_t`` (the model "built from no update"). Each replying node's Shapley
       value ``sv_e`` is estimated with :func:`estimate_shapley`.
    4. **Update.** ``phi_e <- alpha * phi_e + beta * sv_e`` for every node that replied
       (paper: ``alpha = 0.75``, ``beta = 0.25``; here ``alpha_decay`` and
       ``beta = 1 - alpha_decay`` by default). Other nodes keep their value.
    5. **Aggregate.** The new global model is FedAvg over all replies (the grand coalition).

    **Estimator and cost.**

    Shapley values are estimated by permutation sampling with optional truncation
    (TMC-Shapley, Ghorbani & Zou 2019): for each of ``num_permutations`` distinct random
    orders of the ``k`` players, walk the order, add one player at a time and credit it with
    the change of ``v``; average over permutations. With ``truncation_tolerance > 0`` a walk
    stops evaluating once ``|v(N) - v(prefix)| <= truncation_tolerance * |v(N)|`` and credits
    the remaining players with 0 (Ghorbani & Zou's truncation, a biased speed-up); with the
    default ``0`` nothing is truncated, which is the plain Monte-Carlo estimator of S-FedAvg's
    Algorithm 2 (Castro et al. 2009). Each coalition's value is cached for the round, so the
    cost is at most ``min(num_permutations * (k - 1) + 2, 2**k)`` calls of ``validation_fn``
    (each on one aggregation of at most ``k`` models) per round, on top of FedAvg. When
    ``k! <= num_permutations`` all ``k!`` orders are enumerated instead (no truncation) and the
    values are **exact**; the cache then makes that cost exactly ``2**k`` evaluations.

    **Deviations from the paper, and choices where it is silent.**

    * Coalition models average the coalition's models weighted by example counts,
      renormalised within the coalition (the paper's Eq. 4 is not recoverable from its text;
      this is the FedAvg model the coalition alone would have produced).
    * ``v(empty)`` is the accuracy of ``theta_t``; pass ``empty_coalition_value=0.0`` for the
      preliminaries' convention ``v(empty) = 0``. The choice shifts every ``sv_e`` of a round
      by the same ``v(empty) / k``.
    * The permutations are distinct (the paper samples "a set of R permutations"); exact
      enumeration when ``k! <= num_permutations`` is an addition.
    * Nodes that fail or time out keep their relevance (the paper assumes every sampled client
      replies). The global step is FedAvg (server learning rate 1).
    * Sampling is over the nodes connected at the time, so nodes may join or leave; a node
      seen for the first time starts at ``initial_relevance`` (default ``1 / K`` as above).
    """

    # pylint: disable=too-many-arguments,too-many-locals
    def __init__(
        self,
        validation_fn: ValidationFn,
        *,
        num_train_nodes: int = 5,
        num_permutations: int = 10,
        alpha_decay: float = 0.75,
        beta: float | None = None,
        temperature: float = 1.0,
        truncation_tolerance: float = 0.0,
        empty_coalition_value: float | None = None,
        initial_relevance: float | None = None,
        seed: int | None = None,
        min_available_nodes: int | None = None,
        wait_for_nodes_timeout: float = 120.0,
        fraction_evaluate: float = 1.0,
        min_evaluate_nodes: int = 2,
        weighted_by_key: str = "num-examples",
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
        train_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None,
        evaluate_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None,
    ) -> None:
        _check_settings(
            validation_fn,
            num_train_nodes,
            num_permutations,
            alpha_decay,
            beta,
            temperature,
            truncation_tolerance,
            wait_for_nodes_timeout,
        )
        available = num_train_nodes if min_available_nodes is None else int(min_available_nodes)
        super().__init__(
            fraction_train=1.0,
            fraction_evaluate=fraction_evaluate,
            min_train_nodes=num_train_nodes,
            min_evaluate_nodes=min_evaluate_nodes,
            min_available_nodes=available,
            weighted_by_key=weighted_by_key,
            arrayrecord_key=arrayrecord_key,
            configrecord_key=configrecord_key,
            train_metrics_aggr_fn=train_metrics_aggr_fn,
            evaluate_metrics_aggr_fn=evaluate_metrics_aggr_fn,
        )
        self.validation_fn = validation_fn
        self.num_train_nodes = int(num_train_nodes)
        self.empty_coalition_value = empty_coalition_value
        self.wait_for_nodes_timeout = float(wait_for_nodes_timeout)
        self.seed = seed
        sampling_seed, shapley_seed, evaluate_seed = np.random.SeedSequence(seed).spawn(3)
        self.sampler = RelevanceSampler(
            num_permutations=num_permutations,
            alpha_decay=alpha_decay,
            beta=beta,
            temperature=temperature,
            truncation_tolerance=truncation_tolerance,
            initial_relevance=initial_relevance,
            sampling_seed=sampling_seed,
            shapley_seed=shapley_seed,
        )
        self._evaluate_rng = np.random.default_rng(evaluate_seed)
        self._round_arrays: ArrayRecord | None = None
        self.rounds: list[SFedAvgRound] = []
        self.relevance_history: dict[int, dict[int, float]] = {}
        self.selection_history: dict[int, list[int]] = {}

    # --- Reporting -----------------------------------------------------------------------------
    @property
    def relevance(self) -> dict[int, float]:
        """Current relevance of every known node (a copy)."""
        return self.sampler.relevance

    @property
    def num_permutations(self) -> int:
        """Monte-Carlo permutations per round."""
        return self.sampler.num_permutations

    @property
    def alpha_decay(self) -> float:
        """Weight of the past relevance."""
        return self.sampler.alpha_decay

    @property
    def beta(self) -> float:
        """Weight of the round's Shapley value."""
        return self.sampler.beta

    @property
    def temperature(self) -> float:
        """Softmax temperature of the sampling distribution."""
        return self.sampler.temperature

    @property
    def truncation_tolerance(self) -> float:
        """TMC truncation tolerance."""
        return self.sampler.truncation_tolerance

    def history(self) -> dict[str, Any]:
        """Return the strategy's settings and per-round records as JSON-ready data."""
        settings = {
            "num_train_nodes": self.num_train_nodes,
            "num_permutations": self.num_permutations,
            "alpha_decay": self.alpha_decay,
            "beta": self.beta,
            "temperature": self.temperature,
            "truncation_tolerance": self.truncation_tolerance,
            "empty_coalition_value": self.empty_coalition_value,
            "seed": self.seed,
        }
        return {
            "settings": settings,
            "rounds": [_json_round(record) for record in self.rounds],
            "relevance_history": {
                str(rnd): {str(node): value for node, value in values.items()}
                for rnd, values in self.relevance_history.items()
            },
        }

    def summary(self) -> None:
        """Log summary configuration of the strategy."""
        log(INFO, "\t├──> S-FedAvg (Shapley-valued client sampling):")
        log(INFO, "\t│\t├── Nodes sampled per round: %d", self.num_train_nodes)
        log(
            INFO,
            "\t│\t├── Permutations: %d | truncation tolerance: %g",
            self.num_permutations,
            self.truncation_tolerance,
        )
        log(
            INFO,
            "\t│\t├── Relevance update: phi <- %g * phi + %g * sv",
            self.alpha_decay,
            self.beta,
        )
        log(INFO, "\t│\t└── Softmax temperature: %g | seed: %s", self.temperature, self.seed)
        super().summary()

    # --- Sampling ------------------------------------------------------------------------------
    def sampling_probabilities(self, node_ids: Iterable[int]) -> dict[int, float]:
        """Return ``softmax(phi / temperature)`` over ``node_ids`` (unknown nodes get the initial value)."""
        return self.sampler.probabilities(node_ids)

    def _wait_for_nodes(self, grid: Grid) -> list[int]:
        """Wait, at most ``wait_for_nodes_timeout`` s, for ``min_available_nodes`` nodes."""
        nodes = wait_for_nodes(grid, self.min_available_nodes, self.wait_for_nodes_timeout, who="S-FedAvg")
        if len(nodes) >= self.min_available_nodes:
            return nodes
        if not nodes:
            raise RuntimeError(f"S-FedAvg: no node connected after {self.wait_for_nodes_timeout:g} s")
        log(
            WARNING,
            "S-FedAvg: only %d of %d nodes connected after %g s; sampling from those.",
            len(nodes),
            self.min_available_nodes,
            self.wait_for_nodes_timeout,
        )
        return nodes

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Sample nodes by relevance and configure the next round of training."""
        nodes = self._wait_for_nodes(grid)
        if not self.relevance_history:
            self.sampler.register(nodes)
            self.relevance_history[0] = self.sampler.relevance
        probabilities = self.sampling_probabilities(nodes)
        sampled = self.sampler.sample(probabilities, self.num_train_nodes)
        log(
            INFO,
            "configure_train: S-FedAvg sampled %s nodes (out of %s): %s",
            len(sampled),
            len(nodes),
            sampled,
        )
        self._round_arrays = arrays
        self.selection_history[server_round] = list(sampled)
        self.rounds.append(SFedAvgRound(server_round, probabilities, list(sampled)))

        config["server-round"] = server_round
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        return self._construct_messages(record, sampled, MessageType.TRAIN)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Configure federated evaluation on uniformly sampled nodes (seeded, bounded wait).

        As FedAvg (``max(int(fraction_evaluate * n), min_evaluate_nodes)`` nodes, at most the
        ``n`` connected), but drawn from this strategy's seeded generator and without
        FedAvg's unbounded wait for ``min_available_nodes``.
        """
        if self.fraction_evaluate == 0.0:
            return []
        nodes = self._wait_for_nodes(grid)
        size = min(max(int(len(nodes) * self.fraction_evaluate), self.min_evaluate_nodes), len(nodes))
        sampled = sorted(int(node) for node in self._evaluate_rng.choice(nodes, size=size, replace=False))
        log(INFO, "configure_evaluate: Sampled %s nodes (out of %s)", len(sampled), len(nodes))
        config["server-round"] = server_round
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        return self._construct_messages(record, sampled, MessageType.EVALUATE)

    # --- Aggregation and valuation -------------------------------------------------------------
    def aggregate_train(
        self,
        server_round: int,
        replies: Iterable[Message],
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Aggregate with FedAvg, then value the replying nodes and update their relevance."""
        replies = list(replies)
        arrays, metrics = super().aggregate_train(server_round, replies)
        record = self._round_record(server_round)
        if arrays is not None:
            contents = _contents_by_node(replies)
            started = time.perf_counter()
            estimate, evaluations = self._estimate(contents, arrays)
            record.valuation_time_s = time.perf_counter() - started
            self.sampler.update(estimate.values)
            record.replied = sorted(contents)
            record.shapley = dict(estimate.values)
            record.exact = estimate.exact
            record.num_permutations = estimate.num_permutations
            record.coalition_evaluations = evaluations
            log(
                INFO,
                "aggregate_train: S-FedAvg Shapley values (%s, %d evaluations, %.2fs): %s",
                "exact" if estimate.exact else f"{estimate.num_permutations} permutations",
                evaluations,
                record.valuation_time_s,
                {node: round(value, 4) for node, value in sorted(estimate.values.items())},
            )
        record.relevance = self.sampler.relevance
        self.relevance_history[server_round] = self.sampler.relevance
        return arrays, metrics

    def _round_record(self, server_round: int) -> SFedAvgRound:
        """Return this round's record (made here if ``configure_train`` was bypassed)."""
        if self.rounds and self.rounds[-1].server_round == server_round:
            return self.rounds[-1]
        record = SFedAvgRound(server_round, {}, list(self.selection_history.get(server_round, [])))
        self.rounds.append(record)
        return record

    def _estimate(self, contents: Mapping[int, RecordDict], grand_arrays: ArrayRecord) -> tuple[ShapleyEstimate, int]:
        """Estimate the Shapley values of the replying nodes; also return the evaluations made."""
        players = sorted(contents)
        grand = frozenset(players)
        calls = 0

        def value(coalition: frozenset[int]) -> float:
            nonlocal calls
            if not coalition:
                if self.empty_coalition_value is not None:
                    return float(self.empty_coalition_value)
                if self._round_arrays is None:
                    raise RuntimeError("S-FedAvg: no global model for this round (configure_train not run)")
                model = self._round_arrays
            elif coalition == grand:
                model = grand_arrays
            else:
                model = aggregate_arrayrecords([contents[node] for node in sorted(coalition)], self.weighted_by_key)
            calls += 1
            return float(self.validation_fn(model))

        return self.sampler.estimate(players, value), calls


# --- Helpers -------------------------------------------------------------------------------------
def _check_settings(  # pylint: disable=too-many-arguments,too-many-positional-arguments
    validation_fn: object,
    num_train_nodes: int,
    num_permutations: int,
    alpha_decay: float,
    beta: float | None,
    temperature: float,
    truncation_tolerance: float,
    wait_for_nodes_timeout: float,
) -> None:
    """Raise a clear error for an invalid :class:`SFedAvg` setting."""
    if not callable(validation_fn):
        raise TypeError("validation_fn must be callable: ArrayRecord -> float")
    if num_train_nodes < 1:
        raise ValueError(f"num_train_nodes must be >= 1, got {num_train_nodes}")
    if num_permutations < 1:
        raise ValueError(f"num_permutations must be >= 1, got {num_permutations}")
    if not 0.0 < alpha_decay <= 1.0:
        raise ValueError(f"alpha_decay must be in (0, 1], got {alpha_decay}")
    if beta is not None and not (math.isfinite(beta) and beta >= 0.0):
        raise ValueError(f"beta must be finite and >= 0, got {beta}")
    if not (math.isfinite(temperature) and temperature > 0.0):
        raise ValueError(f"temperature must be finite and > 0, got {temperature}")
    if not truncation_tolerance >= 0.0:
        raise ValueError(f"truncation_tolerance must be >= 0, got {truncation_tolerance}")
    if not wait_for_nodes_timeout >= 0.0:
        raise ValueError(f"wait_for_nodes_timeout must be >= 0, got {wait_for_nodes_timeout}")


def _contents_by_node(replies: Sequence[Message]) -> dict[int, RecordDict]:
    """Map each node with a valid reply to the reply's content (first reply wins)."""
    contents: dict[int, RecordDict] = {}
    for reply in replies:
        if not reply.has_error():
            contents.setdefault(int(reply.metadata.src_node_id), reply.content)
    return contents


def _json_round(record: SFedAvgRound) -> dict[str, Any]:
    """A round record with string keys, ready for ``json.dump``."""
    data = asdict(record)
    for key in ("probabilities", "shapley", "relevance"):
        data[key] = {str(node): value for node, value in data[key].items()}
    return data
