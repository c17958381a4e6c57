"""What a command made of steps (the doctor, the tune) shares to run them and end cleanly however it
ends: a lock on its folder (one process runs it at a time), SIGTERM/SIGHUP raised as ``Stopped`` (or
ignored while it cleans up), the quiet view that remembers the job a step follows, and stopping that
job when the command ends early (a tool's run must not outlive the command)."""
from __future__ import annotations

import fcntl
import json
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

from draftops.errors import DraftopsError
from draftops.history import now_iso
from draftops.link.host import Host
from draftops.runs import jobs
from draftops.runs.tools import JobView
from draftops.terminal import clean

SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Stopped(BaseException):
    """A signal ended the command (raised from its handler; BaseException, as KeyboardInterrupt)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def raise_stopped(signum: int, frame: FrameType | None) -> None:
    raise Stopped(signum)


@contextmanager
def signals(handler: Any) -> Iterator[None]:
    """SIGTERM and SIGHUP handled as ``handler`` says (a ``Stopped`` raised, or ignored while cleaning up)."""
    old = {sig: signal.signal(sig, handler) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, was in old.items():
            signal.signal(sig, was)


def stopped_why(exc: KeyboardInterrupt | Stopped) -> tuple[str, int]:
    """What a step stopped by Ctrl-C or a signal says, and the signal's number."""
    signum = exc.signum if isinstance(exc, Stopped) else int(signal.SIGINT)
    return f"stopped by {signal.Signals(signum).name} during this step", signum


class Tracker(JobView):
    """A quiet view that remembers the job it follows, so an interrupted command can stop it (a tool
    job it started must not outlive it), names it at once (``on_start``), and lets Ctrl-C raise as usual."""

    def __init__(self, say: Callable[[str], None], on_start: Callable[[str], None] = lambda run_id: None) -> None:
        self.say, self.on_start = say, on_start
        self.current: str | None = None

    def started(self, host: str, run_id: str) -> None:
        self.current = run_id
        self.on_start(run_id)
        self.say(f"  run {run_id}")


class HasRuns(Protocol):
    runs: list[str]


def ran(step: HasRuns, run_id: str) -> None:
    """Note a run of the step (the tracker notes a job as it starts; a step adds what made no job)."""
    if run_id not in step.runs:
        step.runs.append(run_id)


def stop_followed(host: Host, job: str, who: str, say: Callable[[str], None],
                  warn: Callable[[str], None]) -> None:
    """Stop the job ``who`` (the doctor, the tune) was following when it ended early, if still running."""
    try:
        if jobs.status(host, job).get("state") in ("running", "starting"):
            jobs.kill(host, job, 10.0)
            say(f"stopped run {job}, which {who} was following")
    except DraftopsError as exc:
        warn(f"could not stop run {job}: {clean(str(exc))}")


@contextmanager
def held(path: Path, missing: Callable[[], Exception], unopenable: Callable[[OSError], Exception],
         busy: Callable[[int], Exception]) -> Iterator[None]:
    """Hold the lock file ``path`` (flock) for the block, writing who holds it; the lock file is the
    tool's own, created once and never deleted (deleting a lock file races with its next holder). The
    errors are the caller's: ``missing`` (no folder), ``unopenable`` (the open's error), ``busy`` (given
    the open descriptor, to read who holds it)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    except FileNotFoundError:
        raise missing() from None
    except OSError as exc:
        raise unopenable(exc) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise busy(fd) from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "since": now_iso()}).encode())
        yield
    finally:
        os.close(fd)


GONE = ("stopped", "not-ours")      # a server entry's states that need no stop


def stop_servers(servers: list[dict[str, Any]], stop: Callable[[dict[str, Any]], None],
                 label: Callable[[dict[str, Any]], str], keep_last: bool = False) -> list[str]:
    """Stop every server the command started and has not stopped (but the last when ``keep_last``);
    returns what is left running, as the state says it (``label``: the server's role)."""
    for entry in servers:
        if entry.get("state") in GONE or (keep_last and entry is servers[-1]):
            continue
        stop(entry)
    return [f"{label(e)} server on port {e['port']} (run {e['run_id']})" for e in servers
            if e.get("state") not in GONE]
