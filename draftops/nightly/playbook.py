"""Playbooks (``playbooks/*.yaml``): which hosts a nightly run drives, which draftops tasks it runs
there in which order, and how far each metric may move before it counts as a regression.

A step names a task exactly as a user types it (``test-drafter``, ``serve.stop``) and its
arguments as a mapping (``ckpt: /models/draft`` becomes ``--ckpt /models/draft``); the runner calls
``invoke <task> --host <host> ...`` the way a user would, so a playbook can only do what a user can.
Validated with pydantic; every error names the file, the line and the field, and says what to write.
"""
from __future__ import annotations

import difflib
import fnmatch
import math
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, ValidationError, field_validator, model_validator

from draftops import yamlfile
from draftops.errors import PlaybookError
from draftops.inventory import check_host_name

DEFAULT_THRESHOLD_PCT = 5.0
# Metrics where a rise is bad (asv/SGLang practice: latency, TTFT, TPOT, ITL); everything else
# (tok/s, speedup, accept length, accuracy) is better when higher.
LOWER_IS_BETTER = ("*_ms", "*latency*", "*ttft*", "*tpot*", "*itl*")
_STEP_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,47}")
_TASK = re.compile(r"[a-z][a-z0-9-]*(\.[a-z][a-z0-9-]*)?")
_ARG = re.compile(r"[a-z][a-z0-9_-]{0,47}")
Scalar = str | int | float | bool
TaskOptions = Mapping[str, Mapping[str, str]]      # task name -> {long option (dashes): kind (bool, int, ...)}
# Numbers are strict (pydantic's lax mode reads `true` as 1 and "5" as 5): a threshold, window or
# timeout written as a boolean or text is a mistake to name, not a value to guess.


class _Located(ValueError):
    """A whole-playbook check that knows where in the file it points (kept by pydantic in ctx)."""

    def __init__(self, message: str, loc: tuple[str | int, ...]):
        super().__init__(message)
        self.loc = loc


class Step(BaseModel):
    """One task call. ``needs``: earlier steps that must have succeeded; ``cleanup``: always runs."""

    model_config = ConfigDict(extra="forbid")

    name: str
    task: str
    args: dict[str, Scalar] = Field(default_factory=dict)
    needs: list[str] = Field(default_factory=list)
    cleanup: bool = False
    timeout: float = Field(default=7200.0, gt=0, le=86400, strict=True)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _STEP_NAME.fullmatch(value):
            raise ValueError(f"step name {value!r} must be 1-48 lower-case letters, digits, '_' or '-' "
                             "(it names the step's log file)")
        return value

    @field_validator("task")
    @classmethod
    def _task(cls, value: str) -> str:
        if not _TASK.fullmatch(value):
            raise ValueError(f"task {value!r} is not a draftops task name; write it as on the command line, "
                             "e.g. `test-drafter` or `serve.stop`")
        if value == "nightly" or value.startswith("nightly."):
            raise ValueError("a playbook cannot run the nightly tasks themselves (that would recurse)")
        return value

    @field_validator("args")
    @classmethod
    def _args(cls, value: dict[str, Scalar]) -> dict[str, Scalar]:
        for key, arg in value.items():
            if not _ARG.fullmatch(key):
                raise ValueError(f"argument name {key!r} must look like a task flag without its dashes "
                                 "(e.g. `ckpt`, `output_len`)")
            if key == "host":
                raise ValueError("`host` is set by the runner for each host in `hosts:`; remove it from args")
            if isinstance(arg, float) and not math.isfinite(arg):
                raise ValueError(f"argument {key!r} is {arg}; give a finite number")
            if isinstance(arg, str) and ("\0" in arg or "\n" in arg):
                raise ValueError(f"argument {key!r} holds a newline or NUL byte; give one line of text")
        return value

    def argv(self, host: str, root: str = "") -> list[str]:
        """The command-line words after ``invoke``: task, ``--host``, then each argument as a flag.
        ``true`` is a bare flag; ``false`` leaves the flag out (the task's default). In text values,
        ``{host}`` becomes the host's name and ``{root}`` its ``root:`` from hosts.yaml (nothing else
        is expanded; the words go to the task as an argv list, never through a shell)."""
        words = [self.task, "--host", host]
        for key, arg in self.args.items():
            flag = "--" + flag_name(key)
            if arg is True:
                words.append(flag)
            elif isinstance(arg, str):        # `--flag=value`: a value that starts with `-` stays the value
                words.append(f"{flag}={arg.replace('{host}', host).replace('{root}', root)}")
            elif arg is not False:
                words.append(f"{flag}={arg}")
        return words


