"""Tune's prediction (draftops/tune/predict.py, acceptance.py): known profiles and costs, known answers."""
from __future__ import annotations

import json
import shlex

import pytest

from draftops.tune import predict as pr
from draftops.tune.cost import RoundCost
from draftops.tune.profile import AcceptanceProfile

# a round costs 4 ms + 1 ms per draft token at c=1, 6 ms + 3 ms per token at c=16 (CPU: not flat in K)
COST = RoundCost(fixed={1: 0.004, 16: 0.006}, per_token={1: 0.001, 16: 0.003}, baseline={1: 0.004, 16: 0.008})
PROFILE = AcceptanceProfile(conditional=(0.8, 0.8, 0.8, 0.8, 0.8, 0.8))


def test_throughput_is_concurrency_times_accept_length_over_the_round() -> None:
    points = {(p.concurrency, p.k): p for p in pr.predict(PROFILE, COST, range(1, 7), [1, 16])}
    k3 = points[(1, 3)]
    assert k3.accept_length == pytest.approx(1 + 0.8 + 0.64 + 0.512)
    assert k3.tok_s == pytest.approx(1 * k3.accept_length / 0.007)
    assert k3.speedup == pytest.approx(k3.tok_s / 250.0) and k3.break_even == pytest.approx(0.007 / 0.004)
    assert k3.topk == 1 and k3.draft_tokens == 3
    assert points[(16, 0)].tok_s == pytest.approx(2000.0) and points[(16, 0)].speedup == 1.0
    assert len(points) == 2 * 7


def test_the_best_k_is_the_fastest_predicted_and_moves_with_the_batch() -> None:
    chosen = pr.best(pr.predict(PROFILE, COST, range(1, 7), [1, 16]))
    # c=1: L(K) / (4 + K) ms: K=1 .360, 2 .407, 3 .422, 4 .420, 5 .410 tokens per ms: K=3
    assert chosen[1].k == 3 and chosen[1].tok_s == pytest.approx(PROFILE.accept_length(3) / 0.007)
    # c=16: 16 L(K) / (6 + 3K) ms: K=1 3.20, 2 3.25, 3 3.15 tokens per ms, against 2.00 without a draft: K=2
    assert chosen[16].k == 2 and chosen[16].speedup == pytest.approx(16 * 2.44 / 0.012 / 2000)


def test_off_from_is_the_lowest_concurrency_from_which_no_draft_wins() -> None:
    base = dict(concurrency=0, accept_length=1.0, tok_s=1.0, speedup=1.0, break_even=1.0)
    mk = lambda c, k: pr.Prediction(**{**base, "concurrency": c, "k": k})  # noqa: E731
    assert pr.off_from({1: mk(1, 3), 4: mk(4, 0), 16: mk(16, 0)}) == 4
    assert pr.off_from({1: mk(1, 3), 4: mk(4, 0), 16: mk(16, 2)}) is None
    assert pr.off_from({1: mk(1, 0)}) == 1


def test_a_costly_verify_at_high_batch_turns_speculation_off_in_the_schedule() -> None:
    cost = RoundCost(fixed={1: 0.004, 16: 0.010}, per_token={1: 0.001, 16: 0.008}, baseline={1: 0.004, 16: 0.008})
    ranges = pr.schedule(PROFILE, cost, range(1, 7), max_batch=48)
    assert ranges[0][0] == 1 and ranges[0][2] == 3 and ranges[-1] == (ranges[-1][0], 48, 0)
    assert all(a[1] + 1 == b[0] for a, b in zip(ranges, ranges[1:], strict=False))     # no gap, no overlap
    config = pr.speculative_config("/d/draft", ranges)
    assert config is not None and config["num_speculative_tokens"] == 3
    assert config["num_speculative_tokens_per_batch_size"] == [list(r) for r in ranges]
    line = pr.engine_line("/d/my draft", ranges)
    words = shlex.split(line)
    assert words[0] == "--speculative-config" and json.loads(words[1])["model"] == "/d/my draft"


def test_one_k_everywhere_needs_no_schedule_and_none_means_no_draft() -> None:
    assert pr.speculative_config("/d", [(1, 48, 3)]) == {"method": "eagle3", "model": "/d", "num_speculative_tokens": 3}
    assert pr.speculative_config("/d", [(1, 48, 0)]) is None
    assert pr.engine_args("/d", [(1, 48, 0)]) == []
    assert "serve without a draft" in pr.engine_line("/d", [(1, 48, 0)])
