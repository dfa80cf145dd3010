"""Pre-training client selectors: the common contract, each method's preference, and the errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from flmarket_flwr.pricing import cohort_budget, run_auction, score
from simulations.baselines.selectors import (
    SELECTORS,
    dds_homogeneity,
    dice_quality,
    flmarket_scores,
    select_clients,
    select_dds,
    select_dice,
    select_flmarket,
    select_qbs,
    select_rs,
)

NAMES = ["flmarket", "rs", "qbs", "dice", "dds"]


@st.composite
def markets(draw: st.DrawFn, max_clients: int = 12, max_classes: int = 6) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Random label counts (at least one sample in all), bids, a cohort size and a seed."""
    num_clients = draw(st.integers(1, max_clients))
    num_classes = draw(st.integers(1, max_classes))
    # Small counts with many zeros make empty clients, one-class clients and ties common.
    cells = st.one_of(st.just(0), st.integers(0, 5), st.integers(0, 400))
    flat = draw(st.lists(cells, min_size=num_clients * num_classes, max_size=num_clients * num_classes))
    counts = np.array(flat, dtype=np.int64).reshape(num_clients, num_classes)
    if counts.sum() == 0:
        counts[draw(st.integers(0, num_clients - 1)), draw(st.integers(0, num_classes - 1))] = 1
    bids = np.array(draw(st.lists(st.floats(0.1, 100.0), min_size=num_clients, max_size=num_clients)))
    num_selected = draw(st.integers(1, num_clients))
    seed = draw(st.integers(0, 2**32 - 1))
    return counts, bids, num_selected, seed


# ----------------------------------------------------------------------------- common contract


def test_registry_names() -> None:
    assert sorted(SELECTORS) == sorted(NAMES)
    assert SELECTORS["dice"] is select_dice and SELECTORS["dds"] is select_dds


@settings(max_examples=150, deadline=None)
@given(market=markets(), name=st.sampled_from(NAMES))
def test_every_selector_returns_distinct_valid_positions_deterministically(
    market: tuple[np.ndarray, np.ndarray, int, int], name: str
) -> None:
    counts, bids, num_selected, seed = market
    first = select_clients(name, counts, num_selected, seed=seed, bids=bids)
    again = select_clients(name, counts.copy(), num_selected, seed=seed, bids=bids.copy())
    # FLMarket buys only clients with a positive score (the product's rule); the others fill every seat.
    expected = min(num_selected, positive_scores(counts)) if name == "flmarket" else num_selected
    assert first.shape == (expected,)
    assert np.issubdtype(first.dtype, np.integer)
    assert len(set(first.tolist())) == expected
    assert np.all((first >= 0) & (first < counts.shape[0]))
    np.testing.assert_array_equal(first, again)


@settings(max_examples=100, deadline=None)
@given(market=markets(), name=st.sampled_from(["flmarket", "qbs", "dice", "dds"]))
def test_deterministic_selectors_ignore_the_seed_and_nest(
    market: tuple[np.ndarray, np.ndarray, int, int], name: str
) -> None:
    # Priority order: the cohort of size n is the first n of the full ranking.
    counts, bids, num_selected, seed = market
    full = select_clients(name, counts, counts.shape[0], seed=0, bids=bids)
    np.testing.assert_array_equal(select_clients(name, counts, num_selected, seed=seed, bids=bids), full[:num_selected])
    ranked = [e for e in range(counts.shape[0]) if name != "flmarket" or flmarket_scores(counts)[e] > 0]
    assert sorted(full.tolist()) == ranked


def test_select_clients_dispatches_case_insensitively() -> None:
    counts = np.array([[1, 2], [5, 5], [0, 3]])
    np.testing.assert_array_equal(select_clients("QBS", counts, 2), select_qbs(counts, 2))
    np.testing.assert_array_equal(select_clients("Dice", counts, 3), select_dice(counts, 3))


def test_float_counts_with_integral_values_are_accepted() -> None:
    counts = np.array([[1.0, 2.0], [5.0, 5.0], [0.0, 3.0]])
    np.testing.assert_array_equal(select_qbs(counts, 3), [1, 0, 2])


