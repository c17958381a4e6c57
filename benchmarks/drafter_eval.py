"""Benchmark: throughput and model FLOP utilisation of the drafter evaluation (remote/drafter).

Synthetic draft + synthetic dumps at a chosen scale, scored exactly as ``eval`` scores them (K-step
TTT forward, data and verifier targets, top-5).  Prints tokens/s (scored rows per second) and MFU
(matmul FLOPs of the rows actually computed / time / peak).  Two peers run on the same data when
asked (both default on CPU), and must reach the same accuracies:

* ``--naive``: a per-sample loop in the style of the seed's standalone script;
* ``--peer``: speculators 0.9.0's own ``Eagle3DraftModel`` forward, one sample per call (eager
  attention; when speculators is importable).  It is given every advantage: only its forward
  (the draft tokens of every step) is timed, not its loss, and counting uses our code.

The evaluator computes only what the verdict needs: a row whose steps so far all failed against
every target kind is not run at later steps (``--no-prune`` runs every row at every step: the
worst case, a draft that is always right).  A random synthetic draft is almost never right, so
with pruning its later steps cost almost nothing: both figures are printed.

    python benchmarks/drafter_eval.py                       # demo scale, CPU, naive comparison
    python benchmarks/drafter_eval.py --scale peer          # hidden 1024 vs speculators' forward
    python benchmarks/drafter_eval.py --scale kimi --device cuda --samples 16 --seq-len 2048

Kimi-K2 scale: hidden 7168, 3 aux slots (+ final), draft vocab 32,000, target vocab 163,840, one
layer of 56 heads x 128 with 8 KV heads, intermediate 18,432, 3 steps.  On CUDA the dumps sit in
pinned host memory and each batch is copied on a side stream while the previous one computes.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import speculators_peer  # noqa: E402
from remote.drafter.data.batching import Batch, background, collate, iter_batches, to_device  # noqa: E402
from remote.drafter.data.dumps import Sample  # noqa: E402
from remote.drafter.load.checkpoint import expected_shapes  # noqa: E402
from remote.drafter.model.draft import DraftArch, Eagle3Draft  # noqa: E402
from remote.drafter.model.rope import RopeSpec  # noqa: E402
from remote.drafter.scoring.metrics import StepCounts  # noqa: E402
from remote.drafter.scoring.score import VerifierHead, new_score, score_batch  # noqa: E402

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
    "peer": Scale(hidden=1024, heads=16, kv_heads=8, head_dim=64, intermediate=3072, layers=1, aux=3,
                  draft_vocab=8000, vocab=32000, steps=3, samples=64, seq_len=256),
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


def synthetic_samples(s: Scale, pin: bool, seed: int = 1, device: torch.device | None = None) -> list[Sample]:
    """Dumps in host memory: tokens, aux slots + a final slot, bf16 like real dumps (drawn on
    ``device`` when given: much faster than the CPU generator at Kimi scale)."""
    gen = torch.Generator(device or "cpu").manual_seed(seed)
    out = []
    for i in range(s.samples):
        hidden = torch.randn(s.seq_len, s.aux + 1, s.hidden, generator=gen, device=device,
                             dtype=torch.float32 if device is None else torch.bfloat16).to(torch.bfloat16)
        ids = torch.randint(0, s.vocab, (s.seq_len,), generator=gen, device=device)
        hidden, ids = hidden.cpu(), ids.cpu()
        out.append(Sample(ids, hidden.pin_memory() if pin else hidden, None, Path(f"synthetic_{i}")))
    return out


def synthetic_head(arch: DraftArch, device: torch.device, dtype: torch.dtype) -> VerifierHead:
    gen = torch.Generator(device).manual_seed(2)
    return VerifierHead(torch.ones(arch.hidden_size, device=device, dtype=dtype),
                        torch.randn(arch.draft_vocab_size, arch.hidden_size, generator=gen, device=device,
                                    dtype=dtype) * arch.hidden_size ** -0.5, 1e-5)


def aim_verifier_targets(draft: Eagle3Draft, head: VerifierHead, samples: list[Sample]) -> None:
    """Rewrite each sample's final slot so that the verifier target of every row is the draft's
    own step-0 prediction (the head's rows are near-orthogonal random vectors, so
    argmax(rows . norm(rows[d])) = d): a draft that is always right at step 0, and at later steps
    as often as chance.  Real drafts lie between this and random targets."""
    final = draft.arch.num_aux
    with torch.inference_mode():
        for s in samples:
            batch = collate([s])
            pred = next(draft.iter_steps(batch.aux(list(range(final))).to(draft.device), batch.input_ids, 1))
            s.hidden[1:, final] = head.rows[pred[0].argmax(-1)].to(s.hidden.dtype).cpu()


# -- FLOPs ------------------------------------------------------------------------------------------
def _macs(arch: DraftArch, seq_len: int) -> dict[str, float]:
    """Multiply-adds per row: fc (once), one TTT step's dense work, causal attention per step
    (mean (n+1)/2 keys, QK and PV), one diagonal key per later step, the verifier head (once)."""
    h, hd, a = arch.hidden_size, arch.head_dim, arch
    proj = lambda width: width * (a.num_heads + 2 * a.num_kv_heads) * hd + a.num_heads * hd * h  # noqa: E731
    mlp = 3 * h * a.intermediate_size
    step = proj(2 * h) + mlp + (a.num_layers - 1) * (proj(h) + mlp) + h * a.draft_vocab_size
    return {"fc": a.num_aux * a.aux_hidden_size * h, "step": step,
            "attn": a.num_layers * 2 * a.num_heads * hd * (seq_len + 1) / 2,
            "diag": a.num_layers * 2 * a.num_heads * hd, "verifier": h * a.draft_vocab_size}


def forward_flops(arch: DraftArch, steps: int, seq_len: int) -> float:
    """FLOPs per row when every row runs every step (2 per multiply-add)."""
    m = _macs(arch, seq_len)
    per_step = sum(m["step"] + m["attn"] + k * m["diag"] for k in range(steps))
    return 2.0 * (m["fc"] + m["verifier"] + per_step)


def executed_flops(arch: DraftArch, seq_len: int, grid_rows: int, computed: list[int]) -> float:
    """FLOPs of a run: fc, verifier head and causal attention on every row of the padded grid,
    dense step work and diagonal keys on the rows computed at each step."""
    m = _macs(arch, seq_len)
    macs = grid_rows * (m["fc"] + m["verifier"] + len(computed) * m["attn"])
    macs += sum(c * (m["step"] + k * m["diag"]) for k, c in enumerate(computed))
    return 2.0 * macs


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


# -- the paths being timed ----------------------------------------------------------------------------
Accs = dict[str, list[float | None]]


@dataclass
class Run:
    """One timed pass: wall seconds, scored rows, accuracies, executed FLOPs, peak device memory."""

    seconds: float
    rows: int
    accs: Accs
    flops: float = 0.0
    peak_bytes: int = 0
    computed: list[int] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.rows / self.seconds


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _accs(data: StepCounts, verifier: StepCounts | None) -> Accs:
    return {"data": data.full_acc(), "verifier": verifier.full_acc() if verifier else [],
            "top5": [data.to_dict()["top5_acc_0"]]}


def device_batches(samples: list[Sample], budget: int, device: torch.device) -> list[Batch]:
    """All batches collated and already on ``device`` (to time the forward without any copy)."""
    return [b.to(device) for b in iter_batches(samples.__getitem__, range(len(samples)), budget)]


def run_fast(draft: Eagle3Draft, head: VerifierHead, samples: list[Sample], steps: int, budget: int,
             device: torch.device, prune: bool = True, preloaded: list[Batch] | None = None) -> Run:
    """The evaluator's path: padded batches, background reads, async device copies (or batches
    already on the device, ``preloaded``)."""
    score = new_score([0, 1, 2], steps, True)
    rows = grid = 0
    computed = [0] * steps
    final = draft.arch.num_aux
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    _sync(device)
    start = time.perf_counter()
    with torch.inference_mode():
        if preloaded is None:
            host = iter_batches(samples.__getitem__, range(len(samples)), budget, pin=device.type == "cuda")
            batches: Any = to_device(background(host), device)
        else:
            batches = preloaded
        for batch in batches:
            done = score_batch(draft, batch, score, steps, head.targets(batch.final(final)), prune=prune)
            computed = [c + d for c, d in zip(computed, done + [0] * steps, strict=False)]
            rows += int(batch.lengths.sum())
            grid += batch.input_ids.numel()
    _sync(device)
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    seq = max(s.token_ids.shape[0] for s in samples) - 1
    return Run(seconds, rows, _accs(score.data, score.verifier),
               executed_flops(draft.arch, seq, grid, [c for c in computed if c]), peak, computed)


def run_naive(draft: Eagle3Draft, head: VerifierHead, samples: list[Sample], steps: int) -> Run:
    """Per-sample loop in the style of the seed's standalone script: one sample at a time,
    the K-step chain re-run from scratch for each k, and per-position scoring in Python.
    It computes the same numbers as the batched path (checked by the caller)."""
    right = {"data": [0] * steps, "verifier": [0] * steps}
    total = {"data": [0] * steps, "verifier": [0] * steps}
    top5 = [0, 0]
    rows = 0
    d2t = draft.d2t.tolist()
    dev = draft.device
    _sync(dev)
    start = time.perf_counter()
    with torch.no_grad():
        for s in samples:
            aux = s.hidden[:-1, :3].to(dev, draft.dtype).flatten(1)[None]
            ids = s.token_ids[1:][None]
            tokens = s.token_ids.tolist()
            targets = head.targets(s.hidden[1:, 3].to(dev)).tolist()
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
    _sync(dev)
    accs: Accs = {kind: [r / t if t else None for r, t in zip(right[kind], total[kind], strict=True)] for kind in right}
    accs["top5"] = [top5[0] / top5[1]]
    return Run(time.perf_counter() - start, rows, accs)


# -- speculators' own forward as the peer -----------------------------------------------------------
def speculators_model(arch: DraftArch, weights: dict[str, torch.Tensor]) -> Any | None:
    """speculators 0.9.0's Eagle3DraftModel with ``weights`` (eager attention, fp32, eval), or
    None when speculators/transformers are not importable."""
    if not speculators_peer.available():
        return None
    Eagle3DraftModel, Eagle3SpeculatorConfig = speculators_peer.import_eagle3()  # noqa: N806

    tlc = {"model_type": "llama", "hidden_size": arch.hidden_size, "intermediate_size": arch.intermediate_size,
           "num_hidden_layers": arch.num_layers, "num_attention_heads": arch.num_heads,
           "num_key_value_heads": arch.num_kv_heads, "head_dim": arch.head_dim, "hidden_act": "silu",
           "rms_norm_eps": arch.rms_norm_eps, "vocab_size": arch.vocab_size, "max_position_embeddings": 4096,
           "rope_parameters": {"rope_type": "default", "rope_theta": arch.rope.theta}}
    cfg = Eagle3SpeculatorConfig(
        transformer_layer_config=tlc, draft_vocab_size=arch.draft_vocab_size,
        eagle_aux_hidden_state_layer_ids=list(range(arch.num_aux)),
        speculators_config={"algorithm": "eagle3", "default_proposal_method": "greedy",
                            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                            "verifier": {"architectures": ["LlamaForCausalLM"], "name_or_path": None}})
    cfg.transformer_layer_config._attn_implementation = "eager"
    model = Eagle3DraftModel(cfg).eval()
    state = {n: t.float().cpu() for n, t in weights.items() if n != "d2t"}
    state["d2t"] = weights["d2t"].cpu()
    state["t2d"] = torch.zeros(arch.vocab_size, dtype=torch.bool).index_fill_(
        0, torch.arange(arch.draft_vocab_size) + state["d2t"], True)
    model.load_state_dict(state, strict=False)
    return model


def run_peer(model: Any, draft: Eagle3Draft, head: VerifierHead, samples: list[Sample], steps: int) -> Run:
    """speculators' forward, one sample per call (its packed-sequence mask is dense under eager
    attention); the verifier targets and the counting are ours, on the draft tokens it returns."""
    score = new_score([0, 1, 2], steps, True)
    rows = 0
    final = draft.arch.num_aux
    start = time.perf_counter()
    with torch.inference_mode():
        for s in samples:
            batch = collate([s])
            n = batch.input_ids.shape[1]
            tokens = model(hidden_states=batch.aux([0, 1, 2]).float(), input_ids=batch.input_ids,
                           document_ids=torch.zeros(1, n, dtype=torch.long), ttt_steps=steps)
            targets = head.targets(batch.final(final))
            has_next = batch.scored & (batch.next_ids >= 0)
            score.data.update([draft.draft_to_target(t) for t in tokens], batch.next_ids, has_next)
            score.verifier.update(list(tokens), targets, batch.scored)  # type: ignore[union-attr]
            rows += n
    return Run(time.perf_counter() - start, rows, _accs(score.data, score.verifier))


def _same(a: Accs, b: Accs, kinds: tuple[str, ...] = ("data", "verifier")) -> bool:
    return all(abs((x or 0) - (y or 0)) <= 1e-9 for kind in kinds for x, y in zip(a[kind], b[kind], strict=True))


def _fmt(accs: list[float | None]) -> str:
    return "[" + ", ".join("n/a" if a is None else f"{a:.3f}" for a in accs) + "]"


def require_device(name: str) -> torch.device:
    """The torch device for ``--device``; exits with one line when CUDA is asked for but absent."""
    if name == "cuda" and not torch.cuda.is_available():
        why = "torch is a CPU-only build" if torch.version.cuda is None else "no GPU is visible"
        raise SystemExit(f"drafter_eval: --device cuda needs a CUDA GPU, but {why} (torch {torch.__version__}); "
                         "run with --device cpu")
    return torch.device(name)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", choices=sorted(SCALES), default="demo")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    for name in Scale.__dataclass_fields__:
        p.add_argument("--" + name.replace("_", "-"), type=int, help=f"override the scale's {name}")
    p.add_argument("--batch-tokens", type=int, help="padded tokens per forward (8192 CPU / 16384 GPU)")
    p.add_argument("--peak-tflops", type=float, help="peak for MFU (default: GPU table / CPU probe)")
    p.add_argument("--naive", action=argparse.BooleanOptionalAction, default=None,
                   help="also time the per-sample loop (default: on for CPU)")
    p.add_argument("--peer", action=argparse.BooleanOptionalAction, default=None,
                   help="also time speculators' own forward (default: on for CPU when importable)")
    p.add_argument("--prune", action=argparse.BooleanOptionalAction, default=True,
                   help="skip rows whose chain already failed (--no-prune: every row, every step)")
    p.add_argument("--targets", choices=("random", "draft"), default="random",
                   help="verifier targets: random (a draft that is never right), or the draft's own step-0 "
                        "predictions (always right at step 0)")
    p.add_argument("--repeat", type=int, default=3, help="timed runs of each path; the best is reported")
    return p


def main() -> None:
    args = build_parser().parse_args()
    scale = replace(SCALES[args.scale], **{f: getattr(args, f) for f in Scale.__dataclass_fields__
                                           if getattr(args, f) is not None})
    device = require_device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    arch = arch_for(scale)
    draft = Eagle3Draft(arch, synthetic_weights(arch, device, dtype), device, dtype)
    head = synthetic_head(arch, device, dtype)
    samples = synthetic_samples(scale, pin=device.type == "cuda",
                                device=device if device.type == "cuda" else None)
    if args.targets == "draft":
        aim_verifier_targets(draft, head, samples)
    budget = args.batch_tokens or (16384 if device.type == "cuda" else 8192)
    peak, peak_src = _peak(device, args.peak_tflops)
    print(f"scale {args.scale}: {scale}")
    print(f"device {device} ({torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}), "
          f"dtype {str(dtype).replace('torch.', '')}, batch tokens {budget}, threads {torch.get_num_threads()}, "
          f"prune {args.prune}, verifier targets {args.targets}")
    print(f"model FLOPs per row, every step: {forward_flops(arch, scale.steps, scale.seq_len) / 1e6:.2f} MFLOP; "
          f"peak {peak / 1e12:.3f} TFLOP/s ({peak_src})")
    run_fast(draft, head, samples[: max(1, len(samples) // 8)], scale.steps, budget, device)  # warm-up
    with_naive = args.naive if args.naive is not None else device.type == "cpu"
    peer_model = None
    if args.peer is not False and device.type == "cpu":
        peer_model = speculators_model(arch, draft.w)
        if peer_model is None and args.peer:
            raise SystemExit("drafter_eval: --peer needs speculators==0.9.0 and transformers "
                             "(scripts/setup.sh --test installs them)")
    if with_naive:
        naive_draft = Eagle3Draft(arch, {n: t.float() for n, t in draft.w.items()}, device, torch.float32)
        naive_head = VerifierHead(head.norm.float(), head.rows.float(), head.eps)
    runs: dict[str, list[Run]] = {"batched": [], "naive": [], "speculators": []}
    for _ in range(args.repeat):  # interleaved, best of each: all see the same machine load
        runs["batched"].append(run_fast(draft, head, samples, scale.steps, budget, device, args.prune))
        if with_naive:
            runs["naive"].append(run_naive(naive_draft, naive_head, samples, scale.steps))
        if peer_model is not None:
            runs["speculators"].append(run_peer(peer_model, draft, head, samples, scale.steps))
    _print_runs(runs, peak, device)


def _peak(device: torch.device, peak_tflops: float | None) -> tuple[float, str]:
    """The peak FLOP/s the MFU is taken against, and where that figure came from."""
    if device.type == "cuda":
        return gpu_peak_flops(peak_tflops)
    if peak_tflops:
        return peak_tflops * 1e12, "--peak-tflops"
    return cpu_peak_flops(), "measured fp32 matmul probe"


def _print_runs(runs: dict[str, list[Run]], peak: float, device: torch.device) -> None:
    """The best batched run, then each peer's best against it (their accuracies must agree on CPU)."""
    fast = min(runs["batched"], key=lambda r: r.seconds)
    print(f"batched : {fast.rows} rows in {fast.seconds:.3f} s = {fast.tokens_per_s:,.0f} tokens/s, "
          f"MFU {100 * fast.flops / fast.seconds / peak:.2f}% (rows run per step {fast.computed}), "
          f"verifier full_acc {_fmt(fast.accs['verifier'])}")
    for name in ("naive", "speculators"):
        if not runs[name]:
            continue
        other = min(runs[name], key=lambda r: r.seconds)
        print(f"{name:<8}: {other.rows} rows in {other.seconds:.3f} s = {other.tokens_per_s:,.0f} tokens/s, "
              f"verifier full_acc {_fmt(other.accs['verifier'])}")
        print(f"speed-up over {name}: {fast.tokens_per_s / other.tokens_per_s:.2f}x")
        if device.type == "cpu" and not _same(fast.accs, other.accs):
            raise SystemExit(f"batched and {name} accuracies differ ({fast.accs} vs {other.accs}): "
                             "the benchmark is not comparing like with like")


if __name__ == "__main__":
    main()
