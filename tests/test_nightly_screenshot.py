"""The HTML report opened in headless Chromium (scripts/setup.sh --test installs it): its tables and
its embedded plots render. The screenshot must show the plots' line colour and the regression row's
background, so a page whose images fail to decode or whose table is unstyled fails here."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest

from draftops import history
from draftops.nightly import detect, report
from draftops.nightly.night import HostNightReport, Night
from draftops.nightly.playbook import Playbook, Step
from draftops.nightly.results import baseline_nights
from draftops.nightly.runner import FAILED, INFRA, OK, HostOutcome, StepResult
from tests.support.chromium import CHROMIUM, screenshot

PLOT_BLUE = np.array([31, 119, 180]) / 255          # matplotlib's first line colour
REGRESSION_RED = np.array([248, 180, 180]) / 255     # report.py's .REGRESSION background


def build_report(tmp_path: Path) -> Path:
    book = Playbook(name="nightly", hosts=["box", "down"], steps=[Step(name="drafter", task="test-drafter")],
                    setup="kimi-eagle3")
    hist = history.History(tmp_path / "runs" / "history.sqlite")
    start = datetime(2026, 11, 1, tzinfo=timezone.utc)
    for n in range(9):
        drop = 0.7 if n >= 7 else 1.0
        metrics = {"speculative.tok_s": 100 * drop + n % 2, "baseline.tok_s": 60.0 + n % 3, "speedup": 1.6 * drop,
                   "accept_length.measured": 2.8 * drop, "accept_length.predicted": 2.9, "drafter.step0_acc": 0.8}
        hist.record(history.RunRecord(run_id=f"n{n}", kind="nightly", host="box",
                                      time=history.to_iso(start + timedelta(days=n)),
                                      settings={"setup": "kimi-eagle3"}, metrics=metrics))
    nights = baseline_nights(hist, "box", "kimi-eagle3", 20)
    verdicts = detect.judge_all([r.metrics for r in nights], threshold=book.threshold,
                                lower_better=book.lower_better, window=7, min_nights=3)
    box = HostOutcome("box", steps=[StepResult("drafter", "test-drafter", OK)], metrics=nights[-1].metrics,
                      facts={"gpu": "RTX PRO 6000 Blackwell", "driver": "580.1"})
    down = HostOutcome("down", steps=[StepResult("drafter", "test-drafter", FAILED, failure=INFRA,
                                                 reason="error: Host 'down' could not be reached")])
    folder = tmp_path / "runs" / "nightly-2026-11-09"
    folder.mkdir(parents=True)
    night = Night("nightly-2026-11-09", folder, book, Path("playbooks/p.yaml"), history.now_iso(), "abc123",
                  [HostNightReport(box, verdicts, nights), HostNightReport(down, [], [])])
    return report.write(night)["html"]


def test_report_content_without_a_browser(tmp_path):
    page = build_report(tmp_path).read_text()
    assert page.count("<img ") == 4 and "REGRESSION" in page and "down / drafter" in page
    assert "RTX PRO 6000 Blackwell" in page and "abc123" in page


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed here (scripts/setup.sh --test "
                                             "installs chromium-headless-shell; CI runs this test)")
def test_report_renders_in_headless_chromium(tmp_path):
    html = build_report(tmp_path)
    pixels = screenshot(html, tmp_path / "shot.png", 3200)
    assert pixels.shape[0] >= 3000 and pixels.std() > 0.05            # not a blank page

    def share(colour: np.ndarray) -> float:
        return float((np.abs(pixels - colour).max(axis=-1) < 0.03).mean())

    assert share(PLOT_BLUE) > 0.0005, "the embedded plots did not render"
    assert share(REGRESSION_RED) > 0.0005, "the regression row is not highlighted"
    top = pixels[:200]
    assert (top < 0.3).all(axis=-1).mean() > 0.003                    # the heading's text is drawn
