"""ClientApp of the FLMarket Flower app.

One ``ClientApp`` serves every phase of a run:

* **Market** (``query.market_*`` messages): registered with
  :func:`~flmarket_flwr.market.register_market_handlers`. The client's label
  counts ``N_e`` come from its partition; its bid is its (simulated,
  heterogeneous) cost per sample times ``N_e``, plus a markup
  (:func:`simulated_cost_bid`). The server only ever sees them masked (PASS).
  A node started with ``--node-config "... identity-key='<pem>' identity-directory='<json>'"``
  signs its PASS key advertisement and checks its neighbours' against the buyer's directory
  (:func:`identity_key_of`, :func:`identity_directory_of`). With ``market-ledger-dir='<dir>'`` in its
  node config it keeps a release ledger there and refuses a market whose members differ too little from
  one it already released a sum for (:func:`release_ledger_of`); with ``pass-complete-graph=true`` it
  takes part in PASS only on the complete graph (:func:`complete_graph_of`), and with
  ``pass-min-participants=<n>`` only in a roster of at least ``n`` nodes (:func:`min_participants_of`); with
  ``pass-split-tolerance=<c>`` its secrets withstand ``c`` colluding neighbours in a split consistency round
  (:func:`split_tolerance_of`); with ``market-buyer-key=<64 hex digits>`` it takes part only in a market whose
  terms name that buyer key, which must sign the award before the node opens its counts (:func:`buyer_key_of`).
* No other query: the baselines' raw-statistics query (RS, QBS, DICE, DDS) is answered
  only by the experiments' ClientApp (:mod:`simulations.apps`), never by this one.
* **Training** (``train`` / ``evaluate`` messages): plain local SGD on the
  client's partition with the configured model, on CUDA when available.

The client's partition is ``node_config["partition-id"]`` out of
``node_config["num-partitions"]`` (set by the simulation engine, or by
``flower-supernode --node-config "partition-id=0 num-partitions=3"`` in a
deployment).

:func:`build_client_app` builds the app; ``app`` is the one that ``flwr run`` loads.
``build_client_app(run_config)`` lays a fixed run config over the one Flower hands
the app (:class:`RunConfigOverride`): :mod:`simulations.run` uses it to run a job's
config through ``flwr.simulation.run_simulation``, which takes no run config.

In a deployment every message runs in a fresh process, so this module keeps
its import light for the market messages: the model (and with it ``torch``) is
imported by the ``train`` and ``evaluate`` handlers only, and the label counts
are computed once and then kept in ``context.state``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.app.typing import MetricRecordValues
from flwr.clientapp import ClientApp

from flmarket_flwr.market import SimulatedCostBid, read_award, register_market_handlers
from flmarket_flwr.market.ledger import DEFAULT_MIN_ROSTER_CHANGE, ReleaseLedger
from flmarket_flwr.pass_protocol import MIN_PARTICIPANTS, IdentityDirectory, SkellamNoise, load_identity_key
from flmarket_flwr.run_config import market_noise, read
from flmarket_flwr.task import (
    DataConfig,
    build_task_model,
    configure_torch_threads,
    evaluate,
    load_partition,
    partition_label_counts,
    resolve_device,
    training_seed,
)
from flmarket_flwr.task import train as train_model

if TYPE_CHECKING:
    import torch

STATE_KEY = "flmarket-app"
"""Key of this app's ``ConfigRecord`` in ``context.state`` (label-count cache)."""


def partition_id_of(context: Context) -> int:
    """Return the client's partition id from its node config.

    Raises
    ------
    KeyError
        If the node config has no ``partition-id`` (start the SuperNode with
        ``--node-config "partition-id=<i> num-partitions=<n>"``).
    """
    if "partition-id" not in context.node_config:
        raise KeyError(
            "node_config has no 'partition-id': start the SuperNode with "
            '--node-config "partition-id=<i> num-partitions=<n>"'
        )
    return int(context.node_config["partition-id"])


def data_config_of(context: Context) -> DataConfig:
    """Return the data config shared by all clients of the run.

    The number of clients is the federation's: the node config's ``num-partitions`` (set by Flower's
    simulation, or ``flower-supernode --node-config "partition-id=<i> num-partitions=<n>"``).
    """
    if "num-partitions" not in context.node_config:
        raise KeyError(
            "node_config has no 'num-partitions': start the SuperNode with "
            '--node-config "partition-id=<i> num-partitions=<n>"'
        )
    return DataConfig.from_run_config(context.run_config, context.node_config)


