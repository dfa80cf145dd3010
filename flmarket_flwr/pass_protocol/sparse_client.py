"""The sparse secure mode of PASS, the client's side: :class:`SparseSecureClient`.

The rounds of :class:`~.client.PassClient` with identity keys and the consistency round, on a directed graph the
client helps draw (docs/threat-model.md, "The sparse secure profile", rules 1-4): it checks the session's settings
and ``(k, t)`` (:mod:`.sparse_secure`), draws and signs its own out-neighbours, shares its secrets ``t``-of-``k``
among them only, masks with its out- and in-neighbours that completed key sharing and signs that list, and unmasks
only for the survivor set it signed, on ``t`` signatures of its out-neighbours, revealing a dealer's self-mask share
only where both signed lists name the edge. Its state is :mod:`.sparse_state`'s records.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
from collections.abc import Mapping
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from flmarket_flwr.pass_protocol.channel import noise_words, seal, signed_mask, unseal
from flmarket_flwr.pass_protocol.client import PassClient
from flmarket_flwr.pass_protocol.client_keys import check_neighbour_keys, prove_channel, signed_by
from flmarket_flwr.pass_protocol.client_state import (
    Fresh,
    Joined,
    SessionView,
    Unmasked,
    Withdrawn,
    read_state,
    require_stage,
)
from flmarket_flwr.pass_protocol.client_views import check_signed_set, sign_view
from flmarket_flwr.pass_protocol.dleq import mask_scalar
from flmarket_flwr.pass_protocol.encoding import (
    SHARE_BYTES,
    PassError,
    bitmap_array,
    bitmap_bits,
    counts_commitment,
    in_bitmap,
    pair_digest,
    roster_fingerprint,
    strictly_increasing,
    survivor_transcript,
)
from flmarket_flwr.pass_protocol.graph import roster_digest
from flmarket_flwr.pass_protocol.identity import (
    IdentityDirectory,
    sign_share_ciphertext,
)
from flmarket_flwr.pass_protocol.messages import (
    Advertisement,
    AdvertiseRequest,
    ConsistencyReply,
    ConsistencyRequest,
    DrawRequest,
    OutNeighbourDraw,
    ShareKeysReply,
    ShareKeysRequest,
    SparseAdvertiseRequest,
    SparseMaskedInput,
    SparseMaskRequest,
    SparseShareKeysRequest,
    SparseUnmaskRequest,
    UnmaskReply,
)
from flmarket_flwr.pass_protocol.primitives import MIN_PARTICIPANTS, expand_seed
from flmarket_flwr.pass_protocol.shamir import random_scalar, scalar_to_bytes, split_scalars
from flmarket_flwr.pass_protocol.sparse_secure import (
    IndexDraw,
    SessionBinding,
    SparseSecureSettings,
    draw_out_neighbours,
    unpack_indices,
)
from flmarket_flwr.pass_protocol.sparse_state import (
    SPARSE_ROUNDS,
    SparseAdvertised,
    SparseMasked,
    SparseRound,
    SparseShared,
)

__all__ = ["SparseSecureClient"]

_Round = TypeVar("_Round", SparseAdvertised, SparseShared, SparseMasked)


class SparseSecureClient(SessionView):
    """One client's side of the sparse secure mode of PASS; all its state is one round's record.

    Rounds, each from the record the one before it left (the server's side:
    :class:`~flmarket_flwr.pass_protocol.sparse_server.SparseSecureServer`):

    1. :meth:`advertise`: refuse settings weaker than this node's own, then as :meth:`.PassClient.advertise`
       (signed keys bound to the run, session and roster fingerprint);
    2. :meth:`draw`: ``U1`` is fixed; refuse a ``(k, t)`` other than the finder's for the session's settings at
       ``|U1|``, draw ``k`` out-neighbours uniformly from the rest of ``U1`` with this client's own randomness, and
       sign the draw (rule 1);
    3. :meth:`share_keys`: check the out-neighbours echoed, every in-neighbour's signed draw naming this client
       (same ``U1`` and ``(k, t)``) and the in-degree cap, every neighbour's signed keys; share the mask key and the
       self-mask seed ``t``-of-``k`` among the out-neighbours only (rule 2);
    4. :meth:`mask_input`: mask with the out- and in-neighbours the server says completed key sharing, and sign
       that list (rule 3);
    5. :meth:`sign_survivors`: sign one survivor set (rule 4);
    6. :meth:`unmask`: only for that set, with ``t`` valid signatures of out-neighbours on it; a dealer's self-mask
       share only if the dealer's signed list names this client and this client's names the dealer; a dropped
       dealer's mask-key share with no list (rule 3).

    Parameters
    ----------
    record : mapping, optional
        A state from :meth:`to_record` (a fresh client if omitted).
    draw : callable, optional
        ``draw(n)``, a uniform integer below ``n`` for the out-neighbour draw (:func:`secrets.randbelow`; a seam for
        tests, never for a deployment).
    """

    def __init__(self, record: Mapping[str, Any] | None = None, *, draw: IndexDraw = secrets.randbelow) -> None:
        self._round: SparseRound = read_state(record or {}, SPARSE_ROUNDS)
        self._draw = draw

    @property
    def round(self) -> SparseRound:
        """This client's state (secrets included)."""
        return self._round

    @property
    def out_neighbours(self) -> tuple[int, ...]:
        """The out-neighbours this client drew (empty before :meth:`draw`)."""
        return getattr(self._round, "out_neighbours", ())

    def _at(self, kind: type[_Round], step: str) -> _Round:
        return require_stage(self._round, kind, step)

    # Round 1 -----------------------------------------------------------------
    def advertise(
        self,
        request: SparseAdvertiseRequest | Mapping[str, Any],
        counts: npt.ArrayLike,
        *,
        identity_key: Ed25519PrivateKey,
        settings: SparseSecureSettings,
        run_id: int = 0,
    ) -> Advertisement:
        """Refuse the session's settings if weaker than this node's ``settings``; else make and sign the keys.

        ``run_id`` is this client's own (Flower's ``context.run_id``), as in :meth:`.PassClient.advertise`; the
        roster floor this client holds ``|U1|`` to is its own ``settings.roster_floor``.
        """
        request = SparseAdvertiseRequest.coerce(request)
        if not isinstance(self._round, Fresh):
            raise PassError("this client already advertised: one PASS session per run")
        if not isinstance(identity_key, Ed25519PrivateKey):
            raise PassError("the sparse secure mode needs this client's identity key")
        session_settings = SparseSecureSettings(
            request.colluders,
            request.roster_floor,
            request.dropout_ppm,
            request.reruns,
            request.security_bits,
            request.markets,
        )
        weaker = session_settings.weaker_than(settings)
        if weaker:
            raise PassError(f"the session's settings are weaker than this node's: {'; '.join(weaker)}")
        # PassClient's advertise makes and signs the keys; there is no server seed in this mode, so the slot of its
        # graph commitment holds the digest of the settings accepted, which the advert's signature binds (its
        # neighbours check it under their own: a node never takes one that joined in another mode or settings).
        terms = session_settings.digest()
        inner = PassClient()
        advert = inner.advertise(
            AdvertiseRequest(
                request.session,
                request.index,
                request.node_id,
                request.num_classes,
                request.count_bound,
                terms,
                request.roster,
            ),
            counts,
            identity_key=identity_key,
            min_participants=settings.roster_floor,
            run_id=run_id,
        )
        fields = {item.name: getattr(inner.round, item.name) for item in dataclasses.fields(inner.round)}
        self._round = SparseAdvertised(**fields, **dataclasses.asdict(session_settings))
        return advert

    # Round 2: the draw -------------------------------------------------------
    def draw(self, request: DrawRequest | Mapping[str, Any], identity_key: Ed25519PrivateKey) -> OutNeighbourDraw:
        """Check ``U1`` and ``(k, t)``, draw ``k`` out-neighbours from the rest of ``U1``, and sign the draw."""
        request = DrawRequest.coerce(request)
        state = self._at(SparseAdvertised, "draw")
        if state.out_neighbours:
            raise PassError("this client already drew its out-neighbours in this session")
        participants = bitmap_array(request.participants)
        if not in_bitmap(request.participants, state.index):
            raise PassError("the participants do not include this client")
        if len(participants) < max(state.min_participants, MIN_PARTICIPANTS):
            raise PassError(
                f"this client needs at least {state.min_participants} participants, got {len(participants)}"
            )
        if len(request.node_ids) % 8:
            raise PassError("the roster's node ids must be whole big-endian uint64 words")
        node_ids = np.frombuffer(request.node_ids, dtype=">u8")
        if roster_fingerprint(state.run_id, state.session, node_ids) != state.roster:
            raise PassError("the roster's node ids do not match the roster fingerprint this client signed")
        if np.unique(node_ids).size != node_ids.size:
            raise PassError("a node id holds two roster slots: one colluder would count as several (refused)")
        if not 0 < state.index <= node_ids.size or int(node_ids[state.index - 1]) != state.node_id:
            raise PassError(f"the roster does not put this client's node id {state.node_id} at its index {state.index}")
        if int(participants[-1]) > node_ids.size:
            raise PassError("U1 names an index beyond the roster")
        wanted = state.settings.parameters(len(participants))
        if (request.degree, request.threshold) != (wanted.degree, wanted.threshold):
            raise PassError(
                f"(k, t) = ({request.degree}, {request.threshold}) is not the finder's ({wanted.degree}, "
                f"{wanted.threshold}) for the session's settings at |U1| = {len(participants)}: refused"
            )
        out = draw_out_neighbours(participants, state.index, wanted.degree, self._draw)
        binding = _binding(state, request.participants)
        signature = binding.sign_draw(identity_key, state.index, out, wanted.degree, wanted.threshold)
        self._round = dataclasses.replace(
            state,
            participants=request.participants,
            roster_node_ids=request.node_ids,
            degree=wanted.degree,
            threshold=wanted.threshold,
            in_degree_cap=wanted.in_degree_cap,
            out_neighbours=out,
        )
        return OutNeighbourDraw(list(out), signature)

    # Round 3: share keys -----------------------------------------------------
    def share_keys(
        self,
        request: SparseShareKeysRequest | Mapping[str, Any],
        directory: IdentityDirectory,
        identity_key: Ed25519PrivateKey,
    ) -> ShareKeysReply:
        """Check the draws and keys relayed, then deal each out-neighbour its encrypted, signed shares."""
        request = SparseShareKeysRequest.coerce(request)
        state = self._at(SparseAdvertised, "share_keys")
        if not state.out_neighbours:
            raise PassError("share_keys comes after this client's draw")
        if tuple(request.out_neighbours) != state.out_neighbours:
            raise PassError("the out-neighbours relayed are not the ones this client drew")
        columns = (
            request.neighbour_node_ids,
            request.cipher_public_keys,
            request.mask_public_keys,
            request.signatures,
            request.cipher_key_proofs,
        )
        in_columns = (request.in_draws, request.in_draw_signatures)
        if not strictly_increasing(request.in_neighbours) or any(
            len(c) != len(request.in_neighbours) for c in in_columns
        ):
            raise PassError("the in-neighbours must be ascending, one signed draw each")
        union = sorted(set(state.out_neighbours) | set(request.in_neighbours))
        if request.neighbours != union or any(len(column) != len(union) for column in columns):
            raise PassError("the neighbours relayed are not this client's out- and in-neighbours, one advert each")
        if len(request.in_neighbours) > state.in_degree_cap:
            raise PassError(
                f"{len(request.in_neighbours)} in-neighbours, above the in-degree cap {state.in_degree_cap}: refused"
            )
        members = bitmap_bits(state.participants)
        if any(not 0 < v <= members.size or not members[v - 1] or v == state.index for v in request.in_neighbours):
            raise PassError("the in-neighbours must be other members of U1")
        roster = np.frombuffer(state.roster_node_ids, dtype=">u8")
        if any(int(roster[v - 1]) != node for v, node in zip(union, request.neighbour_node_ids, strict=True)):
            raise PassError("a neighbour's node id is not the one the roster fingerprint puts at its index")
        node_of = dict(zip(request.neighbours, request.neighbour_node_ids, strict=True))
        _check_in_draws(state, request, directory, node_of)
        keys_request = ShareKeysRequest(  # the checks of PassClient's share keys, over every neighbour
            server_seed=b"",
            participants=state.participants,
            degree=state.degree,
            neighbours=request.neighbours,
            neighbour_node_ids=request.neighbour_node_ids,
            cipher_public_keys=request.cipher_public_keys,
            mask_public_keys=request.mask_public_keys,
            signatures=request.signatures,
            cipher_key_proofs=request.cipher_key_proofs,
        )
        pair_seeds, channel_secrets = check_neighbour_keys(state, keys_request, directory)
        secret_of = dict(zip(union, channel_secrets, strict=True))
        self_seed = scalar_to_bytes(random_scalar())
        key = int.from_bytes(mask_scalar(state.mask_private_key), "little")
        out = list(state.out_neighbours)
        rows = split_scalars([key, int.from_bytes(self_seed, "little")], out, state.threshold)
        ciphertexts, digests, signatures = [], [], []
        session, index = state.session, state.index
        for v, (key_share, seed_share) in zip(out, rows, strict=True):
            both = scalar_to_bytes(key_share) + scalar_to_bytes(seed_share)
            ciphertexts.append(seal(secret_of[v], session, index, v, both))
            digests.append(pair_digest(session, index, v, both))
            signatures.append(
                sign_share_ciphertext(
                    identity_key,
                    index,
                    v,
                    ciphertexts[-1],
                    digests[-1],
                    run_id=state.run_id,
                    session=session,
                    roster=state.roster,
                )
            )
        self._round = SparseShared(  # the mask key pair is dealt: it goes
            **_terms(state),
            counts=state.counts,
            cipher_private_key=state.cipher_private_key,
            cipher_public_key=state.cipher_public_key,
            self_seed=self_seed,
            degree=state.degree,
            participants=state.participants,
            neighbours=tuple(union),
            pair_seeds=tuple(pair_seeds),
            channel_secrets=tuple(channel_secrets),
            neighbour_cipher_keys=tuple(request.cipher_public_keys),
            neighbour_cipher_proofs=tuple(request.cipher_key_proofs),
            identity_keys=tuple(directory.key_of(n) for n in request.neighbour_node_ids),
            threshold=state.threshold,
            out_neighbours=state.out_neighbours,
            in_neighbours=tuple(request.in_neighbours),
        )
        return ShareKeysReply(out, ciphertexts, digests, state.threshold, signatures)

    # Round 4: masked input ---------------------------------------------------
    def mask_input(
        self,
        request: SparseMaskRequest | Mapping[str, Any],
        identity_key: Ed25519PrivateKey,
        noise: npt.ArrayLike | None = None,
    ) -> SparseMaskedInput:
        """Open the in-neighbours' shares, mask with the neighbours that completed key sharing, sign that list.

        A sender whose shares do not open is accused as in :meth:`.PassClient.mask_input` (with the channel secret
        and its proof, or ``b""`` if the ciphertext's signature fails) and masked without. Fewer than ``t``
        out-neighbours completed and not accused leave this client's secrets unrecoverable: it withdraws (with
        accusations) or refuses.
        """
        request = SparseMaskRequest.coerce(request)
        state = self._at(SparseShared, "mask_input")
        senders, completed = request.senders, request.completed
        if (
            not strictly_increasing(senders)
            or not set(senders) <= set(state.in_neighbours)
            or any(len(c) != len(senders) for c in (request.ciphertexts, request.share_digests, request.signatures))
        ):
            raise PassError("the senders must be distinct in-neighbours of this client, one signed ciphertext each")
        if not strictly_increasing(completed) or not set(completed) <= set(state.neighbours):
            raise PassError("the clients that completed key sharing must be neighbours of this client, ascending")
        position = {v: i for i, v in enumerate(state.neighbours)}
        held, held_from, accused, proofs = [], [], [], []
        for v, ciphertext, digest, signature in zip(
            senders, request.ciphertexts, request.share_digests, request.signatures, strict=True
        ):
            both = unseal(state.channel_secrets[position[v]], ciphertext, state.session, v, state.index, digest)
            if both is None:
                accused.append(v)
                forged = not signed_by(state, v, signature, ciphertext, digest)
                proofs.append(b"" if forged else prove_channel(state, v))
                continue
            held.append(both)
            held_from.append(v)
        masked_with = [v for v in completed if v not in set(accused)]
        holders = len(set(masked_with) & set(state.out_neighbours))
        if holders < state.threshold:
            if not accused:
                raise PassError(
                    f"only {holders} out-neighbours completed key sharing, the threshold is {state.threshold}"
                )
            self._round = Withdrawn(**_terms(state), accused=tuple(accused))
            return SparseMaskedInput(b"", b"", accused, proofs, [], b"")
        counts = np.frombuffer(state.counts, dtype="<u8").astype(np.uint64)
        masked = counts + expand_seed(state.self_seed, state.num_classes)
        if noise is not None:
            masked += noise_words(noise, state.num_classes)
        for v in masked_with:
            masked += signed_mask(state.pair_seeds[position[v]], state.index, v, state.num_classes)
        nonce = os.urandom(32)
        commitment = counts_commitment(state.session, state.index, counts, nonce)
        list_signature = _binding(state, state.participants).sign_masked_with(identity_key, state.index, masked_with)
        self._round = SparseMasked(  # the keys, the self-mask seed, the edges' secrets and the counts go
            **_terms(state),
            degree=state.degree,
            participants=state.participants,
            neighbours=state.neighbours,
            identity_keys=state.identity_keys,
            nonce=nonce,
            held_from=tuple(held_from),
            held_shares=tuple(held),
            accused=tuple(accused),
            threshold=state.threshold,
            out_neighbours=state.out_neighbours,
            completed=tuple(completed),
            masked_with=tuple(masked_with),
        )
        return SparseMaskedInput(
            masked.astype("<u8").tobytes(), commitment, accused, proofs, masked_with, list_signature
        )

    # Round 5: consistency ----------------------------------------------------
    def sign_survivors(
        self, request: ConsistencyRequest | Mapping[str, Any], identity_key: Ed25519PrivateKey
    ) -> ConsistencyReply:
        """Sign the survivor set shown, once, after the checks of :meth:`unmask` (rule 4)."""
        request = ConsistencyRequest.coerce(request)
        state = self._at(SparseMasked, "sign_survivors")
        if state.view_requested or state.unmask_requested:
            raise PassError("this client already signed a survivor set in this session")
        self._round = state = dataclasses.replace(state, view_requested=True)
        self._round, reply = sign_view(state, request, identity_key, _check_view)
        return reply

    # Round 6: unmask ---------------------------------------------------------
    def unmask(self, request: SparseUnmaskRequest | Mapping[str, Any]) -> UnmaskReply:
        """Answer the split this client signed, once, on ``t`` out-neighbours' signatures (rules 3 and 4)."""
        request = SparseUnmaskRequest.coerce(request)
        state = self._at(SparseMasked, "unmask")
        if state.unmask_requested:
            raise PassError("this client already received an unmask request in this session")
        self._round = state = dataclasses.replace(state, unmask_requested=True)  # answered or refused, once
        survivors = _check_view(state, request.survivors, request.dropped)
        dropped = bitmap_bits(request.dropped, survivors.size)
        check_signed_set(
            state, request, survivors, signers_from=state.out_neighbours, threshold=state.threshold, who="out-neighbour"
        )
        lists = _dealer_lists(state, request)
        reply = UnmaskReply([], [], [], [])
        own = set(state.masked_with)
        for v, both in zip(state.held_from, state.held_shares, strict=True):
            if survivors[v - 1]:
                if v in own and state.index in lists.get(v, ()):  # both signed lists name the edge
                    reply.survivor_indices.append(v)
                    reply.survivor_shares.append(both[SHARE_BYTES:])
            elif dropped[v - 1]:  # dropped in this view: no list needed
                reply.dropped_indices.append(v)
                reply.dropped_shares.append(both[:SHARE_BYTES])
        self._round = Unmasked(
            **_terms(state),
            participants=state.participants,
            nonce=state.nonce,
            transcript=survivor_transcript(state.session, np.flatnonzero(survivors) + 1),
            survivor_count=int(np.count_nonzero(survivors)),
            survivors=request.survivors,
        )
        return reply


