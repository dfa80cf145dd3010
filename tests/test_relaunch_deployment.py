"""End-to-end: the market re-launched inside one Flower run, on a real SuperLink and SuperNodes on loopback.

TLS, SuperNode authentication and the secure profile as in docs/deployment.md (``tests/test_deployment.py``'s
``Deployment``): nine SuperNode keys are registered up front, so the directory's writer knows all nine node ids and
writes one directory; six SuperNodes start, the first market runs over them, three more start after round 3 and one
winner is killed (by PID) while the run trains. ``market-relaunch-every=4`` re-runs the market before round 5, over
the federation as it is then. Every process is stopped by PID afterwards, none may survive.
"""

import json
import time
from collections.abc import Mapping
from pathlib import Path

import pytest
from processes import free_ports, process_tree, stop_pids
from test_deployment import BIN_DIR, STARTUP_TIMEOUT_S, Deployment, running, write_node_key

from flmarket_flwr.pass_protocol import IdentityDirectory, generate_identity, save_identity_key

pytestmark = pytest.mark.skipif(
    not (BIN_DIR / "flower-superlink").exists() or not Path("/proc").is_dir(),
    reason="needs Flower's executables next to the Python interpreter and /proc (Linux)",
)

FIRST_NODES = 6  # the secure profile's smallest market (split tolerance 2)
JOINING_NODES = 3
ALL_NODES = FIRST_NODES + JOINING_NODES  # the directory's size: 6 of 9 meets the profile's roster floor (2/3)
ROUNDS = 6
RELAUNCH_EVERY = 4  # markets before rounds 1 and 5
JOIN_AFTER_ROUND = 3
ROUND_TIMEOUT_S = 75.0  # the round the killed winner misses ends here; longer than Flower's heartbeat patience (60 s)
MARKET_TIMEOUT_S = 90.0
RUN_TIMEOUT_S = 900


