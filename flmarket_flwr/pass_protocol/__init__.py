"""PASS: privacy-aware secret sharing of per-class label counts (FLMarket, section 4).

The server learns the global per-class label counts ``N_s = sum_e N_e`` of the
``E`` candidate clients without seeing any client's own counts ``N_e``.

Protocol
--------
1. The server assigns each client a unique non-negative index ``e`` and a
   session identifier binding the run (and the attempt).
2. Each client makes an X25519 key pair (:class:`PassParticipant`) and sends its
   32-byte public key; the private key never leaves the client.
3. The server collects every public key (:class:`PassAggregator`) and
   broadcasts the complete set ``{e: PK_e}``.
4. For every other client ``v``, client ``e`` computes the X25519 shared
   secret, derives the pairwise seed
   ``s_{e,v} = HKDF-SHA256(secret, info = "flmarket-pass/v1" || len(session) ||
   session || min(e, v) || max(e, v))`` (same on both sides, bound to run and
   pair), expands it with the ChaCha20 keystream into ``C`` words, and sends
   ``Y_e = N_e + sum_{v > e} PRG(s_{e,v}) - sum_{v < e} PRG(s_{e,v})``.
5. The server adds all ``Y_e`` (:func:`unmask_sum`): each mask appears once with
   ``+`` and once with ``-``, so the sum is exactly ``N_s``.

Arithmetic
----------
The paper works over the reals, where masks cannot be uniform. Here every
vector lives in the ring ``Z_{2^64}`` (numpy ``uint64`` with wrapping). Counts
are non-negative integers below ``2^63``, and so must every per-class total be;
the sum is then recovered exactly, and a total ``>= 2^63`` flags (with
probability ``1 - 2^-C``) an incomplete set of masked vectors.

Threat model
------------
Semi-honest (honest-but-curious) server and clients that follow the protocol.
For any strict, non-empty subset of the masked vectors, the pairwise masks
between that subset and the rest do not cancel, so the partial sum is
uniform in ``Z_{2^64}^C`` given that the PRG output is indistinguishable from
uniform (ChaCha20 keyed by an HKDF output of an X25519 secret unknown to the
server); only the complete sum carries information, and it carries exactly
``N_s``. PASS needs at least 3 participants: with 2, each learns the other's
counts as ``N_s - N_e``. Not covered: a malicious server substituting public
keys (no authentication of keys beyond the transport), clients lying about
their counts, and collusion (any ``E - 1`` colluders learn the last client's
counts from ``N_s``, inherent to releasing the sum). A client dropping out after
its key was broadcast breaks cancellation: the round must be restarted over the
survivors with fresh keys and a fresh session, never by reusing a key pair for
a different participant set (the server could then subtract vectors and strip
masks).

PASS v2 (``secagg``, with ``shamir``, ``graph`` and ``identity``) replaces that
restart: double masking with Shamir-shared keys on a sparse committed graph
(Bonawitz et al. 2017, Bell et al. 2020), one sum per session, signed keys.
"""

from flmarket_flwr.pass_protocol.aggregator import MaskedVectors, PassAggregator, unmask_sum
from flmarket_flwr.pass_protocol.participant import (
    DEFAULT_SESSION,
    PassParticipant,
    PublicKeys,
)
from flmarket_flwr.pass_protocol.primitives import (
    COUNT_LIMIT,
    MASK_DTYPE,
    MIN_PARTICIPANTS,
    PROTOCOL_LABEL,
    PUBLIC_KEY_LENGTH,
    derive_pair_seed,
    expand_seed,
    load_public_key,
    pair_info,
    pairwise_sign,
    public_key_fingerprint,
    validate_counts,
)

from flmarket_flwr.pass_protocol.graph import (
    commit_graph_seed,
    derive_graph_seed,
    mask_graph,
    neighbourhood_size,
    neighbours_of,
    roster_digest,
    share_threshold,
)
from flmarket_flwr.pass_protocol.identity import (
    IdentityDirectory,
    advertisement_message,
    generate_identity,
    sign_advertisement,
    verify_advertisement,
)
from flmarket_flwr.pass_protocol.secagg import (
    Advertisement,
    AdvertiseRequest,
    MaskedInput,
    MaskRequest,
    PassClient,
    PassError,
    PassServer,
    ShareKeysReply,
    ShareKeysRequest,
    UnmaskReply,
    UnmaskRequest,
    bitmap_to_indices,
    counts_commitment,
    indices_to_bitmap,
    survivor_transcript,
)
from flmarket_flwr.pass_protocol.shamir import (
    reconstruct_secrets,
    share_from_bytes,
    share_to_bytes,
    split_secrets,
)

__all__ = [
    "COUNT_LIMIT",
    "DEFAULT_SESSION",
    "MASK_DTYPE",
    "MIN_PARTICIPANTS",
    "PROTOCOL_LABEL",
    "PUBLIC_KEY_LENGTH",
    "MaskedVectors",
    "PassAggregator",
    "PassParticipant",
    "PublicKeys",
    "derive_pair_seed",
    "expand_seed",
    "load_public_key",
    "pair_info",
    "pairwise_sign",
    "public_key_fingerprint",
    "unmask_sum",
    "validate_counts",
    "Advertisement",
    "AdvertiseRequest",
    "IdentityDirectory",
    "MaskedInput",
    "MaskRequest",
    "PassClient",
    "PassError",
    "PassServer",
    "ShareKeysReply",
    "ShareKeysRequest",
    "UnmaskReply",
    "UnmaskRequest",
    "advertisement_message",
    "bitmap_to_indices",
    "commit_graph_seed",
    "counts_commitment",
    "derive_graph_seed",
    "generate_identity",
    "indices_to_bitmap",
    "mask_graph",
    "neighbourhood_size",
    "neighbours_of",
    "roster_digest",
    "reconstruct_secrets",
    "share_from_bytes",
    "share_threshold",
    "share_to_bytes",
    "sign_advertisement",
    "split_secrets",
    "survivor_transcript",
    "verify_advertisement",
]
