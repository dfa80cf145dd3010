"""PASS blame: who deviated, from the evidence the server holds, without trusting either party or another round.

:func:`judge_accusation` settles one receiver's accusation of a sender from the ciphertext the server relayed and
the accuser's proof of their channel secret; :func:`forged_share` names a holder that returned an unmask share
other than the one its dealer sent it.
"""

from __future__ import annotations

from collections.abc import Mapping

from flmarket_flwr.pass_protocol.channel import accusation_context, unseal
from flmarket_flwr.pass_protocol.dleq import verify_exchange
from flmarket_flwr.pass_protocol.encoding import share_digest
from flmarket_flwr.pass_protocol.identity import verify_share_ciphertext
from flmarket_flwr.pass_protocol.messages import UnmaskReply


def judge_accusation(
    accuser: int,
    accused: int,
    proof: bytes,
    *,
    ciphertext: bytes,
    signature: bytes,
    digest: bytes,
    accuser_cipher_key: bytes,
    accused_cipher_key: bytes,
    accused_identity_key: bytes | None,
    session: bytes,
    run_id: int,
    roster: bytes,
) -> tuple[int, str]:
    """The one of ``accuser`` and ``accused`` that deviated, and why.

    In order: with identity keys (``accused_identity_key`` given), a ciphertext whose sender's signature fails on
    the server's own copy names the sender (garbage shares; the accuser rightly revealed nothing). Otherwise (every
    advertised cipher key came with a valid proof of possession) the accuser must prove its channel secret with
    the sender (:func:`~flmarket_flwr.pass_protocol.dleq.verify_exchange` against both advertised cipher keys; none
    or a wrong one names the accuser), and the server opens the ciphertext it relayed with it exactly as the
    accuser had to (:func:`~flmarket_flwr.pass_protocol.channel.unseal`): it opens, the accusation was false; it
    does not, the sender sent garbage. When the server relays faithfully, the client named is one that deviated,
    whatever the other did (a proof cannot name an honest sender: :mod:`~flmarket_flwr.pass_protocol.dleq`). A
    server that forges a ciphertext can get its honest receiver named, as it can exclude anyone anyway; with
    identity keys it learns nothing by it (the receiver reveals no secret for a ciphertext not signed).

    Parameters
    ----------
    accuser, accused : int
        PASS indices: the receiver that accused, and the sender of ``ciphertext``.
    proof : bytes
        The accuser's proof of their channel secret (``b""`` when it revealed none).
    ciphertext, signature, digest : bytes
        The server's copy of what the accused sent the accuser, its signature (``b""`` if unsigned) and digest.
    accuser_cipher_key, accused_cipher_key : bytes
        Their advertised cipher keys (each checked with its proof of possession at advertise).
    accused_identity_key : bytes or None
        The accused's directory key, with identity keys; ``None`` without.
    session, run_id, roster
        What the signature and the proof are bound to.

    Returns
    -------
    tuple of (int, str)
        The index named, and the reason to record.
    """
    if accused_identity_key is not None:
        try:
            verify_share_ciphertext(
                accused_identity_key,
                signature,
                accused,
                accuser,
                ciphertext,
                digest,
                run_id=run_id,
                session=session,
                roster=roster,
            )
        except ValueError:
            return accused, f"its share ciphertext to client {accuser} is not signed by it: garbage shares"
    secret = verify_exchange(
        accuser_cipher_key,
        accused_cipher_key,
        proof,
        accusation_context(run_id, roster, session, accuser, accused),
    )
    if secret is None:
        return accuser, f"it accused client {accused} without a valid proof of their channel secret"
    if unseal(secret, ciphertext, session, accused, accuser, digest) is not None:
        return accuser, f"it accused client {accused}, whose shares open under the proven secret: false accusation"
    return accused, f"its shares to client {accuser} do not open under the proven secret: garbage shares"


def forged_share(
    session: bytes, holder: int, reply: UnmaskReply, digests: Mapping[tuple[int, int], bytes]
) -> str | None:
    """Evidence that ``holder`` returned a share other than the one its dealer sent it, or ``None``.

    ``digests[dealer, holder]`` is the share-pair digest the dealer sent the server. The holder checked its shares
    against it when it masked, so a mismatch now is the holder's own doing.
    """
    returned = (
        (reply.survivor_indices, reply.survivor_shares, b"b", slice(32, 64), "self-mask seed"),
        (reply.dropped_indices, reply.dropped_shares, b"s", slice(0, 32), "mask key"),
    )
    for dealers, shares, kind, part, what in returned:
        for dealer, share in zip(dealers, shares, strict=True):
            expected = digests.get((dealer, holder), b"")[part]
            if share_digest(session, dealer, holder, kind, share) != expected:
                return (
                    f"its unmask share of the {what} of client {dealer} does not match the digest that "
                    f"client {dealer} sent with it (and that client {holder} accepted): corrupted share"
                )
    return None
