"""The market in a real deployment: one SuperLink and N SuperNode processes on loopback, current defaults against
the previous ones (a fixed 60 s per market round, no per-node time, no thin-market floor), side by side.

Each run is ``docs/deployment.md``'s insecure set-up with its own ``FLWR_HOME`` and ports, the default app with
``num-server-rounds=1``; everything started is stopped by PID afterwards and the run checks that none of it, and
no ServerApp, is left. Per run: the market's wall time, who was excluded and why, bidders, winners, the market's
status and how the ServerApp ended.

    python -m benchmarks.bench_deployment --sizes 10 30 --runs 3 --json results.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tests.processes import free_ports, process_tree, stop_started

PROJECT = Path(__file__).resolve().parents[1]
BIN_DIR = Path(sys.executable).parent
STARTUP_TIMEOUT_S = 180.0
RUN_TIMEOUT_S = 900.0
LINGER_WAIT_S = 30.0
"""Seconds a ServerApp may take to exit after ``flwr run`` ended before it counts as left over."""
STOP_GRACE_S = 30.0
BASE_RUN_CONFIG = "distribution='d1' budget=2000.0 num-server-rounds=1 local-epochs=1 wait-for-nodes-timeout=120.0"
#: The previous defaults, as run config: 60 s per round whatever the number of nodes, and no thin-market floor
#: (``market-min-participation`` must be > 0: the smallest value asks for one bidder).
PROFILES = {
    "current": "",
    "previous": "market-timeout=60.0 market-timeout-per-node=0.0 market-min-participation=1e-9",
}


@dataclass
class RunResult:
    """What one deployment run showed."""

    profile: str
    num_nodes: int
    run: int
    started_utc: str
    load_before: float
    market_s: float | None = None
    market_status: str = "none"
    market_reason: str = ""
    excluded: dict[str, int] = field(default_factory=dict)
    bidders: int = 0
    winners: int = 0
    run_line: str = "neither line"
    flwr_exit: int | None = None
    serverapp_lingered: bool = False
    serverapp_gone_s: float | None = None
    survivors: list[int] = field(default_factory=list)
    wall_s: float = 0.0
    load_after: float = 0.0


def load_average() -> float:
    """The 1-minute load average."""
    return os.getloadavg()[0]


def reason_kind(reason: str) -> str:
    """An exclusion reason without node ids and numbers of seconds, to count alike reasons together."""
    return re.sub(r"\d+(\.\d+)?", "#", reason)[:90]


class LoopbackDeployment:
    """A SuperLink and ``num_nodes`` SuperNodes (``--insecure``) under ``root``, with a private FLWR_HOME."""

    def __init__(self, root: Path, num_nodes: int) -> None:
        self.root, self.num_nodes = root, num_nodes
        home = root / "flwr-home"
        home.mkdir(parents=True)
        ports = free_ports(num_nodes + 1)
        self.port, self.node_ports = ports[0], ports[1:]
        self.env = {
            **os.environ,
            "FLWR_HOME": str(home),
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "PATH": f"{BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT), os.environ.get("PYTHONPATH")])),
        }
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "loopback"\n\n[superlink.loopback]\naddress = "127.0.0.1:{self.port}"\n'
            "insecure = true\n",
            encoding="utf-8",
        )
        self.pids: list[int] = []
        self.logs: list[Any] = []

    def spawn(self, name: str, command: list[str]) -> subprocess.Popen:
        """Start ``command`` with its output in ``<name>.log``; keep its PID."""
        log_file = (self.root / f"{name}.log").open("wb")
        self.logs.append(log_file)
        process = subprocess.Popen(  # pylint: disable=consider-using-with
            command, cwd=self.root, env=self.env, stdout=log_file, stderr=subprocess.STDOUT
        )
        self.pids.append(process.pid)
        return process

    def start(self) -> None:
        """Start the SuperLink, then the SuperNodes, and wait until every SuperNode has its node id."""
        self.spawn("superlink", ["flower-superlink", "--insecure", "--host", "127.0.0.1", "--port", str(self.port)])
        for i, port in enumerate(self.node_ports):
            self.spawn(
                f"supernode-{i}",
                [
                    "flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{self.port}",
                    "--host", "127.0.0.1", "--port", str(port), "--max-wait-time", str(STARTUP_TIMEOUT_S),
                    "--node-config", f"partition-id={i} num-partitions={self.num_nodes}",
                ],
            )  # fmt: skip
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while sum(self._has_node_id(i) for i in range(self.num_nodes)) < self.num_nodes:
            if time.monotonic() > deadline:
                raise TimeoutError(f"not every SuperNode connected within {STARTUP_TIMEOUT_S:.0f} s ({self.root})")
            time.sleep(1.0)

    def _has_node_id(self, i: int) -> bool:
        return "SuperNode ID:" in (self.root / f"supernode-{i}.log").read_text(errors="replace")

    def serverapps(self) -> list[int]:
        """PIDs of ServerApp processes under the SuperLink."""
        tree = process_tree(self.pids[:1])
        return [pid for pid in tree if "flwr-serverapp" in _cmdline(pid)]

    def stop(self) -> list[int]:
        """Stop everything started, by PID: the tree under the started PIDs and every process carrying this
        deployment's ``FLWR_HOME`` (a SuperExec, ServerApp or ClientApp whose parent is gone); return the PIDs still
        alive afterwards."""
        survivors = stop_started(self.pids, ("FLWR_HOME", self.env["FLWR_HOME"]), STOP_GRACE_S, STOP_GRACE_S)
        for log_file in self.logs:
            log_file.close()
        return survivors


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def run_once(root: Path, num_nodes: int, profile: str, index: int) -> RunResult:
    """One deployment run of ``profile`` at ``num_nodes`` SuperNodes, in a fresh folder under ``root``."""
    folder = root / f"n{num_nodes}-{profile}-{index}"
    result = RunResult(profile, num_nodes, index, time.strftime("%H:%M:%S", time.gmtime()), load_average())
    started = time.monotonic()
    deployment = LoopbackDeployment(folder, num_nodes)
    try:
        deployment.start()
        results = folder / "results"
        config = f"{BASE_RUN_CONFIG} results-dir='{results}' run-name='bench' {PROFILES[profile]}".strip()
        command = ["flwr", "run", str(PROJECT), "loopback", "--stream", "--run-config", config]
        run = deployment.spawn("flwr-run", command)
        try:
            result.flwr_exit = run.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            result.flwr_exit = None
        ended = time.monotonic()
        while deployment.serverapps() and time.monotonic() < ended + LINGER_WAIT_S:
            time.sleep(1.0)
        result.serverapp_lingered = bool(deployment.serverapps())
        result.serverapp_gone_s = None if result.serverapp_lingered else round(time.monotonic() - ended, 1)
        output = (folder / "flwr-run.log").read_text(errors="replace")
        if "FLMarket run succeeded" in output:
            result.run_line = "succeeded"
        elif "FLMarket run FAILED" in output:
            result.run_line = "FAILED"
        market_file = results / "bench" / "market.json"
        if market_file.is_file():
            read_market(json.loads(market_file.read_text()), result)
    finally:
        result.survivors = deployment.stop()
        result.wall_s = time.monotonic() - started
        result.load_after = load_average()
    return result


def read_market(market: dict[str, Any], result: RunResult) -> None:
    """Fill ``result`` from a ``market.json``."""
    result.market_s = market.get("timings", {}).get("total")
    result.market_status = market.get("status", "?")
    result.market_reason = (market.get("reason") or "")[:200]
    result.excluded = dict(Counter(reason_kind(reason) for reason in market.get("excluded", {}).values()))
    result.bidders = len(market.get("bids", {}))
    result.winners = len(market.get("winners", []))


def table(results: list[RunResult]) -> str:
    """The runs as a Markdown table."""
    lines = [
        "| N | profile | run | market s | status | bidders | winners | excluded | run line | flwr exit | "
        "ServerApp left | wall s | load |",
        "|---:|---|---:|---:|---|---:|---:|---|---|---:|---|---:|---|",
    ]
    for r in results:
        excluded = "; ".join(f"{count} x {kind}" for kind, count in r.excluded.items()) or "none"
        market = f"{r.market_s:.0f}" if r.market_s is not None else "-"
        lines.append(
            f"| {r.num_nodes} | {r.profile} | {r.run} | {market} | {r.market_status} | {r.bidders} | {r.winners} | "
            f"{excluded} | {r.run_line} | {r.flwr_exit} | {_left(r)} | "
            f"{r.wall_s:.0f} | {r.load_before:.1f}-{r.load_after:.1f} |"
        )
    return "\n".join(lines)


def _left(r: RunResult) -> str:
    """Whether a ServerApp was left once ``flwr run`` ended (and how long the last one took to go)."""
    if r.serverapp_lingered:
        return f"yes, > {LINGER_WAIT_S:.0f} s"
    return "no" if r.serverapp_gone_s is None else f"no ({r.serverapp_gone_s:.0f} s)"


def ratios(results: list[RunResult]) -> str:
    """Per N: the market's time and the bidders of each profile (range and median), current over previous."""
    lines = []
    for n in sorted({r.num_nodes for r in results}):
        medians = {}
        for profile in PROFILES:
            runs = [r for r in results if r.num_nodes == n and r.profile == profile and r.market_s is not None]
            if not runs:
                continue
            times, bidders = [r.market_s or 0.0 for r in runs], [r.bidders for r in runs]
            medians[profile] = statistics.median(times)
            succeeded = sum(r.market_status == "succeeded" for r in runs)
            lines.append(
                f"N = {n}, {profile}: market {min(times):.0f}-{max(times):.0f} s (median {medians[profile]:.0f}), "
                f"bidders {min(bidders)}-{max(bidders)} of {n}, market succeeded in {succeeded} of {len(runs)}"
            )
        if len(medians) == 2:
            lines.append(
                f"N = {n}: median market time current / previous = {medians['current'] / medians['previous']:.2f}x"
            )
    return "\n".join(lines)


