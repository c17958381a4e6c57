"""The agent's runner and `follow` see a process end the moment it ends (a Linux pidfd), instead of
up to a polling pause later; without a pidfd they poll as before. In-process, on real processes."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from draftops.onhost import agent as hostagent

needs_pidfd = pytest.mark.skipif(getattr(os, "pidfd_open", None) is None, reason="no os.pidfd_open here")


@needs_pidfd
def test_a_long_pause_ends_when_the_process_exits() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.2)"])
    fd = hostagent._exit_fd(child.pid)
    assert fd is not None
    try:
        began = time.monotonic()
        assert hostagent._pause_or_exit(fd, 60.0) is True       # a 60 s pause, cut short by the exit
        assert time.monotonic() - began < 30.0
        assert child.wait(timeout=5) == 0
    finally:
        os.close(fd)


@needs_pidfd
def test_the_runner_returns_the_exit_code_as_soon_as_the_command_ends(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(hostagent, "OUTCOME_POLL_S", 60.0)       # only the exit can end the wait early
    log = tmp_path / "log"
    log.write_bytes(b"")
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(7)"])
    began = time.monotonic()
    code = hostagent._wait_for(child, hostagent._EventScanner(str(log)), str(tmp_path / "status.json"), {})
    assert code == 7 and time.monotonic() - began < 30.0


def test_without_a_descriptor_it_is_a_plain_pause_and_a_gone_pid_has_none() -> None:
    began = time.monotonic()
    assert hostagent._pause_or_exit(None, 0.05) is False
    assert time.monotonic() - began >= 0.05
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    assert hostagent._exit_fd(int(done.stdout)) is None           # reaped: nothing to wait on
    assert hostagent._exit_fd(None) is None and hostagent._exit_fd(0) is None


def test_the_runner_still_waits_by_polling_where_there_is_no_pidfd(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(hostagent, "_exit_fd", lambda pid: None)
    log = tmp_path / "log"
    log.write_bytes(b"")
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    assert hostagent._wait_for(child, hostagent._EventScanner(str(log)), str(tmp_path / "status.json"), {}) == 3