def test_keywords_of_other_selectors_are_ignored() -> None:
    counts = np.array([[4, 4], [9, 1], [2, 2]])
    bids = np.ones(3)
    embeddings = np.eye(3)
    expected = select_qbs(counts, 2)
    np.testing.assert_array_equal(select_qbs(counts, 2, bids=bids, embeddings=embeddings, volume_weight=0.3), expected)


# ----------------------------------------------------------------------------- RS


def test_rs_changes_with_the_seed() -> None:
    counts = np.ones((20, 3), dtype=int)
    draws = {tuple(select_rs(counts, 5, seed=seed).tolist()) for seed in range(30)}
    assert len(draws) >= 25  # C(20, 5) * 5! orders: repeats among 30 seeds are very unlikely
    np.testing.assert_array_equal(select_rs(counts, 5, seed=7), select_rs(counts, 5, seed=7))


def test_rs_is_uniform_over_clients() -> None:
    num_clients, num_selected, trials = 10, 3, 4000
    counts = np.ones((num_clients, 2), dtype=int)
    chosen = np.zeros(num_clients)
    first = np.zeros(num_clients)
    for seed in range(trials):
        picked = select_rs(counts, num_selected, seed=seed)
        chosen[picked] += 1
        first[picked[0]] += 1
    # Each client is in the cohort with probability k/E and first with probability 1/E.
    np.testing.assert_allclose(chosen / trials, num_selected / num_clients, atol=0.03)
    assert chisquare(chosen).pvalue > 1e-3
    assert chisquare(first).pvalue > 1e-3


# ----------------------------------------------------------------------------- QBS


def test_qbs_picks_the_largest_volumes_with_ties_to_lower_position() -> None:
    counts = np.array([[5, 5], [30, 0], [1, 1], [0, 10], [7, 3], [20, 20]])
    # Volumes: 10, 30, 2, 10, 10, 40.
    np.testing.assert_array_equal(select_qbs(counts, 6), [5, 1, 0, 3, 4, 2])
    np.testing.assert_array_equal(select_qbs(counts, 2), [5, 1])


@settings(max_examples=100, deadline=None)
@given(market=markets())
def test_qbs_cohort_volumes_dominate_the_rest(market: tuple[np.ndarray, np.ndarray, int, int]) -> None:
    counts, _, num_selected, _ = market
    volumes = counts.sum(axis=1)
    picked = select_qbs(counts, num_selected)
    rest = np.setdiff1d(np.arange(counts.shape[0]), picked)
    assert np.all(np.diff(volumes[picked]) <= 0)
    if rest.size:
        assert volumes[picked].min() >= volumes[rest].max()


# ----------------------------------------------------------------------------- DICE


def test_dice_prefers_a_larger_balanced_client() -> None:
    counts = np.array(
        [
            [50] * 10,  # smaller, balanced
            [1000] + [0] * 9,  # as large, one class
            [100] * 10,  # larger, balanced
        ]
    )
    assert select_dice(counts, 1)[0] == 2
    np.testing.assert_array_equal(select_dice(counts, 3), [2, 0, 1])
    np.testing.assert_allclose(dice_quality(counts), [0.5, 0.5, 1.0])


def test_dice_weight_moves_between_volume_and_balance() -> None:
    counts = np.array([[100, 100], [400, 0]])
    np.testing.assert_array_equal(select_dice(counts, 2, volume_weight=1.0), [1, 0])  # QBS
    np.testing.assert_array_equal(select_dice(counts, 2, volume_weight=0.0), [0, 1])  # balance only


def test_dice_ranks_empty_clients_last() -> None:
    # Without the rule an empty client (std 0) would look perfectly balanced.
    counts = np.array([[0, 0, 0], [40, 0, 0], [15, 15, 15], [0, 0, 0]])
    np.testing.assert_array_equal(select_dice(counts, 4), [2, 1, 0, 3])
    assert np.isneginf(dice_quality(counts)[[0, 3]]).all()


