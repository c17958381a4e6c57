"""``runs/<doctor-id>/doctor.json``: what a doctor was asked, each step's state, its runs and the
servers it started. Written whole (remote/fileio.py) after every change, so an interrupted doctor
leaves the state of its last finished step, and ``--resume`` continues from there."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from draftops import cmdline
from draftops.doctor import plan, statefile
from draftops.documents import StepsOf, other_schema
from draftops.errors import DoctorError
from draftops.history import json_safe, now_iso
from draftops.runs import jobs
from draftops.runs.steps import held as held_lock
from remote.fileio import write_json
from remote.jsonread import loads

SCHEMA = "draftops.doctor/1"
STATE_NAME = "doctor.json"
LOCK_NAME = ".doctor.lock"
DONE_STATES = ("done", "skipped")      # a resumed doctor never redoes these
MAX_STATE_BYTES = 4 << 20


@dataclasses.dataclass
class Step:
    """One step: its state (pending, running, done, skipped, failed, stopped), the history runs it
    made, what it found (``outcome``) and the commands that reproduce it."""

    name: str
    state: str = "pending"
    started: str | None = None
    ended: str | None = None
    runs: list[str] = dataclasses.field(default_factory=list)
    outcome: dict[str, Any] = dataclasses.field(default_factory=dict)
    error: str | None = None
    commands: list[str] = dataclasses.field(default_factory=list)
    earlier: list[str] = dataclasses.field(default_factory=list)    # runs of its attempts that did not finish

    @property
    def finished(self) -> bool:
        return self.state in DONE_STATES


@dataclasses.dataclass
class State(StepsOf[Step]):
    """The whole doctor.json."""

    doctor_id: str
    host: str
    args: plan.Args
    steps: list[Step]
    created: str = dataclasses.field(default_factory=now_iso)
    status: str = "running"        # running, healthy, unhealthy, fixed, not-fixed, failed, stopped
    stopped_at: str | None = None
    why: str | None = None
    why_signal: int | None = None      # the signal that stopped it (the exit code is 128 + it)
    servers: list[dict[str, Any]] = dataclasses.field(default_factory=list)   # run_id, port, role, state
    left_running: list[str] = dataclasses.field(default_factory=list)
    resumed: list[str] = dataclasses.field(default_factory=list)              # when each resume began
    folder: Path = Path(".")


    def to_dict(self) -> dict[str, Any]:
        return json_safe({"schema": SCHEMA, "doctor_id": self.doctor_id, "host": self.host,
                          "created": self.created, "args": self.args.to_dict(), "status": self.status,
                          "stopped_at": self.stopped_at, "why": self.why, "why_signal": self.why_signal,
                          "steps": [dataclasses.asdict(s) for s in self.steps], "servers": self.servers,
                          "left_running": self.left_running, "resumed": self.resumed})

    def save(self) -> None:
        """doctor.json, whole or not at all; a disk that cannot take it is one paragraph."""
        try:
            write_json(self.folder / STATE_NAME, self.to_dict())
        except OSError as exc:
            raise DoctorError(f"cannot write {self.folder / STATE_NAME}: {exc.strerror or exc}. Free disk space "
                              f"there and run `{resume_command(self.doctor_id, self.host)}`: it continues from the "
                              "last step the file recorded.") from None


def new(runs_dir: Path, host: str, args: plan.Args) -> State:
    doctor_id = jobs.new_run_id("doctor")
    state = State(doctor_id, host, args, [Step(name) for name in plan.steps(args)], folder=runs_dir / doctor_id)
    state.save()
    return state


def load(folder: Path) -> State:
    """A doctor's state, read through its one typed model (statefile.py); anything else is refused in
    one paragraph naming the file (and the field)."""
    path = folder / STATE_NAME
    try:
        if path.is_symlink() or not path.is_file():
            raise DoctorError(f"{path} is not a doctor's state file (missing, or not a regular file); "
                              "`invoke doctor --resume` takes the id of a doctor run (runs/*-doctor-*), or start a new "
                              "doctor without --resume.")
        with path.open("rb") as fh:          # bounded whatever the file grows to while it is read
            raw = fh.read(MAX_STATE_BYTES + 1)
        if len(raw) > MAX_STATE_BYTES:
            raise DoctorError(f"{path} is over {MAX_STATE_BYTES} bytes, far more than a doctor writes; it is "
                              "not a doctor's state file. Start a new doctor without --resume.")
        data = loads(raw.decode("utf-8"))
    except (OSError, ValueError) as exc:
        raise DoctorError(f"{path} cannot be read as a doctor's state ({type(exc).__name__}: {exc}); start a new "
                          "doctor without --resume.") from None
    said = other_schema(data, SCHEMA)
    if said is not None:
        raise DoctorError(f"{path} is not a {SCHEMA} document (schema {said!r}); start a new doctor without "
                          "--resume.")
    model = statefile.parse(data, path)
    steps = [Step(**s.model_dump()) for s in model.steps]
    return State(doctor_id=model.doctor_id, host=model.host, args=plan.Args(**model.args.model_dump()),
                 steps=steps, created=model.created, status=model.status, stopped_at=model.stopped_at,
                 why=model.why, why_signal=model.why_signal,
                 servers=[s.model_dump(exclude_none=True) for s in model.servers],
                 left_running=list(model.left_running), resumed=list(model.resumed), folder=folder)


def latest(runs_dir: Path) -> Path:
    """The newest doctor's folder (run ids sort by time)."""
    found = sorted(p for p in runs_dir.glob("*-doctor-*") if (p / STATE_NAME).is_file()) if runs_dir.is_dir() else []
    if not found:
        raise DoctorError(f"no doctor to resume in {runs_dir} (no runs/*-doctor-*/{STATE_NAME}); run `invoke doctor "
                          "--draft CKPT` first.")
    return found[-1]


