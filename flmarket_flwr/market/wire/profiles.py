"""The market's security profiles, which the buyer and each node choose on their own side, and what the secure
profile assumes of the clients: one vocabulary for :class:`~flmarket_flwr.market.MarketConfig` and the node config."""

from __future__ import annotations

import math
from typing import Final

__all__ = ["PROFILE_COLLUDER_SHARE", "SECURITY_PROFILES", "profile_colluders"]

SECURITY_PROFILES: Final = ("semi-honest", "malicious")
"""The market's profiles: against a semi-honest server (the default), or against a malicious one (the secure
profile, ``docs/threat-model.md``); the buyer sets its side in :class:`~flmarket_flwr.market.MarketConfig`, each
node in its node config (``market-security``)."""
PROFILE_COLLUDER_SHARE: Final = 0.2
"""The colluding clients the secure profile assumes, as a share of the pinned directory (rounded up): the nodes'
``pass-colluders`` default and the buyer's ``pass_reruns`` default."""


def profile_colluders(directory_size: int) -> int:
    """The colluding clients the secure profile assumes in a pinned directory of ``directory_size`` nodes:
    :data:`PROFILE_COLLUDER_SHARE` of them, rounded up."""
    return math.ceil(PROFILE_COLLUDER_SHARE * directory_size - 1e-9)
