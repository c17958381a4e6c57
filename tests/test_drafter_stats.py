"""The verdict statistics on hand-made counts: the paired served-vs-best comparison (stats.py) and
the chance level (chance.py)."""
from __future__ import annotations

import math

import pytest
import torch

from remote.drafter.scoring.chance import ChanceLevel
from remote.drafter.scoring.stats import BETTER, INCONCLUSIVE, SAME, PerSample, compare, sign_test


def _exact_sign_p(wins: int, losses: int) -> float:
    n, k = wins + losses, max(wins, losses)
    return min(1.0, 2 * sum(math.comb(n, j) for j in range(k, n + 1)) / 2 ** n)


@pytest.mark.parametrize("wins,losses", [(0, 0), (6, 0), (5, 1), (3, 3), (10, 2), (40, 25), (0, 9), (300, 240)])
def test_sign_test_is_the_exact_binomial_tail(wins: int, losses: int) -> None:
    assert sign_test(wins, losses) == pytest.approx(_exact_sign_p(wins, losses), rel=1e-9)
    assert sign_test(wins, losses) == sign_test(losses, wins)


def test_sign_test_needs_six_samples_for_five_percent() -> None:
    assert sign_test(5, 0) > 0.05 > sign_test(6, 0)


def _samples(rows: int, n: int, steps: int, rates: list[float], seed: int) -> PerSample:
    """n samples of ``rows`` scored rows; step k chain-correct with probability rates[k]."""
    gen = torch.Generator().manual_seed(seed)
    total = torch.full((n, steps), rows, dtype=torch.long) - torch.arange(steps)
    correct = torch.stack([torch.binomial(total[:, k].double(), torch.full((n,), rates[k], dtype=torch.float64),
                                          generator=gen).long() for k in range(steps)], 1)
    return PerSample(correct, total)


def test_identical_layouts_are_the_same() -> None:
    s = _samples(30, 50, 3, [0.8, 0.6, 0.4], seed=1)
    c = compare(s, s, alpha=0.05, tolerance=0.01)
    assert c.outcome == SAME and c.gain == 0 and c.samples_tied == 50 and c.sign_test_p == 1.0
    assert not c.significant and c.gain_ci == [0.0, 0.0]


def test_a_clearly_better_layout_is_better_with_its_accept_length_gain() -> None:
    served = _samples(30, 80, 3, [0.70, 0.50, 0.35], seed=2)
    best = _samples(30, 80, 3, [0.74, 0.55, 0.40], seed=3)
    c = compare(served, best, alpha=0.05, tolerance=0.01)
    assert c.outcome == BETTER and c.significant and c.samples == 80
    assert c.gain == pytest.approx(c.best_accept_length - c.served_accept_length)
    assert c.gain == pytest.approx(sum(c.step_gain))
    assert c.gain_ci[0] > 0 and c.gain_ci[0] < c.gain < c.gain_ci[1]
    assert all(lo <= g <= hi for g, (lo, hi) in zip(c.step_gain, c.step_gain_ci, strict=True))


def test_a_few_samples_are_inconclusive_even_with_a_large_gain() -> None:
    served = _samples(40, 4, 3, [0.5, 0.3, 0.2], seed=4)
    best = _samples(40, 4, 3, [0.9, 0.8, 0.7], seed=5)
    c = compare(served, best, alpha=0.05, tolerance=0.01)
    assert c.gain > 0.5 and c.samples_better == 4
    assert c.sign_test_p > 0.05 and not c.significant and c.outcome == INCONCLUSIVE


def test_a_significant_gain_below_the_margin_counts_as_the_same() -> None:
    served = _samples(200, 400, 2, [0.60, 0.40], seed=6)
    best = PerSample(served.correct + (torch.arange(400) % 10 == 0).long()[:, None], served.total)
    c = compare(served, best, alpha=0.05, tolerance=0.01)
    assert 0 < max(c.step_gain) < 0.01 and c.samples_better == 40 and c.samples_worse == 0
    assert c.significant and c.outcome == SAME


def test_a_worse_best_layout_is_the_same() -> None:
    served = _samples(30, 60, 3, [0.8, 0.6, 0.5], seed=7)
    best = _samples(30, 60, 3, [0.6, 0.4, 0.3], seed=8)
    c = compare(served, best, alpha=0.05, tolerance=0.01)
    assert c.gain < 0 and c.outcome == SAME and not c.significant


def test_samples_without_scored_rows_are_not_compared_and_nothing_is_the_same() -> None:
    empty = PerSample(torch.zeros(3, 2, dtype=torch.long), torch.zeros(3, 2, dtype=torch.long))
    c = compare(empty, empty, alpha=0.05, tolerance=0.01)
    assert c.samples == 0 and c.outcome == SAME and c.gain == 0


def test_the_bootstrap_is_deterministic_and_rows_must_match() -> None:
    served = _samples(30, 40, 3, [0.7, 0.5, 0.3], seed=9)
    best = _samples(30, 40, 3, [0.75, 0.55, 0.35], seed=10)
    assert compare(served, best, 0.05, 0.01) == compare(served, best, 0.05, 0.01)
    other = PerSample(best.correct, best.total + 1)
    with pytest.raises(ValueError):
        compare(served, other, 0.05, 0.01)


def test_chance_level_guesses_that_ignore_the_hidden_states() -> None:
    """Constant guess = the most frequent emittable target; current-token guess is cross-fitted, so a
    token seen in one half only falls back to the other half's most frequent target."""
    vocab = 10
    emit = torch.ones(vocab, dtype=torch.bool)
    emit[9] = False  # the draft cannot produce target 9
    level = ChanceLevel(vocab, emit)
    current = torch.tensor([[1, 2, 3, 1, 2, 5], [1, 2, 3, 1, 2, 6], [4, 4, 4, 4, 4, 4]])
    target = torch.tensor([[7, 8, 9, 7, 8, 0], [7, 8, 9, 7, 8, 0], [9, 9, 9, 9, 9, 9]])
    scored = torch.ones_like(current, dtype=torch.bool)
    level.update(current, target, scored)  # samples 0 and 2 in fold 0, sample 1 in fold 1
    acc, token = level.constant()
    assert token in (7, 8) and acc == pytest.approx(4 / 18)  # 9 is most frequent but cannot be emitted
    # fold 0 (12 rows) guessed from fold 1's table: 1->7, 2->8, 3->(9 not emittable: fallback), 5/4 unseen
    # fold 1 (6 rows) from fold 0's: 1->7, 2->8, 3->fallback, 6 unseen -> fallback
    fallback_1, fallback_0 = 7, 7  # ties between 7 and 8 go to the smaller id
    right_0 = 4 + int(fallback_1 == 0)  # rows 1,2,1,2 of sample 0 right; the 5->0 row only by fallback
    right_1 = 4 + int(fallback_0 == 0)
    assert level.current_token() == pytest.approx((right_0 + right_1) / 18)
    empty = ChanceLevel(vocab, emit)
    assert empty.constant() == (None, None) and empty.current_token() is None
