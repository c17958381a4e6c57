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


def test_a_clear_drop_on_the_last_night_alone_is_a_regression(tmp_path):
    """The interval holds the nights' own spread (1% here): a 20% drop lies wholly beyond the 5% threshold."""
    got = detect.judge_all([r.metrics for r in baseline_nights(feed(tmp_path, 10, drop_from=9), "box", "demo", 9)],
                           threshold=BOOK.threshold, lower_better=BOOK.lower_better, window=7, min_nights=3)
    tok = next(v for v in got if v.metric == "speculative.tok_s")
    assert tok.verdict == detect.REGRESSION and tok.ci_pct is not None and tok.ci_pct[1] < -5
    assert tok.interval_text().startswith(("-19", "-20", "-21")) and "95% CI" in tok.interval_text()
    assert {v.verdict for v in got if v is not tok} == {detect.UNCHANGED}


def test_a_drop_whose_interval_straddles_the_threshold_is_suspicious():
    """Noisy nights (±6%): a night 8% down is beyond the 5% threshold, its interval is not."""
    nights = [{"m": v} for v in (100.0, 106.0, 94.0, 103.0, 97.0, 105.0, 95.0)] + [{"m": 92.0}]
    got = detect.judge("m", nights, threshold=5, lower_better=False, window=7, min_nights=3)
    assert got.verdict == detect.SUSPICIOUS and got.ci_pct is not None and got.ci_pct[0] < -5 < got.ci_pct[1]


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


def test_noisy_baseline_widens_the_interval():
    rng = random.Random(1)
    wide = [{"m": 100 * (1 + rng.uniform(-0.15, 0.15))} for _ in range(7)]
    quiet = [{"m": 100 * (1 + rng.uniform(-0.01, 0.01))} for _ in range(7)]
    noisy = detect.judge("m", [*wide, {"m": 80.0}], threshold=5, lower_better=False, window=7, min_nights=3)
    calm = detect.judge("m", [*quiet, {"m": 80.0}], threshold=5, lower_better=False, window=7, min_nights=3)
    assert noisy.ci_pct is not None and calm.ci_pct is not None
    assert noisy.ci_pct[1] - noisy.ci_pct[0] > 3 * (calm.ci_pct[1] - calm.ci_pct[0])
    assert calm.verdict == detect.REGRESSION and noisy.verdict == detect.SUSPICIOUS
    assert noisy.noise_pct is not None and noisy.noise_pct > 3


def test_one_stalled_baseline_night_is_set_aside_not_averaged_in():
    nights = [{"m": v} for v in (100.0, 101.0, 99.0, 100.5, 30.0, 99.5, 100.0)] + [{"m": 100.0}]
    got = detect.judge("m", nights, threshold=5, lower_better=False, window=7, min_nights=3)
    assert got.verdict == detect.UNCHANGED and got.set_aside and "night 5" in got.set_aside[0]


@pytest.mark.parametrize("bad", [math.nan, math.inf, None, "fast", True])
def test_unusable_current_values_are_not_measured(bad):
    nights = [{"m": 1.0}] * 5 + [{"m": bad}]
    assert detect.judge("m", nights, threshold=5, lower_better=False, window=7,
                        min_nights=3).verdict == detect.NOT_MEASURED


def test_a_missing_previous_night_is_left_out_of_the_window():
    nights = [{"m": 100.0}] * 6 + [{}, {"m": 70.0}]
    got = detect.judge("m", nights, threshold=5, lower_better=False, window=7, min_nights=3)
    assert got.verdict == detect.REGRESSION and got.nights == 6


def test_zero_baseline_does_not_divide_by_zero():
    got = detect.judge("m", [{"m": 0.0}] * 5 + [{"m": 0.0}], threshold=5, lower_better=False, window=7,
                       min_nights=3)
    assert got.verdict == detect.UNCHANGED and got.change_pct == 0.0


def test_the_report_table_shows_each_change_with_its_interval():
    from draftops.nightly import report
    nights = [{"x.tok_s": v} for v in (100.0, 101.0, 99.0, 100.5, 99.5)] + [{"x.tok_s": 80.0}]
    got = detect.judge("x.tok_s", nights, threshold=5, lower_better=False, window=7, min_nights=3)
    (row,) = report.table_rows([got])
    assert report.COLUMNS[4] == "95% CI" and row[-1] == detect.REGRESSION
    assert row[3].startswith("-20") and row[4].startswith("-2") and "…-1" in row[4], row
