"""End-to-end: the FLMarket app in a real SuperLink / SuperNode deployment on loopback.

Starts ``flower-superlink --insecure`` and ``flower-supernode --insecure`` processes (each with its
own free port and ``--node-config "partition-id=i num-partitions=n"``), writes a SuperLink
connection into a temporary ``FLWR_HOME/config.toml`` and runs ``flwr run <app> <connection>
--stream``. Each of these processes spawns a ``flower-superexec`` child (which spawns the ServerApp /
ClientApp processes): the whole process tree is stopped by PID in a ``finally``, with bounded waits
everywhere. The ServerApp and ClientApps import ``flmarket_flwr`` from this checkout (``PYTHONPATH``).

The dropout test runs ``tests/dropout_app`` (the product's apps, with a ClientApp mod that makes one
chosen SuperNode hang in PASS's ``market_mask`` round) and kills that SuperNode while it hangs.
"""

import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import pytest
from processes import free_ports, is_alive, pids_with_env, proc_table, process_tree, started_by, stop_pids, stop_started

PROJECT = Path(__file__).resolve().parents[1]
DROPOUT_APP = Path(__file__).resolve().parent / "dropout_app"
BIN_DIR = Path(sys.executable).parent
NUM_NODES = 3
STARTUP_TIMEOUT_S = 60
RUN_TIMEOUT_S = 400
HANG_MARKER_ENV = "FLMARKET_TEST_HANG_MARKER"  # read by tests/dropout_app's ClientApp
BIG_REPLY_MARKER_ENV = "FLMARKET_TEST_BIG_REPLY_MARKER"
MASK_DELAY_ENV = "FLMARKET_TEST_MASK_DELAY_S"

pytestmark = pytest.mark.skipif(
    not (BIN_DIR / "flower-superlink").exists() or not Path("/proc").is_dir(),
    reason="needs Flower's executables next to the Python interpreter and /proc (Linux)",
)


# --- Process and port helpers ----------------------------------------------------------------
def stop_process_tree(processes: list[subprocess.Popen], grace_s: float = 10.0) -> None:
    """Stop ``processes`` and all their descendants by PID, then reap the ``Popen`` objects."""
    stop_pids(process_tree([proc.pid for proc in processes]), grace_s)
    for proc in processes:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def wait_for_health(port: int, process: subprocess.Popen, timeout_s: float, ca_file: Path | None = None) -> None:
    """Wait (bounded) until the SuperLink answers on ``/health`` (over HTTPS, trusting ``ca_file``, if given)."""
    scheme, context = ("https", ssl.create_default_context(cafile=str(ca_file))) if ca_file else ("http", None)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"flower-superlink exited with code {process.returncode}")
        try:
            with urllib.request.urlopen(f"{scheme}://127.0.0.1:{port}/health", timeout=1, context=context) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"SuperLink not healthy on port {port} after {timeout_s:g} s")


def write_certificates(folder: Path) -> dict[str, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1 / localhost, as PEM files in ``folder``."""
    # pylint: disable=import-outside-toplevel
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True)
    now = datetime.datetime.now(datetime.UTC)

    def certificate(subject: str, key, issuer: str, issuer_key, extensions) -> x509.Certificate:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
        )
        for extension, critical in extensions:
            builder = builder.add_extension(extension, critical=critical)
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = certificate(
        "flmarket test CA",
        ca_key,
        "flmarket test CA",
        ca_key,
        [(x509.BasicConstraints(ca=True, path_length=None), True)],
    )
    names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    server = certificate(
        "127.0.0.1",
        server_key,
        "flmarket test CA",
        ca_key,
        [(x509.SubjectAlternativeName(names), False), (x509.BasicConstraints(ca=False, path_length=None), True)],
    )
    paths = {"ca": folder / "ca.crt", "cert": folder / "server.pem", "key": folder / "server.key"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(
        server_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return paths


def write_node_key(path: Path) -> Path:
    """A SuperNode's ECDSA P-384 key pair in OpenSSH format (``path`` and ``path.pub``, like ssh-keygen)."""
    # pylint: disable=import-outside-toplevel
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    path.parent.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
    )
    path.with_suffix(".pub").write_bytes(
        key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    )
    return path


