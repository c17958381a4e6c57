"""One way to run a remote tool: start it, follow it, pull its run folder home, read its result.

Every tool the tasks start on the host goes through here, so each one is started, followed,
pulled and read the same way:

- :func:`run_tool` runs ``python -m MODULE ARGS`` (``remote.drafter``, ``remote.sglang_patch``,
  ``remote.draft_config``, ``remote.envcheck``, ``remote.bench.runner``) as a detached job;
  :func:`run_job` does the same for a shell script (env.setup, an engine install).
- The result file: a tool announces its one result file with a ``result`` event
  (``remote.events.result``) and writes it into its run folder; :class:`ToolResult` holds it, read
  once from the pulled folder (report.json, patch.json, draft_config.json, env.json, runner.json).
- Exit codes: ``remote/exitcodes.py``, one table for every tool (ok, check failed, usage, refused,
  internal error); :meth:`ToolResult.check` turns a failure into one paragraph by it, led by the
  tool's own ``error`` event.
- :func:`call_tool` runs a quick tool that answers one JSON line (``remote.serve``,
  ``remote.bench.probe``) over one exec, with the same table and the same ``error`` event.

What is shown while a job runs is up to a :class:`JobView` the caller passes (the console's live
tail at the task layer, nothing in library code); this module never prints.
"""
from __future__ import annotations

import json
import shlex
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from draftops.errors import DraftopsError, JobError, ToolFailed, host_prefix
from draftops.link.host import Host
from draftops.runs import jobs, mlstack
from draftops.terminal import clean
from remote import events, exitcodes, jsonread

if TYPE_CHECKING:
    from draftops.documents import Document
    from draftops.slurmspec import SlurmOptions

D = TypeVar("D", bound="Document")

LOG_TAIL_LINES = 15


class JobView:
    """What following a job tells whoever shows it. This base shows nothing (library callers,
    tests); the task layer passes ``draftops.console.LiveJob``."""

    def started(self, host: str, run_id: str) -> None:
        """The job was started; it is followed next."""

    @contextmanager
    def following(self) -> Iterator[None]:
        """Held while the log streams (a live display opens and closes around it)."""
        yield

    def text(self, line: str) -> None:
        """A log line (terminal-safe)."""

    def event(self, event: dict[str, Any]) -> None:
        """An event line of the tool (progress, result, error, ...)."""

    def detached(self, host: str, run_id: str) -> None:
        """Ctrl-C while following: the job keeps running on the host. A view may leave the process
        here; if it returns, the KeyboardInterrupt goes on to the caller."""

    def leave_on_interrupt(self, host: str, run_id: str) -> Callable[[], None] | None:
        """A way to leave the process at once on Ctrl-C, run from the SIGINT handler itself; None
        (this base) lets Ctrl-C raise KeyboardInterrupt as usual, and then :meth:`detached` runs.

        Why a handler: a KeyboardInterrupt raised between a lock's acquire and the ``try`` that would
        release it (rich's live display, paramiko's reader) leaves the lock held, and unwinding then
        waits on it forever; under load that happened often enough to fail CI."""
        return None

    def ended(self, run_id: str, final: dict[str, Any]) -> None:
        """The job ended with ``final`` (its status: state, exit_code, outcome)."""

    def skipped(self, notes: list[dict[str, str]]) -> None:
        """Entries of the run folder the pull left out (links leading out, FIFOs, ...)."""


def follow(host: Host, run_id: str, view: JobView, *, offset: int = 0, lines: int | None = None,
           tap: Callable[[dict[str, Any]], None] | None = None, bounded: bool = True) -> dict[str, Any]:
    """Stream a job's log into ``view`` until it ends; returns its final status. ``bounded=False``
    (`invoke logs --follow`) waits for a Slurm job however long it is queued.

    ``tap`` sees every event before the view does. Ctrl-C calls ``view.detached`` (the job runs on)."""
    def on_event(event: dict[str, Any]) -> None:
        if tap is not None:
            tap(event)
        view.event(event)

    previous = _leave_on_sigint(view.leave_on_interrupt(host.name, run_id))
    try:
        with view.following():
            final = jobs.follow(host, run_id, view.text, on_event, offset, lines, bounded=bounded)
    except KeyboardInterrupt:
        view.detached(host.name, run_id)
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    view.ended(run_id, final)
    return final


