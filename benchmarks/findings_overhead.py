"""Benchmark: `test-drafter` on the demo at a base commit against the working tree (issue 25: all
the new cause checks may add no more than 10% to the evaluation).

What is timed is what `invoke test-drafter` runs on the host: one process, ``python -m remote.drafter
eval`` on the demo's draft, dumps and target (with the demo's expected accuracy), start-up and
imports included.  The base commit (default 5b04e3f, before the findings work) is checked out with
``git worktree add --detach`` into a temporary folder (removed at the end); both trees evaluate the
same demo, built by the working tree.  The two run in turn (base, tree, base, tree, ...) after one
warm-up each, so drift of a shared machine hits both; printed, for wall seconds and for the
child's cpu seconds (user + system: steadier when the machine is shared): each one's median
(min..max), the ratio of the medians and the median of the paired ratios.

    python benchmarks/findings_overhead.py [--base 5b04e3f] [--repeats 7] [--device cpu]

The same pairing from outside, for one figure:  farm-bench -n 7 --vs 'python -m remote.drafter eval
...' -- python -m remote.drafter eval ...  (run from each tree).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from remote.drafter.demo.build import ensure_demo  # noqa: E402
from remote.drafter.demo_spec import MARKER, DemoPaths  # noqa: E402

BASE = "5b04e3f"
GOAL = 1.10  # the bound on the tree's time over the base's


def eval_command(paths: DemoPaths, out: Path, device: str) -> list[str]:
    """The host side of `test-drafter` on the demo, with explicit paths so neither tree rebuilds it."""
    expected = json.loads((paths.root / MARKER).read_text()).get("val_full_acc_0")
    cmd = [sys.executable, "-m", "remote.drafter", "eval", "--ckpt", str(paths.draft), "--data", str(paths.data),
           "--verifier", str(paths.target), "--out", str(out), "--device", device]
    return cmd + (["--expected-acc", str(expected)] if expected is not None else [])


def _child_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def timed(tree: Path, cmd: list[str]) -> tuple[float, float]:
    """(wall, cpu) seconds of one evaluation run from ``tree`` (its code on PYTHONPATH); cpu (user +
    system of the finished child) is the steadier figure on a shared machine. A failure stops the run."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cpu, start = _child_cpu(), time.perf_counter()
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=False)
    seconds, cpu = time.perf_counter() - start, _child_cpu() - cpu
    if done.returncode != 0:
        sys.exit(f"eval failed in {tree} (exit {done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return seconds, cpu


def base_tree(commit: str, parent: Path) -> Path:
    folder = parent / f"base-{commit}"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(folder), commit],
                   check=True)
    return folder


def figure(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} s (min {min(xs):.3f}, max {max(xs):.3f}, n={len(xs)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default=BASE, help=f"commit to compare against ({BASE})")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs of each tree (7)")
    parser.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="draftops-findings-bench-") as tmp_name:
        tmp = Path(tmp_name)
        with contextlib.redirect_stdout(io.StringIO()):  # its progress events
            paths = ensure_demo(tmp / "demo")
        base = base_tree(args.base, tmp)
        try:
            trees = {"base": base, "tree": REPO}
            cmds = {name: eval_command(paths, tmp / "out" / name, args.device) for name in trees}
            for name, tree in trees.items():  # warm-up: page cache, bytecode
                timed(tree, cmds[name])
            runs: dict[str, list[tuple[float, float]]] = {"base": [], "tree": []}
            for _ in range(args.repeats):
                for name, tree in trees.items():
                    runs[name].append(timed(tree, cmds[name]))
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], check=False)
    print(f"test-drafter eval on the demo ({args.device}), base {args.base} vs the working tree; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    for index, kind in enumerate(("wall", "cpu")):
        base_s, tree_s = ([r[index] for r in runs[n]] for n in ("base", "tree"))
        ratio = statistics.median(tree_s) / statistics.median(base_s)
        paired = statistics.median(t / b for t, b in zip(tree_s, base_s, strict=True))
        print(f"  {kind}: base {figure(base_s)}; tree {figure(tree_s)}")
        print(f"  {kind}: ratio of medians {ratio:.3f}, median paired ratio {paired:.3f} "
              f"({'within' if paired <= GOAL else 'OVER'} the issue's {GOAL:.2f})")


if __name__ == "__main__":
    main()
