"""`invoke tune`: the fastest vLLM or SGLang speculative settings for a draft, predicted from its acceptance profile
and the measured cost of a round, then confirmed on real servers; the flow is draftops/tune/ (this task
takes the flags, prints its lines and exits with its code)."""
from __future__ import annotations

from typing import Any

from invoke import Context
from invoke.exceptions import Exit

from draftops.cli.common import HOST_HELP, connect, ensure_code, friendly, project_root
from draftops.cli.jsonout import JSON_HELP, answer, json_output
from draftops.cli.options import WHOLE, Number, task
from draftops.console import console, escape
from draftops.link.host import Host
from draftops.runs.hostfiles import host_path

MAX_BUDGET_S = 24 * 3600.0
_HELP = {
    "draft": "draft checkpoint folder on the host, or `demo` (the generated demo's draft)",
    "data": "its hidden-state dump folder on the host (not for the demo)",
    "profile": "serve profile of the host (hosts.yaml `serve:`)",
    "concurrency": "the concurrencies to tune for, comma-separated (default 1,4,16)",
    "max_steps": "the largest num_speculative_tokens (SGLang: steps) predicted (K_max; test-drafter unrolls this "
                 "many; default 8)",
    "budget_s": "seconds the whole tune may take (default 840: under 15 minutes); each server start and bench "
                "counts, and a confirming server that does not fit is skipped and said",
    "port": "port for the servers the tune starts (default: the profile's)",
    "resume": "continue the latest tune (or the tune of this id) from its last finished step",
    "host": HOST_HELP,
    "json": JSON_HELP,
}
BUDGET = Number(float, 60.0, MAX_BUDGET_S,
                refusal="{flag} {text!r} must be a number of seconds from {low} to {high}.",
                unreadable="{flag} {text!r} must be a number of seconds from 60 to 86400.")
STEPS = Number(int, 2, 32, refusal="{flag} {text!r} must be a whole number from {low} to {high}.")


def concurrencies(text: str) -> list[int]:
    """``1,4,16`` → [1, 4, 16]; anything else is one line naming the flag."""
    from draftops.errors import TuneError
    from draftops.tune import plan
    try:
        values = sorted({int(part) for part in str(text).split(",") if part.strip()})
    except ValueError:
        values = []
    if not values or not all(1 <= v <= plan.MAX_CONCURRENCY for v in values) or len(values) > 8:
        raise TuneError(f"--concurrency {text!r} must be up to 8 whole numbers from 1 to {plan.MAX_CONCURRENCY}, "
                        "comma-separated (e.g. 1,4,16).")
    return values


@task(help=_HELP, optional=["resume"], options={"port": WHOLE, "max_steps": STEPS, "budget_s": BUDGET})
@json_output("tune")
@friendly
def tune(c: Context, draft: str | None = None, data: str | None = None, profile: str | None = None,
         concurrency: str | None = None, max_steps: int | None = None, budget_s: float | None = None,
         port: int | None = None, resume: str | None = None, host: str | None = None, json: bool = False) -> None:
    """Find the fastest vLLM num_speculative_tokens (SGLang: steps, topk and draft tokens) per concurrency
    for a draft: its acceptance profile (test-drafter), the cost of a round measured on real servers
    (baseline and two K), throughput predicted for every setting, the best confirmed; the answer as
    engine arguments, the story in runs/<id>/tune.{md,html,json}. Exit 0 done, 1 a failed step, 128 + a signal."""
    from draftops.tune import state
    host_ = connect(c, host)
    runs_dir = project_root(c) / "runs"
    if resume is not None:
        folder = state.find(runs_dir, None if resume is True else str(resume))
        with state.held(folder):
            current = state.load(folder)
            if budget_s is not None:            # the one setting a resume may change: more time
                current.args.budget_s = budget_s
            if current.host != host_.name:
                raise state.TuneError(f"tune {current.tune_id} ran on host {current.host!r}, not {host_.name!r}; "
                                      f"resume it with `{state.resume_command(current.tune_id, current.host)}`.")
            ensure_code(host_)
            _run(host_, current, folder)
        return
    args = _new_args(host_, draft, data, profile, concurrency, max_steps, budget_s, port)
    ensure_code(host_)
    from draftops.tune import plan
    configured = _configured(host_, args)
    current, folder = state.new(runs_dir, host_.name, args, plan.steps(args, configured))
    current.configured_k, current.engine = configured, _engine(host_, args)
    with state.held(folder):
        _run(host_, current, folder)