# --- The deployment --------------------------------------------------------------------------
class Deployment:
    """A SuperLink and ``num_nodes`` SuperNodes on loopback, with a private FLWR_HOME.

    ``secure=True``: TLS with a throwaway CA and SuperNode authentication (each SuperNode's key
    registered with ``flwr supernode register`` before it starts), as in ``docs/deployment.md``;
    otherwise ``--insecure``.
    """

    def __init__(self, root: Path, num_nodes: int = NUM_NODES, secure: bool = False) -> None:
        self.root = root
        self.num_nodes = num_nodes
        self.secure = secure
        self.home = root / "flwr-home"
        self.home.mkdir()
        ports = free_ports(num_nodes + 1)
        self.superlink_port, self.node_ports = ports[0], ports[1:]
        self.env = {
            **os.environ,
            "FLWR_HOME": str(self.home),
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "PATH": f"{BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT), os.environ.get("PYTHONPATH")])),
        }
        self.processes: list[subprocess.Popen] = []
        self.supernodes: list[subprocess.Popen] = []
        self.certs = write_certificates(root / "certs") if secure else {}
        transport = f'root-certificates = "{self.certs["ca"]}"\n' if secure else "insecure = true\n"
        (self.home / "config.toml").write_text(
            "[superlink]\n"
            'default = "loopback"\n\n'
            "[superlink.loopback]\n"
            f'address = "127.0.0.1:{self.superlink_port}"\n' + transport,
            encoding="utf-8",
        )

    def _spawn(self, name: str, command: list[str], extra_env: Mapping[str, str] | None = None) -> subprocess.Popen:
        log_file = (self.root / f"{name}.log").open("wb")
        process = subprocess.Popen(  # pylint: disable=consider-using-with
            command, cwd=self.root, env={**self.env, **(extra_env or {})}, stdout=log_file, stderr=subprocess.STDOUT
        )
        self.processes.append(process)
        return process

    def start(self, node_env: Mapping[int, Mapping[str, str]] | None = None) -> None:
        """Start the SuperLink, wait for it, then start the SuperNodes (``node_env``: extra env per partition)."""
        transport = ["--insecure"]
        if self.secure:
            transport = [
                "--ssl-ca-certfile",
                str(self.certs["ca"]),
                "--ssl-certfile",
                str(self.certs["cert"]),
                "--ssl-keyfile",
                str(self.certs["key"]),
                "--enable-supernode-auth",
            ]
        superlink = self._spawn(
            "superlink",
            [str(BIN_DIR / "flower-superlink"), *transport, "--host", "127.0.0.1", "--port", str(self.superlink_port)],
        )
        wait_for_health(self.superlink_port, superlink, STARTUP_TIMEOUT_S, self.certs.get("ca"))
        for partition_id in range(self.num_nodes):
            key = None
            if self.secure:
                key = write_node_key(self.root / "keys" / f"supernode-{partition_id}")
                self.flwr("supernode", "register", str(key.with_suffix(".pub")), "loopback")
            self.start_node(partition_id, key, (node_env or {}).get(partition_id))

    def start_node(self, partition_id: int, key: Path | None, env: Mapping[str, str] | None = None) -> None:
        """Start the SuperNode of ``partition_id`` (authenticating with the private ``key`` if secure)."""
        transport = ["--insecure"]
        if self.secure:
            transport = ["--root-certificates", str(self.certs["ca"]), "--auth-supernode-private-key", str(key)]
        port = self.node_ports[partition_id] if partition_id < len(self.node_ports) else free_ports(1)[0]
        node = self._spawn(
            f"supernode-{partition_id}",
            [
                str(BIN_DIR / "flower-supernode"),
                *transport,
                "--superlink",
                f"127.0.0.1:{self.superlink_port}",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--max-wait-time",
                str(STARTUP_TIMEOUT_S),
                "--node-config",
                f"partition-id={partition_id} num-partitions={self.num_nodes}",
            ],
            env,
        )
        self.supernodes.append(node)

    def flwr(self, *args: str) -> str:
        """A short ``flwr`` CLI command against this deployment (not ``flwr run``); return its output."""
        completed = subprocess.run(
            [str(BIN_DIR / "flwr"), *args],
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=STARTUP_TIMEOUT_S,
            check=False,
        )
        output = completed.stdout + completed.stderr
        assert completed.returncode == 0, f"flwr {' '.join(args)}: {output}"
        return completed.stdout

    def node_ids(self, timeout_s: float = STARTUP_TIMEOUT_S) -> dict[int, int]:
        """``{partition id: node id}`` once every SuperNode has logged its id (bounded wait)."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = {}
            for partition_id in range(self.num_nodes):
                text = (self.root / f"supernode-{partition_id}.log").read_text(errors="replace")
                match = re.search(r"SuperNode ID: (\d+)", text)
                if match:
                    found[partition_id] = int(match.group(1))
            if len(found) == self.num_nodes:
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(found)} of {self.num_nodes} SuperNodes connected\n{self.logs()}")
            time.sleep(0.3)

    def flwr_run(self, run_config: str, app: Path = PROJECT) -> subprocess.Popen:
        """Start ``flwr run <app> loopback --stream`` (output in ``flwr-run.log``)."""
        return self._spawn(
            "flwr-run",
            [str(BIN_DIR / "flwr"), "run", str(app), "loopback", "--stream", "--run-config", run_config],
        )

    def finish(self, run: subprocess.Popen, timeout_s: float = RUN_TIMEOUT_S) -> str:
        """Wait (bounded) for ``flwr run`` to end successfully; return its output."""
        try:
            run.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"flwr run did not end within {timeout_s} s\n{self.logs()}")
        output = (self.root / "flwr-run.log").read_text(errors="replace")
        assert run.returncode == 0, output[-5000:]
        return output

    def wait_for_output(self, text: str, run: subprocess.Popen, timeout_s: float = RUN_TIMEOUT_S) -> float:
        """Wait (bounded) until ``flwr run``'s output shows ``text``; return when (``time.monotonic()``)."""
        return self.wait_for_text(self.root / "flwr-run.log", text, run, timeout_s)

    def wait_for_text(self, log: Path, text: str, run: subprocess.Popen, timeout_s: float = RUN_TIMEOUT_S) -> float:
        """Wait (bounded, while ``run`` lasts) until ``log`` shows ``text``; return when (``time.monotonic()``)."""
        deadline = time.monotonic() + timeout_s
        while True:
            ended = run.poll() is not None
            if text in log.read_text(errors="replace"):
                return time.monotonic()
            if ended or time.monotonic() > deadline:
                pytest.fail(f"{text!r} never appeared in {log.name}\n{self.logs()}")
            time.sleep(0.2)

    def kill_node(self, partition_id: int) -> None:
        """Kill a SuperNode and everything under it (flower-superexec, its ClientApp), by PID, at once."""
        stop_pids(process_tree([self.supernodes[partition_id].pid]), grace_s=0.0)

    def logs(self) -> str:
        """Tails of the SuperLink, SuperNode and ``flwr run`` logs (for failure messages)."""
        parts = []
        for path in sorted(self.root.glob("*.log")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-1500:]}")
        return "\n".join(parts)

    @property
    def marker(self) -> tuple[str, str]:
        """The environment entry every process of this deployment carries (Flower's own children included)."""
        return ("FLWR_HOME", str(self.home))

    def stop(self) -> list[int]:
        """Stop every started process, its descendants and every process carrying :attr:`marker`, by PID; return
        the PIDs still alive afterwards."""
        left = stop_started([process.pid for process in self.processes], self.marker)
        stop_process_tree(self.processes, grace_s=0.0)  # reap the Popen objects
        return left


