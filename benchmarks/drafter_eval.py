"""Benchmark: throughput and model FLOP utilisation of the drafter evaluation (remote/drafter).

Synthetic draft + synthetic dumps at a chosen scale, scored exactly as ``eval`` scores them (K-step
TTT forward, data and verifier targets, top-5).  Prints tokens/s (scored rows per second) and MFU
(matmul FLOPs of the forward / time / peak).  With ``--naive`` (default on CPU) it also runs a
per-sample fp32 loop in the style of the seed's standalone script, on the same data, checks that
both give the same accuracy, and prints the speed-up.

    python benchmarks/drafter_eval.py                       # demo scale, CPU, naive comparison
    python benchmarks/drafter_eval.py --scale kimi --device cuda --samples 16 --seq-len 2048

Kimi-K2 scale: hidden 7168, 3 aux slots (+ final), draft vocab 32,000, target vocab 163,840, one
layer of 56 heads x 128 with 8 KV heads, intermediate 18,432, 3 steps.  On CUDA the dumps sit in
pinned host memory and each batch is copied on a side stream while the previous one computes.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from remote.drafter.batching import background, iter_batches, to_device  # noqa: E402
from remote.drafter.checkpoint import expected_shapes  # noqa: E402
from remote.drafter.data import Sample  # noqa: E402
from remote.drafter.model import DraftArch, Eagle3Draft  # noqa: E402
from remote.drafter.rope import RopeSpec  # noqa: E402
from remote.drafter.scoring import VerifierHead, new_score, score_batch  # noqa: E402

PEAK_TFLOPS = {  # dense bf16 tensor-core peaks (no sparsity)
    "H200": 989.0, "H100": 989.0, "H800": 989.0, "A100": 312.0, "A800": 312.0, "L40S": 362.0,
    "L40": 181.0, "RTX 6000 Ada": 364.0, "RTX PRO 6000": 504.0, "B200": 2250.0, "GB200": 2500.0,
    "A10": 125.0, "L4": 121.0, "RTX 4090": 165.0, "RTX 5090": 210.0,
}


@dataclass(frozen=True)
class Scale:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    layers: int
    aux: int
    draft_vocab: int
    vocab: int
    steps: int
    samples: int
    seq_len: int


SCALES = {
    "demo": Scale(hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=512, layers=1, aux=3,
                  draft_vocab=48, vocab=64, steps=3, samples=256, seq_len=40),
    "kimi": Scale(hidden=7168, heads=56, kv_heads=8, head_dim=128, intermediate=18432, layers=1, aux=3,
                  draft_vocab=32000, vocab=163840, steps=3, samples=16, seq_len=2048),
}


def arch_for(s: Scale) -> DraftArch:
    return DraftArch(hidden_size=s.hidden, num_heads=s.heads, num_kv_heads=s.kv_heads, head_dim=s.head_dim,
                     intermediate_size=s.intermediate, num_layers=s.layers, num_aux=s.aux,
                     aux_hidden_size=s.hidden, draft_vocab_size=s.draft_vocab, vocab_size=s.vocab,
                     rms_norm_eps=1e-5, rope=RopeSpec(), norm_before_residual=False, norm_output=False,
                     norm_before_fc=False, fc_norm=False, qk_norm=False,
                     sliding_windows=(None,) * s.layers)


def synthetic_weights(arch: DraftArch, device: torch.device, dtype: torch.dtype,
                      seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights of every shape the forward reads, made directly on ``device``."""
    gen = torch.Generator(device).manual_seed(seed)
    out = {}
    for name, shape in expected_shapes(arch).items():
        if name == "d2t":
            keep = torch.randperm(arch.vocab_size, generator=gen, device=device)[: arch.draft_vocab_size]
            out[name] = keep.sort().values - torch.arange(arch.draft_vocab_size, device=device)
        elif len(shape) == 1:
            out[name] = torch.ones(shape, device=device, dtype=dtype)
        else:
            out[name] = (torch.randn(shape, generator=gen, device=device, dtype=dtype) * shape[-1] ** -0.5)
    return out