def _engine(host: Host, args: Any) -> str:
    from draftops.serve import profiles
    return profiles.resolve(host.spec, args.profile).engine


def _configured(host: Host, args: Any) -> int:
    """The K the draft is served with when none is asked: the profile's, else draftops' vLLM default (on
    SGLang: the same number of steps, a chain)."""
    from draftops.serve import profiles
    from draftops.serve.request import VLLM_DEFAULT_STEPS
    chosen = profiles.resolve(host.spec, args.profile)
    return int(getattr(chosen.settings, "steps", None) or VLLM_DEFAULT_STEPS)


def _new_args(host: Host, draft: str | None, data: str | None, profile: str | None, concurrency: str | None,
              max_steps: int | None, budget_s: float | None, port: int | None) -> Any:
    from draftops.documents.tune import Args
    from draftops.errors import TuneError
    from draftops.serve import profiles
    from draftops.tune import plan
    if not draft:
        raise Exit("error: give --draft CKPT (a draft folder on the host, or `demo`), or --resume.", code=1)
    if draft != "demo" and not data:
        raise TuneError(f"--draft {draft} needs --data DUMPS: the hidden-state dumps it was trained on (on the host), "
                        "for its acceptance profile; only the demo knows its own.")
    chosen = profiles.resolve(host.spec, profile)
    if chosen.engine not in ("vllm", "sglang"):
        raise TuneError(f"serve profile {chosen.name!r} of host {host.name!r} serves with {chosen.engine}; `invoke "
                        "tune` tunes vLLM's num_speculative_tokens and SGLang's trees. Name a vLLM or SGLang "
                        "profile with --profile.")
    args = Args(draft=draft if draft == "demo" else host_path(host, draft),
                data=host_path(host, data) if data else None, profile=profile,
                concurrency=concurrencies(concurrency) if concurrency else list(plan.DEFAULT_CONCURRENCY),
                max_steps=max_steps or plan.DEFAULT_MAX_STEPS, budget_s=budget_s or plan.DEFAULT_BUDGET_S, port=port)
    need = plan.needed_s(args, _configured(host, args))
    if need > args.budget_s:
        raise TuneError(f"--budget-s {args.budget_s:.0f} is less than the about {need:.0f} s the measuring steps need "
                        f"({len(args.concurrency)} concurrencies × 3 servers, a start ~{plan.SERVE_S:.0f} s and a "
                        f"bench ~{plan.BENCH_S:.0f} s each here); give more, or fewer --concurrency values.")
    return args


def _run(host: Host, current: Any, folder: Any) -> None:
    from draftops.tune import flow, report
    console.print(f"[bold]tune[/] {current.tune_id} on {escape(host.name)}: "
                  f"{escape(', '.join(s.name for s in current.steps))}")
    ctx = flow.start(host, current, folder, lambda text: console.print(escape(text), soft_wrap=True))
    code = flow.run(ctx)
    answer(ctx.doc.model_dump(mode="json"), ctx.doc.tune_id)
    colour = "green" if ctx.doc.status == "done" else "red"
    lines = report.summary(ctx.doc)
    console.print(f"[{colour}]{escape(lines[0])}[/]")
    for line in lines[1:]:
        console.print(escape(line), soft_wrap=True)
    if code:
        raise Exit(code=code)
