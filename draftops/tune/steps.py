"""A tune's steps: the acceptance profile (test-drafter unrolled to K_max), the measuring servers, the
prediction (the cost fitted, every K at every concurrency), the confirming servers and the answer."""
from __future__ import annotations

import statistics
from typing import Any

from draftops import records
from draftops.documents.tune import Point, Step
from draftops.errors import TuneError
from draftops.runs import jobs
from draftops.runs.tools import run_tool
from draftops.serve.host_engine import host_engine
from draftops.serve.request import demo_dir
from draftops.tune import acceptance, grid, plan, predict, serving
from draftops.tune.context import Ctx, ran
from draftops.tune.cost import Measured, RoundCost, fit
from draftops.tune.profile import AcceptanceProfile


def profile(ctx: Ctx, step: Step, seen: dict[str, float]) -> None:
    """`invoke test-drafter --steps K_max` (the full pass): conditional acceptance per depth."""
    from draftops.documents.drafter_report import DrafterReport
    host, args = ctx.host, ctx.doc.args
    tool_args = ["eval", "--out", jobs.RUN_DIR, "--steps", str(args.max_steps), "--device", "auto", "--full",
                 *host_engine(host).eval_args()]
    if not ctx.demo:
        tool_args += ["--ckpt", args.draft, "--data", str(args.data)]
    given = {"ckpt": None if ctx.demo else args.draft, "data": None if ctx.demo else args.data,
             "steps": args.max_steps, "full": True, "tune": ctx.doc.tune_id}
    done = run_tool(host, "remote.drafter", tool_args, name="test-drafter", view=ctx.tracker, task="test-drafter",
                    given=given, env={"DRAFTOPS_DEMO_DIR": demo_dir(host.state_dir)})
    ran(step, done.run_id)
    report = done.document(DrafterReport) if done.ok else None
    records.keep(host.project_root, f"run {done.run_id}",
                 lambda rev: records.test_drafter_record(done.run_id, done.host, done.final, report, given,
                                                         git_rev=rev, config_digest=None), ctx.warn)
    done.check()
    found = acceptance.from_report(report) if report is not None else None
    if report is None or found is None:
        raise TuneError(f"test-drafter run {done.run_id} gave no per-position acceptance (metrics.served.*.cond_acc "
                        f"in its report.json); see `invoke logs {done.run_id}`.")
    counts = acceptance.counts(report)
    tops = AcceptanceProfile.from_report(report)        # per-depth top-k: what SGLang's trees are predicted from
    ctx.doc.profile = {"conditional": list(found.conditional), "samples": found.samples, "source": found.source,
                       "run": done.run_id, "rows": list(counts.cond_total or []) if counts else [],
                       "topk": [list(r) for r in tops.topk] if tops else [], "verdict": report.verdict.status}
    if report.verdict.status != "MATCH":
        ctx.doc.notes.append(f"test-drafter says {report.verdict.status} for the draft as configured (run "
                             f"{done.run_id}): tune measures it as it is; fix it first (`invoke doctor --draft "
                             f"{args.draft} --fix`) for the settings of the fixed draft.")
    step.outcome = {"run_id": done.run_id, "depths": found.max_depth,
                    "accept_length": {str(k): round(found.accept_length(k), 3) for k in range(1, found.max_depth + 1)}}
    ctx.say(f"  conditional acceptance per depth: {' '.join(f'{p:.2f}' for p in found.conditional)}")


def the_profile(ctx: Ctx) -> AcceptanceProfile:
    found = ctx.doc.profile or {}
    tops = tuple(tuple(float(v) for v in row) for row in found.get("topk") or [])
    return AcceptanceProfile(conditional=tuple(found.get("conditional") or ()), topk=tops,
                             samples=int(found.get("samples") or 0), source=str(found.get("source") or "report"))


def benches(ctx: Ctx) -> list[tuple[Step, grid.Setting, int, dict[str, Any]]]:
    """Every finished bench of the tune: (step, its setting (k, topk, draft tokens), concurrency, outcome)."""
    out = []
    for s in ctx.doc.steps:
        k = s.k if s.k is not None else plan.k_of(s.name)
        if k is not None and s.state == "done":
            out += [(s, grid.of_bench(s, k, ctx.doc.engine, b), c, b) for c, b in serving.as_measured(s)]
    return out


def _measured(ctx: Ctx, rows: list[tuple[Step, grid.Setting, int, dict[str, Any]]]) -> list[Measured]:
    prof = the_profile(ctx)
    out = []
    for _, setting, c, b in rows:
        k, n = setting[0], grid.verified(setting, ctx.doc.engine)
        tok_s = b.get("tok_s")
        length = 1.0 if k == 0 else b.get("accept_length")
        if length is None and k:
            length = prof.accept_length(k)
            ctx.doc.notes.append(f"bench run {b.get('bench_run')}: the server gave no accept length; the round's "
                                 f"cost there uses the predicted {length:.2f}")
        if isinstance(tok_s, (int, float)) and tok_s > 0:
            out.append(Measured(c, n, float(tok_s), float(length or 1.0)))
    return out


def _cost_doc(cost: RoundCost) -> dict[str, Any]:
    return {"fixed_s": {str(c): v for c, v in cost.fixed.items()},
            "per_token_s": {str(c): v for c, v in cost.per_token.items()},
            "baseline_s": {str(c): v for c, v in cost.baseline.items()}}


