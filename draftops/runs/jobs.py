"""Remote jobs: every run gets an id and ``<root>/runs/<id>/`` (job.json, log, status.json), runs
detached from the SSH link, and can be listed, read, followed, killed and pulled home.

job.json says what the run is (the task and its arguments, never env values); status.json says how it
went (state, exit code, and the ``outcome``: the fields of the last ``result`` event the job printed,
e.g. the drafter's verdict, so any task can record its own headline). Logs travel in bounded blocks
and reach the terminal only through :mod:`draftops.terminal`.
"""
from __future__ import annotations

import fcntl
import json
import os
import secrets
import shlex
import shutil
import tarfile
import tempfile
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftops import history
from draftops.errors import ConnectError, DraftopsError, JobError, RemoteError, UnknownRun
from draftops.link.host import Host
from draftops.onhost import wire
from draftops.runs import mlstack
from draftops.terminal import clean, needs_cleaning
from remote import events, exitcodes

if TYPE_CHECKING:       # pydantic models: loaded with the inventory, not at import
    from draftops.slurmspec import SlurmOptions

RUN_DIR = "$DRAFTOPS_RUN_DIR"      # in a job's argv: the job's own run folder (set by the runner)
#: an argv item of a job that is exactly one of these is left to the job's shell: the run folder, and
#: what a Slurm job's `srun` tasks know of their node (drafter/spread.slurm_command)
JOB_VARS = (RUN_DIR, "$SLURM_NNODES", "$SLURM_NODEID", "$DRAFTOPS_RDZV")
TAIL_LINES = 50                    # what `invoke logs` shows without --all / --lines
RUNS_SHOWN = 20                    # what `invoke runs` shows without --all / --last
MAX_LINE = wire.MAX_LINE      # longer lines are passed on in pieces of this many bytes
PULLED_LIST = ".draftops-pulled.json"   # in a pulled copy: the names that came from the host
PULL_MARK = ".pull-"                     # in the name of a pull's temp folder: runs/.<id>.pull-XXXX
#: what draftops itself writes in the local runs/ besides pulled run folders (the history database
#: and its SQLite side files, the nightly reports and the scheduled nights' log): never a pull's
LOCAL_NAMES = (history.DB_NAME, "nightly.log")
LOCAL_PREFIXES = (history.DB_NAME + "-", "nightly-")


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


def is_run_id(run_id: object) -> bool:
    """Whether ``run_id`` can name a run folder (a name, never a path; no comma, which separates ids;
    printable, so no control character reaches a message and no undecodable byte (a surrogate) reaches
    the SSH library, which cannot encode it)."""
    return (isinstance(run_id, str) and bool(run_id) and "/" not in run_id and "," not in run_id
            and not run_id.startswith(".") and run_id.isprintable())


def _check_id(run_id: str) -> str:
    if not is_run_id(run_id):
        raise JobError(f"{run_id!r} is not a run id; `invoke runs` lists them.")
    return run_id


@dataclass
class Job:
    """A started remote job."""

    host: Host
    id: str
    pid: int | None = None     # the runner's, as the start's reply said (None: a Slurm job's, on its node)

    @property
    def run_dir(self) -> str:
        return f"{self.host.runs_dir}/{self.id}"


def _plain_args(args: Mapping[str, Any] | None) -> dict[str, Any]:
    """The task's arguments as JSON scalars, unset ones left out."""
    plain: dict[str, Any] = {}
    for key, value in (args or {}).items():
        if value is None or value is False:
            continue
        plain[str(key)] = value if isinstance(value, (str, int, float, bool)) else str(value)
    return plain


