"""The tune's answer: per concurrency the setting to use, held against the baseline and the configured K
by the comparison rule (draftops/comparison.py: the ratio's interval and a decision at a stated error
rate); vLLM's per-batch-size schedule and ``--speculative-config``; the concurrency from which
speculation is off; the acceptance profile held against one server's per-position counters."""
from __future__ import annotations

from typing import Any

from draftops import comparison
from draftops.documents.tune import Best, Point, Step
from draftops.errors import BenchError
from draftops.tune import grid, plan, predict, sglang, steps
from draftops.tune.context import Ctx
from draftops.tune.cost import fit

MAX_BATCH_DEFAULT = 48          # draftops' max running requests when the profile sets none (serve/request.py)


def _blocks(ctx: Ctx, run_id: str | None) -> comparison.Blocks | None:
    from draftops.bench import result as bench_result
    from draftops.bench import samples
    if not run_id:
        return None
    try:
        return samples.blocks(bench_result.load(ctx.runs_dir / run_id), "throughput")
    except BenchError as exc:
        ctx.warn(f"bench run {run_id} left out of the comparison: {exc}")
        return None


def _versus(ctx: Ctx, mine: Point, other: Point | None) -> dict[str, Any] | None:
    """``mine`` against ``other`` (run B against run A): the ratio, its 95% interval, the decision."""
    if other is None or other is mine:
        return None
    a, b = _blocks(ctx, other.bench_run), _blocks(ctx, mine.bench_run)
    if a is None or b is None:
        return None
    verdict = comparison.compare("throughput", a, b)
    return {**verdict.to_dict(), "against_k": other.k, "sentence": verdict.sentence()}


def _choose(ctx: Ctx, c: int, points: list[Point]) -> Best:
    """The predicted best at concurrency ``c``; a measured setting the rule says is faster replaces it."""
    here = [p for p in points if p.concurrency == c]
    pick = max(here, key=lambda p: (p.predicted_tok_s or 0.0, -p.k))
    measured = [p for p in here if p.measured_tok_s is not None]
    top = max(measured, key=lambda p: p.measured_tok_s or 0.0) if measured else None
    why = f"predicted fastest ({pick.predicted_tok_s:.0f} tok/s)"
    if top is not None and top is not pick and pick.measured_tok_s is not None:
        against = _versus(ctx, pick, top)
        if against is not None and against["decision"] == comparison.SLOWER:
            why = (f"measured faster than the predicted {_label(ctx, pick)}: "
                   f"{against['sentence']}")
            pick = top
    base = next((p for p in here if p.k == 0), None)
    conf = next((p for p in here if p.k == ctx.doc.configured_k and p.topk == 1), None)
    return Best(concurrency=c, k=pick.k, topk=pick.topk, draft_tokens=pick.draft_tokens,
                predicted_tok_s=pick.predicted_tok_s, measured_tok_s=pick.measured_tok_s,
                best_measured_k=top.k if top else None, best_measured_tok_s=top.measured_tok_s if top else None,
                vs_baseline=_versus(ctx, pick, base) if pick.k else None,
                vs_configured=_versus(ctx, pick, conf) if pick is not conf else None, why=why)


def _label(ctx: Ctx, p: Point) -> str:
    return grid.label(p.k, p.topk, p.draft_tokens, ctx.doc.engine)


def max_batch(ctx: Ctx) -> int:
    """The servers' max running requests (vLLM's max_num_seqs, as read back): no batch is larger."""
    for s in ctx.doc.steps:
        seqs = ((s.outcome or {}).get("effective") or {}).get("max_num_seqs")
        if isinstance(seqs, int) and seqs > 0:
            return seqs
    return MAX_BATCH_DEFAULT