def _leave_on_sigint(leave: Callable[[], None] | None) -> Any:
    """Install ``leave`` as the SIGINT handler (main thread only); returns the handler to restore.
    A SIGINT the caller ignores (``nohup``, a background job of a script) stays ignored."""
    if leave is None or threading.current_thread() is not threading.main_thread():
        return None
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        return None
    return signal.signal(signal.SIGINT, lambda _signum, _frame: leave())


@dataclass
class ToolResult:
    """A finished run of a remote tool: its final status, the pulled folder and what it said."""

    host: str
    run_id: str
    final: dict[str, Any]
    folder: Path | None = None
    result_file: Path | None = None
    data: Any = None                       # the result file's JSON, read once (None: no file)
    error: dict[str, Any] | None = None    # the tool's last `error` event
    skipped: list[dict[str, str]] = field(default_factory=list)   # what the pull left out
    notes: list[str] = field(default_factory=list)                 # why the result was not read

    @property
    def state(self) -> str | None:
        return self.final.get("state")

    @property
    def exit_code(self) -> int | None:
        code = self.final.get("exit_code")
        return code if isinstance(code, int) else None

    @property
    def ok(self) -> bool:
        return self.state == "succeeded"

    def document(self, model: type[D]) -> D | None:
        """The result file as its typed model (``draftops.documents``), None when the run left none;
        a file that fails the model is a ``DocumentError`` naming it and the field, unless the run
        failed: then its own reason (:meth:`check`) comes first, the broken file being its consequence."""
        if self.data is None:
            return None
        from draftops.documents import parse  # pydantic: imported once there is a document to read
        from draftops.errors import DocumentError

        try:
            return parse(model, self.data, self.result_file or f"the result of run {self.run_id}")
        except DocumentError:
            self.check()
            raise

    @property
    def meaning(self) -> str:
        """The exit code's name in remote/exitcodes.py's table."""
        return exitcodes.meaning(self.exit_code)

    @property
    def error_message(self) -> str | None:
        """The tool's own one-paragraph reason: its ``error`` event, else the one the host kept."""
        message = (self.error or {}).get("message") or (self.final.get("outcome") or {}).get("error")
        text = clean(str(message or "")).strip()
        return text or None

    def queued_note(self) -> str | None:
        """Why a Slurm job left queued past its bound has not started (Slurm's reason, cleaned); None for
        a run that started."""
        if self.state not in ("starting", "running"):
            return None
        return clean(str(self.final.get("note") or "it is still queued")).rstrip(".")

    def failure(self) -> str:
        """One paragraph on why the run failed: the tool's reason (its ``error`` event), where its log
        is, and the end of that log without the lines that repeat the reason (shown once)."""
        if (note := self.queued_note()) is not None:
            return (f"run {self.run_id} did not start: {note}. The job stays queued and runs when Slurm starts "
                    f"it: `invoke kill {self.run_id}` cancels it; `invoke "
                    f"logs {self.run_id} --follow` waits for it, and `invoke pull {self.run_id}` brings it home "
                    "once it ran.")
        head = f"run {self.run_id} {clean(str(self.state))}"
        if self.exit_code is not None:               # None: a Slurm job cancelled while queued never ran
            head += f" (exit {self.exit_code})"
        slurm = self.final.get("slurm") or {}
        if slurm.get("job_id") and slurm.get("state") not in ("COMPLETED", "FAILED", None):
            head += clean(f" (Slurm job {slurm['job_id']} {slurm['state']}: {slurm.get('words', '')})")
        if self.exit_code == exitcodes.USAGE:
            head += " (the tool refused its command line: a draftops bug, please report it)"
        reason = self.error_message
        text = f"{head}: {reason}" if reason else f"{head}."
        if (self.error or {}).get("kind") == mlstack.STACK_MISSING:
            return text                         # one paragraph: the log says it again, less well
        log = self.folder / "log" if self.folder else None
        if log is None or not log.is_file():
            return text
        text += f" Its log is in {log}."
        tail = [line for line in log_tail(log) if not (reason and reason in line)]
        return text + "".join("\n" + line for line in tail)

    def check(self) -> ToolResult:
        """``self`` when the run succeeded; else :class:`ToolFailed` with :meth:`failure`."""
        if not self.ok:
            raise ToolFailed(self.failure(), self)
        return self


