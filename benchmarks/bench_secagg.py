"""PASS v2 against Flower's own SecAgg+ at the same neighbourhood size and threshold, side by side.

Run: ``.venv/bin/python -m benchmarks.bench_secagg`` (E = 100, 1,000, 10,000; C = 10 and 1,000;
about 20 min on 2 cores, most of it the 10,000 PASS v2 clients run whole); ``--sizes``/``--classes``
to choose; ``--quick``: E = 100 only; ``--simulation``: also both protocols through Flower's Ray
simulation engine at E = 100 (``--simulation-only``: that part alone).

What runs
---------
Every client holds an integer vector of ``C`` label counts drawn in ``[0, 1000)``. Each protocol
must return their sum. Both use the same masking graph size: ``k = neighbourhood_size(E)``
(30, 32, 34 neighbours at E = 100, 1,000, 10,000) and the same reconstruction threshold
``t = k // 2 + 1`` (16, 17, 18).

* **PASS v2**: the market's own four message rounds, ``MarketPhase.run_pass``, against real
  ClientApps with the market handlers (:func:`simulations.inprocess_grid.market_client_app`):
  X25519 + ChaCha20 pairwise masks on the Harary graph of degree ``k``, double masking, Shamir
  shares of both secrets to the ``k`` neighbours at threshold ``t``.
* **SecAgg+**: Flower's legacy ``DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(...))`` in a
  ``LegacyContext`` with the legacy ``FedAvg``, against ``ClientApp(client_fn, mods=[secaggplus_mod])``
  whose ``NumPyClient.fit`` returns the counts (weight 1). ``num_shares = k + 1``: Flower counts the
  client itself (its ring neighbourhood is offsets ``-k/2 .. +k/2``, itself included, and it keeps
  one share), so each client has exactly ``k`` neighbours, as in PASS v2;
  ``reconstruction_threshold = t`` (Flower's ``t`` counts among the ``k + 1`` holders, the client
  included; PASS v2's among its ``k`` neighbours: PASS v2's is the stricter by one holder).
  Counts are floats to SecAgg+: ``clipping_range = 1024`` (a public bound above every count),
  ``quantization_range`` the largest power of two ``Q`` with ``E * Q < 2**32``
  (``modulus_range = 2**32``: the sum cannot wrap), ``max_weight = 1`` (the workflow returns the
  mean; the sum is the mean times ``E``).

How it is measured
------------------
Both protocols run through the same in-process grid (:class:`MeasuredGrid`, built on
:class:`~simulations.inprocess_grid.InProcessGrid`): every message crosses Flower's own wire
format and every node's ``Context`` is rebuilt from protobuf for every message, as in a deployment.

* *client CPU*: ``time.process_time`` around each ClientApp call (context load and save included;
  Flower's Shamir sharing runs in a thread pool, whose CPU is counted), summed per client;
* *server CPU*: process CPU of the whole run minus all clients' CPU (it includes the in-process
  transport's serialisation of both directions);
* *bytes*: length of the serialised messages, each client's replies (sent by the client) and
  every instruction (sent by the server);
* *peak RSS*: the process's resident-set high-water mark (``VmHWM``, reset through
  ``/proc/self/clear_refs`` just before the run) and its rise over the RSS before the run. Server,
  all ``E`` clients' stored ``Context``s and the transport share the process: an upper bound for
  the server; the clients' stored contexts are reported beside it.

SecAgg+ is run whole at E = 100 only (``--secagg-whole-max``): whole at E = 1,000 it would take
about 4 min of CPU per C here (137 ms per client, about 110 ms of server unmasking per client), and
E = 10,000 ten times that. Above it, ONE client runs ``secaggplus_mod`` for real through all four
stages with exactly ``k`` neighbours holding real P-384 key pairs (its cost does not depend on
``E`` beyond ``SAMPLE_NUMBER``): the server's messages to it are built as the workflow builds them
(the ``k`` encrypted shares addressed to it are real Fernet ciphertexts under real ECDH keys, of
shares of the real sizes). Its CPU and bytes are the per-client figures; server bytes are ``E``
times its instructions; server CPU is ``E`` times one measured Shamir reconstruction at threshold
``t`` plus one mask expansion (the unmask step; a lower bound: the transport and the forwarding of
the shares are left out); server memory is not measured there. These rows say "1 client driven
x E". The same driver at E = 100 is printed beside the whole run as a check.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from uuid import uuid4

import numpy as np
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.client import NumPyClient
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.common import FitIns, NDArrays, Parameters, Scalar, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.secure_aggregation.crypto.shamir import combine_shares, create_shares
from flwr.common.secure_aggregation.crypto.symmetric_encryption import encrypt, generate_shared_key
from flwr.common.secure_aggregation.quantization import dequantize, quantize
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
from flwr.common.secure_aggregation.secaggplus_utils import pseudo_rand_gen, share_keys_plaintext_concat
from flwr.compat.common import recorddict_compat as compat
from flwr.server import LegacyContext, ServerConfig
from flwr.server.strategy import FedAvg as LegacyFedAvg
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_PARAMS_RECORD
from flwr.serverapp import Grid, ServerApp
from flwr.supercore.primitives.asymmetric import (
    bytes_to_private_key,
    bytes_to_public_key,
    generate_key_pairs,
    private_key_to_bytes,
    public_key_to_bytes,
)

from flmarket_flwr.market import MarketConfig, MarketPhase, register_market_handlers
from flmarket_flwr.pass_protocol.graph import neighbourhood_size, share_threshold
from simulations.inprocess_grid import InProcessGrid, market_client_app, serverapp_identity, wire_roundtrip

SIZES = (100, 1_000, 10_000)
QUICK_SIZES = (100,)
CLASS_COUNTS = (10, 1_000)
TARGET_RATIO = 20  # issue 21: at least 20x less client CPU than SecAgg+ at every E from 100 to 10,000
SIMULATION_SIZES = (100,)
MAX_COUNT = 1000
CLIPPING_RANGE = 1024.0
MODULUS_RANGE = 2**32


# --- Memory -------------------------------------------------------------------------------------
def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


class PeakRss:
    """Peak RSS of a block: ``VmHWM`` reset through ``/proc/self/clear_refs`` at entry (NaN if not allowed)."""

    def __enter__(self) -> PeakRss:
        self.before = _status_mib("VmRSS")
        try:
            Path("/proc/self/clear_refs").write_text("5")
            self.reset = True
        except OSError:
            self.reset = False
        return self

    def __exit__(self, *exc: object) -> None:
        self.peak = _status_mib("VmHWM") if self.reset else math.nan


# --- Measuring grid -----------------------------------------------------------------------------
class MeasuredGrid(InProcessGrid):
    """In-process grid that counts each client's CPU and bytes, and the server's bytes."""

    def __init__(self, client_app: ClientApp | Callable[[], ClientApp], node_ids: list[int]) -> None:
        super().__init__(client_app, node_ids, shuffle_seed=None)
        self.client_cpu: dict[int, float] = defaultdict(float)
        self.client_bytes: dict[int, int] = defaultdict(int)
        self.server_bytes = 0
        self.server_bytes_to: dict[int, int] = defaultdict(int)

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        ids = []
        for message in messages:
            node = message.metadata.dst_node_id
            if node not in self._contexts:
                raise ValueError(f"unknown destination node {node}")
            message.metadata.__dict__["_message_id"] = str(uuid4())
            copy, raw = wire_roundtrip(message)
            self.server_bytes += len(raw)
            self.server_bytes_to[node] += len(raw)
            self._accept(message.metadata.message_id, copy)
            ids.append(message.metadata.message_id)
        return ids

    def _deliver(self, message: Message) -> Message | None:
        node = message.metadata.dst_node_id
        started = time.process_time()
        reply = super()._deliver(message)
        self.client_cpu[node] += time.process_time() - started
        return reply

    def _receive(self, reply: Message) -> Message:
        received, raw = wire_roundtrip(reply)
        self.client_bytes[reply.metadata.src_node_id] += len(raw)
        return received


@dataclass
class Row:
    """One measured (or, where ``how`` says so, extrapolated) aggregation."""

    protocol: str
    num_clients: int
    num_classes: int
    how: str
    wall_s: float
    client_cpu_mean_s: float
    client_cpu_max_s: float
    server_cpu_s: float
    client_bytes_mean: float
    server_bytes: float
    max_error: float
    exact: bool
    load: float = math.nan
    degree: int = 0
    threshold: int = 0
    peak_rss_mib: float = math.nan
    rss_rise_mib: float = math.nan
    client_state_mib: float = math.nan


def _row(
    protocol: str, grid: MeasuredGrid, wall: float, cpu: float, total: np.ndarray, truth: np.ndarray, rss: PeakRss
) -> Row:
    client_cpu = np.array(list(grid.client_cpu.values()))
    error = float(np.max(np.abs(total.astype(np.float64) - truth))) if total.size else math.nan
    k = matched_degree(len(grid.node_ids))
    return Row(
        protocol=protocol,
        num_clients=len(grid.node_ids),
        num_classes=truth.size,
        how="measured, whole protocol",
        wall_s=wall,
        client_cpu_mean_s=float(client_cpu.mean()),
        client_cpu_max_s=float(client_cpu.max()),
        server_cpu_s=cpu - float(client_cpu.sum()),
        client_bytes_mean=float(np.mean(list(grid.client_bytes.values()))),
        server_bytes=float(grid.server_bytes),
        max_error=error,
        exact=bool(np.array_equal(np.rint(total).astype(np.int64), truth)),
        load=os.getloadavg()[0],
        degree=k,
        threshold=share_threshold(k),
        peak_rss_mib=rss.peak,
        rss_rise_mib=rss.peak - rss.before,
        client_state_mib=sum(len(raw) for raw in grid._contexts.values()) / 2**20,  # pylint: disable=W0212
    )


def matched_degree(num_clients: int) -> int:
    """``k``: PASS v2's default graph degree for E clients, which SecAgg+ is given too."""
    return neighbourhood_size(num_clients)


