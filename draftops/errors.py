"""The exceptions draftops raises on the local side: one tree, drawn here once.

    DraftopsError
    ├── InventoryError      hosts.yaml missing, malformed, invalid, or an unknown host name
    ├── ConnectError        the host cannot be reached or refuses us
    │   ├── HostUnreachable   no TCP/SSH session within the connect timeout
    │   ├── AuthFailed        the key was rejected
    │   ├── HostKeyRejected   the host key is unknown (strict) or changed
    │   └── LinkDropped       the link dropped during a call: no answer came back   (also an AgentError)
    ├── RemoteError         a command on the host failed; ``.result`` is that command's FailedCommand
    │   ├── AgentError        the host agent's answer is unusable (no reply, not JSON, another protocol)
    │   ├── RootError         the host's `root` is unusable (`/`, the home directory, not writable)
    │   ├── SyncRefused       the agent refused a sync, nothing half-done   (also a SyncError)
    │   ├── UnknownRun        the host has no run of that id                (also a JobError)
    │   ├── SchedulerError    Slurm refused a job or did not answer (sbatch, scancel)   (also a JobError)
    │   └── HostFileError     a host file cannot be read as asked (missing, not a regular file, too big)
    ├── SyncError           code sync failed; the remote tree is left as it was before
    ├── JobError            a run id is unknown or a job cannot be started, read, pulled or stopped
    │   └── ToolFailed        a remote tool's run ended other than ok; ``.result`` is its ToolResult
    ├── HistoryError        runs/history.sqlite cannot be read or written
    ├── BenchError          a benchmark result is unreadable, or two runs cannot be compared
    ├── DocumentError       a JSON document a tool wrote is unreadable, of another version, or fails its model
    ├── ServeError          a server could not be started, probed or stopped
    │   └── ServeRefused      a pre-start check failed (one paragraph per reason)
    ├── EngineError         an engine name or engine venv that cannot be used as given
    ├── ExtraMissing        the built-in `local` host needs the ML stack this install left out (the `local` extra)
    ├── PlaybookError       a playbook (playbooks/*.yaml) is missing, malformed or invalid
    ├── DoctorError         `invoke doctor` cannot start or resume as asked (its state file, different arguments)
    ├── TuneError           `invoke tune` cannot start, resume or write its state (tune.json, its lock, the budget)
    ├── ScheduleError       the nightly crontab block cannot be read or written
    └── TrackingError       the MLflow tracking server did not take a run (down, slow, refusing; `runs.export`)

Messages. Each is one paragraph that names the file, field or host and the fix. A message about a
host starts with ``Host 'NAME'`` (``host_prefix``), the way the agent client and the transports
write them; the command line adds ``error: `` in front (``draftops.cli.common.friendly``) and nothing
else does, so every error reads the same wherever it comes from.

Transport failures. What the SSH library or a socket raises when a link drops (paramiko's
``SSHException``, ``EOFError``, ``OSError``) is mapped inside ``draftops.link`` where it happens, as
httpx maps at its transport: every agent call that loses its link raises ``LinkDropped``, so nothing
above the link package names the SSH library or its exceptions.

Carrying the result. A ``RemoteError`` keeps what the failed command left, as Invoke's
``UnexpectedExit`` keeps ``result``: ``err.result`` holds the host, the command line, the exit code
and the tails of stdout and stderr (bounded: a log-sized stream must not live in an exception). An
error raised for another reason by code that caught a RemoteError chains it (``raise ... from exc``),
so ``err.__cause__.result`` is still there.

The other tree. ``remote/`` runs on the GPU host under the ml-env python and cannot import draftops
(nor draftops it: the host's code must stay free of pydantic, paramiko and rich), so the remote
tools have a tree of their own: one base, ``remote.exitcodes.ToolError``, and under it each tool's
small tree next to it (``remote/drafter/errors.py``, ``remote/sglang_patch/errors.py``,
``remote/draft_config/errors.py``, ``remote/bench/errors.py``). Those errors never cross the link as
objects: the one envelope of every tool (``remote.exitcodes.main``) prints the one-paragraph message
(and an ``error`` event) and exits with the error's code, and the local side raises one of the
errors above with that message. The host agent's refusals cross the same
way: as an exit code from ``wire.Exit``, which ``draftops.link.agent`` maps to one class here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TAIL_CHARS = 2000      # what a FailedCommand keeps of each stream (the end, where the reason is)


def host_prefix(name: str, where: str | None = None) -> str:
    """``Host 'box'`` or ``Host 'box' (user@address:port)``: how every message about a host starts."""
    return f"Host {name!r}" + (f" ({where})" if where else "")


def tail(data: bytes | str, limit: int = TAIL_CHARS) -> str:
    """The last ``limit`` characters of a command's output, as text."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    return text[-limit:]


