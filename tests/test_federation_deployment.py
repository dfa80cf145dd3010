"""A federation that changes, in a real loopback deployment: one ``flwr run`` over SuperLink and SuperNode processes.

The default profile (no noise: one PASS release per node per run), ``tests/scenario_app`` (the product's apps, its
ClientApp behind a mod that holds one train round until the test opens a gate). Six SuperNodes start; the run
includes one by id (trains at a fixed payment, never bids), excludes another by id and a third by its tag. While round
:data:`GATED_ROUND` is held, the test starts three more SuperNodes, then a winner of the first market crashes
(SIGKILL, by PID) once its update of that round is uploaded; the churn criterion re-launches the market before the
next round among the three newcomers alone (the three that released are sent nothing), and its winners train beside
the first cohort. The every-K criterion fires later, when no connected node can release again: that market is
skipped before any message. One deployment serves every assertion: the markets, the newcomers' wins, the run's
budget (``market.json``), and the messages each SuperNode received, counted in its own log (the excluded id: none
of any kind). Every process is stopped by PID.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from processes import free_ports, kill_now, process_tree
from test_deployment import BIN_DIR, STARTUP_TIMEOUT_S, Deployment, running

SCENARIO_APP = Path(__file__).resolve().parent / "scenario_app"
GATE_ENV, GATE_ROUND_ENV = "FLMARKET_TEST_GATE", "FLMARKET_TEST_GATE_ROUND"  # read by the scenario app's mod
FIRST_NODES = 6  # one included, one excluded by id, one by its tag: three bid in the first market
JOINING_NODES = 3  # enough for a market of their own (PASS's three-node minimum)
ALL_NODES = FIRST_NODES + JOINING_NODES
INCLUDED, EXCLUDED, TAGGED = 0, 4, 5  # partitions of the first six; TAGGED declares market-tag 'rival'
GATED_ROUND = 1
ROUNDS = 4
RELAUNCH_EVERY = 2  # the churn market before round 2 comes first; this fires before round 4, nobody left to buy
BUDGET, INCLUDE_PAYMENT = 2000.0, 50.0
ROUND_TIMEOUT_S = 90.0  # a round sent to the crashed winner while the SuperLink still lists it ends here
MARKET_TIMEOUT_S = 60.0
RUN_TIMEOUT_S = 600
RECEIVED = "Received successfully"  # Flower's SuperNode logs this line once per message it receives

pytestmark = pytest.mark.skipif(
    not (BIN_DIR / "flower-superlink").exists() or not Path("/proc").is_dir(),
    reason="needs Flower's executables next to the Python interpreter and /proc (Linux)",
)


class ChurningDeployment(Deployment):
    """An insecure loopback deployment of :data:`ALL_NODES` partitions whose SuperNodes start when told: the
    first :data:`FIRST_NODES` with the SuperLink, each with the scenario app's gate in its environment."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, num_nodes=FIRST_NODES)
        self.gate = root / "gate"
        self.gate.mkdir()
        self.node_pids: dict[int, int] = {}  # partition id -> the SuperNode's PID

    def start_node(self, partition_id: int, key: Path | None = None, env: Mapping[str, str] | None = None) -> None:
        """Start the SuperNode of ``partition_id`` (one of :data:`ALL_NODES` partitions), with the gate."""
        gate = {GATE_ENV: str(self.gate), GATE_ROUND_ENV: str(GATED_ROUND)}
        node = self._spawn(
            f"supernode-{partition_id}",
            [
                str(BIN_DIR / "flower-supernode"),
                "--insecure",
                "--superlink",
                f"127.0.0.1:{self.superlink_port}",
                "--host",
                "127.0.0.1",
                "--port",
                str(free_ports(1)[0]),
                "--max-wait-time",
                str(STARTUP_TIMEOUT_S),
                "--node-config",
                f"partition-id={partition_id} num-partitions={ALL_NODES}"
                + (" market-tag='rival'" if partition_id == TAGGED else ""),
            ],
            {**gate, **(env or {})},
        )
        self.supernodes.append(node)
        self.node_pids[partition_id] = node.pid

    def node_id(self, partition_id: int, timeout_s: float = STARTUP_TIMEOUT_S) -> int:
        """The node id the SuperNode of ``partition_id`` logged once connected (bounded wait)."""
        log = self.root / f"supernode-{partition_id}.log"
        deadline = time.monotonic() + timeout_s
        while not (match := re.search(r"SuperNode ID: (\d+)", log.read_text(errors="replace"))):
            if time.monotonic() > deadline:
                pytest.fail(f"SuperNode {partition_id} never connected\n{self.logs()}")
            time.sleep(0.3)
        return int(match.group(1))

    def received(self, partition_id: int) -> int:
        """How many messages of any kind the SuperNode of ``partition_id`` received (its own log)."""
        return (self.root / f"supernode-{partition_id}.log").read_text(errors="replace").count(RECEIVED)

    def replied(self, partition_id: int) -> Counter[str]:
        """The message types of the replies the SuperNode of ``partition_id`` sent (its own log)."""
        text = (self.root / f"supernode-{partition_id}.log").read_text(errors="replace")
        return Counter(re.findall(r"Sending: (\S+) message", text))

    def wait_until_sent(
        self, partition_id: int, message_type: str, run_poll: Callable[[], int | None], timeout_s: float = RUN_TIMEOUT_S
    ) -> None:
        """Wait (bounded, while the run lasts) until the SuperNode of ``partition_id`` has uploaded a reply of
        ``message_type`` (its log: ``Sending: <type> message``, then ``Sent successfully``)."""
        log = self.root / f"supernode-{partition_id}.log"
        deadline = time.monotonic() + timeout_s
        while not _sent_after(log.read_text(errors="replace"), f"Sending: {message_type} "):
            if run_poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"SuperNode {partition_id} never sent a {message_type} reply\n{self.logs()}")
            time.sleep(0.2)

    def wait_for_files(
        self, names: set[str], run_poll: Callable[[], int | None], timeout_s: float = RUN_TIMEOUT_S
    ) -> None:
        """Wait (bounded, while ``run_poll()`` says the run lasts) until every file of ``names`` is in the gate."""
        deadline = time.monotonic() + timeout_s
        while not names <= {path.name for path in self.gate.iterdir()}:
            if run_poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the gate never saw {sorted(names)}\n{self.logs()}")
            time.sleep(0.3)


