"""How many places name each run-config key outside its schema (``flmarket_flwr/app/run_config.py``) and pyproject.

A place: a string literal equal to a multi-word key (``"num-selected"``), a class field named after a key
(``num_selected``), or a ``conf/`` YAML key with a key's Python name. Tests are not counted. Run from the
project root: ``python -m benchmarks.count_config_keys``.
"""

from __future__ import annotations

import ast
import re
import statistics
from pathlib import Path

from flmarket_flwr.app.run_config import APP_KEYS

SCHEMA = Path("flmarket_flwr/app/run_config.py")
SELF = Path("benchmarks/count_config_keys.py")
GROUP_DIRS = ("dataset", "model", "selector", "distribution")
"""conf/ groups whose single-word keys (``name``, ``root``) are no app key, whatever they are called."""


def _python_places(names: dict[str, str]) -> tuple[dict[str, set[str]], set[str]]:
    """Places per key in the Python sources, and the classes with a field named after a key."""
    places: dict[str, set[str]] = {key: set() for key in names}
    classes: set[str] = set()
    by_field = {field: key for key, field in names.items()}
    for path in sorted(Path(".").glob("*/**/*.py")):
        if path.parts[0] in ("tests", "results") or path.parts[0].startswith(".") or path in (SCHEMA, SELF):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "-" in node.value:
                if node.value in places:
                    places[node.value].add(f"{path}:{node.lineno}")
            if isinstance(node, ast.ClassDef):
                for statement in node.body:
                    if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                        if statement.target.id in by_field:
                            places[by_field[statement.target.id]].add(f"{path}:{statement.lineno}")
                            classes.add(node.name)
    return places, classes


def _yaml_places(names: dict[str, str], places: dict[str, set[str]]) -> None:
    """Add the ``conf/`` YAML keys that are a key's Python name."""
    by_field = {field: key for key, field in names.items()}
    for path in sorted(Path("conf").glob("**/*.yaml")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            match = re.match(r"\s*([a-z_]+):", line)
            if match and match.group(1) in by_field:
                field = match.group(1)
                if "_" in field or path.parts[1] not in GROUP_DIRS:
                    places[by_field[field]].add(f"{path}:{number}")


def main() -> None:
    """Print the totals, the spread per key and the classes with a field named after a key."""
    names = {key.name: key.field for key in APP_KEYS}
    places, classes = _python_places(names)
    _yaml_places(names, places)
    counts = {key: len(found) for key, found in places.items()}
    files = {key: len({place.rsplit(":", 1)[0] for place in found}) + 2 for key, found in places.items()}
    print(
        f"{len(names)} keys; places naming a key outside the schema: {sum(counts.values())} "
        f"(mean {statistics.mean(counts.values()):.2f}, max {max(counts.values())}); files naming a key, schema and "
        f"pyproject included: mean {statistics.mean(files.values()):.2f}, range {min(files.values())}-"
        f"{max(files.values())}"
    )
    print(f"classes with a field named after a key ({len(classes)}): {', '.join(sorted(classes))}")
    for key in ("num-selected", "local-epochs", "batch-size", "learning-rate", "momentum", "wait-for-nodes-timeout"):
        print(f"  {key}: {counts[key]} places in {files[key]} files")


if __name__ == "__main__":
    main()
