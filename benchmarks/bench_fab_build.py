"""What the set-up's virtual environment costs every ``flwr run .``: the FAB build with the venv inside the app
folder (the old README: ``python3 -m venv .venv``) against the venv beside it, reached through a ``.venv`` link (the
README now), side by side in alternating runs.

``flwr run .`` builds its FAB with ``flwr.cli.build.build_fab_from_disk``, which lists every file under the app
(``collect_files``: ``os.walk``, a symlink check and a ``resolve()`` per file) before any filter (``.gitignore``,
``fab-include``, Flower's own ``.venv/**`` exclusion) applies: no filter can skip the walk, but a link is never
entered. Each run builds the FAB of a copy of this checkout's tracked files, in a fresh process: once with the venv
running this script hard-linked into ``<app>/.venv`` (every file there, no data copied), once with that same tree
moved beside the app and ``.venv`` a link to it. Both must give the same FAB, byte for byte.

    python -m benchmarks.bench_fab_build --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
PROBE = """
import hashlib, json, sys, time
from pathlib import Path
from flwr.cli.build import build_fab_from_disk
from flwr.cli.utils import collect_files
app = Path(sys.argv[1])
started = time.perf_counter()
fab = build_fab_from_disk(app)
build_s = time.perf_counter() - started
started = time.perf_counter()
walked = len(collect_files(app))
walk_s = time.perf_counter() - started
print(json.dumps({"build_s": build_s, "walk_s": walk_s, "walked": walked, "fab": hashlib.sha256(fab).hexdigest()}))
"""
LAYOUTS = ("inside", "beside")


def make_app(root: Path, venv: Path) -> tuple[Path, Path]:
    """A copy of the checkout's tracked files in ``root/flmarket-flwr`` and a hard-linked copy of ``venv`` beside it;
    returns ``(app, venv copy)``."""
    app = root / "flmarket-flwr"
    tracked = (
        subprocess.run(["git", "ls-files", "-z"], cwd=PROJECT, capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, tracked):
        target = app / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(PROJECT / name, target)
    copy = root / "flmarket-flwr.venv"
    subprocess.run(["cp", "-al", str(venv), str(copy)], check=True)  # same files, no data copied
    return app, copy


def arrange(app: Path, venv_copy: Path, layout: str) -> None:
    """Put the venv inside the app (``<app>/.venv`` a folder) or beside it (``<app>/.venv`` a link)."""
    link = app / ".venv"
    if link.is_symlink():
        link.unlink()
    elif link.is_dir():
        link.rename(venv_copy)
    if layout == "inside":
        venv_copy.rename(link)
    else:
        link.symlink_to(os.path.relpath(venv_copy, app))


def measure(app: Path, out_dir: Path) -> dict[str, float | int | str]:
    """One FAB build of ``app`` in a fresh interpreter, then the whole ``flwr build`` command (start-up included)."""
    out = subprocess.run([sys.executable, "-c", PROBE, str(app)], capture_output=True, text=True, check=True)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    started = time.perf_counter()
    subprocess.run([str(Path(sys.executable).parent / "flwr"), "build", "--app", str(app)], cwd=out_dir, check=True,
                   capture_output=True)  # fmt: skip
    row["cli_s"] = time.perf_counter() - started
    return row


def summary(rows: list[dict]) -> str:
    """The table: per layout, the range of the FAB build and of the walk alone, and the files walked."""
    header = "| layout | FAB build (s) | median | the walk (s) | `flwr build` (s) | files walked | runs |"
    lines = [header, "|---" * 7 + "|"]
    for layout in LAYOUTS:
        mine = [row for row in rows if row["layout"] == layout]
        if not mine:
            continue
        build = [row["build_s"] for row in mine]
        walk = [row["walk_s"] for row in mine]
        cli = [row["cli_s"] for row in mine]
        lines.append(
            f"| {layout} | {min(build):.2f}-{max(build):.2f} | {statistics.median(build):.2f} | "
            f"{min(walk):.2f}-{max(walk):.2f} | {min(cli):.2f}-{max(cli):.2f} | {mine[0]['walked']:,} | {len(mine)} |"
        )
    inside = [row["build_s"] for row in rows if row["layout"] == "inside"]
    beside = [row["build_s"] for row in rows if row["layout"] == "beside"]
    if inside and beside:
        lines.append(f"\nmedian ratio inside/beside: {statistics.median(inside) / statistics.median(beside):.1f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Run the alternating measurements and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of each layout, alternating (default 3)")
    parser.add_argument(
        "--venv", type=Path, default=Path(sys.prefix), help="the venv to place (default: the one running this)"
    )
    parser.add_argument(
        "--tmp", type=Path, default=None, help="where the copies go: on the venv's file system (default: the system's)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the raw rows here")
    args = parser.parse_args(argv)
    if not (args.venv / "pyvenv.cfg").is_file():
        parser.error(f"{args.venv} is not a virtual environment (no pyvenv.cfg): pass --venv")
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-fab-", dir=args.tmp) as tmp:  # hard links: --tmp on the same disk
        app, venv_copy = make_app(Path(tmp), args.venv.resolve())
        for run in range(args.runs):
            for layout in LAYOUTS if run % 2 == 0 else tuple(reversed(LAYOUTS)):
                arrange(app, venv_copy, layout)
                load = os.getloadavg()[0]
                row = {"layout": layout, "run": run, "load_before": load, **measure(app, Path(tmp))}
                row["load_after"] = os.getloadavg()[0]
                rows.append(row)
                print(
                    f"{time.strftime('%H:%M:%S')} {layout:6} build {row['build_s']:.2f} s, walk {row['walk_s']:.2f} s, "
                    f"flwr build {row['cli_s']:.2f} s, {row['walked']} files, load {load:.1f}-{row['load_after']:.1f}",
                    flush=True,
                )
        arrange(app, venv_copy, "beside")  # the copy goes with the folder either way
    if len({row["fab"] for row in rows}) != 1:
        raise SystemExit(f"the layouts gave different FABs: {sorted({row['fab'] for row in rows})}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print()
    print(summary(rows))
    print(f"\nthe same FAB in every run (sha256 {rows[0]['fab'][:16]}...)")


if __name__ == "__main__":
    main()
