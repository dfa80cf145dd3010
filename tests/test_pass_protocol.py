"""Tests of PASS: exactness, uniformity of partial sums, validation and key hygiene."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Sequence
from itertools import combinations

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.stats import chi2

from flmarket_flwr.pass_protocol import (
    COUNT_LIMIT,
    PROTOCOL_LABEL,
    PassAggregator,
    PassParticipant,
    derive_pair_seed,
    expand_seed,
    load_public_key,
    pair_info,
    pairwise_sign,
    unmask_sum,
    validate_counts,
)

SESSION = b"test-run-1"
ZERO_KEY = bytes(32)  # a low-order point: every X25519 exchange with it gives zeros
ALPHA = 1e-9  # per chi-square statistic; a few hundred statistics => false failure < 1e-6

UniformityRound = tuple[np.ndarray, list[np.ndarray]]


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------
def make_participants(
    counts: np.ndarray, session: bytes = SESSION, first_index: int = 0
) -> list[PassParticipant]:
    """One participant per row of ``counts``, indices ``first_index ...``."""
    return [
        PassParticipant(first_index + row, counts[row], session=session)
        for row in range(counts.shape[0])
    ]


def broadcast(participants: Sequence[PassParticipant]) -> dict[int, bytes]:
    """The key set the server would broadcast."""
    return {p.index: p.public_key for p in participants}


def masked_vectors(participants: Sequence[PassParticipant]) -> list[np.ndarray]:
    """Every participant's masked vector for the full key set."""
    keys = broadcast(participants)
    return [p.masked_counts(keys) for p in participants]


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
# Exactness
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
    participants = make_participants(given_counts)
    total = unmask_sum(masked_vectors(participants))
    assert total.dtype == np.int64
    assert total.shape == (num_classes,)
    np.testing.assert_array_equal(total, counts.sum(axis=0))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    num_clients=st.integers(3, 30),
    num_classes=st.integers(1, 1000),
    seed=st.integers(0, 2**32 - 1),
    kind=st.sampled_from(["int64", "uint64", "float"]),
)
def test_exact_sum_many_small_rounds(
    num_clients: int, num_classes: int, seed: int, kind: str
) -> None:
    _check_exact_sum(num_clients, num_classes, seed, kind)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    num_clients=st.integers(3, 200),
    num_classes=st.integers(1, 1000),
    seed=st.integers(0, 2**32 - 1),
)
def test_exact_sum_few_large_rounds(num_clients: int, num_classes: int, seed: int) -> None:
    _check_exact_sum(num_clients, num_classes, seed, "int64")


def test_paper_example_three_clients() -> None:
    counts = np.array([[3, 6, 8], [4, 4, 7], [10, 8, 5]])
    total = unmask_sum(masked_vectors(make_participants(counts)))
    np.testing.assert_array_equal(total, [17, 18, 20])


def test_exact_sum_up_to_the_count_limit() -> None:
    assert COUNT_LIMIT == 2**63
    counts = np.array(
        [[COUNT_LIMIT - 3, 0], [1, 2**62], [1, 2**62 - 1]], dtype=np.uint64
    )
    total = unmask_sum(masked_vectors(make_participants(counts)))
    np.testing.assert_array_equal(total, [COUNT_LIMIT - 1, COUNT_LIMIT - 1])


def test_all_input_forms_of_unmask_sum_agree() -> None:
    counts = np.arange(4 * 7).reshape(4, 7)
    participants = make_participants(counts, first_index=10)
    vectors = masked_vectors(participants)
    expected = counts.sum(axis=0)
    by_index = {p.index: y for p, y in zip(participants, vectors)}
    np.testing.assert_array_equal(unmask_sum(vectors), expected)
    np.testing.assert_array_equal(unmask_sum(tuple(vectors)), expected)
    np.testing.assert_array_equal(unmask_sum(by_index), expected)
    np.testing.assert_array_equal(unmask_sum(np.stack(vectors)), expected)


