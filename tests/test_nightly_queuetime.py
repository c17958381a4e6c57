"""A night on a Slurm host says how long each step waited in the queue apart from how long it ran:
read from the run folders the step pulled (slurm.json, status.json), real files, hostile ones too."""
from __future__ import annotations

import calendar
import json
import os
import time
from pathlib import Path

from draftops.nightly import queuetime
from draftops.nightly.runner import StepResult, queue_words


def pulled(runs: Path, name: str, slurm: dict | None, status: dict, when: float | None = None) -> Path:
    folder = runs / name
    folder.mkdir(parents=True)
    if slurm is not None:
        (folder / "slurm.json").write_text(json.dumps(slurm))
    (folder / "status.json").write_text(json.dumps(status))
    mark = folder / ".draftops-pulled.json"
    mark.write_text("[]")
    if when is not None:
        os.utime(mark, (when, when))
    return folder


def test_a_steps_queue_wait_is_apart_from_its_run_time(tmp_path):
    runs = tmp_path / "runs"
    began = time.time() - 5
    # Slurm said so itself (its end seen): 42 s queued; the runner ran the command 7.5 s
    pulled(runs, "a", {"job_id": "12", "submitted": 1000.0, "final": {"queued_s": 42.0, "ran_s": 8.0}},
           {"started": "2026-12-02T08:00:00Z", "seconds": 7.5})
    # the end not seen before the pull: from when it was queued to when its runner started
    submitted = float(calendar.timegm(time.strptime("2026-12-02T07:59:40", "%Y-%m-%dT%H:%M:%S")))
    pulled(runs, "b", {"job_id": "13", "submitted": submitted}, {"started": "2026-12-02T08:00:00Z", "seconds": 3.0})
    pulled(runs, "c", None, {"started": "2026-12-02T08:00:00Z", "seconds": 99.0})          # not a Slurm run
    pulled(runs, "old", {"job_id": "9", "final": {"queued_s": 500.0}}, {"seconds": 1.0}, when=began - 3600)
    got = queuetime.of_step(runs, began)
    assert got == queuetime.QueueTime(queued_s=62.0, ran_s=10.5, jobs=2)
    step = StepResult("eval", "test-drafter", "ok", queue=got)
    assert queue_words(step) == " (queued 62 s in Slurm, ran 10 s)"


def test_no_slurm_runs_means_no_queue_time_and_broken_files_are_not_figures(tmp_path):
    runs = tmp_path / "runs"
    pulled(runs, "plain", None, {"seconds": 4.0})
    assert queuetime.of_step(runs, 0) is None
    assert queue_words(StepResult("s", "bench", "ok")) == ""
    bad = pulled(runs, "nan", {"job_id": "5", "submitted": "soon", "final": {"queued_s": float("nan")}}, {})
    (bad / "status.json").write_text('{"seconds": -4, "started": "\\u001b[31m"}')
    assert queuetime.of_run(bad) == (0.0, 0.0)
    (runs / "link").symlink_to(bad)
    assert queuetime.of_step(runs, 0) == queuetime.QueueTime(0.0, 0.0, 1)
