"""`invoke test-drafter` as a user sees it: the job's progress while it runs, the result once (the rich
report, not the log's plain summary as well), the log's end when it fails, and `invoke runs` naming
the task, its arguments and the verdict instead of the wrapper shell line.

The terminal check runs the task on a real pseudo-terminal and replays what it wrote through a
terminal emulator (pyte), so it counts what stays on the screen, as a person would."""
from __future__ import annotations

import json
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from fcntl import ioctl
from pathlib import Path

import pytest

from remote.drafter.cli import summary
from tests.conftest import REPO, ssh_entry
from tests.support.drafter_support import task_project
from tests.support.laptop_venv import laptop_python
from tests.support.tasks import invoke

pytestmark = [pytest.mark.ssh, pytest.mark.slow]
ROWS, COLS = 60, 200


def invoke_on_a_terminal(project: Path, *args: str) -> tuple[int, bytes]:
    """Run invoke with a pseudo-terminal as stdin/stdout/stderr; return its exit code and every byte."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "TERM": "xterm-256color"}
    for name in ("DRAFTOPS_HOST", "DRAFTOPS_INVENTORY", "COLUMNS", "LINES", "NO_COLOR"):
        env.pop(name, None)
    leader, follower = pty.openpty()
    ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
    proc = subprocess.Popen([laptop_python(), "-m", "invoke", *args], cwd=project, env=env, stdin=follower,
                            stdout=follower, stderr=follower, close_fds=True, start_new_session=True)
    os.close(follower)
    out = bytearray()
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:            # EIO: the last writer closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
        return proc.wait(timeout=60), bytes(out)
    finally:
        os.close(leader)
        if proc.poll() is None:
            proc.kill()


def screen_text(raw: bytes) -> list[str]:
    """Every line a terminal shows after ``raw``, scrolled-off lines included."""
    import pyte
    screen = pyte.HistoryScreen(COLS, ROWS, history=20000, ratio=0.001)
    stream = pyte.ByteStream(screen)
    stream.feed(raw.replace(b"\n", b"\r\n") if b"\r\n" not in raw else raw)
    def render(line) -> str:
        return "".join(line[x].data for x in range(COLS)).rstrip()
    return [render(line) for line in screen.history.top] + [line.rstrip() for line in screen.display]


@pytest.fixture(scope="module")
def drafter_project(tmp_path_factory, sshd):
    base = tmp_path_factory.mktemp("drafter-task")
    entry = ssh_entry(sshd, base, python=sys.executable)
    # Seed the hosts' demo caches with this process's demo instead of generating it again.
    return task_project(base, {"box": entry}, "box", demo_roots=(base / "hostroot",), local_demo=True)


@pytest.fixture(scope="module")
def first_run(drafter_project):
    result = invoke(drafter_project, "sync", "test-drafter", "--steps", "3")
    assert result.returncode == 0, result.stdout + result.stderr
    run_dir = next((drafter_project / "runs").glob("*-test-drafter-*"))
    return result, json.loads((run_dir / "report.json").read_text()), run_dir.name


def test_the_verdict_is_shown_once_as_the_report(first_run):
    result, report, _ = first_run
    out = result.stdout + result.stderr
    # box has no serve profile: it serves with SGLang, which never reads a speculators config's ids,
    # so the demo's fix is a flat-format copy (tests/test_sglang_host_verdict.py)
    ids = report["verdict"]["fix_layer_ids"]
    fix = f"fix: a flat-format copy with eagle_config.eagle_aux_hidden_state_layer_ids = {ids}"
    assert fix in out and report["verdict"]["status"] in out
    assert out.count("predicted accept length") == 1, out
    for line in summary(report):                  # the job log's plain summary is not repeated
        assert line.strip() not in out, line
    # its log lines are not replayed once it is over; piped, as here, the latest one was shown as it ran,
    # one `… ` line every few seconds (issue 35, item 12), never the whole log
    shown = [line for line in out.splitlines() if "drafter: " in line]
    assert all(line.startswith("… ") for line in shown) and len(shown) <= 2, out


def test_runs_shows_the_task_its_arguments_and_the_verdict(drafter_project, first_run):
    _, report, run_id = first_run
    result = invoke(drafter_project, "runs")
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if run_id in line)
    assert "test-drafter --steps 3 --device auto" in row and report["verdict"]["status"] in row
    assert "succeeded" in row
    assert "command -v" not in result.stdout and "PYTHONPATH" not in result.stdout


def test_a_failed_run_shows_the_end_of_its_log_once(drafter_project):
    result = invoke(drafter_project, "test-drafter", "--ckpt", "/nonexistent/draft", "--data", "/nonexistent/dumps")
    assert result.returncode == 1
    out = result.stdout + result.stderr
    assert "failed (exit 3)" in out and "/nonexistent/draft" in out
    error_lines = [line for line in out.splitlines() if line.startswith("error: ") and "nonexistent" in line]
    assert len(error_lines) == 1, out           # the drafter's paragraph, from the log's end, once
    listed = invoke(drafter_project, "runs").stdout
    assert "error:" in listed and "--ckpt /nonexistent/draft" in listed


def test_on_a_terminal_progress_shows_while_it_runs_and_the_result_stays_once(drafter_project):
    pytest.importorskip("pyte")
    code, raw = invoke_on_a_terminal(drafter_project, "test-drafter", "--host", "local")
    screen = screen_text(raw)
    text = "\n".join(screen)
    assert code == 0, text[-3000:]
    assert b"drafter: " in raw, "the log window never showed the job's progress"
    assert "drafter: " not in text, "the log window was left on the screen"
    assert text.count("predicted accept length") == 1, text[-3000:]
    assert "fix: eagle_aux_hidden_state_layer_ids" in text