def test_dice_reproduces_the_papers_table_5_split() -> None:
    # FLMarket paper, Table 5 (CIFAR-10, D6, 10 of 20): both methods pick clients 2, 3, 7, 16,
    # 17, 19; DICE adds 1, 5, 13, 18 where FLMarket adds 4, 8, 10, 12. Among these 14 clients
    # the reconstruction must rank FLMarket's four last.
    table = {
        2: [9, 203, 19, 224, 224, 318, 362, 40, 0, 0],
        3: [5, 120, 112, 311, 472, 58, 0, 319, 360, 0],
        7: [6, 125, 66, 14, 207, 75, 6, 97, 121, 36],
        16: [151, 378, 29, 4, 85, 44, 125, 12, 69, 174],
        17: [30, 42, 171, 201, 11, 1, 322, 111, 53, 70],
        19: [33, 212, 23, 99, 29, 64, 141, 109, 157, 25],
        4: [220, 11, 2, 46, 659, 0, 55, 16, 169, 143],
        8: [401, 11, 56, 6, 724, 66, 36, 5, 25, 6],
        10: [1, 244, 13, 93, 4, 83, 52, 191, 1, 25],
        12: [287, 9, 42, 65, 13, 5, 114, 600, 45, 21],
        1: [530, 38, 59, 349, 33, 346, 209, 0, 0, 0],
        5: [281, 174, 211, 4, 247, 570, 0, 0, 0, 0],
        13: [257, 159, 37, 13, 125, 628, 180, 0, 0, 0],
        18: [2, 605, 43, 133, 166, 271, 398, 0, 0, 0],
    }
    ids = np.array(list(table))
    picked = ids[select_dice(np.array(list(table.values())), 10)]
    assert set(picked.tolist()) == {2, 3, 7, 16, 17, 19, 1, 5, 13, 18}


# ----------------------------------------------------------------------------- DDS


def test_dds_homogeneity_values() -> None:
    counts = np.array([[5, 5, 5, 5], [20, 0, 0, 0], [10, 10, 0, 0], [0, 0, 0, 0]])
    # TV to uniform: 0, 3/4, 1/2 -> rescaled by 3/4: h = 1, 0, 1/3; empty client 0.
    np.testing.assert_allclose(dds_homogeneity(counts), [1.0, 0.0, 1.0 / 3.0, 0.0])


def test_dds_picks_the_uniform_client_then_a_different_one() -> None:
    counts = np.array(
        [
            [30, 10, 10, 10],  # skewed
            [10, 10, 10, 10],  # uniform
            [11, 10, 10, 9],  # nearly uniform, same content as client 1
            [9, 10, 11, 10],  # nearly uniform, different content
        ]
    )
    embeddings = np.array([[5.0, 5.0], [0.0, 0.0], [0.1, 0.0], [4.0, -4.0]])
    np.testing.assert_array_equal(select_dds(counts, 2, embeddings=embeddings), [1, 3])
    # Without the diversity term it is a ranking by homogeneity: the near-duplicate comes second.
    np.testing.assert_array_equal(select_dds(counts, 2, embeddings=embeddings, diversity_weight=0.0), [1, 2])


def test_dds_default_embeddings_are_label_distributions() -> None:
    counts = np.array(
        [
            [10, 10, 10, 10],  # uniform
            [10, 10, 10, 10],  # duplicate of client 0
            [20, 20, 0, 0],  # half-covering
            [0, 0, 20, 20],  # the other half
        ]
    )
    # Greedy: 0 (h = 1); then 2 beats the duplicate 1 (h 1/3 + 1 > 1 + 0); then 3, far from 2.
    np.testing.assert_array_equal(select_dds(counts, 4), [0, 2, 3, 1])
    same = select_dds(counts, 4, embeddings=counts / counts.sum(axis=1, keepdims=True))
    np.testing.assert_array_equal(same, [0, 2, 3, 1])