def running(system: Deployment, node_env: Mapping[int, Mapping[str, str]] | None = None) -> Iterator[Deployment]:
    """Start ``system``; stop it (by PID) afterwards whatever happens, and check that nothing it started is left:
    no process under what it started, and none carrying its ``FLWR_HOME`` (a SuperExec, ServerApp or ClientApp
    whose parent is gone)."""
    try:
        system.start(node_env)
        yield system
    finally:
        survivors = system.stop()
        assert not survivors, f"processes survived: {[(pid, proc_table().get(pid)) for pid in survivors]}"
        assert not pids_with_env(*system.marker), "processes with this deployment's FLWR_HOME are left"


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    """A running loopback deployment of ``NUM_NODES`` SuperNodes."""
    yield from running(Deployment(tmp_path))


def test_tls_with_supernode_authentication(tmp_path: Path) -> None:
    """TLS and SuperNode auth as documented: registered SuperNodes join over TLS, an unregistered one does not.

    (The whole market and FedAvg run over this set-up was run by hand, see docs/deployment.md; it takes
    about two minutes here, so this test stops at the connections.)
    """
    for deployment in running(Deployment(tmp_path, secure=True)):
        registered = set(deployment.node_ids().values())
        listed = json.loads(deployment.flwr("supernode", "list", "loopback", "--format", "json"))
        online = {int(node["node-id"]) for node in listed["nodes"] if node["status"] == "online"}
        assert online == registered, listed

        stranger = write_node_key(tmp_path / "keys" / "stranger")
        deployment.start_node(NUM_NODES, stranger)
        stranger_log = tmp_path / f"supernode-{NUM_NODES}.log"
        deadline = time.monotonic() + 20
        while deployment.supernodes[-1].poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert deployment.supernodes[-1].poll() not in (None, 0), deployment.logs()  # Flower's exit code 305
        assert "Failed to activate SuperNode" in stranger_log.read_text(errors="replace"), deployment.logs()
        listed = json.loads(deployment.flwr("supernode", "list", "loopback", "--format", "json"))
        assert {int(node["node-id"]) for node in listed["nodes"]} == registered, listed


