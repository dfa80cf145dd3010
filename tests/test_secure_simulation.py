"""docs/deployment.md's "The secure profile in simulation", run as written: forty simulated nodes, each a member of a
directory keyed by member that the documented ``identity_cli`` commands made before the run (never the buyer), the
sparse secure mode at two stated colluders on both sides, under ``flwr run`` from a fresh ``FLWR_HOME``.

One ``flwr run`` with its own ``FLWR_HOME`` and local SuperLink ports; every process it started is stopped by PID.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from processes import pids_with_cmdline, stop_started
from test_app_simulation import BIN_DIR, LocalFlower, needs_flower_cli

PROJECT = Path(__file__).resolve().parent.parent
SECTION = "## The secure profile in simulation"
NODES = 40
RUN_TIMEOUT_S = 1500


def section_blocks() -> list[str]:
    """The section's bash blocks, in order."""
    text = (PROJECT / "docs" / "deployment.md").read_text(encoding="utf-8")
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```bash\n(.*?)^```", section, flags=re.S | re.M)


@needs_flower_cli
def test_forty_simulated_members_run_the_sparse_secure_mode_from_the_documented_directory(tmp_path: Path) -> None:
    blocks = section_blocks()
    assert len(blocks) == 2 and f"N={NODES}" in blocks[0]
    assert "pass-colluders=2" in blocks[0] and "pass-colluders='2'" in blocks[1]  # the same colluders on both sides
    assert "neighbours='sparse'" in blocks[1]  # at 40 nodes the complete graph costs less: the sparse mode is asked for
    (tmp_path / "simulation.sh").write_text("set -euo pipefail\n" + "\n".join(blocks), encoding="utf-8")
    flower = LocalFlower(tmp_path)  # its own local SuperLink ports; the script sets FLWR_HOME itself, as documented
    env = {
        **flower.env,
        "APP": str(PROJECT),
        "VENV": str(BIN_DIR.parent),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT), os.environ.get("PYTHONPATH")])),
    }
    for name in ("FLWR_HOME", "FLMARKET_HOME", "FLMARKET_NODE_CONFIG", "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"):
        env.pop(name, None)  # the documented exports set them
    home = tmp_path / "flwr-home"
    try:
        completed = subprocess.run(
            ["bash", str(tmp_path / "simulation.sh")],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
    finally:
        left = stop_started(pids_with_cmdline(str(home)), ("FLWR_HOME", str(home)))
    output = completed.stdout + completed.stderr
    assert not left, f"processes of {home} survived: {left}"
    assert completed.returncode == 0, output[-6000:]
    assert "FLMarket run succeeded" in output, output[-6000:]

    directory = json.loads((tmp_path / "consortium" / "directory.json").read_text())
    assert directory["keyed-by"] == "member" and sorted(map(int, directory["keys"])) == list(range(NODES))
    assert f"{NODES} node(s) bound to members of the directory ({NODES} members)" in output, output[-6000:]
    opening = r"Market: secure profile \(security='malicious', directory of 40 nodes\); PASS over 40 clients on "
    drawn = r"a graph each client draws \(the sparse secure mode\): k=(\d+) out-neighbours each.*pass-colluders 2 "
    line = re.search(opening + drawn, output)
    assert line and int(line.group(1)) < NODES - 1, output[-6000:]
    market = json.loads((tmp_path / "results" / "secure-simulation" / "market.json").read_text())
    assert market["status"] == "succeeded" and market["winners"] and market["within_budget"], market
    assert len(market["pass_participants"]) == NODES and not market["excluded"], market
    ledgers = list((tmp_path / "flmarket-home" / "ledger").glob("*/release-ledger.json"))
    assert len(ledgers) == NODES  # one per member's identity, each with this release and its privacy spend
    assert all(json.loads(path.read_text())["spent"] for path in ledgers)
