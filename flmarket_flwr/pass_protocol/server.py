"""PASS v2, the server's side: :class:`PassServer` builds each round's requests and rebuilds ``N_s``.

It takes and returns messages keyed by PASS index and never touches a Flower message (the glue in
:mod:`flmarket_flwr.market.buyer.pass_rounds` does); a bad reply excludes its client, and only a session that can no
longer finish safely raises :class:`~flmarket_flwr.pass_protocol.encoding.PassError`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from flmarket_flwr.pass_protocol.blame import forged_share, judge_accusation
from flmarket_flwr.pass_protocol.channel import CIPHERTEXT_BYTES, possession_context
from flmarket_flwr.pass_protocol.dleq import edwards_lift, montgomery_u, verify_possession
from flmarket_flwr.pass_protocol.encoding import (
    MAX_PARTICIPANTS,
    SHARE_BYTES,
    PassError,
    indices_to_bitmap,
    roster_fingerprint,
    strictly_increasing,
    survivor_transcript,
)
from flmarket_flwr.pass_protocol.graph import (
    DEFAULT_BAD_FRACTION,
    DEFAULT_SECURITY_BITS,
    GRAPH_SEED_LENGTH,
    commit_graph_seed,
    derive_graph_seed,
    mask_graph,
    max_secret_threshold,
    neighbourhood_size,
    roster_digest,
    share_threshold,
)
from flmarket_flwr.pass_protocol.identity import IdentityDirectory, verify_advertisement, verify_survivor_set
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
from flmarket_flwr.pass_protocol.primitives import COUNT_LIMIT, MIN_PARTICIPANTS, load_public_key, ring_sum
from flmarket_flwr.pass_protocol.reconstruction import check_recoverable, misdealt_dealer, unmasked_sum
from flmarket_flwr.pass_protocol.server_state import ServerState, Step


class PassServer:
    """The server's side of PASS v2: builds each round's per-client requests and reconstructs ``N_s``.

    Every method takes and returns dicts keyed by PASS index (``node_of`` / ``index_of`` map to Flower node
    ids). A client whose reply is missing or invalid leaves the protocol at that round (reason in
    ``excluded``); the server never crashes on a bad reply and raises :class:`PassError` only when the
    session as a whole can no longer finish safely. Memory is ``O(E k)``: per-edge ciphertexts and shares.

    One session, driven by the glue (send each request's ``to_record()``, pass the replies back keyed by index;
    a missing reply is a dropout)::

        requests = server.advertise_requests(node_ids)           # -> client.advertise(request, counts)
        requests = server.receive_advertisements(replies)        # -> client.share_keys(request, directory)
        requests = server.receive_shares(replies)                # -> client.mask_input(request)
        requests = server.receive_masked(replies)                # -> client.unmask(request)
        server.receive_unmask(replies)

    Accusations ride in the masked inputs and are judged inside ``receive_masked`` (no extra round).

    With a ``directory`` the server runs the consistency round between the last two steps::

        requests = server.receive_masked(replies)                # -> client.sign_survivors(request, key)
        requests = server.receive_signatures(replies)            # -> client.unmask(request)
        label_counts = server.finish()

    Parameters
    ----------
    session : bytes
        Unique identifier of this PASS session (one per run).
    num_classes : int
        ``C``.
    count_bound : int
        Declared maximum count of any class at any client; the sum is refused above ``count_bound * |U3|``.
    degree : int, optional
        Graph degree ``k``; default :func:`neighbourhood_size` of ``|U1|`` (clients refuse a smaller one).
    security_bits, bad_fraction
        Parameters of :func:`neighbourhood_size` (the clients must use the same or weaker ones).
    directory : IdentityDirectory, optional
        Verify advertisement signatures (clients with a directory check them again themselves), and run the
        consistency round: survivors sign the set they were shown, and each gets its neighbours' signatures.
    server_seed : bytes, optional
        32-byte graph seed (random by default; only for tests).
    run_id : int (default: 0)
        The Flower run id, bound into every signature (the clients use their own).

    Notes
    -----
    What the server can and cannot learn, honest or deviating, with the test behind each claim, is in
    docs/threat-model.md ("PASS in brief" and the tables after it).
    """

    def __init__(
        self,
        session: bytes,
        num_classes: int,
        count_bound: int,
        *,
        degree: int | None = None,
        security_bits: int = DEFAULT_SECURITY_BITS,
        bad_fraction: float = DEFAULT_BAD_FRACTION,
        directory: IdentityDirectory | None = None,
        server_seed: bytes | None = None,
        run_id: int = 0,
    ) -> None:
        if not isinstance(session, bytes) or not session:
            raise ValueError("session must be non-empty bytes")
        if num_classes < 1 or count_bound < 1:
            raise ValueError("num_classes and count_bound must be >= 1")
        self.session, self.num_classes, self.count_bound = session, num_classes, count_bound
        self._degree_override, self._security_bits, self._bad_fraction = degree, security_bits, bad_fraction
        self.directory = directory
        self.run_id = int(run_id)
        self._server_seed = server_seed if server_seed is not None else os.urandom(GRAPH_SEED_LENGTH)
        self.graph_commitment = commit_graph_seed(self._server_seed)
        self.noise_slack = 0
        """Noise allowed beyond ``[0, count_bound * |U3|]`` in a class of the sum (0: the clients add none)."""
        self.state = ServerState(masked_sum=np.zeros(num_classes, dtype=np.uint64))
        """What this session has gathered so far (read it; the rounds alone change it)."""

    def _advance(self, step: Step, name: str) -> None:
        """Move past ``step``, or :class:`PassError` if the session is not there."""
        if self.state.step != step:
            raise PassError(f"{name} called out of order (step {int(self.state.step)}, expected {int(step)})")
        self.state.step = Step(step + 1)

    def _exclude(self, index: int, reason: str) -> None:
        self.state.excluded.setdefault(index, reason)

    # Round 1 -----------------------------------------------------------------
    def advertise_requests(self, node_ids: Sequence[int]) -> dict[int, AdvertiseRequest]:
        """Assign indices ``1..E`` to ``node_ids`` (in the given order) and build the advertise requests."""
        self._advance(Step.ADVERTISE, "advertise_requests")
        if len(set(node_ids)) != len(node_ids):
            raise ValueError("node ids must be distinct")
        if not MIN_PARTICIPANTS <= len(node_ids) <= MAX_PARTICIPANTS:
            raise PassError(f"PASS v2 needs {MIN_PARTICIPANTS} to {MAX_PARTICIPANTS} clients, got {len(node_ids)}")
        if self.count_bound * len(node_ids) >= COUNT_LIMIT:
            raise ValueError(f"count_bound * E must be < 2**63, got {self.count_bound} * {len(node_ids)}")
        self.state.node_of = {i + 1: int(node) for i, node in enumerate(node_ids)}
        self.state.index_of = {node: index for index, node in self.state.node_of.items()}
        self.state.roster = roster_fingerprint(self.run_id, self.session, list(node_ids))
        return {
            index: AdvertiseRequest(
                self.session, index, node, self.num_classes, self.count_bound, self.graph_commitment, self.state.roster
            )
            for index, node in self.state.node_of.items()
        }

    def _degree_for(self, size: int) -> int:
        if self._degree_override is None:
            return neighbourhood_size(size, security_bits=self._security_bits, bad_fraction=self._bad_fraction)
        k = min(self._degree_override, size - 1)
        return k + 1 if k < size - 1 and k % 2 else k

    def _valid_advert(self, index: int, reply: Any) -> Advertisement | None:
        try:
            advert = Advertisement.coerce(reply)
            load_public_key(advert.cipher_public_key, index)
            load_public_key(advert.mask_public_key, index)
            if self.directory is not None:
                node = self.state.node_of[index]
                verify_advertisement(
                    self.directory.key_of(node),
                    advert.signature,
                    self.session,
                    index,
                    node,
                    advert.cipher_public_key,
                    advert.mask_public_key,
                    run_id=self.run_id,
                    roster=self.state.roster,
                    mode=self.graph_commitment,
                )
            possession = possession_context(self.run_id, self.session, index)
            if not verify_possession(advert.cipher_public_key, advert.cipher_key_proof, possession):
                raise ValueError("its cipher key comes without a valid proof of possession")
            if edwards_lift(advert.mask_public_key) is None:  # its dealing is checked against this point
                raise ValueError("its mask key is not a point of the prime-order subgroup")
        except (TypeError, ValueError) as error:
            self._exclude(index, f"advertisement refused: {error}")
            return None
        return advert

    def receive_advertisements(
        self, replies: Mapping[int, Advertisement | Mapping[str, Any]]
    ) -> dict[int, ShareKeysRequest]:
        """Validate the adverts (U1), open the graph seed, and build each client's share-keys request."""
        self._advance(Step.ADVERTISEMENTS, "receive_advertisements")
        adverts = self._valid_adverts(replies)
        self.state.degree = self._degree_for(len(adverts))
        self.state.threshold = share_threshold(self.state.degree)
        participants = sorted(adverts)
        seed = derive_graph_seed(self._server_seed, roster_digest(self.session, participants))
        self.state.graph = mask_graph(seed, participants, self.state.degree)
        requests, roster = {}, indices_to_bitmap(participants)
        self.state.participants = roster
        for u in participants:
            neighbours = list(self.state.graph[u])
            requests[u] = ShareKeysRequest(
                server_seed=self._server_seed,
                participants=roster,
                degree=self.state.degree,
                neighbours=neighbours,
                neighbour_node_ids=[self.state.node_of[v] for v in neighbours],
                cipher_public_keys=[adverts[v].cipher_public_key for v in neighbours],
                mask_public_keys=[adverts[v].mask_public_key for v in neighbours],
                signatures=[adverts[v].signature for v in neighbours],
                cipher_key_proofs=[adverts[v].cipher_key_proof for v in neighbours],
            )
        return requests

    def _valid_adverts(self, replies: Mapping[int, Advertisement | Mapping[str, Any]]) -> dict[int, Advertisement]:
        """U1: the valid adverts whose keys no other advert reuses (the others excluded, named); kept in the state.

        Raises
        ------
        PassError
            Fewer than :data:`~.primitives.MIN_PARTICIPANTS` remain.
        """
        adverts = {i: a for i, r in replies.items() if i in self.state.node_of and (a := self._valid_advert(i, r))}
        owners: dict[int, list[int]] = {}
        for i, advert in adverts.items():
            for key in {montgomery_u(advert.cipher_public_key), montgomery_u(advert.mask_public_key)}:
                owners.setdefault(key, []).append(i)
            if montgomery_u(advert.cipher_public_key) == montgomery_u(advert.mask_public_key):
                owners.setdefault(-1, []).extend([i, i])
        for clash in (group for group in owners.values() if len(group) > 1):
            for i in clash:
                self._exclude(i, "advertisement reuses a public key")
                adverts.pop(i, None)
        for i in self.state.node_of:
            if i not in adverts:
                self._exclude(i, "no advertisement")
        participants = sorted(adverts)
        if len(participants) < MIN_PARTICIPANTS:
            raise PassError(f"only {len(participants)} clients advertised valid keys, PASS needs {MIN_PARTICIPANTS}")
        self.state.adverts = adverts
        return adverts

    def _dealers_of(self, holder: int) -> set[int]:
        """The clients whose shares ``holder`` may hold: its neighbours, or on the sparse secure mode's directed
        graph its in-neighbours (:mod:`.sparse_server`)."""
        if self.state.in_graph:
            return set(self.state.in_graph.get(holder, ()))
        return set(self.state.graph[holder])

    # Round 2 -----------------------------------------------------------------
    def receive_shares(self, replies: Mapping[int, ShareKeysReply | Mapping[str, Any]]) -> dict[int, MaskRequest]:
        """Keep the clients that sent one well-formed ciphertext per neighbour (U2); route the ciphertexts."""
        self._advance(Step.SHARES, "receive_shares")
        sent: dict[int, ShareKeysReply] = {}
        for u, reply in replies.items():
            if u not in self.state.graph:
                continue
            try:
                reply = ShareKeysReply.coerce(reply)
            except PassError as error:
                self._exclude(u, str(error))
                continue
            if (
                reply.receivers != list(self.state.graph[u])
                or len(reply.ciphertexts) != len(reply.receivers)
                or len(reply.share_digests) != len(reply.receivers)
                or any(len(c) != CIPHERTEXT_BYTES for c in reply.ciphertexts)
                or any(len(d) != 64 for d in reply.share_digests)
                or len(reply.signatures) not in {len(reply.receivers), 0 if self.directory is None else -1}
            ):
                self._exclude(u, "share-keys reply does not hold one ciphertext and one digest per neighbour")
                continue
            if not self.state.threshold <= reply.threshold <= max_secret_threshold(self.state.degree):
                self._exclude(
                    u,
                    f"its announced threshold {reply.threshold} is outside [{self.state.threshold}, "
                    f"{max_secret_threshold(self.state.degree)}]: its secrets would not survive one receiver's loss",
                )
                continue
            sent[u] = reply
            self.state.thresholds[u] = reply.threshold
        for u in self.state.graph:
            if u not in sent:
                self._exclude(u, "no share-keys reply")
        self.state.u2 = sorted(sent)
        if len(self.state.u2) < MIN_PARTICIPANTS:
            raise PassError(f"only {len(self.state.u2)} clients shared their keys, PASS needs {MIN_PARTICIPANTS}")
        inbox: dict[int, MaskRequest] = {u: MaskRequest([], [], [], []) for u in self.state.u2}
        for u in self.state.u2:  # senders in increasing order, so each inbox is sorted
            signatures = sent[u].signatures or [b""] * len(sent[u].receivers)
            for v, ciphertext, digest, signature in zip(
                sent[u].receivers, sent[u].ciphertexts, sent[u].share_digests, signatures, strict=True
            ):
                if v in inbox:
                    inbox[v].senders.append(u)
                    inbox[v].ciphertexts.append(ciphertext)
                    inbox[v].share_digests.append(digest)
                    inbox[v].signatures.append(signature)  # b"" if unsigned: a client with a directory complains
                    self.state.digests[u, v] = digest
                    self.state.ciphertexts[u, v] = (ciphertext, signature)
        return inbox

    # Round 3 -----------------------------------------------------------------
    def receive_masked(
        self, replies: Mapping[int, MaskedInput | Mapping[str, Any]]
    ) -> dict[int, UnmaskRequest] | dict[int, ConsistencyRequest]:
        """Keep the masked inputs (U3), judge their accusations, and go on if every needed secret can be rebuilt.

        Returns the unmask requests, or with a directory the consistency-round requests (the survivor set
        to sign, for :meth:`receive_signatures`). Each accusation is settled here from the evidence it carries
        (:meth:`_judge`): blame costs no extra round, and the accused need not be online.
        """
        self._advance(Step.MASKED, "receive_masked")
        u2 = set(self.state.u2)
        withdrawals: list[int] = []
        for u, reply in replies.items():
            if u not in u2:
                continue
            try:
                reply = MaskedInput.coerce(reply)
            except PassError as error:
                self._exclude(u, str(error))
                continue
            withdrawn = reply.masked_counts == reply.counts_commitment == b"" and bool(reply.accused)
            if not withdrawn and (
                len(reply.masked_counts) != 8 * self.num_classes or len(reply.counts_commitment) != 32
            ):
                self._exclude(u, "masked input has the wrong size")
                continue
            senders = {v for v in self._dealers_of(u) if (v, u) in self.state.ciphertexts}
            if (
                not strictly_increasing(reply.accused)
                or not set(reply.accused) <= senders
                or len(reply.proofs) != len(reply.accused)
            ):
                self._exclude(u, "masked input accuses clients that sent it no shares")
                continue
            if withdrawn:
                withdrawals.append(u)
            else:
                self.state.masked[u] = reply
            for v, proof in zip(reply.accused, reply.proofs, strict=True):
                self.state.accusations[u, v] = proof
        for (u, v), proof in sorted(self.state.accusations.items()):
            self._judge(u, v, proof)
        for u in withdrawals:  # after the judging: a false accuser is named for that, not for withdrawing
            self._exclude(u, f"withdrew: fewer than {self.state.threshold} neighbours' shares opened at it")
            culprits = self.state.culprits
            if u not in culprits and all(v in culprits for (w, v) in self.state.accusations if w == u):
                self.state.wronged.add(u)
        return self._close_inputs()

    def _judge(self, accuser: int, accused: int, proof: bytes) -> None:
        """Name whichever of ``accuser`` and ``accused`` deviated (:func:`~.blame.judge_accusation`); it leaves
        PASS (its masked input is unused)."""
        if accused in self.state.culprits:
            return  # already named: its masked input is out either way
        # An accuser named for another accusation is still heard: its proof is evidence whoever gives it.
        ciphertext, signature = self.state.ciphertexts[accused, accuser]
        directory = self.directory
        culprit, reason = judge_accusation(
            accuser,
            accused,
            proof,
            ciphertext=ciphertext,
            signature=signature,
            digest=self.state.digests[accused, accuser],
            accuser_cipher_key=self.state.adverts[accuser].cipher_public_key,
            accused_cipher_key=self.state.adverts[accused].cipher_public_key,
            accused_identity_key=None if directory is None else directory.key_of(self.state.node_of[accused]),
            session=self.session,
            run_id=self.run_id,
            roster=self.state.roster,
        )
        self._blame(culprit, reason)

    def _blame(self, index: int, reason: str) -> None:
        """Name ``index`` as one who deviated: it leaves PASS (its masked input is not used), and the reason
        replaces any earlier one (a convicted dealer may have been excluded as a mere dropout first)."""
        self.state.culprits.add(index)
        self.state.excluded[index] = reason

    # What the session produced, for the glue ---------------------------------
    @property
    def roster(self) -> bytes:
        """The roster fingerprint every advert binds (after :meth:`advertise_requests`)."""
        return self.state.roster

    @property
    def node_of(self) -> dict[int, int]:
        """PASS index -> Flower node id."""
        return self.state.node_of

    @property
    def index_of(self) -> dict[int, int]:
        """Flower node id -> PASS index."""
        return self.state.index_of

    @property
    def excluded(self) -> dict[int, str]:
        """Each client that left the protocol, and why."""
        return self.state.excluded

    @property
    def adverts(self) -> dict[int, Advertisement]:
        """The valid advertisements (U1)."""
        return self.state.adverts

    @property
    def graph(self) -> dict[int, tuple[int, ...]]:
        """Each participant's neighbours in the mask graph."""
        return self.state.graph

    @property
    def degree(self) -> int:
        """The graph degree ``k``."""
        return self.state.degree

    @property
    def threshold(self) -> int:
        """The session's Shamir threshold ``t``."""
        return self.state.threshold

    @property
    def u2(self) -> list[int]:
        """The clients that shared their keys."""
        return self.state.u2

    @property
    def survivors(self) -> list[int]:
        """U3: the clients whose masked inputs are in the sum."""
        return self.state.survivors

    @property
    def dropped(self) -> list[int]:
        """U2 less U3."""
        return self.state.dropped

    @property
    def commitments(self) -> dict[int, bytes]:
        """Each survivor's counts commitment."""
        return self.state.commitments

    @property
    def transcript(self) -> bytes:
        """``survivor_transcript`` of U3."""
        return self.state.transcript

    @property
    def culprits(self) -> frozenset[int]:
        """The clients named for a deviation (garbage or mis-dealt shares, a false accusation)."""
        return frozenset(self.state.culprits)

    @property
    def wronged(self) -> frozenset[int]:
        """Clients that withdrew only because senders convicted of garbage shares left them short of ``t``:
        excluded from this session through no fault of their own (a fresh session may take them back)."""
        return frozenset(self.state.wronged)

    def _close_inputs(self) -> dict[int, UnmaskRequest] | dict[int, ConsistencyRequest]:
        """Fix U3 (masked inputs less the named culprits) and build the next round's requests."""
        masked = {u: reply for u, reply in self.state.masked.items() if u not in self.state.culprits}
        self.state.survivors = sorted(masked)
        self.state.dropped = sorted(set(self.state.u2) - set(masked))
        for d in self.state.dropped:
            self._exclude(d, "no masked input")
        # An accuser that is still in masked without its accused: that edge carries no mask and no shares.
        self.state.cut = {(u, v) for (u, v) in self.state.accusations if u in masked}
        check_recoverable(self.state)
        self._check_dealing()
        vectors = np.stack([np.frombuffer(masked[u].masked_counts, dtype="<u8") for u in self.state.survivors])
        self.state.masked_sum = ring_sum(vectors.astype(np.uint64))
        self.state.commitments = {u: masked[u].counts_commitment for u in self.state.survivors}
        self.state.transcript = survivor_transcript(self.session, self.state.survivors)
        request = UnmaskRequest.of(self.state.survivors, self.state.dropped)
        if self.directory is not None:
            self.state.awaiting_signatures = True
            view = ConsistencyRequest(request.survivors, request.dropped)
            return {u: view for u in self.state.survivors}
        return {u: request for u in self.state.survivors}

    # Consistency round -------------------------------------------------------
    def receive_signatures(
        self, replies: Mapping[int, ConsistencyReply | Mapping[str, Any]]
    ) -> dict[int, UnmaskRequest]:
        """Check each survivor's signature on the set; send each signer the valid signatures of its neighbours.

        A survivor whose signature is missing or does not verify under its directory key is excluded (it
        is not asked to unmask; its masked input stays in the sum). A signer with fewer than ``t`` signing
        neighbours will refuse to unmask; :meth:`finish` then tells whether enough shares came back.
        """
        if self.state.step != Step.UNMASK or not self.state.awaiting_signatures:
            raise PassError("receive_signatures called out of order (it follows receive_masked with a directory)")
        self.state.awaiting_signatures = False
        directory = self.directory
        if directory is None:
            raise PassError("the consistency round needs the identity directory")
        view = UnmaskRequest.of(self.state.survivors, self.state.dropped)
        signed: dict[int, bytes] = {}
        for u in self.state.survivors:
            reply = replies.get(u)
            if reply is None:
                self._exclude(u, "no signature on the survivor set")
                continue
            try:
                signature = ConsistencyReply.coerce(reply).signature
                verify_survivor_set(
                    directory.key_of(self.state.node_of[u]),
                    signature,
                    view.survivors,
                    view.dropped,
                    run_id=self.run_id,
                    session=self.session,
                    roster=self.state.roster,
                    participants=self.state.participants,
                )
            except ValueError as error:  # PassError is a ValueError
                self._exclude(u, f"survivor-set signature refused: {error}")
                continue
            signed[u] = signature
        if len(signed) < MIN_PARTICIPANTS:
            raise PassError(f"only {len(signed)} survivors signed the survivor set, PASS needs {MIN_PARTICIPANTS}")
        requests = {}
        for u in sorted(signed):
            signers = [v for v in self.state.graph[u] if v in signed]
            requests[u] = dataclasses.replace(view, signers=signers, signatures=[signed[v] for v in signers])
        return requests

    def _check_dealing(self) -> None:
        """``PassError`` naming a dropped dealer whose mask-key shares do not rebuild its advertised mask key
        (:func:`~.reconstruction.misdealt_dealer`)."""
        dealer = misdealt_dealer(self.state)
        if dealer is not None:
            self._blame(dealer, "its mask-key shares do not rebuild its advertised mask key: mis-dealt shares")
            raise PassError(
                f"client {dealer} dealt shares that do not rebuild its advertised mask key: the session stops "
                "before any share is requested"
            )

    # Round 4 -----------------------------------------------------------------
    def receive_unmask(self, replies: Mapping[int, UnmaskReply | Mapping[str, Any]]) -> None:
        """Store the well-formed unmask replies (shares of ``b`` for survivors, of ``s`` for dropped clients)."""
        if self.state.awaiting_signatures:
            raise PassError("receive_unmask called before receive_signatures")
        self._advance(Step.UNMASK, "receive_unmask")
        alive, gone = set(self.state.survivors), set(self.state.dropped)
        for v, reply in replies.items():
            if v not in alive:
                continue
            try:
                reply = UnmaskReply.coerce(reply)
            except PassError as error:
                self._exclude(v, str(error))
                continue
            neighbours = self._dealers_of(v)
            groups = (
                (reply.survivor_indices, reply.survivor_shares, alive),
                (reply.dropped_indices, reply.dropped_shares, gone),
            )
            if any(
                len(i) != len(s)
                or len(set(i)) != len(i)
                or not set(i) <= neighbours & allowed
                or any(len(x) != SHARE_BYTES for x in s)
                for i, s, allowed in groups
            ):
                self._exclude(v, "unmask reply names peers or shares it should not")
                continue
            forged = forged_share(self.session, v, reply, self.state.digests)
            if forged is not None:
                self._exclude(v, forged)
                continue
            for u, share in zip(reply.survivor_indices, reply.survivor_shares, strict=True):
                self.state.b_shares.setdefault(u, []).append((v, share))
            for d, share in zip(reply.dropped_indices, reply.dropped_shares, strict=True):
                self.state.s_shares.setdefault(d, []).append((v, share))

    def finish(self) -> npt.NDArray[np.int64]:
        """Remove every self-mask and every dropped client's pairwise masks; return ``N_s`` over U3.

        Raises
        ------
        PassError
            A needed secret has fewer than ``t`` shares or inconsistent ones, or the sum exceeds
            ``count_bound * |U3|`` in some class (a poisoned or incomplete sum is never returned); with
            :attr:`noise_slack` the sum is decoded signed (two's complement) and may leave
            ``[0, count_bound * |U3|]`` by that much.
        """
        self._advance(Step.FINISH, "finish")
        total = unmasked_sum(self.state, self.session, self.num_classes)
        signed = total.view(np.int64)  # two's complement: clients' noise can take a class below zero
        bound, slack = self.count_bound * len(self.state.survivors), self.noise_slack
        if (signed > bound + slack).any() or (signed < -slack).any():
            raise PassError(
                f"the sum exceeds count_bound * |U3| = {bound} in some class (or leaves it, or 0, by more than "
                f"the noise slack {slack}): refused"
            )
        self.state.b_shares.clear()
        self.state.s_shares.clear()
        return signed.copy()
