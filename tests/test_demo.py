"""The Flower-free demo: every step of the market on digits, end to end, PASS v2 driven in-process."""

from __future__ import annotations

import numpy as np
import pytest

from flmarket_flwr.app.demo import main, run_demo, secure_global_counts
from flmarket_flwr.pass_protocol import PassError
from flmarket_flwr.pricing import run_auction, score


def test_demo_market_is_exact_and_within_budget() -> None:
    label_counts, global_counts, scores, bids, result = run_demo(
        num_clients=20, distribution="d4", budget=300.0, seed=0, markup=0.2
    )
    np.testing.assert_array_equal(global_counts, label_counts.sum(axis=0))
    np.testing.assert_allclose(scores, score(label_counts, global_counts, 20), rtol=1e-12)
    assert 0 < result.winners.size < 20
    assert result.total_payment <= 300.0
    assert np.all(result.payments[result.winners] >= bids[result.winners])
    reference = run_auction(scores, bids, 300.0)
    assert result.winners.tolist() == reference.winners.tolist()


def test_pass_over_the_demo_clients_gives_the_exact_sum_and_refuses_what_it_must() -> None:
    counts = np.array([[3, 6, 8], [4, 4, 7], [10, 8, 5]])  # the paper's PASS example
    np.testing.assert_array_equal(secure_global_counts(counts, session=b"test"), [17, 18, 20])
    with pytest.raises(PassError, match="needs 3 to"):
        secure_global_counts(counts[:2], session=b"test")
    with pytest.raises(PassError, match="count_bound"):
        secure_global_counts(counts, session=b"test", count_bound=9)


def test_demo_prints_winners_and_refuses_too_few_clients(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--num-clients", "6", "--budget", "50"])
    out = capsys.readouterr().out
    assert "exact: True" in out and "winners:" in out and "of budget 50.00" in out
    with pytest.raises(SystemExit):
        main(["--num-clients", "2"])
    assert "at least 3" in capsys.readouterr().err
