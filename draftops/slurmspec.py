"""The ``slurm:`` settings of a Slurm host entry (and of its serve profiles and tasks), and the
``sbatch`` options they become.

A host with ``scheduler: slurm`` runs every job as a Slurm batch job submitted on its login node
(docs/slurm.md). Each value here ends up as one ``sbatch`` argument, passed as an argv item (no shell
reads it on the host); it is still checked strictly, so that a value can never become a second
option, a newline in a script, or an escape sequence in a message: each field has the shape Slurm
documents for it, and ``extra_args`` items are ``--name`` or ``--name=value`` only, never one of the
options draftops sets itself.
"""
from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: the jobs a per-task override can name (``slurm.tasks``): a run's task, or its name's first words
TASK_KEYS = ("test-drafter", "capture-check", "bench", "serve", "env-setup", "engine-setup", "env-check",
             "demo", "patch-sglang", "draft-config")
#: options draftops sets itself on every submission: the run folder's log, the run id as the job
#: name, the job id on stdout, the working folder; a user's value would break the bookkeeping
OWNED = ("--output", "--error", "--job-name", "--parsable", "--wrap", "--chdir", "--open-mode", "--input",
         "--array", "--hold")
_WORDS = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.,:+-]{0,127}")      # names, lists of names, gres specs
_TIME = re.compile(r"(\d{1,4}-)?\d{1,6}(:\d{1,2}){0,2}|UNLIMITED|INFINITE", re.IGNORECASE)
_MEM = re.compile(r"\d{1,12}[KMGT]?", re.IGNORECASE)
_OPTION = re.compile(r"--[a-z][a-z0-9-]{0,63}(=[^\x00-\x1f\x7f]{0,512})?")
MAX_PENDING_S = 7 * 24 * 3600.0


def _plain(value: Any, what: str) -> Any:
    """Refuse control characters before the shape check: a newline would start a new line in the job
    script, an escape sequence would reach a terminal through every message that names the value."""
    if isinstance(value, str) and re.search(r"[\x00-\x1f\x7f]", value):
        raise ValueError(f"{what} {value!r} contains a newline or another control character")
    return value


def _not_a_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError(f"write a number, not {str(value).lower()} (YAML reads true/false/yes/no as booleans)")
    return value


class SlurmOptions(BaseModel):
    """What a Slurm job asks for; every field is optional (Slurm's and the site's defaults apply)."""

    model_config = ConfigDict(extra="forbid")
    partition: str | None = Field(None, description="--partition (one name or a comma-separated list)")
    account: str | None = Field(None, description="--account")
    qos: str | None = Field(None, description="--qos")
    time: str | None = Field(None, description="--time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS")
    gpus: str | None = Field(None, description="--gpus: a count, or type:count (a100:4)")
    gres: str | None = Field(None, description="--gres, e.g. gpu:a100:4")
    cpus: int | None = Field(None, ge=1, le=4096, description="--cpus-per-task")
    mem: str | None = Field(None, description="--mem, e.g. 64G (0: all of the node's)")
    nodes: int | None = Field(None, ge=1, le=4096, description="--nodes")
    max_pending: float | None = Field(None, gt=0, le=MAX_PENDING_S,
                                      description="seconds a job may wait in the queue before draftops stops "
                                                  "waiting for it and says so (the job stays queued)")
    extra_args: list[str] = Field(default_factory=list, description="more sbatch options: --name or --name=value")

    _numbers_not_bools = field_validator("cpus", "nodes", "max_pending", mode="before")(_not_a_bool)

    @field_validator("partition", "account", "qos", "gres", "time", "mem", "gpus", mode="before")
    @classmethod
    def _text(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)           # time: 30, gpus: 4, mem: 0
        return _plain(value, "the value")

    @field_validator("partition", "account", "qos", "gres", "gpus")
    @classmethod
    def _words(cls, value: str | None) -> str | None:
        if value is not None and not _WORDS.fullmatch(value):
            raise ValueError(f"{value!r} is not a Slurm name: use letters, digits and . _ , : + - (no spaces, "
                             "not starting with '-')")
        return value

    @field_validator("time")
    @classmethod
    def _time(cls, value: str | None) -> str | None:
        if value is not None and not _TIME.fullmatch(value):
            raise ValueError(f"{value!r} is not a Slurm time limit: write minutes (30), MM:SS, HH:MM:SS, "
                             "D-HH, D-HH:MM or D-HH:MM:SS (2-00:00:00)")
        return value

    @field_validator("mem")
    @classmethod
    def _mem(cls, value: str | None) -> str | None:
        if value is not None and not _MEM.fullmatch(value):
            raise ValueError(f"{value!r} is not a Slurm memory size: write a number with an optional unit "
                             "K, M, G or T (64G)")
        return value

    @field_validator("extra_args", mode="before")
    @classmethod
    def _extra(cls, value: Any) -> Any:
        if isinstance(value, str):
            raise ValueError("write extra_args as a YAML list, e.g. ['--constraint=a100', '--exclusive']")
        if not isinstance(value, list):
            return value
        for item in value:
            if not isinstance(item, str):
                raise ValueError(f"extra_args item {item!r} is not text; write '--name=value'")
            _plain(item, "extra_args item")
            if not _OPTION.fullmatch(item):
                raise ValueError(f"extra_args item {item!r} is not one sbatch option: write '--name' or "
                                 "'--name=value' in one item (short options such as -N are not taken)")
            if item.split("=", 1)[0] in OWNED:
                raise ValueError(f"extra_args item {item!r} sets an option draftops sets itself on every job "
                                 f"({', '.join(OWNED)}): the run folder's log and the job's name are how "
                                 "draftops finds the job again; remove it")
        return value


