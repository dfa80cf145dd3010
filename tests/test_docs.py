"""The documents say what the code does: the configuration reference is the schemas' own tables, and the README's
table of the settings people change first names real keys with their real defaults."""

from __future__ import annotations

import re
from pathlib import Path

from flmarket_flwr.app.run_config import DEFAULTS, markdown_table
from flmarket_flwr.market.node.node_config import MARKET_SCHEMA
from simulations.run_config import markdown_table as experiments_table

PROJECT = Path(__file__).resolve().parent.parent


def _between(text: str, start: str, end: str) -> str:
    assert start in text and end in text, f"markers {start!r} / {end!r} missing"
    return text.split(start, 1)[1].split(end, 1)[0].strip("\n") + "\n"


def test_the_configuration_reference_is_the_schemas_tables() -> None:
    text = (PROJECT / "docs" / "configuration.md").read_text()
    hint = "regenerate with python -m flmarket_flwr.app.run_config --markdown / ...market.node_config --markdown"
    assert _between(text, "<!-- run-config table: generated -->", "<!-- end of run-config table -->") == (
        markdown_table()
    ), hint
    assert _between(text, "<!-- node-config table: generated -->", "<!-- end of node-config table -->") == (
        MARKET_SCHEMA.markdown()
    ), hint
    experiments = _between(text, "<!-- experiments' table: generated -->", "<!-- end of experiments' table -->")
    assert experiments == experiments_table(), "regenerate with python -m simulations.run_config"


def test_the_readmes_first_settings_are_real_keys_with_their_defaults() -> None:
    readme = (PROJECT / "README.md").read_text()
    section = readme.split("### The settings people change first", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| `([a-z-]+)`[^|]*\| ([^|]+) \|", section, flags=re.MULTILINE)
    assert rows, "the README's settings table is missing"
    for key, default in rows:
        if key == "num-supernodes":  # the federation's, not the app's
            continue
        assert key in DEFAULTS, key
        assert default.strip().strip('"') == str(DEFAULTS[key]), (key, default, DEFAULTS[key])