def start(host: Host, name: str, command: str, *, env: Mapping[str, str] | None = None,
          cwd: str | None = None, task: str | None = None, args: Mapping[str, Any] | None = None,
          slurm: SlurmOptions | None = None) -> Job:
    """Start ``command`` (a shell command line) detached on ``host``; returns at once.

    ``task`` and ``args`` say what the run is for `invoke runs` (default: ``name``, no arguments);
    ``cwd`` is relative to the host's root (default ``code``, the synced tree); ``env`` values reach
    the job only (a 0600 file its runner reads and deletes), never job.json, a log or a pulled folder.
    On a ``scheduler: slurm`` host the runner is queued as a Slurm batch job instead (docs/slurm.md),
    with the host's ``slurm:`` options, its task's, and ``slurm`` (a serve profile's) over them."""
    job = Job(host, new_run_id(name))
    spec: dict[str, Any] = {"name": name, "task": task or name, "args": _plain_args(args), "command": command,
                            "cwd": cwd or "code", "env": dict(env or {}),
                            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if host.spec.scheduler == "slurm":
        spec["slurm"] = slurm_job(host, task or name, slurm)
    try:
        job.pid = host.agent.start(job.id, spec)
    except RemoteError as exc:
        if exc.result is None or exc.result.exit_code not in (None, -1):
            raise                                   # the agent answered: a refusal, nothing started
        job.pid = _started_anyway(host, job, exc)
    return job


def slurm_job(host: Host, task: str, more: SlurmOptions | None = None) -> dict[str, Any]:
    """The ``slurm`` part of a job spec: the sbatch options (one argv item each) and the pending bound."""
    from draftops.slurmspec import resolve, sbatch_args

    options = resolve(host.spec.slurm, task, more)
    bound = host.max_pending if host.max_pending is not None else options.max_pending
    return {"args": sbatch_args(options), "max_pending": bound}


def pending_bound(host: Host, task: str, more: SlurmOptions | None = None) -> float | None:
    """Seconds a job of ``task`` may wait in the queue (this task's --max-pending, else hosts.yaml's);
    None on a host without a scheduler or without a bound."""
    return slurm_job(host, task, more)["max_pending"] if host.spec.scheduler == "slurm" else None


def bound_pending(host: Host, seconds: float | None) -> None:
    """Make ``seconds`` (a task's ``--max-pending``) the queue-wait bound of every job this task starts on
    ``host``, over hosts.yaml's ``max_pending``; None: hosts.yaml's. Refused on a host without a
    scheduler: its jobs never queue, and a bound silently ignored would read as one that held."""
    if seconds is not None and host.spec.scheduler != "slurm":
        raise JobError(f"Host {host.name!r} has no scheduler (no `scheduler: slurm` in hosts.yaml): its jobs start "
                       "at once and never wait in a queue, so --max-pending bounds nothing there. Drop "
                       "--max-pending, or name a Slurm host with --host.")
    host.max_pending = seconds


def _started_anyway(host: Host, job: Job, lost: RemoteError) -> int | None:
    """The start's answer was lost (the link dropped): the job may be running on the host, and starting
    it again would run it twice. Ask the host (the transport reconnects) whether the run exists."""
    where = f"Host {host.name!r}"
    try:
        row = host.agent.status(job.id)
    except UnknownRun:
        raise JobError(f"{where}: run {job.id} did not start: the link dropped before the host created it "
                       f"(no answer came back). Nothing runs there; "
                       "start it again.") from lost
    except DraftopsError as exc:      # a dropped link included (draftops.link maps it: LinkDropped)
        raise JobError(f"{where}: the link dropped while starting run {job.id}, and the host could not be asked "
                       f"whether it started ({exc}). It may be running: check with `invoke runs --host "
                       f"{host.name}` or `invoke logs {job.id} --host {host.name}` before starting it again."
                       ) from lost
    pid = row.get("pid")
    return int(pid) if isinstance(pid, int) else None


def python_m(python: str, module: str, args: Sequence[str], *, no_site: bool = False, in_job: bool = False) -> str:
    """``PYTHON [-S] -m MODULE ARGS``, every part quoted: the one builder of the line that runs a module on
    the host, for a job (:func:`python_module_command`) and a quick tool (``tools.module_command``).
    ``in_job``: ``RUN_DIR`` (and the other ``JOB_VARS``) among ``args`` are expanded by the job's shell."""
    argv = [f'"{a}"' if in_job and a in JOB_VARS else shlex.quote(a) for a in args]
    return " ".join([shell_path(python) + (" -S" if no_site else ""), "-m", shlex.quote(module), *argv])


def python_module_command(host: Host, module: str, args: list[str]) -> str:
    """Command line that runs ``python -m module args`` with the host's ml-env python on the synced code
    (the job's cwd, ``<root>/code``). A module that needs the ML stack on a ``local`` host whose install
    lacks it is refused here, in one line, before any job starts (``mlstack.require``)."""
    python = shell_path(host.spec.interpreter)
    line = python_m(host.spec.interpreter, module, args, in_job=True)
    mlstack.require(host, module)
    missing = (f"draftops: the ml-env python {host.spec.interpreter} does not exist on host {host.name}. "
               + mlstack.setup_advice(host) + " Or fix `python:` in hosts.yaml.")
    return (f"command -v {python} >/dev/null 2>&1 || "
            f"{{ echo {shlex.quote(missing)} >&2; exit {exitcodes.NO_PYTHON}; }}; "
            f'PYTHONPATH="$PWD" exec {line}')


def status(host: Host, run_id: str) -> dict[str, Any]:
    return host.agent.status(_check_id(run_id))


def list_runs(host: Host, ids: list[str] | None = None) -> list[dict[str, Any]]:
    """The host's runs, or only those of ``ids`` (each checked to be a run id)."""
    return host.agent.runs(None if ids is None else [_check_id(i) for i in ids])


def recent_runs(host: Host, count: int) -> tuple[list[dict[str, Any]], int]:
    """The host's last ``count`` runs (oldest first) and how many it has in all."""
    if count < 1:
        raise JobError(f"the number of runs to show must be 1 or more, not {count}.")
    return host.agent.recent(count)


def kill(host: Host, run_id: str, grace_s: float = 10.0) -> dict[str, Any]:
    """SIGTERM the job's process group, SIGKILL after ``grace_s``; returns the final status."""
    return host.agent.kill(_check_id(run_id), grace_s)


class LineSplitter:
    """Bytes in, lines out: text lines (made terminal-safe) to ``on_text``, events to ``on_event``;
    the job-end event is kept in ``end``.

    Memory is bounded and the work linear whatever the stream looks like: each chunk is searched
    once, and a line longer than ``max_line`` bytes is passed on in pieces."""

    def __init__(self, on_text: Callable[[str], None],
                 on_event: Callable[[dict[str, Any]], None] = lambda event: None, max_line: int = MAX_LINE):
        self.on_text, self.on_event, self.max_line = on_text, on_event, max_line
        self.partial = bytearray()
        self.end: dict[str, Any] | None = None

    def feed(self, chunk: bytes) -> None:
        end = chunk.rfind(b"\n")
        if end >= 0:
            if self.partial:
                self.partial += chunk[:end]
                block = bytes(self.partial)
                self.partial.clear()
            else:
                block = chunk[:end]
            self._block(block)
            chunk = chunk[end + 1:]
        self.partial += chunk
        while len(self.partial) >= self.max_line:
            piece = bytes(self.partial[:self.max_line])
            del self.partial[:self.max_line]
            self._block(piece)

    def close(self) -> None:
        """Pass on a last line that had no newline."""
        if self.partial:
            block = bytes(self.partial)
            self.partial.clear()
            self._block(block)

    def _block(self, block: bytes) -> None:
        """Complete lines, decoded and checked once per block: line by line only when it holds an
        event or something to clean (a log of plain text goes at C speed)."""
        text = block.decode("utf-8", "replace")
        lines = text.split("\n")
        if events.EVENT_PREFIX not in text and not needs_cleaning(text):
            for line in lines:
                self.on_text(line)
            return
        for line in lines:
            event = events.parse(line) if line.startswith(events.EVENT_PREFIX) else None
            if event is None:
                self.on_text(clean(line))
            elif event.get("event") == "job-end":
                self.end = event
            else:
                self.on_event(event)


def read_log(host: Host, run_id: str, on_text: Callable[[str], None],
             on_event: Callable[[dict[str, Any]], None] = lambda event: None,
             lines: int | None = TAIL_LINES) -> dict[str, Any]:
    """Stream the log's last ``lines`` text lines (None: all of it) to ``on_text``, in bounded memory.

    Returns the host's header: ``offset`` (where the shown part starts) and ``size`` (bytes in all)."""
    if lines is not None and lines < 0:
        raise JobError(f"--lines must be 0 or more, not {lines}.")
    splitter = LineSplitter(on_text, on_event)
    try:
        header = host.agent.tail(_check_id(run_id), lines, splitter.feed)
    finally:
        splitter.close()
    return {"offset": header.offset, "size": header.size}


#: how long a follow keeps re-attaching to a job whose log stream dropped or went silent (the keeper
#: closes a link that answers no keepalive for 10 s): the job lives on, so a stall must not end the follow
REATTACH_S = 120.0
REATTACH_PAUSE_S = 2.0


@dataclass
class _Silence:
    """A follow's re-attaching: one line when the stream is lost, and the bound on trying without progress."""

    host: str
    run_id: str
    on_text: Callable[[str], None]
    since: float | None = None
    at: int = -1

    def retry(self, at: int) -> bool:
        """Whether to re-attach at byte ``at`` (after a pause); progress since the last loss restarts the bound."""
        now = time.monotonic()
        if self.since is None or at > self.at:
            self.since, self.at = now, at
            self.on_text(f"[draftops] the link to host {self.host!r} went silent or dropped while run "
                         f"{self.run_id} runs on; re-attaching at byte {at} (for up to {REATTACH_S:g} s)")
        elif now - self.since >= REATTACH_S:
            return False
        time.sleep(REATTACH_PAUSE_S)
        return True


def follow(host: Host, run_id: str, on_text: Callable[[str], None],
           on_event: Callable[[dict[str, Any]], None] = lambda e: None, offset: int = 0,
           lines: int | None = None, bounded: bool = True) -> dict[str, Any]:
    """Stream the job's log until it ends, from byte ``offset`` or from its last ``lines`` lines;
    returns its final status. Ctrl-C only stops the tail. ``bounded``: a Slurm job still queued past
    its ``max_pending`` ends the follow (its row says so); False waits while it is queued.

    A stream that ends before the job's end event (a silent or dropped link, a killed agent) is
    re-attached where it stopped, with one line saying so, for up to ``REATTACH_S`` seconds without
    progress: the job does not depend on the link. Past that bound it is an error that says how to
    re-attach by hand."""
    splitter = LineSplitter(on_text, on_event)
    seen = {"start": offset, "bytes": 0, "known": lines is None}

    def feed(chunk: bytes) -> None:
        seen["bytes"] += len(chunk)
        splitter.feed(chunk)

    def started(at: int) -> None:
        if not seen["known"]:            # the first stream's start; a re-attach continues from bytes seen
            seen.update(start=at, known=True)

    cause: RemoteError | None = None
    silence = _Silence(host.name, run_id, on_text)
    while True:
        try:
            host.agent.follow(_check_id(run_id), feed, offset=seen["start"] + seen["bytes"],
                              lines=None if seen["known"] else lines, bounded=bounded, on_start=started)
            break
        except UnknownRun:
            raise
        except (RemoteError, ConnectError) as exc:
            cause = exc if isinstance(exc, RemoteError) else cause
        if splitter.end is not None or not silence.retry(seen["start"] + seen["bytes"]):  # no start yet: --lines again
            break
    splitter.close()
    if splitter.end is None:
        why = f"exit {cause.exit_code}" if cause else "no job-end event"
        raise JobError(
            f"Host {host.name!r}: the log stream of run {run_id} ended before the job did ({why}): the "
            "connection dropped or the host agent was stopped, and re-attaching did not work for "
            f"{REATTACH_S:g} s. The job itself keeps running on the host. "
            f"Re-attach with `invoke logs {run_id} --follow --host {host.name}` (about "
            f"{seen['start'] + seen['bytes']} bytes of its log were shown), or check it with `invoke runs`; `invoke "
            f"collect {run_id} --host {host.name}` finishes a test-drafter, capture-check or bench run as its task "
            "would have.") from cause
    return splitter.end


@dataclass
class Pulled:
    """A run folder copied home, and the entries the host left out (links leading out, FIFOs, ...)."""

    path: Path
    skipped: list[dict[str, str]] = field(default_factory=list)


def pull(host: Host, run_id: str, dest_root: Path | None = None) -> Path:
    """Copy ``<root>/runs/<id>/`` into local ``runs/<id>/``; see :func:`pull_run`."""
    return pull_run(host, run_id, dest_root).path


def pull_run(host: Host, run_id: str, dest_root: Path | None = None) -> Pulled:
    """Copy ``<root>/runs/<id>/`` into local ``runs/<id>/`` (one tar stream, spooled to disk).

    It lands in a temp folder next to the destination first and is renamed into place only when all
    of it arrived, so a failure leaves no partial folder (and an earlier copy stays as it was). Links
    that lead out of the run folder and special files are left out, each with a note in ``skipped``."""
    _check_id(run_id)
    dest_root = dest_root or host.project_root / "runs"
    dest = dest_root / run_id
    _check_replaceable(dest, run_id)
    try:
        dest_root.mkdir(parents=True, exist_ok=True)
        _remove_dead_pulls(dest_root)
        work, held = _work_folder(dest_root, run_id)
    except OSError as exc:
        raise JobError(f"Cannot pull run {run_id} into {dest}: {exc}.") from None
    try:
        archive = work / "pack.tar.gz"
        with open(archive, "wb") as fh:
            try:
                host.agent.pack(run_id, fh.write)
            except UnknownRun:
                raise
            except RemoteError as exc:
                raise JobError(f"{str(exc).rstrip('.')}. Pulling run {run_id} did not finish; {dest} was left as "
                               "it was.") from exc
        tree = work / "tree"
        tree.mkdir()
        skipped = _extract(archive, tree)
        _note_pulled(tree)
        _check_replaceable(dest, run_id)        # again: it may have appeared during the transfer
        if os.path.isdir(dest) and not os.path.islink(dest):
            _carry_local_files(dest, tree)
        _rename_into_place(tree, dest, work / "previous")
        return Pulled(dest, skipped)
    except (OSError, zlib.error, tarfile.TarError) as exc:
        raise JobError(f"Host {host.name!r}: pulling run {run_id} into {dest} failed: {exc}. {dest} was "
                       "left as it was.") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
        os.close(held)


def _check_replaceable(dest: Path, run_id: str) -> None:
    """Refuse a pull that would replace a local entry the host did not put there: draftops' own files
    (a host run folder named ``history.sqlite`` would replace the history with a folder), a file or
    link, or a folder without the list of pulled names (a nightly report, a compare, the user's)."""
    if run_id in LOCAL_NAMES or run_id.startswith(LOCAL_PREFIXES):
        raise JobError(f"Run id {run_id!r} names draftops' own local file {dest} (the run history, a "
                       "nightly report or the nightly log), so it is not pulled there: a host run folder "
                       "of that name would replace it. Rename the folder on the host (under its "
                       "<root>/runs/) and pull it by the new name.")
    if not os.path.lexists(dest):
        return
    if os.path.islink(dest) or not os.path.isdir(dest) or not os.path.isfile(dest / PULLED_LIST):
        what = ("a link" if os.path.islink(dest) else "a file" if not os.path.isdir(dest)
                else f"a folder without {PULLED_LIST}, so not an earlier pull of that run")
        raise JobError(f"Not pulling run {run_id}: {dest} exists here and is {what}; a pull would replace "
                       "it. Move it aside (or remove it if it is no longer needed) and pull again.")


def _work_folder(dest_root: Path, run_id: str) -> tuple[Path, int]:
    """A pull's temp folder under ``dest_root``, with a lock held on it for as long as the pull lives
    (its descriptor is returned): :func:`_remove_dead_pulls` tells a live pull's folder by that lock.
    Made under a shared lock on ``dest_root``, so no clean-up runs between its creation and its lock."""
    root_fd = os.open(dest_root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(root_fd, fcntl.LOCK_SH)
        work = Path(tempfile.mkdtemp(prefix=f".{run_id}{PULL_MARK}", dir=dest_root))
        held = os.open(work, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(held, fcntl.LOCK_EX)
        return work, held
    finally:
        os.close(root_fd)


def _remove_dead_pulls(dest_root: Path) -> None:
    """Remove the temp folders of pulls that were killed (SIGKILL, a power cut) before their own
    clean-up ran: they would stay in runs/ for good, as big as what had arrived. A live pull holds a
    lock on its folder and keeps it."""
    root_fd = os.open(dest_root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(root_fd, fcntl.LOCK_EX)
        for entry in os.scandir(dest_root):
            if not (entry.name.startswith(".") and PULL_MARK in entry.name) or not entry.is_dir(follow_symlinks=False):
                continue
            try:
                fd = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue                          # a live pull's
            finally:
                os.close(fd)
            shutil.rmtree(entry.path, ignore_errors=True)
    finally:
        os.close(root_fd)


def _extract(archive: Path, tree: Path) -> list[dict[str, str]]:
    """Unpack into ``tree`` only files, folders and links that stay inside it; return the notes."""
    skipped: list[dict[str, str]] = []

    def keep(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
        problem = _member_problem(member)
        if problem is None and hasattr(tarfile, "data_filter"):
            try:
                return tarfile.data_filter(member, path)
            except tarfile.FilterError as exc:
                problem = str(exc)
        if problem:
            skipped.append({"path": member.name, "reason": problem})
            return None
        return member

    _unpack(archive, tree, keep)
    notes = tree / wire.PULL_NOTES
    if notes.is_file() and not notes.is_symlink():
        try:
            skipped = json.loads(notes.read_text()).get("skipped", []) + skipped
        except (ValueError, AttributeError):
            skipped.append({"path": wire.PULL_NOTES, "reason": "unreadable notes from the host"})
        notes.unlink()
    return skipped + _drop_links_leading_out(tree)


def _unpack(archive: Path, tree: Path,
            keep: Callable[[tarfile.TarInfo, str], tarfile.TarInfo | None]) -> None:
    """Extract the pulled tar.gz through ``keep``; one that ends early is a ``tarfile.ReadError``."""
    try:
        with tarfile.open(archive, "r:gz") as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(tree, filter=keep)
            else:  # pragma: no cover - Python without PEP 706 (3.10 before .12)
                for member in tar:
                    if keep(member, str(tree)) is not None:
                        tar.extract(member, tree)
    except EOFError as exc:     # gzip's, for a local archive that ends early (the link's are mapped in link/)
        raise tarfile.ReadError(f"the archive ends early ({exc})") from None


def _drop_links_leading_out(tree: Path) -> list[dict[str, str]]:
    """Remove links that resolve outside ``tree`` (a chain of links may, even if each looked fine)."""
    dropped = []
    real_tree = os.path.realpath(tree)
    for folder, dirs, files in os.walk(tree):
        for name in dirs + files:
            path = os.path.join(folder, name)
            if os.path.islink(path) and os.path.commonpath([real_tree, os.path.realpath(path)]) != real_tree:
                dropped.append({"path": os.path.relpath(path, tree), "reason": "symlink leads out of the run folder"})
                os.unlink(path)
    return dropped


def _member_problem(member: tarfile.TarInfo) -> str | None:
    """Why a tar member may not be unpacked (None: it may)."""
    if not (member.isfile() or member.isdir() or member.issym()):
        return "not a file, folder or symlink"
    parts = member.name.split("/")
    if member.name.startswith("/") or ".." in parts:
        return "its name leads out of the run folder"
    if member.issym() and (member.linkname.startswith("/") or ".." in member.linkname.split("/")):
        return f"symlink to {member.linkname} may lead out of the run folder"
    return None


def _entries(top: Path) -> list[str]:
    """The files and links under ``top`` (relative POSIX paths; links to folders are not entered)."""
    found = []
    for folder, dirs, files in os.walk(top):
        for name in [*files, *(d for d in dirs if os.path.islink(os.path.join(folder, d)))]:
            found.append(os.path.relpath(os.path.join(folder, name), top).replace(os.sep, "/"))
    return found


def _note_pulled(tree: Path) -> None:
    """Record in the copy which names came from the host, so the next pull can tell them from files
    written here later."""
    (tree / PULLED_LIST).write_text(json.dumps(sorted(_entries(tree))))


def _carry_local_files(old: Path, tree: Path) -> None:
    """Keep, in the new copy, the files of the earlier copy that were written here after it was pulled
    (``bench-result.json``, built from the pulled files; a note): a pull refreshes the host's files
    and never deletes ours. A name an earlier pull brought that the host no longer has goes (the
    copy mirrors the host); where the host now has the same name, its version wins. Files are hard
    linked (copied across file systems), so the earlier copy stays whole until the rename."""
    try:
        pulled = set(json.loads((old / PULLED_LIST).read_text()))
    except (OSError, ValueError, TypeError):
        pulled = set()          # a copy from before the list existed: keep whatever is only here
    for rel in _entries(old):
        target = tree / rel
        if rel == PULLED_LIST or rel in pulled or os.path.lexists(target):
            continue
        folders = [tree.joinpath(*Path(rel).parts[:i]) for i in range(1, len(Path(rel).parts))]
        if any(os.path.islink(f) or (os.path.lexists(f) and not f.is_dir()) for f in folders):
            continue            # the host has a file or link where our folder was: its version wins
        target.parent.mkdir(parents=True, exist_ok=True)
        source = old / rel
        if source.is_symlink():
            os.symlink(os.readlink(source), target)
        else:
            try:
                os.link(source, target)
            except OSError:
                shutil.copy2(source, target)


def _rename_into_place(tree: Path, dest: Path, previous: Path) -> None:
    if os.path.lexists(dest):
        os.rename(dest, previous)
        try:
            os.rename(tree, dest)
        except OSError:
            os.rename(previous, dest)
            raise
    else:
        os.rename(tree, dest)