def test_keys_given_as_pairs_or_mapping_give_the_same_vector() -> None:
    participants = make_participants(np.ones((4, 5), dtype=np.int64))
    keys = broadcast(participants)
    target = participants[2]
    from_mapping = target.masked_counts(keys)
    from_pairs = target.masked_counts(list(reversed(keys.items())))
    np.testing.assert_array_equal(from_mapping, from_pairs)


def test_non_contiguous_indices() -> None:
    counts = np.array([[1, 2], [3, 4], [5, 6], [7, 8]])
    participants = [
        PassParticipant(index, row, session=SESSION) for index, row in zip([0, 7, 3, 2**40], counts)
    ]
    np.testing.assert_array_equal(unmask_sum(masked_vectors(participants)), [16, 20])


# ----------------------------------------------------------------------------
# Pairwise masks and seeds
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


def test_zero_counts_masks_cancel_over_all_participants() -> None:
    participants = make_participants(np.zeros((6, 50), dtype=np.int64))
    vectors = masked_vectors(participants)
    total = np.add.reduce(np.stack(vectors), axis=0, dtype=np.uint64)
    np.testing.assert_array_equal(total, np.zeros(50, dtype=np.uint64))
    assert all(np.count_nonzero(y) == 50 for y in vectors)


def test_prg_is_deterministic_and_prefix_consistent() -> None:
    seed = bytes(range(32))
    long = expand_seed(seed, 100)
    np.testing.assert_array_equal(expand_seed(seed, 100), long)
    np.testing.assert_array_equal(expand_seed(seed, 10), long[:10])
    assert not np.array_equal(expand_seed(bytes(32), 100), long)


def test_session_gives_fresh_masks_and_exact_sums() -> None:
    counts = np.array([[5, 0, 2], [1, 1, 1], [0, 9, 4], [2, 2, 2]])
    private_keys = [X25519PrivateKey.generate() for _ in counts]

    def run(session: bytes) -> list[np.ndarray]:
        participants = [
            PassParticipant(i, row, session=session, private_key=key)
            for i, (row, key) in enumerate(zip(counts, private_keys))
        ]
        return masked_vectors(participants)

    first, second, first_again = run(b"run-a"), run(b"run-b"), run(b"run-a")
    for y_first, y_second, y_again in zip(first, second, first_again):
        assert not np.array_equal(y_first, y_second)
        np.testing.assert_array_equal(y_first, y_again)  # rebuilt participants agree
    np.testing.assert_array_equal(unmask_sum(first), counts.sum(axis=0))
    np.testing.assert_array_equal(unmask_sum(second), counts.sum(axis=0))


def test_key_pair_is_bound_to_one_participant_set() -> None:
    participants = make_participants(np.ones((4, 3), dtype=np.int64))
    keys = broadcast(participants)
    first = participants[0].masked_counts(keys)
    np.testing.assert_array_equal(participants[0].masked_counts(dict(keys)), first)
    survivors = {i: k for i, k in keys.items() if i != 3}
    with pytest.raises(ValueError, match="fresh key pair"):
        participants[0].masked_counts(survivors)


def test_failed_call_does_not_bind_the_key_pair() -> None:
    participants = make_participants(np.ones((4, 3), dtype=np.int64))
    keys = broadcast(participants)
    with pytest.raises(ValueError, match="participant 3"):
        participants[0].masked_counts({**keys, 3: ZERO_KEY})
    participants[0].masked_counts({i: k for i, k in keys.items() if i != 3})


# ----------------------------------------------------------------------------
# Uniformity of partial sums
# ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def uniformity_round() -> UniformityRound:
    """E = 5 clients with constant counts over C = 20,000 classes."""
    num_classes = 20_000
    counts = np.zeros((5, num_classes), dtype=np.int64)
    counts[1:] = 7  # client 0 holds zeros, the others a constant
    return counts, masked_vectors(make_participants(counts))


def test_uniformity_statistic_has_power(uniformity_round: UniformityRound) -> None:
    counts, vectors = uniformity_round
    full_sum = np.add.reduce(np.stack(vectors), axis=0, dtype=np.uint64)
    np.testing.assert_array_equal(full_sum, counts.sum(axis=0).astype(np.uint64))
    assert not looks_uniform(full_sum)
    top_bit_cleared = vectors[0] & np.uint64(2**63 - 1)  # one biased bit out of 64
    assert bit_p_values(top_bit_cleared)[63] < ALPHA
    assert not looks_uniform(top_bit_cleared)


