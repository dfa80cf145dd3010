"""Tests of PASS: the primitives, and exactness and uniformity of PASS v2's masked vectors.

The primitives (seeds, PRG, key loading, count validation) are tested directly. The protocol's own
rounds, dropouts and attacks are in ``test_pass_secagg.py``; here one no-dropout session of
:class:`PassClient` / :class:`PassServer` checks the sum is exact over many sizes, that every masked
vector and every strict partial sum of them is uniform in ``Z_2^64``, and that a fresh session gives
fresh masks.
"""

from __future__ import annotations

import ast
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.stats import chi2

from flmarket_flwr import pass_protocol
from flmarket_flwr.pass_protocol import PassClient, PassError, PassServer
from flmarket_flwr.pass_protocol.messages import MaskedInput
from flmarket_flwr.pass_protocol.primitives import (
    COUNT_LIMIT,
    PROTOCOL_LABEL,
    derive_pair_seed,
    expand_seed,
    hkdf_sha256,
    load_public_key,
    pair_info,
    pairwise_sign,
    validate_counts,
)

SESSION = b"test-run-1"
ZERO_KEY = bytes(32)  # a low-order point: every X25519 exchange with it gives zeros
ALPHA = 1e-9  # per chi-square statistic; a few hundred statistics => false failure < 1e-6

UniformityRound = tuple[np.ndarray, list[np.ndarray]]


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------
def run_session(
    counts: np.ndarray,
    session: bytes = SESSION,
    node_ids: list[int] | None = None,
    count_bound: int | None = None,
    degree: int | None = None,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """One PASS v2 session without dropouts; return ``N_s`` and every masked vector ``Y_e`` (by row).

    Messages and client states cross their record form, as between processes.
    """
    counts = np.asarray(counts)
    size, classes = counts.shape
    bound = max(1, int(np.max(counts))) if count_bound is None else count_bound
    nodes = node_ids if node_ids is not None else [1000 + row for row in range(size)]
    server = PassServer(session, classes, bound, degree=degree)
    requests = server.advertise_requests(nodes)
    row_of = {index: nodes.index(node) for index, node in server.node_of.items()}
    states = {index: PassClient().to_record() for index in requests}

    def answer(requests: dict, method: str, **kwargs: object) -> dict:  # type: ignore[type-arg]
        replies = {}
        for index, request in requests.items():
            client = PassClient.from_record(states[index])
            own = (counts[row_of[index]],) if method == "advertise" else ()
            replies[index] = getattr(client, method)(request.to_record(), *own, **kwargs).to_record()
            states[index] = client.to_record()
        return replies

    floor = {"security_bits": 0, "bad_fraction": 0.01} if degree is not None else {}
    shares = server.receive_advertisements(answer(requests, "advertise", **floor))
    masks = server.receive_shares(answer(shares, "share_keys"))
    masked = answer(masks, "mask_input")
    unmasks = server.receive_masked(masked)
    server.receive_unmask(answer(unmasks, "unmask"))
    total = server.finish()
    vectors = [
        np.frombuffer(MaskedInput.from_record(masked[index]).masked_counts, dtype="<u8").astype(np.uint64)
        for index in sorted(masked, key=lambda i: row_of[i])
    ]
    return total, vectors


def bit_p_values(values: np.ndarray) -> np.ndarray:
    """Chi-square (1 dof) p-value of the frequency of ones at each of the 64 bits."""
    n = values.shape[0]
    bits = (values[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)
    ones = bits.sum(axis=0).astype(np.float64)
    statistic = (2.0 * ones - n) ** 2 / n
    return chi2.sf(statistic, df=1)


def byte_p_value(values: np.ndarray) -> float:
    """Chi-square (255 dof) p-value of the histogram of all bytes of ``values``."""
    as_bytes = values.view(np.uint8)
    observed = np.bincount(as_bytes, minlength=256).astype(np.float64)
    expected = as_bytes.size / 256.0
    statistic = ((observed - expected) ** 2 / expected).sum()
    return float(chi2.sf(statistic, df=255))


def looks_uniform(values: np.ndarray) -> bool:
    """True when no bit-frequency or byte-histogram statistic rejects at ``ALPHA``."""
    return bool(bit_p_values(values).min() > ALPHA and byte_p_value(values) > ALPHA)


# ----------------------------------------------------------------------------
# Exactness of a PASS v2 session
# ----------------------------------------------------------------------------
def _check_exact_sum(num_clients: int, num_classes: int, seed: int, kind: str) -> None:
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 2**40 + 1, size=(num_clients, num_classes), dtype=np.int64)
    if kind == "float":
        given_counts = counts.astype(np.float64)  # exact below 2**53
    elif kind == "uint64":
        given_counts = counts.astype(np.uint64)
    else:
        given_counts = counts
    total, vectors = run_session(given_counts)
    assert total.dtype == np.int64
    assert total.shape == (num_classes,)
    np.testing.assert_array_equal(total, counts.sum(axis=0))
    assert len(vectors) == num_clients


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    num_clients=st.integers(3, 20),
    num_classes=st.integers(1, 1000),
    seed=st.integers(0, 2**32 - 1),
    kind=st.sampled_from(["int64", "uint64", "float"]),
)
def test_exact_sum_many_small_sessions(num_clients: int, num_classes: int, seed: int, kind: str) -> None:
    _check_exact_sum(num_clients, num_classes, seed, kind)


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    num_clients=st.integers(40, 120),
    num_classes=st.integers(1, 1000),
    seed=st.integers(0, 2**32 - 1),
)
def test_exact_sum_few_large_sessions(num_clients: int, num_classes: int, seed: int) -> None:
    """Large enough that the default masking graph is sparse (``k < E - 1``)."""
    _check_exact_sum(num_clients, num_classes, seed, "int64")


