"""Ed25519 signatures of PASS v2 and the market: key advertisements, survivor sets, share ciphertexts, bids, award
endorsements and member bindings, each under its own label.

Each client signs with its long-term identity key, checked against the :class:`IdentityDirectory` each node pins
(the keys and the directory: :mod:`flmarket_flwr.pass_protocol.directory`, whose names this module re-exports).
Without a directory PASS is secure against a semi-honest server only (docs/threat-model.md).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Final

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from flmarket_flwr.pass_protocol.directory import (
    DIRECTORY_DIGEST_LENGTH,
    IDENTITY_KEY_LENGTH,
    SIGNATURE_LENGTH,
    DirectorySignature,
    IdentityDirectory,
    directory_signature_message,
    ed25519_verifies,
    generate_identity,
    load_directory,
    load_identity_key,
    parse_digest,
    parse_public_key,
    public_key_of,
    save_identity_key,
)
from flmarket_flwr.pass_protocol.directory import field as _field

_ADVERT_LABEL: Final[bytes] = b"flmarket-pass/v2/advertisement/run-roster"
_SURVIVORS_LABEL: Final[bytes] = b"flmarket-pass/v2/survivor-set"
_CIPHERTEXT_LABEL: Final[bytes] = b"flmarket-pass/v2/share-ciphertext"
_ENDORSEMENT_LABEL: Final[bytes] = b"flmarket/v1/award-endorsement"
_BID_LABEL: Final[bytes] = b"flmarket/v1/bid"
AWARD_DIGEST_LENGTH: Final[int] = 32
"""Bytes of an award digest (SHA-256, :meth:`flmarket_flwr.market.wire.award.Award.digest`)."""
ROSTER_LENGTH: Final[int] = 32
"""Bytes of a roster fingerprint (SHA-256)."""
_MEMBER_BINDING_LABEL: Final[bytes] = b"flmarket-pass/v2/member-binding"
MEMBER_BINDING_LENGTH: Final[int] = 16 + 64
"""Bytes of one packed member binding: node id, member (big-endian uint64 each) and the member's signature."""


def _context(run_id: int, session: bytes, roster: bytes) -> bytes:
    """Run id, session and roster fingerprint as one injective byte string (checked)."""
    if isinstance(run_id, bool) or not isinstance(run_id, int) or not 0 <= run_id < 2**64:
        raise ValueError(f"run_id must be an int in [0, 2**64), got {run_id!r}")
    if not isinstance(session, bytes) or not session:
        raise ValueError("session must be non-empty bytes")
    if not isinstance(roster, bytes) or len(roster) != ROSTER_LENGTH:
        raise ValueError(f"roster fingerprint must be {ROSTER_LENGTH} bytes")
    return struct.pack(">Q", run_id) + _field(session) + roster


def advertisement_message(
    session: bytes,
    index: int,
    node_id: int,
    cipher_public_key: bytes,
    mask_public_key: bytes,
    *,
    run_id: int,
    roster: bytes,
    mode: bytes,
) -> bytes:
    """The bytes a client signs: domain label, run id, session, roster, index, node id, both keys and the session's
    mode.

    ``mode`` (32 bytes) is what the session runs under: the commitment to the server's graph seed where the server
    places the graph, the sparse secure settings' digest
    (:meth:`~flmarket_flwr.pass_protocol.sparse_secure.SparseSecureSettings.digest`) where each client draws its own
    out-neighbours. A neighbour's advert verifies only under this client's own mode, so no client takes a neighbour
    that the server brought into the session in another mode or under other settings."""
    if not 0 <= index < 2**64 or not 0 <= node_id < 2**64:
        raise ValueError(f"index and node_id must be in [0, 2**64), got {index} and {node_id}")
    for name, key in (("cipher", cipher_public_key), ("mask", mask_public_key), ("mode", mode)):
        if not isinstance(key, bytes) or len(key) != 32:
            raise ValueError(f"{name} {'digest' if name == 'mode' else 'public key'} must be 32 bytes")
    return b"".join(
        (
            _field(_ADVERT_LABEL),
            _context(run_id, session, roster),
            struct.pack(">QQ", index, node_id),
            _field(cipher_public_key),
            _field(mask_public_key),
            _field(mode),
        )
    )


def sign_advertisement(
    identity_private_key: Ed25519PrivateKey,
    session: bytes,
    index: int,
    node_id: int,
    cipher_public_key: bytes,
    mask_public_key: bytes,
    *,
    run_id: int,
    roster: bytes,
    mode: bytes,
) -> bytes:
    """Ed25519 signature (64 bytes) over :func:`advertisement_message`."""
    message = advertisement_message(
        session, index, node_id, cipher_public_key, mask_public_key, run_id=run_id, roster=roster, mode=mode
    )
    return identity_private_key.sign(message)


