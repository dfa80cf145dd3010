"""The wheels that take the Flower app and its Ray simulation to a machine with no package index.

A GPU machine with Python 3.12 and CUDA torch (and numpy, scipy, scikit-learn, matplotlib, grpcio, protobuf, ...)
but no ``flwr``, ``ray`` or ``cryptography`` runs ``benchmarks/gpu_path.sh`` from wheels carried beside the
working tree, and everything that travels must fit in 64 MiB. This module downloads those wheels at the versions
of ``constraints.txt`` and makes Ray's fit: the ``ray`` wheel (73.8 MB for cp312) without the parts that Flower's
simulation and the engine's Ray tasks never load (:data:`RAY_DROPPED`: Java workers, RLlib, Ray Data, Train, Tune,
Serve, LLM, the dashboard's web client), its three native programs stripped of their symbol tables
(:data:`RAY_STRIPPED`), repacked by the ``wheel`` tool (``wheel unpack`` / ``wheel pack``, which writes a new
``RECORD``) as version ``2.55.1+slim``, which ``ray==2.55.1`` still accepts, its largest members then stored
LZMA-compressed (:data:`LZMA_FROM_BYTES`).

    python -m benchmarks.device_wheels --dest .whl                                   # the GPU machine (cp312)
    python -m benchmarks.device_wheels --dest /tmp/slim --python-version 3.11 --only ray   # this machine's Ray

``--dest`` must be a folder git ignores (``.whl/`` is in ``.gitignore``): wheels are never committed.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Final

from packaging.utils import canonicalize_name, parse_wheel_filename

PROJECT: Final = Path(__file__).resolve().parents[1]

CARRIED: Final[tuple[str, ...]] = (
    "alembic",
    "annotated-types",
    "cffi",
    "cryptography",
    "dm-tree",
    "dp-accounting",
    "fastapi",
    "flwr",
    "grpcio-health-checking",
    "iterators",
    "jsonschema",
    "jsonschema-specifications",
    "mako",
    "prompt-toolkit",
    "pycparser",
    "pycryptodome",
    "pydantic",
    "pydantic-core",
    "pynacl",
    "ray",
    "referencing",
    "rpds-py",
    "sqlalchemy",
    "starlette",
    "tomli",
    "tomli-w",
    "typing-inspection",
    "uvicorn",
    "watchfiles",
    "wcwidth",
)
"""What ``flmarket-flwr[app]`` imports (``flwr run``'s SuperLink, SuperExec and simulation, the app, the engine) and
the GPU machine lacks. Left out: the packages the machine has (torch, numpy, scipy, scikit-learn, matplotlib,
grpcio, protobuf, click, typer, requests, pyyaml, msgpack, aiohttp, ...); ``uv``, which ``flwr`` calls only to
install an app's dependencies at run time (``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1`` turns that off);
Hydra (``hydra-core``, ``omegaconf``, ``antlr4-python3-runtime``), which only ``python -m simulations.run`` imports;
and the optional extras of uvicorn and SQLAlchemy that nothing here loads (``httptools``, ``websockets``,
``python-dotenv``, ``greenlet``, ``tzdata``)."""

RAY_DROPPED: Final[tuple[str, ...]] = (
    "ray/jars",
    "ray/rllib",
    "ray/data",
    "ray/train",
    "ray/tune",
    "ray/serve",
    "ray/llm",
    "ray/dashboard/client/build",
)
"""Folders of the ``ray`` wheel that neither Flower's simulation (``flwr.simulation.ray_transport``: ``ray``,
``ray.util.actor_pool``, ``ray.util.scheduling_strategies``) nor the engine's Ray tasks nor ``ray start`` load."""

RAY_STRIPPED: Final[tuple[str, ...]] = (
    "ray/_raylet.so",
    "ray/core/src/ray/raylet/raylet",
    "ray/core/src/ray/gcs/gcs_server",
)
"""Ray's native programs, shipped with their full symbol tables: ``strip --strip-unneeded`` keeps what the dynamic
linker needs (11 MB off each, 4 MB of the compressed wheel)."""

LZMA_FROM_BYTES: Final = 2**20
"""Members of the slim wheel at least this large (Ray's native programs) are stored LZMA-compressed (7.6 MiB less
than deflate): a wheel is a zip archive, and pip reads any method Python's ``zipfile`` does."""

