"""The checks and the write-up of ``benchmarks/gpu_path.sh``: what travels to the device machine against its 64 MiB,
the proof that every ClientApp trained on the GPU (read from the run's own log), and the summary, record and figure
it leaves in ``$OUT``.

    python -m benchmarks.gpu_path budget --carry .whl                 # exit 1 over 64 MiB
    python -m benchmarks.gpu_path report --work <gpu_path.sh's folder> --out "$OUT" --cuda true

What travels is the working tree (tracked files and untracked ones git does not ignore; on a copy without ``.git``,
every file) plus each carried path. The proof: each train message of the run's winners logs one line in the
ClientApp (``flmarket_flwr.app.client_app.train``: the device and its peak CUDA memory), and the run's log must hold
one such line per winner and round, on ``cuda`` with a positive peak for the GPU arm, on ``cpu`` for the CPU arm.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

PROJECT: Final = Path(__file__).resolve().parents[1]

TRAVEL_LIMIT_BYTES: Final = 64 * 2**20
"""What one call to the device machine may carry: the working tree and the carried paths together."""

TRAIN_LINE: Final = re.compile(
    r"ClientApp node (?P<node>\d+) \(partition (?P<partition>\d+)\), round (?P<round>\d+): trained (?P<examples>\d+)"
    r" examples on (?P<device>\S+)(?: \((?P<gpu>[^)]*)\))? in (?P<seconds>[\d.]+) s,"
    r" peak CUDA memory (?:(?P<peak>[\d.]+) MiB|none \(CPU\))"
)
"""The ClientApp's line for one train message (``flmarket_flwr.app.client_app.train``)."""

MARKET_LINE: Final = re.compile(r"Market: \d+ winners of .*")
"""The market's one-line outcome in the ServerApp's log."""

NO_GPU: Final = "no GPU"
"""What a CUDA check reads on a machine without one."""


def _sizes(paths: Iterable[Path]) -> int:
    return sum(path.stat().st_size for path in paths if path.is_file() and not path.is_symlink())


def _files_under(root: Path) -> list[Path]:
    return [path for path in root.rglob("*") if ".git" not in path.relative_to(root).parts]


def tree_files(root: Path) -> list[Path]:
    """The working tree's files that travel: ``git ls-files`` (tracked, and untracked that git does not ignore) in a
    checkout, every file but ``.git`` elsewhere (a copy that arrived without it)."""
    if not (root / ".git").exists():
        return _files_under(root)
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout
    return [root / name for name in listed.decode().split("\0") if name]


def travel_bytes(root: Path, carried: Sequence[Path] = ()) -> dict[str, Any]:
    """Bytes that travel: the tree's, each carried path's (not counted twice), their total and the limit."""
    carried_abs = [(root / path).resolve() for path in carried]
    tree = [path for path in tree_files(root) if not any(path.resolve().is_relative_to(c) for c in carried_abs)]
    by_path = {str(path): _sizes(_files_under(root / path) if (root / path).is_dir() else [root / path])
               for path in carried}  # fmt: skip
    total = _sizes(tree) + sum(by_path.values())
    return {
        "tree": _sizes(tree),
        "carried": by_path,
        "total": total,
        "limit": TRAVEL_LIMIT_BYTES,
        "within": total <= TRAVEL_LIMIT_BYTES,
    }


def describe_budget(budget: Mapping[str, Any]) -> str:
    """One line: the tree, each carried path and the total against the limit, in MiB."""
    carried = ", ".join(f"{path} {size / 2**20:.1f} MiB" for path, size in budget["carried"].items())
    verdict = "within" if budget["within"] else "OVER"
    return (
        f"travels: tree {budget['tree'] / 2**20:.1f} MiB{', ' + carried if carried else ''}; "
        f"total {budget['total'] / 2**20:.1f} MiB, {verdict} the {budget['limit'] / 2**20:.0f} MiB limit"
    )