def log_tail(path: Path, lines: int = LOG_TAIL_LINES, max_bytes: int = 1 << 16) -> list[str]:
    """The last text lines of a pulled log (event lines left out, terminal-safe); reads only its end."""
    with open(path, "rb") as fh:
        size = fh.seek(0, 2)
        fh.seek(max(0, size - max_bytes))
        data = fh.read()
    if size > max_bytes:
        data = data.split(b"\n", 1)[-1]            # the first line is cut
    text = [clean(line) for line in data.decode("utf-8", "replace").splitlines()
            if not line.startswith(events.EVENT_PREFIX)]
    return text[-lines:]


def run_tool(host: Host, module: str, args: list[str], *, name: str | None = None,
             view: JobView | None = None, env: Mapping[str, str] | None = None, task: str | None = None,
             given: Mapping[str, Any] | None = None, pull: bool = True) -> ToolResult:
    """Run ``python -m module args`` on ``host`` (its ml-env python, the synced code) as a detached
    job and return its :class:`ToolResult`; ``jobs.RUN_DIR`` in ``args`` is the job's run folder.

    ``name`` names the run id (default: the module's last part); ``task``/``given`` say what the run
    is for `invoke runs`; ``env`` reaches the job only; ``pull=False`` leaves the folder on the host.
    A tool that needs torch on a ``local`` host whose install has none is refused first (``mlstack``)."""
    command = jobs.python_module_command(host, module, args)    # refused first where the ML stack is missing
    return run_job(host, name or module.rsplit(".", 1)[-1].replace("_", "-"), command, view=view, env=env,
                   task=task, given=given, pull=pull)


def run_job(host: Host, name: str, command: str, *, view: JobView | None = None,
            env: Mapping[str, str] | None = None, task: str | None = None, given: Mapping[str, Any] | None = None,
            cwd: str | None = None, pull: bool = True, slurm: SlurmOptions | None = None) -> ToolResult:
    """Start the shell command line ``command`` as a detached job, follow it into ``view``, pull its
    run folder and read the result file its ``result`` event names (see :func:`run_tool`). ``slurm``:
    settings of this job over the host's (a torchrun's nodes)."""
    job = jobs.start(host, name, command, env=env, cwd=cwd, task=task, args=given, slurm=slurm)
    return finish_job(host, job.id, view=view, pull=pull)


def finish_job(host: Host, run_id: str, *, view: JobView | None = None, pull: bool = True) -> ToolResult:
    """Follow a started job into ``view`` to its end, pull its run folder and read the result file its
    ``result`` event names (the second half of :func:`run_job`)."""
    view = view or JobView()
    view.started(host.name, run_id)
    seen: dict[str, dict[str, Any]] = {}

    def tap(event: dict[str, Any]) -> None:
        if event.get("event") in ("result", "error"):
            seen[str(event["event"])] = event

    final = follow(host, run_id, view, tap=tap)
    result = ToolResult(host.name, run_id, final, error=seen.get("error"))
    if pull:
        pulled = jobs.pull_run(host, run_id)
        view.skipped(pulled.skipped)
        result.folder, result.skipped = pulled.path, pulled.skipped
        announced = (seen.get("result") or {}).get("path") or (final.get("outcome") or {}).get("path")
        _read_result(result, announced)
    mlstack.complete(host, result.error)        # the error event's paragraph: it names the host's python
    return result


def _read_result(result: ToolResult, announced: Any) -> None:
    """Read the result file the tool announced, from the pulled folder (only a file in it: a path
    that leads elsewhere is not read)."""
    if not isinstance(announced, str) or not announced or result.folder is None:
        return
    path = result.folder / Path(announced).name
    if not path.is_file() or path.is_symlink():
        result.notes.append(f"the result file {Path(announced).name} it announced is not in {result.folder}")
        return
    result.result_file = path
    if path.suffix != ".json":
        return
    try:
        result.data = jsonread.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        result.notes.append(f"{path} is not readable JSON: {exc}")


