"""ClientApp of the FLMarket Flower app: one ``ClientApp`` for the market and for training.

Market messages go to :func:`~flmarket_flwr.market.register_market_handlers` with the partition's label
counts and a simulated cost bid; ``train`` / ``evaluate`` run local SGD on the partition
(``node_config["partition-id"]`` of ``"num-partitions"``). Every node-config key is declared once
(:data:`NODE_CONFIG`) and a bad node config is refused at the first message; :func:`build_client_app`
describes the keys (docs/configuration.md). ``app`` is the one that ``flwr run`` loads.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping
from functools import partial
from logging import INFO
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.app.typing import MetricRecordValues
from flwr.clientapp import ClientApp
from flwr.supercore import log

from flmarket_flwr.app.run_config import (
    DEFAULTS,
    market_noise,
    settings_from,
)
from flmarket_flwr.app.settings_fields import ClientFields, TrainFields
from flmarket_flwr.app.task import (
    DataConfig,
    build_task_model,
    configure_torch_threads,
    describe_device,
    evaluate,
    load_partition,
    partition_label_counts,
    peak_memory_mib,
    reset_peak_memory,
    resolve_device,
    training_seed,
)
from flmarket_flwr.app.task import train as train_model
from flmarket_flwr.market import SimulatedCostBid, read_award, register_market_handlers
from flmarket_flwr.market.node.node_config import (
    MARKET_SCHEMA,
    NodeConfigCheck,
    NodeKey,
    NodeSettings,
    read_node_settings,
)
from flmarket_flwr.market.wire.config_keys import at_least

if TYPE_CHECKING:
    import torch

STATE_KEY = "flmarket-app"
"""Key of this app's ``ConfigRecord`` in ``context.state`` (label-count cache)."""

APP_NODE_KEYS: Final[tuple[NodeKey, ...]] = (
    NodeKey("partition-id", int, None, "this node's partition of the data (set by the simulation engine)",
            at_least(0), ">= 0"),
    NodeKey("num-partitions", int, None, "the number of partitions: the federation's size", at_least(1), ">= 1"),
)  # fmt: skip
"""The app's own node-config keys (the market's are :data:`~flmarket_flwr.market.node.node_config.MARKET_NODE_KEYS`)."""

NODE_CONFIG: Final = MARKET_SCHEMA.extended(APP_NODE_KEYS, run_config_keys=DEFAULTS)
"""Every node-config key of the app; a run-config key given as node config is refused by name."""


class ClientSettings(ClientFields):
    """The run config as the ClientApp reads it: a field per key of :data:`~flmarket_flwr.app.run_config.APP_KEYS`
    read by the data config, the client or both apps, typed (the ServerApp checks the values)."""


class TrainSettings(TrainFields):
    """A train message's local-training settings (its ``config`` record, else the run config's)."""


def settings_of(context: Context) -> ClientSettings:
    """The run config of ``context`` as :class:`ClientSettings` (read at each message: overrides apply)."""
    return settings_from(ClientSettings, context.run_config)


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
    return int(NODE_CONFIG.value(context.node_config, "partition-id"))  # type: ignore[arg-type]


def data_config_of(context: Context, val_per_class: int = 0) -> DataConfig:
    """Return the data config shared by all clients of the run.

    The number of clients is the federation's: the node config's ``num-partitions`` (set by Flower's
    simulation, or ``flower-supernode --node-config "partition-id=<i> num-partitions=<n>"``); ``val_per_class``
    the server-side validation split held out of the pool (``0`` in the app; :func:`build_client_app`).
    """
    if "num-partitions" not in context.node_config:
        raise KeyError(
            "node_config has no 'num-partitions': start the SuperNode with "
            '--node-config "partition-id=<i> num-partitions=<n>"'
        )
    return DataConfig.from_run_config(context.run_config, context.node_config, val_per_class)