def test_market_then_fedavg_in_deployment(deployment: Deployment) -> None:
    """Three SuperNodes: the market picks winners within budget, only winners train."""
    results, train_log = deployment.root / "results", deployment.root / "train-log"
    budget, rounds = 2000.0, 2
    deployment.node_ids()
    output = deployment.finish(
        deployment.flwr_run(
            f"distribution='d1' budget={budget} num-server-rounds={rounds} "
            f"wait-for-nodes-timeout=60.0 results-dir='{results}' run-name='deploy' "
            f"train-log-dir='{train_log}'"
        )
    )
    run_dir = results / "deploy"
    assert (run_dir / "market.json").is_file(), output[-4000:] + deployment.logs()

    market = json.loads((run_dir / "market.json").read_text())
    winners = {int(node) for node in market["winners"]}
    assert len(market["participants"]) == NUM_NODES
    assert not market["excluded"] and market["within_budget"]
    assert 0 < len(winners) < NUM_NODES
    assert market["total_payment"] <= budget

    # Only winners trained (checked from the client side), once per round each.
    records = [json.loads(p.read_text()) for p in sorted(train_log.glob("run-*/train-*.json"))]
    assert sorted((r["node_id"], r["server_round"]) for r in records) == sorted(
        (node, r) for node in winners for r in range(1, rounds + 1)
    )
    assert all(record["won"] for record in records)

    history = json.loads((run_dir / "history.json").read_text())
    accuracies = [row["accuracy"] for row in history["rounds"]]
    assert len(accuracies) == rounds + 1
    assert accuracies[-1] > accuracies[0] + 0.2, accuracies
    assert "FLMarket summary" in output


# --- A SuperNode killed in the middle of PASS ------------------------------------------------
DROPOUT_NODES = 6
HUNG_PARTITION = DROPOUT_NODES - 1
# Each market message starts a fresh ClientApp process per node: on a loaded 2-core machine a healthy
# round of six nodes takes 20-40 s, so the round timeout cannot be much smaller than this.
MARKET_TIMEOUT_S = 45.0
MARKET_ROUNDS = 7  # PASS: advertise, share, mask, unmask; then bid, audit, award
SLACK_S = 45.0
LOG_SLACK_S = 15.0
UPLOAD_KILL_DELAY_S = 1.0
SURVIVOR_MASK_DELAY_S = 10.0  # `flwr run --stream` forwards the ServerApp's log lines with some delay