def _terms(state: Joined) -> dict[str, Any]:
    return {item.name: getattr(state, item.name) for item in dataclasses.fields(Joined)}


def _binding(state: Joined, participants: bytes) -> SessionBinding:
    """What this client's sparse secure signatures bind: its run, session, roster fingerprint and ``U1``."""
    u1 = roster_digest(state.session, bitmap_array(participants))
    return SessionBinding(state.run_id, state.session, state.roster, u1)


def _check_in_draws(
    state: SparseAdvertised, request: SparseShareKeysRequest, directory: IdentityDirectory, node_of: dict[int, int]
) -> None:
    """Every in-neighbour's draw: ``k`` members of ``U1`` other than itself naming this client, signed by it under the
    same run, session, roster fingerprint, ``U1`` and ``(k, t)`` as this client's own (rule 1)."""
    binding = _binding(state, state.participants)
    members = bitmap_bits(state.participants)
    for v, packed, signature in zip(request.in_neighbours, request.in_draws, request.in_draw_signatures, strict=True):
        out = unpack_indices(packed)
        in_u1 = out[-1] <= members.size and bool(members[np.asarray(out) - 1].all()) if out else False
        in_u1 = in_u1 and v <= members.size and bool(members[v - 1])
        if len(out) != state.degree or state.index not in out or v in out or not in_u1:
            raise PassError(
                f"the draw relayed for in-neighbour {v} is not {state.degree} members of U1 naming this client"
            )
        try:
            binding.verify_draw(directory.key_of(node_of[v]), signature, v, out, state.degree, state.threshold)
        except (KeyError, ValueError) as error:
            raise PassError(f"in-neighbour {v} refused: {error}") from error


