"""A node's refusal reasons: written and read in the wire module alone, so that the buyer never imports the node."""

from __future__ import annotations

import ast
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from flmarket_flwr.market.wire.messages import (
    ACTIONS,
    LABEL_COUNTS_FAILED,
    REQUEST_REFUSED,
    label_counts_failure,
    refusal_reason,
)

BUYER = Path(__file__).resolve().parents[1] / "flmarket_flwr" / "market" / "buyer"


@given(st.sampled_from(ACTIONS), st.text(max_size=300))
def test_a_label_count_failure_reads_back_as_the_node_wrote_it(action: str, cause: str) -> None:
    detail = LABEL_COUNTS_FAILED + cause
    reason = refusal_reason(action, detail)
    assert reason == f"flmarket: {action}: {detail}"
    assert label_counts_failure(reason) == detail
    assert label_counts_failure(f"{action}: error reply (code 2): {reason}") == detail  # as the buyer logs it


@given(st.sampled_from(ACTIONS))
def test_a_generic_refusal_names_no_label_count_failure(action: str) -> None:
    assert label_counts_failure(refusal_reason(action, REQUEST_REFUSED)) is None


def test_the_buyer_imports_nothing_of_the_node_side() -> None:
    """The room rule of tests/test_layering.py, for the one import the refusals once made (server.py -> client.py)."""
    paths = sorted(BUYER.glob("*.py"))
    assert paths
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert not [module for module in imported if module.startswith("flmarket_flwr.market.node")], path.name