def flag_name(key: str) -> str:
    """A playbook argument's task option, as Invoke names it (``output_len`` -> ``output-len``)."""
    return key.replace("_", "-")


def arg_problem(task: str, key: str, arg: Scalar, options: Mapping[str, str]) -> str | None:
    """Why ``key: arg`` is not an option value ``task`` takes (None when it is). Checked when the
    playbook loads: a bool flag given text would run that text as another task at night."""
    flag = flag_name(key)
    if flag not in options:
        valid = sorted(o for o in options if o != "host")
        close = difflib.get_close_matches(flag, valid, n=1)
        hint = f" (did you mean `{close[0].replace('-', '_')}`?)" if close else ""
        return (f"`{task}` has no option `--{flag}`{hint}; its options: "
                f"{', '.join(v.replace('-', '_') for v in valid) or 'none'}")
    kind = options[flag]
    if kind == "bool" and not isinstance(arg, bool):
        return f"`--{flag}` is an on/off flag of `{task}`: write true or false, not {arg!r}"
    if kind != "bool" and arg is True:
        return f"`--{flag}` of `{task}` takes a value; `true` would leave it without one"
    if kind == "int" and (isinstance(arg, (float, str))):
        return f"`--{flag}` of `{task}` takes a whole number, not {arg!r}"
    if kind in ("float", "number") and isinstance(arg, str):     # "number": an option cli/options.py declares
        return f"`--{flag}` of `{task}` takes a number, not {arg!r}"
    return None


class Playbook(BaseModel):
    """A nightly run: hosts, ordered steps, per-metric thresholds (glob -> percent), baseline window."""

    model_config = ConfigDict(extra="forbid")

    name: str = ""
    description: str = ""
    setup: str = ""                                    # what "the same setup" means across nights
    hosts: list[str] = Field(min_length=1)
    steps: list[Step] = Field(min_length=1)
    thresholds: dict[str, StrictFloat] = Field(default_factory=dict)
    lower_is_better: list[str] = Field(default_factory=lambda: list(LOWER_IS_BETTER))
    baseline_window: int = Field(default=7, ge=2, le=100, strict=True)
    min_nights: int = Field(default=3, ge=1, le=100, strict=True)

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, value: list[str]) -> list[str]:
        names = [check_host_name(h) for h in value]
        if len(set(names)) != len(names):
            raise ValueError(f"a host is listed twice in {names}; list each once")
        return names

    @field_validator("thresholds")
    @classmethod
    def _thresholds(cls, value: dict[str, float]) -> dict[str, float]:
        for pattern, pct in value.items():
            if not (math.isfinite(pct) and 0 < pct < 1000):
                raise ValueError(f"threshold for {pattern!r} is {pct}; give a percentage above 0 and below 1000, "
                                 "e.g. 5 for 5%")
        return value

    @model_validator(mode="after")
    def _step_graph(self) -> Playbook:
        seen: set[str] = set()
        for i, step in enumerate(self.steps):
            if step.name in seen:
                raise _Located(f"step name {step.name!r} is used twice; give each step its own name",
                               ("steps", i, "name"))
            if step.cleanup and step.needs:
                raise _Located(f"step {step.name!r} is a clean-up step, which always runs; remove its `needs`",
                               ("steps", i, "needs"))
            for need in step.needs:
                if need not in seen:
                    known = ", ".join(sorted(seen)) or "none yet"
                    raise _Located(f"step {step.name!r} needs {need!r}, which is not an earlier step "
                                   f"(earlier steps: {known}); steps run in the order written", ("steps", i, "needs"))
            seen.add(step.name)
        if self.min_nights > self.baseline_window:
            raise _Located(f"min_nights ({self.min_nights}) cannot exceed baseline_window "
                           f"({self.baseline_window})", ("min_nights",))
        return self

    def threshold(self, metric: str) -> float:
        """The first pattern in ``thresholds`` (file order) that matches, else 5%."""
        for pattern, pct in self.thresholds.items():
            if fnmatch.fnmatchcase(metric, pattern):
                return pct
        return DEFAULT_THRESHOLD_PCT

    def lower_better(self, metric: str) -> bool:
        return any(fnmatch.fnmatchcase(metric, p) for p in self.lower_is_better)

    def check_tasks(self, known: Iterable[str] | TaskOptions, source: str = "playbook",
                    line: Callable[[tuple[str | int, ...]], int] | None = None) -> None:
        """Every step's task must exist in this project's task collection; given the tasks' options
        (a mapping), every argument must be one of them, with a value of its kind."""
        names = set(known)
        for i, step in enumerate(self.steps):
            where = f"{source}:{line(('steps', i, 'task'))}" if line else source
            if step.task not in names:
                close = difflib.get_close_matches(step.task, sorted(names), n=1)
                hint = f" (did you mean `{close[0]}`?)" if close else ""
                raise PlaybookError(f"{where}: step {i + 1} ({step.name!r}): unknown task `{step.task}`{hint}; "
                                    "`invoke --list` shows the tasks a step can name.")
            if isinstance(known, Mapping):
                self._check_args(i, step, known[step.task], source, line)

    @staticmethod
    def _check_args(i: int, step: Step, options: Mapping[str, str], source: str,
                    line: Callable[[tuple[str | int, ...]], int] | None) -> None:
        for key, arg in step.args.items():
            problem = arg_problem(step.task, key, arg, options)
            if problem:
                where = f"{source}:{line(('steps', i, 'args', key))}" if line else source
                raise PlaybookError(f"{where}: step {i + 1} ({step.name!r}), argument `{key}`: {problem}. "
                                    "Fix the playbook; nothing was run.")