def label_counts(context: Context) -> np.ndarray:
    """Per-class label counts ``N_e`` of this client (the market's input).

    Computed from the partition on first use, then read from ``context.state``
    (which survives between messages, also in a deployment where each message
    runs in a fresh process). The cache is keyed by the data config and the
    partition id, and never leaves the client.
    """
    partition_id = partition_id_of(context)
    data_config = data_config_of(context)
    cache_key = f"{data_config!r}/partition-{partition_id}"
    state = context.state.get(STATE_KEY)
    if not isinstance(state, ConfigRecord):
        state = context.state[STATE_KEY] = ConfigRecord()
    if state.get("label-counts-key") == cache_key:
        return np.asarray(state["label-counts"], dtype=np.int64)
    counts = partition_label_counts(partition_id, data_config)
    state["label-counts-key"] = cache_key
    state["label-counts"] = [int(c) for c in counts]
    return counts


def simulated_cost_bid(label_counts: np.ndarray, score: float, context: Context) -> float:
    """The client's bid: :class:`~flmarket_flwr.market.SimulatedCostBid` with the run config's settings.

    ``b_e = cost_e * N_e * (1 + bid-markup)``, ``cost_e`` drawn in ``[cost-low, cost-high)`` from the
    client's partition id and ``seed``; read at bid time, so ``--run-config`` overrides apply.
    """
    config = context.run_config
    policy = SimulatedCostBid(
        seed=read(config, "seed"),
        low=read(config, "cost-low"),
        high=read(config, "cost-high"),
        markup=read(config, "bid-markup"),
    )
    return policy(label_counts, score, context)


def model_name_of(context: Context) -> str:
    """The model to train, from the run config (``model`` key)."""
    return str(read(context.run_config, "model"))


def train(msg: Message, context: Context) -> Message:
    """Train the received global model on the local partition."""
    import torch  # pylint: disable=C0415,redefined-outer-name

    from flmarket_flwr.models import set_arrays  # pylint: disable=C0415

    configure_torch_threads(read(context.run_config, "torch-threads"))
    partition_id = partition_id_of(context)
    data_config = data_config_of(context)
    config: dict[str, Any] = dict(msg.content.config_records.get("config", ConfigRecord()))
    server_round = int(config.get("server-round", 0))

    model = build_task_model(model_name_of(context), data_config)
    set_arrays(model, msg.content.array_records["arrays"])
    data = load_partition(partition_id, data_config)
    device = resolve_device(read(context.run_config, "device"))
    seed = training_seed(data_config.seed, partition_id, server_round)
    torch.manual_seed(seed)  # Dropout and any other draw from torch's global generator: same run, same model.
    started = time.perf_counter()
    train_loss = train_model(
        model,
        data,
        epochs=int(config.get("local-epochs", read(context.run_config, "local-epochs"))),
        lr=float(config.get("learning-rate", read(context.run_config, "learning-rate"))),
        device=device,
        batch_size=int(config.get("batch-size", read(context.run_config, "batch-size"))),
        momentum=float(config.get("momentum", read(context.run_config, "momentum"))),
        seed=seed,
    )
    train_time = time.perf_counter() - started
    _record_training(context, partition_id, server_round, len(data[1]), train_time, device)

    metrics: dict[str, MetricRecordValues] = {
        "train_loss": 0.0 if math.isnan(train_loss) else train_loss,
        "train_time": train_time,
        "num-examples": len(data[1]),
    }
    content = RecordDict(
        {
            "arrays": ArrayRecord(model.to("cpu").state_dict()),
            "metrics": MetricRecord(metrics),
        }
    )
    return Message(content=content, reply_to=msg)


def evaluate_local(msg: Message, context: Context) -> Message:
    """Evaluate the received global model on the local partition."""
    from flmarket_flwr.models import set_arrays  # pylint: disable=C0415

    configure_torch_threads(read(context.run_config, "torch-threads"))
    data_config = data_config_of(context)
    model = build_task_model(model_name_of(context), data_config)
    set_arrays(model, msg.content.array_records["arrays"])
    data = load_partition(partition_id_of(context), data_config)
    device = resolve_device(read(context.run_config, "device"))
    loss, accuracy = evaluate(model, data, device)
    metrics: dict[str, MetricRecordValues] = {
        "eval_loss": 0.0 if math.isnan(loss) else loss,
        "eval_acc": 0.0 if math.isnan(accuracy) else accuracy,
        "num-examples": len(data[1]),
    }
    return Message(content=RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)


