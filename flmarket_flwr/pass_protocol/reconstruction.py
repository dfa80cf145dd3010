"""PASS v2, the server's reconstruction: whether every needed secret can be rebuilt, and the sum unmasked.

Functions of a :class:`~flmarket_flwr.pass_protocol.server_state.ServerState` that the server's rounds call once
the masked inputs close (:func:`check_recoverable`, :func:`misdealt_dealer`) and at the end
(:func:`unmasked_sum`); keys are PASS indices.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from flmarket_flwr.pass_protocol.channel import rebuild_secret, scalar_pair_mask
from flmarket_flwr.pass_protocol.dleq import dealing_matches, montgomery_u, public_key_of_scalar
from flmarket_flwr.pass_protocol.encoding import PassError
from flmarket_flwr.pass_protocol.primitives import MIN_PARTICIPANTS, expand_seed
from flmarket_flwr.pass_protocol.server_state import ServerState


def holders(state: ServerState, dealer: int, alive: set[int]) -> list[int]:
    """The surviving neighbours that hold ``dealer``'s shares (and masked with it): all but its accusers."""
    return [v for v in state.graph[dealer] if v in alive and (v, dealer) not in state.cut]


def mask_peers(state: ServerState, dropped: int, alive: set[int]) -> list[int]:
    """The survivors whose masked inputs carry a mask with ``dropped``: its holders, or in the sparse secure mode
    its out- and in-neighbours whose signed lists name it."""
    if not state.in_graph:
        return holders(state, dropped, alive)
    around = sorted(set(state.graph.get(dropped, ())) | set(state.in_graph.get(dropped, ())))
    return [v for v in around if v in alive and dropped in state.masked_with.get(v, ())]


def check_recoverable(state: ServerState) -> None:
    """``PassError`` unless ``|U3| >= 3`` and each survivor and dropped client keeps ``t`` surviving neighbours."""
    if len(state.survivors) < MIN_PARTICIPANTS:
        raise PassError(f"only {len(state.survivors)} clients sent masked input, PASS needs {MIN_PARTICIPANTS}")
    alive = set(state.survivors)
    if state.in_graph:
        _check_directed(state, alive)
        return
    for u in state.survivors + state.dropped:
        left = len(holders(state, u, alive))
        if not left and u not in alive and any((v, u) in state.cut for v in state.graph[u]):
            continue  # every surviving neighbour accused it: none masked with it, nothing to rebuild
        if left < state.thresholds[u]:
            raise PassError(
                f"client {u} keeps only {left} surviving neighbours, the threshold is {state.thresholds[u]}: "
                "its secret cannot be rebuilt, the session stops before any share is requested"
            )


def _check_directed(state: ServerState, alive: set[int]) -> None:
    """:func:`check_recoverable` in the sparse secure mode: the survivors' masks pair up (each edge in both signed
    lists or in neither), each survivor keeps ``t`` holders whose lists and its own name the edge (only they reveal
    its self-mask seed), and each dropped client that some survivor masked with keeps ``t`` holders."""
    for u in state.survivors:
        one_sided = [v for v in state.masked_with[u] if v in alive and u not in state.masked_with[v]]
        if one_sided:
            raise PassError(f"client {u} masked with survivor {one_sided[0]}, which did not mask with it")
        mutual = [v for v in holders(state, u, alive) if v in state.masked_with[u] and u in state.masked_with[v]]
        if len(mutual) < state.thresholds[u]:
            raise PassError(
                f"client {u} keeps only {len(mutual)} surviving holders that masked with it, the threshold is "
                f"{state.thresholds[u]}: its self-mask seed cannot be rebuilt"
            )
    for d in state.dropped:
        left = len(holders(state, d, alive))
        if mask_peers(state, d, alive) and left < state.thresholds[d]:
            raise PassError(f"client {d} keeps only {left} surviving holders, the threshold is {state.thresholds[d]}")


def misdealt_dealer(state: ServerState) -> int | None:
    """The first dropped dealer whose mask-key shares do not rebuild its advertised mask key, if any.

    Each holder checked its share against its point (:func:`~.channel.unseal`); here the points of the surviving
    holders must lie on one polynomial of degree < ``t`` through the advertised key
    (:func:`~flmarket_flwr.pass_protocol.dleq.dealing_matches`). A client that dealt shares of anything
    else and then withheld its masked input is thus named before any unmask request, when the market
    can still run a fresh session without it, rather than after everyone unmasked.
    """
    alive = set(state.survivors)
    for d in state.dropped:
        kept = holders(state, d, alive)
        points = [state.digests[d, v][:32] for v in kept]
        advertised = state.adverts[d].mask_public_key
        if kept and not dealing_matches(advertised, kept, points, state.thresholds[d]):
            return d
    return None


def _rebuild(state: ServerState, owner: int, shares: list[tuple[int, bytes]], what: str) -> bytes:
    """The secret (a scalar mod ``l``, 32 bytes) behind ``t`` of ``owner``'s shares, each checked at unmask."""
    threshold = state.thresholds[owner]
    if len(shares) < threshold:
        raise PassError(f"only {len(shares)} shares of {what} of client {owner}, the threshold is {threshold}")
    try:  # any t: each matched its dealer's digest or point (forged_share)
        return rebuild_secret(shares[:threshold])
    except ValueError as error:
        raise PassError(f"the shares of {what} of client {owner}: {error}") from error


def unmasked_sum(state: ServerState, session: bytes, num_classes: int) -> npt.NDArray[np.uint64]:
    """The survivors' masked sum less every self-mask and every dropped client's pairwise masks (in ``Z_2^64``).

    Raises
    ------
    PassError
        A needed secret has fewer than ``t`` shares or inconsistent ones, or a dropped client's rebuilt mask key
        is not the one it advertised.
    """
    total = state.masked_sum.copy()
    for u in state.survivors:
        seed = _rebuild(state, u, state.b_shares.get(u, []), "the self-mask seed")
        total -= expand_seed(seed, num_classes)
    alive = set(state.survivors)
    for d in state.dropped:
        kept = mask_peers(state, d, alive)
        if not kept:  # every surviving neighbour accused it: none masked with it
            continue
        scalar = _rebuild(state, d, state.s_shares.get(d, []), "the mask key")
        advertised = state.adverts[d].mask_public_key
        if public_key_of_scalar(scalar) != montgomery_u(advertised).to_bytes(32, "little"):
            raise PassError(f"the rebuilt mask key of client {d} does not match its advertised key")
        for v in kept:  # v masked with +eps_{v,d} PRG; eps_{v,d} = -eps_{d,v}
            peer_key = state.adverts[v].mask_public_key
            total += scalar_pair_mask(scalar, peer_key, session, d, v, num_classes)
    return total