@pytest.mark.parametrize("moment", ["handling", "uploading"])
def test_supernode_killed_in_pass_is_excluded_without_a_stall(tmp_path: Path, moment: str) -> None:
    """Kill one of six SuperNodes in ``market_mask``: while its ClientApp handles it, or while its reply uploads.

    PASS recovers the dead node's masks from the survivors' shares; the market excludes it with a
    reason; ``N_s`` is the sum over the five survivors' partitions; and the market phase is bounded by
    its message rounds times ``market-timeout`` (no multi-minute stall in Flower's transport). A reply
    cut off mid-upload is registered at the SuperLink without its objects: pulling it retries until the
    SuperLink's object-push session expires (3 minutes), which must neither hold the market nor cost
    the other nodes their replies.
    """
    marker = tmp_path / "marked-node-id"
    node_env: dict[int, dict[str, str]] = {HUNG_PARTITION: {HANG_MARKER_ENV: str(marker)}}
    if moment == "uploading":  # the cut-off reply reaches the SuperLink first, the others after it
        node_env = {p: {MASK_DELAY_ENV: str(SURVIVOR_MASK_DELAY_S)} for p in range(HUNG_PARTITION)}
        node_env[HUNG_PARTITION] = {BIG_REPLY_MARKER_ENV: str(marker)}
    system = Deployment(tmp_path, num_nodes=DROPOUT_NODES)
    for deployment in running(system, node_env):
        node_of = deployment.node_ids()
        results = tmp_path / "results"
        run = deployment.flwr_run(
            f"distribution='d1' budget=2000.0 num-server-rounds=1 local-epochs=1 "
            f"market-timeout={MARKET_TIMEOUT_S} market-timeout-per-node=0.0 wait-for-nodes-timeout=60.0 "
            f"results-dir='{results}' run-name='dropout' train-log-dir='{tmp_path / 'train-log'}'",
            app=DROPOUT_APP,
        )
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not marker.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marker.exists(), "the marked node never got its market_mask message\n" + deployment.logs()
        hung_node = int(marker.read_text())
        assert hung_node == node_of[HUNG_PARTITION]
        node_log = tmp_path / f"supernode-{HUNG_PARTITION}.log"
        if moment == "uploading":
            deployment.wait_for_text(node_log, "Sending: query.market_mask", run)
            time.sleep(UPLOAD_KILL_DELAY_S)  # the SuperNode has registered the reply and is pushing its objects
        deployment.kill_node(HUNG_PARTITION)
        killed_at = time.monotonic()
        if moment == "uploading":
            tail = node_log.read_text(errors="replace").split("Sending: query.market_mask", 1)[1]
            assert "Sent successfully" not in tail, "the reply finished uploading before the kill"
        excluded_after_s = deployment.wait_for_output(f"excluding node {hung_node}", run) - killed_at
        output = deployment.finish(run)
        after_kill_s = time.monotonic() - killed_at

    market = json.loads((results / "dropout" / "market.json").read_text())
    survivors = sorted(node for partition, node in node_of.items() if partition != HUNG_PARTITION)
    assert set(market["excluded"]) == {str(hung_node)}, market["excluded"]
    assert market["excluded"][str(hung_node)].startswith("market_mask:"), market["excluded"]
    assert f"excluding node {hung_node}" in output
    assert market["pass_participants"] == survivors
    assert market["global_counts"] == expected_global_counts(range(HUNG_PARTITION)).tolist()
    assert set(market["winners"]) <= set(survivors) and market["winners"]

    # The round the node died in ends at its deadline: the exclusion comes at most one timeout after the kill.
    assert excluded_after_s <= MARKET_TIMEOUT_S + LOG_SLACK_S, excluded_after_s
    timings = market["timings"]
    assert timings["pass"] <= 4 * MARKET_TIMEOUT_S + SLACK_S, timings
    assert timings["total"] <= MARKET_ROUNDS * MARKET_TIMEOUT_S + SLACK_S, timings
    assert after_kill_s < RUN_TIMEOUT_S / 2, after_kill_s
    print(
        f"market phase with a killed SuperNode: {timings}; node excluded {excluded_after_s:.1f} s and "
        f"flwr run ended {after_kill_s:.1f} s after the kill"
    )


def expected_global_counts(partitions: range, num_partitions: int = DROPOUT_NODES) -> np.ndarray:
    """``N_s`` over ``partitions`` of the d1 runs' data config (the clients' own partitioning), without noise."""
    from flmarket_flwr.app.task import DataConfig, partition_label_counts  # pylint: disable=import-outside-toplevel

    config = DataConfig.from_run_config({"distribution": "d1"}, {"num-partitions": num_partitions})
    return sum(partition_label_counts(p, config) for p in partitions)


