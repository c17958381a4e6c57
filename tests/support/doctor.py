"""The doctor as the tests drive it: its project, its runs and steps, its state file read back."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from draftops import history
from draftops.doctor import plan, state
from tests.conftest import REPO
from tests.support.drafter_support import local_demo_project

NO_BENCH = ("doctor", "--draft", "demo", "--fix", "--no-bench")


@pytest.fixture
def project(make_project, no_inventory_env) -> Path:
    """A project on the `local` host whose host root holds this session's demo (as generated)."""
    root = local_demo_project(make_project())
    return root


def env() -> dict[str, str]:
    full = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(REPO)}
    full.pop("DRAFTOPS_HOST", None)
    return full


def invoke(root: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=root, env=env(), capture_output=True,
                          text=True, timeout=timeout)


def _sigint_as_from_a_terminal() -> None:
    """A suite run as a background job of a script ignores SIGINT, and its children inherit that (then
    Python installs no KeyboardInterrupt handler and a Ctrl-C sent to the doctor does nothing)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(root: Path, *args: str, **kw: Any) -> subprocess.Popen:
    kw.setdefault("preexec_fn", _sigint_as_from_a_terminal)    # Ctrl-C as from a terminal
    return subprocess.Popen([sys.executable, "-m", "invoke", *args], cwd=root, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kw)


def doctor_doc(root: Path) -> dict[str, Any]:
    (folder,) = [p for p in (root / "runs").glob("*-doctor-*") if (p / "doctor.json").is_file()]
    doc: dict[str, Any] = json.loads((folder / "doctor.json").read_text())
    return doc


def wait_for_step(root: Path, name: str, proc: subprocess.Popen, timeout: float = 240) -> None:
    """Until doctor.json says step ``name`` is running (its job started: a run id was announced)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        try:
            doc = doctor_doc(root)
        except (ValueError, OSError):
            doc = {}
        step = next((s for s in doc.get("steps", []) if s["name"] == name), None)
        if step and step["state"] == "running" and step["runs"]:     # its job runs
            return
        time.sleep(0.2)
    raise AssertionError(f"step {name} never ran")


def runs_of(root: Path, kind: str) -> list[str]:
    return sorted(r.run_id for r in history.History(root / "runs" / "history.sqlite").query(kind=kind))


def states(doc: dict[str, Any]) -> dict[str, str]:
    return {s["name"]: s["state"] for s in doc["steps"]}


def step_runs(doc: dict[str, Any], name: str) -> list[str]:
    return next(s["runs"] for s in doc["steps"] if s["name"] == name)


HOSTILE = "<script>alert(1)</script> | `x` \x1b[31mred\x1b[0m ![img](http://evil/)"


def synthetic(tmp_path: Path) -> state.State:
    """A finished doctor's state with the figures a real one records (one hostile host text)."""
    made = state.new(tmp_path / "runs", "local", plan.Args(draft="demo", fix=True))
    predicted = {"steps": 3, "served": 1.07, "best": 3.48}
    outcomes = {
        "check": {"run_id": "r-check", "status": "MISMATCH", "fixable": True, "message": HOSTILE,
                  "predicted": predicted, "trained_slots": [{"slot": 0, "layer_id": -1, "role": "embedding"}],
                  "configured_layer_ids": [2, 4, 5], "served_slots": [1, 2, 3], "serving_convention": "vllm",
                  "findings": [{"id": "layer-convention-shift", "severity": "bad", "text": HOSTILE, "fix": "f"}]},
        "baseline": {"bench_run": "r-b", "throughput": {"median": 100.0, "min": 95.0, "max": 104.0},
                     "accept_length": None},
        "as-served": {"bench_run": "r-a", "throughput": {"median": 60.0, "min": 55.0, "max": 64.0},
                      "accept_length": 1.08, "serve_run": "s-a", "configured_ids": [2, 4, 5],
                      "effective_ids": [2, 4, 5], "engine": "vllm"},
        "fix": {"run_id": "r-fix", "old_ids": [2, 4, 5], "written_ids": [0, 2, 4], "backup": "b", "config": "c"},
        "recheck": {"run_id": "r-re", "status": "MATCH", "predicted": {"steps": 3, "served": 3.48, "best": 3.48}},
        "fixed": {"bench_run": "r-f", "throughput": {"median": 130.0, "min": 120.0, "max": 138.0},
                  "accept_length": 3.41},
        "compare": {"tolerance": 0.1,
                    "as-served": {"measured": 1.08, "predicted": 1.07, "within_tolerance": True,
                                  "speed_text": "×0.60", "findings": []},
                    "fixed": {"measured": 3.41, "predicted": 3.48, "within_tolerance": True, "speed_text": "×1.30",
                              "findings": [{"severity": "good", "code": "draft-limit", "text": HOSTILE}],
                              "per_position": [{"available": True, "rows": [
                                  {"step": 0, "predicted": 0.87, "measured": 0.86, "reached": 900, "verdict": "agree"}
                              ]}]}},
    }
    for step in made.steps:
        step.state, step.outcome, step.runs = "done", outcomes.get(step.name, {}), [f"run-{step.name}"]
        step.commands = [f"invoke {step.name}"]
    made.status = "fixed"
    made.save()
    return made