def synthetic_samples(s: Scale, pin: bool, seed: int = 1) -> list[Sample]:
    """Dumps in host memory: tokens, aux slots + a final slot, bf16 like real dumps."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(s.samples):
        hidden = torch.randn(s.seq_len, s.aux + 1, s.hidden, generator=gen).to(torch.bfloat16)
        ids = torch.randint(0, s.vocab, (s.seq_len,), generator=gen)
        out.append(Sample(ids, hidden.pin_memory() if pin else hidden, None, Path(f"synthetic_{i}")))
    return out


def forward_flops(arch: DraftArch, steps: int, seq_len: int) -> float:
    """Matmul FLOPs per scored row for ``steps`` TTT steps (2 per multiply-add).

    fc once; per step: q/k/v/o, MLP and lm_head of every layer, attention over the causal prefix
    (mean (n+1)/2 keys) plus the row's own earlier steps; plus the verifier head once."""
    h, hd, a = arch.hidden_size, arch.head_dim, arch
    proj = lambda width: width * (a.num_heads + 2 * a.num_kv_heads) * hd + a.num_heads * hd * h  # noqa: E731
    per_layer_mlp = 3 * h * a.intermediate_size
    dense = proj(2 * h) + per_layer_mlp + (a.num_layers - 1) * (proj(h) + per_layer_mlp) + h * a.draft_vocab_size
    attn = sum(2 * a.num_heads * hd * ((seq_len + 1) / 2 + k) * a.num_layers for k in range(steps))
    fc = a.num_aux * a.aux_hidden_size * h
    return 2.0 * (fc + steps * dense + attn + h * a.draft_vocab_size)


def cpu_peak_flops(dtype: torch.dtype = torch.float32) -> float:
    """Measured matmul FLOP/s of this CPU (best of a few 1024^3 products): the attainable peak."""
    x = torch.randn(1024, 1024, dtype=dtype)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        x @ x
        best = min(best, time.perf_counter() - t)
    return 2 * 1024**3 / best


def gpu_peak_flops(override: float | None) -> tuple[float, str]:
    if override:
        return override * 1e12, "--peak-tflops"
    name = torch.cuda.get_device_name()
    for key, tflops in PEAK_TFLOPS.items():
        if key.lower() in name.lower():
            return tflops * 1e12, f"table ({key})"
    raise SystemExit(f"unknown GPU {name!r}: pass --peak-tflops")


Accs = dict[str, list[float | None]]


def run_fast(draft: Eagle3Draft, head: VerifierHead, samples: list[Sample], steps: int, budget: int,
             device: torch.device) -> tuple[float, int, Accs]:
    """The evaluator's path: padded batches, background reads, async device copies."""
    score = new_score([0, 1, 2], steps, True)
    rows = 0
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    with torch.inference_mode():
        host = iter_batches(samples.__getitem__, range(len(samples)), budget, pin=device.type == "cuda")
        batches = to_device(background(host), device)
        for batch in batches:
            score_batch(draft, batch, score, steps, head.targets(batch.final(3)))
            rows += int(batch.lengths.sum())
    sync()
    accs = {"data": score.data.full_acc(), "verifier": score.verifier.full_acc(),
            "top5": [score.data.to_dict()["top5_acc_0"]]}
    return time.perf_counter() - start, rows, accs