def test_every_strict_subset_sum_is_uniform(uniformity_round: UniformityRound) -> None:
    _, vectors = uniformity_round
    for size in (1, 2, 4):
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
# Aggregator
# ----------------------------------------------------------------------------
def test_aggregator_full_round_in_any_arrival_order() -> None:
    rng = np.random.default_rng(3)
    counts = rng.integers(0, 1000, size=(6, 12))
    participants = make_participants(counts, first_index=1)
    round_ = PassAggregator([p.index for p in participants], num_classes=12)
    assert round_.indices == (1, 2, 3, 4, 5, 6)
    for p in rng.permutation(participants):
        round_.add_public_key(p.index, p.public_key)
    assert round_.missing_public_keys() == ()
    keys = round_.public_keys()
    assert keys == broadcast(participants)
    for p in rng.permutation(participants):
        assert p.index in round_.missing_masked()
        round_.add_masked(p.index, p.masked_counts(keys))
    assert round_.missing_masked() == ()
    np.testing.assert_array_equal(round_.result(), counts.sum(axis=0))


def test_aggregator_infers_num_classes() -> None:
    participants = make_participants(np.ones((3, 4), dtype=np.int64))
    round_ = PassAggregator([0, 1, 2])
    assert round_.num_classes is None
    for p in participants:
        round_.add_public_key(p.index, p.public_key)
    keys = round_.public_keys()
    round_.add_masked(0, participants[0].masked_counts(keys))
    assert round_.num_classes == 4
    with pytest.raises(ValueError, match="participant 1 has length 3, expected 4"):
        round_.add_masked(1, np.zeros(3, dtype=np.uint64))


def test_aggregator_refuses_result_after_a_dropout() -> None:
    participants = make_participants(np.ones((4, 3), dtype=np.int64))
    round_ = PassAggregator([0, 1, 2, 3])
    for p in participants:
        round_.add_public_key(p.index, p.public_key)
    keys = round_.public_keys()
    for p in participants[:3]:
        round_.add_masked(p.index, p.masked_counts(keys))
    assert round_.missing_masked() == (3,)
    with pytest.raises(ValueError, match=r"missing from participants \[3\].*fresh keys"):
        round_.result()


def test_aggregator_validation_stores_nothing_on_error() -> None:
    participants = make_participants(np.ones((3, 4), dtype=np.int64))
    round_ = PassAggregator([0, 1, 2], num_classes=4)
    good = participants[0].public_key
    with pytest.raises(ValueError, match="participant 5 is not part"):
        round_.add_public_key(5, good)
    with pytest.raises(ValueError, match="participant 0 must be 32 bytes"):
        round_.add_public_key(0, good[:31])
    with pytest.raises(TypeError, match="participant 0 must be bytes"):
        round_.add_public_key(0, bytearray(good))
    with pytest.raises(ValueError, match="participant 0 is not a valid point"):
        round_.add_public_key(0, ZERO_KEY)
    assert round_.missing_public_keys() == (0, 1, 2)
    round_.add_public_key(0, good)
    with pytest.raises(ValueError, match="participant 0 already submitted a public key"):
        round_.add_public_key(0, participants[1].public_key)
    with pytest.raises(ValueError, match="participant 1 sent the key of participant 0"):
        round_.add_public_key(1, good)
    with pytest.raises(ValueError, match="public keys still missing from participants \\[1, 2\\]"):
        round_.public_keys()
    with pytest.raises(ValueError, match="participant 0 arrived before all public keys"):
        round_.add_masked(0, np.zeros(4, dtype=np.uint64))
    for p in participants[1:]:
        round_.add_public_key(p.index, p.public_key)
    keys = round_.public_keys()
    with pytest.raises(ValueError, match="participant 1 has length 5, expected 4"):
        round_.add_masked(1, np.zeros(5, dtype=np.uint64))
    with pytest.raises(ValueError, match="participant 1 must be a uint64"):
        round_.add_masked(1, np.zeros(4, dtype=np.int64))
    with pytest.raises(ValueError, match="participant 1 must be a non-empty 1-D"):
        round_.add_masked(1, np.zeros((2, 2), dtype=np.uint64))
    with pytest.raises(ValueError, match="participant 9 is not part"):
        round_.add_masked(9, np.zeros(4, dtype=np.uint64))
    assert round_.missing_masked() == (0, 1, 2)
    vector = participants[1].masked_counts(keys)
    round_.add_masked(1, vector)
    with pytest.raises(ValueError, match="participant 1 already submitted a masked vector"):
        round_.add_masked(1, vector)
    assert round_.missing_masked() == (0, 2)