def test_dds_is_invariant_to_embedding_scale() -> None:
    rng = np.random.default_rng(3)
    counts = rng.integers(0, 50, size=(15, 5))
    embeddings = rng.normal(size=(15, 8))
    np.testing.assert_array_equal(
        select_dds(counts, 8, embeddings=embeddings), select_dds(counts, 8, embeddings=1000.0 * embeddings)
    )


def test_dds_ranks_empty_clients_last() -> None:
    counts = np.array([[0, 0], [3, 3], [0, 0], [6, 0]])
    np.testing.assert_array_equal(select_dds(counts, 4), [1, 3, 0, 2])


# ----------------------------------------------------------------------------- FLMarket


def positive_scores(counts: np.ndarray) -> int:
    return int(np.count_nonzero(flmarket_scores(counts) > 0))


@settings(max_examples=300, deadline=None)
@given(market=markets(), budget=st.one_of(st.none(), st.floats(0.01, 1e4)))
def test_flmarket_is_the_products_auction(market: tuple[np.ndarray, np.ndarray, int, int], budget) -> None:
    counts, bids, num_selected, _ = market
    scores = flmarket_scores(counts)
    np.testing.assert_allclose(scores, score(counts, counts.sum(axis=0), counts.shape[0]))
    picked = select_flmarket(counts, num_selected, bids=bids, budget=budget)
    buyable = min(num_selected, positive_scores(counts))
    if budget is None:  # the least budget that buys the cohort: the head of the ranking's positive scores
        if buyable:
            budget = cohort_budget(scores, bids, buyable)
        ranked = [int(e) for e in run_auction(scores, bids, 1.0).order if scores[e] > 0]
        np.testing.assert_array_equal(picked, ranked[:buyable])
    if budget is not None:
        np.testing.assert_array_equal(picked, run_auction(scores, bids, budget, num_winners=num_selected).winners)


def test_flmarket_prefers_the_scarce_class_at_equal_bids() -> None:
    # Class 1 is scarce (theta_1 = 0.9): its sole holder wins although it holds the least data.
    counts = np.array([[30, 0], [30, 0], [30, 0], [0, 10]])
    bids = np.full(4, 5.0)
    assert select_flmarket(counts, 1, bids=bids)[0] == 3
    np.testing.assert_array_equal(select_flmarket(counts, 4, bids=bids), [3, 0, 1, 2])
    assert select_qbs(counts, 1)[0] == 0  # volume alone disagrees


def test_flmarket_never_buys_zero_score_clients() -> None:
    # alpha = 4 / (4 * 2) = 0.5 <= 1: every phi, hence every score, is zero; the market buys nobody.
    counts = np.array([[1, 0], [0, 1], [1, 0], [0, 1]])
    bids = np.array([3.0, 1.0, 2.0, 4.0])
    assert np.all(flmarket_scores(counts) == 0)
    assert select_flmarket(counts, 3, bids=bids).size == 0
    assert select_flmarket(counts, 3, bids=bids, budget=1e9).size == 0


def test_a_binding_budget_buys_a_smaller_cohort_within_it() -> None:
    counts = np.array([[30, 5], [10, 10], [0, 12], [8, 1]])
    bids = np.array([4.0, 2.0, 3.0, 1.0])
    full = select_flmarket(counts, 3, bids=bids)
    assert full.size == 3
    tight = select_flmarket(counts, 3, bids=bids, budget=2.5)
    assert 0 < tight.size < 3
    np.testing.assert_array_equal(tight, full[: tight.size])


# ----------------------------------------------------------------------------- errors


GOOD = np.array([[3, 1], [0, 4], [2, 2]])