def _record_training(  # pylint: disable=too-many-arguments,too-many-positional-arguments
    context: Context,
    partition_id: int,
    server_round: int,
    num_examples: int,
    train_time: float,
    device: torch.device,
) -> None:
    """Write an audit record of this train message when ``train-log-dir`` is set.

    One small JSON file per (node, round) in ``<train-log-dir>/run-<run_id>/``:
    tests use it to check, from the client side, that only the market's winners
    ever trained.
    """
    log_dir = str(read(context.run_config, "train-log-dir"))
    if not log_dir:
        return
    folder = Path(log_dir).expanduser() / f"run-{context.run_id}"
    folder.mkdir(parents=True, exist_ok=True)
    award = read_award(context)
    record = {
        "node_id": int(context.node_id),
        "partition_id": partition_id,
        "server_round": server_round,
        "num_examples": num_examples,
        "train_time_s": train_time,
        "won": None if award is None else award.won,
        "payment": None if award is None else award.payment,
        "device": str(device),
    }
    path = folder / f"train-node{context.node_id}-round{server_round}.json"
    path.write_text(json.dumps(record), encoding="utf-8")


class RunConfigOverride:
    """Flower ``ClientApp`` mod that lays a fixed run config over the context's.

    Every message's handler sees ``context.run_config`` updated with ``run_config`` (its
    keys win). ``flwr.simulation.run_simulation`` has no run-config
    argument in Flower 1.41 (the ClientApps then see an empty run config); this is how
    :mod:`simulations.run` passes a job's config to the app. A module-level class, so
    that Ray can pickle the ``ClientApp`` that carries it.

    Parameters
    ----------
    run_config : Mapping[str, Any]
        Flower run-config keys (``num-selected``, ``selector``, ...) and values
        (``bool``, ``int``, ``float`` or ``str``).
    """

    def __init__(self, run_config: Mapping[str, Any]) -> None:
        self.run_config = dict(run_config)

    def __call__(self, msg: Message, context: Context, call_next: Any) -> Message:
        """Run the next mod or the handler with the overlaid run config.

        The context's own run config is put back afterwards: Flower's simulation
        engine refuses a context whose ``run_config`` changed.
        """
        original = context.run_config
        context.run_config = {**original, **self.run_config}
        try:
            return call_next(msg, context)
        finally:
            context.run_config = original


def identity_key_of(context: Context) -> Ed25519PrivateKey | None:
    """The node's Ed25519 identity key, from the PEM file named by ``node_config["identity-key"]`` (if any)."""
    path = str(context.node_config.get("identity-key", ""))
    return load_identity_key(path) if path else None


def identity_directory_of(context: Context) -> IdentityDirectory | None:
    """The buyer's identity directory, from the JSON file named by ``node_config["identity-directory"]`` (if any)."""
    path = str(context.node_config.get("identity-directory", ""))
    return IdentityDirectory.from_json(Path(path)) if path else None


def buyer_key_of(context: Context) -> bytes | None:
    """The buyer's Ed25519 public key the node pins: ``node_config["market-buyer-key"]`` (64 hex digits), if any.

    With it the node refuses a market whose terms name another buyer key (every award must be signed by it);
    anything but 64 hex digits is refused, so that a typo never silently leaves the node unpinned.
    """
    value = context.node_config.get("market-buyer-key", "")
    if not isinstance(value, str):
        raise ValueError(f'node config "market-buyer-key" must be 64 hex digits, got {value!r}')
    text = value.strip()
    if not text:
        return None
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != 32:
        raise ValueError(f'node config "market-buyer-key" must be 64 hex digits, got {value!r}')
    return key


def complete_graph_of(context: Context) -> bool:
    """Whether the node takes part in PASS only on the complete graph: ``node_config["pass-complete-graph"]``.

    ``true`` (or ``"true"``) turns it on, absent or ``false`` leaves it off; anything else is refused (a
    typo must not silently leave a node on sparse graphs).
    """
    value = context.node_config.get("pass-complete-graph", False)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError(f'node config "pass-complete-graph" must be true or false, got {value!r}')


def min_participants_of(context: Context) -> int:
    """The smallest PASS roster the node takes part in: ``node_config["pass-min-participants"]`` (default 3).

    The server chooses whom it invites, so the complete graph (:func:`complete_graph_of`) protects a node only
    when this is close to the size of the federation it expects. An int, or a string of digits, of at least 3;
    anything else is refused (a typo must not silently leave the node at the default).
    """
    return _node_config_int(context, "pass-min-participants", default=MIN_PARTICIPANTS, minimum=MIN_PARTICIPANTS)


