"""The layout of docs/layout.md holds in the code: the plugin, the example app and the experiments import downward only.

Every ``import`` of the project's own code (module level, inside functions and under ``TYPE_CHECKING`` alike) is read
from the source with :mod:`ast`, so a lazy import cannot hide an upward dependency.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("flmarket_flwr", "simulations", "benchmarks")

# Floors, from the ground up: a room may import its own floor's room and the rooms on floors below it, nothing above.
FLOORS: dict[str, int] = {
    "flmarket_flwr.pass_protocol": 0,  # PASS: no Flower, no market
    "flmarket_flwr.pricing": 0,  # the score and the auction: numpy only
    "flmarket_flwr.nodes": 0,
    "flmarket_flwr.market.wire": 1,  # what buyer and node both read: messages, records, award, ledger rule
    "flmarket_flwr.market.buyer": 2,  # FLMarket, the market phase over a Grid: never imports the node
    "flmarket_flwr.market.node": 2,  # the ClientApp handlers, node settings, bids: never imports the buyer
    "flmarket_flwr.market": 3,  # the public API (market/__init__.py): what a Flower user imports
    "flmarket_flwr": 3,  # the package's own __init__
    "flmarket_flwr.app.data": 4,  # the example app's data sets
    "simulations.inprocess_grid": 4,  # the test harness: a Grid running real ClientApps in one process (not the wheel)
    "flmarket_flwr.app": 5,  # the example app: ServerApp, ClientApp, run config, task, models, demo
    "simulations.baselines": 6,  # the experiments' baselines: RS, QBS, DICE, DDS, S-FedAvg
    "simulations": 7,  # the experiments' runtime: engine, sweeps, report
    "benchmarks": 8,
}
BUYER, NODE = "flmarket_flwr.market.buyer", "flmarket_flwr.market.node"
PLUGIN = ("flmarket_flwr.pass_protocol", "flmarket_flwr.pricing", "flmarket_flwr.nodes", "flmarket_flwr.market")


def room_of(module: str) -> str:
    """The longest room of :data:`FLOORS` that holds ``module`` (a dotted name)."""
    rooms = [room for room in FLOORS if module == room or module.startswith(room + ".")]
    if not rooms:
        raise ValueError(f"{module!r} is in no room of the layout; add it to FLOORS and docs/layout.md")
    return max(rooms, key=len)


def module_name(path: Path) -> str:
    """The dotted module name of a source file under :data:`ROOT`."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def own_imports(path: Path, module: str | None = None) -> Iterator[tuple[str, int]]:
    """``(imported module, line)`` for each import of the project's own packages in ``path``, relative ones resolved.

    ``module`` is the file's dotted name (by default from its place under :data:`ROOT`). ``from package import name``
    yields ``package.name`` (``name`` may be a module; a room is found either way).
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    module = module or module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            names = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] in PACKAGES:
                yield name, node.lineno


def sources() -> list[Path]:
    return sorted(
        path for package in PACKAGES for path in (ROOT / package).rglob("*.py") if "__pycache__" not in path.parts
    )


def room_arrows() -> dict[tuple[str, str], str]:
    """Each import between two rooms, as ``(importer's room, imported room) -> "file:line"`` (the first seen)."""
    arrows: dict[tuple[str, str], str] = {}
    for path in sources():
        source = room_of(module_name(path))
        for imported, line in own_imports(path):
            target = room_of(imported)
            if target != source:
                arrows.setdefault((source, target), f"{path.relative_to(ROOT)}:{line}")
    return arrows


def test_every_source_file_lies_in_a_room_of_the_layout() -> None:
    assert sources()
    for path in sources():
        room_of(module_name(path))


def test_no_import_runs_up_a_floor_or_sideways_between_rooms() -> None:
    wrong = [
        f"{where}: {source} (floor {FLOORS[source]}) imports {target} (floor {FLOORS[target]})"
        for (source, target), where in room_arrows().items()
        if FLOORS[target] >= FLOORS[source]
    ]
    assert not wrong, "\n".join(wrong)


def test_the_plugin_imports_neither_the_app_nor_the_experiments() -> None:
    arrows = room_arrows()
    upward = {
        (source, target): where
        for (source, target), where in arrows.items()
        if source in PLUGIN and not target.startswith(PLUGIN)
    }
    assert not upward
    assert not [(s, t) for s, t in arrows if s.startswith("flmarket_flwr.app") and t.split(".")[0] != "flmarket_flwr"]


def test_pass_and_pricing_never_import_flower() -> None:
    for room in ("pass_protocol", "pricing"):
        for path in (ROOT / "flmarket_flwr" / room).rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            names = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
            names += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
            assert not [name for name in names if name.split(".")[0] == "flwr"], path


def test_the_rooms_import_one_another_without_a_circle() -> None:
    edges = set(room_arrows())
    rooms = {room for edge in edges for room in edge}
    reach = {room: {target for source, target in edges if source == room} for room in rooms}
    for _ in rooms:  # transitive closure, small: ten rooms
        for room, targets in reach.items():
            reach[room] = targets | set(itertools.chain.from_iterable(reach.get(t, set()) for t in targets))
    assert not [room for room in rooms if room in reach[room]]


@pytest.mark.parametrize(
    ("module", "room"),
    [
        ("flmarket_flwr.market.node.client", "flmarket_flwr.market.node"),
        ("flmarket_flwr.market.buyer.server", "flmarket_flwr.market.buyer"),
        ("flmarket_flwr.market.wire.messages", "flmarket_flwr.market.wire"),
        ("flmarket_flwr.market", "flmarket_flwr.market"),
        ("flmarket_flwr.app.data.partition", "flmarket_flwr.app.data"),
        ("flmarket_flwr.app.server_app", "flmarket_flwr.app"),
        ("simulations.baselines.selectors", "simulations.baselines"),
        ("simulations.engine", "simulations"),
        ("simulations.inprocess_grid", "simulations.inprocess_grid"),
    ],
)
def test_a_module_belongs_to_its_longest_room(module: str, room: str) -> None:
    assert room_of(module) == room


def test_the_walk_sees_an_upward_import_the_plugin_would_make(tmp_path: Path) -> None:
    """The checker itself: a plugin module that imports the app, even lazily inside a function, is an upward arrow."""
    source = tmp_path / "probe.py"
    source.write_text("def f():\n    from flmarket_flwr.app import task\n    from .. import app\n", encoding="utf-8")
    imported = [name for name, _ in own_imports(source, "flmarket_flwr.market.probe")]
    assert imported == ["flmarket_flwr.app.task", "flmarket_flwr.app"]
    assert all(FLOORS[room_of(name)] > FLOORS["flmarket_flwr.market"] for name in imported)


def test_the_buyer_and_the_node_never_import_each_other() -> None:
    """Two rooms of one floor: they meet at the wire room below them, with no arrow either way between them."""
    arrows = room_arrows()
    assert FLOORS[BUYER] == FLOORS[NODE] > FLOORS["flmarket_flwr.market.wire"]
    assert (BUYER, "flmarket_flwr.market.wire") in arrows and (NODE, "flmarket_flwr.market.wire") in arrows
    assert not {(BUYER, NODE), (NODE, BUYER)} & set(arrows), {edge: arrows[edge] for edge in arrows if BUYER in edge}


@pytest.mark.parametrize(
    ("module", "statement"),
    [
        ("flmarket_flwr.market.buyer.probe", "from flmarket_flwr.market.node.client import read_award\n"),
        ("flmarket_flwr.market.node.probe", "def f():\n    from ..buyer import server\n"),
        ("flmarket_flwr.market.wire.probe", "from flmarket_flwr.market.buyer.config import MarketConfig\n"),
        ("flmarket_flwr.market.node.probe", "from flmarket_flwr.market import FLMarket\n"),
    ],
)
def test_an_import_between_the_buyer_and_the_node_breaks_the_layout(
    tmp_path: Path, module: str, statement: str
) -> None:
    """The checker itself: a buyer module importing the node (or back, or the wire importing either, or a room
    importing the public API above it) is an arrow the floors forbid."""
    source = tmp_path / "probe.py"
    source.write_text(statement, encoding="utf-8")
    imported = [name for name, _ in own_imports(source, module)]
    assert imported
    for name in imported:
        assert FLOORS[room_of(name)] >= FLOORS[room_of(module)], name
