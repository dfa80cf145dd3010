"""The sparse secure mode of PASS, the server's side: :class:`SparseSecureServer`.

It announces the session's settings and the finder's ``(k, t)``, and then only relays: each client's signed draw of
out-neighbours goes to those it names, each dealer's ciphertexts to its out-neighbours, each survivor's signed
masked-with list to its holders. The checks it makes and the sum it rebuilds are :class:`~.server.PassServer`'s,
which it drives on the directed graph (holders: out-neighbours; masks over out- and in-neighbours,
:func:`~.reconstruction.mask_peers`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from flmarket_flwr.pass_protocol.encoding import PassError, indices_to_bitmap
from flmarket_flwr.pass_protocol.graph import roster_digest
from flmarket_flwr.pass_protocol.graph_parameters import GraphParameters
from flmarket_flwr.pass_protocol.identity import IdentityDirectory
from flmarket_flwr.pass_protocol.messages import (
    Advertisement,
    ConsistencyReply,
    ConsistencyRequest,
    DrawRequest,
    OutNeighbourDraw,
    ShareKeysReply,
    SparseAdvertiseRequest,
    SparseMaskedInput,
    SparseMaskRequest,
    SparseShareKeysRequest,
    SparseUnmaskRequest,
    UnmaskReply,
)
from flmarket_flwr.pass_protocol.server import PassServer
from flmarket_flwr.pass_protocol.server_state import ServerState, Step
from flmarket_flwr.pass_protocol.sparse_secure import SessionBinding, SparseSecureSettings, pack_indices

__all__ = ["SparseSecureServer", "in_neighbours_of"]


class SparseSecureServer:
    """The server's side of the sparse secure mode: builds each round's requests and rebuilds ``N_s``.

    One session (each request's ``to_record()`` to the client of that index, the replies back keyed by index; a
    missing reply is a dropout)::

        requests = server.advertise_requests(node_ids)       # -> client.advertise(request, counts, ...)
        requests = server.receive_advertisements(replies)    # -> client.draw(request, key)
        requests = server.receive_draws(replies)             # -> client.share_keys(request, directory, key)
        requests = server.receive_shares(replies)            # -> client.mask_input(request, key)
        requests = server.receive_masked(replies)            # -> client.sign_survivors(request, key)
        requests = server.receive_signatures(replies)        # -> client.unmask(request)
        server.receive_unmask(replies)
        label_counts = server.finish()

    Parameters
    ----------
    session, num_classes, count_bound, run_id
        As :class:`~.server.PassServer`.
    settings : SparseSecureSettings
        The session's settings, announced with the roster; ``(k, t)`` is the finder's for them at ``|U1|``.
    directory : IdentityDirectory
        The clients' identity keys: every draw, advert and list is signed.
    """

    def __init__(
        self,
        session: bytes,
        num_classes: int,
        count_bound: int,
        *,
        settings: SparseSecureSettings,
        directory: IdentityDirectory,
        run_id: int = 0,
    ) -> None:
        if not isinstance(directory, IdentityDirectory):
            raise ValueError("the sparse secure mode needs the clients' identity directory")
        self.core = PassServer(session, num_classes, count_bound, directory=directory, run_id=run_id)
        """The checks and the reconstruction, driven on the directed graph."""
        self.settings = settings
        self.directory = directory
        self.parameters: GraphParameters | None = None
        """The finder's parameters at ``|U1|`` (after :meth:`receive_advertisements`)."""
        self.draws: dict[int, tuple[tuple[int, ...], bytes]] = {}
        """Each client's valid draw and its signature."""
        self.lists: dict[int, tuple[tuple[int, ...], bytes]] = {}
        """Each masked input's valid masked-with list and its signature."""
        self._awaiting_draws = False

    @property
    def settings(self) -> SparseSecureSettings:
        """The session's settings; every advert signs their digest, in the slot of the graph commitment (no graph
        seed in this mode), and the core checks each advert under it."""
        return self._settings

    @settings.setter
    def settings(self, settings: SparseSecureSettings) -> None:
        self._settings = settings
        self.core.graph_commitment = settings.digest()

    @property
    def state(self) -> ServerState:
        """What the session has gathered (``graph``: out-neighbours; ``in_graph``: in-neighbours)."""
        return self.core.state

    @property
    def excluded(self) -> dict[int, str]:
        """Each client that left the protocol, and why."""
        return self.core.excluded

    @property
    def survivors(self) -> list[int]:
        """U3."""
        return self.core.survivors

    @property
    def node_of(self) -> dict[int, int]:
        """PASS index -> node id."""
        return self.core.node_of

    @property
    def index_of(self) -> dict[int, int]:
        """Node id -> PASS index."""
        return self.core.index_of

    @property
    def session(self) -> bytes:
        """The session id."""
        return self.core.session

    @property
    def commitments(self) -> dict[int, bytes]:
        """Each survivor's counts commitment."""
        return self.core.commitments

    @property
    def transcript(self) -> bytes:
        """``survivor_transcript`` of U3."""
        return self.core.transcript

    @property
    def culprits(self) -> frozenset[int]:
        """The clients named for a deviation (:attr:`.PassServer.culprits`)."""
        return self.core.culprits

    @property
    def wronged(self) -> frozenset[int]:
        """Clients that withdrew only because convicted senders left them short of ``t`` (as in ``PassServer``)."""
        return self.core.wronged

    @property
    def noise_slack(self) -> int:
        """Noise allowed beyond ``[0, count_bound * |U3|]`` in a class of the sum (:class:`~.server.PassServer`)."""
        return self.core.noise_slack

    @noise_slack.setter
    def noise_slack(self, value: int) -> None:
        self.core.noise_slack = value

    def _binding(self) -> SessionBinding:
        u1 = roster_digest(self.core.session, sorted(self.state.adverts))
        return SessionBinding(self.core.run_id, self.core.session, self.state.roster, u1)

    # Round 1 -----------------------------------------------------------------
    def advertise_requests(self, node_ids: Sequence[int]) -> dict[int, SparseAdvertiseRequest]:
        """Assign indices ``1..E`` to ``node_ids`` and announce the terms and the session's settings."""
        settings = self.settings
        return {
            index: SparseAdvertiseRequest(
                request.session,
                index,
                request.node_id,
                request.num_classes,
                request.count_bound,
                request.roster,
                settings.colluders,
                settings.roster_floor,
                settings.dropout_ppm,
                settings.reruns,
                settings.security_bits,
                settings.markets,
            )
            for index, request in self.core.advertise_requests(node_ids).items()
        }

    def receive_advertisements(
        self, replies: Mapping[int, Advertisement | Mapping[str, Any]]
    ) -> dict[int, DrawRequest]:
        """Fix U1 (the valid adverts) and ``(k, t)``, the finder's at ``|U1|``; ask each member to draw."""
        self.core._advance(Step.ADVERTISEMENTS, "receive_advertisements")
        adverts = self.core._valid_adverts(replies)
        self.parameters = parameters = self.settings.parameters(len(adverts))
        self.state.degree, self.state.threshold = parameters.degree, parameters.threshold
        self.state.participants = indices_to_bitmap(sorted(adverts))
        self._awaiting_draws = True
        node_ids = np.asarray([self.node_of[i] for i in sorted(self.node_of)], dtype=">u8").tobytes()
        request = DrawRequest(self.state.participants, parameters.degree, parameters.threshold, node_ids)
        return {u: request for u in sorted(adverts)}

    def receive_draws(
        self, replies: Mapping[int, OutNeighbourDraw | Mapping[str, Any]]
    ) -> dict[int, SparseShareKeysRequest]:
        """Keep each valid signed draw; relay to each drawer its out-neighbours' keys and its in-neighbours' draws."""
        if not self._awaiting_draws:
            raise PassError("receive_draws called out of order (it follows receive_advertisements)")
        self._awaiting_draws = False
        binding, k, t = self._binding(), self.state.degree, self.state.threshold
        for u in sorted(self.state.adverts):
            try:
                draw = OutNeighbourDraw.coerce(replies[u]) if u in replies else None
                if draw is None:
                    raise ValueError("no draw")
                out = tuple(draw.out_neighbours)
                if len(out) != k or len(set(out)) != k or u in out or not set(out) <= self.state.adverts.keys():
                    raise ValueError(f"not {k} distinct other members of U1")
                binding.verify_draw(self.directory.key_of(self.node_of[u]), draw.signature, u, sorted(out), k, t)
            except ValueError as error:  # PassError is a ValueError
                self.core._exclude(u, f"draw refused: {error}")
                continue
            self.draws[u] = (tuple(sorted(out)), draw.signature)
        self.state.graph = {u: out for u, (out, _) in self.draws.items()}
        ins = in_neighbours_of(self.state.graph)
        self.state.in_graph = {v: ins.get(v, ()) for v in self.state.adverts}
        return {u: self._share_keys_request(u) for u in self.state.graph}

    def _share_keys_request(self, u: int) -> SparseShareKeysRequest:
        out, ins = self.state.graph[u], self.state.in_graph[u]
        union = sorted(set(out) | set(ins))
        adverts = self.state.adverts
        return SparseShareKeysRequest(
            out_neighbours=list(out),
            neighbours=union,
            neighbour_node_ids=[self.node_of[v] for v in union],
            cipher_public_keys=[adverts[v].cipher_public_key for v in union],
            mask_public_keys=[adverts[v].mask_public_key for v in union],
            signatures=[adverts[v].signature for v in union],
            cipher_key_proofs=[adverts[v].cipher_key_proof for v in union],
            in_neighbours=list(ins),
            in_draws=[pack_indices(self.draws[v][0]) for v in ins],
            in_draw_signatures=[self.draws[v][1] for v in ins],
        )

    # Round 2 -----------------------------------------------------------------
    def receive_shares(self, replies: Mapping[int, ShareKeysReply | Mapping[str, Any]]) -> dict[int, SparseMaskRequest]:
        """Keep the dealers that sent one ciphertext per out-neighbour (U2); route them, with each holder's
        neighbours in U2."""
        if self._awaiting_draws:
            raise PassError("receive_shares called before receive_draws")
        inbox = self.core.receive_shares(replies)
        u2 = set(self.state.u2)
        requests = {}
        for u, mail in inbox.items():
            around = set(self.state.graph[u]) | set(self.state.in_graph[u])
            completed = sorted(around & u2)
            requests[u] = SparseMaskRequest(
                mail.senders, mail.ciphertexts, mail.share_digests, mail.signatures, completed
            )
        return requests

    # Round 3 -----------------------------------------------------------------
    def receive_masked(
        self, replies: Mapping[int, SparseMaskedInput | Mapping[str, Any]]
    ) -> dict[int, ConsistencyRequest]:
        """Check each masked-with list's signature (a bad one: the input is refused), then as
        :meth:`.PassServer.receive_masked`: U3, the accusations, the consistency round's requests."""
        binding, kept = self._binding(), {}
        for u, reply in replies.items():
            if u not in self.state.graph:
                continue
            try:
                masked = SparseMaskedInput.coerce(reply)
                if masked.masked_counts:
                    around = set(self.state.graph[u]) | set(self.state.in_graph[u])
                    listed = tuple(masked.masked_with)
                    if list(listed) != sorted(set(listed)) or not set(listed) <= around:
                        raise ValueError("its masked-with list is not its neighbours, ascending")
                    key = self.directory.key_of(self.node_of[u])
                    binding.verify_masked_with(key, masked.masked_with_signature, u, listed)
                    self.lists[u] = (listed, masked.masked_with_signature)
                    self.state.masked_with[u] = frozenset(listed)
            except ValueError as error:
                self.core._exclude(u, f"masked input refused: {error}")
                continue
            kept[u] = masked.to_record()
        requests = self.core.receive_masked(kept)  # with a directory: the consistency round's requests
        return {u: request for u, request in requests.items() if isinstance(request, ConsistencyRequest)}

    # Consistency round -------------------------------------------------------
    def receive_signatures(
        self, replies: Mapping[int, ConsistencyReply | Mapping[str, Any]]
    ) -> dict[int, SparseUnmaskRequest]:
        """As :meth:`.PassServer.receive_signatures` (each signer gets its out-neighbours' signatures), with each
        surviving dealer's signed masked-with list for its holders."""
        requests = self.core.receive_signatures(replies)
        alive = set(self.survivors)
        out = {}
        for u, request in requests.items():
            dealers = [v for v in self.state.in_graph[u] if v in alive and v in self.lists]
            out[u] = SparseUnmaskRequest(
                request.survivors,
                request.dropped,
                request.signers,
                request.signatures,
                dealers,
                [pack_indices(self.lists[v][0]) for v in dealers],
                [self.lists[v][1] for v in dealers],
            )
        return out

    # Round 4 -----------------------------------------------------------------
    def receive_unmask(self, replies: Mapping[int, UnmaskReply | Mapping[str, Any]]) -> None:
        """Store the well-formed unmask replies (:meth:`.PassServer.receive_unmask`: shares of in-neighbours only)."""
        self.core.receive_unmask(replies)

    def finish(self) -> npt.NDArray[np.int64]:
        """``N_s`` over U3 (:meth:`.PassServer.finish`)."""
        return self.core.finish()


def in_neighbours_of(draws: Mapping[int, Sequence[int]]) -> dict[int, tuple[int, ...]]:
    """Each client's in-neighbours given every client's out-neighbours (for tests and benchmarks)."""
    ins: dict[int, list[int]] = {u: [] for u in draws}
    for u, out in sorted(draws.items()):
        for v in out:
            ins.setdefault(v, []).append(u)
    return {v: tuple(x) for v, x in ins.items()}
