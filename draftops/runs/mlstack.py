"""Which remote tools need the ML stack, and the one line said before one would run without it.

A laptop's base install (``pip install -e .``) has no torch or safetensors: an SSH host runs
``remote/`` with its own ml-env, so driving it needs none here. The built-in ``local`` host runs
``remote/`` with this very interpreter, so there the ML stack is the ``local`` extra's; without it the
tool would die on ``import torch`` with a traceback in its log. ``tests/test_dependencies.py`` checks
:data:`ML_TOOLS` against the import graph of every tool draftops starts.
"""
from __future__ import annotations

import importlib.util
import os
import shlex
import sys
from typing import Any

from draftops import cmdline
from draftops.errors import ExtraMissing
from draftops.link.host import Host

#: the tools draftops starts whose imports reach torch, safetensors or numpy (outside a guard)
ML_TOOLS = frozenset({"remote.drafter", "remote.drafter.launch", "remote.capture", "remote.bench.demo_prompts"})
ML_STACK = ("torch", "safetensors", "numpy")
INSTALL = "pip install -e '.[local]'"


def missing_here() -> list[str]:
    """The ML stack's packages this interpreter cannot import (found, not imported: torch takes seconds)."""
    return [name for name in ML_STACK if importlib.util.find_spec(name) is None]


def runs_here(host: Host, python: str | None = None) -> bool:
    """Whether ``host`` runs its tools with this interpreter: a ``local`` host whose python is ours."""
    interpreter = python or host.spec.interpreter
    same = os.path.abspath(os.path.expanduser(interpreter)) == os.path.abspath(sys.executable)
    return host.spec.transport == "local" and same


def require(host: Host, module: str, python: str | None = None) -> None:
    """Refuse, in one line, to start ``module`` here when it needs what this install lacks."""
    if module not in ML_TOOLS or not runs_here(host, python):
        return
    missing = missing_here()
    if missing:
        install = " ".join((shlex.quote(sys.executable), "-m", INSTALL))   # advice, not a line draftops runs
        raise ExtraMissing(
            f"Host {host.name!r} runs `{module}` with this interpreter ({sys.executable}), which has no "
            f"{' and '.join(missing)}: install the `local` extra (`{install}` in the project, or scripts/setup.sh), "
            "or pass --host NAME for a host with its own ml-env.")


#: the ``error`` event's kind of a tool that found no torch in the ml-env (remote/stackcheck.py)
STACK_MISSING = "StackMissing"
#: what the evaluator imports (remote/stackcheck.py's STACK): env.check fails without them
EVALUATOR = ("torch", "safetensors")


def setup_advice(host: Host) -> str:
    """What makes ``host``'s ml-env able to run the evaluator: `invoke env.setup` where hosts.yaml gives
    it an `env:` entry to build, else the entry to add first (env.setup refuses a host without one)."""
    env = host.spec.env
    setup = f"`{cmdline.command('env.setup', host=host.name)}`"      # --host unless it is the default
    if env is None:
        return (f"Host {host.name!r} has no `env:` entry in hosts.yaml, so there is no ml-env for env.setup to "
                "build: add one (`env: {venv: ~/ml-env, requirements: remote/requirements.txt}`; "
                "remote/requirements-cpu.txt on a host without a GPU), then run " + setup + ", or point its "
                "`python:` at an interpreter that has torch and safetensors.")
    return (f"Run {setup}: it installs {env.requirements or 'the requirements'} into {env.venv} "
            f"(the python hosts.yaml gives host {host.name!r} is {host.spec.interpreter}).")


def stack_missing_paragraph(host: Host, python: str, lacking: str) -> str:
    """One paragraph for a host whose ml-env python cannot import the evaluator's stack."""
    return (f"Host {host.name!r} runs its tools with {python}, which cannot import {lacking}, so it cannot run "
            f"the evaluator. {setup_advice(host)}")


def complete(host: Host, error: dict[str, Any] | None) -> None:
    """Turn a tool's ``StackMissing`` error event (which knows the interpreter, not the host) into the
    one paragraph that names the host, its python and the command that sets the ml-env up."""
    if not error or error.get("kind") != STACK_MISSING:
        return
    missing = error.get("missing")
    lacking = " or ".join(str(m) for m in missing) if isinstance(missing, list) and missing else "torch"
    python = error.get("python") if isinstance(error.get("python"), str) else host.spec.interpreter
    error["message"] = stack_missing_paragraph(host, str(python), lacking)
