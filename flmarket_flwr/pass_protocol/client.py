"""PASS v2, the client's side: its rounds, :class:`PassClient`.

Each round reads the frozen record of what the rounds before it established and leaves the next one
(:mod:`.client_state`, which also turns a state into, and reads it back from, a ``ConfigRecord``-compatible record,
so that each round may run in a fresh process); the checks of a survivor set shown to the client are in
:mod:`.client_views`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from flmarket_flwr.pass_protocol.channel import (
    noise_words,
    possession_context,
    seal,
    signed_mask,
    unseal,
)
from flmarket_flwr.pass_protocol.client_keys import check_neighbour_keys, prove_channel, signed_by
from flmarket_flwr.pass_protocol.client_state import (
    Advertised,
    ClientRound,
    Fresh,
    Joined,
    Masked,
    SessionView,
    Shared,
    Stage,
    Unmasked,
    Withdrawn,
    read_state,
    require_stage,
)
from flmarket_flwr.pass_protocol.client_views import check_consistency, check_view, sign_view
from flmarket_flwr.pass_protocol.dleq import (
    mask_scalar,
    prove_possession,
)
from flmarket_flwr.pass_protocol.encoding import (
    MAX_PARTICIPANTS,
    SHARE_BYTES,
    PassError,
    bitmap_array,
    counts_commitment,
    in_bitmap,
    pair_digest,
    strictly_increasing,
    survivor_transcript,
)
from flmarket_flwr.pass_protocol.graph import (
    DEFAULT_BAD_FRACTION,
    DEFAULT_SECURITY_BITS,
    check_degree,
    commit_graph_seed,
    derive_graph_seed,
    neighbourhood_size,
    neighbours_of,
    roster_digest,
    secret_threshold,
    share_threshold,
)
from flmarket_flwr.pass_protocol.identity import (
    ROSTER_LENGTH,
    IdentityDirectory,
    sign_advertisement,
    sign_share_ciphertext,
)
from flmarket_flwr.pass_protocol.messages import (
    Advertisement,
    AdvertiseRequest,
    ConsistencyReply,
    ConsistencyRequest,
    MaskedInput,
    MaskRequest,
    ShareKeysReply,
    ShareKeysRequest,
    UnmaskReply,
    UnmaskRequest,
)
from flmarket_flwr.pass_protocol.primitives import (
    MIN_PARTICIPANTS,
    expand_seed,
    is_integer,
    validate_counts,
)
from flmarket_flwr.pass_protocol.shamir import random_scalar, scalar_to_bytes, split_scalars

__all__ = ["PassClient", "Stage"]

_Round = TypeVar("_Round", Advertised, Shared, Masked)


class PassClient(SessionView):
    """One client's side of PASS v2; all its state (keys included) is one round's record (:mod:`.client_state`).

    Parameters
    ----------
    record : mapping, optional
        A state from :meth:`to_record` (a fresh client if omitted).

    Rounds
    ------
    Rounds (:class:`PassClient` / :class:`~flmarket_flwr.pass_protocol.server.PassServer`; every message and the
    client state are ``ConfigRecord``-compatible records), each from the record the one before it left:

    1. advertise: the server assigns each client an index, a session id, ``C``, a declared count bound,
       its commitment to the graph seed and a roster fingerprint; each client makes an X25519 cipher key
       pair and mask key pair and returns the public keys (signed with its Ed25519 identity key if it has
       one, bound to its own run id, the session and the roster, :mod:`.identity`);
    2. share keys: the server opens the graph seed; each client checks its neighbourhood in the graph
       (:mod:`.graph`), Shamir-shares (:mod:`.shamir`, as scalars mod ``l``) its mask private key ``s_e`` and
       a fresh self-mask seed ``b_e`` among its ``k`` neighbours (threshold ``t = k // 2 + 1``, at most
       ``k - 1``), encrypted to each, with a digest of each share
       (:func:`~flmarket_flwr.pass_protocol.encoding.share_digest`; for the mask key its point ``sigma B``,
       which makes the dealing verifiable against the advertised key) that the receiver checks and the server
       keeps, so that a corrupted unmask share names the client that returned it and a mis-dealt mask key names
       its dealer before anyone unmasks; each ciphertext is encrypted under the edge's channel secret,
       ``X25519`` of the two cipher keys (and signed with the identity key, if any); the mask private key is
       then wiped;
    3. masked input: ``Y_e = N_e + PRG(b_e) + sum_v eps_{e,v} PRG(s_{e,v})`` over its neighbours that
       shared, and a commitment to ``N_e``; the cipher private key, the seeds, the edges' secrets and the counts
       are then wiped; a neighbour whose shares do not open is accused (masked without), with the channel
       secret and a proof of it (:mod:`.dleq`), and the server opens the ciphertext itself and names whichever
       of the two lied, with no extra round;
    4. consistency (only with identity keys): each survivor signs the survivor set it is shown, once;
    5. unmask: each survivor sends shares of ``b`` for surviving neighbours and of ``s`` for dropped ones,
       never both for one peer (with identity keys: only for the set it signed, on ``t`` valid signatures of
       its neighbours on that set); the server removes every mask and obtains ``N_s`` over the survivors.

    Arithmetic is in the ring ``Z_2^64`` (numpy ``uint64``, wrapping), where a mask that is uniform (given
    the PRG) hides a count completely and the sum is exact; counts are integers in ``[0, count_bound]``
    with ``count_bound * E < 2^63`` (:mod:`.primitives`: X25519, HKDF-SHA256 seeds bound to the session and
    the pair, ChaCha20 PRG).
    """

    def __init__(self, record: Mapping[str, Any] | None = None) -> None:
        self._round: ClientRound = read_state(record or {})

    @property
    def round(self) -> ClientRound:
        """This client's state: the record its last round left (secrets included; the rounds alone replace it)."""
        return self._round

    def _at(self, kind: type[_Round], step: str) -> _Round:
        """The state, or :class:`PassError` unless the client is at the stage of ``kind``."""
        return require_stage(self._round, kind, step)

    def advertise(
        self,
        request: AdvertiseRequest | Mapping[str, Any],
        counts: npt.ArrayLike,
        *,
        identity_key: Ed25519PrivateKey | None = None,
        security_bits: int = DEFAULT_SECURITY_BITS,
        bad_fraction: float = DEFAULT_BAD_FRACTION,
        min_participants: int = MIN_PARTICIPANTS,
        run_id: int = 0,
        complete_graph: bool = False,
        split_tolerance: int = 0,
    ) -> Advertisement:
        """Make the session's cipher and mask key pairs and return the public keys (signed if ``identity_key``).

        ``security_bits`` / ``bad_fraction`` are this client's own floor on the graph degree, and
        ``min_participants`` its floor on ``|U1|`` (from its config, not from the server): it later refuses a
        sparser graph than :func:`neighbourhood_size` gives, or a roster smaller than that floor (a malicious
        server could otherwise show a victim a roster of colluders only). ``run_id`` is the run this client
        is in, from its own runtime (Flower's ``context.run_id``), never from the server: the signature binds
        it with the session and the announced roster fingerprint. With ``complete_graph`` the client later
        refuses any graph but the complete one (``k = |U1| - 1``): the server assigns the indices, so on a
        sparse graph it can seat this client among ``t`` colluders; on the complete graph every participant
        is its neighbour, and its secrets need ``t`` colluders of all of them (at ``O(|U1|)`` work).
        ``split_tolerance`` is how many colluding neighbours its own secrets must withstand when a server
        splits the consistency round (:func:`~flmarket_flwr.pass_protocol.graph.secret_threshold`); it raises
        their Shamir threshold, and the client refuses a graph too sparse for it.
        """
        request = AdvertiseRequest.coerce(request)
        if not isinstance(self._round, Fresh):
            raise PassError(
                f"this client already advertised (session {(self.session or b'').hex()[:16]}): one PASS session per run"
            )
        if not request.session or not 1 <= request.count_bound or request.num_classes < 1:
            raise PassError("advertise request needs a session, num_classes >= 1 and count_bound >= 1")
        if len(request.graph_commitment) != 32 or not 0 < request.index <= MAX_PARTICIPANTS:
            raise PassError(
                f"advertise request needs a 32-byte graph commitment and an index in [1, {MAX_PARTICIPANTS}]"
            )
        if not is_integer(split_tolerance) or split_tolerance < 0:
            raise PassError(f"split_tolerance must be an integer >= 0, got {split_tolerance!r}")
        if not is_integer(min_participants):
            raise PassError(f"min_participants must be an integer, got {min_participants!r}")
        if len(request.roster) != ROSTER_LENGTH or not 0 <= run_id < 2**64:
            raise PassError(f"advertise request needs a {ROSTER_LENGTH}-byte roster fingerprint (and a valid run id)")
        values = validate_counts(counts)
        if values.shape != (request.num_classes,):
            raise PassError(f"counts have {values.size} classes, the session has {request.num_classes}")
        if int(values.max()) > request.count_bound:
            raise PassError(f"a class count {int(values.max())} exceeds the declared count_bound {request.count_bound}")
        cipher_key, mask_key = X25519PrivateKey.generate(), X25519PrivateKey.generate()
        cipher_public = cipher_key.public_key().public_bytes_raw()
        mask_public = mask_key.public_key().public_bytes_raw()
        possession = prove_possession(
            cipher_key.private_bytes_raw(),
            cipher_public,
            possession_context(run_id, request.session, request.index),
        )
        signature = b""
        if identity_key is not None:
            signature = sign_advertisement(
                identity_key,
                request.session,
                request.index,
                request.node_id,
                cipher_public,
                mask_public,
                run_id=run_id,
                roster=request.roster,
                mode=request.graph_commitment,
            )
        self._round = Advertised(
            session=request.session,
            index=request.index,
            node_id=request.node_id,
            run_id=int(run_id),
            roster=request.roster,
            num_classes=request.num_classes,
            count_bound=request.count_bound,
            graph_commitment=request.graph_commitment,
            counts=values.astype("<u8").tobytes(),
            cipher_private_key=cipher_key.private_bytes_raw(),
            cipher_public_key=cipher_public,
            mask_private_key=mask_key.private_bytes_raw(),
            mask_public_key=mask_public,
            min_security_bits=int(security_bits),
            max_bad_fraction_ppm=round(bad_fraction * 1_000_000),
            min_participants=max(int(min_participants), MIN_PARTICIPANTS),
            complete_graph=bool(complete_graph),
            split_tolerance=int(split_tolerance),
        )
        return Advertisement(cipher_public, mask_public, signature, possession)

    # Round 2 -----------------------------------------------------------------
    def share_keys(
        self,
        request: ShareKeysRequest | Mapping[str, Any],
        directory: IdentityDirectory | None = None,
        identity_key: Ed25519PrivateKey | None = None,
    ) -> ShareKeysReply:
        """Check the graph and the neighbours' keys, then send each neighbour its encrypted shares of ``s_e, b_e``.

        With ``directory`` every neighbour's advertisement must carry a valid signature for its node id, this
        run, this session and the roster this client was shown; the client then also requires the consistency
        round before it unmasks (:meth:`sign_survivors`, :meth:`unmask`). Each share pair is encrypted under
        the edge's channel secret (``X25519`` of the two cipher keys, one exchange per neighbour, kept until
        :meth:`mask_input` opens the neighbour's pair with it), and signed with ``identity_key`` if given.
        """
        request = ShareKeysRequest.coerce(request)
        state = self._at(Advertised, "share_keys")
        session, index = state.session, state.index
        if commit_graph_seed(request.server_seed) != state.graph_commitment:
            raise PassError("the server seed does not match the graph commitment")
        participants = bitmap_array(request.participants)
        if not in_bitmap(request.participants, index):
            raise PassError("the participants do not include this client")
        if len(participants) < state.min_participants:
            raise PassError(
                f"this client needs at least {state.min_participants} participants, got {len(participants)}"
            )
        k = request.degree
        try:
            check_degree(k, len(participants))
        except ValueError as error:
            raise PassError(str(error)) from error
        floor = neighbourhood_size(
            len(participants),
            security_bits=state.min_security_bits,
            bad_fraction=state.max_bad_fraction_ppm / 1_000_000,
        )
        if k < floor:
            raise PassError(f"degree {k} is below this client's floor {floor} for {len(participants)} participants")
        if state.complete_graph and k != len(participants) - 1:
            raise PassError(
                f"this client takes part only on the complete graph (degree {len(participants) - 1}), got {k}"
            )
        seed = derive_graph_seed(request.server_seed, roster_digest(session, participants))
        neighbours = list(neighbours_of(seed, participants, k, index))
        columns = (
            request.neighbour_node_ids,
            request.cipher_public_keys,
            request.mask_public_keys,
            request.signatures,
            request.cipher_key_proofs,
        )
        if request.neighbours != neighbours or any(len(column) != k for column in columns):
            raise PassError("the neighbours sent are not this client's neighbourhood in the committed graph")
        try:
            threshold = secret_threshold(k, state.split_tolerance)
        except ValueError as error:
            raise PassError(str(error)) from error
        pair_seeds, channel_secrets = check_neighbour_keys(state, request, directory)
        self_seed = scalar_to_bytes(random_scalar())
        key = int.from_bytes(mask_scalar(state.mask_private_key), "little")
        rows = split_scalars([key, int.from_bytes(self_seed, "little")], neighbours, threshold)
        ciphertexts, digests, signatures = [], [], []
        for v, secret, (key_share, seed_share) in zip(neighbours, channel_secrets, rows, strict=True):
            both = scalar_to_bytes(key_share) + scalar_to_bytes(seed_share)
            ciphertexts.append(seal(secret, session, index, v, both))
            digests.append(pair_digest(session, index, v, both))
            if identity_key is not None:
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
        identity_keys = () if directory is None else tuple(directory.key_of(n) for n in request.neighbour_node_ids)
        self._round = Shared(  # the mask key pair is dealt: it goes
            **_terms(state),
            counts=state.counts,
            cipher_private_key=state.cipher_private_key,
            cipher_public_key=state.cipher_public_key,
            self_seed=self_seed,
            degree=k,
            participants=request.participants,
            neighbours=tuple(neighbours),
            pair_seeds=tuple(pair_seeds),
            channel_secrets=tuple(channel_secrets),
            neighbour_cipher_keys=tuple(request.cipher_public_keys),
            neighbour_cipher_proofs=tuple(request.cipher_key_proofs),
            identity_keys=identity_keys,  # with a directory: for the consistency round
        )
        return ShareKeysReply(
            receivers=neighbours,
            ciphertexts=ciphertexts,
            share_digests=digests,
            threshold=threshold,
            signatures=signatures,
        )

    # Round 3 -----------------------------------------------------------------
    def mask_input(
        self,
        request: MaskRequest | Mapping[str, Any],
        noise: npt.ArrayLike | None = None,
    ) -> MaskedInput:
        """Open the shares held for neighbours in U2 and return ``Y_e``, the counts commitment and any accusations.

        A neighbour whose shares do not open (:func:`unseal`) is accused, not fatal: this client masks without
        it and holds nothing for it, and sends the edge's channel secret with a proof that it is the one
        behind the two advertised cipher keys (:func:`~flmarket_flwr.pass_protocol.dleq.prove_exchange`), so
        the server opens the ciphertext it relayed exactly as this client did and names whoever lied. The
        secret opens that edge's two share pairs, both of which the accused holds anyway. With identity keys a
        ciphertext must carry its sender's signature, checked only for one that does not open (a ciphertext
        that opens under the edge's secret and matches its digest came from the sender: the server knows
        neither key); an unsigned one is accused without a secret (the server's own copy decides), so a server
        that forges a ciphertext learns nothing from the accusation.
        Afterwards the client's own private keys, self-mask seed, channel secrets and counts are wiped from the state.

        When fewer than ``t`` senders' shares open because some were accused, the client withdraws instead of
        masking with too few neighbours: it sends its accusations alone (empty ``masked_counts`` and
        ``counts_commitment``), so that ``k - t + 1`` colluders who garble their shares to one client get
        themselves named rather than it silently refused; the server treats it as dropped. With fewer than
        ``t`` and no one to accuse it raises :class:`PassError`.

        ``noise`` (signed integers, one per class; :mod:`~flmarket_flwr.pass_protocol.noise`) is added to the
        counts inside ``Y_e`` (mod 2^64) and kept nowhere; the counts commitment binds the exact counts.
        """
        request = MaskRequest.coerce(request)
        state = self._at(Shared, "mask_input")
        session, index, neighbours = state.session, state.index, state.neighbours
        senders = request.senders
        threshold = share_threshold(state.degree)
        signed = bool(state.identity_keys)
        if (
            not strictly_increasing(senders)
            or not set(senders) <= set(neighbours)
            or len(senders) != len(request.ciphertexts)
            or len(senders) != len(request.share_digests)
            or len(request.signatures) != (len(senders) if signed else len(request.signatures))
        ):
            raise PassError("the senders must be distinct neighbours of this client, one ciphertext and digest each")
        position = {v: i for i, v in enumerate(neighbours)}
        held, held_from, accused, proofs = [], [], [], []
        for i, (v, ciphertext) in enumerate(zip(senders, request.ciphertexts, strict=True)):
            digest = request.share_digests[i]
            both = unseal(state.channel_secrets[position[v]], ciphertext, session, v, index, digest)
            if both is None:  # the sender's signature matters only now: an accusation reveals the edge's secret
                accused.append(v)
                forged = signed and not signed_by(state, v, request.signatures[i], ciphertext, digest)
                proofs.append(b"" if forged else prove_channel(state, v))
                continue
            held.append(both)
            held_from.append(v)
        if len(held_from) < threshold:
            if not accused:  # too few senders, and none to blame: the server knows who sent nothing
                raise PassError(f"only {len(held_from)} neighbours' shares opened here, the threshold is {threshold}")
            self._round = Withdrawn(**_terms(state), accused=tuple(accused))  # no masked input, accusations only
            return MaskedInput(b"", b"", accused, proofs)
        num_classes = state.num_classes
        counts = np.frombuffer(state.counts, dtype="<u8").astype(np.uint64)
        masked = counts + expand_seed(state.self_seed, num_classes)
        if noise is not None:  # distributed DP: signed noise wraps mod 2^64 and is decoded signed by the server
            masked += noise_words(noise, num_classes)
        for v in held_from:
            masked += signed_mask(state.pair_seeds[position[v]], index, v, num_classes)
        nonce = os.urandom(32)
        commitment = counts_commitment(session, index, counts, nonce)
        self._round = Masked(  # the keys, the self-mask seed, the edges' secrets and the counts go
            **_terms(state),
            degree=state.degree,
            participants=state.participants,
            neighbours=state.neighbours,
            identity_keys=state.identity_keys,
            nonce=nonce,
            held_from=tuple(held_from),
            held_shares=tuple(held),
            accused=tuple(accused),
        )
        return MaskedInput(masked.astype("<u8").tobytes(), commitment, accused, proofs)

    def _prove_channel(self, accused: int) -> bytes:
        """:func:`~.client_keys.prove_channel` of this client's state (at masked input)."""
        return prove_channel(self._at(Shared, "an accusation"), accused)

    # Consistency round (with identity keys) ------------------------------------
    def sign_survivors(
        self, request: ConsistencyRequest | Mapping[str, Any], identity_key: Ed25519PrivateKey | None
    ) -> ConsistencyReply:
        """Sign the survivor set the server shows, once, after the same checks as :meth:`unmask`.

        The signature binds the run, the session, the roster fingerprint, ``U1`` and the set; the client
        keeps the set and later unmasks only for exactly that set (Bonawitz et al. 2017's consistency check).
        """
        request = ConsistencyRequest.coerce(request)
        state = self._at(Masked, "sign_survivors")
        if state.view_requested or state.unmask_requested:
            raise PassError("this client already signed a survivor set in this session")
        self._round = state = dataclasses.replace(state, view_requested=True)  # answered or refused, once
        if identity_key is None:
            raise PassError("this client has no identity key to sign a survivor set with")
        self._round, reply = sign_view(state, request, identity_key, check_view)
        return reply

    # Round 4 -----------------------------------------------------------------
    def unmask(self, request: UnmaskRequest | Mapping[str, Any]) -> UnmaskReply:
        """Answer the server's survivor/dropout split once: ``b`` shares of survivors, ``s`` shares of dropped.

        Any request after the first (answered or refused) is refused. With identity keys (a directory at
        :meth:`share_keys`) the split must be the one this client signed in the consistency round, and carry
        valid signatures on it from at least ``t`` of its neighbours.
        """
        request = UnmaskRequest.coerce(request)
        if self.unmask_requested:
            raise PassError("this client already received an unmask request in this session")
        state = self._at(Masked, "unmask")
        self._round = state = dataclasses.replace(state, unmask_requested=True)  # answered or refused, once
        survivors = check_view(state, request.survivors, request.dropped)
        if state.identity_keys:
            check_consistency(state, request, survivors)
        reply = UnmaskReply([], [], [], [])
        for v, both in zip(state.held_from, state.held_shares, strict=True):
            if survivors[v - 1]:
                reply.survivor_indices.append(v)
                reply.survivor_shares.append(both[SHARE_BYTES:])  # share of b_v
            else:
                reply.dropped_indices.append(v)
                reply.dropped_shares.append(both[:SHARE_BYTES])  # share of s_v
        self._round = Unmasked(  # the held shares go
            **_terms(state),
            participants=state.participants,
            nonce=state.nonce,
            transcript=survivor_transcript(state.session, np.flatnonzero(survivors) + 1),
            survivor_count=int(np.count_nonzero(survivors)),
            survivors=request.survivors,
        )
        return reply


def _terms(state: Joined) -> dict[str, Any]:
    """The session's terms as ``state`` holds them, for the next round's record (:class:`~.client_state.Joined`)."""
    return {item.name: getattr(state, item.name) for item in dataclasses.fields(Joined)}