def report(results: list[RunResult]) -> None:
    """Print the runs' table and the ratios."""
    print(f"\nSuperNodes on loopback, {BASE_RUN_CONFIG}; load average (1 min) before-after each run\n")
    print(table(results))
    print()
    print(ratios(results))


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 30], help="numbers of SuperNodes")
    parser.add_argument("--runs", type=int, default=3, help="runs of each profile at each size (alternating)")
    parser.add_argument("--profiles", nargs="+", default=list(PROFILES), choices=list(PROFILES))
    parser.add_argument("--keep", type=Path, default=None, help="keep the run folders (logs) under this folder")
    parser.add_argument("--json", type=Path, default=None, help="also write the raw results here")
    parser.add_argument("--report", type=Path, default=None, help="print the tables of an earlier --json and stop")
    args = parser.parse_args(argv)
    if args.report:
        report([RunResult(**row) for row in json.loads(args.report.read_text())])
        return
    results: list[RunResult] = []
    with tempfile.TemporaryDirectory(prefix="bench-deployment-") as tmp:
        root = args.keep or Path(tmp)
        for n in args.sizes:
            for index in range(args.runs):
                order = args.profiles if index % 2 == 0 else list(reversed(args.profiles))
                for profile in order:
                    result = run_once(root, n, profile, index)
                    results.append(result)
                    print(table([result]).splitlines()[-1], flush=True)
                    if args.json:
                        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    report(results)
    survivors = [pid for r in results for pid in r.survivors]
    if survivors:
        raise SystemExit(f"processes started by the benchmark survived their stop: {survivors}")


if __name__ == "__main__":
    main()
