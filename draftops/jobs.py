"""Remote jobs: every run gets an id and ``<root>/runs/<id>/`` (job.json, log, status.json), runs
detached from the SSH link, and can be listed, followed, killed and pulled home.
"""
from __future__ import annotations

import io
import json
import secrets
import shlex
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from remote import events

from draftops.errors import JobError, RemoteError
from draftops.host import Host

NO_SUCH_RUN = 7                  # the host agent's exit code for a missing run folder
RUN_DIR = "$DRAFTOPS_RUN_DIR"   # in a job's argv: the job's own run folder (set by the runner)


def shell_path(path: str) -> str:
    """Quote a host path but keep a leading ``~/`` expandable."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def new_run_id(name: str) -> str:
    """Sortable, unique, readable: ``20261130-101500-test-drafter-a1b2``."""
    slug = "".join(ch if ch.isalnum() or ch == "-" else "-" for ch in name.lower()).strip("-") or "job"
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{slug[:32]}-{secrets.token_hex(2)}"


def _check_id(run_id: str) -> str:
    if not run_id or "/" in run_id or run_id.startswith("."):
        raise JobError(f"{run_id!r} is not a run id; `invoke runs` lists them.")
    return run_id


@dataclass
class Job:
    """A started remote job."""

    host: Host
    id: str

    @property
    def run_dir(self) -> str:
        return f"{self.host.runs_dir}/{self.id}"


def start(host: Host, name: str, command: str, *, env: Mapping[str, str] | None = None,
          cwd: str | None = None) -> Job:
    """Start ``command`` (a shell command line) detached on ``host``; returns at once.

    ``cwd`` is relative to the host's root (default ``code``, the synced tree); ``env`` values are
    stored in the run's 0600 job.json and never printed."""
    job = Job(host, new_run_id(name))
    spec = {"name": name, "command": command, "cwd": cwd or "code", "env": dict(env or {}),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    host.agent("start", f"runs/{job.id}", input=json.dumps(spec).encode())
    return job


def python_module_command(host: Host, module: str, args: list[str]) -> str:
    """Command line that runs ``python -m module args`` with the host's ml-env python on the synced code
    (the job's cwd, ``<root>/code``)."""
    argv = " ".join('"$DRAFTOPS_RUN_DIR"' if a == RUN_DIR else shlex.quote(a) for a in args)
    python = shell_path(host.spec.interpreter)
    missing = (f"draftops: the ml-env python {host.spec.interpreter} does not exist on host {host.name}; "
               "run `invoke env.setup` or fix `python:` in hosts.yaml")
    return (f"command -v {python} >/dev/null 2>&1 || {{ echo {shlex.quote(missing)} >&2; exit 127; }}; "
            f'PYTHONPATH="$PWD" exec {python} -m {module} {argv}')


def status(host: Host, run_id: str) -> dict[str, Any]:
    try:
        return host.agent("status", f"runs/{_check_id(run_id)}")
    except RemoteError as exc:
        if exc.exit_code != NO_SUCH_RUN:
            raise
        raise JobError(f"Host {host.name!r} has no run {run_id!r}; `invoke runs` lists the runs there.") from None


def list_runs(host: Host) -> list[dict[str, Any]]:
    return host.agent("runs", "runs")["runs"]


def kill(host: Host, run_id: str, grace_s: float = 10.0) -> dict[str, Any]:
    """SIGTERM the job's process group, SIGKILL after ``grace_s``; returns the final status."""
    status(host, run_id)
    return host.agent("kill", f"runs/{run_id}", str(grace_s))


class _LineSplitter:
    """Turns the raw byte stream into lines, then into events or text."""

    def __init__(self, on_text: Callable[[str], None], on_event: Callable[[dict[str, Any]], None]):
        self.buffer = b""
        self.on_text, self.on_event = on_text, on_event
        self.end: dict[str, Any] | None = None

    def feed(self, chunk: bytes) -> None:
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8", "replace")
            event = events.parse(line)
            if event is None:
                self.on_text(line)
            elif event.get("event") == "job-end":
                self.end = event
            else:
                self.on_event(event)


def follow(host: Host, run_id: str, on_text: Callable[[str], None],
           on_event: Callable[[dict[str, Any]], None] = lambda e: None, offset: int = 0) -> dict[str, Any]:
    """Stream the job's log until it ends; returns its final status. Ctrl-C only stops the tail."""
    status(host, run_id)
    splitter = _LineSplitter(on_text, on_event)
    host.transport.stream(host.agent_command("follow", f"runs/{run_id}", str(offset)),
                          splitter.feed)
    if splitter.buffer:
        splitter.feed(b"\n")
    return splitter.end or status(host, run_id)


def pull(host: Host, run_id: str, dest_root: Path | None = None) -> Path:
    """Copy ``<root>/runs/<id>/`` into local ``runs/<id>/`` (one tar stream)."""
    status(host, run_id)
    dest = (dest_root or host.project_root / "runs") / run_id
    result = host.transport.run(host.agent_command("pack", f"runs/{run_id}"))
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(result.stdout), mode="r:gz") as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
        else:  # pragma: no cover - Python without PEP 706
            for member in tar.getmembers():
                if member.issym() or member.islnk() or member.name.startswith(("/", "..")):
                    continue
                tar.extract(member, dest)
    return dest