def make_counts(num_clients: int, num_classes: int) -> np.ndarray:
    """The ``(E, C)`` integer counts of one benchmark case, in ``[0, MAX_COUNT)``."""
    return np.random.default_rng(num_clients * 7 + num_classes).integers(0, MAX_COUNT, size=(num_clients, num_classes))


def node_ids(num_clients: int) -> list[int]:
    return [10_000 + i for i in range(num_clients)]


# --- PASS ---------------------------------------------------------------------------------------
def run_pass(counts: np.ndarray) -> Row:
    num_clients, num_classes = counts.shape
    nodes = node_ids(num_clients)
    grid = MeasuredGrid(market_client_app(dict(zip(nodes, counts, strict=True))), nodes)
    phase = MarketPhase(MarketConfig(budget=1.0, num_classes=num_classes, timeout=3600.0, poll_interval=0.001))
    with PeakRss() as rss:
        cpu, wall = time.process_time(), time.perf_counter()
        result = phase.run_pass(grid, nodes)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert result.participants == nodes
    return _row("PASS v2", grid, wall, cpu, np.asarray(result.global_counts), counts.sum(axis=0), rss)


# --- SecAgg+ ------------------------------------------------------------------------------------
class CountsClient(NumPyClient):
    """A client whose 'model update' is its label-count vector, with weight 1."""

    def __init__(self, counts: np.ndarray) -> None:
        self.counts = counts

    def fit(self, parameters: NDArrays, config: dict[str, Scalar]) -> tuple[NDArrays, int, dict[str, Scalar]]:
        return [self.counts.astype(np.float64)], 1, {}


