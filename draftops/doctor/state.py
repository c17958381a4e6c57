"""``runs/<doctor-id>/doctor.json``: what a doctor was asked, each step's state, its runs and the
servers it started. Written whole (remote/fileio.py) after every change, so an interrupted doctor
leaves the state of its last finished step, and ``--resume`` continues from there."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from draftops.doctor import plan
from draftops.errors import DoctorError
from draftops.history import json_safe, now_iso
from draftops.runs import jobs
from remote.fileio import write_json
from remote.jsonread import loads

SCHEMA = "draftops.doctor/1"
STATE_NAME = "doctor.json"
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
class State:
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

    def step(self, name: str) -> Step:
        return next(s for s in self.steps if s.name == name)

    def has(self, name: str) -> bool:
        return any(s.name == name for s in self.steps)

    def runs(self) -> list[str]:
        return [run for s in self.steps for run in (*s.earlier, *s.runs)]

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
                              f"there and run `invoke doctor --resume {self.doctor_id}`: it continues from the "
                              "last step the file recorded.") from None


def new(runs_dir: Path, host: str, args: plan.Args) -> State:
    doctor_id = jobs.new_run_id("doctor")
    state = State(doctor_id, host, args, [Step(name) for name in plan.steps(args)], folder=runs_dir / doctor_id)
    state.save()
    return state


def load(folder: Path) -> State:
    """A doctor's state, refused in one paragraph naming the file when it is not one."""
    path = folder / STATE_NAME
    try:
        if path.is_symlink() or not path.is_file():
            raise DoctorError(f"{path} is not a doctor's state file (missing, or not a regular file); "
                              "`invoke doctor --resume` takes the id of a doctor run (runs/*-doctor-*), or start a new "
                              "doctor without --resume.")
        if path.stat().st_size > MAX_STATE_BYTES:
            raise DoctorError(f"{path} is {path.stat().st_size} bytes, far more than a doctor writes; it is "
                              "not a doctor's state file. Start a new doctor without --resume.")
        data = loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            said = data.get("schema") if isinstance(data, dict) else None
            raise DoctorError(f"{path} is not a {SCHEMA} document (schema {said!r}); start a new doctor without "
                              "--resume.")
        known = {f.name for f in dataclasses.fields(Step)}
        steps = [Step(**{k: v for k, v in s.items() if k in known}) for s in data["steps"]]
        return State(doctor_id=str(data["doctor_id"]), host=str(data["host"]), args=plan.Args.from_dict(data["args"]),
                     steps=steps, created=str(data.get("created")), status=str(data.get("status")),
                     stopped_at=data.get("stopped_at"), why=data.get("why"), why_signal=data.get("why_signal"),
                     servers=list(data.get("servers") or []),
                     left_running=list(data.get("left_running") or []), resumed=list(data.get("resumed") or []),
                     folder=folder)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DoctorError(f"{path} cannot be read as a doctor's state ({type(exc).__name__}: {exc}); start a new "
                          "doctor without --resume.") from None


def latest(runs_dir: Path) -> Path:
    """The newest doctor's folder (run ids sort by time)."""
    found = sorted(p for p in runs_dir.glob("*-doctor-*") if (p / STATE_NAME).is_file()) if runs_dir.is_dir() else []
    if not found:
        raise DoctorError(f"no doctor to resume in {runs_dir} (no runs/*-doctor-*/{STATE_NAME}); run `invoke doctor "
                          "--draft CKPT` first.")
    return found[-1]


def resume(runs_dir: Path, doctor_id: str | None, host: str, args: plan.Args | None) -> State:
    """The doctor ``doctor_id`` (default: the latest), checked against what this call asks."""
    if doctor_id is not None and not jobs.is_run_id(doctor_id):
        raise DoctorError(f"--resume {doctor_id!r} is not a run id; give the id of a doctor run (runs/*-doctor-*) "
                          "or --resume alone for the latest.")
    folder = runs_dir / doctor_id if doctor_id else latest(runs_dir)
    state = load(folder)
    if state.host != host:
        raise DoctorError(f"doctor {state.doctor_id} ran on host {state.host!r}, not {host!r}; resume it with "
                          f"--host {state.host}, or start a new doctor without --resume.")
    if args is not None:
        differs = args.differences(state.args)
        if differs:
            theirs, mine = state.args.to_dict(), args.to_dict()
            said = "; ".join(f"{k} {theirs[k]!r} then, {mine[k]!r} now" for k in differs)
            raise DoctorError(f"doctor {state.doctor_id} was asked `invoke doctor {state.args.flags()}`, and this call "
                              f"differs ({said}). Resume it as it was asked (`invoke doctor --resume "
                              f"{state.doctor_id}` alone takes its arguments), or start a new doctor without --resume.")
    return state


def dumps(state: State) -> str:
    return json.dumps(state.to_dict(), indent=2)
