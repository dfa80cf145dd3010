"""The masking graph of PASS v2: a Harary graph on a randomly relabelled cycle (Bell et al. 2020).

Each client masks with, and shares its secrets among, only its ``k`` graph neighbours, so the per-client cost
grows with ``k ~ log E`` instead of ``E``. The graph is drawn from a seed that binds a server seed, committed
before any client key existed, and the roster of participants: a server that wants a victim surrounded by
colluders can only retry by excluding advertised clients, and each try succeeds with probability below
``2^-security_bits``. Threat model: a fraction ``bad_fraction`` of "bad" nodes (dropped or colluding with the
server), placed independently of the relabelling.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Sequence
from typing import Final

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

GRAPH_SEED_LENGTH: Final[int] = 32
"""Length in bytes of the server's graph seed and of the derived graph seed."""

DEFAULT_SECURITY_BITS: Final[int] = 40
DEFAULT_BAD_FRACTION: Final[float] = 0.1

_COMMIT_LABEL: Final[bytes] = b"flmarket-pass/v2/graph-commitment"
_DERIVE_LABEL: Final[bytes] = b"flmarket-pass/v2/graph-seed"
_NONCE: Final[bytes] = bytes(16)


def commit_graph_seed(seed: bytes) -> bytes:
    """SHA-256 commitment to the server's graph seed (sent at advertise time, opened with the roster)."""
    if not isinstance(seed, bytes) or len(seed) != GRAPH_SEED_LENGTH:
        raise ValueError(f"graph seed must be {GRAPH_SEED_LENGTH} bytes")
    return hashlib.sha256(_COMMIT_LABEL + seed).digest()


def derive_graph_seed(server_seed: bytes, roster_digest: bytes) -> bytes:
    """Graph seed ``H(label || server_seed || roster_digest)``.

    ``roster_digest`` is what the clients can check: in PASS v2 it is :func:`roster_digest` of the sorted
    participant indices (the graph seed is committed before any key exists).
    """
    if not isinstance(server_seed, bytes) or len(server_seed) != GRAPH_SEED_LENGTH:
        raise ValueError(f"server seed must be {GRAPH_SEED_LENGTH} bytes")
    return hashlib.sha256(_DERIVE_LABEL + server_seed + roster_digest).digest()


def roster_digest(session: bytes, indices: Sequence[int] | np.ndarray) -> bytes:
    """SHA-256 over the session and the sorted participant indices (length-prefixed, injective)."""
    ordered = np.sort(_index_array(indices)).astype(np.uint64)
    body = struct.pack(">Q", len(session)) + session + struct.pack(">Q", ordered.size)
    return hashlib.sha256(body + ordered.astype(">u8").tobytes()).digest()


def neighbourhood_size(
    num_clients: int, *, security_bits: int = DEFAULT_SECURITY_BITS, bad_fraction: float = DEFAULT_BAD_FRACTION
) -> int:
    """Degree ``k`` of the masking graph for ``num_clients`` participants.

    On the randomly shuffled cycle each node is joined to its ``k/2`` nearest nodes on each side. Removing the
    bad nodes (dropped, or colluding with the server) can only cut the honest survivors apart, or isolate one of
    them, if some run of ``k/2`` consecutive cycle positions is all bad. With ``E`` start positions and each node
    bad independently with probability ``f = bad_fraction``, a union bound gives
    ``P[failure] <= E * f^(k/2)``; ``k`` is the smallest even number with ``E * f^(k/2) <= 2^-security_bits``.
    If that ``k >= E - 1`` the graph is complete (``k = E - 1``, the paper's PASS).

    With the defaults (``security_bits = 40``, ``f = 0.1``), threshold ``t = k // 2 + 1``::

        E        k    t
        20       19   10   (complete)
        100      30   16
        1,000    32   17
        10,000   34   18

    Parameters
    ----------
    num_clients : int
        ``E``, the number of participants (>= 2).
    security_bits : int
        Failure probability target ``2^-security_bits``.
    bad_fraction : float
        Assumed fraction of bad nodes, in ``(0, 1)``.
    """
    if num_clients < 2:
        raise ValueError(f"a masking graph needs at least 2 clients, got {num_clients}")
    if not 0.0 < bad_fraction < 1.0:
        raise ValueError(f"bad_fraction must be in (0, 1), got {bad_fraction}")
    if security_bits < 0:
        raise ValueError(f"security_bits must be >= 0, got {security_bits}")
    # E * f^h <= 2^-s  <=>  h >= (s ln 2 + ln E) / -ln f
    half = max(1, math.ceil((security_bits * math.log(2) + math.log(num_clients)) / -math.log(bad_fraction) - 1e-12))
    return min(2 * half, num_clients - 1)