def resume_command(doctor_id: str, host: str) -> str:
    """The command that resumes a doctor, with its host (pasted elsewhere it must not run on another)."""
    return cmdline.command("doctor", "--resume", doctor_id, host=host)


def find(runs_dir: Path, doctor_id: str | None) -> Path:
    """The folder of the doctor ``doctor_id`` (default: the latest)."""
    if doctor_id is not None and not jobs.is_run_id(doctor_id):
        raise DoctorError(f"--resume {doctor_id!r} is not a run id; give the id of a doctor run (runs/*-doctor-*) "
                          "or --resume alone for the latest.")
    return runs_dir / doctor_id if doctor_id else latest(runs_dir)


def held(folder: Path) -> contextlib.AbstractContextManager[None]:
    """Hold the doctor's lock (``<folder>/.doctor.lock``, flock) for the block: one process runs a doctor
    at a time, so two ``--resume`` of one doctor never both run its steps (runs.steps.held)."""
    path = folder / LOCK_NAME
    return held_lock(
        path,
        missing=lambda: DoctorError(
            f"there is no doctor {folder.name} (no folder {folder}); `invoke doctor --resume` takes "
            "the id of a doctor run (runs/*-doctor-*), or start a new doctor without --resume."),
        unopenable=lambda exc: DoctorError(
            f"cannot open the doctor's lock {path} ({exc.strerror or exc}); the folder must be "
            "writable for a doctor to run in it."),
        busy=lambda fd: DoctorError(
            f"doctor {folder.name} is being run by another `invoke doctor` ({_holder(fd)}; it "
            f"holds {path}); two at once would both run its steps. Nothing was run: wait for "
            f"that one to end, then `{resume_command(folder.name, _host_of(folder))}` if it "
            "did not finish."))


def _holder(fd: int) -> str:
    """Who holds the lock, as the holder wrote it (best effort, bounded)."""
    try:
        info = loads(os.pread(fd, 256, 0) or b"{}")
        return f"pid {int(info['pid'])}, since {str(info['since'])[:19]}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not said who it is yet"


def _host_of(folder: Path) -> str:
    try:
        return load(folder).host
    except DoctorError:
        return "HOST"


#: the flags a resume may name, as the user types them
FLAGS = {"draft": "--draft", "data": "--data", "profile": "--profile", "target": "--target", "fix": "--fix",
         "bench": "--no-bench", "capture": "--capture", "port": "--port", "tune": "--tune"}


def resume(folder: Path, host: str, asked: dict[str, Any]) -> State:
    """The doctor in ``folder``, checked against what this call asks: ``asked`` holds only the flags
    the call named. Those a resume may change (``plan.Args.FREE``: the port, how it ends, whether a
    baseline is reused) are taken; another that differs is refused, naming it."""
    state = load(folder)
    if state.host != host:
        raise DoctorError(f"doctor {state.doctor_id} ran on host {state.host!r}, not {host!r}; resume it with "
                          f"`{resume_command(state.doctor_id, state.host)}`, or start a new doctor without --resume.")
    theirs = state.args.to_dict()
    differs = [k for k, v in asked.items() if k not in plan.Args.FREE and theirs.get(k) != v]
    if differs:
        said = "; ".join(f"{FLAGS.get(k, k)}: {theirs.get(k)!r} then, {asked[k]!r} now" for k in differs)
        raise DoctorError(f"doctor {state.doctor_id} was asked `invoke doctor {state.args.flags()}`, and this call "
                          f"differs ({said}). Resume it as it was asked (`{resume_command(state.doctor_id, host)}` "
                          "alone takes its arguments; --port, --keep-serving and --fresh may change), or start a "
                          "new doctor without --resume.")
    free = {k: v for k, v in asked.items() if k in plan.Args.FREE}
    state.args = dataclasses.replace(state.args, **free)
    return state


def dumps(state: State) -> str:
    return json.dumps(state.to_dict(), indent=2)