def label_counts(context: Context, val_per_class: int = 0) -> np.ndarray:
    """Per-class label counts ``N_e`` of this client (the market's input).

    Computed from the partition on first use, then read from ``context.state``
    (which survives between messages, also in a deployment where each message
    runs in a fresh process). The cache is keyed by the data config and the
    partition id, and never leaves the client.
    """
    partition_id = partition_id_of(context)
    data_config = data_config_of(context, val_per_class)
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
    settings = settings_of(context)
    policy = SimulatedCostBid(
        seed=settings.seed, low=settings.cost_low, high=settings.cost_high, markup=settings.bid_markup
    )
    return policy(label_counts, score, context)


def model_name_of(context: Context) -> str:
    """The model to train, from the run config (``model`` key)."""
    return str(settings_of(context).model)


def train(msg: Message, context: Context, val_per_class: int = 0) -> Message:
    """Train the received global model on the local partition."""
    import torch  # pylint: disable=C0415,redefined-outer-name

    from flmarket_flwr.app.models import set_arrays  # pylint: disable=C0415

    settings = settings_of(context)
    configure_torch_threads(settings.torch_threads)
    partition_id = partition_id_of(context)
    data_config = data_config_of(context, val_per_class)
    config: dict[str, Any] = dict(msg.content.config_records.get("config", ConfigRecord()))
    local = settings_from(TrainSettings, {**context.run_config, **config})
    server_round = int(config.get("server-round", 0))

    model = build_task_model(model_name_of(context), data_config)
    set_arrays(model, msg.content.array_records["arrays"])
    data = load_partition(partition_id, data_config)
    device = resolve_device(settings.device)
    seed = training_seed(data_config.seed, partition_id, server_round)
    torch.manual_seed(seed)  # Dropout and any other draw from torch's global generator: same run, same model.
    reset_peak_memory(device)
    started = time.perf_counter()
    train_loss = train_model(
        model,
        data,
        epochs=local.local_epochs,
        lr=local.learning_rate,
        device=device,
        batch_size=local.batch_size,
        momentum=local.momentum,
        seed=seed,
    )
    train_time = time.perf_counter() - started
    peak_mib = peak_memory_mib(device)
    log(
        INFO,
        "ClientApp node %d (partition %d), round %d: trained %d examples on %s in %.2f s, peak CUDA memory %s",
        context.node_id,
        partition_id,
        server_round,
        len(data[1]),
        describe_device(device),
        train_time,
        "none (CPU)" if peak_mib is None else f"{peak_mib:.1f} MiB",
    )
    _record_training(context, partition_id, server_round, len(data[1]), train_time, device, peak_mib)

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


def evaluate_local(msg: Message, context: Context, val_per_class: int = 0) -> Message:
    """Evaluate the received global model on the local partition."""
    from flmarket_flwr.app.models import set_arrays  # pylint: disable=C0415

    settings = settings_of(context)
    configure_torch_threads(settings.torch_threads)
    data_config = data_config_of(context, val_per_class)
    model = build_task_model(settings.model, data_config)
    set_arrays(model, msg.content.array_records["arrays"])
    data = load_partition(partition_id_of(context), data_config)
    device = resolve_device(settings.device)
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
    peak_cuda_mib: float | None = None,
) -> None:
    """Write an audit record of this train message when ``train-log-dir`` is set.

    One small JSON file per (node, round) in ``<train-log-dir>/run-<run_id>/``:
    tests use it to check, from the client side, that only the market's winners
    ever trained, and on which device (``device``; ``peak_cuda_mib``, the training's peak CUDA memory, ``null``
    on the CPU).
    """
    log_dir = str(settings_of(context).train_log_dir)
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
        "peak_cuda_mib": peak_cuda_mib,
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
        Flower run-config keys (``num-selected``, ``budget``, ...) and values
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


def node_settings_of(context: Context) -> NodeSettings:
    """The node's market settings: its node config's, with the run config's ``pass-dp-*`` noise announced.

    The node adds that noise to its counts, refused below its own ceiling (``pass-dp-max-epsilon`` in its node
    config); in the secure profile it adds the profile's noise when the run announces none
    (:func:`~flmarket_flwr.market.node.node_config.read_node_settings`).
    """
    run = settings_of(context)
    noise = market_noise(run.pass_dp_epsilon, run.pass_dp_delta, run.pass_dp_honest_fraction)
    return read_node_settings(context, announced_noise=noise)


