"""GPU figures for the drafter evaluator in one run (issue 12): the chip's achievable bf16 rate,
the evaluator's throughput at Kimi-K2 scale against it, the naive loop, the copy overlap, an
end-to-end ``evaluate()`` from files, and CUDA bf16 against CPU fp32 correctness.

    python benchmarks/gpu_figures.py --device cuda --out DIR [--baseline PATH] [--budget-s 400]
    python benchmarks/gpu_figures.py --device cpu --smoke --out /tmp/figs   # the same, tiny, seconds

Sections (``--sections``, in this order; each one's results are written to DIR/gpu_figures.json as
soon as it ends, and every line printed is also in DIR/gpu_figures.log):

* ``env``      torch, CUDA, GPU name, driver, SM count.
* ``probe``    bf16 GEMMs at the draft's own shapes (M = rows of one batch): fc (A·H -> H), fused
  qkv (2H -> (heads + 2 kv)·hd), o, gate+up, down, lm_head; their FLOP-weighted mix as the
  forward runs them is the achievable rate MFU is held against; plus an 8192^3 product.
* ``throughput`` the evaluator's scoring of synthetic Kimi-shaped dumps (``drafter_eval.run_fast``)
  for several variants; the code before this tuning (``--baseline``, a copy of remote/ at the
  commit before) runs as the first variant.  MFU counts the FLOPs of the rows actually run.
* ``overlap``  the best variant with (a) the pipeline (pinned host batches copied on a side
  stream), (b) batches already on the device (no copy), (c) synchronous copies.
* ``naive``    the per-sample loop on a few samples, same dtype, for the ratio.
* ``correct``  CUDA bf16 vs CPU fp32: the demo through ``evaluate()`` on both, and a random
  Kimi-shaped draft whose dump's final slot is built so that the verifier targets are the fp32
  draft's own step-0 predictions on its trained slots (the verdict then has a right answer).
* ``e2e``      ``evaluate()`` on Kimi-shaped files (checkpoint, verifier, dumps on local disk),
  timed by phase, pruned and unpruned; and the disk's direct-read rate.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from safetensors.torch import save_file  # noqa: E402

from benchmarks import drafter_eval as de  # noqa: E402
from remote.drafter import EvalOptions, evaluate  # noqa: E402
from remote.drafter.data.batching import collate  # noqa: E402
from remote.drafter.data.dumps import Sample  # noqa: E402
from remote.drafter.model import layers  # noqa: E402
from remote.drafter.model.draft import DraftArch, Eagle3Draft  # noqa: E402
from remote.drafter.scoring.score import VerifierHead  # noqa: E402
from remote.fileio import atomic_write_text  # noqa: E402

evaluate_module: Any = importlib.import_module("remote.drafter.evaluation")
STATED_TFLOPS = 790.0  # the workplace's stated H200 bf16 rate (the "790 TFLOP/s")
DATASHEET_TFLOPS = 989.0  # NVIDIA H200 SXM dense bf16
SMOKE = de.Scale(hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, layers=1, aux=3,
                 draft_vocab=96, vocab=160, steps=3, samples=6, seq_len=48)
LOGIT_REL_TOL = 2.5e-2  # ||bf16 - fp32|| / ||fp32|| per step (argued in docs/performance.md)


class Figures:
    """Results, a log that tees stdout, and the time budget."""

    def __init__(self, out: Path, budget_s: float) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.start = time.perf_counter()
        self.budget = budget_s
        self.data: dict[str, Any] = {}

    def say(self, line: str) -> None:
        text = f"[{time.perf_counter() - self.start:6.1f}s] {line}"
        print(text, flush=True)
        with open(self.out / "gpu_figures.log", "a") as log:
            log.write(text + "\n")

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.start)

    def save(self) -> None:
        atomic_write_text(self.out / "gpu_figures.json", json.dumps(self.data, indent=1, default=str))


# -- helpers --------------------------------------------------------------------------------------------
def timed(fn: Callable[[], Any], device: torch.device, reps: int, warmup: int = 2) -> float:
    """Median seconds of ``fn`` (CUDA events on a GPU, perf_counter on CPU)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def load_baseline(path: Path) -> ModuleType | None:
    """The ``remote`` package of the commit before this tuning, imported as ``baseline``."""
    init = path / "remote" / "__init__.py"
    if not init.is_file():
        return None
    spec = importlib.util.spec_from_file_location("baseline", init, submodule_search_locations=[str(init.parent)])
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["baseline"] = module
    spec.loader.exec_module(module)
    for sub in ("model", "batching", "scoring", "layers"):
        __import__(f"baseline.drafter.{sub}")
    return module


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))


# -- sections -------------------------------------------------------------------------------------------
def section_env(fig: Figures, device: torch.device) -> None:
    env: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
                           "cpu_count": os.cpu_count(), "threads": torch.get_num_threads()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=props.name, sm_count=props.multi_processor_count,
                   memory_gib=round(props.total_memory / 2**30, 1))
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            env["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit",
                 "--format=csv,noheader"], capture_output=True, text=True, timeout=20, check=False).stdout.strip()
    fig.data["env"] = env
    fig.say(f"env: {env}")


