"""PASS messages: one frozen dataclass per request and reply, each a ``ConfigRecord``-compatible record.

``to_record()`` gives the plain dict that travels in a Flower message; ``from_record()`` / ``coerce()`` parse and
type-check one, raising :class:`~flmarket_flwr.pass_protocol.encoding.PassError` when malformed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Self

from flmarket_flwr.pass_protocol.encoding import PassError, indices_to_bitmap


def _is_word(value: Any) -> bool:
    """An ``int`` (not a ``bool``) in ``[0, 2^64)``: every integer a PASS message carries (indices, node ids, counts,
    settings) is one, and a value outside it is refused here rather than overflowing a ``uint64`` later."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**64


FIELD_CHECKS: dict[str, Callable[[Any], bool]] = {
    "bool": lambda v: isinstance(v, bool),
    "bytes": lambda v: isinstance(v, bytes),
    "int": _is_word,
    "list[int]": lambda v: isinstance(v, list) and all(_is_word(x) for x in v),
    "list[bytes]": lambda v: isinstance(v, list) and all(isinstance(x, bytes) for x in v),
}
"""Each ``ConfigRecord`` value type a PASS record may hold, by its annotation, and the check of a value against it
(integers: in ``[0, 2^64)``)."""


class _Record:
    """Dataclass mixin: ``to_record()`` / ``from_record()`` over ConfigRecord-compatible types."""

    def to_record(self) -> dict[str, Any]:
        """The message as a plain dict (bytes, int and lists of them)."""
        fields = dataclasses.fields(self)  # type: ignore[arg-type]
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), list) else v) for f in fields}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Self:
        """Parse and type-check a dict made by :meth:`to_record`; ``PassError`` if malformed."""
        values = {}
        for field in dataclasses.fields(cls):  # type: ignore[arg-type]
            if field.name not in record:
                raise PassError(f"{cls.__name__} lacks field {field.name!r}")
            value = record[field.name]
            value = list(value) if isinstance(value, tuple) else value
            if not FIELD_CHECKS[str(field.type)](value):
                kind = " in [0, 2^64)" if "int" in str(field.type) else ""
                raise PassError(f"{cls.__name__}.{field.name} must be {field.type}{kind}")
            values[field.name] = value
        return cls(**values)

    @classmethod
    def coerce(cls, value: Self | Mapping[str, Any]) -> Self:
        """Accept the message itself or its record; ``PassError`` for anything else."""
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise PassError(f"expected a {cls.__name__} or its record, got {type(value).__name__}")
        return cls.from_record(value)


@dataclass(frozen=True)
class AdvertiseRequest(_Record):
    """Round 1, server -> client ``index``."""

    session: bytes
    index: int
    node_id: int
    num_classes: int
    count_bound: int
    graph_commitment: bytes
    roster: bytes


@dataclass(frozen=True)
class Advertisement(_Record):
    """Round 1, client -> server: two X25519 public keys, an Ed25519 signature (``b""`` if unsigned), and a
    proof that the advertiser knows the cipher key's private key
    (:func:`~flmarket_flwr.pass_protocol.dleq.prove_possession` under
    :func:`~flmarket_flwr.pass_protocol.channel.possession_context`)."""

    cipher_public_key: bytes
    mask_public_key: bytes
    signature: bytes
    cipher_key_proof: bytes


@dataclass(frozen=True)
class ShareKeysRequest(_Record):
    """Round 2, server -> client: the opened seed, all participants U1 (bitmap), the degree, the neighbours' adverts.

    ``cipher_key_proofs[i]`` is neighbour ``i``'s proof of possession of its cipher key: the client checks it
    only if it comes to accuse that neighbour
    (:meth:`~flmarket_flwr.pass_protocol.client.PassClient.mask_input`); the server checked every one.
    """

    server_seed: bytes
    participants: bytes
    degree: int
    neighbours: list[int]
    neighbour_node_ids: list[int]
    cipher_public_keys: list[bytes]
    mask_public_keys: list[bytes]
    signatures: list[bytes]
    cipher_key_proofs: list[bytes]