# --- The guide's secure sequence, run as written ---------------------------------------------
GUIDE = PROJECT / "docs" / "deployment.md"
GUIDE_SECTION = "## Recommended: TLS, SuperNode authentication and the secure profile"
GUIDE_NODES = 6  # the guide's N
GUIDE_BUDGET = 2000.0  # the guide's run config
GUIDE_TIMEOUT_S = 480
ATTACK_APP = Path(__file__).resolve().parent / "attack_app"


def guide_blocks() -> list[str]:
    """The bash blocks of the guide's recommended section, in order (the last but one is the run, the last the
    cleanup)."""
    section = GUIDE.read_text(encoding="utf-8").split(GUIDE_SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL)
    assert len(blocks) >= 3 and "flwr run" in blocks[-2], "the guide's section lost its bash blocks or its run"
    assert "processes left" in blocks[-1], "the guide's section lost its cleanup"
    return blocks


def consecutive_free_ports(count: int, attempts: int = 50) -> int:
    """The first of ``count`` consecutive TCP ports free on 127.0.0.1 right now (the guide's ``NODE_PORT``)."""
    for _ in range(attempts):
        first = free_ports(1)[0]
        if first + count > 65535:
            continue
        sockets = []
        try:
            for port in range(first, first + count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError(f"no {count} consecutive free ports found")


def run_guide(root: Path, run_block: str | None = None, timeout_s: float = GUIDE_TIMEOUT_S) -> str:
    """Run the guide's bash blocks in ``root`` (the last one replaced by ``run_block`` if given); return the output.

    Only the documented placeholders are set: ``APP``, ``VENV``, ``PORT``, ``NODE_PORT`` and the working directory
    (``PYTHONPATH`` makes the processes import this checkout). The guide's own cleanup (its last block) must leave
    no process carrying the guide's ``FLWR_HOME``; then everything the script started is stopped by PID all the
    same (the script's own tree, the PIDs it recorded, the marked processes), and none may survive.
    """
    blocks = guide_blocks()
    pids_file = root / "started.pids"
    record = f'echo "$SUPERLINK_PID ${{SUPERNODE_PIDS[*]}}" > "{pids_file}"\n'
    script = "set -euo pipefail\n" + "\n".join(blocks[:-2]) + record + (run_block or blocks[-2]) + blocks[-1]
    (root / "guide.sh").write_text(script, encoding="utf-8")
    superlink_port = free_ports(1)[0]
    env = {
        **os.environ,
        "APP": str(PROJECT),
        "VENV": str(BIN_DIR.parent),
        "PORT": str(superlink_port),
        "NODE_PORT": str(consecutive_free_ports(GUIDE_NODES)),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT), os.environ.get("PYTHONPATH")])),
    }
    env.pop("FLWR_HOME", None)
    log_path = root / "guide.log"
    with log_path.open("wb") as log_file:
        shell = subprocess.Popen(  # pylint: disable=consider-using-with
            ["bash", str(root / "guide.sh")], cwd=root, env=env, stdout=log_file, stderr=subprocess.STDOUT
        )
    try:
        try:
            shell.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the guide's sequence did not end within {timeout_s} s\n{guide_logs(root)}")
    finally:
        marker = ("FLWR_HOME", str(root / "flwr-home"))
        left_by_the_guide = pids_with_env(*marker) if shell.poll() == 0 else []
        started = [int(pid) for pid in pids_file.read_text().split()] if pids_file.exists() else []
        survivors = stop_started([shell.pid, *started], marker)
        try:
            shell.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        assert not survivors, f"processes survived: {[(pid, proc_table().get(pid)) for pid in survivors]}"
    output = log_path.read_text(errors="replace")
    assert shell.returncode == 0, f"the guide's sequence failed ({shell.returncode})\n{guide_logs(root)}"
    assert not left_by_the_guide, f"the guide's cleanup left {[proc_table().get(pid) for pid in left_by_the_guide]}"
    assert "processes left: none" in output, output[-2000:]
    return output


FLOWER_CHILDREN = ("flower-superexec", "flwr-serverapp", "flwr-clientapp")


