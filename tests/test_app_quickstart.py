"""An existing Flower app (Flower's quickstart structure, ``tests/quickstart_app``) gains the market with the
documented drop-in lines and runs under ``flwr run``: the market first, then FedAvg on the winners only.

One ``flwr run`` with its own ``FLWR_HOME`` and local SuperLink ports; every process it started is stopped
by PID at the end.
"""

from __future__ import annotations

import os
from pathlib import Path

from processes import pids_with_cmdline
from test_app_simulation import LocalFlower, _explain, needs_flower_cli

QUICKSTART = Path(__file__).resolve().parent / "quickstart_app"
PROJECT = QUICKSTART.parents[1]


@needs_flower_cli
def test_quickstart_with_the_market_runs_under_flwr_run(tmp_path: Path) -> None:
    flower = LocalFlower(tmp_path)
    # The ServerApp and ClientApps import flmarket_flwr from this checkout, not from an installed copy.
    flower.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT), os.environ.get("PYTHONPATH")]))
    try:
        completed = flower.flwr("--federation-config", "num-supernodes=4", app=QUICKSTART)
    finally:
        flower.stop()
    output = completed.stdout + completed.stderr
    assert not pids_with_cmdline(str(flower.home)), "a SuperLink process survived"
    assert "FLMarket market phase finished" in output, _explain(output)
    assert "quickstart finished: 2 training rounds" in output, _explain(output)
    assert "Traceback" not in output, _explain(output)
