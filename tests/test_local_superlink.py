"""docs/usage.md's "When the local SuperLink does not start in time", run as written (issue 44, item 2).

Flower 1.42 gives the local SuperLink that ``flwr run .`` starts 15 s and kills it on the timeout, which can leave
a half-made ``state.db`` that the next start refuses. The guide starts the SuperLink by hand and waits as long as it
takes (``flwr`` then uses it), and moves a refused database aside. Each test runs the blocks in a private
``FLWR_HOME`` on free ports (the documented ``FLWR_LOCAL_*_PORT`` variables and the same numbers in the command),
with ``flwr ls`` in place of the block's ``flwr run`` (the same lookup of the local SuperLink, without a
simulation), and stops everything carrying its ``FLWR_HOME`` by PID afterwards.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from processes import free_ports, pids_with_env, proc_table, stop_started

PROJECT = Path(__file__).resolve().parents[1]
SECTION = "### When the local SuperLink does not start in time"
BIN_DIR = Path(sys.executable).parent
START_TIMEOUT_S = 120


def section_blocks() -> list[str]:
    """The section's two bash blocks: the start by hand (ending with ``flwr run``) and the database moved aside."""
    text = (PROJECT / "docs" / "usage.md").read_text(encoding="utf-8")
    section = text.split(SECTION, 1)[1].split("\n### ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 2 and blocks[0].rstrip().splitlines()[-1].startswith("flwr run ."), blocks
    assert blocks[1].startswith("mv "), blocks
    return blocks


class LocalHome:
    """A private ``FLWR_HOME`` and ports, and the guide's blocks adapted to them."""

    def __init__(self, root: Path) -> None:
        self.root, self.home = root, root / "flwr-home"
        self.http, self.control = (str(port) for port in free_ports(2))
        self.env = {
            "PATH": f"{BIN_DIR}:/usr/bin:/bin",
            "HOME": str(root),
            "FLWR_HOME": str(self.home),  # what the first block exports, in the reader's shell for the second
            "PYTHONPATH": str(PROJECT),
            "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": self.http,
            "FLWR_LOCAL_CONTROL_API_PORT": self.control,
        }

    def adapt(self, block: str, flwr_run_as: str = "flwr ls --format json") -> str:
        """``block`` on this home's ports and folder, its ``flwr run`` replaced by ``flwr_run_as``."""
        block = block.replace('"$HOME/.flwr"', f'"{self.home}"').replace(".venv/bin", str(BIN_DIR))
        block = block.replace("39091", self.http).replace("39093", self.control)
        return re.sub(r"^flwr run \..*$", flwr_run_as, block, flags=re.M)

    def bash(self, script: str, timeout_s: float = START_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", "set -euo pipefail\n" + script],
            cwd=PROJECT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )

    def superlinks(self) -> list[str]:
        """Command lines of the SuperLinks carrying this home."""
        commands = [proc_table().get(pid, (0, ""))[1] for pid in pids_with_env("FLWR_HOME", str(self.home))]
        return [command for command in commands if "flower-superlink" in command]


@pytest.fixture
def local(tmp_path: Path) -> Iterator[LocalHome]:
    home = LocalHome(tmp_path)
    try:
        yield home
    finally:
        left = stop_started([], ("FLWR_HOME", str(home.home)))
        assert not left, [proc_table().get(pid) for pid in left]


def test_a_superlink_started_by_hand_is_the_one_flwr_uses(local: LocalHome) -> None:
    started, _ = section_blocks()

    done = local.bash(local.adapt(started))

    assert done.returncode == 0, done.stdout + done.stderr
    assert "Starting local SuperLink" not in done.stdout + done.stderr, "flwr started a SuperLink of its own"
    assert json.loads(done.stdout)["runs"] == []
    (superlink,) = local.superlinks()
    assert f"--port {local.http}" in superlink and "--simulation" in superlink
    assert (local.home / "local-superlink" / "state.db").is_file()


def test_a_half_made_state_db_is_refused_until_moved_aside(local: LocalHome) -> None:
    started, move_aside = section_blocks()
    database = local.home / "local-superlink" / "state.db"
    database.parent.mkdir(parents=True)
    with sqlite3.connect(database) as half_made:  # what a SuperLink killed while it made its tables leaves
        half_made.execute("CREATE TABLE task (task_id TEXT PRIMARY KEY)")
    head = local.adapt(started).split("\nuntil ", 1)[0]  # the set-up and the SuperLink's start
    foreground = head.rstrip().removesuffix("&")  # waited for: it must refuse the database and exit

    refused = local.bash(foreground)

    assert refused.returncode != 0
    log = (local.home / "local-superlink" / "superlink.log").read_text(errors="replace")
    assert "schema does not match" in log or "already exists" in log, log[-2000:]

    moved = local.bash(local.adapt(move_aside))
    again = local.bash(local.adapt(started))

    assert moved.returncode == 0 and database.with_suffix(".db.broken").is_file()
    assert again.returncode == 0, again.stdout + again.stderr
    assert json.loads(again.stdout)["runs"] == [] and len(local.superlinks()) == 1