def load(path: Path, tasks: TaskOptions | None = None) -> Playbook:
    """Read and validate ``path``; PlaybookError names file, line and field. With ``tasks`` (the
    project's tasks and their options), every step's task and arguments are checked too."""
    path = Path(path)
    if not path.is_file():
        raise PlaybookError(f"playbook {path} does not exist; pass --playbook playbooks/<name>.yaml "
                            f"(shipped: playbooks/nightly.yaml, playbooks/smoke.yaml, playbooks/cluster.yaml).")
    try:
        data, root = yamlfile.load(path)
    except yamlfile.YamlFileError as exc:
        where = f"{path}:{exc.line}" if exc.line else str(path)
        raise PlaybookError(f"{where}: the playbook is not valid YAML ({exc}). Fix the indentation or quoting "
                            "on that line.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PlaybookError(f"playbook {path} cannot be read ({exc}).") from None
    if not isinstance(data, dict):
        raise PlaybookError(f"{path}:1: a playbook is a mapping with `hosts:` and `steps:` (and optionally "
                            f"`thresholds:`, `baseline_window:`), not {type(data).__name__}.")
    try:
        book = Playbook(**{"name": path.stem, **data})
    except ValidationError as exc:
        raise PlaybookError(_explain(exc, path, root, data)) from None
    except TypeError as exc:                      # non-string top-level keys
        raise PlaybookError(f"{path}:1: {exc}; top-level keys are names such as `hosts` and `steps`.") from None
    if not book.setup:
        book.setup = book.name
    if tasks is not None:
        book.check_tasks(tasks, str(path), lambda loc: yamlfile.line_of(root, loc))
    return book


def _explain(exc: ValidationError, path: Path, root: Any, data: dict[str, Any]) -> str:
    parts = []
    for err in exc.errors():
        located = (err.get("ctx") or {}).get("error")
        loc = list(located.loc if isinstance(located, _Located) else err["loc"])
        field = ".".join(str(p) for p in loc) or "(playbook)"
        if len(loc) >= 2 and loc[0] == "steps" and isinstance(loc[1], int):
            steps = data.get("steps")
            item = steps[loc[1]] if isinstance(steps, list) and loc[1] < len(steps) else None
            name = item.get("name") if isinstance(item, dict) else None
            field = f"step {loc[1] + 1}" + (f" ({name!r})" if name else "") + (
                f", field `{'.'.join(str(p) for p in loc[2:])}`" if loc[2:] else "")
        else:
            field = f"field `{field}`"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            model = Step if loc and loc[0] == "steps" else Playbook
            valid = list(model.model_fields)
            close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
            msg = "unknown field" + (f" (did you mean `{close[0]}`?)" if close else "") + \
                  f"; valid fields: {', '.join(valid)}"
        elif err["type"] == "missing":
            msg = "this field is required"
        parts.append(f"{path}:{yamlfile.line_of(root, loc)}: {field}: {msg}.")
    return " ".join(parts) + " Fix the playbook and run again."
