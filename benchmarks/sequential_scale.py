"""Benchmark: the sequential verdict's time does not grow with the dump set (issue 27).

The demo's dumps (256 samples) are replicated to ``--factor`` times as many (default 8) by sampling new
sequences from the demo's own target with the demo's generator settings (``tinyllama.sample`` at the
demo's temperature, another seed per copy) and capturing the same five slots, so the layout signal is
the demo's. Then, for the 1x and the Nx set, each as its own ``python -m remote.drafter eval`` process
(what `invoke test-drafter` runs on the host): the sequential verdict (the default) and the full pass
(``--full``), ``--repeats`` times in turn. Printed: each one's median wall seconds, the Nx/1x ratio of the
sequential verdict (goal <= 1.3x), whether every verdict equals the full pass's (status, reason, fix), the
samples it scored and read, and the bytes read: the evaluator's own count of tensor bytes loaded
(``data.read.bytes``) and the process's ``read_bytes`` from ``/proc/<pid>/io`` after this benchmark's
files were dropped from the page cache (``posix_fadvise(DONTNEED)`` on its own files only).

    python benchmarks/sequential_scale.py [--factor 8] [--repeats 3] [--work DIR] [--seed 0]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from remote.drafter.demo.build import ensure_demo, write_dumps  # noqa: E402
from remote.drafter.demo_spec import MARKER, DemoPaths, DemoSpec  # noqa: E402
from remote.drafter.model import tinyllama  # noqa: E402

GOAL = 1.3


def replicate(paths: DemoPaths, out: Path, factor: int, spec: DemoSpec = DemoSpec()) -> Path:
    """``factor`` x the demo's samples: the demo's own files, then new draws from its target (same
    prompt length, length and temperature; seed 1000 + copy), every one with the demo's five slots."""
    data = out / f"data-{factor}x"
    if (data / "DONE").is_file():
        return data
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    for f in paths.data.iterdir():
        shutil.copy(f, data / f.name)
    cfg, weights = tinyllama.load(paths.target)
    config = json.loads((paths.data / "data_config.json").read_text())
    for copy in range(1, factor):
        gen = torch.Generator().manual_seed(1000 + copy)
        prompts = torch.randint(0, spec.vocab_size, (spec.samples, spec.prompt_len), generator=gen)
        with torch.no_grad():
            ids = tinyllama.sample(cfg, weights, prompts, spec.seq_len, spec.temperature, gen)
            states, _ = tinyllama.forward(cfg, weights, ids)
        slots = states[:, :, [i + 1 for i in spec.slot_ids]]
        part = out / f"part-{copy}"
        with contextlib.redirect_stdout(io.StringIO()):
            write_dumps(part, ids, slots, None, config, "safetensors")
        for i in range(spec.samples):
            shutil.move(part / f"hs_{i}.safetensors", data / f"hs_{copy * spec.samples + i}.safetensors")
        shutil.rmtree(part)
    (data / "DONE").write_text("")
    return data


def drop_cache(folder: Path) -> None:
    """Evict this benchmark's own files from the page cache, so read_bytes counts real reads."""
    for f in folder.iterdir():
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def run(paths: DemoPaths, data: Path, out: Path, full: bool, seed: int) -> dict[str, Any]:
    """One evaluation process: wall seconds, its read_bytes, and the report's verdict and reads."""
    expected = json.loads((paths.root / MARKER).read_text()).get("val_full_acc_0")
    cmd = [sys.executable, "-m", "remote.drafter", "eval", "--ckpt", str(paths.draft), "--data", str(data),
           "--verifier", str(paths.target), "--out", str(out), "--device", "cpu", "--seed", str(seed),
           "--expected-acc", str(expected)] + (["--full"] if full else [])
    drop_cache(data)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    read = 0
    while proc.poll() is None:   # the child's last read_bytes before it exits
        with contextlib.suppress(OSError):
            line = next(x for x in Path(f"/proc/{proc.pid}/io").read_text().splitlines() if x.startswith("read_bytes"))
            read = int(line.split()[1])
        time.sleep(0.02)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"eval failed ({proc.returncode}): {proc.stderr.read() if proc.stderr else ''}")
    report = json.loads((out / "report.json").read_text())
    v = report["verdict"]
    seq = report.get("sequential") or {}
    return {"wall": wall, "os_read_bytes": read, "verdict": (v["status"], v["reason"], v["fix_layer_ids"]),
            "samples": report["data"]["samples"], "total": report["data"]["samples_total"],
            "read": report["data"]["read"], "decided_by": seq.get("decided_by")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--factor", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, help="keep the demo and the replicated dumps here (default: a temp folder)")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="draftops-seqscale-"))
    work.mkdir(parents=True, exist_ok=True)
    with contextlib.redirect_stdout(io.StringIO()):
        paths = ensure_demo(work / "demo")
    sets = {1: paths.data, args.factor: replicate(paths, work, args.factor)}
    runs: dict[tuple[int, bool], list[dict[str, Any]]] = {}
    for _ in range(args.repeats):
        for factor, data in sets.items():
            for full in (False, True):
                runs.setdefault((factor, full), []).append(run(paths, data, work / "out", full, args.seed))
    print(f"sequential verdict vs the full pass, demo dumps at 1x and {args.factor}x "
          f"(median of {args.repeats}, one process each, cpu, seed {args.seed})")
    print(f"{'set':>5} {'mode':>10} {'wall s':>8} {'scored':>7} {'of':>6} {'loaded':>7} {'tensor MB':>10} "
          f"{'disk MB':>8}  verdict")
    for (factor, full), rs in sorted(runs.items()):
        r = rs[-1]
        print(f"{factor:>4}x {'full' if full else 'sequential':>10} {statistics.median(x['wall'] for x in rs):8.2f} "
              f"{r['samples']:>7} {r['total']:>6} {r['read']['samples']:>7} {r['read']['bytes'] / 1e6:10.2f} "
              f"{statistics.median(x['os_read_bytes'] for x in rs) / 1e6:8.2f}  {r['verdict']}")
    ratio = statistics.median(x["wall"] for x in runs[args.factor, False]) / statistics.median(
        x["wall"] for x in runs[1, False])
    same = all(r["verdict"] == runs[f, True][0]["verdict"] for (f, full), rs in runs.items() for r in rs)
    print(f"sequential wall {args.factor}x / 1x: {ratio:.2f} (goal <= {GOAL}: {'met' if ratio <= GOAL else 'NOT met'})")
    print(f"every sequential verdict equals the full pass's on the same set: {same}")
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
