"""The data value score: closed form against the paper's sums, vectorisation, errors, and the same bits on every
machine (pinned, and re-computed under each BLAS kernel and vector unit this CPU has)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import subprocess
import sys
from decimal import Decimal, localcontext
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from flmarket_flwr.pricing import alpha, phi, score, theta
from flmarket_flwr.pricing.score import _ln, _log_factorial, _log_factorial_table


def direct_phi(x: int, alpha_value: float) -> float:
    """phi(x) = sum_{t=1..x} -ln(min(t/alpha, 1)), summed term by term."""
    return sum(-math.log(min(t / alpha_value, 1.0)) for t in range(1, x + 1))


def direct_score(local: np.ndarray, global_counts: np.ndarray, num_clients: int) -> float:
    """u_e = sum_c theta_c * phi(n_e^c), straight from the paper's equations."""
    total = int(global_counts.sum())
    alpha_value = total / (num_clients * global_counts.size)
    return sum(
        (1 - int(global_counts[c]) / total) * direct_phi(int(local[c]), alpha_value) for c in range(global_counts.size)
    )


@settings(max_examples=400, deadline=None)
@given(x=st.integers(0, 400), alpha_value=st.floats(0.05, 300.0))
def test_phi_closed_form_equals_direct_sum(x: int, alpha_value: float) -> None:
    expected = direct_phi(x, alpha_value)
    assert phi(x, alpha_value) == pytest.approx(expected, rel=1e-9, abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(
    counts=hnp.arrays(
        np.int64, hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=8), elements=st.integers(0, 60)
    ),
    extra_clients=st.integers(0, 5),
)
def test_score_equals_direct_formula(counts: np.ndarray, extra_clients: int) -> None:
    global_counts = counts.sum(axis=0)
    if global_counts.sum() == 0:
        global_counts = global_counts + 1
    num_clients = counts.shape[0] + extra_clients
    vectorised = score(counts, global_counts, num_clients)
    assert vectorised.shape == (counts.shape[0],)
    for row, value in zip(counts, vectorised, strict=True):
        expected = direct_score(row, global_counts, num_clients)
        assert value == pytest.approx(expected, rel=1e-9, abs=1e-9)
        assert score(row, global_counts, num_clients) == value  # a row alone has its bits in the matrix


def test_one_client_returns_float_and_many_return_array() -> None:
    global_counts = np.array([30, 20, 10])
    assert isinstance(score([10, 5, 2], global_counts, 3), float)
    assert score([[10, 5, 2], [20, 15, 8]], global_counts, 3).shape == (2,)


def test_theta_and_alpha_follow_the_paper() -> None:
    global_counts = np.array([50, 30, 20])
    np.testing.assert_allclose(theta(global_counts), [0.5, 0.7, 0.8])
    assert theta(global_counts).sum() == pytest.approx(global_counts.size - 1)
    assert alpha(global_counts, num_clients=5) == pytest.approx(100 / 15)


def test_phi_saturates_at_alpha_and_never_decreases() -> None:
    alpha_value = 7.5
    values = [phi(x, alpha_value) for x in range(30)]
    assert all(b >= a for a, b in pairwise(values))
    assert values[7] > values[6]
    assert all(v == values[7] for v in values[7:])
    assert phi(0, alpha_value) == 0.0
    assert phi(100, 0.9) == 0.0  # alpha <= 1: every term is zero


def test_scarce_classes_are_worth_more() -> None:
    global_counts = np.array([900, 100])
    rich_in_common, rich_in_scarce = score([[50, 0], [0, 50]], global_counts, num_clients=10)
    assert rich_in_scarce > rich_in_common


