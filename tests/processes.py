"""Process helpers shared by the end-to-end tests that start Flower's own processes.

Free loopback ports, the process tree under given PIDs (read from /proc), the processes whose environment carries
a marker (a test's own ``FLWR_HOME``), a bounded stop (SIGTERM children first, wait until all are gone or the
grace period ends, SIGKILL the rest) and a crash (SIGKILL at once).
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


def pids_with_env(name: str, value: str) -> list[int]:
    """PIDs whose environment (as they were started) holds ``name=value``, this process excepted.

    Flower's ``flower-superexec`` (the SuperLink's runs in its own session), ``flwr-serverapp`` and
    ``flwr-clientapp`` inherit the environment of what a test started but are not all its descendants once a
    parent is gone: a test's own ``FLWR_HOME`` finds every one of them.
    """
    entry = f"{name}={value}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            environ = (proc / "environ").read_bytes()
        except OSError:  # gone, or another user's
            continue
        if entry in environ.split(b"\0") and is_alive(int(proc.name)):
            found.append(int(proc.name))
    return found


def started_by(roots: list[int], env: tuple[str, str] | None = None) -> list[int]:
    """Everything a test started: ``roots`` and their descendants, and (``env = (name, value)``) every process
    whose environment holds ``name=value`` with its descendants; parents first, living ones only."""
    marked = pids_with_env(*env) if env is not None else []
    return [pid for pid in process_tree(list(dict.fromkeys([*roots, *marked]))) if is_alive(pid)]


def stop_started(
    roots: list[int], env: tuple[str, str] | None = None, grace_s: float = 10.0, settle_s: float = 10.0
) -> list[int]:
    """Stop everything :func:`started_by` finds, by PID, and return what is still alive afterwards (should be none).

    SIGTERM (children first) to what is found, again to what appears meanwhile (a ClientApp a SuperExec was
    starting), until all are gone or ``grace_s`` passes; then SIGKILL to what is left, and up to ``settle_s`` for
    the kernel to take it (a SIGKILLed process on a starved machine takes a while).
    """
    signalled: set[int] = set()
    deadline = time.monotonic() + grace_s
    while (alive := started_by(roots, env)) and time.monotonic() < deadline:
        for pid in reversed([pid for pid in alive if pid not in signalled]):
            _signal(pid, signal.SIGTERM)
            signalled.add(pid)
        time.sleep(0.2)
    for pid in started_by(roots, env):
        _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + settle_s
    while (alive := started_by(roots, env)) and time.monotonic() < deadline:
        for pid in alive:
            _signal(pid, signal.SIGKILL)
        time.sleep(0.2)
    return alive


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def is_alive(pid: int) -> bool:
    """Whether ``pid`` is running (zombies count as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def kill_now(pids: list[int]) -> None:
    """SIGKILL ``pids`` at once (a crash: nothing of theirs runs again, not even an exit handler)."""
    for pid in pids:
        _signal(pid, signal.SIGKILL)


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
