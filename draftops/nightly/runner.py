"""Run a playbook's steps on several hosts at once.

Each step is ``python -m invoke <task> --host <host> <args>`` started in the project folder, the
same command a user would type, with its output in ``<night>/<host>/<NN>-<step>.log``. A failed step
skips the later steps that need it (directly or through another skipped step); clean-up steps
always run. Hosts run in parallel through Fabric's ``ThreadingGroup``: each member is a
``HostNight`` and ``group.run()`` calls ``HostNight.run`` on every one in its own thread; an exception
in one host's run comes back as that host's value in the ``GroupException``, the others finish.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from fabric import ThreadingGroup
from fabric.exceptions import GroupException

from draftops import history
from draftops.errors import HistoryError
from draftops.nightly import results
from draftops.nightly.playbook import Playbook, Step

OK, FAILED, SKIPPED = "ok", "failed", "skipped"
INFRA, STEP = "infrastructure", "step"
# Tasks whose failure means the machine or server is not there, not that the draft got worse.
INFRA_TASKS = {"sync", "env.check", "env.setup", "serve", "serve.start", "serve.stop", "serve.status"}
_UNREACHABLE = ("could not be reached", "rejected key", "host key", "Connection refused")


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


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    return (errors or lines or ["(no output)"])[-1][:400]


class HostNight:
    """One host's night; ``run`` is what the ThreadingGroup calls in this host's thread."""

    def __init__(self, host: str, book: Playbook, project_root: Path, folder: Path, root: str = ""):
        self.host = host
        self.root = root                 # the host's `root:` in hosts.yaml, for `{root}` in step args
        self.book = book
        self.project_root = project_root
        self.folder = folder / host

    def __repr__(self) -> str:
        return f"HostNight({self.host!r})"

    def run(self) -> HostOutcome:
        self.folder.mkdir(parents=True, exist_ok=True)
        outcome = HostOutcome(self.host, started=history.now_iso())
        done: dict[str, str] = {}
        env_json: Path | None = None
        for index, step in enumerate(self.book.steps, start=1):
            blocked = [n for n in step.needs if done.get(n) != OK]
            if blocked and not step.cleanup:
                outcome.steps.append(StepResult(step.name, step.task, SKIPPED, reason=f"needs {', '.join(blocked)}, "
                                                "which did not succeed"))
                done[step.name] = SKIPPED
                continue
            result, text = self._step(index, step)
            outcome.steps.append(result)
            done[step.name] = result.status
            env_json = results.env_json_in(text, self.project_root) or env_json
        try:
            runs = results.night_runs(history.for_project(self.project_root), self.host, outcome.started)
        except HistoryError as exc:           # the steps' results stay; only the metrics are missing
            outcome.error = f"the night's runs could not be read from the history: {exc}"
            runs = []
        outcome.run_ids = [r.run_id for r in runs]
        outcome.metrics = results.metrics_of(runs, self.project_root)
        outcome.findings = results.findings_of(runs, self.project_root)
        outcome.facts = results.describe(runs, env_json)
        return outcome

    def _step(self, index: int, step: Step) -> tuple[StepResult, str]:
        log = self.folder / f"{index:02d}-{step.name}.log"
        words = step.argv(self.host, self.root)
        argv = [sys.executable, "-m", "invoke", *words]
        env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1", "TERM": "dumb"}
        env.pop("DRAFTOPS_HOST", None)
        began = time.monotonic()
        try:
            done = subprocess.run(argv, cwd=self.project_root, env=env, stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, errors="replace", timeout=step.timeout)
            code: int | None = done.returncode
            text = done.stdout + done.stderr
        except subprocess.TimeoutExpired as exc:
            code = None
            text = _text(exc.stdout) + _text(exc.stderr) + f"\nerror: timed out after {step.timeout:g} s\n"
        seconds = time.monotonic() - began
        log.write_text(f"$ invoke {shlex.join(words)}\n{text}\n[exit {code}]\n", encoding="utf-8")
        result = StepResult(step.name, step.task, OK if code == 0 else FAILED, step.cleanup, exit_code=code,
                            seconds=seconds, log=log)
        if result.status == FAILED:
            infra = step.task in INFRA_TASKS or any(s in text for s in _UNREACHABLE)
            result.failure = INFRA if infra else STEP
            result.reason = _last_line(text)
        return result, text


def _text(raw: str | bytes | None) -> str:
    if raw is None:
        return ""
    return raw.decode(errors="replace") if isinstance(raw, bytes) else raw


def run_hosts(book: Playbook, hosts: dict[str, str], project_root: Path, folder: Path) -> list[HostOutcome]:
    """Every host's night (``hosts``: name -> root), in parallel; a host whose run raised gets an
    outcome holding the error."""
    nights = [HostNight(h, book, project_root, folder, root) for h, root in hosts.items()]
    group = ThreadingGroup.from_connections(nights)
    try:
        found = dict(group.run())
    except GroupException as exc:
        found = dict(exc.result)
    outcomes = []
    for night in nights:
        value = found.get(night)
        if isinstance(value, HostOutcome):
            outcomes.append(value)
        else:
            outcomes.append(HostOutcome(night.host, error=f"the host's run raised {type(value).__name__}: {value}"))
    return outcomes