@dataclass(frozen=True)
class ShareKeysReply(_Record):
    """Round 2, client -> server: one encrypted share pair per neighbour, and a digest of each pair.

    ``share_digests[i]`` is :func:`~flmarket_flwr.pass_protocol.encoding.share_digest` of the mask-key share
    (its point ``sigma B``) then of the self-mask-seed share (a SHA-256 digest) sent to ``receivers[i]``
    (64 bytes): the receiver checks its shares against it, the server checks the one share the receiver
    returns at unmask, so a corrupted unmask share names its sender, and the server checks a dropped dealer's
    points against its advertised mask key.
    With an identity key, ``signatures[i]`` signs ``ciphertexts[i]`` and ``share_digests[i]``
    (:func:`~flmarket_flwr.pass_protocol.identity.sign_share_ciphertext`); without one it is empty.
    ``threshold`` is the Shamir threshold of the dealer's own two secrets (its split tolerance may raise it
    above the session's, :func:`~flmarket_flwr.pass_protocol.graph.secret_threshold`): the server rebuilds
    them from that many shares, and fewer than that many never give them. The server refuses one above
    :func:`~flmarket_flwr.pass_protocol.graph.max_secret_threshold` (``k - 1``): one receiver's loss must
    leave the dealer's secrets recoverable.
    """

    receivers: list[int]
    ciphertexts: list[bytes]
    share_digests: list[bytes]
    threshold: int
    signatures: list[bytes] = dataclasses.field(default_factory=list)


@dataclass(frozen=True)
class MaskRequest(_Record):
    """Round 3, server -> client: the ciphertexts addressed to it by the neighbours in U2, digests and signatures."""

    senders: list[int]
    ciphertexts: list[bytes]
    share_digests: list[bytes] = dataclasses.field(default_factory=list)
    signatures: list[bytes] = dataclasses.field(default_factory=list)


@dataclass(frozen=True)
class MaskedInput(_Record):
    """Round 3, client -> server: ``Y_e`` as little-endian uint64 words, the counts commitment, and accusations.

    ``accused`` (ascending) are the senders whose shares did not open at this client, which masked without
    them; ``proofs[i]`` is its proof of the channel secret with ``accused[i]`` (the secret is read from it,
    :func:`~flmarket_flwr.pass_protocol.dleq.prove_exchange`), or ``b""`` when the ciphertext's own
    signature failed (the server's copy then decides, and no secret is revealed to a server that may have
    forged it) or the accused's cipher key came without a valid proof of possession (an honest server relays
    only keys whose proofs it checked). Empty ``masked_counts`` and ``counts_commitment`` with accusations: the
    client withdraws (fewer than ``t`` senders' shares opened) and is treated as dropped.
    """

    masked_counts: bytes
    counts_commitment: bytes
    accused: list[int] = dataclasses.field(default_factory=list)
    proofs: list[bytes] = dataclasses.field(default_factory=list)


@dataclass(frozen=True)
class ConsistencyRequest(_Record):
    """Consistency round (with identity keys), server -> survivor: the survivor set U3 and dropped D, as bitmaps."""

    survivors: bytes
    dropped: bytes


@dataclass(frozen=True)
class ConsistencyReply(_Record):
    """Consistency round, survivor -> server: its Ed25519 signature on the set it was shown."""

    signature: bytes


@dataclass(frozen=True)
class UnmaskRequest(_Record):
    """Round 4, server -> client: survivors U3 (sent Y) and dropped D = U2 \\ U3, as roster bitmaps.

    After a consistency round it also carries the signatures of the client's neighbours on that same set
    (``signers`` ascending, one signature each); without one both lists are empty.
    """

    survivors: bytes
    dropped: bytes
    signers: list[int] = dataclasses.field(default_factory=list)
    signatures: list[bytes] = dataclasses.field(default_factory=list)

    @classmethod
    def of(
        cls,
        survivors: Iterable[int],
        dropped: Iterable[int],
        signers: Iterable[int] = (),
        signatures: Iterable[bytes] = (),
    ) -> UnmaskRequest:
        """The request for these index sets (and the neighbours' signatures on them, if any)."""
        return cls(indices_to_bitmap(survivors), indices_to_bitmap(dropped), list(signers), list(signatures))