def build_client_app(run_config: Mapping[str, Any] | None = None, val_per_class: int = 0) -> ClientApp:
    """Build the app's ``ClientApp``: market, train and evaluate handlers (nothing that reveals counts).

    Parameters
    ----------
    run_config : Mapping[str, Any], optional
        A run config laid over the one Flower provides (see :class:`RunConfigOverride`);
        ``None``: Flower's run config only (``flwr run``).
    val_per_class : int (default: 0)
        The server-side validation split held out of the training pool before it is partitioned
        (:func:`data_config_of`): ``0`` in the app; the experiments set it for S-FedAvg and the runs compared with it.

    Returns
    -------
    ClientApp
        A new app.

    Notes
    -----
    One ``ClientApp`` serves every phase of a run:

    * **Market** (``query.market_*`` messages): registered with
      :func:`~flmarket_flwr.market.register_market_handlers`. The client's label
      counts ``N_e`` come from its partition; its bid is its (simulated,
      heterogeneous) cost per sample times ``N_e``, plus a markup
      (:func:`simulated_cost_bid`). The server only ever sees them masked (PASS).
      The node's settings come from its node config, read once per message
      (:func:`~flmarket_flwr.market.node.node_config.read_node_settings`), with the run config's ``pass-dp-*`` noise
      announced (:func:`node_settings_of`). A node started with
      ``--node-config "... identity-key='<pem>' identity-directory='<json>'"`` and a pin
      (``identity-directory-digest`` or ``identity-directory-signer``) signs its PASS key advertisement and
      checks its neighbours' against the directory it pins. With ``market-ledger-dir='<dir>'`` it keeps a
      release ledger there and refuses a market whose members differ too little from one it already released a
      sum for; with ``pass-complete-graph=true`` it takes part in PASS only on the complete graph, and with
      ``pass-min-participants=<n>`` only in a roster of at least ``n`` nodes; with ``pass-split-tolerance=<c>``
      its secrets withstand ``c`` colluding neighbours in a split consistency round; with
      ``pass-dp-total-epsilon=<e>`` it refuses a release that would take its composed epsilon past ``e`` (its
      privacy budget, kept in its release ledger); with ``market-buyer-key=<64 hex digits>`` it takes part only
      in a market whose terms name that buyer key, which must sign the award before the node opens its counts.
      ``market-security=malicious`` turns all of these on (the secure profile).
    * No other query: the baselines' raw-statistics query (RS, QBS, DICE, DDS) is answered
      only by the experiments' ClientApp (:mod:`simulations.apps`), never by this one.
    * **Training** (``train`` / ``evaluate`` messages): plain local SGD on the
      client's partition with the configured model, on CUDA when available; each train message logs one line with
      the device it trained on and its peak CUDA memory (``ClientApp node ..., round r: trained n examples on
      cuda:0 (<GPU>) in t s, peak CUDA memory m MiB``).

    Every node-config key is declared once (:data:`NODE_CONFIG`: the market's keys,
    :mod:`flmarket_flwr.market.node.node_config`, and the app's own); a node config with an unknown key, a
    run-config key or a value that cannot work is refused at the first message (:class:`NodeConfigCheck`).

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
    mods: list[Any] = [NodeConfigCheck(NODE_CONFIG)]
    client = ClientApp(mods=[*mods, RunConfigOverride(run_config)] if run_config else mods)
    register_market_handlers(
        client, with_split(label_counts, val_per_class), simulated_cost_bid, settings=node_settings_of
    )
    client.train()(with_split(train, val_per_class))
    client.evaluate()(with_split(evaluate_local, val_per_class))
    return client


HandlerType = TypeVar("HandlerType", bound=Callable[..., Any])


def with_split(handler: HandlerType, val_per_class: int) -> HandlerType:
    """``handler`` (a message handler with a ``val_per_class`` parameter, passed to :func:`data_config_of`) with
    ``val_per_class`` bound; itself at ``0`` (a module-level function or a partial of one: Ray pickles either)."""
    return partial(handler, val_per_class=val_per_class) if val_per_class else handler  # type: ignore[return-value]


app = build_client_app()
"""The ``ClientApp`` that ``flwr run`` loads (``[tool.flwr.app.components]``)."""
