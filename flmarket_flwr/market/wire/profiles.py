"""The market's security profiles, which the buyer and each node choose on their own side, and what the secure
profile assumes of the clients: one vocabulary for :class:`~flmarket_flwr.market.MarketConfig` and the node config."""

from __future__ import annotations

import math
from typing import Final

__all__ = [
    "PROFILE_COLLUDER_SHARE",
    "PROFILE_DROPOUT",
    "PROFILE_ROSTER_SHARE",
    "SECURITY_PROFILES",
    "profile_colluders",
    "profile_roster_floor",
]

SECURITY_PROFILES: Final = ("semi-honest", "malicious")
"""The market's profiles: against a semi-honest server (the default), or against a malicious one (the secure
profile, ``docs/threat-model.md``); the buyer sets its side in :class:`~flmarket_flwr.market.MarketConfig`, each
node in its node config (``market-security``)."""
PROFILE_COLLUDER_SHARE: Final = 0.2
"""The colluding clients the secure profile assumes, as a share of the pinned directory (rounded up): the nodes'
``pass-colluders`` default and the buyer's ``pass_reruns`` default."""
PROFILE_ROSTER_SHARE: Final = 2 / 3
"""The secure profile's roster floor, as a share of the pinned directory (the nodes' ``pass-min-participants``
default and the floor the buyer announces in the sparse mode)."""
PROFILE_DROPOUT: Final = 0.05
"""The dropout the sparse secure mode's degrees are sized for (each honest client drops independently with it): the
nodes' ``pass-dropout`` default and the buyer's ``pass_dropout``."""


def profile_colluders(directory_size: int) -> int:
    """The colluding clients the secure profile assumes in a pinned directory of ``directory_size`` nodes:
    :data:`PROFILE_COLLUDER_SHARE` of them, rounded up."""
    return math.ceil(PROFILE_COLLUDER_SHARE * directory_size - 1e-9)


def profile_roster_floor(directory_size: int, least: int) -> int:
    """The secure profile's roster floor in a pinned directory of ``directory_size`` nodes:
    :data:`PROFILE_ROSTER_SHARE` of them, rounded up, and at least ``least``."""
    return max(least, math.ceil(PROFILE_ROSTER_SHARE * directory_size - 1e-9))