def test_the_guides_cleanup_leaves_no_flower_process(deployment: Deployment) -> None:
    """docs/deployment.md's step 9, as written, while a run is in flight (SuperExecs, a ServerApp and ClientApps
    running): it finds every process carrying the deployment's ``FLWR_HOME``, leaves none, and says so."""
    deployment.node_ids()
    run = deployment.flwr_run(
        f"distribution='d1' budget=2000.0 num-server-rounds=1 results-dir='{deployment.root / 'results'}' "
        "run-name='cleanup'"
    )
    seen: set[str] = set()
    serverapp_alive = False
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while (seen != set(FLOWER_CHILDREN) or not serverapp_alive) and time.monotonic() < deadline and run.poll() is None:
        commands = [proc_table().get(pid, (0, ""))[1] for pid in pids_with_env(*deployment.marker)]
        seen |= {name for name in FLOWER_CHILDREN for command in commands if name in command}
        serverapp_alive = any("flwr-serverapp" in command for command in commands)
        time.sleep(0.2)
    assert seen == set(FLOWER_CHILDREN) and serverapp_alive, f"{seen}\n{deployment.logs()}"
    before = pids_with_env(*deployment.marker)

    cleanup = subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + guide_blocks()[-1]],
        cwd=deployment.root,
        env=deployment.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert cleanup.returncode == 0, cleanup.stdout + cleanup.stderr
    assert cleanup.stdout.strip().endswith("processes left: none"), cleanup.stdout + cleanup.stderr
    assert not cleanup.stderr, cleanup.stderr  # quiet: processes of other users, or gone, are skipped silently
    left = pids_with_env(*deployment.marker)
    assert not left, [proc_table().get(pid) for pid in left]
    assert len(before) >= 1 + 2 * NUM_NODES + 1, before  # SuperLink, SuperNodes, their SuperExecs, flwr run at least
    assert not [pid for pid in started_by([p.pid for p in deployment.processes]) if is_alive(pid)]


def guide_logs(root: Path) -> str:
    """Tails of the script's, the SuperLink's and the SuperNodes' logs (for failure messages)."""
    return "\n".join(
        f"--- {path.name}\n{path.read_text(errors='replace')[-2000:]}" for path in sorted(root.glob("*.log"))
    )


def test_the_guides_secure_sequence_runs_as_written(tmp_path: Path) -> None:
    """docs/deployment.md's recommended sequence: TLS, SuperNode auth and the secure profile on six SuperNodes.

    The run succeeds with winners within the budget; every node took part in PASS, added the profile's noise
    (``N_s`` is not the exact sum of the partitions) and kept its ledger, with the release and its privacy spend,
    under its own ``FLMARKET_HOME``.
    """
    output = run_guide(tmp_path)
    assert "FLMarket run succeeded" in output, guide_logs(tmp_path)
    assert output.count("pins hold") == GUIDE_NODES, output[-3000:]

    directory = json.loads((tmp_path / "directory.json").read_text())
    node_ids = sorted(int(node) for node in directory["keys"])
    market = json.loads((tmp_path / "results" / "secure" / "market.json").read_text())
    assert market["status"] == "succeeded" and not market["excluded"], market
    assert market["pass_participants"] == node_ids and len(node_ids) == GUIDE_NODES, market
    assert market["winners"] and market["within_budget"] and market["total_payment"] <= GUIDE_BUDGET
    exact = expected_global_counts(range(GUIDE_NODES), GUIDE_NODES).tolist()
    assert len(market["global_counts"]) == len(exact)
    assert market["global_counts"] != exact, "N_s is the exact sum: the profile's noise is missing"

    for partition_id in range(GUIDE_NODES):
        ledgers = list((tmp_path / f"node-{partition_id}" / "ledger").glob("*/release-ledger.json"))
        assert len(ledgers) == 1, f"node {partition_id}: {ledgers}"
        ledger = json.loads(ledgers[0].read_text())
        assert len(ledger["records"]) == 1 and len(ledger["records"][0]["members"]) == GUIDE_NODES, ledger
        assert len(ledger["spent"]) == 1 and ledger["spent"][0]["variance"] > 0, ledger