def secagg_client_app(counts_of: Callable[[Context], np.ndarray]) -> ClientApp:
    return ClientApp(client_fn=lambda context: CountsClient(counts_of(context)).to_client(), mods=[secaggplus_mod])


def quantization_range(num_clients: int) -> int:
    """Largest power of two Q with E * Q < 2**32: the sum of E vectors in [0, Q] cannot wrap."""
    return 2 ** int(math.floor(math.log2((MODULUS_RANGE - 1) / num_clients)))


def secagg_shares(num_clients: int, degree: int | None = None, threshold: int | None = None) -> tuple[int, int]:
    """``(num_shares, reconstruction_threshold)``: ``k`` neighbours plus the client itself, threshold ``t``.

    ``k`` is :func:`matched_degree` unless ``degree`` is given (``E - 1``: SecAgg+ on the complete graph); ``t`` is
    :func:`share_threshold` of ``k`` unless ``threshold`` is given (another PASS mode's ``t``).
    """
    k = matched_degree(num_clients) if degree is None else degree
    return k + 1, share_threshold(k) if threshold is None else threshold


def secagg_workflow(num_clients: int, timeout: float | None = None) -> SecAggPlusWorkflow:
    shares, threshold = secagg_shares(num_clients)
    return SecAggPlusWorkflow(
        num_shares=shares,
        reconstruction_threshold=threshold,
        max_weight=1.0,
        clipping_range=CLIPPING_RANGE,
        quantization_range=quantization_range(num_clients),
        modulus_range=MODULUS_RANGE,
        timeout=timeout,
    )