def test_paper_example_three_clients() -> None:
    counts = np.array([[3, 6, 8], [4, 4, 7], [10, 8, 5]])
    total, _ = run_session(counts)
    np.testing.assert_array_equal(total, [17, 18, 20])


def test_exact_sum_up_to_the_declared_bound() -> None:
    """Counts at ``count_bound`` with ``count_bound * E`` just below ``2**63``: still exact."""
    assert COUNT_LIMIT == 2**63
    bound = (COUNT_LIMIT - 1) // 3
    counts = np.array([[bound, 0], [bound, bound], [bound - 5, 1]], dtype=np.uint64)
    total, _ = run_session(counts, count_bound=bound)
    np.testing.assert_array_equal(total, [3 * bound - 5, bound + 1])
    with pytest.raises(ValueError, match="2\\*\\*63"):
        PassServer(SESSION, 2, bound + 1).advertise_requests([1, 2, 3])


def test_counts_above_the_declared_bound_are_refused_by_the_client() -> None:
    with pytest.raises(PassError, match="exceeds the declared count_bound"):
        run_session(np.array([[1, 2], [3, 4], [5, 6]]), count_bound=5)


def test_arbitrary_node_ids() -> None:
    counts = np.array([[1, 2], [3, 4], [5, 6], [7, 8]])
    total, _ = run_session(counts, node_ids=[0, 7, 3, 2**62])
    np.testing.assert_array_equal(total, [16, 20])


def test_zero_counts_give_nonzero_masked_vectors_and_a_zero_sum() -> None:
    total, vectors = run_session(np.zeros((6, 50), dtype=np.int64), count_bound=1)
    np.testing.assert_array_equal(total, np.zeros(50))
    assert all(np.count_nonzero(y) == 50 for y in vectors)


def test_session_gives_fresh_masks_and_exact_sums() -> None:
    counts = np.array([[5, 0, 2], [1, 1, 1], [0, 9, 4], [2, 2, 2]])
    first_total, first = run_session(counts, session=b"run-a")
    second_total, second = run_session(counts, session=b"run-b")
    again_total, again = run_session(counts, session=b"run-a")  # fresh keys and self-masks even so
    for y_first, y_second, y_again in zip(first, second, again, strict=True):
        assert not np.array_equal(y_first, y_second)
        assert not np.array_equal(y_first, y_again)
    for total in (first_total, second_total, again_total):
        np.testing.assert_array_equal(total, counts.sum(axis=0))


