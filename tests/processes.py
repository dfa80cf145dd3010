"""Process helpers shared by the end-to-end tests that start Flower's own processes.

Free loopback ports, the process tree under given PIDs (read from /proc), and a bounded stop:
SIGTERM children first, wait until all are gone or the grace period ends, SIGKILL the rest.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports that are free on 127.0.0.1 right now."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def proc_table() -> dict[int, tuple[int, str]]:
    """``{pid: (parent pid, command line)}`` of every readable process."""
    table: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        table[int(entry.name)] = (int(stat.rsplit(")", 1)[1].split()[1]), cmdline)
    return table


def process_tree(roots: list[int]) -> list[int]:
    """``roots`` (those still running) and all their descendants, parents first."""
    table = proc_table()
    tree, frontier = [], [pid for pid in roots if pid in table]
    while frontier:
        pid = frontier.pop(0)
        tree.append(pid)
        frontier.extend(child for child, (ppid, _) in table.items() if ppid == pid)
    return tree


def pids_with_cmdline(fragment: str) -> list[int]:
    """PIDs whose command line contains ``fragment`` (e.g. a unique temporary path)."""
    return [pid for pid, (_, cmdline) in proc_table().items() if fragment in cmdline and pid != os.getpid()]


def is_alive(pid: int) -> bool:
    """Whether ``pid`` is running (zombies count as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def stop_pids(pids: list[int], grace_s: float = 10.0) -> None:
    """SIGTERM ``pids`` (children first), wait at most ``grace_s``, then SIGKILL what is left."""
    for pid in reversed(pids):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(is_alive(pid) for pid in pids):
        time.sleep(0.2)
    for pid in pids:
        if is_alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