@dataclass(frozen=True)
class TrainLine:
    """One ClientApp train message as its log line tells it."""

    node: int
    round: int
    device: str
    peak_cuda_mib: float | None


def train_lines(log: str) -> list[TrainLine]:
    """Every ClientApp train line in ``log`` (a message logged twice counts once)."""
    seen: dict[tuple[int, int], TrainLine] = {}
    for match in TRAIN_LINE.finditer(log):
        line = TrainLine(
            node=int(match["node"]),
            round=int(match["round"]),
            device=match["device"],
            peak_cuda_mib=None if match["peak"] is None else float(match["peak"]),
        )
        seen.setdefault((line.node, line.round), line)
    return list(seen.values())


def training_proof(log: str, winners: Iterable[int], rounds: int, expect: str) -> dict[str, Any]:
    """Whether the log shows every winner training in every round on the ``expect``-ed device type.

    Parameters
    ----------
    log : str
        The run's output (``flwr run --stream``).
    winners : Iterable[int]
        The market's winners (node ids; ``market.json``).
    rounds : int
        The FedAvg rounds run.
    expect : str
        ``"cuda"`` (a positive peak CUDA memory on every line too) or ``"cpu"``.

    Returns
    -------
    dict
        ``ok``, the counts expected and logged, what is missing or on another device, the devices seen and the
        peak CUDA memory range.
    """
    lines = train_lines(log)
    expected = {(int(node), r) for node in winners for r in range(1, rounds + 1)}
    logged = {(line.node, line.round) for line in lines}
    wrong = [
        line
        for line in lines
        if line.device.split(":")[0] != expect or (expect == "cuda" and not (line.peak_cuda_mib or 0.0) > 0.0)
    ]
    peaks = [line.peak_cuda_mib for line in lines if line.peak_cuda_mib is not None]
    return {
        "ok": bool(expected) and logged == expected and not wrong,
        "expected": len(expected),
        "logged": len(logged & expected),
        "missing": sorted(expected - logged)[:10],
        "unexpected": sorted(logged - expected)[:10],
        "wrong_device": [f"node {w.node} round {w.round} on {w.device}" for w in wrong][:10],
        "devices": sorted({line.device for line in lines}),
        "peak_cuda_mib": [min(peaks), max(peaks)] if peaks else None,
    }


def read_walls(path: Path) -> dict[str, dict[str, float]]:
    """``gpu_path.sh``'s ``walls.txt`` (``<part> <nanoseconds> <exit status>`` lines) as seconds and statuses."""
    walls: dict[str, dict[str, float]] = {}
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
        name, nanoseconds, status = line.split()
        walls[name] = {"wall_s": int(nanoseconds) / 1e9, "exit": int(status)}
    return walls


def main_arm(work: Path, out: Path, arm: str, expect: str) -> dict[str, Any]:
    """One ``flwr run`` arm: the market's line, every round's accuracy, the run's timings and the training proof."""
    log_path = out / f"main_{arm}.log"
    log = log_path.read_text(encoding="utf-8", errors="replace") if log_path.is_file() else ""
    run = work / "results" / arm
    if not (run / "history.json").is_file() or not (run / "market.json").is_file():
        return {"ok": False, "error": f"no history.json / market.json in {run}: see main_{arm}.log"}
    history = json.loads((run / "history.json").read_text(encoding="utf-8"))
    market = json.loads((run / "market.json").read_text(encoding="utf-8"))
    rounds = [row for row in history["rounds"] if row["round"] > 0]
    proof = training_proof(log, map(int, market["winners"]), len(rounds), expect)
    market_line = MARKET_LINE.search(log)
    return {
        "ok": proof["ok"] and market["status"] == "succeeded",
        "market": market_line.group(0) if market_line else None,
        "winners": len(market["winners"]),
        "accuracy": [row["accuracy"] for row in history["rounds"]],
        "timings": history["timings"],
        "proof": proof,
    }