def run_naive(draft: Eagle3Draft, head: VerifierHead, samples: list[Sample], steps: int
              ) -> tuple[float, int, Accs]:
    """Per-sample fp32 loop in the style of the seed's standalone script: one sample at a time,
    the K-step chain re-run from scratch for each k, and per-position scoring in Python.
    It computes the same numbers as the batched path (checked by the caller)."""
    right = {"data": [0] * steps, "verifier": [0] * steps}
    total = {"data": [0] * steps, "verifier": [0] * steps}
    top5 = [0, 0]
    rows = 0
    d2t = draft.d2t.tolist()
    start = time.perf_counter()
    with torch.no_grad():
        for s in samples:
            aux = s.hidden[:-1, :3].float().flatten(1)[None]
            ids = s.token_ids[1:][None]
            tokens = s.token_ids.tolist()
            targets = head.targets(s.hidden[1:, 3].float()).tolist()
            n = ids.shape[1]
            alive = {"data": [True] * n, "verifier": [True] * n}
            for k in range(steps):
                logits = draft.forward(aux, ids, k + 1)[-1][0]
                for t in range(n - k):
                    pred = int(logits[t].argmax())
                    if k == 0 and t + 2 < len(tokens):
                        top5[0] += any(d + d2t[d] == tokens[t + 2] for d in logits[t].topk(5).indices.tolist())
                        top5[1] += 1
                    for kind, want, valid in (("verifier", targets[t + k], True),
                                              ("data", tokens[t + k + 2] if t + k + 2 < len(tokens) else -1,
                                               t + k + 2 < len(tokens))):
                        ok = alive[kind][t] and (pred + d2t[pred] if kind == "data" else pred) == want
                        alive[kind][t] = ok
                        if valid:
                            right[kind][k] += ok
                            total[kind][k] += 1
            rows += n
    accs = {kind: [r / t if t else None for r, t in zip(right[kind], total[kind])] for kind in right}
    accs["top5"] = [top5[0] / top5[1]]
    return time.perf_counter() - start, rows, accs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", choices=sorted(SCALES), default="demo")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    for field in Scale.__dataclass_fields__:
        p.add_argument("--" + field.replace("_", "-"), type=int, help=f"override the scale's {field}")
    p.add_argument("--batch-tokens", type=int, help="padded tokens per forward (8192 CPU / 16384 GPU)")
    p.add_argument("--peak-tflops", type=float, help="peak for MFU (default: GPU table / CPU probe)")
    p.add_argument("--naive", action=argparse.BooleanOptionalAction, default=None,
                   help="also time the per-sample loop (default: on for CPU)")
    p.add_argument("--repeat", type=int, default=3, help="timed runs of each path; the best is reported")
    args = p.parse_args()
    scale = replace(SCALES[args.scale], **{f: getattr(args, f) for f in Scale.__dataclass_fields__
                                           if getattr(args, f) is not None})
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    arch = arch_for(scale)
    draft = Eagle3Draft(arch, synthetic_weights(arch, device, dtype), device, dtype)
    head_gen = torch.Generator(device).manual_seed(2)
    head = VerifierHead(torch.ones(arch.hidden_size, device=device, dtype=dtype),
                        torch.randn(arch.draft_vocab_size, arch.hidden_size, generator=head_gen, device=device,
                                    dtype=dtype) * arch.hidden_size ** -0.5, 1e-5)
    samples = synthetic_samples(scale, pin=device.type == "cuda")
    budget = args.batch_tokens or (16384 if device.type == "cuda" else 8192)
    if device.type == "cuda":
        peak, peak_src = gpu_peak_flops(args.peak_tflops)
    else:
        peak, peak_src = (args.peak_tflops * 1e12, "--peak-tflops") if args.peak_tflops else \
            (cpu_peak_flops(), "measured fp32 matmul probe")
    flops_row = forward_flops(arch, scale.steps, scale.seq_len)
    print(f"scale {args.scale}: {scale}")
    print(f"device {device} ({torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}), "
          f"dtype {str(dtype).replace('torch.', '')}, batch tokens {budget}, threads {torch.get_num_threads()}")
    print(f"model FLOPs per scored row: {flops_row / 1e6:.2f} MFLOP; peak {peak / 1e12:.3f} TFLOP/s ({peak_src})")
    run_fast(draft, head, samples[: max(1, len(samples) // 8)], scale.steps, budget, device)  # warm-up
    with_naive = args.naive if args.naive is not None else device.type == "cpu"
    if with_naive:
        naive_draft = Eagle3Draft(arch, {n: t.float() for n, t in draft.w.items()}, device, torch.float32)
        naive_head = VerifierHead(head.norm.float(), head.rows.float(), head.eps)
    fast_runs, naive_runs = [], []
    for _ in range(args.repeat):  # interleaved, best of each: both see the same machine load
        fast_runs.append(run_fast(draft, head, samples, scale.steps, budget, device))
        if with_naive:
            naive_runs.append(run_naive(naive_draft, naive_head, samples, scale.steps))
    fast = min(fast_runs, key=lambda r: r[0])
    fast_tps = fast[1] / fast[0]
    print(f"batched : {fast[1]} rows in {fast[0]:.3f} s = {fast_tps:,.0f} tokens/s, "
          f"MFU {100 * fast_tps * flops_row / peak:.2f}%, verifier full_acc {_fmt(fast[2]['verifier'])}")
    if with_naive:
        naive = min(naive_runs, key=lambda r: r[0])
        naive_tps = naive[1] / naive[0]
        print(f"naive   : {naive[1]} rows in {naive[0]:.3f} s = {naive_tps:,.0f} tokens/s, "
              f"verifier full_acc {_fmt(naive[2]['verifier'])}")
        print(f"speed-up: {fast_tps / naive_tps:.1f}x")
        if device.type == "cpu" and any(abs((a or 0) - (b or 0)) > 1e-9 for kind in naive[2]
                                        for a, b in zip(fast[2][kind], naive[2][kind])):
            raise SystemExit(f"batched and naive accuracies differ ({fast[2]} vs {naive[2]}): "
                             "the benchmark is not comparing like with like")


def _fmt(accs: list[float | None]) -> str:
    return "[" + ", ".join("n/a" if a is None else f"{a:.3f}" for a in accs) + "]"


if __name__ == "__main__":
    main()