def legacy_context(context: Context, num_clients: int, num_rounds: int = 1) -> LegacyContext:
    strategy = LegacyFedAvg(
        fraction_fit=1.0,
        fraction_evaluate=0.0,
        min_fit_clients=num_clients,
        min_available_clients=num_clients,
        initial_parameters=ndarrays_to_parameters([]),
    )
    return LegacyContext(context=context, config=ServerConfig(num_rounds=num_rounds), strategy=strategy)


def secagg_sum(context: LegacyContext, num_clients: int) -> np.ndarray:
    """The sum of the counts: the workflow's weighted mean (weights 1) times E."""
    record = context.state.array_records[MAIN_PARAMS_RECORD]
    (mean,) = parameters_to_ndarrays(compat.arrayrecord_to_parameters(record, keep_input=True))
    return mean * num_clients


def run_secagg(counts: np.ndarray) -> Row:
    num_clients, _ = counts.shape
    nodes = node_ids(num_clients)
    by_node = dict(zip(nodes, counts, strict=True))
    grid = MeasuredGrid(secagg_client_app(lambda context: by_node[context.node_id]), nodes)
    server_context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    context = legacy_context(server_context, num_clients)
    workflow = DefaultWorkflow(fit_workflow=secagg_workflow(num_clients))
    with PeakRss() as rss:
        cpu, wall = time.process_time(), time.perf_counter()
        workflow(grid, context)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return _row("SecAgg+", grid, wall, cpu, secagg_sum(context, num_clients), counts.sum(axis=0), rss)


