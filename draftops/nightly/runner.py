"""Run a playbook's steps on several hosts at once.

Each step is ``python -m invoke <task> --host <host> <args>`` started in the project folder, the
same command a user would type, with its output in ``<night>/<host>/<NN>-<step>.log``. A failed step
skips the later steps that need it (directly or through another skipped step); clean-up steps
always run. Hosts run in parallel, each ``HostNight.run`` in a thread of one bounded
``concurrent.futures`` pool (as ``cli/core.sync`` overlaps its scan with the connection); an
exception in one host's run becomes that host's outcome, the others finish.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from draftops import cmdline, history
from draftops.errors import HistoryError
from draftops.nightly import queuetime, results
from draftops.nightly.playbook import Playbook, Step

OK, FAILED, SKIPPED = "ok", "failed", "skipped"
INFRA, STEP = "infrastructure", "step"
# Tasks whose failure means the machine or server is not there, not that the draft got worse.
INFRA_TASKS = {"sync", "env.check", "env.setup", "serve", "serve.start", "serve.stop", "serve.status"}
_UNREACHABLE = ("could not be reached", "rejected key", "host key", "Connection refused")
#: at most this many hosts' nights at once (a thread each, starting one invoke process at a time)
MAX_PARALLEL_HOSTS = 32
CLEANUP_AFTER_STOP_S = 120.0     # how long a clean-up step may run once the night was told to stop
END_GRACE_S = 10.0               # TERM, then KILL after this, for a step's process group
POLL_S = 0.25


class Stop:
    """The night was told to stop (SIGTERM, SIGHUP, Ctrl-C): the running step is ended, later steps are
    skipped, the clean-up steps still run (each for at most CLEANUP_AFTER_STOP_S); a second signal
    ends the clean-up too. Set from the signal handler, read by every host's thread."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.why = ""
        self.at = 0.0
        self.hard = False

    def set(self, why: str) -> None:
        if self._event.is_set():
            self.hard = True
            return
        self.why, self.at = why, time.monotonic()
        self._event.set()

    def __bool__(self) -> bool:
        return self._event.is_set()


@dataclass
class StepResult:
    name: str
    task: str
    status: str                    # ok | failed | skipped
    cleanup: bool = False
    failure: str = ""              # infrastructure | step (failed only)
    exit_code: int | None = None
    seconds: float = 0.0
    log: Path | None = None
    reason: str = ""               # why it failed or was skipped (one line)
    queue: queuetime.QueueTime | None = None   # on a Slurm host: its jobs' queue wait apart from run time
    findings: list[results.Finding] = field(default_factory=list)   # what the step's runs concluded

    @property
    def flagged(self) -> bool:
        """The step ran to its end, but what it found is wrong (a MISMATCH, a ✗ finding)."""
        return any(f.bad for f in self.findings)


@dataclass
class HostOutcome:
    host: str
    steps: list[StepResult] = field(default_factory=list)
    metrics: dict[str, object] = field(default_factory=dict)
    facts: dict[str, str] = field(default_factory=dict)
    run_ids: list[str] = field(default_factory=list)
    findings: list[results.Finding] = field(default_factory=list)     # what the steps concluded
    started: str = ""
    error: str = ""                # the host's run itself crashed (a bug or a full disk)

    @property
    def failed(self) -> bool:
        return bool(self.error) or any(s.status == FAILED for s in self.steps)

    @property
    def flagged(self) -> bool:
        """A step concluded something is wrong (a ✗ finding), though every step ran."""
        return any(f.bad for f in self.findings)

    @property
    def infra_failed(self) -> bool:
        return any(s.status == FAILED and s.failure == INFRA for s in self.steps)


def queue_words(step: StepResult) -> str:
    """`` (queued 12 s in Slurm, ran 40 s)`` for a step whose jobs were Slurm jobs, else ""."""
    if step.queue is None:
        return ""
    return f" (queued {step.queue.queued_s:.0f} s in Slurm, ran {step.queue.ran_s:.0f} s)"


