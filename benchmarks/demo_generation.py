"""Benchmark: how long the demo's first generation takes (issue 9: under about 30 s on 2 idle cores).

Generates the demo into fresh temp folders in a fresh process each time (imports included, as a
host's first `invoke test-drafter` pays them), and prints wall and CPU seconds per phase and in all,
plus the machine's load average, since on a shared machine wall time measures the neighbours too:
CPU seconds are the figure that carries over (the build uses one thread).

    python benchmarks/demo_generation.py [--runs 3]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHILD = """
import contextlib, io, sys, time
t0 = time.perf_counter()
from remote.drafter.demo.build import ensure_demo
t_import = time.perf_counter() - t0
with contextlib.redirect_stdout(io.StringIO()):
    ensure_demo(sys.argv[1])
print(round(t_import, 3), round(time.perf_counter() - t0, 3), round(time.process_time(), 3))
"""


def one_run() -> dict:
    with tempfile.TemporaryDirectory(prefix="draftops-demo-bench-") as tmp:
        out = Path(tmp) / "demo"
        load = os.getloadavg()[0]
        proc = subprocess.run([sys.executable, "-c", CHILD, str(out)], cwd=REPO, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)}, check=True)
        imports, wall, cpu = map(float, proc.stdout.split())
        meta = json.loads((out / "DEMO.json").read_text())
        return {"load": load, "imports": imports, "wall": wall, "cpu": cpu, "phases": meta["seconds"],
                "val_acc": meta["val_full_acc_0"], "draws": meta["target_draws"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    print(f"{'run':>3} {'load':>5} {'imports s':>9} {'sample':>13} {'write':>13} {'train':>13} "
          f"{'total wall s':>12} {'total cpu s':>11}  val acc")
    for i in range(args.runs):
        r = one_run()
        phases = "".join(f" {p['wall']:6.1f}/{p['cpu']:<6.1f}" for p in
                         (r["phases"].get(k, {"wall": 0, "cpu": 0}) for k in ("sample", "write", "train")))
        print(f"{i + 1:>3} {r['load']:5.1f} {r['imports']:9.1f}{phases} {r['wall']:12.1f} {r['cpu']:11.1f}  "
              f"{r['val_acc']:.3f} ({r['draws']} target draw(s))", flush=True)
        time.sleep(1)
    print("phases: wall/cpu seconds; the acceptance figure is total wall on an idle 2-core machine (< 30 s)")


if __name__ == "__main__":
    main()