def test_counts_in_the_millions_match_lgamma() -> None:
    rng = np.random.default_rng(7)
    counts = rng.integers(0, 5_000_000, size=(500, 10))
    global_counts = counts.sum(axis=0)
    alpha_value = global_counts.sum() / (500 * 10)
    got = score(counts, global_counts, 500)
    weights = 1 - global_counts / global_counts.sum()
    for row, value in zip(counts[:20], got[:20], strict=True):
        saturated = [min(int(x), math.floor(alpha_value)) for x in row]
        expected = sum(
            w * (m * math.log(alpha_value) - math.lgamma(m + 1)) for w, m in zip(weights, saturated, strict=True)
        )
        assert value == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("local", "global_counts", "num_clients", "error", "message"),
    [
        ([1, -1], [5, 5], 2, ValueError, "negative"),
        ([1.5, 1], [5, 5], 2, ValueError, "non-integer"),
        ([np.nan, 1], [5, 5], 2, ValueError, "NaN"),
        ([1, 2, 3], [5, 5], 2, ValueError, "shape"),
        ([[[1, 2]]], [5, 5], 2, ValueError, "shape"),
        ([1, 2], [[5, 5]], 2, ValueError, "global_counts must have shape"),
        ([1, 2], [5, 5], 0, ValueError, "num_clients must be >= 1"),
        ([1, 2], [5, 5], 2.0, TypeError, "num_clients must be an int"),
        ([0, 0], [0, 0], 2, ValueError, "all zero"),
        ([6, 1], [5, 5], 2, ValueError, "exceed"),
        ([True, False], [5, 5], 2, TypeError, "integer counts"),
        (["a", "b"], [5, 5], 2, TypeError, "integer counts"),
        ([], [], 2, ValueError, "empty"),
        ([1, 2], [2**60, 5], 2, ValueError, "2\\*\\*53"),
    ],
)
def test_bad_input_names_the_problem(local, global_counts, num_clients, error, message) -> None:
    with pytest.raises(error, match=message):
        score(local, global_counts, num_clients)


@pytest.mark.parametrize("bad_alpha", [0.0, -1.0, math.nan, math.inf])
def test_phi_rejects_bad_alpha(bad_alpha: float) -> None:
    with pytest.raises(ValueError, match="alpha"):
        phi(3, bad_alpha)


# --- The same bits on every machine ---------------------------------------------------------------------------------
def _exact_ln(value: float | int) -> Decimal:
    with localcontext() as context:
        context.prec = 50
        return Decimal(value).ln()


def _ulps(got: float, exact: Decimal) -> float:
    return float(abs(Decimal(got) - exact) / Decimal(math.ulp(float(exact))))


@settings(max_examples=500, deadline=None)
@given(value=st.floats(min_value=5e-324, max_value=1.7e308) | st.floats(min_value=0.5, max_value=2.0))
def test_the_portable_logarithm_is_within_an_ulp(value: float) -> None:
    got = float(_ln(np.array([value]))[0])
    if value == 1.0:
        assert got == 0.0
    else:
        assert _ulps(got, _exact_ln(value)) < 1.0


@settings(max_examples=60, deadline=None)
@given(m=st.integers(0, 4095) | st.integers(4096, 20_000))
def test_the_log_factorial_is_within_three_ulps_of_ln_m_factorial(m: int) -> None:
    got = float(_log_factorial(np.array([m, m], dtype=np.int64))[0])  # two: the Stirling branch
    if m < 2:
        assert got == 0.0
    else:
        assert _ulps(got, _exact_ln(math.factorial(m))) < (1.0 if m < 4096 else 3.0)


@settings(max_examples=100, deadline=None)
@given(
    counts=hnp.arrays(
        np.int64,
        hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=40),
        elements=st.integers(0, 10_000) | st.integers(0, 5_000_000),
    ),
)
def test_a_row_scored_alone_has_its_bits_in_the_matrix(counts: np.ndarray) -> None:
    global_counts = counts.sum(axis=0) + 1
    scores = score(counts, global_counts, counts.shape[0])
    assert [score(row, global_counts, counts.shape[0]) for row in counts] == scores.tolist()


def score_bits() -> dict[str, str]:
    """The bits of the score on fixed markets, one per path of the computation: the ``ln(m!)`` table, Stirling's
    series, Stirling's series over repeated saturated counts, ``alpha <= 1``, a noisy ``N_s`` below a local count.
    Hex floats, and a SHA-256 over the big-endian bytes of a 6,000-client market."""
    markets = {
        "table": ([12, 0, 7, 30], [40, 25, 9, 60], 5, True),
        "stirling": (
            [[5_000_000, 123_457, 4_096, 0], [3_000_000, 7_000_001, 65_537, 12]],
            [8e6, 8e6, 7e4, 20],
            2,
            True,
        ),
        "alpha below one": ([[1, 0, 3], [0, 2, 1]], [1, 2, 4], 3, True),
        "noisy global": ([9, 4, 0], [7, 5, 3], 3, False),
    }
    bits = {}
    for name, (local, global_counts, clients, exact) in markets.items():
        values = np.atleast_1d(score(np.asarray(local), np.asarray(global_counts), clients, exact_global=exact))
        bits[name] = " ".join(float(value).hex() for value in values)
    counts = (np.arange(60_000, dtype=np.int64).reshape(6_000, 10) * 7_919) % 9_000  # alpha 4,500: saturated
    values = np.asarray(score(counts, counts.sum(axis=0), 6_000))
    bits["saturated, 6,000 clients"] = hashlib.sha256(values.astype(">f8").tobytes()).hexdigest()
    return bits