def verify_advertisement(
    identity_public_key: bytes,
    signature: bytes,
    session: bytes,
    index: int,
    node_id: int,
    cipher_public_key: bytes,
    mask_public_key: bytes,
    *,
    run_id: int,
    roster: bytes,
    mode: bytes,
) -> None:
    """Check an advertisement's signature.

    Raises
    ------
    ValueError
        If the signature is missing or malformed, the identity key is malformed, or the signature does not
        verify for exactly this run, session, roster, index, node id, pair of keys and mode.
    """
    message = advertisement_message(
        session, index, node_id, cipher_public_key, mask_public_key, run_id=run_id, roster=roster, mode=mode
    )
    _verify(identity_public_key, signature, message, f"advertisement of node {node_id} (index {index})")


def survivor_set_message(
    survivors: bytes, dropped: bytes, *, run_id: int, session: bytes, roster: bytes, participants: bytes
) -> bytes:
    """The bytes a client signs in the consistency round: its run, session, roster, ``U1`` and the set it was shown.

    ``participants``, ``survivors`` and ``dropped`` are roster bitmaps (``encoding.indices_to_bitmap``).
    """
    for name, value in (("participants", participants), ("survivors", survivors), ("dropped", dropped)):
        if not isinstance(value, bytes):
            raise ValueError(f"{name} must be a bitmap (bytes)")
    return b"".join(
        (
            _field(_SURVIVORS_LABEL),
            _context(run_id, session, roster),
            _field(participants),
            _field(survivors),
            _field(dropped),
        )
    )


def sign_survivor_set(
    identity_private_key: Ed25519PrivateKey,
    survivors: bytes,
    dropped: bytes,
    *,
    run_id: int,
    session: bytes,
    roster: bytes,
    participants: bytes,
) -> bytes:
    """Ed25519 signature (64 bytes) over :func:`survivor_set_message`."""
    message = survivor_set_message(
        survivors, dropped, run_id=run_id, session=session, roster=roster, participants=participants
    )
    return identity_private_key.sign(message)


def verify_survivor_set(
    identity_public_key: bytes,
    signature: bytes,
    survivors: bytes,
    dropped: bytes,
    *,
    run_id: int,
    session: bytes,
    roster: bytes,
    participants: bytes,
) -> None:
    """Check a survivor-set signature; ``ValueError`` unless it verifies for exactly this set and context."""
    message = survivor_set_message(
        survivors, dropped, run_id=run_id, session=session, roster=roster, participants=participants
    )
    _verify(identity_public_key, signature, message, "survivor-set signature")


def share_ciphertext_message(
    sender: int, receiver: int, ciphertext: bytes, digest: bytes, *, run_id: int, session: bytes, roster: bytes
) -> bytes:
    """The bytes a dealer signs for one share ciphertext: run, session, roster, both indices, ciphertext, digest."""
    return b"".join(
        (
            _field(_CIPHERTEXT_LABEL),
            _context(run_id, session, roster),
            struct.pack(">QQ", sender, receiver),
            _field(ciphertext),
            _field(digest),
        )
    )


def sign_share_ciphertext(
    identity_private_key: Ed25519PrivateKey,
    sender: int,
    receiver: int,
    ciphertext: bytes,
    digest: bytes,
    *,
    run_id: int,
    session: bytes,
    roster: bytes,
) -> bytes:
    """Ed25519 signature (64 bytes) over :func:`share_ciphertext_message`."""
    message = share_ciphertext_message(
        sender, receiver, ciphertext, digest, run_id=run_id, session=session, roster=roster
    )
    return identity_private_key.sign(message)


def verify_share_ciphertext(
    identity_public_key: bytes,
    signature: bytes,
    sender: int,
    receiver: int,
    ciphertext: bytes,
    digest: bytes,
    *,
    run_id: int,
    session: bytes,
    roster: bytes,
) -> None:
    """Check a share-ciphertext signature; ``ValueError`` unless it verifies for exactly this ciphertext."""
    message = share_ciphertext_message(
        sender, receiver, ciphertext, digest, run_id=run_id, session=session, roster=roster
    )
    _verify(identity_public_key, signature, message, f"share ciphertext {sender} -> {receiver}")