def drive_one_secagg_client(
    num_clients: int, counts_by_classes: dict[int, np.ndarray], degree: int | None = None, threshold: int | None = None
) -> list[Row]:
    """SecAgg+ for ONE client with its ``k`` real neighbours in a roster of E; see the module docstring.

    ``degree``: ``k`` (default :func:`matched_degree`; ``E - 1`` for the complete graph); ``threshold``: ``t``
    (default :func:`share_threshold` of ``k``), see :func:`secagg_shares`.
    """
    shares, threshold = secagg_shares(num_clients, degree, threshold)
    me, others = 10_000, [10_001 + i for i in range(shares - 1)]
    current: dict[str, np.ndarray] = {}
    grid = MeasuredGrid(secagg_client_app(lambda context: current["counts"]), [me])
    neighbour_keys = {}
    for node in others:
        _, pk1 = generate_key_pairs()
        sk2, pk2 = generate_key_pairs()
        neighbour_keys[node] = (public_key_to_bytes(pk1), public_key_to_bytes(pk2), private_key_to_bytes(sk2))

    def send(record: ConfigRecord, content: RecordDict | None = None) -> ConfigRecord:
        content = content if content is not None else RecordDict()
        content.config_records[RECORD_KEY_CONFIGS] = record
        message = Message(content, dst_node_id=me, message_type=MessageType.TRAIN, group_id="1")
        (reply,) = grid.send_and_receive([message])
        assert not reply.has_error(), reply.error
        return reply.content.config_records[RECORD_KEY_CONFIGS]

    # Stage 0 (setup) and 1 (share keys): independent of C, run once.
    setup = send(
        ConfigRecord(
            {
                Key.STAGE: Stage.SETUP,
                Key.SAMPLE_NUMBER: num_clients,
                Key.SHARE_NUMBER: shares,
                Key.THRESHOLD: threshold,
                Key.CLIPPING_RANGE: CLIPPING_RANGE,
                Key.TARGET_RANGE: quantization_range(num_clients),
                Key.MOD_RANGE: MODULUS_RANGE,
                Key.MAX_WEIGHT: 1.0,
            }
        )
    )
    my_pk1, my_pk2 = setup[Key.PUBLIC_KEY_1], setup[Key.PUBLIC_KEY_2]
    assert isinstance(my_pk1, bytes) and isinstance(my_pk2, bytes), "secaggplus_mod's setup reply has no public keys"
    keys = {str(node): [pk1, pk2] for node, (pk1, pk2, _) in neighbour_keys.items()}
    keys[str(me)] = [my_pk1, my_pk2]
    share_keys = send(ConfigRecord({**keys, Key.STAGE: Stage.SHARE_KEYS}))
    share_ciphertexts = share_keys[Key.CIPHERTEXT_LIST]
    assert isinstance(share_ciphertexts, list) and len(share_ciphertexts) == shares - 1
    cpu_keys, bytes_keys, server_keys = grid.client_cpu[me], grid.client_bytes[me], grid.server_bytes
    after_keys = grid._contexts[me]  # pylint: disable=protected-access

    # The k encrypted shares addressed to this client, as its neighbours' mods would make them.
    seed_share_len = len(create_shares(os.urandom(32), threshold, 2)[0])
    key_share_len = len(create_shares(private_key_to_bytes(generate_key_pairs()[0]), threshold, 2)[0])
    ciphertexts = []
    for node, (_, _, neighbour_sk2) in neighbour_keys.items():
        shared = generate_shared_key(bytes_to_private_key(neighbour_sk2), bytes_to_public_key(my_pk2))
        plaintext = share_keys_plaintext_concat(node, me, os.urandom(seed_share_len), os.urandom(key_share_len))
        ciphertexts.append(encrypt(shared, plaintext))

    # Server side: one reconstruction at the threshold and one mask expansion, times E.
    seed_shares = create_shares(os.urandom(32), threshold, shares)[:threshold]
    started = time.process_time()
    combine_shares(seed_shares)
    combine_s = time.process_time() - started

    rows = []
    for num_classes, counts in counts_by_classes.items():
        current["counts"] = counts
        grid._contexts[me] = after_keys  # pylint: disable=protected-access
        grid.client_cpu[me], grid.client_bytes[me], grid.server_bytes = cpu_keys, bytes_keys, server_keys
        fit_content = compat.fitins_to_recorddict(FitIns(Parameters(tensors=[], tensor_type="numpy.ndarray"), {}), True)
        masked = send(
            ConfigRecord(
                {
                    Key.STAGE: Stage.COLLECT_MASKED_VECTORS,
                    Key.CIPHERTEXT_LIST: ciphertexts,
                    Key.SOURCE_LIST: list(neighbour_keys),
                }
            ),
            fit_content,
        )
        masked_parameters = masked[Key.MASKED_PARAMETERS]
        assert isinstance(masked_parameters, list) and len(masked_parameters) == 2  # the weight factor, the vector
        unmask = send(
            ConfigRecord({Key.STAGE: Stage.UNMASK, Key.ACTIVE_NODE_ID_LIST: [me, *others], Key.DEAD_NODE_ID_LIST: []})
        )
        share_list = unmask[Key.SHARE_LIST]
        assert isinstance(share_list, list) and len(share_list) == shares
        started = time.process_time()
        pseudo_rand_gen(os.urandom(32), MODULUS_RANGE, [(1,), (num_classes,)])
        prg_s = time.process_time() - started
        client_cpu = grid.client_cpu[me]
        server_cpu = num_clients * (combine_s + prg_s)
        rows.append(
            Row(
                protocol="SecAgg+",
                num_clients=num_clients,
                num_classes=num_classes,
                how=f"1 client driven x {num_clients}",
                wall_s=num_clients * client_cpu + server_cpu,
                client_cpu_mean_s=client_cpu,
                client_cpu_max_s=client_cpu,
                server_cpu_s=server_cpu,
                client_bytes_mean=float(grid.client_bytes[me]),
                server_bytes=float(num_clients * grid.server_bytes),
                max_error=math.nan,
                exact=True,
                load=os.getloadavg()[0],
                degree=shares - 1,
                threshold=threshold,
            )
        )
    return rows