def _schedule(ctx: Ctx, chosen: list[Best]) -> list[tuple[int, int, int]]:
    """Each batch size's best K on the cost refitted on every bench, the measured concurrencies held to
    their chosen setting; vLLM carries the last range to its max running requests."""
    args = ctx.doc.args
    cost = fit(steps._measured(ctx, steps.benches(ctx)))
    top = max_batch(ctx)
    ranges = predict.schedule(steps.the_profile(ctx), cost, range(1, args.max_steps + 1), top)
    per = {b: k for lo, hi, k in ranges for b in range(lo, hi + 1)}
    for row in chosen:
        if row.concurrency in per:
            per[row.concurrency] = row.k
        elif row.concurrency > top:
            note = (f"concurrency {row.concurrency} runs as batches of at most {top} (the servers' max running "
                    f"requests, vLLM's max_num_seqs): the per-batch-size schedule ends at {top}, and K={row.k} there "
                    f"is the best for the queue those {row.concurrency} requests make")
            if note not in ctx.doc.notes:
                ctx.doc.notes.append(note)
    out: list[tuple[int, int, int]] = []
    for b in sorted(per):
        if out and out[-1][2] == per[b]:
            out[-1] = (out[-1][0], b, per[b])
        else:
            out.append((b, b, per[b]))
    return out


def profile_check(ctx: Ctx) -> dict[str, Any] | None:
    """test-drafter's conditional acceptance per depth against the K_max server's own counters at the
    lowest concurrency: where the two part (bench/positions.py's rule)."""
    from draftops.bench.positions import compare_positions
    from draftops.bench.result import PerPosition
    k_max = ctx.doc.args.max_steps
    name = plan.measure(k_max)
    if not ctx.doc.has(name):
        return None
    rows = steps.serving.as_measured(ctx.doc.step(name))
    found = next(((c, b) for c, b in rows if b.get("per_position")), None)
    if found is None or not ctx.doc.profile:
        return None
    c, bench = found
    table = compare_positions(f"K={k_max} at concurrency {c}", str(bench.get("bench_run")),
                              PerPosition.model_validate(bench["per_position"]),
                              list(ctx.doc.profile.get("conditional") or []),
                              prediction_run=str(ctx.doc.profile.get("run")), role="served",
                              predicted_rows=list(ctx.doc.profile.get("rows") or []) or None)
    said = table.finding[2] if table.finding else "no position could be judged (too few drafts reached them)"
    return {"concurrency": c, "bench_run": bench.get("bench_run"), "rows": [r.__dict__ for r in table.rows],
            "differs_at": table.part.step if table.part else None, "text": said}


def answer(ctx: Ctx, step: Step) -> None:
    doc = ctx.doc
    chosen = [_choose(ctx, c, doc.points) for c in sorted(set(doc.args.concurrency))]
    doc.best = chosen
    doc.off_from = predict.off_from({b.concurrency: _as_prediction(b) for b in chosen})
    if doc.engine == "sglang":
        doc.engine_args = sglang.answer_args(
            [(b.concurrency, sglang.TreeSetting(b.k, b.topk, b.draft_tokens) if b.k else None) for b in chosen],
            doc.args.draft, ctx.host.name)
    else:
        _vllm_answer(ctx, chosen)
    doc.median_error = steps.median_error(doc.points)
    doc.profile_check = profile_check(ctx)
    step.outcome = {"median_error": doc.median_error, "median_error_check": steps.median_error(doc.points, "check"),
                    "off_from": doc.off_from}
    for b in chosen:
        ctx.say(f"  concurrency {b.concurrency}: {grid.label(b.k, b.topk, b.draft_tokens, doc.engine)} ({b.why})")
    ctx.say(f"  engine arguments: {(doc.engine_args or {}).get('line')}")


def _vllm_answer(ctx: Ctx, chosen: list[Best]) -> None:
    """vLLM's per-batch-size schedule and --speculative-config."""
    doc = ctx.doc
    ranges = _schedule(ctx, chosen)
    config = predict.speculative_config(ctx.draft_path(), ranges)
    doc.engine_args = {"engine": "vllm", "args": predict.engine_args(ctx.draft_path(), ranges),
                       "line": predict.engine_line(ctx.draft_path(), ranges), "speculative_config": config,
                       "schedule": [list(r) for r in ranges],
                       "per_concurrency": {str(b.concurrency): b.k for b in chosen},
                       "setting": "num_speculative_tokens_per_batch_size", "max_batch": max_batch(ctx),
                       "note": ("vLLM 0.32 reads num_speculative_tokens_per_batch_size (inclusive batch-size ranges, "
                                "K 0 = no speculation there; num_speculative_tokens caps them); it has no other "
                                "setting that turns speculation off above a batch size")}


def _as_prediction(b: Best) -> predict.Prediction:
    return predict.Prediction(b.concurrency, b.k, 1.0, b.predicted_tok_s or 0.0, 1.0, 1.0)