def bid_message(
    *, run_id: int, session: bytes, transcript: bytes, index: int, node_id: int, score: float, bid: float
) -> bytes:
    """The bytes a bidder signs at the bid step: domain label, run id, session, transcript, its PASS index and node id,
    and its score and bid (IEEE-754 doubles, as the award lists them)."""
    if isinstance(run_id, bool) or not isinstance(run_id, int) or not 0 <= run_id < 2**64:
        raise ValueError(f"run_id must be an int in [0, 2**64), got {run_id!r}")
    for name, value in (("session", session), ("transcript", transcript)):
        if not isinstance(value, bytes) or not value:
            raise ValueError(f"{name} must be non-empty bytes")
    if not 0 <= index < 2**64 or not 0 <= node_id < 2**64:
        raise ValueError(f"index and node_id must be in [0, 2**64), got {index} and {node_id}")
    return b"".join(
        (
            _field(_BID_LABEL),
            struct.pack(">Q", run_id),
            _field(session),
            _field(transcript),
            struct.pack(">QQdd", index, node_id, score, bid),
        )
    )


def sign_bid(
    identity_private_key: Ed25519PrivateKey,
    *,
    run_id: int,
    session: bytes,
    transcript: bytes,
    index: int,
    node_id: int,
    score: float,
    bid: float,
) -> bytes:
    """Ed25519 signature (64 bytes) over :func:`bid_message`."""
    message = bid_message(
        run_id=run_id, session=session, transcript=transcript, index=index, node_id=node_id, score=score, bid=bid
    )
    return identity_private_key.sign(message)


def verify_bid(
    identity_public_key: bytes,
    signature: bytes,
    *,
    run_id: int,
    session: bytes,
    transcript: bytes,
    index: int,
    node_id: int,
    score: float,
    bid: float,
) -> None:
    """Check a bid's signature; ``ValueError`` unless it verifies for exactly this bid, bidder and session."""
    message = bid_message(
        run_id=run_id, session=session, transcript=transcript, index=index, node_id=node_id, score=score, bid=bid
    )
    _verify(identity_public_key, signature, message, f"bid of node {node_id} (index {index})")


def award_endorsement_message(award_digest: bytes) -> bytes:
    """The bytes a bidder signs to endorse an award: domain label and the award's digest (which binds its run,
    session, transcript, terms, bidders, winners and payments)."""
    if not isinstance(award_digest, bytes) or len(award_digest) != AWARD_DIGEST_LENGTH:
        raise ValueError(f"an award digest must be {AWARD_DIGEST_LENGTH} bytes")
    return _field(_ENDORSEMENT_LABEL) + award_digest


def sign_award_endorsement(identity_private_key: Ed25519PrivateKey, award_digest: bytes) -> bytes:
    """Ed25519 signature (64 bytes) over :func:`award_endorsement_message`."""
    return identity_private_key.sign(award_endorsement_message(award_digest))


def verify_award_endorsement(identity_public_key: bytes, signature: bytes, award_digest: bytes) -> None:
    """Check an endorsement; ``ValueError`` unless it verifies for exactly this award digest."""
    _verify(identity_public_key, signature, award_endorsement_message(award_digest), "award endorsement")