@dataclass(frozen=True)
class UnmaskReply(_Record):
    """Round 4, client -> server: self-mask-seed shares of surviving neighbours, mask-key shares of dropped ones."""

    survivor_indices: list[int]
    survivor_shares: list[bytes]
    dropped_indices: list[int]
    dropped_shares: list[bytes]


# The sparse secure mode (:mod:`.sparse_client`, :mod:`.sparse_server`): its rounds' own messages; the others
# (Advertisement, ShareKeysReply, ConsistencyRequest / Reply, UnmaskReply) are the ones above.


@dataclass(frozen=True)
class SparseAdvertiseRequest(_Record):
    """Sparse secure round 1, server -> client ``index``: the terms, the roster fingerprint and the session's
    settings (:class:`~flmarket_flwr.pass_protocol.sparse_secure.SparseSecureSettings`, which a client refuses if
    weaker than its own)."""

    session: bytes
    index: int
    node_id: int
    num_classes: int
    count_bound: int
    roster: bytes
    colluders: int
    roster_floor: int
    dropout_ppm: int
    reruns: int
    security_bits: int
    markets: int


@dataclass(frozen=True)
class DrawRequest(_Record):
    """Sparse secure, server -> client once ``U1`` is fixed: ``U1`` (bitmap), the session's ``(k, t)``, which the
    client refuses unless the finder gives exactly them for the settings at ``|U1|``, and the roster's node ids in
    PASS-index order (big-endian uint64 words), which the client checks against the roster fingerprint it signed:
    the server cannot then put another node behind an index the client draws."""

    participants: bytes
    degree: int
    threshold: int
    node_ids: bytes
    """Big-endian uint64 words, one per roster slot: one bytes object for every client (no per-id list to build)."""


@dataclass(frozen=True)
class OutNeighbourDraw(_Record):
    """Sparse secure, client -> server: the ``k`` out-neighbours the client drew (ascending), and its Ed25519
    signature over them, ``(k, t)``, ``U1``'s digest, the roster fingerprint, the session and the run."""

    out_neighbours: list[int]
    signature: bytes


@dataclass(frozen=True)
class SparseShareKeysRequest(_Record):
    """Sparse secure round 2, server -> client: its out-neighbours (its draw, echoed), and for every neighbour
    (out- or in-, ascending in ``neighbours``) its node id, keys, advert signature and proof of possession; then
    each in-neighbour's signed draw naming this client (``in_draws[i]`` packed
    :func:`~flmarket_flwr.pass_protocol.sparse_secure.pack_indices`)."""

    out_neighbours: list[int]
    neighbours: list[int]
    neighbour_node_ids: list[int]
    cipher_public_keys: list[bytes]
    mask_public_keys: list[bytes]
    signatures: list[bytes]
    cipher_key_proofs: list[bytes]
    in_neighbours: list[int]
    in_draws: list[bytes]
    in_draw_signatures: list[bytes]


@dataclass(frozen=True)
class SparseMaskRequest(_Record):
    """Sparse secure round 3, server -> client: the ciphertexts its in-neighbours dealt it (as
    :class:`MaskRequest`), and ``completed``, its neighbours that completed key sharing (U2, as the server says):
    the client masks with those."""

    senders: list[int]
    ciphertexts: list[bytes]
    share_digests: list[bytes]
    signatures: list[bytes]
    completed: list[int]


@dataclass(frozen=True)
class SparseMaskedInput(_Record):
    """Sparse secure round 3, client -> server: :class:`MaskedInput`'s fields, and the neighbours it masked with
    (ascending) with its signature on that list (bound to the run, session, roster fingerprint and ``U1``)."""

    masked_counts: bytes
    counts_commitment: bytes
    accused: list[int]
    proofs: list[bytes]
    masked_with: list[int]
    masked_with_signature: bytes


@dataclass(frozen=True)
class SparseUnmaskRequest(_Record):
    """Sparse secure round 4, server -> client: :class:`UnmaskRequest`'s split and its out-neighbours' signatures
    on it, and for each surviving dealer whose shares it holds, that dealer's signed masked-with list (packed)."""

    survivors: bytes
    dropped: bytes
    signers: list[int]
    signatures: list[bytes]
    dealers: list[int]
    dealer_lists: list[bytes]
    dealer_list_signatures: list[bytes]