@dataclass
class Answer:
    """What a quick tool said: its exit code, stdout's last line as JSON, stderr, its error event."""

    exit_code: int | None
    data: Any
    stderr: str
    error: dict[str, Any] | None

    @property
    def meaning(self) -> str:
        return exitcodes.meaning(self.exit_code)


#: quick tools that import nothing outside the standard library (tests/test_tools.py runs each with
#: ``python -S``): run with the agent's python they skip ``site``, which on a virtualenv with an
#: editable install costs every exec ~10 ms (its .pth finder imports pathlib)
STDLIB_TOOLS = frozenset({"remote.serve", "remote.drafter.demo_spec"})


def module_command(host: Host, module: str, args: list[str], *, python: str | None = None,
                   env: Mapping[str, str] | None = None) -> str:
    """``cd <code> && env K=V PYTHONPATH=.[:extra] PYTHON [-S] -m module args``: a quick tool's line.

    An ``env`` PYTHONPATH (a serve profile's) goes after the synced code folder. ``-S`` only for a
    stdlib tool run by the agent's python: an engine's python keeps its site-packages."""
    assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in _tool_env(env).items())
    line = jobs.python_m(python or host.agent_python, module, args, no_site=python is None and module in STDLIB_TOOLS)
    return f"cd {jobs.shell_path(host.code_dir)} && env {assigns} {line}"


def _tool_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """A quick tool's environment: ``env`` with the synced code folder first on PYTHONPATH."""
    variables = dict(env or {})
    extra = variables.pop("PYTHONPATH", "")
    return {**variables, "PYTHONPATH": "." + (":" + extra if extra else "")}


def _standby_tool(host: Host, module: str, args: list[str], python: str | None,
                  env: Mapping[str, str] | None) -> dict[str, Any] | None:
    """The same call for a kept connection's standby agent (the agent's python, already started on the
    host: docs/protocol.md § Kept connections), when the tool is one of the stdlib tools that the
    agent's python runs; None otherwise (then it is one exec)."""
    if python is not None or module not in STDLIB_TOOLS:
        return None
    return {"module": module, "argv": list(args), "cwd": host.code_dir, "env": _tool_env(env)}


def call_tool(host: Host, module: str, args: list[str], *, python: str | None = None,
              env: Mapping[str, str] | None = None, input: bytes | None = None, timeout: float | None = None,
              error: type[DraftopsError] = JobError, missing: str = "") -> Any:
    """Run a quick tool over one exec and return the JSON of its last stdout line.

    A failure raises ``error`` with one paragraph: the tool's ``error`` event (else its stderr's end),
    its exit code by the table, and ``missing`` when the interpreter itself is not there."""
    answer = ask_tool(host, module, args, python=python, env=env, input=input, timeout=timeout)
    if answer.exit_code == exitcodes.OK and answer.data is not None:
        return answer.data
    no_python = answer.exit_code == exitcodes.NO_PYTHON or (answer.error is None and "No such file" in answer.stderr)
    hint = (f" The python {python or host.agent_python} does not exist on host {host.name!r}. {missing}"
            if no_python and missing else "")
    said = str((answer.error or {}).get("message") or answer.stderr[-1500:]).strip()
    what = " ".join([module, *args[:1]])
    raise error(f"{host_prefix(host.name)}: `{what}` failed (exit {answer.exit_code}, {answer.meaning}).{hint} "
                f"{clean(said)}".strip())


def ask_tool(host: Host, module: str, args: list[str], *, python: str | None = None,
             env: Mapping[str, str] | None = None, input: bytes | None = None,
             timeout: float | None = None) -> Answer:
    """Run a quick tool and return what it said, whatever its exit code (see :func:`call_tool`)."""
    standby = _standby_tool(host, module, args, python, env)
    command = module_command(host, module, args, python=python, env=env)
    mlstack.require(host, module, python)       # before the host is asked anything
    done = host.agent.quick(command, standby, input, timeout)
    lines = done.text.strip().splitlines()
    error = None
    data: Any = None
    for line in lines:
        event = events.parse(line)
        if event is not None and event.get("event") == "error":
            error = event
    if lines and events.parse(lines[-1]) is None:
        try:
            data = json.loads(lines[-1])
        except ValueError:
            data = None
    return Answer(done.exit_code, data, done.stderr.decode("utf-8", "replace").strip(), error)