def member_binding_message(run_id: int, node_id: int, member: int, directory_digest: bytes) -> bytes:
    """The bytes a member signs to say which node id it is in run ``run_id``, under the directory it pins."""
    for name, value in (("run_id", run_id), ("node_id", node_id), ("member", member)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
            raise ValueError(f"{name} must be an int in [0, 2**64), got {value!r}")
    if not isinstance(directory_digest, bytes) or len(directory_digest) != DIRECTORY_DIGEST_LENGTH:
        raise ValueError(f"directory_digest must be {DIRECTORY_DIGEST_LENGTH} bytes")
    return _field(_MEMBER_BINDING_LABEL) + struct.pack(">QQQ", run_id, node_id, member) + _field(directory_digest)


def sign_member_binding(
    identity_private_key: Ed25519PrivateKey, run_id: int, node_id: int, member: int, directory_digest: bytes
) -> bytes:
    """Ed25519 signature (64 bytes) over :func:`member_binding_message`."""
    return identity_private_key.sign(member_binding_message(run_id, node_id, member, directory_digest))


def pack_member_bindings(bindings: Mapping[int, tuple[int, bytes]]) -> bytes:
    """``{node id: (member, signature)}`` as one byte string, by node id (:data:`MEMBER_BINDING_LENGTH` each)."""
    return b"".join(
        struct.pack(">QQ", node_id, member) + signature for node_id, (member, signature) in sorted(bindings.items())
    )


def unpack_member_bindings(packed: bytes) -> dict[int, tuple[int, bytes]]:
    """The inverse of :func:`pack_member_bindings`; ``ValueError`` for a malformed string or a node id twice."""
    if not isinstance(packed, bytes) or len(packed) % MEMBER_BINDING_LENGTH:
        raise ValueError(f"member bindings must be bytes of a multiple of {MEMBER_BINDING_LENGTH}")
    bindings: dict[int, tuple[int, bytes]] = {}
    for start in range(0, len(packed), MEMBER_BINDING_LENGTH):
        node_id, member = struct.unpack(">QQ", packed[start : start + 16])
        if node_id in bindings:
            raise ValueError(f"node {node_id} is bound twice")
        bindings[node_id] = (member, packed[start + 16 : start + MEMBER_BINDING_LENGTH])
    return bindings


def bind_members(
    directory: IdentityDirectory, bindings: Mapping[int, tuple[int, bytes]], run_id: int
) -> IdentityDirectory:
    """The directory of run ``run_id``, keyed by node id: each node's key is that of the member it proved to be.

    Parameters
    ----------
    directory : IdentityDirectory
        The pinned directory, keyed by member (``by_member``).
    bindings : Mapping[int, tuple[int, bytes]]
        Node id -> (member, the member's signature over :func:`member_binding_message` for this run, node id and
        the directory's digest).
    run_id : int
        The Flower run.

    Returns
    -------
    IdentityDirectory
        ``{node id: key of its member}``, with ``members`` the pinned directory's (unbound members count in every
        size and quorum as they would in a directory keyed by node id).

    Raises
    ------
    ValueError
        If the directory is not keyed by member, a member is not in it or is bound to two node ids, or a signature
        does not verify (naming the node): a binding can only come from the member's own key, for this run.
    """
    if not directory.by_member:
        raise ValueError("only a directory keyed by member is bound to node ids")
    digest = directory.digest()
    keys: dict[int, bytes] = {}
    seen: dict[int, int] = {}
    for node_id, (member, signature) in sorted(bindings.items()):
        if member not in directory:
            raise ValueError(f"node {node_id} claims member {member}, which the directory does not list")
        if member in seen:
            raise ValueError(f"member {member} is bound to two node ids ({seen[member]} and {node_id})")
        _verify(
            directory[member],
            signature,
            member_binding_message(run_id, node_id, member, digest),
            f"binding of node {node_id} to member {member}",
        )
        seen[member] = node_id
        keys[node_id] = directory[member]
    return IdentityDirectory(keys, members=directory.members)


def _verify(identity_public_key: bytes, signature: bytes, message: bytes, what: str) -> None:
    """Verify one Ed25519 signature; ``ValueError`` naming ``what`` if it is missing, malformed or wrong."""
    if not signature:
        raise ValueError(f"{what} is not signed")
    if not isinstance(signature, bytes) or len(signature) != SIGNATURE_LENGTH:
        raise ValueError(f"{what}: a signature must be {SIGNATURE_LENGTH} bytes")
    if not isinstance(identity_public_key, bytes) or len(identity_public_key) != IDENTITY_KEY_LENGTH:
        raise ValueError(f"{what}: the identity key is not a valid Ed25519 key ({IDENTITY_KEY_LENGTH} bytes)")
    if not ed25519_verifies(identity_public_key, signature, message):
        raise ValueError(f"{what} does not verify for this run, session, roster and content")


__all__ = [
    "AWARD_DIGEST_LENGTH",
    "DIRECTORY_DIGEST_LENGTH",
    "IDENTITY_KEY_LENGTH",
    "MEMBER_BINDING_LENGTH",
    "ROSTER_LENGTH",
    "SIGNATURE_LENGTH",
    "DirectorySignature",
    "IdentityDirectory",
    "advertisement_message",
    "award_endorsement_message",
    "bid_message",
    "bind_members",
    "directory_signature_message",
    "ed25519_verifies",
    "generate_identity",
    "load_directory",
    "load_identity_key",
    "member_binding_message",
    "pack_member_bindings",
    "parse_digest",
    "parse_public_key",
    "public_key_of",
    "save_identity_key",
    "share_ciphertext_message",
    "sign_advertisement",
    "sign_award_endorsement",
    "sign_bid",
    "sign_member_binding",
    "sign_share_ciphertext",
    "sign_survivor_set",
    "survivor_set_message",
    "unpack_member_bindings",
    "verify_advertisement",
    "verify_award_endorsement",
    "verify_bid",
    "verify_share_ciphertext",
    "verify_survivor_set",
]
