"""Identity keys and the directory of them that each node pins: the trust anchor of the secure profile.

Each client holds a long-term Ed25519 identity key (:func:`generate_identity`, :func:`save_identity_key`,
:func:`load_identity_key`); the public halves are listed in an :class:`IdentityDirectory`, keyed by node id or by
member, that each node pins in its own node config (by digest or by a third party's signature,
:func:`load_directory`): a directory the server can write guards against nothing. What the keys sign is in
:mod:`flmarket_flwr.pass_protocol.identity`.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

import nacl.bindings
import nacl.exceptions
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_pem_private_key,
)

IDENTITY_KEY_LENGTH: Final[int] = 32
SIGNATURE_LENGTH: Final[int] = 64
_DIRECTORY_VERSION: Final[int] = 1
_DIRECTORY_LABEL: Final[bytes] = b"flmarket-pass/v2/identity-directory"
_DIRECTORY_SIGNATURE_LABEL: Final[bytes] = b"flmarket-pass/v2/identity-directory/signature"
_BY_MEMBER_LABEL: Final[bytes] = b"flmarket-pass/v2/identity-directory/keyed-by-member"
DIRECTORY_DIGEST_LENGTH: Final[int] = 32
"""Bytes of a directory digest (SHA-256 of :meth:`IdentityDirectory.canonical_bytes`)."""


def field(data: bytes) -> bytes:
    """Length-prefixed field (8-byte big-endian length): the signed messages' injective encoding."""
    return struct.pack(">Q", len(data)) + data


def ed25519_verifies(public_key: bytes, signature: bytes, message: bytes) -> bool:
    """Whether ``signature`` is a valid Ed25519 signature on ``message`` under the 32 raw bytes ``public_key``.

    Every signature check of the secure profile goes through here. It is libsodium's verification (PyNaCl), about
    1.6x faster than OpenSSL's on this project's machines (``benchmarks/RESULTS.md``, section 4) and stricter: it also
    refuses small-order keys and ``R`` points, which no honest signer produces. A key or signature of the wrong
    length, or one that is not bytes, is simply not valid.
    """
    if not isinstance(public_key, bytes) or not isinstance(signature, bytes):
        return False
    if len(public_key) != IDENTITY_KEY_LENGTH or len(signature) != SIGNATURE_LENGTH:
        return False
    try:
        nacl.bindings.crypto_sign_open(signature + message, public_key)
    except (nacl.exceptions.BadSignatureError, nacl.exceptions.ValueError, nacl.exceptions.TypeError):
        return False
    return True


def generate_identity() -> tuple[Ed25519PrivateKey, bytes]:
    """A fresh Ed25519 identity: ``(private key, 32 raw public bytes)``."""
    private_key = Ed25519PrivateKey.generate()
    return private_key, public_key_of(private_key)


def save_identity_key(private_key: Ed25519PrivateKey, path: str | os.PathLike[str]) -> bytes:
    """Write ``private_key`` as unencrypted PKCS#8 PEM, readable by its owner only; return the raw public key."""
    pem = private_key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(pem)
    return public_key_of(private_key)


