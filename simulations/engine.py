"""In-process engine for sweeps: the Flower app's selection and training code, without the message layer.

One job = partition, selection, then FedAvg rounds on the selected clients, all in this process:

* **Selection** calls :mod:`flmarket_flwr.pricing` directly: FLMarket is the product's one rule,
  :func:`~flmarket_flwr.pricing.run_auction` on :func:`~simulations.baselines.selectors.flmarket_scores`
  (``num_selected`` a cohort cap, ``0`` for the budget alone; the budget from :func:`auction_budget`, e.g. a
  fixed fraction of the total bid), where PASS's
  output is replaced by the plain sum of the clients' label counts (PASS returns exactly that sum,
  mod 2^64, see ``tests/test_pass_protocol.py``); RS, QBS, DICE and DDS are ``select_clients`` (in the budget
  mode, ``num_selected=0`` with ``budget_fraction``, as many clients as FLMarket buys on the same partition).
  ``market="protocol"`` runs FLMarket's real market phase instead (:class:`~flmarket_flwr.market.MarketPhase`:
  PASS, the clients' own scores and bids, the auction) over an in-process Grid of market clients, and its
  time counts as selection time: the run time to compare with S-FedAvg.
* **Training** is FedAvg: each selected client trains a copy of the global model, the server averages
  the weights by sample count the way ``flwr.serverapp.strategy.FedAvg`` does (float32 arrays, weights
  ``n_e / sum n``). **S-FedAvg** (``selector="sfedavg"``, the in-training baseline) instead samples
  ``num_selected`` of all clients every round with the strategy's own
  :class:`~simulations.baselines.RelevanceSampler` (seeded as :class:`~simulations.baselines.SFedAvg`
  with ``seed``), values the round's updates on the server's validation split (``val_per_class``) and
  updates their relevance, exactly as the Flower strategy does. Local training is
  ``flmarket_flwr.app.task.train``: whole epochs (``local_steps=0``, the Flower app's protocol, bit-for-bit its
  train handler) or a fixed number of steps with gradient-norm clipping (its ``steps`` and ``clip_norm``).
* **Protocol**: accuracy on the held-out test set after every round; final accuracy = mean of the last
  ``final_window`` rounds; ``auc_accuracy`` = mean accuracy over all rounds run (the area under the
  accuracy curve per round, the endpoint of a fixed round budget); plateau criterion: that mean minus the mean
  of the ``final_window`` rounds before it, within ``plateau_tolerance``; a run whose weights or loss turn
  non-finite is stopped and marked ``diverged`` (final accuracy NaN), one that falls more than ``collapse_drop``
  below its best window is marked ``collapsed``: both are counted by :mod:`simulations.stats`, never averaged in.
* **Paired seeds**: ``seed`` fixes the partition, the initial model, RS's draw and the mini-batch order,
  identically for every selector. Bids (``bid_policy``): ``volume`` (primary: ``c N_e (1 + markup)`` at
  one shared per-sample cost ``c``), ``constant`` (every client bids 1) or ``random`` (the Flower app's
  per-client costs, :func:`~flmarket_flwr.market.simulated_cost_per_sample`).

:func:`run_job_inprocess` takes a Hydra job config (``conf/``, with ``engine=inprocess``) and returns
the ``result.json`` record of :func:`simulations.run.summarize`; ``python -m simulations.engine`` runs a
resumable grid of jobs (see :func:`main`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from flmarket_flwr.app import task
from flmarket_flwr.app.run_config import field_name, neighbours_of
from flmarket_flwr.app.task import DEFAULT_NUM_CLIENTS, DataConfig
from flmarket_flwr.market.node.bidding import cost_based_bid, simulated_cost_per_sample
from flmarket_flwr.pricing import cohort_budget, run_auction
from simulations.baselines.selectors import (
    DDS_DIVERSITY_WEIGHT,
    DICE_VOLUME_WEIGHT,
    flmarket_scores,
    select_clients,
    select_within_budget,
)
from simulations.record import job_record
from simulations.run_config import ENGINE_APP_KEYS, EXPERIMENT_SCHEMA, ROUNDS_KEY, SWEEP_DEFAULTS
from simulations.settings_fields import EngineFields

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = [
    "BASELINE_MATCHES",
    "BID_POLICIES",
    "MARKET_MODES",
    "EngineConfig",
    "Federation",
    "ShapleyCohort",
    "auc_accuracy",
    "auction_budget",
    "bids_for",
    "data_config",
    "fedavg",
    "load_federation",
    "main",
    "run_engine",
    "run_job_inprocess",
    "run_market_protocol",
    "run_on_ray",
    "rerun",
    "same_curve",
    "select",
]

BID_POLICIES = ("volume", "constant", "random")
"""Bid policies: shared per-sample cost (primary), constant bids, per-client random costs."""

BASELINE_MATCHES = ("cohort", "budget")
"""How a baseline in the budget mode is matched to FLMarket: as many clients as its auction buys (the paper's
question), or what the same budget ``R`` buys at the same bids, pay-as-bid (the buyer's question)."""

MARKET_MODES = ("direct", "protocol")
"""FLMarket's selection: the pricing functions directly, or the real market phase over an in-process Grid."""

MARKET_NODE_BASE = 1_000
"""Node id of partition 0 in the in-process market (node ids must be non-zero)."""

TensorPair = tuple["torch.Tensor", "torch.Tensor"]


ENGINE_IGNORES = frozenset(
    {"market-timeout", "wait-for-nodes-timeout", "round-timeout", "results-dir", "run-name", "train-log-dir"}
)
"""Run-config keys with no meaning in process (timeouts, output folders): a Hydra job may set them freely."""


JOB_IDENTITY = ("selector", "dataset", "model", "distribution", "num_clients", "num_selected", "seed")
"""The fields that name a job in its record."""


@dataclass(frozen=True)
class EngineConfig(EngineFields):
    """One in-process job.

    A field per run-config key of :data:`ENGINE_APP_KEYS`, its type, default (but :data:`SWEEP_DEFAULTS`) and check
    the experiments' schema's (:data:`~simulations.run_config.EXPERIMENT_SCHEMA`: the app's keys and ``selector``,
    ``val-per-class``), and ``rounds`` (:data:`ROUNDS_KEY`); the others are the engine's own protocol.

    Attributes
    ----------
    dataset, data_root, test_per_class, val_per_class, model
        Data set (registry name), its folder, held-out sizes and the model, as in the app's run config.
    num_clients, distribution, schedule, alpha, seed
        Federation: ``E``, global distribution ``d1..d7``, pruning schedule, Dirichlet concentration, seed.
    selector, num_selected, budget
        Selector name; cohort size (``0``: FLMarket's budget-driven auction, and a baseline takes as many
        clients as that auction buys, which needs ``budget_fraction``; S-FedAvg: clients sampled per round);
        auction budget ``R`` (``> 0``, the app's ``budget``).
    budget_fraction
        ``> 0``: the auction's budget is this fraction of the sum of all clients' bids, fixed before selection
        (it takes precedence over ``budget`` and ``cohort_budget``); ``0``: not used.
    neighbours, audit_winners
        The PASS graph and the winners' audit of ``market="protocol"`` (app keys).
    baseline_match
        A baseline with ``num_selected=0``: ``"cohort"``, as many clients as FLMarket's auction buys on the same
        partition; ``"budget"``, the clients its own order buys within the same budget ``R`` at the same bids,
        each paid its bid (:func:`~simulations.baselines.selectors.select_within_budget`). See
        :data:`BASELINE_MATCHES`.
    cohort_budget
        With a cohort (``num_selected > 0``), run FLMarket's auction at the least budget that buys it instead of
        ``budget`` (:func:`auction_budget`): comparisons at equal cohort size. ``False``: at ``budget``.
    market
        FLMarket's selection: ``"direct"`` (the pricing functions on the plain sum of the counts) or
        ``"protocol"`` (the real market phase over an in-process Grid, timed; see the module docstring).
    dice_volume_weight, dds_diversity_weight
        The weights of our DICE and DDS reconstructions (their sensitivity is part of the comparison).
    bid_policy, cost_per_sample, cost_low, cost_high, bid_markup
        How clients bid (see :data:`BID_POLICIES`).
    rounds, min_rounds, local_steps, local_epochs, batch_size, learning_rate, momentum, clip_norm
        FedAvg rounds (at most, when ``min_rounds`` > 0: the run stops at the first round from
        ``min_rounds`` on where the plateau criterion holds); local SGD steps per round (``0``:
        ``local_epochs`` whole epochs); batch size, learning rate, momentum; gradient-norm clipping
        (``0``: none).
    final_window, plateau_tolerance, collapse_drop
        Final accuracy window, plateau criterion and collapse threshold (see the module docstring).
    device, torch_threads
        Torch device and intra-op threads.
    """

    num_clients: int = DEFAULT_NUM_CLIENTS
    budget_fraction: float = 0.0
    cohort_budget: bool = True
    baseline_match: str = "cohort"
    market: str = "direct"
    dice_volume_weight: float = DICE_VOLUME_WEIGHT
    dds_diversity_weight: float = DDS_DIVERSITY_WEIGHT
    bid_policy: str = "volume"
    cost_per_sample: float = 1.0
    rounds: int = int(SWEEP_DEFAULTS[ROUNDS_KEY])
    min_rounds: int = 0
    local_steps: int = 20
    clip_norm: float = 5.0
    final_window: int = 10
    plateau_tolerance: float = 0.01
    collapse_drop: float = 0.3

    def check(self) -> None:
        """Reject settings the engine cannot run (the run-config keys by the schema's checks); run at construction."""
        keys = {key: getattr(self, field_name(key)) for key in ENGINE_APP_KEYS}
        EXPERIMENT_SCHEMA.check_values(keys | {ROUNDS_KEY: self.rounds})
        if self.bid_policy not in BID_POLICIES:
            raise ValueError(f"bid_policy must be one of {BID_POLICIES}, got {self.bid_policy!r}")
        if self.selector == "sfedavg" and self.val_per_class < 1:
            raise ValueError("S-FedAvg values clients on a validation split: set val_per_class >= 1")
        if self.baseline_match not in BASELINE_MATCHES:
            raise ValueError(f"baseline_match must be one of {BASELINE_MATCHES}, got {self.baseline_match!r}")
        if self.baseline_match == "budget" and self.num_selected:
            raise ValueError("baseline_match='budget' buys within the budget alone: set num_selected=0")
        if self.market not in MARKET_MODES:
            raise ValueError(f"market must be one of {MARKET_MODES}, got {self.market!r}")
        if self.market == "protocol" and self.bid_policy == "random":
            raise ValueError("market='protocol' runs the clients' bid policies: use bid_policy volume or constant")
        if not (math.isfinite(self.budget_fraction) and self.budget_fraction >= 0):
            raise ValueError(f"budget_fraction must be finite and >= 0, got {self.budget_fraction}")
        if self.num_selected == 0 and self.selector == "sfedavg":
            raise ValueError("sfedavg needs num_selected >= 1 (clients sampled per round)")
        if self.num_selected == 0 and self.selector != "flmarket" and not self.budget_fraction:
            raise ValueError(
                f"{self.selector} needs num_selected >= 1, or num_selected=0 with budget_fraction > 0 "
                "(as many clients as FLMarket buys)"
            )
        if self.rounds < 1 or self.final_window < 1:
            raise ValueError("rounds and final_window must be >= 1")
        if self.min_rounds and not 2 * self.final_window <= self.min_rounds <= self.rounds:
            raise ValueError("min_rounds must be 0 or lie in [2 * final_window, rounds]")


@dataclass(frozen=True, eq=False)
class Federation:
    """The clients' data and the server's test set of one (data set, partition) pair.

    Attributes
    ----------
    client_data : list of TensorPair
        ``(inputs, labels)`` of each client, by partition id.
    label_counts : numpy.ndarray
        ``(E, C)`` per-class counts.
    test_data : TensorPair
        The held-out test set.
    validation_data : TensorPair or None
        The server's validation split (``val_per_class`` per class, taken from the training pool before
        the partition; S-FedAvg values updates on it), ``None`` when ``val_per_class`` is 0.
    num_classes : int
        Number of classes.
    input_shape : tuple of int
        Shape of one input.
    """

    client_data: list[TensorPair]
    label_counts: np.ndarray
    test_data: TensorPair
    num_classes: int
    input_shape: tuple[int, ...]
    validation_data: TensorPair | None = None


# --- Data ----------------------------------------------------------------------------------------------------------
def data_config(cfg: EngineConfig) -> DataConfig:
    """The Flower app's data config for ``cfg``: the engine reads its data through the app's own loader."""
    config = DataConfig(**{item.name: getattr(cfg, item.name) for item in fields(DataConfig)})
    config.validate()
    return config


@lru_cache(maxsize=16)
def _federation(config: DataConfig) -> Federation:
    clients = [task.load_partition(partition_id, config) for partition_id in range(config.num_clients)]
    return Federation(
        client_data=clients,
        label_counts=task.all_label_counts(config),
        test_data=task.load_test_set(config),
        num_classes=task.num_classes(config),
        input_shape=task.input_shape(config),
        validation_data=task.load_validation_set(config) if config.val_per_class > 0 else None,
    )


def load_federation(cfg: EngineConfig) -> Federation:
    """The clients' tensors and label counts and the test set for ``cfg`` (cached per process).

    Everything comes from :mod:`flmarket_flwr.app.task`, the loader the Flower app's ClientApps and ServerApp use:
    the data set's test set, then ``val_per_class`` per class for a validation split, then the partition of the rest.
    """
    return _federation(data_config(cfg))


# --- Selection -----------------------------------------------------------------------------------------------------
def bids_for(cfg: EngineConfig, label_counts: np.ndarray) -> np.ndarray:
    """Every client's bid under ``cfg.bid_policy``.

    ``volume``: ``c N_e (1 + markup)`` with one shared ``c = cost_per_sample``; ``constant``: 1 each;
    ``random``: ``c_e N_e (1 + markup)`` with the Flower app's per-client ``c_e`` in ``[cost_low, cost_high)``.
    A client without data bids like one sample (it scores 0 and never wins).
    """
    volumes = np.maximum(label_counts.sum(axis=1), 1)
    if cfg.bid_policy == "constant":
        return np.ones(volumes.size)
    if cfg.bid_policy == "volume":
        costs = [cfg.cost_per_sample] * volumes.size
    else:
        costs = [simulated_cost_per_sample(e, cfg.seed, cfg.cost_low, cfg.cost_high) for e in range(volumes.size)]
    # The market's own cost-based bid (market.bidding), on each client's volume.
    pairs = zip(volumes, costs, strict=True)
    return np.array([cost_based_bid(np.array([volume]), cost, cfg.bid_markup) for volume, cost in pairs])


def _embeddings(federation: Federation, seed: int) -> np.ndarray:
    """DDS's client embeddings: the app's fixed feature extractor on each client's inputs (``task.embed_inputs``)."""
    from flmarket_flwr.app.task import embed_inputs  # pylint: disable=import-outside-toplevel

    return np.stack([embed_inputs(images.numpy(), seed=seed) for images, _ in federation.client_data])


def select(cfg: EngineConfig, federation: Federation) -> tuple[list[int], dict[str, Any]]:
    """Run the pre-training selector: the selected partition ids (selection order) and what it saw and decided.

    Raises
    ------
    ValueError
        For ``sfedavg``, which samples clients during training (:class:`ShapleyCohort`), not before.
    """
    counts = federation.label_counts
    if cfg.selector == "sfedavg":
        raise ValueError("S-FedAvg samples its clients during training, not before: see ShapleyCohort")
    if cfg.selector != "flmarket":
        return _select_baseline(cfg, federation)
    bids = bids_for(cfg, counts)
    scores = flmarket_scores(counts)
    budget = auction_budget(cfg, scores, bids)
    auction = run_auction(
        scores, bids, budget, num_winners=cfg.num_selected or None, budget_rule=cfg.auction_budget_rule
    )
    positions = [int(p) for p in auction.winners]
    protocol: dict[str, Any] = {}
    if cfg.market == "protocol":
        protocol_winners, protocol = run_market_protocol(cfg, counts, budget)
        protocol["same_winners_as_direct"] = protocol_winners == positions
        positions = protocol_winners
    market = {
        "total_payment": float(auction.total_payment),
        "budget": budget,
        "budget_rule": cfg.auction_budget_rule,
        "paid_share": float(auction.total_payment) / budget,
        "within_budget": bool(auction.within_budget),
        "pass_attempts": 0,
        "scores": scores.tolist(),
        "bids": bids.tolist(),
        "bid_policy": cfg.bid_policy,
        **protocol,
    }
    return positions, market


def _select_baseline(cfg: EngineConfig, federation: Federation) -> tuple[list[int], dict[str, Any]]:
    """RS, QBS, DICE or DDS: ``num_selected`` clients, or (``0``) matched to FLMarket's auction here.

    The budget mode's match (:attr:`EngineConfig.baseline_match`): ``cohort``, as many clients as FLMarket's
    auction at the same bids and budget (:func:`auction_budget`) buys on the same partition, its winner count
    recorded as ``matched_cohort``; ``budget``, what the same budget buys at the same bids, pay-as-bid, the amount
    paid recorded as ``paid``.
    """
    counts = federation.label_counts
    size, matched = cfg.num_selected, {}
    extra: dict[str, Any] = {"volume_weight": cfg.dice_volume_weight}
    if cfg.selector == "dds":
        extra = {"embeddings": _embeddings(federation, cfg.seed), "diversity_weight": cfg.dds_diversity_weight}
    if not size:
        bids = bids_for(cfg, counts)
        scores = flmarket_scores(counts)
        budget = auction_budget(cfg, scores, bids)
        if cfg.baseline_match == "budget":
            bought = [int(p) for p in select_within_budget(cfg.selector, counts, bids, budget, seed=cfg.seed, **extra)]
            paid = float(sum(float(bids[p]) for p in bought))
            matched = {"match": "budget", "payment_rule": "pay-as-bid", "budget": budget, "paid": paid}
            return bought, matched | {"bid_policy": cfg.bid_policy}
        size = len(run_auction(scores, bids, budget, budget_rule=cfg.auction_budget_rule).winners)
        matched = {"matched_cohort": size, "budget": budget, "bid_policy": cfg.bid_policy}
        if not size:
            return [], matched
    chosen = select_clients(cfg.selector, counts, size, seed=cfg.seed, **extra)
    return [int(p) for p in chosen], matched


def auction_budget(cfg: EngineConfig, scores: np.ndarray, bids: np.ndarray) -> float:
    """The budget ``R`` of FLMarket's auction: a fraction of the total bid, ``cfg.budget``, or the cohort's least.

    With ``budget_fraction > 0``, ``R = budget_fraction * sum(bids)`` (all clients' bids), fixed before any
    selection: the budget mode in which the budget, not a cohort size, decides how many clients win. Otherwise,
    with ``cohort_budget`` and a cohort (``num_selected > 0``) the budget is
    :func:`~flmarket_flwr.pricing.cohort_budget` of the ``num_selected`` first positive-score clients (fewer if
    fewer score above zero), so FLMarket buys a full cohort when one exists and still pays within the budget.
    """
    if cfg.budget_fraction > 0:
        return float(cfg.budget_fraction * np.sum(bids))
    if not (cfg.cohort_budget and cfg.num_selected):
        return float(cfg.budget)
    buyable = min(cfg.num_selected, int(np.count_nonzero(scores > 0)))
    return cohort_budget(scores, bids, buyable, budget_rule=cfg.auction_budget_rule) if buyable else float(cfg.budget)


def run_market_protocol(cfg: EngineConfig, label_counts: np.ndarray, budget: float) -> tuple[list[int], dict[str, Any]]:
    """FLMarket's real market phase over an in-process Grid: the winners' partition ids and what it cost.

    Every partition is a node (id ``MARKET_NODE_BASE + partition id``) running the market handlers of
    :func:`~flmarket_flwr.market.register_market_handlers` on its own label counts, with the bid policy
    of ``cfg`` (``volume``: :class:`~flmarket_flwr.market.CostBasedBid` at ``cost_per_sample``;
    ``constant``: 1). :class:`~flmarket_flwr.market.MarketPhase` runs PASS (X25519, Shamir-shared
    masks, the neighbourhood graph), collects the clients' bids and runs the auction, exactly as in a
    Flower run; messages cross Flower's wire format, synchronously (no network latency).
    """
    # pylint: disable=import-outside-toplevel
    from flmarket_flwr.market import BidPolicy, CostBasedBid, MarketConfig, MarketPhase
    from simulations.inprocess_grid import InProcessGrid, market_client_app, serverapp_identity

    def constant_bid(label_counts: np.ndarray, score: float, context: Any) -> float:
        return 1.0

    policy: BidPolicy = (
        CostBasedBid(cfg.cost_per_sample, cfg.bid_markup) if cfg.bid_policy == "volume" else constant_bid
    )
    nodes = [MARKET_NODE_BASE + e for e in range(label_counts.shape[0])]
    app = market_client_app({node: label_counts[e] for e, node in enumerate(nodes)}, policy)
    config = MarketConfig(
        budget=budget,
        num_classes=label_counts.shape[1],
        num_winners=cfg.num_selected or None,
        budget_rule=cfg.auction_budget_rule,
        neighbours=neighbours_of(cfg.neighbours),
        audit_winners=cfg.audit_winners,
        expected_nodes=len(nodes),
    )
    started = time.perf_counter()
    grid = InProcessGrid(app, nodes)
    with serverapp_identity(grid.run.run_id):
        outcome = MarketPhase(config).run(grid)
    elapsed = time.perf_counter() - started
    winners = [node - MARKET_NODE_BASE for node in outcome.winners]
    return winners, {"market_phase_s": elapsed, "market_timings": dict(outcome.timings), "pass_attempts": 1}


# --- Training ------------------------------------------------------------------------------------------------------
def _build_model(cfg: EngineConfig, federation: Federation) -> nn.Module:
    from flmarket_flwr.app.models import build_model  # pylint: disable=import-outside-toplevel

    options = {"in_channels": federation.input_shape[0]} if cfg.model.replace("-", "_") == "deap_cnn" else {}
    return build_model(cfg.model, num_classes=federation.num_classes, **options)


# pylint: disable=too-many-arguments,too-many-locals
def fedavg(states: Sequence[Mapping[str, np.ndarray]], weights: Sequence[float]) -> dict[str, np.ndarray]:
    """Weighted average of state dicts, computed as ``flwr``'s ``aggregate_arrayrecords`` does."""
    total = float(sum(weights))
    averaged: dict[str, np.ndarray] = {}
    for state, weight in zip(states, weights, strict=True):
        factor = weight / total
        for key, value in state.items():
            if key in averaged:
                averaged[key] += value * factor
            else:
                averaged[key] = value * factor
    return averaged


def _local_update(cfg: EngineConfig, model: nn.Module, data: TensorPair, seed: int, device: torch.device) -> float:
    from flmarket_flwr.app.task import train  # pylint: disable=import-outside-toplevel

    steps = cfg.local_steps if cfg.local_steps > 0 else None  # None: whole epochs, unclipped, as the Flower app
    return train(
        model,
        data,
        cfg.local_epochs,
        cfg.learning_rate,
        device,
        cfg.batch_size,
        cfg.momentum,
        seed,
        steps=steps,
        clip_norm=cfg.clip_norm if steps else 0.0,
    )


def _state(model: nn.Module) -> dict[str, np.ndarray]:
    return {key: value.detach().cpu().numpy().copy() for key, value in model.state_dict().items()}


def _load(model: nn.Module, state: Mapping[str, np.ndarray]) -> None:
    import torch  # pylint: disable=import-outside-toplevel

    model.load_state_dict({key: torch.from_numpy(np.asarray(value)) for key, value in state.items()}, strict=True)


@dataclass
class _Training:
    """What the FedAvg loop records."""

    rounds: list[dict[str, Any]] = field(default_factory=list)
    diverged_at: int | None = None
    final_state: dict[str, np.ndarray] | None = None
    cohorts: dict[int, list[int]] = field(default_factory=dict)


class ShapleyCohort:
    """S-FedAvg's cohort: sampled every round by relevance, its updates valued on the validation split.

    The relevance, the sampling and the Shapley estimate are :class:`~simulations.baselines.RelevanceSampler`,
    seeded as :class:`~simulations.baselines.SFedAvg` is with ``seed`` (its first two streams) and with its
    defaults (10 permutations, ``phi <- 0.75 phi + 0.25 sv``, temperature 1, initial relevance ``1 / E``).
    The value of a coalition is the validation accuracy of the FedAvg of its members' models (sample-weighted,
    renormalised); the empty coalition's is the round's incoming global model's.

    Parameters
    ----------
    num_clients : int
        Candidates (partition ids ``0 .. num_clients - 1``).
    num_sampled : int
        Clients sampled per round.
    seed : int
        The run's seed.
    """

    def __init__(self, num_clients: int, num_sampled: int, seed: int) -> None:
        # pylint: disable=import-outside-toplevel
        from simulations.baselines import RelevanceSampler

        sampling_seed, shapley_seed, _ = np.random.SeedSequence(seed).spawn(3)
        self.candidates = list(range(num_clients))
        self.num_sampled = num_sampled
        self.sampler = RelevanceSampler(sampling_seed=sampling_seed, shapley_seed=shapley_seed)
        self.sampler.register(self.candidates)
        self.rounds: list[dict[str, Any]] = []

    def clients(self, server_round: int) -> list[int]:
        """Sample this round's clients (drawing order)."""
        probabilities = self.sampler.probabilities(self.candidates)
        sampled = self.sampler.sample(probabilities, self.num_sampled)
        self.rounds.append({"server_round": server_round, "sampled": sampled})
        return sampled

    def value(
        self,
        updates: Mapping[int, tuple[Mapping[str, np.ndarray], float]],
        incoming: Mapping[str, np.ndarray],
        validation_accuracy: Callable[[Mapping[str, np.ndarray]], float],
    ) -> None:
        """Value the round's updates (partition id -> (state, sample count)) and update the relevance."""
        started = time.perf_counter()

        def coalition_value(coalition: frozenset[int]) -> float:
            if not coalition:
                return validation_accuracy(incoming)
            members = sorted(coalition)
            return validation_accuracy(fedavg([updates[e][0] for e in members], [updates[e][1] for e in members]))

        estimate = self.sampler.estimate(sorted(updates), coalition_value)
        self.sampler.update(estimate.values)
        self.rounds[-1].update(
            shapley={str(e): v for e, v in estimate.values.items()},
            exact=estimate.exact,
            coalition_evaluations=estimate.num_evaluations,
            valuation_time_s=time.perf_counter() - started,
        )

    def history(self) -> dict[str, Any]:
        """Per-round samples, Shapley values and valuation cost, and the final relevance (JSON-ready)."""
        return {
            "rounds": self.rounds,
            "relevance": {str(e): v for e, v in self.sampler.relevance.items()},
            "valuation_s": float(sum(r.get("valuation_time_s", 0.0) for r in self.rounds)),
        }


def _fedavg_rounds(cfg: EngineConfig, federation: Federation, cohort: Sequence[int] | ShapleyCohort) -> _Training:
    """FedAvg for ``cfg.rounds`` rounds, evaluating the global model after each.

    ``cohort``: the selected partition ids (every round the same), or S-FedAvg's :class:`ShapleyCohort`.
    """
    import torch  # pylint: disable=import-outside-toplevel

    from flmarket_flwr.app.task import evaluate, resolve_device  # pylint: disable=import-outside-toplevel

    device = resolve_device(cfg.device)
    torch.manual_seed(cfg.seed)  # The initial model: as the ServerApp builds it.
    worker = _build_model(cfg, federation)
    global_state = _state(worker)
    training = _Training()
    loss, accuracy = evaluate(worker, federation.test_data, device)
    training.rounds.append(_round_record(0, accuracy, loss, None, 0.0, 0.0))

    def validation_accuracy(state: Mapping[str, np.ndarray]) -> float:
        assert federation.validation_data is not None
        _load(worker, state)
        return float(evaluate(worker, federation.validation_data, device)[1])

    if not isinstance(cohort, ShapleyCohort) and not cohort:
        training.final_state = global_state  # FLMarket bought nobody: nothing to train, as the app fails such a run
        return training
    for server_round in range(1, cfg.rounds + 1):
        started, cpu_started = time.perf_counter(), time.process_time()
        clients = cohort.clients(server_round) if isinstance(cohort, ShapleyCohort) else list(cohort)
        training.cohorts[server_round] = clients
        states, weights, losses = [], [], []
        for partition_id in clients:
            _load(worker, global_state)
            seed = task.training_seed(cfg.seed, partition_id, server_round)  # the app's train handler's seed
            losses.append(_local_update(cfg, worker, federation.client_data[partition_id], seed, device))
            states.append(_state(worker))
            weights.append(float(len(federation.client_data[partition_id][1])))
        incoming, global_state = global_state, fedavg(states, weights)
        if isinstance(cohort, ShapleyCohort) and np.all(np.isfinite(losses)):
            cohort.value(
                dict(zip(clients, zip(states, weights, strict=True), strict=True)), incoming, validation_accuracy
            )
        trained = time.perf_counter()
        if not all(np.all(np.isfinite(v)) for v in global_state.values()) or not np.all(np.isfinite(losses)):
            training.diverged_at = server_round
            cpu_s = time.process_time() - cpu_started
            training.rounds.append(
                _round_record(server_round, math.nan, math.nan, math.nan, trained - started, 0.0, cpu_s)
            )
            break
        _load(worker, global_state)
        loss, accuracy = evaluate(worker, federation.test_data, device)
        train_loss = float(np.average(losses, weights=weights))
        cpu_s = time.process_time() - cpu_started
        training.rounds.append(
            _round_record(
                server_round, accuracy, loss, train_loss, trained - started, time.perf_counter() - trained, cpu_s
            )
        )
        if cfg.min_rounds and server_round >= cfg.min_rounds and _plateau_reached(cfg, training.rounds[1:]):
            break
    training.final_state = global_state
    return training


def _round_record(  # pylint: disable=too-many-arguments,too-many-positional-arguments
    server_round: int,
    accuracy: float,
    loss: float,
    train_loss: float | None,
    round_s: float,
    eval_s: float,
    cpu_s: float = 0.0,
) -> dict[str, Any]:
    """One round's record; ``cpu_s`` is the process CPU time of the round (training, aggregation, evaluation)."""
    return {
        "round": server_round,
        "accuracy": float(accuracy),
        "loss": float(loss),
        "train_loss": train_loss,
        "round_time_s": round_s,
        "eval_time_s": eval_s,
        "cpu_s": cpu_s,
    }


def _plateau_delta(accuracies: np.ndarray, window: int) -> float:
    """Mean of the last ``window`` accuracies minus the mean of the ``window`` before (NaN when too short)."""
    if accuracies.size < 2 * window:
        return math.nan
    return float(accuracies[-window:].mean() - accuracies[-2 * window : -window].mean())


def auc_accuracy(accuracies: Sequence[float] | np.ndarray) -> float:
    """Mean test accuracy over the rounds run (round 0, the initial model, excluded): the area under the
    accuracy-per-round curve divided by the rounds; NaN when no round ran or one is not finite.
    """
    values = np.asarray(accuracies, dtype=np.float64)
    return float(values.mean()) if values.size and np.all(np.isfinite(values)) else math.nan


def _plateau_reached(cfg: EngineConfig, rounds: Sequence[Mapping[str, Any]]) -> bool:
    accuracies = np.array([r["accuracy"] for r in rounds], dtype=np.float64)
    return bool(abs(_plateau_delta(accuracies, cfg.final_window)) <= cfg.plateau_tolerance)


def _protocol(cfg: EngineConfig, training: _Training) -> dict[str, Any]:
    """Final accuracy, plateau and divergence flags (see the module docstring)."""
    accuracies = np.array([r["accuracy"] for r in training.rounds[1:]], dtype=np.float64)
    window = cfg.final_window
    diverged = training.diverged_at is not None
    final = math.nan if diverged or accuracies.size < window else float(accuracies[-window:].mean())
    delta = math.nan if diverged else _plateau_delta(accuracies, window)
    moving = np.convolve(accuracies, np.ones(window) / window, mode="valid") if accuracies.size >= window else None
    best_window = float(np.max(moving)) if moving is not None and not diverged else math.nan
    return {
        "final_accuracy": final,
        "final_window": window,
        "last_accuracy": float(accuracies[-1]) if accuracies.size else math.nan,
        "auc_accuracy": math.nan if diverged else auc_accuracy(accuracies),
        "plateau_delta": delta,
        "plateau_tolerance": cfg.plateau_tolerance,
        "plateau_reached": bool(abs(delta) <= cfg.plateau_tolerance),
        "rounds_run": int(accuracies.size),
        "diverged": diverged,
        "diverged_at_round": training.diverged_at,
        "collapsed": bool(not diverged and best_window - final > cfg.collapse_drop),
        "best_window_accuracy": best_window,
    }


def run_engine(cfg: EngineConfig, run_config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Run one job in process and return its ``result.json`` record (``simulations.run.summarize``'s shape).

    ``final_accuracy`` is the mean of the last ``final_window`` rounds (NaN for a diverged run);
    ``engine`` holds the protocol, the plateau criterion and the divergence flags, and ``engine.ran_on`` the device
    the job trained on and its peak CUDA memory in MiB (``None`` on the CPU).
    """
    started = time.perf_counter()
    device = task.resolve_device(cfg.device)
    with _reproducible(cfg.torch_threads, warn_only=device.type == "cuda") as settings:
        task.reset_peak_memory(device)
        federation = load_federation(cfg)
        loaded = time.perf_counter()
        sfedavg = ShapleyCohort(cfg.num_clients, cfg.num_selected, cfg.seed) if cfg.selector == "sfedavg" else None
        # S-FedAvg: every client is a candidate (as the app's selection record says); it samples per round.
        selected, market = (list(range(cfg.num_clients)), {}) if sfedavg else select(cfg, federation)
        selected_at = time.perf_counter()
        training = _fedavg_rounds(cfg, federation, sfedavg or selected)
        finished = time.perf_counter()
    protocol = _protocol(cfg, training)
    accuracies = [r["accuracy"] for r in training.rounds[1:]]
    result = job_record(
        run_config=run_config if run_config is not None else asdict(cfg),
        identity={key: getattr(cfg, key) for key in JOB_IDENTITY},
        rounds=training.rounds,
        final_accuracy=protocol["final_accuracy"],
        best_accuracy=float(np.nanmax(accuracies)) if np.isfinite(accuracies).any() else math.nan,
        selected_nodes=selected,  # no nodes here: node id = partition id
        selected_partitions=selected,
        label_counts=federation.label_counts,
        trained_per_round=training.cohorts,
        timings={
            "job_wall_s": finished - started,
            "selection_s": selected_at - loaded,
            "training_s": finished - selected_at,
            "server_app_s": finished - loaded,
            "overhead_s": loaded - started,
        },
    )
    result["engine"] = {"name": "inprocess", "config": asdict(cfg), "bought_nobody": not selected, **protocol}
    result["engine"]["reproducibility"] = settings
    result["engine"]["ran_on"] = {"device": task.describe_device(device), "peak_cuda_mib": task.peak_memory_mib(device)}
    if market and cfg.selector == "flmarket":
        result["market"] = market
    elif market:
        result["engine"]["matched"] = market  # a baseline's cohort matched to FLMarket's auction
    if sfedavg:
        result["sfedavg"] = sfedavg.history()
        result["timings"]["valuation_s"] = result["sfedavg"]["valuation_s"]
    return result


# --- Bit-for-bit re-runs -------------------------------------------------------------------------------------------
def _cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; the platform's processor string elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


CUBLAS_WORKSPACE_KEY = "CUBLAS_WORKSPACE_CONFIG"
CUBLAS_WORKSPACE_DETERMINISTIC = ":4096:8"
"""The cuBLAS workspace setting that torch's deterministic mode needs on CUDA (PyTorch's reproducibility notes)."""


@contextmanager
def _reproducible(threads: int, warn_only: bool = False) -> Iterator[dict[str, Any]]:
    """Run a job at a fixed number of torch intra-op threads with torch's deterministic algorithms; restore both after.

    The thread count is what decides a CPU run's floating-point sums on one machine: at one thread the archived job
    ``volume/seed=0_distribution=d4`` (FLMarket) re-runs bit for bit, at two its accuracy matches to about four
    digits through round 5 and then drifts (issue 43). Across machines torch's kernels decide them too: the yielded
    settings name torch's CPU capability (``AVX512``, ``AVX2``, ...), and a job re-runs bit for bit only where it
    and the CPU model are the recorded ones. ``threads = 0`` keeps torch's default (the machine's cores):
    the yielded settings, written into the record (``engine.reproducibility``), say how many that was, and
    :func:`rerun` uses them. ``warn_only`` (a job on CUDA): an operation with no deterministic CUDA kernel (torch
    lists ``NLLLoss`` on CUDA among them) warns instead of failing the job; the record says so.
    """
    import torch  # pylint: disable=import-outside-toplevel

    before = (
        torch.get_num_threads(),
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    cublas = os.environ.get(CUBLAS_WORKSPACE_KEY)
    if threads > 0:
        torch.set_num_threads(threads)
    # On a GPU, torch refuses cuBLAS's matrix products in deterministic mode unless cuBLAS keeps a fixed workspace.
    os.environ.setdefault(CUBLAS_WORKSPACE_KEY, CUBLAS_WORKSPACE_DETERMINISTIC)
    torch.use_deterministic_algorithms(True, warn_only=warn_only)
    try:
        yield {
            "torch_threads": torch.get_num_threads(),
            "interop_threads": torch.get_num_interop_threads(),
            "deterministic_algorithms": True,
            "deterministic_warn_only": warn_only,
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "torch": torch.__version__,
            "numpy": np.__version__,
            "python": platform.python_version(),
            "cpu": _cpu_model(),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        }
    finally:
        torch.set_num_threads(before[0])
        torch.use_deterministic_algorithms(before[1], warn_only=before[2])
        if cublas is None:
            os.environ.pop(CUBLAS_WORKSPACE_KEY, None)


def rerun(record: Mapping[str, Any]) -> dict[str, Any]:
    """Re-run the engine job of a ``result.json`` record with its recorded config (and recorded thread count).

    Raises
    ------
    ValueError
        A record without ``engine.config`` (not an engine job).
    """
    engine = record.get("engine", {})
    if "config" not in engine:
        raise ValueError("the record has no engine.config: only an engine job can be re-run")
    values = dict(engine["config"])
    recorded = engine.get("reproducibility", {}).get("torch_threads")
    if not values.get("torch_threads") and recorded:
        values["torch_threads"] = recorded  # torch's default then was this many threads
    return run_engine(EngineConfig(**values))


CURVE_KEYS = ("accuracy", "loss", "train_loss")
"""The per-round values a bit-for-bit re-run must reproduce exactly."""


def same_curve(archived: Mapping[str, Any], again: Mapping[str, Any], *, score_rel_tol: float = 0.0) -> list[str]:
    """Every difference between two records of one job: the selection, the payments and each round's
    :data:`CURVE_KEYS`, compared exactly (an empty list: the same run, bit for bit).

    The market's scores are compared to ``score_rel_tol`` (exactly by default): a record made before the score had
    the same bits on every machine (issue 54) carries scores whose last bits came from its CPU's BLAS kernel.
    """
    differences = []
    for key in ("selected_partitions",):
        if archived.get(key) != again.get(key):
            differences.append(f"{key}: {archived.get(key)} != {again.get(key)}")
    for key in ("scores", "bids", "total_payment", "budget"):
        mine, theirs = archived.get("market", {}).get(key), again.get("market", {}).get(key)
        if key == "scores" and isinstance(mine, list) and isinstance(theirs, list) and len(mine) == len(theirs):
            same = all(math.isclose(a, b, rel_tol=score_rel_tol) for a, b in zip(mine, theirs, strict=True))
        else:
            same = mine == theirs
        if not same:
            differences.append(f"market.{key}: {mine} != {theirs}")
    rounds, rounds_again = archived["rounds"], again["rounds"]
    if len(rounds) != len(rounds_again):
        differences.append(f"rounds run: {len(rounds)} != {len(rounds_again)}")
    for first, second in zip(rounds, rounds_again, strict=False):
        for key in CURVE_KEYS:
            a, b = first.get(key), second.get(key)
            if a != b and not (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)):
                differences.append(f"round {first['round']} {key}: {a!r} != {b!r}")
    return differences


# --- Hydra and command line ----------------------------------------------------------------------------------------
_ENGINE_KEYS = (
    "market",
    "budget_fraction",
    "cohort_budget",
    "baseline_match",
    "bid_policy",
    "cost_per_sample",
    "local_steps",
    "clip_norm",
    "final_window",
    "plateau_tolerance",
    "collapse_drop",
    "min_rounds",
    "dice_volume_weight",
    "dds_diversity_weight",
)


def config_from_hydra(cfg: Any, run_config: Mapping[str, Any] | None = None) -> EngineConfig:
    """The :class:`EngineConfig` of a composed Hydra job config (``conf/``; engine keys under ``sim.engine``).

    The app keys come through :func:`simulations.config.to_run_config`, the one mapping from Hydra to the
    app's run config (give it as ``run_config`` when the caller has it already); an app key the engine cannot
    honour (``fraction-train`` below 1, ...) is an error naming it, never a silent difference from the Flower path.
    """
    from omegaconf import OmegaConf  # pylint: disable=import-outside-toplevel

    from simulations.config import to_run_config  # pylint: disable=import-outside-toplevel

    container = OmegaConf.to_container(cfg, resolve=True) if not isinstance(cfg, Mapping) else cfg
    assert isinstance(container, Mapping)
    if run_config is None:
        run_config = to_run_config(cfg)
    implemented = {*ENGINE_APP_KEYS, ROUNDS_KEY, *ENGINE_IGNORES}
    defaults = EXPERIMENT_SCHEMA.defaults
    unsupported = {key: value for key, value in run_config.items() if key not in implemented and value != defaults[key]}
    if unsupported:
        raise ValueError(f"the in-process engine does not implement app key(s) {unsupported}: use engine=flower")
    values: dict[str, Any] = {field_name(key): run_config[key] for key in ENGINE_APP_KEYS}
    values["rounds"] = run_config[ROUNDS_KEY]
    values["device"] = "cpu" if values["device"] == "auto" else values["device"]
    values["num_clients"] = container["federation"]["num_clients"]
    engine = dict((container.get("sim") or {}).get("engine") or {})
    values.update({key: engine[key] for key in _ENGINE_KEYS if engine.get(key) is not None})
    return EngineConfig(**values)


def run_job_inprocess(cfg: Any) -> dict[str, Any]:
    """Run a Hydra job config through the engine; return the record ``simulations.run`` writes as ``result.json``."""
    from simulations.config import to_run_config  # pylint: disable=import-outside-toplevel

    started = time.perf_counter()
    run_config = to_run_config(cfg)
    result = run_engine(config_from_hydra(cfg, run_config), run_config=run_config)
    result["timings"]["job_wall_s"] = time.perf_counter() - started
    return result


def _job_name(cfg: EngineConfig, varied: Sequence[str]) -> str:
    return "_".join(f"{key}={getattr(cfg, key)}" for key in varied)


def write_result(job: Path, result: Mapping[str, Any]) -> None:
    """Write ``<job>/result.json`` atomically: a stopped sweep leaves no half file."""
    job.mkdir(parents=True, exist_ok=True)
    partial = job / "result.json.partial"
    partial.write_text(json.dumps(result), encoding="utf-8")
    partial.replace(job / "result.json")


def run_on_ray(
    jobs: Sequence[tuple[EngineConfig, Path]],
    workers: int,
    done: Callable[[Path, dict[str, Any]], None],
    job_gpus: float = 0.0,
) -> None:
    """Run engine jobs as Ray tasks, at most ``workers`` at once, and hand each result to ``done`` as it arrives.

    Ray is Flower's simulation backend, so it is installed with the app. With ``RAY_ADDRESS`` set the tasks
    go to that existing cluster (every node needs this project importable at the same path, or installed);
    otherwise a local Ray with ``workers`` CPUs starts for the sweep and stops after it. Each task returns
    its result to this process, which writes it: a cluster needs no shared file system. Each task asks Ray for
    one CPU and ``job_gpus`` of a GPU: a job with ``device="cuda"`` needs ``job_gpus > 0``, since Ray hides the
    GPUs from a task that asks for none (``0.25``: four jobs share a GPU).
    """
    import ray  # pylint: disable=import-outside-toplevel

    address = os.environ.get("RAY_ADDRESS") or None
    started_here = not ray.is_initialized()
    if started_here:
        # The project first, then this process's own PYTHONPATH (packages installed with pip --target, say).
        paths = [str(Path(__file__).resolve().parents[1]), *filter(None, [os.environ.get("PYTHONPATH")])]
        ray.init(
            address=address,
            num_cpus=None if address else workers,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(paths)}},
        )
    task = ray.remote(num_cpus=1, num_gpus=job_gpus)(run_engine)
    try:
        queue = list(jobs)
        running: dict[Any, Path] = {}
        while queue or running:
            while queue and len(running) < workers:
                cfg, job = queue.pop(0)
                running[task.remote(cfg)] = job
            finished, _ = ray.wait(list(running), num_returns=1)
            job = running.pop(finished[0])
            done(job, ray.get(finished[0]))
    finally:
        if started_here:
            ray.shutdown()


_GRID_KEYS = (
    "seed",
    "distribution",
    "num_clients",
    "schedule",
    "bid_policy",
    "dice_volume_weight",
    "dds_diversity_weight",
    "num_selected",
    "selector",
)
"""Grid order: seed outermost (a partial sweep covers every setting with fewer seeds), selector innermost
(every (setting, seed) is finished for all selectors before the next begins: whole paired sets)."""


def _parse_bool(text: str) -> bool:
    """``true``/``false`` (any case) for a boolean option; anything else is an error naming the value."""
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text.lower() == "true"


def main(argv: list[str] | None = None) -> None:
    """Run a resumable grid of engine jobs: ``<out>/<job>/result.json``; finished jobs are skipped.

    Example (the pilot)::

        python -m simulations.engine --out results/digits_xl/raw/pilot --distribution d4 d5 d6 \\
            --selector flmarket rs qbs dice dds --num-selected 10 --seed 0 1 2

    ``--workers N`` runs N jobs at once as Ray tasks (one torch thread each by default): on a local Ray, or on
    the existing cluster at ``RAY_ADDRESS`` when that is set (:func:`run_on_ray`).
    """
    parser = argparse.ArgumentParser(description="Resumable grid of in-process FLMarket jobs.")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--workers", type=int, default=1, help="jobs run at once, as Ray tasks (RAY_ADDRESS: a cluster)"
    )
    parser.add_argument(
        "--job-gpus", type=float, default=0.0, help="share of a GPU each job's Ray task asks for (--device cuda)"
    )
    types = {
        "num_selected": int,
        "seed": int,
        "num_clients": int,
        "dice_volume_weight": float,
        "dds_diversity_weight": float,
    }
    for key in _GRID_KEYS:
        parser.add_argument(f"--{key.replace('_', '-')}", nargs="+", type=types.get(key, str), default=None)
    for item in fields(EngineConfig):
        if item.name not in _GRID_KEYS:
            kind = _parse_bool if isinstance(item.default, bool) else type(item.default)
            parser.add_argument(f"--{item.name.replace('_', '-')}", type=kind, default=item.default)
    args = vars(parser.parse_args(argv))
    out: Path = args.pop("out")
    workers: int = args.pop("workers")
    if workers < 1:
        parser.error(f"--workers must be >= 1, got {workers}")
    job_gpus: float = args.pop("job_gpus")
    if not 0.0 <= job_gpus <= 1.0:
        parser.error(f"--job-gpus must be in [0, 1], got {job_gpus}")
    if str(args["device"]).startswith("cuda") and job_gpus == 0.0:
        parser.error(
            f"--device {args['device']} needs --job-gpus > 0: Ray hides the GPUs from a task that asks for none"
        )
    grids = {key: args.pop(key) or [getattr(EngineConfig, key)] for key in _GRID_KEYS}
    always_named = ("distribution", "num_selected", "selector", "seed")
    varied = [key for key in _GRID_KEYS if len(grids[key]) > 1 or key in always_named]
    products = itertools.product(*grids.values())
    combos = [EngineConfig(**args, **dict(zip(_GRID_KEYS, combo, strict=True))) for combo in products]
    jobs = [(cfg, out / _job_name(cfg, varied)) for cfg in combos]
    todo = [(cfg, job) for cfg, job in jobs if not (job / "result.json").is_file()]
    out.mkdir(parents=True, exist_ok=True)
    print(f"{len(jobs)} jobs, {len(jobs) - len(todo)} finished before, {len(todo)} to run on {workers} worker(s)")
    started = time.perf_counter()
    finished = 0

    def report(job: Path, result: dict[str, Any]) -> None:
        nonlocal finished
        # How it ran, for the report's timings: runs at once, and on how many cores (a cluster's are not known here).
        cluster = bool(os.environ.get("RAY_ADDRESS"))
        result["sweep"] = {"runs_at_once": workers, "cpus": 0 if cluster else os.cpu_count(), "ray_cluster": cluster}
        write_result(job, result)
        finished += 1
        engine = result["engine"]
        print(
            f"[{finished:4d}/{len(todo)}] {job.name} | final {result['final_accuracy']:.4f} "
            f"rounds {engine['rounds_run']} plateau {engine['plateau_delta']:+.4f} diverged {engine['diverged']} "
            f"| {result['timings']['job_wall_s']:.1f} s (elapsed {time.perf_counter() - started:.0f} s)",
            flush=True,
        )

    if todo:
        run_on_ray(todo, workers, report, job_gpus)
    print(f"results in {out.resolve()}", flush=True)


if __name__ == "__main__":
    # Run as the importable module, so that Ray's workers find every name the jobs refer to.
    from simulations import engine

    engine.main()