def quantisation_error(counts: np.ndarray, clipping_range: float, seed: int = 0) -> tuple[float, bool]:
    """SecAgg+'s error on the sum of ``counts`` from its quantisation alone, with Flower's own functions.

    The masks cancel exactly modulo ``2**32`` (no wrap: ``E * Q < 2**32``), so the workflow's
    result is ``dequantize(sum_e quantize(x_e))`` shifted and scaled as in its unmask stage.
    Returns the largest absolute error on the sum and whether rounding recovers every count.
    """
    num_clients = counts.shape[0]
    target = quantization_range(num_clients)
    np.random.seed(seed)  # Flower's stochastic rounding draws from numpy's global generator
    quantised = np.zeros(counts.shape[1], dtype=np.int64)
    for row in counts:  # in row order: the stochastic rounding's draws are as before
        quantised += quantize([row.astype(np.float64)], clipping_range, target)[0].astype(np.int64)
    (mean,) = dequantize([quantised], clipping_range, target)
    total = mean - (num_clients - 1) * clipping_range  # the workflow's offset; weights 1: the sum itself
    truth = counts.sum(axis=0)
    return float(np.max(np.abs(total - truth))), bool(np.array_equal(np.rint(total).astype(np.int64), truth))


# --- Flower simulation (Ray) --------------------------------------------------------------------
def simulate(protocol: str, counts: np.ndarray) -> dict[str, float]:
    """Run one aggregation through ``flwr.simulation.run_simulation``; return its timings."""
    from flwr.simulation import run_simulation  # pylint: disable=import-outside-toplevel

    num_clients, num_classes = counts.shape
    out: dict[str, float] = {}
    rounds: list[float] = []  # aggregation times: the first (cold: Ray starts the actors), then warm

    def counts_of(context: Context) -> np.ndarray:
        return counts[int(context.node_config["partition-id"])]

    def wait_for_nodes(grid: Grid) -> list[int]:
        deadline = time.monotonic() + 300
        while len(nodes := sorted(grid.get_node_ids())) < num_clients and time.monotonic() < deadline:
            time.sleep(0.2)
        return nodes

    server = ServerApp()
    if protocol == "PASS":
        client = ClientApp()
        register_market_handlers(client, counts_of)

        @server.main()
        def _pass(grid: Grid, context: Context) -> None:
            nodes = wait_for_nodes(grid)
            phase = MarketPhase(MarketConfig(budget=1.0, num_classes=num_classes, timeout=600.0))
            started = time.perf_counter()  # once: a PASS v2 client takes part in one session per run
            result = phase.run_pass(grid, nodes)
            rounds.append(time.perf_counter() - started)
            out["exact"] = float(np.array_equal(result.global_counts, counts.sum(axis=0)))

    else:
        client = secagg_client_app(counts_of)

        class TimedWorkflow(SecAggPlusWorkflow):
            def __call__(self, grid: Grid, context: Context) -> None:
                started = time.perf_counter()
                super().__call__(grid, context)
                rounds.append(time.perf_counter() - started)

        @server.main()
        def _secagg(grid: Grid, context: Context) -> None:
            wait_for_nodes(grid)
            legacy = legacy_context(context, num_clients, num_rounds=2)
            base = secagg_workflow(num_clients, timeout=600.0)
            workflow = TimedWorkflow(
                num_shares=base.num_shares,
                reconstruction_threshold=base.reconstruction_threshold,
                max_weight=base.max_weight,
                clipping_range=base.clipping_range,
                quantization_range=base.quantization_range,
                modulus_range=base.modulus_range,
                timeout=base.timeout,
            )
            DefaultWorkflow(fit_workflow=workflow)(grid, legacy)
            total = secagg_sum(legacy, num_clients)
            out["exact"] = float(np.array_equal(np.rint(total).astype(np.int64), counts.sum(axis=0)))

    started = time.perf_counter()
    run_simulation(
        server_app=server,
        client_app=client,
        num_supernodes=num_clients,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
    )
    out["run_simulation_s"] = time.perf_counter() - started
    out["cold_s"], out["warm_s"] = rounds[0], (rounds[1] if len(rounds) > 1 else math.nan)
    return out