def end_words(result: StepResult) -> str:
    """How a step ended, as its line and the health summary say it: a step that exited 0 but found
    something wrong is not just "ok" (``ok, but ✗ MISMATCH, ids-wrong``)."""
    bad = list(dict.fromkeys(f.code for f in result.findings if f.bad))
    return result.status + (f", but ✗ {', '.join(bad)}" if bad else "")


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    return (errors or lines or ["(no output)"])[-1][:400]


class HostNight:
    """One host's night; ``run`` runs in this host's thread of ``run_hosts``' pool."""

    def __init__(self, host: str, book: Playbook, project_root: Path, folder: Path, root: str = "",
                 stop: Stop | None = None, say: Callable[[str], None] | None = None):
        self.host = host
        self.root = root                 # the host's `root:` in hosts.yaml, for `{root}` in step args
        self.book = book
        self.project_root = project_root
        self.folder = folder / host
        self.stop = stop if stop is not None else Stop()
        self.say = say or (lambda line: None)

    def __repr__(self) -> str:
        return f"HostNight({self.host!r})"

    def run(self) -> HostOutcome:
        self.folder.mkdir(parents=True, exist_ok=True)
        outcome = HostOutcome(self.host, started=history.now_iso())
        done: dict[str, str] = {}
        env_json: Path | None = None
        seen: set[str] = set()
        for index, step in enumerate(self.book.steps, start=1):
            reason = self._skip_reason(step, done)
            if reason:
                outcome.steps.append(StepResult(step.name, step.task, SKIPPED, step.cleanup, reason=reason))
                done[step.name] = SKIPPED
                self._tell(step, f"skipped: {reason}")
                continue
            result, text = self._step(index, step)
            result.findings = self._step_findings(outcome, seen, text)
            outcome.steps.append(result)
            done[step.name] = result.status
            self._tell(step, end_words(result) + (f" (exit {result.exit_code})" if result.status == FAILED else "")
                       + f" in {result.seconds:.1f} s" + queue_words(result)
                       + (f": {result.reason}" if result.reason else ""))
            env_json = results.env_json_in(text, self.project_root) or env_json
        try:
            runs = results.night_runs(history.for_project(self.project_root), self.host, outcome.started)
        except HistoryError as exc:           # the steps' results stay; only the metrics are missing
            outcome.error = f"the night's runs could not be read from the history: {exc}"
            runs = []
        outcome.run_ids = [r.run_id for r in runs]
        outcome.metrics = results.metrics_of(runs, self.project_root)
        outcome.findings = [f for s in outcome.steps for f in s.findings]
        outcome.findings += results.findings_of([r for r in runs if r.run_id not in seen], self.project_root)
        outcome.facts = results.describe(runs, env_json)
        return outcome

    def _step_findings(self, outcome: HostOutcome, seen: set[str], log_text: str) -> list[results.Finding]:
        """The findings of the runs the step just recorded (those of the night not seen before) and of
        the capture-checks its log names; ``seen`` grows by those runs."""
        try:
            new = results.night_runs(history.for_project(self.project_root), self.host, outcome.started, seen)
        except HistoryError:                  # said once, when the night's runs are read at its end
            new = []
        seen.update(r.run_id for r in new)
        return results.findings_of(new, self.project_root, log_text)

    def _skip_reason(self, step: Step, done: dict[str, str]) -> str:
        if step.cleanup:
            return "the night was stopped again during its clean-up" if self.stop.hard else ""
        if self.stop:
            return f"the night was stopped ({self.stop.why}) before this step"
        blocked = [n for n in step.needs if done.get(n) != OK]
        return f"needs {', '.join(blocked)}, which did not succeed" if blocked else ""

    def _tell(self, step: Step, what: str) -> None:
        """One line per step start and end, so a night is never silent for minutes (cron, a pipe)."""
        self.say(f"{datetime.now():%H:%M:%S} {self.host} / {step.name} ({step.task}): {what}")

    def _step(self, index: int, step: Step) -> tuple[StepResult, str]:
        log = self.folder / f"{index:02d}-{step.name}.log"
        words = step.argv(self.host, self.root)
        argv = [sys.executable, "-m", "invoke", *words]
        env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1", "TERM": "dumb"}
        env.pop("DRAFTOPS_HOST", None)
        self._tell(step, "started")
        began, wall = time.monotonic(), time.time()
        with log.open("w", encoding="utf-8") as out:
            out.write(f"$ {cmdline.quote(argv)}\n")      # what ran, from the project folder
            out.flush()
            # its own session: the step's whole process tree can be ended, and a Ctrl-C on the
            # terminal reaches the night (which ends the step) rather than the step behind its back
            proc = subprocess.Popen(argv, cwd=self.project_root, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            code, ending = self._wait(proc, step, began)
        seconds = time.monotonic() - began
        text = log.read_text(encoding="utf-8", errors="replace").split("\n", 1)[-1] + ending
        with log.open("a", encoding="utf-8") as out:
            out.write(f"{ending}\n[exit {code}]\n")
        result = StepResult(step.name, step.task, OK if code == 0 else FAILED, step.cleanup, exit_code=code,
                            seconds=seconds, log=log, queue=queuetime.of_step(self.project_root / "runs", wall))
        if result.status == FAILED:
            infra = step.task in INFRA_TASKS or any(s in text for s in _UNREACHABLE)
            result.failure = INFRA if infra else STEP
            result.reason = _last_line(text)
        return result, text

    def _wait(self, proc: subprocess.Popen[bytes], step: Step, began: float) -> tuple[int | None, str]:
        """The step's exit code, or None and why it was ended: its timeout, or the night's stop (a
        clean-up step then gets CLEANUP_AFTER_STOP_S more; a second stop ends it too)."""
        while True:
            try:
                return proc.wait(POLL_S), ""
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if self.stop and (not step.cleanup or self.stop.hard):
                why = f"\nerror: ended: the night was stopped ({self.stop.why})\n"
            elif self.stop and now > self.stop.at + CLEANUP_AFTER_STOP_S:
                why = (f"\nerror: ended: the night was stopped ({self.stop.why}) and this clean-up step ran "
                       f"{CLEANUP_AFTER_STOP_S:g} s past it\n")
            elif now > began + step.timeout:
                why = f"\nerror: timed out after {step.timeout:g} s\n"
            else:
                continue
            end_group(proc)
            return None, why


def end_group(proc: subprocess.Popen[bytes]) -> None:
    """TERM the step's process group, then KILL it after END_GRACE_S; wait for the step itself."""
    for sig, grace in ((signal.SIGTERM, END_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(grace)
            if sig == signal.SIGTERM:
                os.killpg(proc.pid, signal.SIGKILL)      # what the step left behind in its group
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def run_hosts(book: Playbook, hosts: dict[str, str], project_root: Path, folder: Path, stop: Stop | None = None,
              say: Callable[[str], None] | None = None) -> list[HostOutcome]:
    """Every host's night (``hosts``: name -> root), in parallel (up to ``MAX_PARALLEL_HOSTS`` at once),
    in the order given; a host whose run raised gets an outcome holding the error. Each step of a
    night has its timeout, so the pool's wait is bounded."""
    nights = [HostNight(h, book, project_root, folder, root, stop, say) for h, root in hosts.items()]
    if not nights:
        return []
    with ThreadPoolExecutor(max_workers=min(len(nights), MAX_PARALLEL_HOSTS), thread_name_prefix="night") as pool:
        running = [pool.submit(night.run) for night in nights]
    return [_outcome(night, future) for night, future in zip(nights, running, strict=True)]


def _outcome(night: HostNight, future: Future[HostOutcome]) -> HostOutcome:
    """The night's outcome, or one that holds the exception its run raised."""
    error = future.exception()
    if error is None:
        return future.result()
    return HostOutcome(night.host, error=f"the host's run raised {type(error).__name__}: {error}")