PINNED_SCORE_BITS = {
    "table": "0x1.52317bd5e2f8cp+3",
    "stirling": "0x1.36cb70b8c7bc2p+20 0x1.1985abab7740bp+21",
    "alpha below one": "0x0.0p+0 0x0.0p+0",
    "noisy global": "0x1.39d9ec6347ecap-1",
    "saturated, 6,000 clients": "f8ab181fd3832b844e886d6ba9bc5fb6e4d303d90cb3032ae74ba9e9bfda513b",
}


def test_the_score_has_its_pinned_bits() -> None:
    """IEEE-754 basic operations in a fixed order: these bits on any machine (a change of the rule changes them)."""
    assert score_bits() == PINNED_SCORE_BITS


def test_the_score_calls_nothing_whose_bits_depend_on_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """No BLAS product, no numpy or libm logarithm or gamma: each would round by the CPU's kernel."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the score called a function whose last bits depend on the CPU")

    for module, names in (
        (np, ("log", "log1p", "log2", "exp", "dot", "matmul", "inner", "einsum", "vdot")),
        (math, ("log", "log1p", "lgamma", "exp")),
    ):
        for name in names:
            monkeypatch.setattr(module, name, refuse)
    _log_factorial_table.cache_clear()  # the table too is built afresh under the patch
    try:
        assert score_bits() == PINNED_SCORE_BITS
    finally:
        _log_factorial_table.cache_clear()


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return set()
    return {
        flag
        for line in text.splitlines()
        if line.startswith(("flags", "Features"))
        for flag in line.split(":")[1].split()
    }


def kernel_settings() -> dict[str, dict[str, str]]:
    """Environments that change which kernels numpy's BLAS, its vector loops and libm use, among those this CPU can
    run: each OpenBLAS core type it supports (x86-64), numpy's dispatch limited to its baseline, and glibc's maths
    without its FMA variants (its ``log`` and ``lgamma`` then round differently)."""
    simd = np.show_config(mode="dicts")["SIMD Extensions"]  # type: ignore[index]
    dispatched = [*simd.get("found", []), *simd.get("not found", [])]  # every target numpy dispatches on: all valid
    settings_by_name = {"numpy baseline only": {"NPY_DISABLE_CPU_FEATURES": " ".join(dispatched)}} if dispatched else {}
    if platform.machine().lower() in ("x86_64", "amd64"):
        flags = _cpu_flags()
        needs = {
            "Prescott": set(),
            "Sandybridge": {"avx"},
            "Haswell": {"avx2", "fma"},
            "Zen": {"avx2", "fma"},
            "SkylakeX": {"avx512f", "avx512bw", "avx512dq", "avx512vl"},
        }
        for kernel, required in needs.items():
            if required <= flags:
                settings_by_name[f"OpenBLAS {kernel}"] = {"OPENBLAS_CORETYPE": kernel}
        if platform.libc_ver()[0] == "glibc" and "fma" in flags:
            settings_by_name["glibc without FMA"] = {"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-FMA,-AVX2"}
    return settings_by_name


def test_the_score_has_the_same_bits_under_every_blas_kernel_and_vector_unit() -> None:
    root = Path(__file__).resolve().parents[1]
    script = "import json, test_score; print(json.dumps(test_score.score_bits()))"
    base = {
        key: value
        for key, value in os.environ.items()
        if key not in ("OPENBLAS_CORETYPE", "NPY_DISABLE_CPU_FEATURES", "GLIBC_TUNABLES")
    }
    base["PYTHONPATH"] = os.pathsep.join([str(root / "tests"), str(root), base.get("PYTHONPATH", "")])
    variants = {"the kernels this CPU picks": {}, **kernel_settings()}
    for name, extra in variants.items():
        result = subprocess.run(
            [sys.executable, "-c", script],
            env={**base, **extra},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert result.returncode == 0, f"{name}: {result.stderr[-2000:]}"
        assert json.loads(result.stdout.splitlines()[-1]) == PINNED_SCORE_BITS, name
