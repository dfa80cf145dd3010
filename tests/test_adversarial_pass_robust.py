"""One client cannot stop PASS for everyone (issue 29, item 4): each attack is played by one real client whose
replies are altered on the way to the server, at E = 8 (the complete graph) and E = 40 (a sparse one); the market
finishes for the others with the culprit named in ``MarketOutcome.excluded``."""

from __future__ import annotations

import numpy as np
import pytest
from adversary import honest_grid, make_counts, market_config

from flmarket_flwr.market import MarketPhase
from flmarket_flwr.market.messages import RECORD_KEY

SIZES = [8, 40]


def altering(node: int, action: str, change):
    """A reply hook that lets ``change(record)`` edit ``node``'s reply to ``query.<action>``."""

    def hook(instruction, reply):
        if (
            instruction.metadata.dst_node_id == node
            and instruction.metadata.message_type == f"query.{action}"
            and not reply.has_error()
        ):
            change(reply.content.config_records[RECORD_KEY])
        return reply

    return hook


def _garbled(ciphertext: bytes) -> bytes:
    """Well-formed garbage: the real ciphertext with its 16-byte authentication tag zeroed."""
    return ciphertext[:-16] + bytes(16)


def _exact_over(counts, nodes) -> list[int]:
    return [int(c) for c in np.sum([counts[n] for n in nodes], axis=0)]


# --- (a) a dealer announces threshold k and garbles one share ----------------------------------------------
def _threshold_k_and_one_garbled(record) -> None:
    record["threshold"] = len(record["receivers"])
    record["ciphertexts"] = [_garbled(c) if i == 0 else c for i, c in enumerate(record["ciphertexts"])]


@pytest.mark.parametrize("num_nodes", SIZES)
def test_a_dealer_announcing_threshold_k_is_refused_at_its_shares_and_the_market_finishes(num_nodes: int) -> None:
    """With ``t = k`` one accusing receiver would leave the dealer's mask key ``k - 1`` holders: the server refuses
    any threshold above ``k - 1`` where it is announced, names the dealer, and PASS goes on without it."""
    counts = make_counts(num_nodes, seed=29)
    attacker = sorted(counts)[3]
    grid = honest_grid(counts, reply_hook=altering(attacker, "market_share", _threshold_k_and_one_garbled))
    outcome = MarketPhase(market_config()).run(grid)
    assert set(outcome.excluded) == {attacker}
    assert "announced threshold" in outcome.excluded[attacker]
    honest = [n for n in counts if n != attacker]
    assert outcome.pass_participants == sorted(honest)
    assert outcome.global_counts == _exact_over(counts, honest)
