"""PASS: privacy-aware secret sharing of per-class label counts (FLMarket, section 4).

The server learns the global counts ``N_s = sum_e N_e`` of the clients that complete one session, never a
client's own ``N_e``: secure aggregation with double masking on a sparse graph, with optional Ed25519 identity
keys (:mod:`.identity`) and distributed noise (:mod:`.noise`). :class:`PassClient` and :class:`PassServer` run the
rounds (:mod:`.client`, :mod:`.server`; their state in :mod:`.client_state` and :mod:`.server_state`) over the
messages in :mod:`.messages`; what each party can and cannot learn, with the test behind each claim, is in
docs/threat-model.md. The sparse secure mode (client-drawn out-neighbours, issue 40) is :mod:`.sparse_client` and
:mod:`.sparse_server` over :mod:`.sparse_secure` and :mod:`.sparse_state`; nothing outside its tests uses it yet.
"""

from flmarket_flwr.pass_protocol.client import PassClient
from flmarket_flwr.pass_protocol.encoding import PassError, counts_commitment
from flmarket_flwr.pass_protocol.identity import (
    IdentityDirectory,
    generate_identity,
    load_directory,
    load_identity_key,
    save_identity_key,
)
from flmarket_flwr.pass_protocol.noise import SkellamNoise
from flmarket_flwr.pass_protocol.primitives import MIN_PARTICIPANTS
from flmarket_flwr.pass_protocol.server import PassServer

__all__ = [
    "MIN_PARTICIPANTS",
    "IdentityDirectory",
    "PassClient",
    "PassError",
    "PassServer",
    "SkellamNoise",
    "counts_commitment",
    "generate_identity",
    "load_directory",
    "load_identity_key",
    "save_identity_key",
]
