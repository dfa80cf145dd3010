"""The README's set-up keeps the virtual environment out of what ``flwr run .`` walks (issue 44, item 1).

Flower 1.42 builds the FAB of ``flwr run .`` by listing every file under the app before any filter applies, and
never enters a link: the environment lives beside the checkout, ``.venv`` links to it, and ``.ci/run`` does the
same as the README. ``python -m benchmarks.bench_fab_build`` measures what it saves.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from flwr.cli.build import build_fab_from_disk
from flwr.cli.utils import collect_files

PROJECT = Path(__file__).resolve().parents[1]


def readme_set_up() -> list[str]:
    """The commands of the README's first bash block that make the environment (before ``pip install``)."""
    block = re.search(r"```bash\n(.*?)```", (PROJECT / "README.md").read_text(encoding="utf-8"), flags=re.S)
    assert block is not None
    commands = [part.strip() for part in block.group(1).strip().split(" && ")]
    set_up = commands[: next(i for i, command in enumerate(commands) if "pip install" in command)]
    assert set_up and set_up[0].startswith("python3 -m venv "), commands
    return set_up


def test_ci_makes_the_environment_as_the_readme_does() -> None:
    ci = (PROJECT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    for command in readme_set_up():
        assert command in ci, f"{command!r} is in the README's set-up but not in .ci/run"
    assert ".venv" in (PROJECT / ".gitignore").read_text().splitlines(), "a .venv link needs '.venv', not '.venv/'"


def test_the_readme_set_up_puts_the_venv_where_flwr_build_never_walks(tmp_path: Path) -> None:
    """The README's commands, as written, in a copy of the app's files: the environment is beside the app, works
    through ``.venv``, and the FAB build lists none of its files; the FAB is the one built without any environment."""
    app = tmp_path / "flmarket-flwr"
    app.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", ".gitignore"):
        (app / name).write_bytes((PROJECT / name).read_bytes())
    for source in (PROJECT / "flmarket_flwr").rglob("*.py"):
        target = app / source.relative_to(PROJECT)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source.read_bytes())
    without = build_fab_from_disk(app)

    subprocess.run(["bash", "-c", " && ".join(readme_set_up())], cwd=app, check=True, timeout=300)

    venv = tmp_path / "flmarket-flwr.venv"
    assert (app / ".venv").is_symlink() and (app / ".venv").resolve() == venv.resolve()
    assert sum(1 for _ in venv.rglob("*")) > 100  # a real environment, with pip
    prefix = subprocess.run(
        [str(app / ".venv" / "bin" / "python"), "-c", "import sys; print(sys.prefix)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(prefix).resolve() == venv.resolve()
    walked = collect_files(app)
    assert not [path for path in walked if path.startswith(".venv")], "flwr build walked into the environment"
    assert build_fab_from_disk(app) == without