class SlurmSettings(SlurmOptions):
    """A host's ``slurm:``: the options of every job, and per-task overrides (``tasks:``)."""

    tasks: dict[str, SlurmOptions] = Field(default_factory=dict,
                                           description="per-task overrides, by task (test-drafter, bench, ...)")

    @field_validator("tasks", mode="before")
    @classmethod
    def _known_tasks(cls, value: Any) -> Any:
        if isinstance(value, dict):
            bad = [k for k in value if k not in TASK_KEYS]
            if bad:
                raise ValueError(f"{bad} name no draftops job; per-task settings are for {', '.join(TASK_KEYS)}")
        return value


def task_key(task: str) -> str | None:
    """The ``tasks:`` key that applies to a run of ``task`` (its task, or its run name)."""
    for key in TASK_KEYS:
        if task == key or task.startswith(key + "-"):
            return key
    return None


def resolve(host: SlurmSettings | None, task: str, *more: SlurmOptions | None) -> SlurmOptions:
    """The options of one job: the host's, then its task's override, then each of ``more`` (a serve
    profile's); a field set later wins, and ``extra_args`` add up."""
    merged: dict[str, Any] = {}
    extra: list[str] = []
    key = task_key(task)
    layers: list[SlurmOptions | None] = [host, host.tasks.get(key) if host and key else None, *more]
    for layer in layers:
        if layer is None:
            continue
        for name in SlurmOptions.model_fields:
            if name == "extra_args":
                extra += layer.extra_args
            elif name in layer.model_fields_set and getattr(layer, name) is not None:
                merged[name] = getattr(layer, name)
    return SlurmOptions(**merged, extra_args=extra)


_FLAGS = (("partition", "--partition"), ("account", "--account"), ("qos", "--qos"), ("time", "--time"),
          ("gpus", "--gpus"), ("gres", "--gres"), ("cpus", "--cpus-per-task"), ("mem", "--mem"),
          ("nodes", "--nodes"))


def sbatch_args(options: SlurmOptions) -> list[str]:
    """The ``sbatch`` options of ``options``, one argv item each (``--name=value``)."""
    args = [f"{flag}={getattr(options, name)}" for name, flag in _FLAGS if getattr(options, name) is not None]
    return args + list(options.extra_args)
