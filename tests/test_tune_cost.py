"""The round-cost fit (draftops/tune/cost.py): known inputs, known lines."""
from __future__ import annotations

import math

import pytest

from draftops.tune.cost import Measured, RoundCost, fit, line


def _bench(c: int, n: int, round_s: float, accept: float) -> Measured:
    """A bench whose round takes ``round_s`` seconds: throughput c × L / round."""
    return Measured(concurrency=c, draft_tokens=n, tok_s=c * accept / round_s, accept_length=accept)


def test_a_round_is_concurrency_times_accept_length_over_throughput() -> None:
    # the 12-06 reference at concurrency 4: K=3 819 tok/s at accept length 3.34
    assert Measured(4, 3, 819.0, 3.34).round_seconds == pytest.approx(4 * 3.34 / 819.0)
    assert Measured(4, 0, 400.0).round_seconds == pytest.approx(0.01)


def test_the_fit_recovers_a_known_line_per_concurrency() -> None:
    points = [_bench(1, 0, 0.004, 1.0), _bench(1, 2, 0.006, 2.5), _bench(1, 6, 0.010, 3.9),
              _bench(4, 0, 0.006, 1.0), _bench(4, 2, 0.010, 2.4), _bench(4, 6, 0.018, 3.7)]
    cost = fit(points)
    assert cost.fixed[1] == pytest.approx(0.004) and cost.per_token[1] == pytest.approx(0.001)
    assert cost.fixed[4] == pytest.approx(0.006) and cost.per_token[4] == pytest.approx(0.002)
    assert cost.round_seconds(4, 10) == pytest.approx(0.026)       # a further point on the same line
    assert cost.baseline_step(4) == pytest.approx(0.006)
    assert cost.round_seconds(4, 0) == cost.baseline_step(4)        # no draft tokens: the baseline
    assert cost.break_even(4, 2) == pytest.approx(0.010 / 0.006)
    assert cost.tok_s(4, 2, 2.4) == pytest.approx(4 * 2.4 / 0.010)


def test_one_speculative_setting_is_anchored_at_the_baseline() -> None:
    cost = fit([_bench(2, 0, 0.005, 1.0), _bench(2, 4, 0.009, 3.0)])
    assert cost.fixed[2] == pytest.approx(0.005) and cost.per_token[2] == pytest.approx(0.001)


def test_between_concurrencies_is_interpolated_and_beyond_scaled() -> None:
    cost = RoundCost(fixed={1: 0.004, 5: 0.008}, per_token={1: 0.001, 5: 0.003}, baseline={1: 0.003, 5: 0.007})
    assert cost.round_seconds(3, 2) == pytest.approx((0.006 + 0.014) / 2)
    assert cost.baseline_step(10) == pytest.approx(0.007 * 2)
    assert cost.concurrencies == (1, 5)


def test_noisy_points_are_fitted_by_least_squares() -> None:
    assert line([(1, 1.0), (2, 2.0), (3, 2.0)]) == pytest.approx((2 / 3, 0.5))
    assert line([(2, 3.0), (2, 5.0)]) == (4.0, 0.0)


def test_a_round_that_comes_out_cheaper_with_more_tokens_is_fitted_flat() -> None:
    # measured on a loaded machine: K=8's round (4 × 4.01 / 163 tok/s) below K=3's (4 × 3.26 / 101 tok/s)
    assert line([(3, 4 * 3.26 / 101), (8, 4 * 4.01 / 163)]) == (pytest.approx((4 * 3.26 / 101 + 4 * 4.01 / 163) / 2),
                                                                0.0)
    cost = fit([Measured(4, 0, 100.0), Measured(4, 3, 101.0, 3.26), Measured(4, 8, 163.0, 4.01)])
    assert cost.per_token[4] == 0.0 and cost.round_seconds(4, 1) == cost.round_seconds(4, 8)


@pytest.mark.parametrize("bad", [math.nan, 0.0, -5.0, math.inf])
def test_a_bench_without_a_usable_throughput_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="no usable throughput"):
        fit([Measured(1, 0, 100.0), Measured(1, 3, bad, 2.0)])


def test_a_concurrency_without_a_baseline_is_refused() -> None:
    with pytest.raises(ValueError, match="no baseline bench at concurrency 4"):
        fit([Measured(4, 3, 800.0, 3.0)])
    with pytest.raises(ValueError, match="no speculative bench"):
        fit([Measured(4, 0, 800.0)])