# ----------------------------------------------------------------------------
# Pairwise masks, seeds and the PRG
# ----------------------------------------------------------------------------
def test_both_sides_derive_the_same_seed() -> None:
    key_a, key_b = X25519PrivateKey.generate(), X25519PrivateKey.generate()
    secret_ab = key_a.exchange(key_b.public_key())
    secret_ba = key_b.exchange(key_a.public_key())
    seed_from_a = derive_pair_seed(secret_ab, SESSION, 4, 9)
    seed_from_b = derive_pair_seed(secret_ba, SESSION, 9, 4)
    assert seed_from_a == seed_from_b
    assert len(seed_from_a) == 32
    assert seed_from_a != secret_ab
    assert derive_pair_seed(secret_ab, b"other-run", 4, 9) != seed_from_a
    assert derive_pair_seed(secret_ab, SESSION, 4, 10) != seed_from_a


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.binary(max_size=300))
def test_hkdf_sha256_gives_the_bytes_of_cryptography_hkdf(ikm: bytes, info: bytes) -> None:
    expected = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(ikm)
    assert hkdf_sha256(ikm, info) == expected


def test_pair_info_is_symmetric_and_length_prefixed() -> None:
    info = pair_info(b"run", 2, 5)
    assert info == pair_info(b"run", 5, 2)
    assert info.startswith(PROTOCOL_LABEL)

    def be64(value: int) -> bytes:
        return value.to_bytes(8, "big")

    assert info == PROTOCOL_LABEL + be64(3) + b"run" + be64(2) + be64(5)
    with pytest.raises(ValueError, match="two distinct indices"):
        pair_info(b"run", 3, 3)


def test_pairwise_masks_cancel() -> None:
    seed = derive_pair_seed(bytes(range(32)), SESSION, 1, 2)
    mask = expand_seed(seed, 1000)
    assert pairwise_sign(1, 2) == 1 and pairwise_sign(2, 1) == -1
    with pytest.raises(ValueError, match="no mask with itself"):
        pairwise_sign(3, 3)
    from_low = np.zeros(1000, dtype=np.uint64) + mask  # e < v adds
    from_high = np.zeros(1000, dtype=np.uint64) - mask  # v > e subtracts
    np.testing.assert_array_equal(from_low + from_high, np.zeros(1000, dtype=np.uint64))
    assert np.count_nonzero(mask) == 1000


def test_prg_is_deterministic_and_prefix_consistent() -> None:
    seed = bytes(range(32))
    long = expand_seed(seed, 100)
    np.testing.assert_array_equal(expand_seed(seed, 100), long)
    np.testing.assert_array_equal(expand_seed(seed, 10), long[:10])
    assert not np.array_equal(expand_seed(bytes(32), 100), long)


# ----------------------------------------------------------------------------
# Uniformity of masked vectors and partial sums
# ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def uniformity_round() -> UniformityRound:
    """E = 5 clients with constant counts over C = 20,000 classes, on a sparse graph (k = 2)."""
    num_classes = 20_000
    counts = np.zeros((5, num_classes), dtype=np.int64)
    counts[1:] = 7  # client 0 holds zeros, the others a constant
    _, vectors = run_session(counts, degree=2)
    return counts, vectors


def test_uniformity_statistic_has_power(uniformity_round: UniformityRound) -> None:
    counts, vectors = uniformity_round
    assert not looks_uniform(counts.sum(axis=0).astype(np.uint64))
    top_bit_cleared = vectors[0] & np.uint64(2**63 - 1)  # one biased bit out of 64
    assert bit_p_values(top_bit_cleared)[63] < ALPHA
    assert not looks_uniform(top_bit_cleared)


def test_every_partial_sum_of_masked_vectors_is_uniform(uniformity_round: UniformityRound) -> None:
    """With self-masks even the full sum of the ``Y_e`` is uniform: only the unmasking reveals ``N_s``."""
    _, vectors = uniformity_round
    for size in (1, 2, 4, 5):
        for subset in combinations(range(len(vectors)), size):
            partial = np.add.reduce(np.stack([vectors[i] for i in subset]), axis=0, dtype=np.uint64)
            bits = bit_p_values(partial)
            assert bits.min() > ALPHA, f"subset {subset}: bit {bits.argmin()} p={bits.min():.3g}"
            byte_p = byte_p_value(partial)
            assert byte_p > ALPHA, f"subset {subset}: byte histogram p={byte_p:.3g}"