def gemm_shapes(arch: DraftArch, m: int) -> list[tuple[str, int, int, int, int]]:
    """(name, M, K, N, times per row) of every GEMM the forward runs, for ``steps``=3."""
    h, hd, a = arch.hidden_size, arch.head_dim, arch
    return [("fc", m, a.num_aux * a.aux_hidden_size, h, 1),
            ("qkv", m, 2 * h, (a.num_heads + 2 * a.num_kv_heads) * hd, 3),
            ("o_proj", m, a.num_heads * hd, h, 3),
            ("gate_up", m, h, 2 * a.intermediate_size, 3),
            ("down", m, a.intermediate_size, h, 3),
            ("lm_head", m, h, a.draft_vocab_size, 3),
            ("verifier_head", m, h, a.draft_vocab_size, 1)]


def section_probe(fig: Figures, device: torch.device, arch: DraftArch, m: int, smoke: bool) -> float:
    """TFLOP/s of each draft GEMM in bf16 (fp32 on CPU) and of their mix; returns the mix rate."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    reps = 3 if smoke else 10
    rows: list[dict[str, Any]] = []
    mix_flops = mix_time = 0.0
    for name, mm, k, n, times in gemm_shapes(arch, m):
        pair = [torch.randn(mm, k, device=device, dtype=dtype), torch.randn(n, k, device=device, dtype=dtype)]
        t = timed(lambda: F.linear(pair[0], pair[1]), device, reps)  # noqa: B023 (called here, in the loop)
        flops = 2.0 * mm * k * n
        rows.append({"gemm": name, "M": mm, "K": k, "N": n, "ms": t * 1e3, "tflops": flops / t / 1e12})
        mix_flops += flops * times
        mix_time += t * times
        fig.say(f"probe {name:13s} [{mm}x{k}]x[{k}x{n}]: {t * 1e3:8.3f} ms  {flops / t / 1e12:7.1f} TFLOP/s")
        pair.clear()
    side = 256 if smoke else 8192
    pair = [torch.randn(side, side, device=device, dtype=dtype) for _ in range(2)]
    square = 2.0 * side**3 / timed(lambda: pair[0] @ pair[1], device, reps) / 1e12
    pair.clear()
    norms = _norm_probe(device, dtype, m, arch.hidden_size, reps)
    mix = mix_flops / mix_time / 1e12
    fig.data["probe"] = {"gemms": rows, "mix_tflops": mix, f"square_{side}_tflops": square, "norms": norms,
                         "dtype": str(dtype)}
    fig.say(f"probe: draft GEMM mix {mix:.1f} TFLOP/s (the achievable rate), {side}^3 {square:.1f} TFLOP/s; "
            f"rms norm {norms}")
    return mix * 1e12


def _norm_probe(device: torch.device, dtype: torch.dtype, m: int, h: int, reps: int) -> dict[str, float]:
    """ms of the HF-style RMSNorm (layers.hf_rms_norm) vs torch's F.rms_norm on [M, H]."""
    x = torch.randn(m, h, device=device, dtype=dtype)
    w = torch.rand(h, device=device, dtype=dtype) + 0.5
    out = {"hf_ms": timed(lambda: layers.hf_rms_norm(x, w, 1e-5), device, reps) * 1e3}
    if hasattr(F, "rms_norm"):
        out["torch_ms"] = timed(lambda: F.rms_norm(x, (h,), w, 1e-5), device, reps) * 1e3
        out["torch_vs_hf_rel_err"] = rel_err(F.rms_norm(x, (h,), w, 1e-5), layers.hf_rms_norm(x, w, 1e-5))
    return out


def run_baseline(base: ModuleType, draft: Any, head: VerifierHead, samples: list[Sample], steps: int,
                 budget: int, device: torch.device) -> de.Run:
    """The evaluator as it was before this tuning (baseline package), timed like run_fast."""
    bb, bs = base.drafter.batching, base.drafter.scoring
    score = bs.new_score([0, 1, 2], steps, True)
    rows = grid = 0
    torch.cuda.reset_peak_memory_stats(device) if device.type == "cuda" else None
    de._sync(device)
    start = time.perf_counter()
    with torch.inference_mode():
        host = bb.iter_batches(samples.__getitem__, range(len(samples)), budget, pin=device.type == "cuda")
        for batch in bb.to_device(bb.background(host), device):
            bs.score_batch(draft, batch, score, steps, head.targets(batch.final(3)))
            rows += int(batch.lengths.sum())
            grid += batch.input_ids.numel()
    de._sync(device)
    seconds = time.perf_counter() - start
    seq = max(s.token_ids.shape[0] for s in samples) - 1
    return de.Run(seconds, rows, de._accs(score.data, score.verifier),
                  de.executed_flops(draft.arch, seq, grid, [grid] * steps),
                  torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0, [grid] * steps)