SLIM_LOCAL_VERSION: Final = "slim"
"""The local version label of the repacked wheel (``2.55.1+slim``): ``ray==2.55.1`` accepts it, ``pip list`` shows
it."""

PLATFORMS: Final[tuple[str, ...]] = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_26_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_5_x86_64",
    "manylinux1_x86_64",
)
"""Linux x86-64 platform tags a wheel may carry for a glibc 2.28+ machine (pip matches each tag exactly)."""


def pinned_versions(constraints: Path, names: Iterable[str]) -> dict[str, str]:
    """The version ``constraints`` pins for each of ``names`` (``name==version`` lines; names compared canonically).

    Raises
    ------
    ValueError
        Naming every one of ``names`` that the file does not pin.
    """
    pins: dict[str, str] = {}
    for line in constraints.read_text(encoding="utf-8").splitlines():
        match = re.fullmatch(r"\s*([A-Za-z0-9_.\-]+)\s*==\s*([^\s;#]+).*", line)
        if match:
            pins[canonicalize_name(match.group(1))] = match.group(2)
    wanted = [canonicalize_name(name) for name in names]
    missing = [name for name in wanted if name not in pins]
    if missing:
        raise ValueError(f"{constraints} pins no version of {', '.join(missing)}")
    return {name: pins[name] for name in wanted}


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def download(name: str, version: str, dest: Path, python_version: str) -> Path:
    """Download ``name==version`` as a wheel for CPython ``python_version`` on Linux x86-64 into ``dest``.

    A project published only as a source distribution is built here into a wheel, which must then be pure Python
    (``py3-none-any``): a compiled one would be built for this machine, not the target.

    Returns
    -------
    Path
        The wheel.

    Raises
    ------
    RuntimeError
        If no wheel for the target exists and the source builds into a platform-specific one.
    """
    with tempfile.TemporaryDirectory(prefix="device-wheel-") as scratch:
        spec = f"{name}=={version}"
        platforms = [arg for tag in PLATFORMS for arg in ("--platform", tag)]
        target = ["--python-version", python_version, "--implementation", "cp", *platforms]
        built = False
        try:
            _pip("download", "-q", "--no-deps", "--only-binary=:all:", *target, "-d", scratch, spec)
        except subprocess.CalledProcessError:
            _pip("wheel", "-q", "--no-deps", "--no-binary", name, "-w", scratch, spec)
            built = True
        (wheel,) = Path(scratch).glob("*.whl")
        pure = all(tag.abi == "none" and tag.platform == "any" for tag in parse_wheel_filename(wheel.name)[3])
        if built and not pure:
            raise RuntimeError(f"{spec} has no wheel for CPython {python_version} and builds into {wheel.name}")
        dest.mkdir(parents=True, exist_ok=True)
        return Path(shutil.move(str(wheel), dest / wheel.name))


def slim_wheel(
    wheel: Path,
    dest: Path,
    dropped: Sequence[str] = RAY_DROPPED,
    stripped: Sequence[str] = RAY_STRIPPED,
    local_version: str = SLIM_LOCAL_VERSION,
    lzma_from: int | None = LZMA_FROM_BYTES,
) -> Path:
    """Repack ``wheel`` into ``dest`` without the folders ``dropped`` and with the binaries ``stripped`` stripped.

    ``wheel unpack`` and ``wheel pack`` (the ``wheel`` tool) do the unpacking and the packing; the new ``RECORD``
    lists the files that are left, with their hashes. The version gains the local label ``local_version``, and the
    members of at least ``lzma_from`` bytes are then stored LZMA-compressed (:func:`recompress`; ``None``: not).

    Raises
    ------
    FileNotFoundError
        If one of ``dropped`` or ``stripped`` is not in the wheel: a new release moved it, and what this module
        claims about the wheel no longer holds.
    RuntimeError
        If ``strip`` (binutils) is not installed while ``stripped`` names files.
    """
    if stripped and shutil.which("strip") is None:
        raise RuntimeError("strip (binutils) is needed to strip the wheel's binaries: apt-get install binutils")
    with tempfile.TemporaryDirectory(prefix="slim-wheel-") as scratch:
        subprocess.run([sys.executable, "-m", "wheel", "unpack", "-d", scratch, str(wheel)], check=True)
        (root,) = Path(scratch).iterdir()
        for folder in dropped:
            path = root / folder
            if not path.is_dir():
                raise FileNotFoundError(f"{wheel.name} has no folder {folder}")
            shutil.rmtree(path)
        for binary in stripped:
            path = root / binary
            if not path.is_file():
                raise FileNotFoundError(f"{wheel.name} has no file {binary}")
            subprocess.run(["strip", "--strip-unneeded", str(path)], check=True)
        _tag_as_named(root, wheel.name)
        dest.mkdir(parents=True, exist_ok=True)
        before = set(dest.glob("*.whl"))
        command = [sys.executable, "-m", "wheel", "pack", "-d", str(dest), str(root)]
        subprocess.run([*command, "--local-version", local_version] if local_version else command, check=True)
        (packed,) = set(dest.glob("*.whl")) - before
    if lzma_from is not None:
        recompress(packed, lzma_from)
    return packed