def test_aggregator_copies_submitted_vectors() -> None:
    participants = make_participants(np.full((3, 2), 4, dtype=np.int64))
    round_ = PassAggregator([0, 1, 2])
    for p in participants:
        round_.add_public_key(p.index, p.public_key)
    keys = round_.public_keys()
    vectors = [p.masked_counts(keys) for p in participants]
    for p, y in zip(participants, vectors):
        round_.add_masked(p.index, y)
    vectors[0][:] = 0  # the caller mutates its own array afterwards
    np.testing.assert_array_equal(round_.result(), [12, 12])


@pytest.mark.parametrize(
    ("indices", "error", "match"),
    [
        ([0, 1], ValueError, "at least 3 participants, got 2"),
        ([0, 1, 1, 2], ValueError, r"duplicate participant indices \[1\]"),
        ([0, 1, -2], ValueError, "non-negative"),
        ([0, 1, True], TypeError, "must be a non-negative int"),
    ],
)
def test_aggregator_rejects_bad_rounds(
    indices: list[object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        PassAggregator(indices)  # type: ignore[arg-type]


def test_aggregator_rejects_bad_num_classes() -> None:
    with pytest.raises(ValueError, match="num_classes must be >= 1"):
        PassAggregator([0, 1, 2], num_classes=0)
    with pytest.raises(TypeError, match="num_classes must be an int"):
        PassAggregator([0, 1, 2], num_classes=2.0)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------
# Participant validation
# ----------------------------------------------------------------------------
@pytest.fixture()
def trio() -> list[PassParticipant]:
    return make_participants(np.array([[1, 2], [3, 4], [5, 6]]))


def test_fewer_than_three_participants_is_refused(trio: list[PassParticipant]) -> None:
    keys = broadcast(trio[:2])
    with pytest.raises(ValueError, match="at least 3 participants, got 2: with 2 each learns"):
        trio[0].masked_counts(keys)
    with pytest.raises(ValueError, match="at least 3 participants, got 1"):
        trio[0].masked_counts({0: trio[0].public_key})


def test_missing_own_key(trio: list[PassParticipant]) -> None:
    keys = broadcast(trio)
    extra = PassParticipant(3, [0, 0])
    keys_without_self = {**{i: k for i, k in keys.items() if i != 0}, 3: extra.public_key}
    with pytest.raises(ValueError, match="own index 0 is missing"):
        trio[0].masked_counts(keys_without_self)


def test_own_key_mismatch(trio: list[PassParticipant]) -> None:
    keys = broadcast(trio)
    keys[0] = PassParticipant(0, [0, 0]).public_key
    with pytest.raises(ValueError, match="own index 0 does not match"):
        trio[0].masked_counts(keys)


@pytest.mark.parametrize(
    ("bad_key", "error", "match"),
    [
        (None, TypeError, "participant 2 must be bytes, got NoneType"),
        ("ab" * 16, TypeError, "participant 2 must be bytes, got str"),
        (bytes(31), ValueError, "participant 2 must be 32 bytes, got 31"),
        (bytes(33), ValueError, "participant 2 must be 32 bytes, got 33"),
        (b"", ValueError, "participant 2 must be 32 bytes, got 0"),
        (ZERO_KEY, ValueError, "participant 2 is not a valid point .*low-order"),
    ],
)
def test_bad_peer_key(
    trio: list[PassParticipant], bad_key: object, error: type[Exception], match: str
) -> None:
    keys: dict[int, object] = dict(broadcast(trio))
    keys[2] = bad_key
    with pytest.raises(error, match=match):
        trio[0].masked_counts(keys)  # type: ignore[arg-type]


def test_low_order_point_rejected_by_load_public_key() -> None:
    with pytest.raises(ValueError, match="participant 4 is not a valid point"):
        load_public_key(ZERO_KEY, 4)
    good = X25519PrivateKey.generate().public_key().public_bytes_raw()
    assert load_public_key(good, 4).public_bytes_raw() == good


def test_duplicate_index_in_pairs(trio: list[PassParticipant]) -> None:
    pairs = list(broadcast(trio).items()) + [(1, PassParticipant(1, [0, 0]).public_key)]
    with pytest.raises(ValueError, match="duplicate participant index 1"):
        trio[0].masked_counts(pairs)


def test_duplicate_key_under_two_indices(trio: list[PassParticipant]) -> None:
    keys = broadcast(trio)
    keys[7] = keys[1]
    with pytest.raises(ValueError, match="duplicate public key: participants 1 and 7"):
        trio[0].masked_counts(keys)


@pytest.mark.parametrize(
    ("entries", "error", "match"),
    [
        ([(0, b"x" * 32, 1)], TypeError, "pairs"),
        ([b"x" * 32], TypeError, "pairs"),
        ([("1", b"x" * 32)], TypeError, "participant index must be a non-negative int"),
        ([(-1, b"x" * 32)], ValueError, "non-negative"),
        ([(False, b"x" * 32)], TypeError, "non-negative int, got bool"),
    ],
)
def test_malformed_key_entries(
    trio: list[PassParticipant], entries: list[object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        trio[0].masked_counts(entries)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("index", "error", "match"),
    [
        (True, TypeError, "got bool"),
        (-1, ValueError, "non-negative"),
        (1.0, TypeError, "got float"),
        ("1", TypeError, "got str"),
        (2**64, ValueError, "below 2\\*\\*64"),
    ],
)
def test_bad_participant_index(index: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        PassParticipant(index, [1, 2])  # type: ignore[arg-type]


def test_numpy_integer_index_is_accepted() -> None:
    assert PassParticipant(np.int64(4), [1]).index == 4  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("session", "error", "match"),
    [("run", TypeError, "session must be bytes"), (b"", ValueError, "non-empty")],
)
def test_bad_session(session: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        PassParticipant(0, [1], session=session)  # type: ignore[arg-type]


def test_bad_private_key_type() -> None:
    with pytest.raises(TypeError, match="private_key must be an X25519PrivateKey"):
        PassParticipant(0, [1], private_key=bytes(32))  # type: ignore[arg-type]


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
        PassParticipant(0, counts)  # type: ignore[arg-type]


def test_counts_are_copied_and_converted() -> None:
    source = np.array([3.0, 0.0, 2.0**52])
    converted = validate_counts(source)
    assert converted.dtype == np.uint64
    np.testing.assert_array_equal(converted, [3, 0, 2**52])
    source[0] = 99.0
    assert converted[0] == 3
    assert validate_counts([2**63 - 1])[0] == 2**63 - 1
    assert PassParticipant(0, np.zeros(17, dtype=np.int32)).num_classes == 17


# ----------------------------------------------------------------------------
# unmask_sum validation
# ----------------------------------------------------------------------------
def test_unmask_sum_rejects_non_uint64() -> None:
    with pytest.raises(TypeError, match="vector 1 must be a uint64 numpy array, got int64"):
        unmask_sum([np.zeros(3, np.uint64), np.zeros(3, np.int64), np.zeros(3, np.uint64)])
    with pytest.raises(TypeError, match="participant 4 must be a uint64 numpy array, got float64"):
        unmask_sum({2: np.zeros(3, np.uint64), 3: np.zeros(3, np.uint64), 4: np.zeros(3)})
    with pytest.raises(TypeError, match="must be a uint64 numpy array, got list"):
        unmask_sum([[0, 0], [0, 0], [0, 0]])
    with pytest.raises(TypeError, match="array of masked vectors must be a uint64"):
        unmask_sum(np.zeros((3, 3), dtype=np.int64))


def test_unmask_sum_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match="at least 3 participants, got 2"):
        unmask_sum([np.zeros(3, np.uint64)] * 2)
    with pytest.raises(ValueError, match="vector 2 has length 4, expected 3"):
        unmask_sum([np.zeros(3, np.uint64), np.zeros(3, np.uint64), np.zeros(4, np.uint64)])
    with pytest.raises(ValueError, match="vector 0 must be a non-empty 1-D"):
        unmask_sum([np.zeros((1, 3), np.uint64)] * 3)
    with pytest.raises(ValueError, match="must be 2-D"):
        unmask_sum(np.zeros((3, 3, 3), dtype=np.uint64))
    with pytest.raises(ValueError, match="row 0 must be a non-empty 1-D"):
        unmask_sum(np.zeros((3, 0), dtype=np.uint64))


def test_unmask_sum_detects_an_incomplete_set() -> None:
    participants = make_participants(np.full((5, 64), 3, dtype=np.int64))
    vectors = masked_vectors(participants)
    # P(all 64 partial-sum entries < 2**63) = 2**-64: detection is certain in practice
    with pytest.raises(ValueError, match="probably incomplete"):
        unmask_sum(vectors[:4])
    with pytest.raises(ValueError, match="probably incomplete"):
        unmask_sum(vectors[1:])
    np.testing.assert_array_equal(unmask_sum(vectors), np.full(64, 15))


# ----------------------------------------------------------------------------
# Key hygiene
# ----------------------------------------------------------------------------
def test_participant_cannot_be_pickled_or_copied() -> None:
    participant = PassParticipant(1, [1, 2, 3])
    with pytest.raises(TypeError, match="cannot be pickled or copied"):
        pickle.dumps(participant)
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        with pytest.raises(TypeError, match="cannot be pickled"):
            pickle.dumps(participant, protocol=protocol)
    with pytest.raises(TypeError, match="cannot be pickled or copied"):
        copy.copy(participant)
    with pytest.raises(TypeError, match="cannot be pickled or copied"):
        copy.deepcopy(participant)
    with pytest.raises(TypeError, match="cannot be pickled or copied"):
        copy.deepcopy({"nested": [participant]})
    with pytest.raises(TypeError, match="cannot be pickled or copied"):
        participant.__getstate__()


def test_repr_shows_index_and_fingerprint_only() -> None:
    private_key = X25519PrivateKey.generate()
    private_bytes = private_key.private_bytes_raw()
    participant = PassParticipant(12, [1, 2, 3], private_key=private_key)
    text = repr(participant)
    assert text.startswith("PassParticipant(index=12, public_key_fingerprint=")
    assert private_bytes.hex() not in text
    assert private_bytes.hex()[:16] not in text
    assert participant.public_key.hex() not in text
    assert str(participant) == text


def test_no_public_attribute_exposes_the_private_key() -> None:
    private_key = X25519PrivateKey.generate()
    private_bytes = private_key.private_bytes_raw()
    participant = PassParticipant(2, [4, 5, 6], session=b"s", private_key=private_key)
    public_names = [name for name in dir(participant) if not name.startswith("_")]
    assert {"index", "num_classes", "public_key", "masked_counts"} <= set(public_names)
    for name in public_names:
        value = getattr(participant, name)
        assert not isinstance(value, X25519PrivateKey), name
        if isinstance(value, (bytes, bytearray)):
            assert private_bytes not in value, name
    # the key lives only in the name-mangled slot, nowhere else in the instance
    state = vars(participant)
    assert state["_PassParticipant__private_key"] is private_key
    others = [v for k, v in state.items() if k != "_PassParticipant__private_key"]
    assert not any(isinstance(v, X25519PrivateKey) for v in others)
    assert not any(isinstance(v, bytes) and private_bytes in v for v in others)
    assert participant.public_key == private_key.public_key().public_bytes_raw()
    assert len(participant.public_key) == 32