def _describe(run: de.Run, probe: float, device: torch.device) -> dict[str, Any]:
    rate = run.flops / run.seconds
    d = {"seconds": run.seconds, "rows": run.rows, "tokens_per_s": run.tokens_per_s, "tflops": rate / 1e12,
         "mfu_probe": rate / probe, "rows_per_step": run.computed, "peak_gib": run.peak_bytes / 2**30,
         "verifier_full_acc": run.accs["verifier"], "data_full_acc": run.accs["data"]}
    if device.type == "cuda":
        d["mfu_790"] = rate / (STATED_TFLOPS * 1e12)
        d["mfu_989"] = rate / (DATASHEET_TFLOPS * 1e12)
    return d


_COMPILED: dict[str, Any] = {}


def _with_norm(norm: Callable[..., torch.Tensor], fn: Callable[[], de.Run]) -> de.Run:
    """Run ``fn`` with layers.rms_norm replaced by ``norm``."""
    plain = layers.rms_norm
    layers.rms_norm = norm
    try:
        return fn()
    finally:
        layers.rms_norm = plain


def _with_compiled_norm(fn: Callable[[], de.Run]) -> de.Run:
    """``fn`` with layers.rms_norm torch.compile'd (dynamic shapes; the warm-up pays the compile)."""
    if "rms_norm" not in _COMPILED:
        _COMPILED["rms_norm"] = torch.compile(layers.hf_rms_norm, dynamic=True)
    return _with_norm(_COMPILED["rms_norm"], fn)