def cost_of(doc: dict[str, Any]) -> RoundCost:
    return RoundCost(fixed={int(c): float(v) for c, v in doc["fixed_s"].items()},
                     per_token={int(c): float(v) for c, v in doc["per_token_s"].items()},
                     baseline={int(c): float(v) for c, v in doc["baseline_s"].items()})


def do_predict(ctx: Ctx, step: Step) -> None:
    """Fit the round's cost on the measuring servers, predict every K at every concurrency, and plan a
    confirming server for each predicted best not measured yet (benched only where it is best)."""
    args = ctx.doc.args
    rows = benches(ctx)
    try:
        cost = fit(_measured(ctx, rows))
    except ValueError as exc:
        raise TuneError(f"the round's cost cannot be fitted: {exc}. The measuring steps' benches are in "
                        f"{ctx.folder / 'tune.json'}.") from None
    ctx.doc.cost = _cost_doc(cost)
    engine = ctx.doc.engine
    preds = grid.predictions(the_profile(ctx), cost, args.max_steps, args.concurrency, engine)
    measured = {(c, *setting): b for _, setting, c, b in rows}
    ctx.doc.points = [_point(p, measured.get((p.concurrency, *grid.of_prediction(p))), "fit") for p in preds]
    chosen = predict.best(preds)
    todo: dict[grid.Setting, list[int]] = {}
    for c, p in chosen.items():
        if (c, *grid.of_prediction(p)) not in measured:
            todo.setdefault(grid.of_prediction(p), []).append(c)
    check = None if todo else _further_point(preds, {tuple(key[1:]) for key in measured})
    if check is not None:          # every best was measured: one further point still checks the fit
        todo[grid.of_prediction(check)] = [check.concurrency]
    at = ctx.doc.steps.index(step) + 1
    for (k, topk, n), cs in sorted(todo.items(), key=lambda kc: min(kc[1])):
        sglang = engine == "sglang"
        name = plan.confirm_tree(k, topk, n) if sglang else plan.confirm(k)
        if not ctx.doc.has(name):
            ctx.doc.steps.insert(at, Step(name=name, k=k, topk=topk, draft_tokens=n if sglang else None,
                                          concurrencies=cs))
            at += 1
    step.outcome = {"best": {str(c): p.k for c, p in chosen.items()},
                    "settings": {str(c): list(grid.of_prediction(p)) for c, p in chosen.items()},
                    "confirm": {grid.label(*s, engine): cs for s, cs in todo.items()},
                    "check_only": None if check is None else {"k": check.k, "concurrency": check.concurrency,
                                                               "setting": list(grid.of_prediction(check))}}
    ctx.say("  predicted best: " + ", ".join(f"concurrency {c}: {_label(ctx, p)} ({p.tok_s:.0f} tok/s, "
                                          f"×{p.speedup:.2f})" for c, p in chosen.items()))


def _label(ctx: Ctx, p: predict.Prediction) -> str:
    return grid.label(p.k, p.topk, p.draft_tokens, ctx.doc.engine)


def _further_point(preds: list[predict.Prediction], measured: set[tuple[int, ...]]) -> predict.Prediction | None:
    """The setting not measured that is predicted fastest at the middle concurrency: where the fit is
    checked when every predicted best was among the measured settings."""
    cs = sorted({p.concurrency for p in preds})
    middle = cs[len(cs) // 2] if cs else 0
    cands = [p for p in preds if p.concurrency == middle and p.k > 0 and grid.of_prediction(p) not in measured]
    return max(cands, key=lambda p: p.tok_s) if cands else None


def _point(p: predict.Prediction, bench: dict[str, Any] | None, role: str) -> Point:
    point = Point(k=p.k, topk=p.topk, draft_tokens=p.draft_tokens, concurrency=p.concurrency,
                  predicted_tok_s=p.tok_s, accept_length_predicted=p.accept_length, speedup_predicted=p.speedup,
                  break_even=p.break_even)
    if bench is not None:
        _measure_into(point, bench, role)
    return point


def _measure_into(point: Point, bench: dict[str, Any], role: str) -> None:
    tok_s = bench.get("tok_s")
    point.measured_tok_s = float(tok_s) if isinstance(tok_s, (int, float)) else None
    length = bench.get("accept_length")
    point.accept_length_measured = 1.0 if point.k == 0 else (float(length) if length is not None else None)
    point.bench_run, point.role = bench.get("bench_run"), role
    if point.measured_tok_s and point.predicted_tok_s is not None:
        point.error = (point.predicted_tok_s - point.measured_tok_s) / point.measured_tok_s


def confirm(ctx: Ctx, step: Step, seen: dict[str, float]) -> None:
    """Serve and bench a predicted best where it is best: the further points the fit is checked on."""
    k = step.k if step.k is not None else plan.k_of(step.name) or 0
    serving.measure(ctx, step, k, step.concurrencies or ctx.doc.args.concurrency, seen)
    for c, b in serving.as_measured(step):
        setting = grid.of_bench(step, k, ctx.doc.engine, b)
        for point in ctx.doc.points:
            if (point.k, point.topk, point.draft_tokens) == setting and point.concurrency == c:
                _measure_into(point, b, "check")


def median_error(points: list[Point], role: str | None = None) -> float | None:
    """The median |predicted - measured| / measured over the measured speculative points (the baseline's
    own step is the cost's input, so its error is 0 by construction and left out)."""
    errs = [abs(p.error) for p in points
            if p.error is not None and p.k > 0 and (role is None or p.role == role)]
    return statistics.median(errs) if errs else None