@pytest.fixture(scope="module")
def churn_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run the scenario once; every test of the module reads what it left (market.json, the SuperNodes' logs)."""
    root = tmp_path_factory.mktemp("federation")
    results, train_log = root / "results", root / "train-log"
    started = time.monotonic()
    for deployment in running(ChurningDeployment(root)):
        assert isinstance(deployment, ChurningDeployment)
        node_of = {partition: deployment.node_id(partition) for partition in range(FIRST_NODES)}
        run = deployment.flwr_run(
            f"distribution='d1' budget={BUDGET} num-server-rounds={ROUNDS} local-epochs=1 "
            f"market-include='{node_of[INCLUDED]}' market-include-payment={INCLUDE_PAYMENT} "
            f"market-exclude='{node_of[EXCLUDED]}, tag:rival' "
            f"market-relaunch-churn=0.2 market-relaunch-every={RELAUNCH_EVERY} "
            f"round-timeout={ROUND_TIMEOUT_S} market-timeout={MARKET_TIMEOUT_S} market-timeout-per-node=0.0 "
            f"wait-for-nodes-timeout=60.0 results-dir='{results}' run-name='churn' train-log-dir='{train_log}'",
            app=SCENARIO_APP,
        )
        market_json = results / "churn" / "market.json"
        # Round GATED_ROUND is held on every node of the first cohort: the newcomers start, then a winner crashes.
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not (market_json.is_file() and json.loads(market_json.read_text()).get("status") == "succeeded"):
            if run.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the first market never succeeded\n{deployment.logs()}")
            time.sleep(0.5)
        first = json.loads(market_json.read_text())
        cohort = [int(node) for node in first["included"]] + [int(node) for node in first["winners"]]
        deployment.wait_for_files({f"held-{node}" for node in cohort}, run.poll)
        for partition in range(FIRST_NODES, ALL_NODES):
            deployment.start_node(partition)
        for partition in range(FIRST_NODES, ALL_NODES):
            node_of[partition] = deployment.node_id(partition)  # connected before round 2's re-launch check
        (deployment.gate / "open").write_text("", encoding="utf-8")
        # A winner crashes once its round-1 update is uploaded (a kill mid-upload would hold the round for Flower's
        # object-push session): round 1 aggregates every update, and the crashed node is gone by round 2.
        partition_of = {node: partition for partition, node in node_of.items()}
        killed = next(int(node) for node in first["winners"] if int(node) != node_of[INCLUDED])
        deployment.wait_until_sent(partition_of[killed], "train", run.poll)
        kill_now(process_tree([deployment.node_pids[partition_of[killed]]]))
        output = deployment.finish(run, timeout_s=RUN_TIMEOUT_S)
        received = {partition: deployment.received(partition) for partition in node_of}
        replied = {partition: deployment.replied(partition) for partition in node_of}
    print(f"\nwall {time.monotonic() - started:.0f} s; node ids {node_of}; killed {killed}; received {received}")
    print("replied:", replied)
    print("trained (node, round):", trained(train_log))
    return {
        "output": output,
        "node_of": node_of,
        "killed": killed,
        "received": received,
        "replied": replied,
        "record": json.loads(market_json.read_text()),
        "trained": trained(train_log),
    }


def _sent_after(text: str, sending: str) -> bool:
    """Whether a SuperNode's log ``text`` shows ``sending`` and, after its last occurrence, ``Sent successfully``."""
    before, found, after = text.rpartition(sending)
    return bool(found) and "Sent successfully" in after


def trained(train_log: Path) -> list[tuple[int, int]]:
    """``(node id, round)`` of every train message the ClientApps logged (the clients' own audit records)."""
    records = [json.loads(path.read_text()) for path in sorted(train_log.glob("run-*/train-*.json"))]
    return sorted((int(record["node_id"]), int(record["server_round"])) for record in records)


def nodes(values: object) -> set[int]:
    """Node ids from a ``market.json`` list or mapping (its keys are strings)."""
    return {int(node) for node in values}  # type: ignore[attr-defined]


def test_churn_relaunches_among_the_newcomers_and_they_win(churn_run: dict[str, Any]) -> None:
    """The first market runs over the six (one included, two excluded); after three nodes join and a winner
    crashes, the churn re-launch invites the three alone, the nodes that released are sent nothing, and newcomers
    win and train."""
    assert "FLMarket run succeeded" in churn_run["output"], churn_run["output"][-4000:]
    node_of, killed = churn_run["node_of"], churn_run["killed"]
    first_nodes = {node_of[p] for p in range(FIRST_NODES)}
    newcomers = {node_of[p] for p in range(FIRST_NODES, ALL_NODES)}
    markets = churn_run["record"]["markets"]
    assert [(m["before_round"], m["status"]) for m in markets[:2]] == [(1, "succeeded"), (GATED_ROUND + 1, "succeeded")]
    one, two = markets[0], markets[1]
    assert one["trigger"] == "the first market" and "3 node(s) joined" in two["trigger"], two["trigger"]
    assert nodes(one["included"]) == {node_of[INCLUDED]} and killed in nodes(one["winners"])
    assert nodes(one["invited"]) == first_nodes - {node_of[INCLUDED], node_of[EXCLUDED], node_of[TAGGED]}
    assert nodes(two["invited"]) == newcomers and nodes(two["pass_participants"]) == newcomers, two
    assert nodes(two["winners"]) and nodes(two["winners"]) <= newcomers  # newcomers win
    assert two["cohort_joined"] and nodes(two["released"]) == newcomers
    # Who trained which round: the first cohort every round (the crashed winner only the held one), the newcomers'
    # winners from the round after their market on.
    done = set(churn_run["trained"])
    late = {node for node, server_round in done if server_round > GATED_ROUND}
    assert late == (nodes(one["winners"]) | nodes(one["included"]) | nodes(two["winners"])) - {killed}, done
    assert {server_round for node, server_round in done if node == killed} == {GATED_ROUND}


def test_every_k_rounds_a_market_nobody_can_join_is_skipped_and_the_run_stays_within_its_budget(
    churn_run: dict[str, Any],
) -> None:
    """Before round ``RELAUNCH_EVERY + GATED_ROUND + 1`` the every-K criterion fires; every connected node has
    released once (default profile), so the market is skipped before any message. Every payment of the run, in
    ``market.json``, adds up to no more than the one budget."""
    record = churn_run["record"]
    markets = record["markets"]
    assert len(markets) == 3, [(m["before_round"], m["trigger"], m["status"]) for m in markets]
    three = markets[2]
    assert three["before_round"] == GATED_ROUND + 1 + RELAUNCH_EVERY and "market-relaunch-every" in three["trigger"]
    assert three["status"] == "skipped" and "can take part" in three["reason"], three["reason"]
    assert three["released"] == [] and three["invited"] == [] and three["pass_sessions"] == []
    assert "re-launching stops" in churn_run["output"]
    paid = sum(m["total_payment"] for m in markets)
    assert record["run_budget"] == BUDGET and paid <= BUDGET * (1 + 1e-12), paid
    assert record["run_total_settled"] <= BUDGET * (1 + 1e-12)
    assert markets[1]["budget"] == pytest.approx(BUDGET - markets[0]["total_payment"])
    assert markets[1]["committed_before"] == pytest.approx(markets[0]["total_payment"])


def test_the_excluded_id_receives_no_message_of_any_kind(churn_run: dict[str, Any]) -> None:
    """Counted in each SuperNode's own log: the excluded id received nothing; the node excluded by its tag only the
    tags query, once per market; the included node its tag query and its train messages, no PASS and no bid; the
    nodes that released in the first market nothing of the newcomers' market, not even its tags query."""
    received, replied, node_of = churn_run["received"], churn_run["replied"], churn_run["node_of"]
    assert received[EXCLUDED] == 0, received
    assert replied[TAGGED] == Counter({"query.market_tags": 2}) and received[TAGGED] == 2, replied[TAGGED]
    included = node_of[INCLUDED]
    assert sorted(r for node, r in churn_run["trained"] if node == included) == list(range(1, ROUNDS + 1))
    assert replied[INCLUDED] == Counter({"train": ROUNDS, "query.market_tags": 1}), replied[INCLUDED]
    first = churn_run["record"]["markets"][0]
    for partition in range(ALL_NODES):
        if node_of[partition] in nodes(first["invited"]) or partition >= FIRST_NODES:  # one market each
            assert replied[partition]["query.market_tags"] == 1, (partition, replied[partition])
            assert replied[partition]["query.market_advertise"] == 1, (partition, replied[partition])
