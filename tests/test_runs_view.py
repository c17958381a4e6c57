"""`invoke runs` as people read it: what each run was (task and arguments, never the wrapper shell
line), how it ended (state, exit, headline), and ids that are always whole, at any width."""
from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from draftops.console import show_runs

WRAPPER = ("command -v /opt/ml-env/bin/python >/dev/null 2>&1 || { echo 'draftops: the ml-env python "
           "/opt/ml-env/bin/python does not exist on host box; run `invoke env.setup`' >&2; exit 127; }; "
           'PYTHONPATH="$PWD" exec /opt/ml-env/bin/python -m remote.drafter eval --out "$DRAFTOPS_RUN_DIR"')


def rows() -> list[dict]:
    return [
        {"id": "20261130-101500-test-drafter-a1b2", "state": "succeeded", "exit_code": 0,
         "started": "2026-11-30T10:15:00Z", "task": "test-drafter", "command": WRAPPER,
         "args": {"ckpt": "/data/drafts/kimi k2 [eagle3]", "steps": 3, "device": "auto"},
         "outcome": {"status": "MISMATCH", "path": "/x/report.json"}},
        {"id": "20261130-101501-" + "a-very-long-task-name-for-a-bench" + "-ffff", "state": "failed",
         "exit_code": 3, "started": "2026-11-30T10:15:01Z", "task": "bench", "command": WRAPPER,
         "args": {"fast": True}, "outcome": {"headline": "412 tok/s", "error": "OOM\nsecond line"}},
        {"id": "20261130-101502-serve-0000", "state": "running", "orphaned": True, "task": "serve",
         "command": WRAPPER, "outcome": {}},
        {"id": "20261130-101503-old-job-1111", "state": "dead", "name": "test-drafter", "command": WRAPPER},
    ]


def render(width: int) -> str:
    buffer = io.StringIO()
    show_runs(rows(), "box", Console(file=buffer, width=width, highlight=False, color_system=None))
    return buffer.getvalue()


@pytest.mark.parametrize("width", [200, 120, 80, 60, 40])
def test_run_ids_are_always_whole_and_the_wrapper_line_is_never_shown(width):
    out = render(width)
    for row in rows():
        assert re.search(rf"(^|\W){re.escape(row['id'])}(\W|$)", out, re.MULTILINE), (width, row["id"], out)
    assert "command -v" not in out and "PYTHONPATH" not in out
    ids = {row["id"] for row in rows()}
    assert all(len(line) <= width for line in out.splitlines() if line.strip() not in ids), out


def test_runs_show_task_arguments_and_outcome():
    out = render(250)
    assert "test-drafter --ckpt '/data/drafts/kimi k2 [eagle3]' --steps 3 --device auto" in out
    assert "MISMATCH" in out and "412 tok/s; error: OOM" in out and "second line" not in out
    assert "bench --fast" in out and "running (runner gone)" in out


def test_describe_and_headline_of_old_and_odd_rows():
    from draftops.console import describe_run, headline
    assert describe_run({"name": "env-check"}) == "env-check"
    assert describe_run({"task": "x", "args": {"dry_run": True, "path": "a'b"}}) == "x --dry-run --path 'a'\"'\"'b'"
    assert headline({}) == "" and headline({"outcome": {"status": "MATCH"}}) == "MATCH"
    assert headline({"outcome": {"error": "e" * 200}}).endswith("...")