# --- Report -------------------------------------------------------------------------------------
def _bytes(value: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value:.0f} B"


def _seconds(value: float) -> str:
    return f"{value * 1e3:.3g} ms" if value < 1 else f"{value:.3g} s"


def _mib(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.1f} MiB"


def print_table(rows: list[Row]) -> None:
    print(
        "| E | C | k | t | protocol | how | wall | client CPU mean (max) | server CPU | bytes sent per client "
        "| bytes sent by server | peak RSS (rise during the run) | clients' stored contexts after the run "
        "| exact | load |"
    )
    print("|---:|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for r in rows:
        exact = "n/a (not run whole)" if math.isnan(r.max_error) else ("yes" if r.exact else "NO")
        rss = "—" if math.isnan(r.peak_rss_mib) else f"{r.peak_rss_mib:.0f} MiB ({r.rss_rise_mib:+.0f} MiB)"
        print(
            f"| {r.num_clients:,} | {r.num_classes:,} | {r.degree} | {r.threshold} | {r.protocol} | {r.how} "
            f"| {_seconds(r.wall_s)} | {_seconds(r.client_cpu_mean_s)} ({_seconds(r.client_cpu_max_s)}) "
            f"| {_seconds(r.server_cpu_s)} | {_bytes(r.client_bytes_mean)} | {_bytes(r.server_bytes)} | {rss} "
            f"| {_mib(r.client_state_mib)} | {exact} | {r.load:.1f} |"
        )


def print_ratios(rows: list[Row]) -> None:
    print("\nRatios SecAgg+ / PASS v2 at the same k and t (higher: PASS v2 cheaper)\n")
    print("| E | C | SecAgg+ how | client CPU | bytes per client | server bytes | server CPU |")
    print("|---:|---:|---|---:|---:|---:|---:|")
    passes = {(r.num_clients, r.num_classes): r for r in rows if r.protocol == "PASS v2"}
    for r in rows:
        base = passes.get((r.num_clients, r.num_classes))
        if r.protocol == "PASS v2" or base is None:
            continue
        print(
            f"| {r.num_clients:,} | {r.num_classes:,} | {r.how} "
            f"| {r.client_cpu_mean_s / base.client_cpu_mean_s:.1f}x "
            f"| {r.client_bytes_mean / base.client_bytes_mean:.1f}x | {r.server_bytes / base.server_bytes:.1f}x "
            f"| {r.server_cpu_s / base.server_cpu_s:.1f}x |"
        )


def print_quantisation(sizes: Iterable[int]) -> None:
    print(
        "\nSecAgg+ quantisation error on the summed counts, by clipping_range "
        "(Flower's quantize/dequantize, C = 1,000):\n"
    )
    print("| E | Q | clipping 1024 (used) | clipping 1000 | clipping 8.0 (Flower's default) |")
    print("|---:|---:|---|---|---|")
    for num_clients in sizes:
        counts = np.random.default_rng(num_clients).integers(0, MAX_COUNT, size=(num_clients, 1_000))
        cells = []
        for clip in (1024.0, 1000.0, 8.0):
            error, exact = quantisation_error(counts, clip)
            cells.append(f"{error:.3g} ({'exact' if exact else 'wrong'} after rounding)")
        exponent = int(math.log2(quantization_range(num_clients)))
        print(f"| {num_clients:,} | 2**{exponent} | " + " | ".join(cells) + " |")


def print_simulation(class_counts: Iterable[int]) -> None:
    print(
        "\nFlower simulation (run_simulation, Ray, 2 actors x 1 CPU): SecAgg+ aggregates twice in one run (the "
        "first pays for Ray starting the actors); PASS v2 once (one session per run)\n"
    )
    print("| E | C | protocol | first aggregation (cold) | second (warm) | whole run_simulation | exact |")
    print("|---:|---:|---|---:|---:|---:|---|")
    for num_clients in SIMULATION_SIZES:
        for num_classes in class_counts:
            counts = make_counts(num_clients, num_classes)
            for protocol in ("PASS", "SecAgg+"):
                timing = simulate(protocol, counts)
                warm = "—" if math.isnan(timing["warm_s"]) else _seconds(timing["warm_s"])
                print(
                    f"| {num_clients} | {num_classes:,} | {protocol} | {_seconds(timing['cold_s'])} "
                    f"| {warm} | {_seconds(timing['run_simulation_s'])} "
                    f"| {'yes' if timing.get('exact') else 'NO'} |",
                    flush=True,
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="E = 100 only")
    parser.add_argument("--sizes", type=int, nargs="*", help="numbers of clients E (default 100 1000 10000)")
    parser.add_argument("--classes", type=int, nargs="*", default=list(CLASS_COUNTS), help="numbers of classes C")
    parser.add_argument("--secagg-whole-max", type=int, default=100, help="largest E at which SecAgg+ runs whole")
    parser.add_argument("--simulation", action="store_true", help="also run both through Flower's Ray simulation")
    parser.add_argument("--simulation-only", action="store_true", help="only the Ray simulation part")
    parser.add_argument("--json", help="also write every row to this JSON file")
    args = parser.parse_args()
    logging.getLogger("flwr").setLevel(logging.WARNING)
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"numpy {np.__version__}; load average at start {os.getloadavg()[0]:.2f}\n"
    )
    sizes = args.sizes or (QUICK_SIZES if args.quick else SIZES)
    rows: list[Row] = []
    for num_clients in () if args.simulation_only else sizes:
        data = {c: make_counts(num_clients, c) for c in args.classes}
        with serverapp_identity():  # this process plays the ServerApp of every grid's run (their default run id)
            for num_classes in args.classes:
                rows.append(run_pass(data[num_classes]))
                if num_clients <= args.secagg_whole_max:
                    rows.append(run_secagg(data[num_classes]))
                print(
                    f"  ... E={num_clients} C={num_classes} whole runs done, load {os.getloadavg()[0]:.1f}", flush=True
                )
            driven = drive_one_secagg_client(num_clients, {c: data[c][0] for c in args.classes})
        if num_clients <= args.secagg_whole_max:
            for row in driven:
                row.how += " (check of the driver)"
        rows.extend(driven)
        data.clear()
    rows.sort(key=lambda r: (r.num_clients, r.num_classes, r.protocol != "PASS v2", r.how))
    if rows:
        print()
        print_table(rows)
        print_ratios(rows)
        print(f"\nTarget (issue 21): PASS v2 at least {TARGET_RATIO}x less client CPU than SecAgg+ at every E:")
        for r in rows:
            if r.protocol == "SecAgg+" and "check" not in r.how:
                base = next(
                    p
                    for p in rows
                    if p.protocol == "PASS v2" and (p.num_clients, p.num_classes) == (r.num_clients, r.num_classes)
                )
                ratio = r.client_cpu_mean_s / base.client_cpu_mean_s
                verdict = "(met)" if ratio >= TARGET_RATIO else "(NOT met)"
                print(f"  E={r.num_clients:,} C={r.num_classes:,}: {ratio:.1f}x {verdict}")
        print(
            f"\nSecAgg+ settings: clipping_range {CLIPPING_RANGE:g}, modulus_range 2**32; per E: "
            + ", ".join(
                f"E={e}: quantization_range 2**{int(math.log2(quantization_range(e)))}, "
                f"(num_shares, threshold) = {secagg_shares(e)}"
                for e in sizes
            )
        )
        print_quantisation(s for s in sizes if s <= 1_000)
    if args.simulation or args.simulation_only:
        print_simulation(args.classes)
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump([asdict(r) for r in rows], file, indent=2)


if __name__ == "__main__":
    main()
