"""PASS v2, the client's checks of the survivor set a server shows it, before it signs or unmasks for it.

:func:`check_view` is the split a client can answer at all (before :meth:`~.client.PassClient.sign_survivors` and
:meth:`~.client.PassClient.unmask`); :func:`check_consistency` is, with identity keys, the consistency round's
guarantee that the set is the one this client signed and ``t`` of its neighbours signed too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection
from typing import TypeVar

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from flmarket_flwr.pass_protocol.client_state import Masked
from flmarket_flwr.pass_protocol.encoding import PassError, bitmap_bits, strictly_increasing
from flmarket_flwr.pass_protocol.graph import share_threshold
from flmarket_flwr.pass_protocol.identity import sign_survivor_set, verify_survivor_set
from flmarket_flwr.pass_protocol.messages import (
    ConsistencyReply,
    ConsistencyRequest,
    SparseUnmaskRequest,
    UnmaskRequest,
)
from flmarket_flwr.pass_protocol.primitives import MIN_PARTICIPANTS


def check_view(state: Masked, survivors_bitmap: bytes, dropped_bitmap: bytes) -> npt.NDArray[np.bool_]:
    """``PassError`` unless the survivor/dropped split is one this client can answer; return the survivor bits.

    Vectorised over the roster bitmaps (``E / 8`` bytes each): no Python work per participant, only per
    neighbour. ``bits[i - 1]`` is True for a survivor ``i``.
    """
    size = 8 * max(len(survivors_bitmap), len(dropped_bitmap), len(state.participants))
    survivors = bitmap_bits(survivors_bitmap, size)
    dropped = bitmap_bits(dropped_bitmap, size)
    participants = bitmap_bits(state.participants, size)
    for name, group in (("survivors", survivors), ("dropped", dropped)):
        if bool((group & ~participants).any()):
            raise PassError(f"{name} must be participants")
    if bool((survivors & dropped).any()):
        raise PassError("a client cannot be both a survivor and dropped")
    if not survivors[state.index - 1]:
        raise PassError("this client sent its masked input but is not listed as a survivor")
    count = int(np.count_nonzero(survivors))
    if count < MIN_PARTICIPANTS:
        raise PassError(f"only {count} survivors, PASS needs {MIN_PARTICIPANTS}")
    neighbours = np.asarray(state.neighbours, dtype=np.int64) - 1
    alive, gone = survivors[neighbours], dropped[neighbours]
    accused = set(state.accused)
    answered = {int(v) + 1 for v in neighbours[alive | gone]}
    if answered != set(state.held_from) | accused:
        raise PassError("survivors and dropped do not match the neighbours that completed key sharing")
    if any(survivors[v - 1] for v in accused):
        raise PassError("a neighbour whose shares did not open here cannot be a survivor (no mask with it)")
    threshold = share_threshold(state.degree)
    if int(np.count_nonzero(alive)) < threshold:
        raise PassError(f"only {int(np.count_nonzero(alive))} neighbours survived, the threshold is {threshold}")
    return survivors


def check_consistency(state: Masked, request: UnmaskRequest, survivors: npt.NDArray[np.bool_]) -> None:
    """With identity keys: the set is the one this client signed, and ``t`` neighbours signed it too
    (:func:`check_signed_set` over all of its neighbours, ``t = k // 2 + 1``)."""
    check_signed_set(
        state,
        request,
        survivors,
        signers_from=state.neighbours,
        threshold=share_threshold(state.degree),
        who="neighbour",
    )


def check_signed_set(
    state: Masked,
    request: UnmaskRequest | SparseUnmaskRequest,
    survivors: npt.NDArray[np.bool_],
    *,
    signers_from: Collection[int],
    threshold: int,
    who: str,
) -> None:
    """The set is the one this client signed, and ``threshold`` of ``signers_from`` (its neighbours; in the sparse
    secure mode, its out-neighbours) signed it too: the consistency round.

    The signatures are checked in the order sent until ``threshold`` are valid: an invalid one is skipped (a
    colluder's, or the server's), never counted, and named if the client ends short. ``who`` names a signer in the
    errors.
    """
    if not state.signed_survivors:
        raise PassError("this client unmasks only after signing the survivor set (consistency round)")
    if (request.survivors, request.dropped) != (state.signed_survivors, state.signed_dropped):
        raise PassError("the survivor set differs from the one this client signed: two views, refused")
    position = {v: i for i, v in enumerate(state.neighbours)}
    signers = request.signers
    if (
        not strictly_increasing(signers)
        or not set(signers) <= set(signers_from)
        or not all(survivors[v - 1] for v in signers)
        or len(signers) != len(request.signatures)
    ):
        raise PassError(f"the signers must be distinct surviving {who}s, one signature each")
    if len(signers) < threshold:
        raise PassError(f"only {len(signers)} {who}s signed this survivor set, the threshold is {threshold}")
    valid, refused = 0, []
    for v, signature in zip(signers, request.signatures, strict=True):
        if valid == threshold:  # t signers' word on this one set is the whole check
            break
        try:
            verify_survivor_set(
                state.identity_keys[position[v]],
                signature,
                request.survivors,
                request.dropped,
                run_id=state.run_id,
                session=state.session,
                roster=state.roster,
                participants=state.participants,
            )
        except ValueError as error:
            refused.append(f"{who} {v}: {error}")
            continue
        valid += 1
    if valid < threshold:
        raise PassError(
            f"only {valid} valid {who} signatures on this survivor set, the threshold is {threshold} "
            f"({'; '.join(refused)})"
        )


MaskedState = TypeVar("MaskedState", bound=Masked)


def sign_view(
    state: MaskedState,
    request: ConsistencyRequest,
    identity_key: Ed25519PrivateKey,
    check_split: Callable[[MaskedState, bytes, bytes], object],
) -> tuple[MaskedState, ConsistencyReply]:
    """Check the split shown with ``check_split`` (the checks of unmask), sign it, and return the state that keeps it.

    The signature binds the run, the session, the roster fingerprint, ``U1`` and the set; the client later unmasks
    only for exactly that set (Bonawitz et al. 2017's consistency check).
    """
    check_split(state, request.survivors, request.dropped)
    signature = sign_survivor_set(
        identity_key,
        request.survivors,
        request.dropped,
        run_id=state.run_id,
        session=state.session,
        roster=state.roster,
        participants=state.participants,
    )
    signed = dataclasses.replace(state, signed_survivors=request.survivors, signed_dropped=request.dropped)
    return signed, ConsistencyReply(signature)
