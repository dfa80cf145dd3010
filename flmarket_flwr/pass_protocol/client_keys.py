"""PASS v2, the client's key agreement with its neighbours: their keys and signatures checked, and channel proofs.

:func:`check_neighbour_keys` validates the keys a client is sent at share keys and derives its pair seeds and channel
secrets; :func:`signed_by` checks a neighbour's signature on the shares it dealt; :func:`prove_channel` is what a
client shows when it accuses a dealer whose shares did not open. Both client modes (:mod:`.client`,
:mod:`.sparse_client`) use them.
"""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from flmarket_flwr.pass_protocol.channel import accusation_context, possession_context
from flmarket_flwr.pass_protocol.client_state import Advertised, Shared
from flmarket_flwr.pass_protocol.dleq import montgomery_u, prove_exchange, verify_possession
from flmarket_flwr.pass_protocol.encoding import PassError
from flmarket_flwr.pass_protocol.identity import IdentityDirectory, verify_advertisement, verify_share_ciphertext
from flmarket_flwr.pass_protocol.messages import ShareKeysRequest
from flmarket_flwr.pass_protocol.primitives import (
    derive_pair_seed,
    exchange_shared_secret,
    parse_public_key,
    validate_public_key_bytes,
)


def check_neighbour_keys(
    state: Advertised, request: ShareKeysRequest, directory: IdentityDirectory | None
) -> tuple[list[bytes], list[bytes]]:
    """Keys valid and pairwise distinct (own keys included); signatures valid when a directory is given.

    Each key is validated by the one exchange this client makes with it (a low-order point gives the
    all-zero secret, which the exchange refuses). Returns each neighbour's pairwise mask seed and the
    edge's channel secret: two X25519 exchanges per neighbour, the whole of this client's key agreement.
    """
    mask_key = X25519PrivateKey.from_private_bytes(state.mask_private_key)
    cipher_key = X25519PrivateKey.from_private_bytes(state.cipher_private_key)
    pair_seeds, channel_secrets = [], []
    session, index = state.session, state.index
    seen = {montgomery_u(state.cipher_public_key), montgomery_u(state.mask_public_key)}
    for v, node_id, cipher_public, mask_public, signature in zip(
        request.neighbours,
        request.neighbour_node_ids,
        request.cipher_public_keys,
        request.mask_public_keys,
        request.signatures,
        strict=True,
    ):
        try:
            validate_public_key_bytes(cipher_public, v)
            validate_public_key_bytes(mask_public, v)
            channel_secrets.append(exchange_shared_secret(cipher_key, parse_public_key(cipher_public, v), v))
            mask_secret = exchange_shared_secret(mask_key, parse_public_key(mask_public, v), v)
            pair_seeds.append(derive_pair_seed(mask_secret, session, index, v))
            if directory is not None:
                if node_id == state.node_id:
                    raise ValueError(f"neighbour {v} claims this client's node id {node_id}")
                verify_advertisement(
                    directory.key_of(node_id),
                    signature,
                    session,
                    v,
                    node_id,
                    cipher_public,
                    mask_public,
                    run_id=state.run_id,
                    roster=state.roster,
                    mode=state.graph_commitment,
                )
        except (TypeError, ValueError) as error:
            raise PassError(f"neighbour {v} refused: {error}") from error
        keys = {montgomery_u(cipher_public), montgomery_u(mask_public)}
        if len(keys) != 2 or keys & seen:
            raise PassError(f"neighbour {v} reuses a public key already in this session")
        seen |= keys
    if directory is not None and len(set(request.neighbour_node_ids)) != len(request.neighbour_node_ids):
        raise PassError("two neighbours claim one node id")
    return pair_seeds, channel_secrets


def signed_by(state: Shared, sender: int, signature: bytes, ciphertext: bytes, digest: bytes) -> bool:
    """Whether ``sender``'s identity key signed this ciphertext and digest (run, session, roster bound)."""
    try:
        verify_share_ciphertext(
            state.identity_keys[state.neighbours.index(sender)],
            signature,
            sender,
            state.index,
            ciphertext,
            digest,
            run_id=state.run_id,
            session=state.session,
            roster=state.roster,
        )
    except ValueError:
        return False
    return True


def prove_channel(state: Shared, accused: int) -> bytes:
    """The channel secret with ``accused`` and its proof, bound to this run, roster, session and edge.

    ``b""`` (nothing revealed) unless the accused's cipher key came with a valid proof of possession: a
    key made as a multiple of another client's key would otherwise turn the secret proven here into the
    secret of another edge. The server checked every advertised proof, so an honest relay never gets here
    with a bad one; a server that relays one is the party deviating.
    """
    run_id, roster, session = state.run_id, state.roster, state.session
    position = state.neighbours.index(accused)
    peer_key = state.neighbour_cipher_keys[position]
    possession = state.neighbour_cipher_proofs[position]
    if not verify_possession(peer_key, possession, possession_context(run_id, session, accused)):
        return b""
    context = accusation_context(run_id, roster, session, state.index, accused)
    return prove_exchange(state.cipher_private_key, state.cipher_public_key, peer_key, context)