def recompress(wheel: Path, lzma_from: int = LZMA_FROM_BYTES) -> None:
    """Store the members of ``wheel`` of at least ``lzma_from`` bytes LZMA-compressed, the others deflated, in place.

    Names, permissions, dates and contents are kept, so the ``RECORD`` that ``wheel pack`` wrote still holds.
    """
    partial = wheel.with_name(wheel.name + ".partial")
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(partial, "w") as target:
        for member in source.infolist():
            copy = zipfile.ZipInfo(member.filename, date_time=member.date_time)
            copy.external_attr, copy.create_system = member.external_attr, member.create_system
            copy.compress_type = zipfile.ZIP_LZMA if member.file_size >= lzma_from else zipfile.ZIP_DEFLATED
            target.writestr(copy, source.read(member))
    partial.replace(wheel)


def _tag_as_named(root: Path, filename: str) -> None:
    """Set the ``Tag`` lines of the unpacked wheel's ``WHEEL`` file to the tags of its published ``filename``.

    ``wheel pack`` names the wheel after those lines, and a published file may carry other tags than its
    ``WHEEL`` file says (Ray's ``manylinux2014_x86_64`` wheels say ``linux_x86_64`` inside).
    """
    (metadata,) = root.glob("*.dist-info/WHEEL")
    lines = [
        line
        for line in metadata.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("Tag:")
    ]
    tags = sorted(str(tag) for tag in parse_wheel_filename(filename)[3])
    metadata.write_text("\n".join([*lines, *(f"Tag: {tag}" for tag in tags)]) + "\n", encoding="utf-8")


def wheel_files(wheel: Path) -> list[str]:
    """The file names inside ``wheel``."""
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def main(argv: list[str] | None = None) -> None:
    """Download the carried wheels (or ``--only`` some) into ``--dest``, with Ray slimmed; print their sizes."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--dest", type=Path, required=True, help="folder for the wheels (one git ignores)")
    parser.add_argument("--python-version", default="3.12", help="target CPython (default: 3.12)")
    parser.add_argument("--only", nargs="+", default=None, help="these of the carried packages only")
    parser.add_argument("--constraints", type=Path, default=PROJECT / "constraints.txt")
    args = parser.parse_args(argv)
    names = args.only or list(CARRIED)
    unknown = sorted(set(map(canonicalize_name, names)) - set(map(canonicalize_name, CARRIED)))
    if unknown:
        parser.error(f"not a carried package: {', '.join(unknown)}")
    dest: Path = args.dest
    for name, version in pinned_versions(args.constraints, names).items():
        stale = [w for w in dest.glob("*.whl") if canonicalize_name(parse_wheel_filename(w.name)[0]) == name]
        for old in stale:
            old.unlink()
        wheel = download(name, version, dest, args.python_version)
        if name == "ray":
            with tempfile.TemporaryDirectory(prefix="ray-wheel-") as original:
                moved = Path(shutil.move(str(wheel), Path(original) / wheel.name))
                full = moved.stat().st_size
                wheel = slim_wheel(moved, dest)
            print(f"{wheel.name}: {wheel.stat().st_size / 2**20:.1f} MiB (the published wheel: {full / 2**20:.1f} MiB)")
    total = sum(w.stat().st_size for w in dest.glob("*.whl"))
    print(f"{len(list(dest.glob('*.whl')))} wheels in {dest}: {total / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
