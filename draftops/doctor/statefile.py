"""``doctor.json`` read through one typed model: a resumed doctor acts on what the file says (which
steps are left, which servers to stop), so a file that is not what a doctor writes is refused in one
paragraph naming the file and the field, never a KeyError or a RecursionError half way through.

The model is strict (a port is an int, never "8000"; ``runs`` a list, never "abc"), the steps must be
exactly those its own arguments plan (no unknown name, none missing), and the nesting is bounded
before pydantic walks it (a doctor writes a few levels).
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from draftops.doctor import plan
from draftops.documents import first_problem, non_finite
from draftops.errors import DoctorError
from draftops.runs import jobs

MAX_DEPTH = 32                  # a doctor's state nests about six levels (steps → outcome → findings → …)
STEP_NAMES = Literal["capture", "check", "baseline", "as-served", "fix", "recheck", "fixed", "compare", "tune"]
STEP_STATES = Literal["pending", "running", "done", "skipped", "failed", "stopped"]
STATUSES = Literal["running", "healthy", "unhealthy", "fixed", "not-fixed", "failed", "stopped"]
SERVER_STATES = Literal["starting", "ready", "stopped", "unknown", "not-ours"]
Port = Annotated[int, Field(ge=1, le=65535)]
Text = Annotated[str, Field(max_length=100_000)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class ArgsModel(_Strict):
    draft: Annotated[str, Field(min_length=1, max_length=4096)]
    data: str | None = None
    profile: str | None = None
    target: str | None = None
    fix: bool = False
    bench: bool = True
    capture: bool = False
    port: Port | None = None
    keep_serving: bool = False
    fresh: bool = False
    tune: bool = False


class StepModel(_Strict):
    name: STEP_NAMES
    state: STEP_STATES = "pending"
    started: str | None = None
    ended: str | None = None
    runs: list[str] = []
    outcome: dict[str, Any] = {}
    error: Text | None = None
    commands: list[Text] = []
    earlier: list[str] = []


class ServerModel(_Strict):
    """A server this doctor started: its run, port and role, and what the host recorded of it when
    it started (the registry entry's token, the job's name and start time), so a resume stops only it."""

    run_id: str
    port: Port
    role: Literal["baseline", "as-served", "fixed"]
    state: SERVER_STATES = "starting"
    token: str | None = None
    job: str | None = None
    started: str | None = None


class StateModel(_Strict):
    schema_: Literal["draftops.doctor/1"] = Field(alias="schema")
    doctor_id: str
    host: Annotated[str, Field(min_length=1, max_length=256)]
    created: str
    args: ArgsModel
    status: STATUSES
    stopped_at: STEP_NAMES | None = None
    why: Text | None = None
    why_signal: Annotated[int, Field(ge=1, le=64)] | None = None
    steps: list[StepModel]
    servers: list[ServerModel] = []
    left_running: list[Text] = []
    resumed: list[str] = []


def depth(value: Any, limit: int = MAX_DEPTH) -> int:
    """How deep ``value`` nests, counted without recursion and only up to ``limit`` + 1."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, level = todo.pop()
        if not isinstance(item, (dict, list)):
            continue
        deepest = max(deepest, level)
        if deepest > limit:
            return deepest
        todo.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _bad(path: Path, what: str) -> DoctorError:
    return DoctorError(f"{path} is not a doctor's state as a doctor writes it: {what}. The file was edited or "
                       "damaged; nothing was run. Start a new doctor without --resume (the old one's runs stay "
                       "in `invoke runs --local`).")


def parse(doc: Any, path: Path) -> StateModel:
    """``doc`` (parsed JSON) as the state; one paragraph naming ``path`` and the field otherwise."""
    if depth(doc) > MAX_DEPTH:
        raise _bad(path, f"it nests deeper than {MAX_DEPTH} levels")
    where = non_finite(doc)
    if where is not None:
        raise _bad(path, f"field '{where}' is not a finite number")
    try:
        model = StateModel.model_validate(doc)
    except ValidationError as exc:
        raise _bad(path, first_problem(exc)) from None
    problem = _consistency(model, path)
    if problem:
        raise _bad(path, problem)
    return model


def _consistency(model: StateModel, path: Path) -> str | None:
    """What the types cannot say: the steps are those its arguments plan, in order; ids are run ids."""
    planned = plan.steps(plan.Args(**model.args.model_dump()))
    names = [s.name for s in model.steps]
    if names != planned:
        return f"field 'steps' names {names}, while a doctor asked these arguments runs {planned}"
    if model.doctor_id != path.parent.name:
        return f"field 'doctor_id' is {model.doctor_id!r}, not the id of its folder {path.parent.name!r}"
    ids = [r for s in model.steps for r in (*s.runs, *s.earlier)] + [s.run_id for s in model.servers]
    wrong = next((r for r in ids if not jobs.is_run_id(r)), None)
    if wrong is not None:
        return f"{wrong!r} (in 'steps' or 'servers') is not a run id"
    return None