def test_a_deviating_buyer_gets_no_counts_in_the_secure_profile(tmp_path: Path) -> None:
    """The guide's deployment with ``tests/attack_app`` as the buyer: PASS and bids honest, then the audit oracle.

    Every bidder is sent ``market_audit`` with payment = bid under no award, under the auction's award signed with
    another key (offered for endorsement first), and under an award naming everyone a winner, with no
    endorsements. No node endorses the forged award or opens its counts, and each node's own log says why.
    """
    attack_out = tmp_path / "attack.json"
    run_block = (
        f'flwr run "{ATTACK_APP}" secure --stream --run-config "market-security=\'malicious\' '
        f"identity-directory='$PWD/directory.json' expected-nodes=$N attack-out='{attack_out}'\"\n"
    )
    output = run_guide(tmp_path, run_block)
    assert "the deviating buyer's attack is done" in output, guide_logs(tmp_path)

    received = json.loads(attack_out.read_text())
    bidders = [str(node) for node in received["bidders"]]
    assert len(bidders) == GUIDE_NODES, received
    for attack in ("no_award", "other_key_endorse", "other_key", "everyone_wins"):
        assert sorted(received[attack]) == sorted(bidders), (attack, received[attack])
        for node, reply in received[attack].items():
            assert "counts" not in reply["keys"] and "endorsement" not in reply["keys"], (attack, node, reply)
            assert reply["error"], (attack, node, reply)  # refused, not silently answered

    for partition_id in range(GUIDE_NODES):
        log_text = (tmp_path / f"supernode-{partition_id}.log").read_text(errors="replace")
        refusals = re.findall(r"Market request market_audit refused: ([^\n]*)", log_text)
        assert len(refusals) == 3, (partition_id, refusals, log_text[-3000:])
        # the audit with no award fails its record's parsing; the two with another award fail the receipt check
        assert "AuditRequest lacks 'award'" in refusals[0], refusals
        assert all("the award this client endorsed" in reason for reason in refusals[1:]), refusals
        assert re.search(r"Market request market_endorse refused: [^\n]*sign", log_text), log_text[-3000:]


# --- Flower ends a starved run ---------------------------------------------------------------
STARVED_MARKET_TIMEOUT_S = 300.0  # the market is still waiting for the advertise round when the ServerApp resumes
RESUME_EXIT_S = 60.0


def test_a_serverapp_whose_run_flower_ended_for_lack_of_heartbeats_exits(deployment: Deployment) -> None:
    """A starved ServerApp (frozen here with SIGSTOP) misses Flower's heartbeat patience: the SuperLink ends the
    run as failed and revokes the ServerApp's token. Once it runs again, its next call is refused and it exits;
    ``flwr run --stream`` ends with neither of the app's last lines (its logs can no longer be uploaded).
    """
    from flwr.common.constant import HEARTBEAT_DEFAULT_INTERVAL, HEARTBEAT_PATIENCE  # pylint: disable=C0415

    deployment.node_ids()
    run = deployment.flwr_run(
        f"distribution='d1' budget=2000.0 num-server-rounds=1 market-timeout={STARVED_MARKET_TIMEOUT_S} "
        f"results-dir='{deployment.root / 'results'}' run-name='starved'"
    )
    deployment.wait_for_output("Market: buyer key", run)
    superlink = deployment.processes[0].pid
    serverapps = [pid for pid in process_tree([superlink]) if "flwr-serverapp" in proc_table()[pid][1]]
    assert len(serverapps) == 1, serverapps
    os.kill(serverapps[0], signal.SIGSTOP)
    try:
        time.sleep(HEARTBEAT_PATIENCE * HEARTBEAT_DEFAULT_INTERVAL + 15.0)
    finally:
        os.kill(serverapps[0], signal.SIGCONT)
    resumed = time.monotonic()
    run.wait(timeout=RESUME_EXIT_S)
    while is_alive(serverapps[0]) and time.monotonic() - resumed < RESUME_EXIT_S:
        time.sleep(0.5)
    assert not is_alive(serverapps[0]), "the ServerApp lingered after Flower ended its run\n" + deployment.logs()
    output = (deployment.root / "flwr-run.log").read_text(errors="replace")
    assert run.returncode == 0 and "FLMarket run succeeded" not in output
    assert "Runtime task-token authentication failed" in (deployment.root / "superlink.log").read_text()
    runs = json.loads(deployment.flwr("ls", "loopback", "--format", "json"))["runs"]
    assert [entry["status"] for entry in runs] == ["finished:failed"], runs
    market = json.loads((deployment.root / "results" / "starved" / "market.json").read_text())  # where it stopped
    assert market["status"] in ("running", "ended") and market["step"] in ("waiting for nodes", "market_advertise")
