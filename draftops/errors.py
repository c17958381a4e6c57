"""The exceptions draftops raises; each message is one paragraph naming the file, host or field and the fix.

    DraftopsError
    ├── InventoryError      hosts.yaml missing, malformed, invalid, or an unknown host name
    ├── ConnectError        the host cannot be reached or refuses us
    │   ├── HostUnreachable   no TCP/SSH session within the connect timeout
    │   ├── AuthFailed        the key was rejected
    │   └── HostKeyRejected   the host key is unknown (strict) or changed
    ├── RemoteError         a command on the host failed (carries stdout/stderr/exit code)
    ├── RootError           the host's `root` is unusable (not writable, `/`, the home directory)
    ├── SyncError           code sync failed; the remote tree is left as it was before
    ├── JobError            a run id is unknown or a job cannot be started/stopped
    ├── HistoryError        runs/history.sqlite cannot be read or written
    ├── BenchError          a benchmark result is unreadable, or two runs cannot be compared
    ├── ServeError          a server could not be started, probed or stopped
    │   └── ServeRefused      a pre-start check failed (one paragraph per reason)
    ├── PlaybookError       a playbook (playbooks/*.yaml) is missing, malformed or invalid
    └── ScheduleError       the nightly crontab block cannot be read or written
"""
from __future__ import annotations


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
    """A command run on the host exited non-zero."""

    def __init__(self, message: str, *, exit_code: int | None = None, stdout: str = "", stderr: str = ""):
        super().__init__(message)
        self.exit_code = exit_code
        self.stdout = stdout
        self.stderr = stderr


class RootError(DraftopsError):
    """The host's `root` directory is refused or not writable."""


class SyncError(DraftopsError):
    """Syncing code to the host failed."""


class JobError(DraftopsError):
    """A remote job could not be found, started or stopped."""


class HistoryError(DraftopsError):
    """The local run history (runs/history.sqlite) cannot be read or written."""


class BenchError(DraftopsError):
    """A benchmark result cannot be read, or two runs cannot be compared."""


class ServeError(DraftopsError):
    """A server could not be started, reached or stopped."""


class ServeRefused(ServeError):
    """`invoke serve` refused to start: each reason is one paragraph naming what to change."""

    def __init__(self, *reasons: str):
        super().__init__("\n\n".join(reasons))
        self.reasons = list(reasons)


class PlaybookError(DraftopsError):
    """A playbook cannot be used as it is (the message names file, line and field)."""


class ScheduleError(DraftopsError):
    """The user's crontab could not be read or changed."""