def _check_view(state: SparseMasked, survivors_bitmap: bytes, dropped_bitmap: bytes) -> npt.NDArray[np.bool_]:
    """``PassError`` unless the split is one this client can answer; return the survivor bits.

    The neighbours it lists as survivors or dropped are exactly those the server said completed key sharing; none it
    accused survives; at least ``t`` of its out-neighbours survive (its own secrets can be rebuilt).
    """
    size = 8 * max(len(survivors_bitmap), len(dropped_bitmap), len(state.participants))
    survivors, dropped = bitmap_bits(survivors_bitmap, size), bitmap_bits(dropped_bitmap, size)
    participants = bitmap_bits(state.participants, size)
    if bool(((survivors | dropped) & ~participants).any()) or bool((survivors & dropped).any()):
        raise PassError("survivors and dropped must be disjoint sets of participants")
    if not survivors[state.index - 1]:
        raise PassError("this client sent its masked input but is not listed as a survivor")
    if int(np.count_nonzero(survivors)) < MIN_PARTICIPANTS:
        raise PassError(f"only {int(np.count_nonzero(survivors))} survivors, PASS needs {MIN_PARTICIPANTS}")
    neighbours = np.asarray(state.neighbours, dtype=np.int64) - 1
    answered = {int(v) + 1 for v in neighbours[survivors[neighbours] | dropped[neighbours]]}
    if answered != set(state.completed):
        raise PassError("survivors and dropped do not match the neighbours that completed key sharing")
    if any(survivors[v - 1] for v in state.accused):
        raise PassError("a neighbour whose shares did not open here cannot be a survivor (no mask with it)")
    alive = sum(1 for v in state.out_neighbours if survivors[v - 1])
    if alive < state.threshold:
        raise PassError(f"only {alive} out-neighbours survived, the threshold is {state.threshold}")
    return survivors


def _dealer_lists(state: SparseMasked, request: SparseUnmaskRequest) -> dict[int, tuple[int, ...]]:
    """Each surviving dealer's masked-with list, its signature checked (rule 3); ``PassError`` on one that fails."""
    columns = (request.dealer_lists, request.dealer_list_signatures)
    if not strictly_increasing(request.dealers) or any(len(c) != len(request.dealers) for c in columns):
        raise PassError("the dealers' masked-with lists must be ascending, one signature each")
    held = set(state.held_from)
    binding = _binding(state, state.participants)
    position = {v: i for i, v in enumerate(state.neighbours)}
    lists = {}
    for v, packed, signature in zip(request.dealers, *columns, strict=True):
        if v not in held:
            raise PassError(f"a masked-with list of client {v}, whose shares this client does not hold")
        masked_with = unpack_indices(packed)
        try:
            binding.verify_masked_with(state.identity_keys[position[v]], signature, v, masked_with)
        except ValueError as error:
            raise PassError(f"the masked-with list of dealer {v} refused: {error}") from error
        lists[v] = masked_with
    return lists
