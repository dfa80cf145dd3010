"""PASS: privacy-aware secret sharing of per-class label counts (FLMarket, section 4), version 2.

The server learns the global per-class label counts ``N_s = sum_e N_e`` of the clients that complete
one session, without seeing any client's own counts ``N_e``. PASS v2 (:mod:`.secagg`) is secure
aggregation with double masking (Bonawitz et al. 2017) on a sparse masking graph (Bell et al. 2020).

Rounds (:class:`PassClient` / :class:`PassServer`; every message and the client state are
``ConfigRecord``-compatible records):

1. advertise: the server assigns each client an index, a session id, ``C``, a declared count bound,
   its commitment to the graph seed and a roster fingerprint; each client makes an X25519 cipher key
   pair and mask key pair and returns the public keys (signed with its Ed25519 identity key if it has
   one, bound to its own run id, the session and the roster, :mod:`.identity`);
2. share keys: the server opens the graph seed; each client checks its neighbourhood in the graph
   (:mod:`.graph`), Shamir-shares (:mod:`.shamir`, as scalars mod ``l``) its mask private key ``s_e`` and
   a fresh self-mask seed ``b_e`` among its ``k`` neighbours (threshold ``t = k // 2 + 1``, at most
   ``k - 1``), encrypted to each, with a digest of each share (:func:`share_digest`; for the mask key its
   point ``sigma B``, which makes the dealing verifiable against the advertised key) that the receiver
   checks and the server keeps, so that a corrupted unmask share names the client that returned it and a
   mis-dealt mask key names its dealer before anyone unmasks; each ciphertext is encrypted under the
   edge's channel secret, ``X25519`` of the two cipher keys (and signed with the identity key, if any);
3. masked input: ``Y_e = N_e + PRG(b_e) + sum_v eps_{e,v} PRG(s_{e,v})`` over its neighbours that
   shared, and a commitment to ``N_e``; the private keys are then wiped; a neighbour whose shares do not
   open is accused (masked without), with the channel secret and a proof of it (:mod:`.dleq`), and the
   server opens the ciphertext itself and names whichever of the two lied, with no extra round;
4. consistency (only with identity keys): each survivor signs the survivor set it is shown, once;
5. unmask: each survivor sends shares of ``b`` for surviving neighbours and of ``s`` for dropped ones,
   never both for one peer (with identity keys: only for the set it signed, on ``t`` valid signatures of
   its neighbours on that set); the server removes every mask and obtains ``N_s`` over the survivors.

Arithmetic is in the ring ``Z_2^64`` (numpy ``uint64``, wrapping), where a mask that is uniform (given
the PRG) hides a count completely and the sum is exact; counts are integers in ``[0, count_bound]``
with ``count_bound * E < 2^63`` (:mod:`.primitives`: X25519, HKDF-SHA256 seeds bound to the session and
the pair, ChaCha20 PRG).

Threat model, in short (details and the test behind each claim: docs/threat-model.md). Semi-honest
server: within one session only ``N_s`` over the survivors is released, whatever the dropouts, as long as
every needed secret keeps ``t`` shares (otherwise :class:`PassError`, never a partial sum); two sessions
(two runs) with and without a client difference to its counts, exactly unless the clients add noise to
them (:mod:`.noise`: record-level differential privacy per release, not client level). Without
identity keys PASS is secure against a semi-honest server only: a malicious server can substitute keys,
and by showing clients different survivor sets it recovers a client's counts. With identity keys,
checked against a directory each client pins (its digest, or a third party's signature, :mod:`.identity`: a
directory the server writes lets it seat a victim among sybils), it cannot substitute or replay keys across runs
or rosters, and the consistency round defeats the tested
split-views attack (complete and sparse graphs); on the complete graph any split, on sparse graphs
consistency is only local to each neighbourhood. It can always exclude clients or abort, and since it
assigns the indices it can make ``t`` colluding clients a chosen victim's neighbours on a sparse graph, who
then open its masked input (directory or not). A session needs
at least 3 clients (with 2, each learns the other's counts); ``E - 1`` colluders learn the last client's
counts from ``N_s``; a client can commit to false counts, which nothing here detects. A client that returns
a corrupted unmask share is excluded by name and the session finishes while each secret keeps ``t``
shares; one that sends garbage share ciphertexts is accused by its receivers and convicted by the channel
secrets they prove (a false accuser by the same proof), and the session finishes.
"""

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
    DirectorySignature,
    IdentityDirectory,
    advertisement_message,
    award_endorsement_message,
    generate_identity,
    load_directory,
    load_identity_key,
    save_identity_key,
    sign_advertisement,
    sign_award_endorsement,
    sign_share_ciphertext,
    sign_survivor_set,
    survivor_set_message,
    verify_advertisement,
    verify_award_endorsement,
    verify_share_ciphertext,
    verify_survivor_set,
)
from flmarket_flwr.pass_protocol.noise import SkellamNoise
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
from flmarket_flwr.pass_protocol.secagg import (
    Advertisement,
    AdvertiseRequest,
    ConsistencyReply,
    ConsistencyRequest,
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
    roster_fingerprint,
    share_digest,
    survivor_transcript,
)
from flmarket_flwr.pass_protocol.shamir import (
    reconstruct_secrets,
    share_from_bytes,
    share_to_bytes,
    split_secrets,
)

__all__ = [
    "SkellamNoise",
    "COUNT_LIMIT",
    "MASK_DTYPE",
    "MIN_PARTICIPANTS",
    "PROTOCOL_LABEL",
    "PUBLIC_KEY_LENGTH",
    "derive_pair_seed",
    "expand_seed",
    "load_public_key",
    "pair_info",
    "pairwise_sign",
    "public_key_fingerprint",
    "validate_counts",
    "Advertisement",
    "AdvertiseRequest",
    "ConsistencyReply",
    "ConsistencyRequest",
    "DirectorySignature",
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
    "award_endorsement_message",
    "bitmap_to_indices",
    "commit_graph_seed",
    "counts_commitment",
    "derive_graph_seed",
    "generate_identity",
    "load_directory",
    "load_identity_key",
    "save_identity_key",
    "indices_to_bitmap",
    "mask_graph",
    "neighbourhood_size",
    "neighbours_of",
    "roster_digest",
    "roster_fingerprint",
    "reconstruct_secrets",
    "share_digest",
    "share_from_bytes",
    "share_threshold",
    "share_to_bytes",
    "sign_advertisement",
    "sign_award_endorsement",
    "sign_share_ciphertext",
    "sign_survivor_set",
    "split_secrets",
    "survivor_set_message",
    "survivor_transcript",
    "verify_advertisement",
    "verify_award_endorsement",
    "verify_share_ciphertext",
    "verify_survivor_set",
]
