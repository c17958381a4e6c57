"""Regression detection over a real history database fed with several nights (issue 11, item 3)."""
from __future__ import annotations

import math
import random
from datetime import datetime, timedelta, timezone

import pytest

from draftops import history
from draftops.nightly import detect
from draftops.nightly.playbook import Playbook, Step
from draftops.nightly.results import baseline_nights

BOOK = Playbook(hosts=["box"], steps=[Step(name="s", task="sync")], setup="demo",
                thresholds={"*tok_s": 5, "*_ms": 10}, baseline_window=7, min_nights=3)
START = datetime(2026, 11, 1, 2, 0, tzinfo=timezone.utc)


def night_metrics(rng: random.Random, n: int, drop_from: int | None, noise: float = 0.01) -> dict[str, float]:
    dropped = drop_from is not None and n >= drop_from
    wobble = lambda base: base * (1 + rng.uniform(-noise, noise))  # noqa: E731
    return {"speculative.tok_s": wobble(100.0) * (0.8 if dropped else 1.0),
            "baseline.tok_s": wobble(60.0),
            "speculative.ttft_ms": wobble(40.0),
            "accept_length.measured": wobble(2.9)}


def feed(tmp_path, nights: int, drop_from: int | None = None, noise: float = 0.01,
         host: str = "box", setup: str = "demo") -> history.History:
    hist = history.History(tmp_path / "runs" / "history.sqlite")
    rng = random.Random(7)
    for n in range(nights):
        hist.record(history.RunRecord(run_id=f"nightly-{n:02d}-{host}", kind="nightly", host=host,
                                      time=history.to_iso(START + timedelta(days=n)),
                                      settings={"setup": setup}, metrics=night_metrics(rng, n, drop_from, noise),
                                      verdict="ok"))
    return hist


def verdicts(hist: history.History, host: str = "box") -> dict[str, str]:
    rows = baseline_nights(hist, host, "demo", BOOK.baseline_window + 2)
    found = detect.judge_all([r.metrics for r in rows], threshold=BOOK.threshold, lower_better=BOOK.lower_better,
                             window=BOOK.baseline_window, min_nights=BOOK.min_nights)
    return {v.metric: v.verdict for v in found}


def test_drop_on_last_two_nights_is_a_regression_of_exactly_that_metric(tmp_path):
    got = verdicts(feed(tmp_path, 10, drop_from=8))
    assert got.pop("speculative.tok_s") == detect.REGRESSION
    assert set(got.values()) == {detect.UNCHANGED}, got


def test_drop_on_the_last_night_only_is_suspicious(tmp_path):
    got = verdicts(feed(tmp_path, 10, drop_from=9))
    assert got.pop("speculative.tok_s") == detect.SUSPICIOUS
    assert set(got.values()) == {detect.UNCHANGED}, got


def test_noise_under_the_threshold_flags_nothing(tmp_path):
    got = verdicts(feed(tmp_path, 12, noise=0.02))
    assert set(got.values()) == {detect.UNCHANGED}, got


def test_too_few_nights_is_insufficient_data(tmp_path):
    got = verdicts(feed(tmp_path, 3, drop_from=2))     # two earlier nights; three are needed
    assert set(got.values()) == {detect.INSUFFICIENT}, got


def test_other_hosts_and_setups_are_not_mixed_in(tmp_path):
    hist = feed(tmp_path, 10, drop_from=8, host="other")      # the drop lives on another host
    rng = random.Random(3)
    for n in range(10):
        hist.record(history.RunRecord(run_id=f"n{n}-box", kind="nightly", host="box",
                                      time=history.to_iso(START + timedelta(days=n, hours=1)),
                                      settings={"setup": "demo"}, metrics=night_metrics(rng, n, None)))
        hist.record(history.RunRecord(run_id=f"n{n}-box-x", kind="nightly", host="box",
                                      time=history.to_iso(START + timedelta(days=n, hours=2)),
                                      settings={"setup": "other-setup"},
                                      metrics={"speculative.tok_s": 1.0}))
    assert set(verdicts(hist).values()) == {detect.UNCHANGED}


@pytest.mark.parametrize("factor, tok_verdict, ttft_verdict", [(1.3, detect.IMPROVED, detect.REGRESSION),
                                                                  (0.7, detect.REGRESSION, detect.IMPROVED)])
def test_direction_aware(factor, tok_verdict, ttft_verdict):
    nights = [{"x.tok_s": 100.0, "x.ttft_ms": 40.0}] * 5 + [{"x.tok_s": 100 * factor, "x.ttft_ms": 40 * factor}] * 2
    tok = detect.judge("x.tok_s", nights, threshold=5, lower_better=False, window=7, min_nights=3)
    ttft = detect.judge("x.ttft_ms", nights, threshold=10, lower_better=True, window=7, min_nights=3)
    assert (tok.verdict, ttft.verdict) == (tok_verdict, ttft_verdict)
    assert tok.change_pct == pytest.approx((factor - 1) * 100)


def test_noisy_baseline_widens_the_limit():
    rng = random.Random(1)
    wide = [{"m": 100 * (1 + rng.uniform(-0.15, 0.15))} for _ in range(7)]
    got = detect.judge("m", [*wide, {"m": 92.0}, {"m": 92.0}], threshold=5, lower_better=False, window=7,
                       min_nights=3)
    assert got.verdict == detect.UNCHANGED and got.limit_pct is not None and got.limit_pct > 8
    assert got.noise_pct is not None and got.noise_pct > 3


@pytest.mark.parametrize("bad", [math.nan, math.inf, None, "fast", True])
def test_unusable_current_values_are_not_measured(bad):
    nights = [{"m": 1.0}] * 5 + [{"m": bad}]
    assert detect.judge("m", nights, threshold=5, lower_better=False, window=7,
                        min_nights=3).verdict == detect.NOT_MEASURED


def test_a_missing_previous_night_makes_it_suspicious_not_regression():
    nights = [{"m": 100.0}] * 6 + [{}, {"m": 70.0}]
    assert detect.judge("m", nights, threshold=5, lower_better=False, window=7,
                        min_nights=3).verdict == detect.SUSPICIOUS


def test_zero_baseline_does_not_divide_by_zero():
    got = detect.judge("m", [{"m": 0.0}] * 5 + [{"m": 0.0}], threshold=5, lower_better=False, window=7,
                       min_nights=3)
    assert got.verdict == detect.UNCHANGED and got.change_pct == 0.0