class LivingFederation(Deployment):
    """A secure deployment whose SuperNodes (all registered, all in one identity directory) start when told."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, num_nodes=FIRST_NODES, secure=True)
        self.keys: dict[int, Path] = {}
        self.node_of: dict[int, int] = {}  # partition id -> node id, as Flower assigned it at registration
        self.node_configs: dict[int, str] = {}
        self.directory = root / "directory.json"

    def start(self, node_env: Mapping[int, Mapping[str, str]] | None = None) -> None:
        """Start the SuperLink, register all nine keys, write the directory, start the first six SuperNodes."""
        original_num_nodes, self.num_nodes = self.num_nodes, 0
        super().start()  # the SuperLink alone
        self.num_nodes = original_num_nodes
        publics = {}
        for partition in range(ALL_NODES):
            self.keys[partition] = write_node_key(self.root / "keys" / f"supernode-{partition}")
            reply = self.flwr(
                "supernode", "register", str(self.keys[partition].with_suffix(".pub")), "loopback", "--format", "json"
            )
            self.node_of[partition] = int(json.loads(reply[reply.index("{") :])["node-id"])
            private, publics[self.node_of[partition]] = generate_identity()
            save_identity_key(private, self.root / f"identity-{partition}.pem")
        directory = IdentityDirectory(publics)
        self.directory.write_text(directory.to_json())
        digest = directory.digest().hex()
        for partition in range(ALL_NODES):
            self.node_configs[partition] = (
                f"partition-id={partition} num-partitions={ALL_NODES} market-security='malicious' "
                f"identity-key='{self.root / f'identity-{partition}.pem'}' identity-directory='{self.directory}' "
                f"identity-directory-digest='{digest}' market-min-roster-change=1"
            )  # roster change 1: the killed winner's departure alone tells the two releases apart (the noise composes)
        for partition in range(FIRST_NODES):
            self.start_node(partition, self.keys[partition])

    def start_node(self, partition_id: int, key: Path | None, env: Mapping[str, str] | None = None) -> None:
        """Start the SuperNode of ``partition_id`` in the secure profile, its ledger under its own FLMARKET_HOME."""
        self.supernodes.append(
            self._spawn(
                f"supernode-{partition_id}",
                [
                    str(BIN_DIR / "flower-supernode"),
                    "--root-certificates",
                    str(self.certs["ca"]),
                    "--auth-supernode-private-key",
                    str(key),
                    "--superlink",
                    f"127.0.0.1:{self.superlink_port}",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(free_ports(1)[0]),
                    "--max-wait-time",
                    str(STARTUP_TIMEOUT_S),
                    "--node-config",
                    self.node_configs[partition_id],
                ],
                {"FLMARKET_HOME": str(self.root / f"node-{partition_id}"), **(env or {})},
            )
        )

    def online(self) -> set[int]:
        """The node ids the SuperLink lists as online."""
        listed = json.loads(self.flwr("supernode", "list", "loopback", "--format", "json"))
        return {int(node["node-id"]) for node in listed["nodes"] if node["status"] == "online"}

    def wait_online(self, nodes: set[int], timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        """Wait (bounded) until every node of ``nodes`` is online."""
        deadline = time.monotonic() + timeout_s
        while not nodes <= self.online():
            if time.monotonic() > deadline:
                pytest.fail(f"nodes {sorted(nodes - self.online())} never came online\n{self.logs()}")
            time.sleep(1.0)


def trained(train_log: Path) -> list[tuple[int, int]]:
    """``(node id, round)`` of every train message the ClientApps logged (the clients' own audit records)."""
    records = [json.loads(path.read_text()) for path in sorted(train_log.glob("run-*/train-*.json"))]
    return sorted((int(record["node_id"]), int(record["server_round"])) for record in records)


def test_a_relaunch_in_a_deployment_invites_the_joined_nodes_and_drops_a_killed_winner(tmp_path: Path) -> None:
    results, train_log = tmp_path / "results", tmp_path / "train-log"
    for federation in running(LivingFederation(tmp_path)):
        assert isinstance(federation, LivingFederation)
        first = {federation.node_of[p] for p in range(FIRST_NODES)}
        federation.wait_online(first)
        run = federation.flwr_run(
            f"market-security='malicious' identity-directory='{federation.directory}' distribution='d1' "
            f"budget=2000.0 num-server-rounds={ROUNDS} local-epochs=1 market-relaunch-every={RELAUNCH_EVERY} "
            f"round-timeout={ROUND_TIMEOUT_S} market-timeout={MARKET_TIMEOUT_S} market-timeout-per-node=0.0 "
            f"wait-for-nodes-timeout=60.0 results-dir='{results}' run-name='living' train-log-dir='{train_log}'"
        )
        # After round 3 (every winner logged it): three SuperNodes join and one winner is killed while the run trains.
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while True:
            done = trained(train_log)
            winners = sorted({node for node, _ in done})
            if winners and all((node, JOIN_AFTER_ROUND) in done for node in winners):
                break
            if run.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"round {JOIN_AFTER_ROUND} never completed\n{federation.logs()}")
            time.sleep(0.5)
        partition_of = {node: partition for partition, node in federation.node_of.items()}
        killed = winners[0]
        stop_pids(process_tree([federation.supernodes[partition_of[killed]].pid]), grace_s=0.0)
        for partition in range(FIRST_NODES, ALL_NODES):
            federation.start_node(partition, federation.keys[partition])
        joined = {federation.node_of[p] for p in range(FIRST_NODES, ALL_NODES)}
        output = federation.finish(run, timeout_s=RUN_TIMEOUT_S)

    assert "FLMarket run succeeded" in output, output[-4000:]
    markets = json.loads((results / "living" / "market.json").read_text())["markets"]
    assert len(markets) >= 2, markets
    assert [entry["before_round"] for entry in markets[:2]] == [1, RELAUNCH_EVERY + 1], markets
    one, two = markets[0], markets[1]
    assert one["status"] == two["status"] == "succeeded", (one, two)
    assert set(one["pass_participants"]) == first and killed in one["winners"]
    assert joined <= set(two["pass_participants"]), two
    assert killed not in two["pass_participants"] and killed not in two["winners"], two
    # The second market's cohort trained the rounds after it, and only they did.
    late = {node for node, server_round in trained(train_log) if server_round > RELAUNCH_EVERY}
    assert late == {int(node) for node in two["winners"]}, (late, two["winners"])
    # Each node's ledger: one release per market it took part in, each charged to its privacy budget.
    for partition, node in federation.node_of.items():
        ledgers = list((tmp_path / f"node-{partition}" / "ledger").glob("*/release-ledger.json"))
        releases = (node in one["pass_participants"]) + (node in two["pass_participants"])
        spent = json.loads(ledgers[0].read_text())["spent"] if ledgers else []
        assert len(spent) == releases, (partition, spent)