def split_tolerance_of(context: Context) -> int:
    """How many colluding neighbours the node's PASS secrets withstand in a split consistency round:
    ``node_config["pass-split-tolerance"]`` (default 0, the protocol's own threshold).

    It raises the Shamir threshold of the node's secrets
    (:func:`~flmarket_flwr.pass_protocol.graph.secret_threshold`), at the price of fewer neighbours that
    may drop out. An int, or a string of digits, of at least 0; anything else is refused.
    """
    return _node_config_int(context, "pass-split-tolerance", default=0, minimum=0)


def _node_config_int(context: Context, key: str, *, default: int, minimum: int) -> int:
    """``node_config[key]`` as an int of at least ``minimum`` (``default`` if absent), or a ``ValueError`` naming it.

    An int or a string of ASCII digits (node config values may arrive as strings); a bool, a float or any other
    string is refused, so that a typo never silently leaves the node at the default.
    """
    value = context.node_config.get(key, default)
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        value = int(value.strip())
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f'node config "{key}" must be an integer of at least {minimum}, got {value!r}')
    return value


def release_ledger_of(context: Context) -> ReleaseLedger | None:
    """The node's release ledger, in the directory named by ``node_config["market-ledger-dir"]`` (if any).

    ``node_config["market-min-roster-change"]`` (default 3) is the smallest group two releases may differ
    by. Off by default: a simulation's nodes are not lasting parties, and the operator of each SuperNode
    chooses where its state lives (README "A real deployment").
    """
    path = str(context.node_config.get("market-ledger-dir", ""))
    if not path:
        return None
    change = context.node_config.get("market-min-roster-change", DEFAULT_MIN_ROSTER_CHANGE)
    return ReleaseLedger(path, min_roster_change=int(change))


def market_noise_of(context: Context) -> SkellamNoise | None:
    """The node's distributed-DP noise on its counts: the run config's ``pass-dp-*`` keys (``None``: off).

    ``node_config["pass-dp-max-epsilon"]`` (a SuperNode operator's own ceiling, absent or 0: none) makes the
    node refuse to mask in a run that announces no noise, a larger epsilon, or less noise than that epsilon
    needs at delta 1e-6 with half the roster honest (a larger ``pass-dp-delta`` or ``pass-dp-honest-fraction``)
    (README "Threat model").
    """
    noise = market_noise(
        read(context.run_config, "pass-dp-epsilon"),
        read(context.run_config, "pass-dp-delta"),
        read(context.run_config, "pass-dp-honest-fraction"),
    )
    ceiling = float(context.node_config.get("pass-dp-max-epsilon", 0.0))
    if ceiling > 0:
        floor = SkellamNoise(ceiling)  # the noise the node's ceiling needs: delta 1e-6, half the roster honest
        if (
            noise is None
            or noise.epsilon > ceiling
            or noise.target_variance < floor.target_variance
            or noise.honest_fraction > floor.honest_fraction
        ):
            raise ValueError(f"the run's pass-dp-* noise is below this node's pass-dp-max-epsilon {ceiling}: refused")
    return noise


def build_client_app(run_config: Mapping[str, Any] | None = None) -> ClientApp:
    """Build the app's ``ClientApp``: market, train and evaluate handlers (nothing that reveals counts).

    Parameters
    ----------
    run_config : Mapping[str, Any], optional
        A run config laid over the one Flower provides (see :class:`RunConfigOverride`);
        ``None``: Flower's run config only (``flwr run``).

    Returns
    -------
    ClientApp
        A new app.
    """
    client = ClientApp(mods=[RunConfigOverride(run_config)] if run_config else None)
    register_market_handlers(
        client,
        get_label_counts=label_counts,
        bid_policy=simulated_cost_bid,
        identity_key=identity_key_of,
        directory=identity_directory_of,
        release_ledger=release_ledger_of,
        noise=market_noise_of,
        complete_graph=complete_graph_of,
        min_participants=min_participants_of,
        split_tolerance=split_tolerance_of,
        buyer_key=buyer_key_of,
    )
    client.train()(train)
    client.evaluate()(evaluate_local)
    return client


app = build_client_app()
"""The ``ClientApp`` that ``flwr run`` loads (``[tool.flwr.app.components]``)."""