@dataclass(frozen=True)
class FailedCommand:
    """What a failed host command left behind (``RemoteError.result``)."""

    host: str
    command: str             # the command line as sent (an agent call: its subcommand and arguments)
    exit_code: int | None    # None: no exit status came back (timed out, link dropped)
    stdout: str = ""         # tail of stdout
    stderr: str = ""         # tail of stderr

    @classmethod
    def of(cls, host: str, command: str, exit_code: int | None, stdout: bytes | str = b"",
           stderr: bytes | str = b"") -> FailedCommand:
        return cls(host, command, exit_code, tail(stdout), tail(stderr))


class DraftopsError(Exception):
    """Base class: everything draftops raises on purpose."""


class InventoryError(DraftopsError):
    """hosts.yaml cannot be used as it is."""


class ConnectError(DraftopsError):
    """The host could not be connected to."""


class HostUnreachable(ConnectError):
    """No SSH session could be opened within the connect timeout."""


class AuthFailed(ConnectError):
    """The host rejected our key."""


class HostKeyRejected(ConnectError):
    """The host key is not trusted under the host's `host_key` policy."""


class RemoteError(DraftopsError):
    """A command run on the host failed; ``result`` says which, how it exited and what it printed."""

    def __init__(self, message: str, result: FailedCommand):
        super().__init__(message)
        self.result = result

    @property
    def exit_code(self) -> int | None:
        return self.result.exit_code

    @property
    def stdout(self) -> str:
        return self.result.stdout

    @property
    def stderr(self) -> str:
        return self.result.stderr


class AgentError(RemoteError):
    """The host agent answered with nothing usable, crashed, or speaks another protocol version."""


class RootError(RemoteError):
    """The host's `root` directory is refused or not writable."""


class LinkDropped(AgentError, ConnectError):
    """The link to the host dropped during an agent call, before its answer came back (no exit status,
    or the SSH library or socket failed mid-call): the call may or may not have run there. An
    ``AgentError`` too, so every caller that handles an agent's failure handles this one as before."""


class SyncError(DraftopsError):
    """Syncing code to the host failed."""


class SyncRefused(RemoteError, SyncError):
    """The host agent refused a sync (a bad entry, a foreign code folder, a live run, the lock)."""


class JobError(DraftopsError):
    """A remote job could not be found, started or stopped."""


class ToolFailed(JobError):
    """A remote tool's run ended other than ok (``draftops.runs.tools.run_tool``); ``.result`` is its
    ``ToolResult``: the final status, the pulled folder, the tool's result file and error event."""

    def __init__(self, message: str, result: Any):
        super().__init__(message)
        self.result = result


class UnknownRun(RemoteError, JobError):
    """The host has no run folder of that id."""


class SchedulerError(RemoteError, JobError):
    """A Slurm host's scheduler refused a job or did not answer (``sbatch``, ``scancel``); nothing was
    queued twice or cancelled half-way."""


class HostFileError(RemoteError):
    """A host file the local side reads (``AgentClient.read``) is missing, not a regular file (a folder,
    FIFO or device), unreadable, or bigger than the read takes."""


class HistoryError(DraftopsError):
    """The local run history (runs/history.sqlite) cannot be read or written."""


class BenchError(DraftopsError):
    """A benchmark result cannot be read, or two runs cannot be compared."""


class DocumentError(DraftopsError):
    """A JSON document a remote tool wrote (``draftops.documents``) cannot be read as its model: not
    JSON, a schema version this draftops does not read, or a field of the wrong type."""


class ServeError(DraftopsError):
    """A server could not be started, reached or stopped."""


class ServeRefused(ServeError):
    """`invoke serve` refused to start: each reason is one paragraph naming what to change."""

    def __init__(self, *reasons: str):
        super().__init__("\n\n".join(reasons))
        self.reasons = list(reasons)


class EngineError(DraftopsError):
    """An engine name or engine venv that cannot be used as given."""


class ExtraMissing(DraftopsError):
    """A tool that needs torch would run on the built-in ``local`` host, with this interpreter, and a base
    install (no ``local`` extra) has no torch here: said before the job starts, with the install line."""


class MlEnvUnfit(DraftopsError):
    """A host's ml-env python cannot run the evaluator (no torch or safetensors): env.check fails with
    the paragraph that names the host, its python and `invoke env.setup`."""


class PlaybookError(DraftopsError):
    """A playbook cannot be used as it is (the message names file, line and field)."""


class NightBusy(PlaybookError):
    """A host of the night is in use by another night of the same project; nothing ran."""


class DoctorError(DraftopsError):
    """`invoke doctor` cannot start or resume as asked (its state file, arguments that differ)."""


class TuneError(DraftopsError):
    """`invoke tune` cannot start, resume or write its state as asked."""


class ScheduleError(DraftopsError):
    """The user's crontab could not be read or changed."""


class TrackingError(DraftopsError):
    """The MLflow tracking server did not take a run: down, slower than the bound, or refusing it."""