def engine_jobs(work: Path, expect: str) -> dict[str, Any]:
    """The engine jobs' results: per selector the accuracy, the device it ran on, its peak CUDA memory, its wall."""
    jobs = {}
    for path in sorted((work / "engine").glob("*/result.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        ran_on = record["engine"]["ran_on"]
        jobs[record["selector"]] = {
            "final_accuracy": record["final_accuracy"],
            "auc_accuracy": record["engine"]["auc_accuracy"],
            "accuracy": [row["accuracy"] for row in record["rounds"]],
            "selected": len(record.get("selected_partitions", [])),
            "device": ran_on["device"],
            "peak_cuda_mib": ran_on["peak_cuda_mib"],
            "job_wall_s": record["timings"]["job_wall_s"],
            "dataset": record["dataset"],
        }
    on_device = all(job["device"].split(":")[0] == expect for job in jobs.values())
    return {"ok": len(jobs) == 3 and on_device, "jobs": jobs}


def plot(report: Mapping[str, Any], path: Path) -> None:
    """Accuracy per round: the main command on the GPU and on the CPU; the engine's jobs."""
    import matplotlib  # pylint: disable=import-outside-toplevel

    matplotlib.use("Agg")
    from matplotlib import pyplot  # pylint: disable=import-outside-toplevel

    figure, (main, engine) = pyplot.subplots(1, 2, figsize=(11, 4))
    for arm, label in (("gpu", f"GPU arm ({report['gpu_device']})"), ("cpu", "CPU cores")):
        accuracy = report["main"][arm].get("accuracy")
        if accuracy:
            main.plot(range(len(accuracy)), accuracy, marker="o", markersize=3, label=label)
    main.set(title="flwr run . (README's main command)", xlabel="round", ylabel="server-side accuracy")
    for selector, job in report["engine"]["jobs"].items():
        engine.plot(range(len(job["accuracy"])), job["accuracy"], label=f"{selector} ({job['device']})")
    datasets = sorted({job["dataset"] for job in report["engine"]["jobs"].values()})
    engine.set(title=f"engine jobs, one partition ({', '.join(datasets)})", xlabel="round", ylabel="test accuracy")
    for axes in (main, engine):
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    pyplot.close(figure)


def _mib_range(value: float | Sequence[float] | None) -> str:
    """``"31.5 MiB"``, ``"30.1-33.0 MiB"`` or ``"none (CPU)"``."""
    if value is None:
        return "none (CPU)"
    low, high = (value, value) if isinstance(value, float | int) else value
    return f"{low:.1f} MiB" if low == high else f"{low:.1f}-{high:.1f} MiB"


def summary_text(report: Mapping[str, Any]) -> str:
    """The human-readable summary: machine, what travelled, wall times, the market, accuracies, proofs, engine."""
    lines = [report["machine"].rstrip(), describe_budget(report["budget"]), ""]
    walls = report["walls"]
    for arm in ("gpu", "cpu"):
        main = report["main"][arm]
        wall = walls.get(f"main_{arm}", {})
        lines.append(
            f"== flwr run, {arm.upper()} arm: wall {wall.get('wall_s', math.nan):.1f} s, exit {wall.get('exit')}"
        )
        if "error" in main:
            lines.append(f"   FAILED: {main['error']}")
            continue
        lines.append(f"   {main['market']}")
        timings = main["timings"]
        lines.append(f"   market {timings['selection_s']:.1f} s, FedAvg {timings['fedavg_total_s']:.1f} s")
        lines.append("   accuracy per round: " + " ".join(f"{a:.4f}" for a in main["accuracy"]))
        proof = main["proof"]
        verdict = "ok" if proof["ok"] else "FAILED"
        lines.append(
            f"   training proof ({verdict}): {proof['logged']} of {proof['expected']} (winner, round) lines, devices "
            f"{', '.join(proof['devices']) or '-'}, peak CUDA memory {_mib_range(proof['peak_cuda_mib'])}"
        )
        for key in ("missing", "unexpected", "wrong_device"):
            if proof[key]:
                lines.append(f"   {key}: {proof[key]}")
    if not report["cuda"]:
        lines.append(f"   GPU checks: {NO_GPU} (torch.cuda.is_available() is False): the GPU arm ran on the CPU")
    speedup = report.get("speedup")
    if speedup:
        lines.append(f"   speed-up GPU over CPU: flwr run wall {speedup['wall']:.2f}x, FedAvg {speedup['fedavg']:.2f}x")
    engine_wall = walls.get("engine", {})
    lines.append(f"== engine, {engine_wall.get('wall_s', math.nan):.1f} s wall, exit {engine_wall.get('exit')}")
    for selector, job in report["engine"]["jobs"].items():
        lines.append(
            f"   {selector}: {job['dataset']}, {job['selected']} selected, final {job['final_accuracy']:.4f}, auc "
            f"{job['auc_accuracy']:.4f}, on {job['device']}, peak CUDA memory {_mib_range(job['peak_cuda_mib'])}, "
            f"{job['job_wall_s']:.1f} s"
        )
    lines.append(f"all checks: {'ok' if report['ok'] else 'FAILED'}")
    return "\n".join(lines) + "\n"


def report(work: Path, out: Path, cuda: bool) -> dict[str, Any]:
    """Read ``gpu_path.sh``'s work folder, write ``summary.txt``, ``results.json`` and ``accuracy.png`` to ``out``."""
    expect = "cuda" if cuda else "cpu"
    result: dict[str, Any] = {
        "cuda": cuda,
        "gpu_device": expect if cuda else f"{NO_GPU}: cpu",
        "machine": (work / "machine.txt").read_text(encoding="utf-8") if (work / "machine.txt").is_file() else "",
        "budget": json.loads((work / "budget.json").read_text(encoding="utf-8")),
        "walls": read_walls(work / "walls.txt"),
        "main": {"gpu": main_arm(work, out, "gpu", expect), "cpu": main_arm(work, out, "cpu", "cpu")},
        "engine": engine_jobs(work, expect),
    }
    gpu, cpu = result["main"]["gpu"], result["main"]["cpu"]
    if cuda and "timings" in gpu and "timings" in cpu:
        result["speedup"] = {
            "wall": result["walls"]["main_cpu"]["wall_s"] / result["walls"]["main_gpu"]["wall_s"],
            "fedavg": cpu["timings"]["fedavg_total_s"] / gpu["timings"]["fedavg_total_s"],
        }
    result["ok"] = bool(
        result["budget"]["within"]
        and gpu["ok"]
        and cpu["ok"]
        and result["engine"]["ok"]
        and all(wall["exit"] == 0 for wall in result["walls"].values())
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    (out / "summary.txt").write_text(summary_text(result), encoding="utf-8")
    plot(result, out / "accuracy.png")
    return result


def main(argv: list[str] | None = None) -> int:
    """``budget`` or ``report`` (see the module docstring); the exit status says whether every check held."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    commands = parser.add_subparsers(dest="command", required=True)
    budget = commands.add_parser("budget", help="what travels to the device machine, against 64 MiB")
    budget.add_argument("--carry", type=Path, action="append", default=[], help="a carried path (repeatable)")
    budget.add_argument("--json", type=Path, default=None, help="also write the figures here")
    budget.add_argument("--root", type=Path, default=PROJECT, help="the working tree (default: this checkout)")
    write = commands.add_parser("report", help="check gpu_path.sh's runs and write the summary to --out")
    write.add_argument("--work", type=Path, required=True)
    write.add_argument("--out", type=Path, required=True)
    write.add_argument("--cuda", choices=("true", "false"), required=True)
    args = parser.parse_args(argv)
    if args.command == "budget":
        figures = travel_bytes(args.root, args.carry)
        print(describe_budget(figures))
        if args.json:
            args.json.write_text(json.dumps(figures), encoding="utf-8")
        return 0 if figures["within"] else 1
    result = report(args.work, args.out, args.cuda == "true")
    print((args.out / "summary.txt").read_text(encoding="utf-8"), end="")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