@pytest.mark.parametrize(
    ("counts", "error", "match"),
    [
        (np.array([1, 2, 3]), ValueError, "2-D"),
        (np.zeros((2, 2, 2), dtype=int), ValueError, "2-D"),
        (np.zeros((0, 3), dtype=int), ValueError, "at least one client"),
        (np.array([[1, -2], [3, 4]]), ValueError, "negative"),
        (np.array([[1.5, 2.0], [3.0, 4.0]]), ValueError, "non-integer"),
        (np.array([[np.nan, 2.0], [3.0, 4.0]]), ValueError, "NaN"),
        (np.array([["a", "b"]]), TypeError, "integer counts"),
        (np.array([[True, False]]), TypeError, "integer counts"),
    ],
)
@pytest.mark.parametrize("name", NAMES)
def test_bad_label_counts(name: str, counts: np.ndarray, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        select_clients(name, counts, 1, bids=np.ones(max(len(counts), 1)))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("num_selected", [0, -1, 4])
def test_num_selected_out_of_range(name: str, num_selected: int) -> None:
    with pytest.raises(ValueError, match=r"num_selected must be between 1 and the number of clients E=3"):
        select_clients(name, GOOD, num_selected, bids=np.ones(3))


@pytest.mark.parametrize("name", NAMES)
def test_num_selected_must_be_an_int(name: str) -> None:
    with pytest.raises(TypeError, match="num_selected must be an int"):
        select_clients(name, GOOD, 2.0, bids=np.ones(3))


def test_unknown_selector_lists_the_known_ones() -> None:
    with pytest.raises(
        ValueError, match=r"unknown selector 'oort'; known selectors: \['dds', 'dice', 'flmarket', 'qbs', 'rs'\]"
    ):
        select_clients("oort", GOOD, 1)


def test_unknown_keyword_is_rejected() -> None:
    with pytest.raises(TypeError, match=r"unknown selector keyword\(s\) \['embedding'\]"):
        select_clients("dds", GOOD, 1, embedding=np.eye(3))


def test_flmarket_needs_bids() -> None:
    with pytest.raises(ValueError, match="select_flmarket needs bids="):
        select_flmarket(GOOD, 2)


@pytest.mark.parametrize("bids", [np.ones(2), np.ones(4), np.ones((3, 1))])
def test_flmarket_bids_length_mismatch(bids: np.ndarray) -> None:
    with pytest.raises(ValueError, match=r"bids must have shape \(3,\), one per client"):
        select_flmarket(GOOD, 2, bids=bids)


def test_flmarket_invalid_bids_and_empty_market() -> None:
    with pytest.raises(ValueError, match="bids must be > 0"):
        select_flmarket(GOOD, 2, bids=np.array([1.0, 0.0, 1.0]))
    with pytest.raises(ValueError, match="all zero"):
        select_flmarket(np.zeros((3, 2), dtype=int), 2, bids=np.ones(3))


@pytest.mark.parametrize("embeddings", [np.ones((2, 4)), np.ones((4, 4))])
def test_dds_embeddings_with_wrong_rows(embeddings: np.ndarray) -> None:
    with pytest.raises(ValueError, match=f"one row per client: 3 clients, {embeddings.shape[0]} embedding rows"):
        select_dds(GOOD, 2, embeddings=embeddings)


def test_dds_embeddings_bad_shape_or_values() -> None:
    with pytest.raises(ValueError, match=r"embeddings must be 2-D"):
        select_dds(GOOD, 2, embeddings=np.ones(3))
    with pytest.raises(ValueError, match="NaN or infinite"):
        select_dds(GOOD, 2, embeddings=np.array([[0.0], [np.inf], [1.0]]))


def test_weights_out_of_range() -> None:
    with pytest.raises(ValueError, match=r"volume_weight must lie in \[0, 1\]"):
        select_dice(GOOD, 2, volume_weight=1.5)
    with pytest.raises(ValueError, match="diversity_weight must be >= 0"):
        select_dds(GOOD, 2, diversity_weight=-1.0)
    with pytest.raises(ValueError, match="diversity_weight must be a finite number"):
        select_dds(GOOD, 2, diversity_weight=float("nan"))


def test_bad_seed() -> None:
    with pytest.raises(ValueError, match="seed must be >= 0"):
        select_rs(GOOD, 2, seed=-1)
    with pytest.raises(TypeError, match="seed must be an int"):
        select_rs(GOOD, 2, seed=1.5)