def share_threshold(k: int) -> int:
    """Shamir threshold ``t = k // 2 + 1`` for degree ``k``.

    ``2t > k``: a server that tells some of x's neighbours "x survived" (they answer shares of x's self-mask
    seed) and others "x dropped" (shares of x's mask key) gets two disjoint sets of answers within ``k``
    neighbours, so never ``t`` of both. With ``c`` neighbours of x colluding with the server (they give both
    kinds) the condition becomes ``t > (k + c) / 2``.
    """
    if k < 1:
        raise ValueError(f"degree must be >= 1, got {k}")
    return k // 2 + 1


def secret_threshold(k: int, split_tolerance: int = 0) -> int:
    """The Shamir threshold a client uses for its own two secrets: the least ``t >= k // 2 + 1`` with
    ``2t - k > split_tolerance``.

    A server that splits the consistency round tells some of the client's neighbours "it survived" (they
    return shares of its self-mask seed) and the others "it dropped" (shares of its mask key); ``c``
    colluding neighbours return both kinds. Both secrets come out when ``c`` colluders and two disjoint groups
    of honest neighbours reach ``t`` each, which takes ``c >= 2t - k``: this threshold withstands up to
    ``split_tolerance`` colluding neighbours (:func:`share_threshold`'s ``t`` withstands one when ``k`` is
    even, none when it is odd). The price: the client's secrets need ``t`` surviving holders, so it tolerates
    ``k - t`` neighbours dropping instead of ``k - k // 2 - 1``.

    Raises
    ------
    ValueError
        ``split_tolerance`` is negative, or no threshold up to :func:`max_secret_threshold` reaches it.
    """
    if split_tolerance < 0:
        raise ValueError(f"split tolerance must be >= 0, got {split_tolerance}")
    t = max(share_threshold(k), (k + split_tolerance) // 2 + 1)
    if t > max_secret_threshold(k):
        raise ValueError(
            f"with {k} neighbours no threshold up to {max_secret_threshold(k)} (one receiver's loss must leave the "
            f"secrets recoverable) withstands {split_tolerance} colluding neighbours"
        )
    return t


def max_secret_threshold(k: int) -> int:
    """The largest Shamir threshold a dealer with ``k`` neighbours may announce: ``k - 1`` (``k // 2 + 1`` if more).

    A dealer's secrets must stay recoverable after one receiver is lost: a receiver whose shares do not open
    accuses the dealer and holds nothing of it, and with ``t = k`` that alone would leave the dealer's mask key
    ``k - 1`` holders and stop the session for everyone. Only at ``k = 2`` (three participants) is the bound
    :func:`share_threshold`'s ``t = 2`` itself, which no dealer may go below.
    """
    return max(share_threshold(k), k - 1)


def check_degree(k: int, num_clients: int) -> None:
    """Raise ``ValueError`` unless ``k`` is a valid degree: even and ``2 <= k < E - 1``, or ``k = E - 1``."""
    if num_clients < 2:
        raise ValueError(f"a masking graph needs at least 2 clients, got {num_clients}")
    if k == num_clients - 1:
        return
    if k < 2 or k >= num_clients - 1 or k % 2:
        raise ValueError(f"degree must be even in [2, {num_clients - 2}] or equal {num_clients - 1}, got {k}")


def _index_array(indices: Sequence[int] | np.ndarray) -> np.ndarray:
    """The indices as an int64 array (an array is taken as it is: no per-element Python work)."""
    if isinstance(indices, np.ndarray):
        return indices.astype(np.int64, copy=False)
    return np.asarray(list(indices), dtype=np.int64)


def _keystream_words(seed: bytes, size: int) -> np.ndarray:
    """``size`` little-endian 64-bit words of the ChaCha20 keystream under ``seed``: the sort keys."""
    if not isinstance(seed, bytes) or len(seed) != GRAPH_SEED_LENGTH:
        raise ValueError(f"graph seed must be {GRAPH_SEED_LENGTH} bytes")
    stream = Cipher(algorithms.ChaCha20(seed, _NONCE), mode=None).encryptor()
    return np.frombuffer(stream.update(bytes(8 * size)), dtype="<u8").astype(np.uint64)


def _shuffled(seed: bytes, indices: Sequence[int] | np.ndarray) -> list[int]:
    """The sorted indices in a random order drawn from the ChaCha20 keystream under ``seed``.

    Each index gets the next little-endian 64-bit keystream word as its sort key; the order is the stable
    sort of those keys (a tie, probability below ``E^2 / 2^65``, keeps the sorted order). Vectorised: one
    keystream read and one argsort, no per-index Python work.
    """
    order = _sorted_distinct(indices)
    keys = _keystream_words(seed, order.size)
    return order[np.argsort(keys, kind="stable")].tolist()


def _sorted_distinct(indices: Sequence[int] | np.ndarray) -> np.ndarray:
    """The indices sorted, as int64; ``ValueError`` if two are equal."""
    order = np.sort(_index_array(indices))
    if order.size > 1 and bool((order[1:] == order[:-1]).any()):
        raise ValueError("graph indices must be distinct")
    return order


def mask_graph(seed: bytes, indices: Sequence[int], k: int) -> dict[int, tuple[int, ...]]:
    """The whole masking graph: ``{index: sorted neighbour indices}``, symmetric, every degree exactly ``k``.

    Deterministic from ``seed``; ``k = len(indices) - 1`` gives the complete graph, otherwise ``k`` must be even.
    """
    cycle = _shuffled(seed, indices)
    size = len(cycle)
    check_degree(k, size)
    if k == size - 1:
        members = tuple(sorted(cycle))
        return {i: tuple(j for j in members if j != i) for i in members}
    half = k // 2
    return {
        node: tuple(sorted(cycle[(p + d) % size] for d in range(-half, half + 1) if d)) for p, node in enumerate(cycle)
    }


def neighbours_of(seed: bytes, indices: Sequence[int] | np.ndarray, k: int, index: int) -> tuple[int, ...]:
    """Sorted neighbours of ``index`` in :func:`mask_graph`, without building the graph or sorting the cycle.

    In the cycle (the indices ordered by their keystream words), the ``k / 2`` successors of ``index`` are the
    indices whose words are the nearest above its own, modulo ``2^64``, and the predecessors the nearest
    below: two vectorised selections, a few microseconds per thousand participants. A tie of words in that
    window (probability below ``E^2 / 2^65``) falls back to the sorted cycle, which orders ties by index.
    """
    order = _sorted_distinct(indices)
    size = order.size
    check_degree(k, size)
    position = int(np.searchsorted(order, index))
    if position >= size or order[position] != index:
        raise ValueError(f"index {index} is not a participant of the graph")
    if k == size - 1:
        return tuple(np.delete(order, position).tolist())
    keys = _keystream_words(seed, size)
    half = k // 2
    ahead = keys - keys[position]  # wraps modulo 2^64: the distance along the cycle, forwards
    behind = np.uint64(0) - ahead  # and backwards
    ahead[position] = behind[position] = np.iinfo(np.uint64).max
    chosen = []
    for distance in (ahead, behind):
        nearest = np.argpartition(distance, half)[: half + 1]
        bound = np.partition(distance[nearest], half - 1)[half - 1]
        within = nearest[distance[nearest] <= bound]
        if within.size != half or bool((distance == 0).any()):  # a tie in the window: use the exact order
            cycle = _shuffled(seed, order)
            p = cycle.index(index)
            return tuple(sorted(cycle[(p + d) % size] for d in range(-half, half + 1) if d))
        chosen.append(within)
    return tuple(sorted(order[np.concatenate(chosen)].tolist()))