def load_identity_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    """Read an Ed25519 private key from a PKCS#8 PEM file (as :func:`save_identity_key` writes it).

    Raises
    ------
    ValueError
        If the file holds no unencrypted Ed25519 private key.
    """
    with open(path, "rb") as handle:
        key = load_pem_private_key(handle.read(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{os.fspath(path)} holds a {type(key).__name__}, not an Ed25519 private key")
    return key


def public_key_of(private_key: Ed25519PrivateKey) -> bytes:
    """The 32 raw public bytes of an Ed25519 private key."""
    return private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def parse_public_key(text: str, what: str) -> bytes:
    """An Ed25519 public key from 64 hex digits; ``ValueError`` naming ``what`` unless it is a valid key."""
    key = _parse_hex(text, IDENTITY_KEY_LENGTH, what)
    try:
        Ed25519PublicKey.from_public_bytes(key)
    except ValueError as error:
        raise ValueError(f"{what} is not a valid Ed25519 public key") from error
    return key


def parse_digest(text: str, what: str) -> bytes:
    """A directory digest from 64 hex digits; ``ValueError`` naming ``what`` otherwise."""
    return _parse_hex(text, DIRECTORY_DIGEST_LENGTH, what)


def _parse_hex(text: object, length: int, what: str) -> bytes:
    """``length`` bytes from ``2 * length`` hex digits (surrounding blanks ignored), or a ``ValueError``."""
    if not isinstance(text, str):
        raise ValueError(f"{what} must be {2 * length} hex digits, got {text!r}")
    try:
        value = bytes.fromhex(text.strip())
    except ValueError as error:
        raise ValueError(f"{what} must be {2 * length} hex digits, got {text!r}") from error
    if len(value) != length:
        raise ValueError(f"{what} must be {2 * length} hex digits ({length} bytes), got {len(value)} bytes")
    return value


@dataclass(frozen=True)
class DirectorySignature:
    """A third party's Ed25519 signature over a directory's canonical bytes.

    Attributes
    ----------
    signer : bytes
        The signer's 32-byte Ed25519 public key.
    value : bytes
        The 64-byte signature over :func:`directory_signature_message`.
    """

    signer: bytes
    value: bytes


def directory_signature_message(canonical: bytes) -> bytes:
    """The bytes a directory's signer signs: a domain label and the directory's canonical bytes."""
    return field(_DIRECTORY_SIGNATURE_LABEL) + field(canonical)


class IdentityDirectory(Mapping[int, bytes]):
    """Immutable mapping ``node_id -> 32-byte Ed25519 public key``, distributed out of band.

    JSON format: ``{"version": 1, "keys": {"<node_id>": "<64 hex digits>"}}``, and for a signed directory
    ``"signature": {"signer": "<64 hex digits>", "value": "<128 hex digits>"}``. The signature is not part of
    the mapping: two directories with the same keys are equal, signed or not.

    Notes
    -----
    Each client holds a long-term Ed25519 identity key; the public halves are distributed out of band in an
    :class:`IdentityDirectory` (node id -> public key). A client signs:

    * its two per-session X25519 public keys, bound to the Flower run id, the session, the roster fingerprint
      the server announced, its PASS index and its node id (:func:`sign_advertisement`); its neighbours verify
      the signature against their own run id and roster before using the keys, so an advert replayed from
      another run or shown under another roster is refused;
    * the survivor set it was shown before unmasking (:func:`sign_survivor_set`, the consistency round of
      Bonawitz et al. 2017), bound to the same run, session and roster;
    * each share ciphertext it sends, with the digest of the shares inside (:func:`sign_share_ciphertext`), so
      that a garbage ciphertext is its own and the server cannot forge one in its name (a receiver reveals its
      channel secret to accuse a sender only for a validly signed ciphertext, :mod:`.client`);
    * the digest of the market's award it checked (:func:`sign_award_endorsement`): a winner opens its counts only
      for an award that ``t`` other members endorsed (:mod:`flmarket_flwr.market.wire.award`).

    Without a directory the server is trusted to relay keys and survivor sets faithfully (semi-honest server
    only); with one, it can no longer substitute keys or replay them, and a client unmasks only for a set that ``t``
    of its neighbours signed (on a sparse graph, clients in different regions can still be shown different sets:
    docs/threat-model.md).
    """

    def __init__(
        self,
        keys: Mapping[int, bytes],
        signature: DirectorySignature | None = None,
        *,
        by_member: bool = False,
        members: int | None = None,
    ) -> None:
        if not isinstance(by_member, bool):
            raise TypeError(f"by_member must be a bool, got {by_member!r}")
        self.by_member = by_member
        """Whether the keys are a consortium's member numbers (a simulation's partitions), each bound to a run's
        node id by the member's own signature (:func:`bind_members`), rather than Flower node ids."""
        checked: dict[int, bytes] = {}
        for node_id, key in keys.items():
            if isinstance(node_id, bool) or not isinstance(node_id, int) or not 0 <= node_id < 2**64:
                raise ValueError(f"node ids must be ints in [0, 2**64), got {node_id!r}")
            if not isinstance(key, bytes) or len(key) != IDENTITY_KEY_LENGTH:
                raise ValueError(f"identity key of node {node_id} must be {IDENTITY_KEY_LENGTH} bytes")
            try:
                Ed25519PublicKey.from_public_bytes(key)
            except ValueError as error:
                raise ValueError(f"identity key of node {node_id} is not a valid Ed25519 key") from error
            checked[node_id] = key
        if len(set(checked.values())) != len(checked):
            raise ValueError("two nodes share one identity key")
        self._keys = MappingProxyType(dict(sorted(checked.items())))
        if members is not None and (
            isinstance(members, bool) or not isinstance(members, int) or members < len(checked)
        ):
            raise ValueError(f"members must be an int >= the {len(checked)} keys, got {members!r}")
        self.members = len(checked) if members is None else members
        """How many parties the pinned directory lists: its length, or for a directory bound to one run's node ids
        (:func:`bind_members`) the member directory's, whichever of them were bound. Sizes and quorums count these."""
        if signature is not None:
            if not ed25519_verifies(
                signature.signer, signature.value, directory_signature_message(self.canonical_bytes())
            ):
                raise ValueError(
                    f"the identity directory's signature by {signature.signer.hex()} does not verify over its keys "
                    "(altered after signing?): refused"
                )
        self.signature = signature

    def __getitem__(self, node_id: int) -> bytes:
        return self._keys[node_id]

    def __iter__(self) -> Iterator[int]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        signed = "" if self.signature is None else f", signed by {self.signature.signer.hex()[:16]}..."
        kind = "members" if self.by_member else "nodes"
        bound = f" of {self.members}" if self.members != len(self) else ""
        return f"IdentityDirectory({len(self)}{bound} {kind}{signed})"

    def key_of(self, node_id: int) -> bytes:
        """Public key of ``node_id``; ``ValueError`` (not ``KeyError``) if the node is unknown."""
        if self.by_member:
            raise ValueError(
                "a directory keyed by member lists no node ids: bind its members to the run's node ids first "
                "(the market's bind step)"
            )
        if node_id not in self._keys:
            raise ValueError(f"node {node_id} is not in the identity directory")
        return self._keys[node_id]

    def canonical_bytes(self) -> bytes:
        """The directory as one injective byte string: a domain label, the version, then ``(node id, key)`` sorted.

        Independent of the JSON's layout and of any signature; what :meth:`digest` hashes and a signer signs.
        """
        entries = b"".join(struct.pack(">Q", node_id) + key for node_id, key in self._keys.items())
        keyed = field(_BY_MEMBER_LABEL) if self.by_member else b""  # a node pinning the digest pins this too
        return field(_DIRECTORY_LABEL) + struct.pack(">QQ", _DIRECTORY_VERSION, len(self._keys)) + entries + keyed

    def digest(self) -> bytes:
        """SHA-256 of :meth:`canonical_bytes` (32 bytes): what a node pins as ``identity-directory-digest``."""
        return hashlib.sha256(self.canonical_bytes()).digest()

    def signed_by(self, signer_key: Ed25519PrivateKey) -> IdentityDirectory:
        """This directory carrying ``signer_key``'s signature over its canonical bytes (a new object)."""
        value = signer_key.sign(directory_signature_message(self.canonical_bytes()))
        return IdentityDirectory(
            self._keys, DirectorySignature(public_key_of(signer_key), value), by_member=self.by_member
        )

    def check_pins(self, *, digest: bytes | None = None, signer: bytes | None = None, source: str = "") -> None:
        """Check the directory against a node's pins: its digest and/or the key that must have signed it.

        Parameters
        ----------
        digest : bytes, optional
            The pinned SHA-256 digest of :meth:`canonical_bytes`.
        signer : bytes, optional
            The pinned Ed25519 public key of the party that signs the directory.
        source : str
            Where the directory came from, for the error message.

        Raises
        ------
        ValueError
            If the digest differs, or the directory is unsigned or signed by another key, naming the pinned
            and the found digest or key. (A signature that does not verify is refused when it is read.)
        """
        name = f"identity directory {source}".rstrip()
        if digest is not None and self.digest() != digest:
            raise ValueError(
                f"{name} has digest {self.digest().hex()}, not the pinned digest {digest.hex()}: refused "
                "(it was altered, or it is not the directory this node trusts)"
            )
        if signer is not None and self.signature is None:
            raise ValueError(f"{name} is not signed, and this node pins its signer {signer.hex()}: refused")
        if signer is not None and self.signature is not None and self.signature.signer != signer:
            raise ValueError(
                f"{name} is signed by {self.signature.signer.hex()}, not by the pinned signer {signer.hex()}: refused"
            )

    def to_json(self) -> str:
        """The directory as JSON text (see the class docstring)."""
        keys = {str(node_id): key.hex() for node_id, key in self._keys.items()}
        data: dict[str, object] = {"version": _DIRECTORY_VERSION, "keys": keys}
        if self.by_member:
            data["keyed-by"] = "member"
        if self.signature is not None:
            data["signature"] = {"signer": self.signature.signer.hex(), "value": self.signature.value.hex()}
        return json.dumps(data, indent=2)

    @classmethod
    def from_json(cls, text_or_path: str | os.PathLike[str]) -> IdentityDirectory:
        """Parse JSON text, or read it from a file path; a signature it carries must verify."""
        text = str(text_or_path)
        if isinstance(text_or_path, os.PathLike) or not text.lstrip().startswith("{"):
            with open(text_or_path, encoding="utf-8") as handle:
                text = handle.read()
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"identity directory is not valid JSON: {error}") from error
        if not isinstance(data, dict) or data.get("version") != _DIRECTORY_VERSION:
            raise ValueError(f'identity directory must be an object with "version": {_DIRECTORY_VERSION}')
        unknown = sorted(set(data) - {"version", "keys", "signature", "keyed-by"})
        if unknown:
            raise ValueError(f"identity directory has unknown field(s) {unknown}")
        if data.get("keyed-by", "node") not in ("node", "member"):
            raise ValueError(f'identity directory "keyed-by" must be "node" or "member", got {data["keyed-by"]!r}')
        keys = data.get("keys")
        if not isinstance(keys, dict):
            raise ValueError('identity directory needs a "keys" object')
        parsed: dict[int, bytes] = {}
        for node_id, hex_key in keys.items():
            if not (str(node_id).isascii() and str(node_id).isdigit()):
                raise ValueError(f"node id {node_id!r} is not a non-negative decimal integer")
            try:
                parsed[int(node_id)] = bytes.fromhex(hex_key)
            except (TypeError, ValueError) as error:
                raise ValueError(f"identity key of node {node_id} is not hex") from error
        return cls(parsed, _parse_signature(data.get("signature")), by_member=data.get("keyed-by") == "member")


def _parse_signature(data: object) -> DirectorySignature | None:
    """The ``"signature"`` field of a directory's JSON (absent: ``None``)."""
    if data is None:
        return None
    if not isinstance(data, dict) or set(data) != {"signer", "value"}:
        raise ValueError('the identity directory\'s "signature" must be an object with "signer" and "value"')
    signer = parse_public_key(data["signer"], "the identity directory's signer")
    return DirectorySignature(signer, _parse_hex(data["value"], SIGNATURE_LENGTH, "the identity directory's signature"))


def load_directory(
    path: str | os.PathLike[str],
    *,
    digest: bytes | None = None,
    signer: bytes | None = None,
    unpinned: bool = False,
) -> IdentityDirectory:
    """Read the directory at ``path`` and check it against the node's pins (:meth:`IdentityDirectory.check_pins`).

    Parameters
    ----------
    path : str or os.PathLike
        The directory's JSON file.
    digest, signer : bytes, optional
        The node's pins: the directory's SHA-256 digest, the public key of the party that signs it (or both).
    unpinned : bool (default: False)
        Accept the file with neither pin: only where the node's operator wrote it, never the buyer.

    Raises
    ------
    ValueError
        If the file is not a directory, carries a signature that does not verify, fails a pin, or has no pin
        while ``unpinned`` is false.

    Notes
    -----
    A directory the server can write guards against nothing: it would map other nodes' ids to keys of its own and
    seat a victim among its sybils. A node therefore pins the directory it trusts: by the SHA-256 digest of its
    canonical bytes (:meth:`IdentityDirectory.digest`), or by the Ed25519 key of a third party that signs those
    bytes (:meth:`IdentityDirectory.signed_by`); :func:`load_directory` refuses any other
    (``python -m flmarket_flwr.pass_protocol.identity_cli`` makes, signs and digests directories).
    """
    source = os.fspath(path)
    if digest is None and signer is None and not unpinned:
        raise ValueError(
            f"identity directory {source} is not pinned: a directory the buyer can write guards against nothing; "
            "pin its digest or its signer's key: refused"
        )
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    if not text.lstrip().startswith("{"):
        raise ValueError(f"identity directory {source} is not a JSON object")
    directory = IdentityDirectory.from_json(text)
    directory.check_pins(digest=digest, signer=signer, source=source)
    return directory
