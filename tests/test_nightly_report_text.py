"""What the morning report says and links (issue 22, items 3 and probe B): text from a playbook or a
host is literal in report.md (no heading from a newline, no table broken by a pipe, no raw HTML) and
in report.html (no tag from `<script>` or `<img onerror>`); only run folders that are here are linked;
one night's trend plot spans days, not years; the title does not read "Nightly nightly-"."""
from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest
from matplotlib.dates import num2date

from draftops import history
from draftops.nightly import plots, report
from tests.support.disks import fill
from tests.support.nights import build_night


def test_markdown_is_literal_text(tmp_path):
    night = build_night(tmp_path)
    text = report.write(night)["markdown"].read_text()
    headings = [ln for ln in text.splitlines() if ln.startswith("#")]
    assert headings == ["# nightly-2026-12-01: playbook smoke", "## Health", "## Counts", "## box",
                        "### box: findings", "## Raw files"], headings
    assert "<script" not in text and "<img" not in text and "\x1b" not in text and "[l](javascript" not in text
    assert "&lt;script&gt;" in text and "a \\| b" in text and "\\*c\\*" in text
    table = [ln for ln in text.splitlines() if ln.startswith("|")]
    assert all(ln.count("|") - ln.count("\\|") == 8 for ln in table), table
    assert "Nightly nightly-" not in text


def test_html_is_escaped(tmp_path):
    night = build_night(tmp_path)
    page = report.write(night)["html"].read_text()
    assert "<script" not in page and "<img src=x" not in page and "\x1b" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "onerror=alert(2)&gt;" in page
    assert "<title>nightly-2026-12-01: playbook smoke</title>" in page and "Nightly nightly-" not in page


def test_only_run_folders_that_are_here_are_linked(tmp_path):
    night = build_night(tmp_path)
    written = report.write(night)
    text, page = written["markdown"].read_text(), written["html"].read_text()
    assert "(../pulled-bench-1/)" in text and "href='../pulled-bench-1/'" in page
    assert "serve-on-the-host-2" not in text and "serve-on-the-host-2" not in page
    links = re.findall(r"(?<!\\)\]\((?!\.\./)([^)]+)\)", text)
    assert links and all((night.folder / link).is_file() for link in links), links


def test_one_nights_trend_spans_days_not_years():
    when = datetime(2026, 12, 1, 2, 30, tzinfo=timezone.utc)
    for dates in ([when], [when, when + timedelta(hours=1)], [when + timedelta(days=n) for n in range(3)]):
        fig = plots.panel_figure("box: speedup", "x", [("speedup", [(d, 1.2) for d in dates])])
        low, high = (num2date(x) for x in fig.axes[0].get_xlim())
        assert low <= min(dates) and high >= max(dates)
        assert high - low <= timedelta(days=4), (low, high)
    many = [when + timedelta(days=n) for n in range(60)]
    fig = plots.panel_figure("box: speedup", "x", [("speedup", [(d, 1.0) for d in many])])
    low, high = (num2date(x) for x in fig.axes[0].get_xlim())
    assert timedelta(days=59) <= high - low <= timedelta(days=66)


def test_a_full_disk_while_the_report_is_written_leaves_no_file_and_still_prints_the_summary(tmp_path):
    from invoke.exceptions import Exit

    from draftops.cli.nightly import finish
    from draftops.console import console
    from tests.conftest import small_tmpfs
    with small_tmpfs(tmp_path / "disk", "64k") as disk:
        night = build_night(disk)
        when = datetime(2026, 11, 1, tzinfo=timezone.utc)
        night.hosts[0].trend = [history.RunRecord(run_id=f"n{i}", kind="nightly", host="box",
                                                  time=history.to_iso(when + timedelta(days=i)),
                                                  metrics={"speedup": 1.0 + i / 10}) for i in range(3)]
        fill(disk)                                                # the disk full to its last byte
        before = sorted(p.name for p in night.folder.rglob("*"))
        with console.capture() as shown, pytest.raises(Exit) as info:
            finish(night)
        after = sorted(p.name for p in night.folder.rglob("*"))
    assert after == before, after                       # no 0-byte report, no temporary file, no half plot
    assert info.value.code == 1
    message = str(info.value.message)
    assert message.startswith("error: the night's report could not be written into ") and str(night.folder) in message
    assert "No space left on device" in message and "Traceback" not in message
    text = shown.get()
    assert "box: STEP FAILURE — 2 steps: 1 ok, 1 failed" in text and "insufficient data" in text, text
