"""The doctor's last step: bench.compare of the baseline with the draft as served and as fixed."""
from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any

from draftops import cmdline, history, records
from draftops.doctor import plan
from draftops.doctor.context import TOLERANCE, Ctx, ran
from draftops.doctor.state import Step
from draftops.errors import DoctorError
from draftops.runs import jobs


def compare(ctx: Ctx, step: Step) -> None:
    """`invoke bench.compare` of the baseline with the draft as served and with the fixed draft."""
    from draftops import comparison
    from draftops.bench import compare as comparing
    from draftops.bench import outputs, result, samples
    hist = history.for_project(ctx.host.project_root)
    runs = {role: ctx.state.step(role).outcome.get("bench_run") for role in plan.SERVED_STEPS if ctx.state.has(role)}
    base = runs.get(plan.BASELINE)
    if not base:
        raise DoctorError("no baseline bench to compare with (the baseline step recorded none); run the doctor "
                          "again with --fresh.")
    loaded = {role: result.load(ctx.runs_dir / str(run)) for role, run in runs.items() if run}
    out: dict[str, Any] = {}
    for role in (plan.AS_SERVED, plan.FIXED):
        if role not in loaded:
            continue
        a, b = loaded[plan.BASELINE], loaded[role]
        extra = ctx.state.step(role).outcome.get("extra_bench_run")
        if extra:                    # the serve step's extra repeats (serving._decide_more): one run B
            b = samples.merged(b, result.load(ctx.runs_dir / str(extra)))
        predictions = {r.run_id: comparing.find_prediction(hist, r) for r in (a, b)}
        current = {r.run_id: comparing.current_config(hist, r) for r in (a, b)}
        cmp = comparing.compare(a, b, predictions, TOLERANCE, current, alpha=comparison.look_alpha())
        run_id = jobs.new_run_id("bench-compare")
        outputs.write(cmp, ctx.runs_dir / run_id)
        records.keep(ctx.host.project_root, "this comparison", partial(_compare_record, cmp, run_id), ctx.warn)
        ran(step, run_id)
        step.commands.append(cmdline.command("bench.compare", "--run-a", a.run_id, "--run-b", b.run_id,
                                             host=ctx.host.name))
        pred = predictions.get(b.run_id)
        measured = b.accept_length.value if b.accept_length else None
        out[role] = {"run_id": run_id, "a": a.run_id, "b": b.run_id, "speedup": cmp.speedup, "noise": cmp.noise,
                     "within_noise": cmp.within_noise, "speed_text": cmp.speed_text(),
                     "throughput": cmp.speed.to_dict() if cmp.speed else None,
                     "decision": cmp.speed.decision if cmp.speed else None, "extra_bench_run": extra,
                     "measured": measured, "predicted": pred.value if pred else None,
                     "predicted_role": pred.role if pred else None,
                     "within_tolerance": (measured is not None and pred is not None
                                          and abs(measured - pred.value) <= TOLERANCE * pred.value),
                     "findings": [dataclasses.asdict(f) for f in cmp.findings],
                     "per_position": [t.to_dict() for t in cmp.positions if t.run_id == b.run_id]}
        ctx.progress(f"  {role}: measured {_num(measured)} vs predicted {_num(pred.value if pred else None)}; "
                     f"throughput vs baseline {cmp.speed_text()}")
    step.outcome = {"tolerance": TOLERANCE, **out}


def _compare_record(cmp: Any, run_id: str, rev: str | None) -> history.RunRecord:
    from draftops.bench import compare as comparing
    return comparing.compare_record(cmp, run_id, git_rev=rev)


def _num(value: float | None) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) else "—"
