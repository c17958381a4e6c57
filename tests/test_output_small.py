"""The small output defects of issue 35, item 12: the doctor's check line with a dangling "—", a task
listed twice in the README's table, and a piped job that showed nothing while it ran (test-drafter
--strict and the nightly's step line are tested where they run: tests/test_json_output.py,
tests/test_nightly_step_findings.py)."""
from __future__ import annotations

from io import StringIO

import pytest
from rich.console import Console

from draftops import console as consoles
from draftops.console import LiveJob
from draftops.doctor.checking import accept_words
from tests.conftest import REPO
from tests.support import bench_runs


@pytest.mark.parametrize(("status", "served", "best", "words"), [
    ("MISMATCH", 1.06, 3.49, "predicted accept length 1.06 as configured, 3.49 with the fix"),
    ("MATCH", 3.43, None, "predicted accept length 3.43 as configured"),
    ("MATCH", 3.43, 3.43, "predicted accept length 3.43 as configured"),
    ("MISMATCH", None, None, "no predicted accept length"),
])
def test_the_check_line_names_only_the_accept_lengths_the_report_holds(status, served, best, words):
    doc = bench_runs.drafter_report(status=status, served=served, best=best)
    if served is None:
        del doc["predicted_accept_length"]
    assert accept_words(bench_runs.read_report(doc)) == words


def test_env_setup_has_one_row_in_the_readme():
    """It had two: a short one and the full one (--engine); a reader could not tell which was current."""
    rows = [line for line in (REPO / "README.md").read_text().splitlines() if line.startswith("| `invoke ")]
    cells = [row.split(" | ")[0] for row in rows]
    assert len([cell for cell in cells if "`invoke env.setup" in cell]) == 1, cells
    assert len([cell for cell in cells if "`invoke env.check" in cell]) == 1, cells


@pytest.mark.parametrize("mode", ["window", "hide"])
def test_a_piped_job_shows_its_progress_as_lines(monkeypatch, mode):
    now = [100.0]
    monkeypatch.setattr(consoles.time, "monotonic", lambda: now[0])
    buffer = StringIO()
    view = LiveJob(Console(file=buffer, width=80, color_system=None), mode)     # a StringIO is no terminal
    view.text("{")                                              # no words: not worth a line
    view.text("generating the demo target")
    view.text("step 2")                                          # within PIPED_S: not printed
    now[0] += consoles.PIPED_S
    view.event({"event": "progress", "what": "metrics samples", "done": 16, "total": 256})
    now[0] += 1
    view.text("\x1b[2Jstep 3")
    shown = ["… generating the demo target"] if mode == "window" else []     # "hide": no log line, even piped
    assert buffer.getvalue().splitlines() == [*shown, "… metrics samples: 16 of 256"]


def test_on_a_terminal_the_window_stays_the_only_view():
    buffer = StringIO()
    view = LiveJob(Console(file=buffer, width=80, force_terminal=True, color_system=None), "window")
    view.text("generating the demo target")
    assert buffer.getvalue() == ""