def test_single_masked_vector_hides_counts(uniformity_round: UniformityRound) -> None:
    counts, vectors = uniformity_round
    for row, masked in enumerate(vectors):
        assert not np.array_equal(masked, counts[row].astype(np.uint64))
        assert np.count_nonzero(masked == counts[row].astype(np.uint64)) == 0
        assert np.count_nonzero(masked >= np.uint64(2**63)) > 0.45 * masked.size


# ----------------------------------------------------------------------------
# Public keys
# ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("bad_key", "error", "match"),
    [
        (None, TypeError, "participant 2 must be bytes, got NoneType"),
        ("ab" * 16, TypeError, "participant 2 must be bytes, got str"),
        (bytearray(32), TypeError, "participant 2 must be bytes, got bytearray"),
        (bytes(31), ValueError, "participant 2 must be 32 bytes, got 31"),
        (bytes(33), ValueError, "participant 2 must be 32 bytes, got 33"),
        (b"", ValueError, "participant 2 must be 32 bytes, got 0"),
        (ZERO_KEY, ValueError, "participant 2 is not a valid point .*low-order"),
    ],
)
def test_bad_public_key(bad_key: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        load_public_key(bad_key, 2)  # type: ignore[arg-type]


def test_low_order_point_rejected_by_load_public_key() -> None:
    with pytest.raises(ValueError, match="participant 4 is not a valid point"):
        load_public_key(ZERO_KEY, 4)
    good = X25519PrivateKey.generate().public_key().public_bytes_raw()
    assert load_public_key(good, 4).public_bytes_raw() == good


# ----------------------------------------------------------------------------
# Count validation
# ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("counts", "error", "match"),
    [
        ([1, -1, 2], ValueError, "non-negative"),
        (np.array([1.0, -2.0]), ValueError, "non-negative"),
        ([1.5, 2.0], ValueError, "non-integer value 1.5"),
        ([1.0, float("nan")], ValueError, "NaN"),
        ([1.0, float("inf")], ValueError, "finite"),
        (np.array([2**63], dtype=np.uint64), ValueError, "< 2\\*\\*63"),
        (np.array([2**64 - 1], dtype=np.uint64), ValueError, "< 2\\*\\*63"),
        ([2.0**63], ValueError, "< 2\\*\\*63"),
        ([2**64 + 5], ValueError, "< 2\\*\\*63"),
        ([[1, 2], [3, 4]], ValueError, "1-D vector .* got shape \\(2, 2\\)"),
        ([], ValueError, "non-empty 1-D"),
        (5, ValueError, "got shape \\(\\)"),
        ([True, False], TypeError, "dtype bool"),
        (["1", "2"], TypeError, "integers or integral floats"),
        ([1 + 0j], TypeError, "integers or integral floats"),
        ([None, 1], TypeError, "integers or integral floats"),
    ],
)
def test_bad_counts(counts: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        validate_counts(counts)  # type: ignore[arg-type]


def test_counts_are_copied_and_converted() -> None:
    source = np.array([3.0, 0.0, 2.0**52])
    converted = validate_counts(source)
    assert converted.dtype == np.uint64
    np.testing.assert_array_equal(converted, [3, 0, 2**52])
    source[0] = 99.0
    assert converted[0] == 3
    assert validate_counts([2**63 - 1])[0] == 2**63 - 1
    assert validate_counts(np.zeros(17, dtype=np.int32)).shape == (17,)


def test_every_pass_module_says_what_it_is_for_in_at_most_700_lines() -> None:
    """One job per file: no module of ``pass_protocol/`` grows past 700 lines, and each opens with its docstring."""
    package = Path(pass_protocol.__file__).parent
    for path in sorted(package.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert len(text.splitlines()) <= 700, f"{path.name} has {len(text.splitlines())} lines"
        assert ast.get_docstring(ast.parse(text)), f"{path.name} has no module docstring"