def section_throughput(fig: Figures, device: torch.device, scale: de.Scale, probe: float,
                       base: ModuleType | None, budgets: list[int], repeat: int, compile_norms: bool
                       ) -> tuple[Eagle3Draft, VerifierHead, list[Sample], int]:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    arch = de.arch_for(scale)
    weights = de.synthetic_weights(arch, device, dtype)
    draft = Eagle3Draft(arch, dict(weights), device, dtype)
    head = de.synthetic_head(arch, device, dtype)
    t = time.perf_counter()
    samples = de.synthetic_samples(scale, pin=device.type == "cuda",
                                   device=device if device.type == "cuda" else None)
    fig.say(f"throughput: {scale.samples} samples x {scale.seq_len} tokens made in {time.perf_counter() - t:.1f} s; "
            f"attention kernel {layers.kernel_name(device.type, dtype)}")
    results: dict[str, Any] = {"scale": scale.__dict__, "variants": {}}
    fig.data["throughput"] = results
    warm = samples[: max(1, min(4, len(samples) // 4))]

    def measure(name: str, fn: Callable[[list[Sample]], de.Run]) -> float:
        """Time one variant (warm-up, then the best of ``repeat``); returns tokens/s (0 if skipped)."""
        if fig.left() < 90 and results["variants"]:
            fig.say(f"throughput: skipping {name!r}, {fig.left():.0f} s left")
            return 0.0
        try:
            t = time.perf_counter()
            fn(warm)
            fig.say(f"throughput {name}: warm-up {time.perf_counter() - t:.1f} s")
            run = min((fn(samples) for _ in range(repeat)), key=lambda r: r.seconds)
        except Exception as exc:  # noqa: BLE001 (a variant that fails must not lose the others)
            results["variants"][name] = {"error": f"{type(exc).__name__}: {exc}"}
            fig.say(f"throughput {name}: FAILED {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
            return 0.0
        d = _describe(run, probe, device)
        results["variants"][name] = d
        fig.say(f"throughput {name}: {d['tokens_per_s']:,.0f} tokens/s, {d['tflops']:.1f} TFLOP/s, "
                f"MFU {100 * d['mfu_probe']:.1f}% of probe"
                + (f", {100 * d['mfu_790']:.1f}% of 790" if "mfu_790" in d else "")
                + f", peak {d['peak_gib']:.1f} GiB, rows/step {d['rows_per_step']}, "
                  f"acc {de._fmt(run.accs['verifier'])}")
        fig.save()
        return d["tokens_per_s"]

    if base is not None:
        old = base.drafter.model.Eagle3Draft(arch, dict(weights), device, dtype)
        measure(f"before (HEAD), {budgets[0]} tokens",
                lambda s: run_baseline(base, old, head, s, scale.steps, budgets[0], device))
        del old
    def every_row_at(budget: int) -> Callable[[list[Sample]], de.Run]:
        return lambda s: de.run_fast(draft, head, s, scale.steps, budget, device, prune=False)

    rates = {b: measure(f"tuned, every row, {b} tokens", every_row_at(b)) for b in budgets}
    best_budget = max(rates, key=lambda b: rates[b])

    every_row = every_row_at(best_budget)
    measure(f"tuned, pruned (random draft), {best_budget} tokens",
            lambda s: de.run_fast(draft, head, s, scale.steps, best_budget, device, prune=True))
    measure(f"tuned with HF's 5-kernel rms_norm (before the fused norm), every row, {best_budget} tokens",
            lambda s: _with_norm(layers.hf_rms_norm, lambda: every_row(s)))
    if compile_norms:
        measure(f"tuned + torch.compile'd HF rms_norm, every row, {best_budget} tokens",
                lambda s: _with_compiled_norm(lambda: every_row(s)))
    de.aim_verifier_targets(draft, head, samples)  # from here on the draft is right at step 0
    measure(f"tuned, pruned (draft right at step 0), {best_budget} tokens",
            lambda s: de.run_fast(draft, head, s, scale.steps, best_budget, device, prune=True))
    results["best_budget"] = best_budget
    results["fallbacks"] = layers.fallback_reasons()
    return draft, head, samples, best_budget


def section_profile(fig: Figures, device: torch.device, draft: Eagle3Draft, head: VerifierHead,
                    samples: list[Sample], steps: int, budget: int) -> None:
    """Top kernels of one pass (every row) by device time."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    part = samples[: max(1, budget // samples[0].token_ids.shape[0])]
    with profile(activities=acts) as prof:
        de.run_fast(draft, head, part, steps, budget, device, prune=False)
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=18, max_name_column_width=60)
    fig.data["profile"] = table
    fig.say("profile (one batch, every row):\n" + table)


def section_overlap(fig: Figures, device: torch.device, draft: Eagle3Draft, head: VerifierHead,
                    samples: list[Sample], steps: int, budget: int, probe: float) -> None:
    res: dict[str, Any] = {"budget": budget}
    fig.data["overlap"] = res
    runs = {
        "pipeline (pinned, side-stream copies)": lambda: de.run_fast(draft, head, samples, steps, budget, device,
                                                                     prune=False),
        "synchronous copies": lambda: de.run_fast(draft, head, samples, steps, budget, device, prune=False,
                                                  preloaded=_sync_batches(samples, budget, device)),
    }
    on_device = [de.device_batches(samples, budget, device)]
    runs["no copies (batches already on the device)"] = lambda: de.run_fast(
        draft, head, samples, steps, budget, device, prune=False, preloaded=on_device[0])
    for name, fn in runs.items():
        run = min((fn() for _ in range(2)), key=lambda r: r.seconds)
        res[name] = _describe(run, probe, device)
        fig.say(f"overlap {name}: {run.seconds:.3f} s, {run.tokens_per_s:,.0f} tokens/s")
    on_device.clear()
    fig.save()


def _sync_batches(samples: list[Sample], budget: int, device: torch.device) -> Any:
    """Batches collated on the fly and copied synchronously (no pinning, no side stream)."""
    from remote.drafter.data.batching import iter_batches

    for b in iter_batches(samples.__getitem__, range(len(samples)), budget):
        yield b.to(device)


def section_naive(fig: Figures, device: torch.device, draft: Eagle3Draft, head: VerifierHead,
                  samples: list[Sample], steps: int, budget: int, count: int) -> None:
    part = samples[:count]
    naive = de.run_naive(draft, head, part, steps)
    fast = min((de.run_fast(draft, head, part, steps, budget, device, prune=False) for _ in range(2)),
               key=lambda r: r.seconds)
    res = {"samples": count, "naive_tokens_per_s": naive.tokens_per_s, "batched_tokens_per_s": fast.tokens_per_s,
           "speedup": fast.tokens_per_s / naive.tokens_per_s, "naive_acc": naive.accs, "batched_acc": fast.accs}
    fig.data["naive"] = res
    fig.say(f"naive: {naive.tokens_per_s:,.0f} tokens/s vs batched (every row) {fast.tokens_per_s:,.0f} "
            f"on the same {count} samples: {res['speedup']:.1f}x; acc naive {de._fmt(naive.accs['verifier'])} "
            f"batched {de._fmt(fast.accs['verifier'])}")
    fig.save()


# -- correctness ----------------------------------------------------------------------------------------
def _quiet_eval(**kw: Any) -> dict[str, Any]:
    with contextlib.redirect_stdout(io.StringIO()):
        return evaluate(EvalOptions(**kw))


def _compare_reports(cpu: dict[str, Any], gpu: dict[str, Any]) -> dict[str, Any]:
    v0, v1 = cpu["verdict"], gpu["verdict"]
    keys = ("status", "fix_layer_ids", "best_slots", "served_slots", "needs_capture_patch")
    acc = {tuple(r["slots"]): r["acc"] for r in cpu["layouts"]}
    acc_gpu = {tuple(r["slots"]): r["acc"] for r in gpu["layouts"]}
    step0 = max(abs((acc[s] or 0) - (acc_gpu[s] or 0)) for s in acc)
    full = 0.0
    for role in ("served", "best"):
        a, b = cpu["metrics"].get(role), gpu["metrics"].get(role)
        if a and b:
            for kind in ("data", "verifier"):
                if a.get(kind) and b.get(kind):
                    full = max(full, max(abs((x or 0) - (y or 0)) for x, y in
                                         zip(a[kind]["full_acc"], b[kind]["full_acc"], strict=True)))
    return {"verdict_identical": all(v0.get(k) == v1.get(k) for k in keys),
            "verdict_cpu": {k: v0.get(k) for k in keys}, "verdict_gpu": {k: v1.get(k) for k in keys},
            "max_step0_acc_diff_points": 100 * step0, "max_full_acc_diff_points": 100 * full,
            "layout_acc_cpu": {str(k): v for k, v in acc.items()},
            "layout_acc_gpu": {str(k): v for k, v in acc_gpu.items()}}


def _logit_check(cpu_draft: Eagle3Draft, gpu_draft: Eagle3Draft, aux: torch.Tensor, ids: torch.Tensor,
                 lengths: torch.Tensor, steps: int) -> dict[str, Any]:
    """Per step: relative error of the GPU logits against fp32, max |diff| over the logit std, and
    argmax agreement overall and where the fp32 top-2 margin exceeds 1% of the logit std."""
    with torch.inference_mode():
        ref = cpu_draft.forward(aux.float(), ids, steps, lengths)
        got = gpu_draft.forward(aux.to(gpu_draft.device), ids, steps, lengths)
    valid = (torch.arange(ids.shape[1])[None, :] < lengths[:, None])
    out: list[dict[str, Any]] = []
    for r, g in zip(ref, got, strict=True):
        r, g = r[valid], g.float().cpu()[valid]
        top2 = r.topk(2, dim=-1).values
        margin = top2[:, 0] - top2[:, 1]
        agree = r.argmax(-1) == g.argmax(-1)
        clear = margin > 0.01 * r.std()
        out.append({"rel_err": rel_err(g, r), "max_abs_over_std": float((g - r).abs().max() / r.std()),
                    "argmax_agree": float(agree.float().mean()),
                    "argmax_agree_margin_gt_1pct_std": float(agree[clear].float().mean()) if clear.any() else None,
                    "rows": int(valid.sum())})
    return {"steps": out, "tolerance_rel_err": LOGIT_REL_TOL,
            "within_tolerance": all(float(s["rel_err"]) <= LOGIT_REL_TOL for s in out)}


def section_correct(fig: Figures, device: torch.device, demo_dir: Path | None, scale: de.Scale,
                    work: Path, kimi_lengths: tuple[int, ...]) -> None:
    res: dict[str, Any] = {"logit_tolerance": LOGIT_REL_TOL}
    fig.data["correct"] = res
    if demo_dir is not None:
        from remote.drafter import load_checkpoint
        from remote.drafter.data.dumps import DumpSet

        expected = json.loads((demo_dir / "DEMO.json").read_text()).get("val_full_acc_0")
        kw = {"ckpt": demo_dir / "draft", "data": demo_dir / "data", "verifier": demo_dir / "target",
              "expected_acc": expected}
        t = time.perf_counter()
        cpu = _quiet_eval(device="cpu", out=work / "demo_cpu", **kw)
        gpu = _quiet_eval(device=device.type, out=work / "demo_gpu", **kw)
        res["demo"] = _compare_reports(cpu, gpu)
        cd, _ = load_checkpoint(demo_dir / "draft", device="cpu", dtype=torch.float32)
        gd, _ = load_checkpoint(demo_dir / "draft", device=device,
                                dtype=torch.bfloat16 if device.type == "cuda" else torch.float32)
        data = DumpSet.open(demo_dir / "data")
        batch = collate([data.load(i) for i in range(16)])
        res["demo"]["logits"] = _logit_check(cd, gd, batch.aux([0, 1, 2]), batch.input_ids, batch.lengths, 3)
        fig.say(f"correct demo ({time.perf_counter() - t:.1f} s): {json.dumps(_brief(res['demo']))}")
        fig.save()
    t = time.perf_counter()
    res["kimi"] = kimi_correctness(fig, device, scale, work, kimi_lengths)
    fig.say(f"correct kimi-shaped ({time.perf_counter() - t:.1f} s): {json.dumps(_brief(res['kimi']))}")
    fig.save()


def _brief(d: dict[str, Any]) -> dict[str, Any]:
    keep = ("verdict_identical", "verdict_cpu", "max_step0_acc_diff_points", "max_full_acc_diff_points")
    out = {k: d[k] for k in keep if k in d}
    if "logits" in d:
        out["logits"] = [{k: (round(v, 5) if isinstance(v, float) else v) for k, v in s.items()}
                         for s in d["logits"]["steps"]]
        out["within_tolerance"] = d["logits"]["within_tolerance"]
    return out


# -- Kimi-shaped files ----------------------------------------------------------------------------------
LAYER_IDS = [-1, 2, 30, 60]  # dump slots: embedding, layers 2 and 30, final (layer 60 of 61)
TRAINED = (0, 1, 2)
CONFIGURED = [2, 30, 60]  # what the config says: SGLang feeds slots (1, 2, 3), not the trained ones


def write_checkpoint(folder: Path, arch: DraftArch, weights: dict[str, torch.Tensor]) -> Path:
    """A flat-format draft (no embedding: it comes from the verifier) and a tied-embedding
    verifier (embed + final norm), both bf16 safetensors."""
    draft, target = folder / "draft", folder / "target"
    draft.mkdir(parents=True, exist_ok=True)
    target.mkdir(parents=True, exist_ok=True)
    tensors = {n.replace("layers.0.", "midlayer.", 1): t.detach().cpu().contiguous()
               for n, t in weights.items() if n != "embed_tokens.weight"}
    save_file(tensors, str(draft / "model.safetensors"))
    block = {"model_type": "llama", "hidden_size": arch.hidden_size, "intermediate_size": arch.intermediate_size,
             "num_hidden_layers": arch.num_layers, "num_attention_heads": arch.num_heads,
             "num_key_value_heads": arch.num_kv_heads, "head_dim": arch.head_dim, "hidden_act": "silu",
             "rms_norm_eps": arch.rms_norm_eps, "max_position_embeddings": 8192, "vocab_size": arch.vocab_size,
             "tie_word_embeddings": False}
    (draft / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], **block, "rope_theta": arch.rope.theta, "rope_scaling": None,
        "draft_vocab_size": arch.draft_vocab_size, "torch_dtype": "bfloat16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": CONFIGURED, "use_aux_hidden_state": True}}))
    save_file({"model.embed_tokens.weight": weights["embed_tokens.weight"].detach().cpu().contiguous(),
               "model.norm.weight": torch.ones(arch.hidden_size, dtype=weights["norm.weight"].dtype)},
              str(target / "model.safetensors"))
    (target / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], **block, "num_hidden_layers": LAYER_IDS[-1] + 1,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16"}))
    return folder


def write_dump(folder: Path, samples: list[Sample]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i, s in enumerate(samples):
        save_file({"token_ids": s.token_ids.contiguous(), "hidden_states": s.hidden.contiguous()},
                  str(folder / f"hs_{i}.safetensors"))
    (folder / "data_config.json").write_text(json.dumps({
        "layer_ids": LAYER_IDS, "layer_id_convention": "sglang", "final_slot": 3,
        "num_hidden_layers": LAYER_IDS[-1] + 1}))
    return folder


def targeted_samples(draft: Eagle3Draft, arch: DraftArch, lengths: tuple[int, ...], seed: int
                     ) -> tuple[list[Sample], torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random samples whose final slot makes the verifier's target at each row the draft's own
    step-0 prediction on the TRAINED slots (verifier rows of the draft vocab are near-orthogonal
    random vectors, so argmax(rows . norm(rows[d])) = d).  Drawn on the draft's device; returns
    the samples (host, bf16) and the padded batch they form."""
    dev = draft.device
    gen = torch.Generator(dev).manual_seed(seed)
    samples = []
    for i, n in enumerate(lengths):
        hidden = torch.randn(n, len(LAYER_IDS), arch.hidden_size, generator=gen, device=dev).to(torch.bfloat16)
        ids = torch.randint(0, arch.vocab_size, (n,), generator=gen, device=dev)
        samples.append(Sample(ids.cpu(), hidden.cpu(), None, Path(f"kimi_{i}")))
    batch = collate(samples)
    with torch.inference_mode():
        logits = draft.forward(batch.aux(list(TRAINED)).to(draft.dtype), batch.input_ids, 1, batch.lengths)[0]
    preds = logits.argmax(-1)
    rows = draft.w["embed_tokens.weight"][draft.draft_to_target(torch.arange(arch.draft_vocab_size, device=dev))]
    for b, s in enumerate(samples):
        n = s.token_ids.shape[0]
        s.hidden[1:, 3] = rows[preds[b, : n - 1]].to(torch.bfloat16).cpu()  # row t's target: position t+1
    return samples, batch.aux(list(TRAINED)), batch.input_ids, batch.lengths


def kimi_correctness(fig: Figures, device: torch.device, scale: de.Scale, work: Path,
                     lengths: tuple[int, ...]) -> dict[str, Any]:
    arch = de.arch_for(scale)
    gpu_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    weights = {n: t.to(gpu_dtype) if t.is_floating_point() else t
               for n, t in de.synthetic_weights(arch, device, gpu_dtype, seed=5).items()}
    cpu_weights = {n: t.cpu() for n, t in weights.items()}
    fp32 = Eagle3Draft(arch, {n: t.float() if t.is_floating_point() else t for n, t in cpu_weights.items()},
                       "cpu", torch.float32)
    t = time.perf_counter()
    samples, aux, ids, lens = targeted_samples(fp32, arch, lengths, seed=6)
    fig.say(f"correct kimi: fp32 CPU targets in {time.perf_counter() - t:.1f} s")
    gpu = Eagle3Draft(arch, dict(weights), device, gpu_dtype)
    out: dict[str, Any] = {"logits": _logit_check(fp32, gpu, aux, ids, lens, scale.steps)}
    del gpu
    files = write_checkpoint(work / "kimi_small", arch, cpu_weights)
    data = write_dump(work / "kimi_small" / "data", samples)
    kw = {"ckpt": files / "draft", "data": data, "verifier": files / "target", "steps": scale.steps}
    t = time.perf_counter()
    gpu_report = _quiet_eval(device=device.type, out=work / "kimi_gpu", **kw)
    fig.say(f"correct kimi: evaluate() on {device.type} in {time.perf_counter() - t:.1f} s")
    t = time.perf_counter()
    cpu_report = _quiet_eval(device="cpu", out=work / "kimi_cpu", **kw)
    fig.say(f"correct kimi: evaluate() on cpu fp32 in {time.perf_counter() - t:.1f} s")
    out.update(_compare_reports(cpu_report, gpu_report))
    out["lengths"] = list(lengths)
    return out


def section_e2e(fig: Figures, device: torch.device, scale: de.Scale, work: Path, samples_n: int) -> None:
    """evaluate() from files on local disk, each phase timed, pruned and every-row."""
    arch = de.arch_for(scale)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    weights = de.synthetic_weights(arch, device, dtype, seed=7)
    gen_draft = Eagle3Draft(arch, dict(weights), device, dtype)
    t = time.perf_counter()
    samples = []
    for i in range(samples_n):  # targets = the draft's own step-0 predictions: step 1 then runs ~every row
        s, *_ = targeted_samples(gen_draft, arch, (scale.seq_len,), seed=100 + i)
        samples += s
    del gen_draft
    files = write_checkpoint(work / "kimi_e2e", arch, {n: t.cpu() for n, t in weights.items()})
    data = write_dump(work / "kimi_e2e" / "data", samples)
    del weights, samples
    size = sum(f.stat().st_size for f in data.glob("*.safetensors"))
    fig.say(f"e2e: wrote {samples_n} dumps ({size / 2**30:.2f} GiB) + checkpoint in {time.perf_counter() - t:.1f} s")
    res: dict[str, Any] = {"samples": samples_n, "seq_len": scale.seq_len, "dump_gib": size / 2**30}
    fig.data["e2e"] = res
    res["disk_direct_read_gbps"] = _direct_read(next(data.glob("*.safetensors")), fig)
    for prune in (True, False):
        phases, rows = _instrument(prune)
        t = time.perf_counter()
        try:
            report = _quiet_eval(ckpt=files / "draft", data=data, verifier=files / "target", device=device.type,
                                 out=work / f"e2e_{prune}", steps=scale.steps)
        finally:
            _restore()
        total = time.perf_counter() - t
        key = "pruned" if prune else "every_row"
        res[key] = {"total_s": total, "phases_s": phases, "rows_per_step": rows,
                    "verdict": report["verdict"]["status"], "report_seconds": report["run"]["seconds"],
                    "metrics_roles": [r for r in ("served", "best") if report["metrics"].get(r)]}
        fig.say(f"e2e {key}: {total:.1f} s total, phases {phases}, rows run per step {rows}, "
                f"verdict {report['verdict']['status']}, roles {res[key]['metrics_roles']}")
        fig.save()


_SAVED: dict[str, Any] = {}


def _instrument(prune: bool) -> tuple[dict[str, float], list[int]]:
    """Time evaluate()'s phases and count the rows its scoring runs (and force ``prune``)."""
    phases: dict[str, float] = {}
    rows: list[int] = []
    ev = evaluate_module
    _SAVED.update(scan=ev._scan, metrics=ev._metrics, load=ev._load, score=ev.score_batch)

    def timed_phase(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                phases[name] = phases.get(name, 0.0) + time.perf_counter() - t
        return wrapper

    def score(*a: Any, **k: Any) -> list[int]:
        done = _SAVED["score"](*a, **{**k, "prune": prune})
        for i, c in enumerate(done):
            rows.extend([0] * (i + 1 - len(rows)))
            rows[i] += c
        return done

    ev._scan, ev._metrics, ev._load = (timed_phase(n, _SAVED[n]) for n in ("scan", "metrics", "load"))
    ev.score_batch = score
    return phases, rows


def _restore() -> None:
    ev = evaluate_module
    ev._scan, ev._metrics, ev._load, ev.score_batch = (_SAVED[n] for n in ("scan", "metrics", "load", "score"))


def _direct_read(file: Path, fig: Figures) -> float | None:
    """GB/s of an O_DIRECT read of ``file`` (bypasses the page cache; None where refused)."""
    try:
        proc = subprocess.run(["dd", f"if={file}", "of=/dev/null", "bs=16M", "iflag=direct"],
                              capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        fig.say(f"e2e: dd failed: {exc}")
        return None
    fig.say(f"e2e: dd O_DIRECT: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}")
    if proc.returncode != 0:
        return None
    for part in proc.stderr.split(","):
        if "/s" in part:
            value, unit = part.split()[-2:]
            scale = {"GB/s": 1.0, "MB/s": 1e-3, "kB/s": 1e-6, "GiB/s": 1.074, "MiB/s": 1.049e-3}.get(unit)
            return float(value) * scale if scale else None
    return None


# -- summary ----------------------------------------------------------------------------------------------
def summary(fig: Figures) -> None:
    d = fig.data
    lines = ["", "==== summary ===="]
    if "env" in d:
        lines.append(f"machine: {d['env'].get('gpu', 'cpu')}, {d['env'].get('nvidia_smi', '')}, "
                     f"torch {d['env']['torch']}, "
                     f"CUDA {d['env']['cuda']}")
    if "probe" in d:
        lines.append(f"probe: draft GEMM mix {d['probe']['mix_tflops']:.1f} TFLOP/s; "
                     + ", ".join(f"{g['gemm']} {g['tflops']:.0f}" for g in d["probe"]["gemms"]))
    lines += [_variant_line(name, v) for name, v in d.get("throughput", {}).get("variants", {}).items()]
    for name, v in d.get("overlap", {}).items():
        if isinstance(v, dict):
            lines.append(f"overlap {name}: {v['seconds']:.3f} s ({v['tokens_per_s']:,.0f} tok/s)")
    if "naive" in d:
        lines.append(f"naive: {d['naive']['naive_tokens_per_s']:,.0f} tok/s, "
                     f"batched {d['naive']['batched_tokens_per_s']:,.0f}: "
                     f"{d['naive']['speedup']:.1f}x")
    lines += _correct_and_e2e_lines(d)
    fig.say("\n".join(lines))


def _variant_line(name: str, v: dict) -> str:
    if "error" in v:
        return f"{name}: ERROR {v['error']}"
    return (f"{name:48s} {v['tokens_per_s']:>10,.0f} tok/s {v['tflops']:7.1f} TFLOP/s "
            f"MFU {100 * v['mfu_probe']:5.1f}% probe"
            + (f" {100 * v['mfu_790']:5.1f}% of 790 {100 * v['mfu_989']:5.1f}% of 989" if "mfu_790" in v else "")
            + f" peak {v['peak_gib']:.1f} GiB")


def _correct_and_e2e_lines(d: dict) -> list[str]:
    lines = [f"correct {part}: {json.dumps(_brief(d['correct'][part]))}"
             for part in ("demo", "kimi") if part in d.get("correct", {})]
    for key in ("pruned", "every_row"):
        if key in d.get("e2e", {}):
            e = d["e2e"][key]
            lines.append(f"e2e {key}: {e['total_s']:.1f} s for {d['e2e']['samples']} samples; phases {e['phases_s']}")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    p.add_argument("--smoke", action="store_true", help="tiny shapes: checks the script end to end in seconds")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu_figures_out")))
    p.add_argument("--work", type=Path, help="scratch folder for the files (default: a temp dir)")
    p.add_argument("--baseline", type=Path, help="folder holding the remote/ package of the code before")
    p.add_argument("--demo", type=Path, help="a generated demo folder (for the demo correctness check)")
    p.add_argument("--sections", default="env,probe,throughput,profile,overlap,naive,correct,e2e")
    p.add_argument("--samples", type=int, help="synthetic samples for throughput (kimi default 32)")
    p.add_argument("--budgets", default="16384,32768,65536", help="batch token budgets to compare")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--naive-samples", type=int, default=2)
    p.add_argument("--e2e-samples", type=int, default=16)
    p.add_argument("--budget-s", type=float, default=420.0, help="seconds this run may take")
    p.add_argument("--threads", type=int, help="CPU threads for the fp32 reference")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                   help="also time a variant with torch.compile'd RMSNorm")
    args = p.parse_args()
    device = de.require_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    fig = Figures(args.out, args.budget_s)
    sections = args.sections.split(",")
    scale = SMOKE if args.smoke else replace(de.SCALES["kimi"], samples=args.samples or 32)
    if args.samples:
        scale = replace(scale, samples=args.samples)
    budgets = [int(b) for b in args.budgets.split(",")]
    if args.smoke:
        budgets = [96, 192]
    arch = de.arch_for(scale)
    base = load_baseline(args.baseline) if args.baseline else None
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu_figures_"))
    fig.say(f"device {device}, sections {sections}, scale {scale}, budgets {budgets}, work {work}, "
            f"baseline {'yes' if base else 'no'}")
    probe = 0.0
    state: tuple[Eagle3Draft, VerifierHead, list[Sample], int] | None = None

    def guarded(name: str, fn: Callable[[], Any]) -> Any:
        if name not in sections:
            return None
        fig.say(f"--- {name} ({fig.left():.0f} s left)")
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 (report and go on: the other sections still count)
            fig.data.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"
            fig.say(f"{name} FAILED: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
            return None
        finally:
            fig.save()

    guarded("env", lambda: section_env(fig, device))
    probe = guarded("probe", lambda: section_probe(fig, device, arch, budgets[0], args.smoke)) or 1.0
    state = guarded("throughput", lambda: section_throughput(fig, device, scale, probe, base, budgets, args.repeat,
                                                             args.compile))
    if state is not None:
        draft, head, samples, best = state
        guarded("profile", lambda: section_profile(fig, device, draft, head, samples, scale.steps, best))
        guarded("overlap", lambda: section_overlap(fig, device, draft, head, samples, scale.steps, best, probe))
        guarded("naive", lambda: section_naive(fig, device, draft, head, samples, scale.steps, best,
                                               args.naive_samples))
        del draft, head, samples, state
        if device.type == "cuda":
            torch.cuda.empty_cache()
    # 8 samples: the verdict's paired comparison is over samples, and its sign test needs at least 6
    # for significance at alpha 0.05 (fewer give UNKNOWN "inconclusive", not the known MISMATCH)
    lengths = (14, 13, 12, 11, 10, 9, 8, 7) if args.smoke else (64, 60, 56, 52, 48, 44, 40, 36)
    guarded("correct", lambda: section_correct(fig, device, args.demo, scale, work, lengths))
    e2e_scale = scale if args.smoke else replace(scale, seq_len=2048)
    guarded("e2e", lambda: section_e2e(fig, device, e2e_scale, work, 8 if args.smoke else args.e2e_samples))
    summary(fig)
    fig.save()


if __name__ == "__main__":
    main()
