"""The doctor's report: ``doctor.md`` and ``doctor.html`` (its chart embedded, so the page is one file
to send) beside ``doctor.json`` (the state, every figure the report shows) and ``doctor.png``.

The story in order: what training fed the draft, what the engine feeds it, the findings, the fix,
predicted against measured before and after (per position where the engine counts it), throughput
against the baseline with the repeats' spread, and the command that reproduces each step. Every value
from a host or a file passes through ``md``/``esc`` (nightly/report.py's escaping) for the format
written; each file is written whole or not at all (remote/fileio.py).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from draftops import cmdline
from draftops.doctor import plan
from draftops.doctor.state import STATE_NAME, State, resume_command
from draftops.errors import DoctorError
from draftops.nightly.report import CHART_SECTION, esc, html_chart, html_tables, sections_markdown
from remote.eagle import convention
from remote.fileio import atomic_write_text

CHART = "doctor.png"
STATUS_TEXT = {"healthy": "healthy: nothing to fix", "unhealthy": "NOT HEALTHY: the findings below name the fix",
               "fixed": "FIXED: measured as predicted", "not-fixed": "NOT FIXED", "failed": "FAILED",
               "stopped": "STOPPED", "running": "running"}


def status_text(state: State) -> str:
    """The doctor's end in words (a fix proved by a bench says so; one checked only by test-drafter too)."""
    if state.status == "fixed" and not state.has(plan.COMPARE):
        return "FIXED: test-drafter says MATCH for the fixed config (not benchmarked: --no-bench)"
    return STATUS_TEXT.get(state.status, state.status)


def _f(value: Any, digits: int = 2) -> str:
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "—"


def _ids(value: Any) -> str:
    return "—" if value is None else "[" + ", ".join(str(v) for v in value) + "]" if isinstance(value, list) \
        else str(value)


def _layer(sglang_id: Any, engine: str) -> str:
    """A dumped slot's layer (the report stores SGLang ids) in ``engine``'s convention."""
    if not isinstance(sglang_id, int) or isinstance(sglang_id, bool):
        return "—"
    return str(convention.convert([sglang_id], convention.SGLANG, engine)[0])


def _role(role: Any) -> str:
    """A slot's role without the evaluator's SGLang layer number ("layer 3"): the id stands before it."""
    text = str(role or "")
    return "layer output" if text.startswith("layer ") else text


class Story:
    """The report's sections as (heading, lines, tables), one model for both formats: a line is text;
    a table is (header, rows). Nothing in here is escaped: each writer escapes for its format."""

    def __init__(self, state: State, mlflow: str | None = None) -> None:
        self.state = state
        self.mlflow = mlflow           # the doctor's MLflow run, when it was logged
        self.sections: list[tuple[str, list[str], list[tuple[list[str], list[list[str]]]]]] = []
        self._build()

    def out(self, name: str) -> dict[str, Any]:
        return self.state.step(name).outcome if self.state.has(name) else {}

    def _build(self) -> None:
        s = self.state
        head = [f"doctor {s.doctor_id} on host {s.host}: {status_text(s)}",
                f"asked: {cmdline.command('doctor', *s.args.words(), host=s.host)}", f"started {s.created}"
                + (f"; resumed {', '.join(s.resumed)}" if s.resumed else "")]
        if s.stopped_at:
            head.append(f"stopped at step '{s.stopped_at}': {s.why}")
            left = [x.name for x in s.steps if not x.finished and x.name != s.stopped_at]
            head.append("not done: " + (", ".join([s.stopped_at, *left])) +
                        f"; `{resume_command(s.doctor_id, s.host)}` continues from '{s.stopped_at}'")
        head.append("left running: " + (", ".join(s.left_running) if s.left_running else "nothing"))
        if self.mlflow:
            head.append(f"MLflow: {self.mlflow} (its steps' runs nested under it)")
        self.sections.append(("Summary", head + self._headline(), []))
        self._fed()
        self._findings()
        self._fix()
        self._measured()
        self._tuned()
        self._steps()

    def _headline(self) -> list[str]:
        cmp = self.out(plan.COMPARE)
        lines = []
        for role, label in ((plan.AS_SERVED, "as served"), (plan.FIXED, "fixed")):
            c = cmp.get(role)
            if not c:
                continue
            within = "within" if c.get("within_tolerance") else "NOT within"
            extra = f" (with the extra repeats of bench {c.get('extra_bench_run')})" if c.get("extra_bench_run") else ""
            lines.append(f"{label}: measured {_f(c.get('measured'))} vs predicted {_f(c.get('predicted'))} "
                         f"({within} {cmp.get('tolerance', 0.1):.0%}); throughput vs baseline {c.get('speed_text')}"
                         + extra)
        return lines

    def _fed(self) -> None:
        check = self.out(plan.CHECK)
        if not check:
            return
        served = self.out(plan.AS_SERVED)
        engine = self.engine()
        lines = [f"draft {check.get('checkpoint')} ({check.get('format')}), dumps {check.get('data')} "
                 f"({_samples(check)})",
                 f"layer ids in this section: {convention.NAMED[engine]} (the "
                 f"{'host engine' if check.get('advice_engine') or served.get('engine') else 'config'}'s convention)",
                 "the dumps hold these target layers, slot by slot: "
                 + ", ".join(f"slot {t.get('slot')} = {_layer(t.get('layer_id'), engine)} ({_role(t.get('role'))})"
                             for t in check.get("trained_slots") or []),
                 f"the draft's config names layer ids {_ids(check.get('configured_layer_ids'))}, which "
                 f"{convention.ENGINE_NAME[engine]} reads as dumped slots {_ids(check.get('served_slots'))}"]
        if served.get("serve_run"):
            lines.append(f"the server as it was ({served.get('engine')} {served.get('engine_version') or ''}, run "
                         f"{served.get('serve_run')}) read ids {_ids(served.get('configured_ids'))} from the config; "
                         f"it reported {_ids(served.get('effective_ids'))}")
        cap = self.out(plan.CAPTURE)
        if cap:
            lines.append(f"the engine's own states (capture-check {cap.get('run_id')}): {cap.get('status')}: "
                         f"{cap.get('message')}")
        self.sections.append(("What training fed, what the engine fed", lines, []))

    def engine(self) -> str:
        """The one convention the report writes layer ids in: the host engine's (test-drafter's or the
        server's), else the one the draft's config is written in."""
        check, served = self.out(plan.CHECK), self.out(plan.AS_SERVED)
        for engine in (check.get("advice_engine"), served.get("engine"), check.get("serving_convention")):
            if engine in convention.ENGINES:
                return str(engine)
        return convention.SGLANG

    def _findings(self) -> None:
        check = self.out(plan.CHECK)
        if not check:
            return
        lines = [f"test-drafter {check.get('run_id')}: {check.get('status')}. {check.get('message') or ''}"]
        rows = [[f.get("severity", ""), f.get("id", ""), f.get("text", ""), f.get("fix", "")]
                for f in check.get("findings") or []]
        if not rows:
            lines.append("no findings")
        if not self.state.args.fix and check.get("fixable"):
            lines.append("apply them with: " + cmdline.command("doctor", *self.state.args.words(), "--fix",
                                                               host=self.state.host))
        self.sections.append(("Findings", lines, [(["severity", "finding", "what", "fix"], rows)] if rows else []))

    def _fix(self) -> None:
        if not self.state.has(plan.FIX):
            return
        step = self.state.step(plan.FIX)
        out = step.outcome
        if step.state == "skipped":
            lines = [f"nothing applied: {out.get('reason')}"]
        elif out.get("run_id"):
            written = convention.ids_text(out.get("written_ids"), self._file_convention())
            lines = [f"draft-config {out.get('run_id')}: {out.get('config')}: ids {_ids(out.get('old_ids'))} → "
                     f"{written}; backup {out.get('backup')}"
                     + (f" (written by the interrupted attempt's run {out['changed_by']})" if out.get("changed_by")
                        else ""), *out.get("warnings", [])]
            again = self.out(plan.RECHECK)
            if again:
                lines.append(f"checked again (test-drafter {again.get('run_id')}): {again.get('status')}, "
                             f"predicted accept length {_f((again.get('predicted') or {}).get('served'))}")
                for f in again.get("findings") or []:
                    if f.get("severity") == "bad":
                        lines.append(f"still wrong after the fix, {f.get('id')}: {f.get('text')} Fix: {f.get('fix')}")
        else:
            lines = [f"not applied ({step.state})"]
        self.sections.append(("The fix", lines, []))

    def _file_convention(self) -> str:
        """The convention the fixed config stores its ids in (a speculators config: vLLM's)."""
        return convention.serving_convention(str(self.out(plan.CHECK).get("format")))

    def _measured(self) -> None:
        runs = {r: self.out(r) for r in plan.SERVED_STEPS if self.out(r).get("bench_run")}
        if not runs:
            return
        predicted = self.predicted()
        rows = []
        for role, out in runs.items():
            t = out.get("throughput") or {}
            reused = out.get("reused")
            rows.append([role, str(out.get("bench_run")), _f(t.get("median"), 1),
                         f"{_f(t.get('min'), 1)}–{_f(t.get('max'), 1)}", _f(out.get("accept_length")),
                         _f(predicted.get(role)),
                         f"reused (recorded {str(reused.get('time'))[:19]}, under {reused.get('max_age_h'):.0f} h old)"
                         if reused else "run now"])
        tables = [(["run", "bench", "tok/s (median)", "repeats' range", "accept measured", "accept predicted",
                    "note"], rows)]
        lines = ["accept length: tokens per verify step, the bonus token included (measured 1 + accepted/drafts; "
                 "predicted 1 + Σ full_acc_k over the served steps)"]
        if any(out.get("reused") for out in runs.values()):
            lines.append("the baseline bench was reused from the history (same host, target, engine, bench settings "
                         "and code version, recent); `--fresh` runs it again")
        lines += self._headline()
        cmp = self.out(plan.COMPARE)
        for role in (plan.AS_SERVED, plan.FIXED):
            for table in (cmp.get(role) or {}).get("per_position") or []:
                if not table.get("available"):
                    continue
                prow = [[str(r.get("step")), _f(r.get("predicted")), _f(r.get("measured")), _f(r.get("reached"), 0),
                         str(r.get("verdict"))] for r in table.get("rows") or []]
                tables.append(([f"{role}: position", "predicted P(accept)", "measured", "drafts reached",
                                "verdict"], prow))
            for finding in (cmp.get(role) or {}).get("findings") or []:
                lines.append(f"{role}: {finding.get('severity')} {finding.get('code')}: {finding.get('text')}")
        self.sections.append(("Predicted vs measured", lines, tables))

    def _tuned(self) -> None:
        """With --tune the story ends with the fastest settings found and confirmed (the tune's own report)."""
        out = self.out(plan.TUNE)
        if not out:
            return
        lines = [f"tune {out.get('tune_id')}: {out.get('status')} (runs/{out.get('tune_id')}/tune.md)"]
        rows = []
        for b in out.get("best") or []:
            k = b.get("k")
            vs = b.get("vs_baseline") or {}
            rows.append([str(b.get("concurrency")), "no draft" if k == 0 else f"K={k}", _f(b.get("predicted_tok_s"), 0),
                         _f(b.get("measured_tok_s"), 0),
                         f"×{vs['ratio']:.2f} {vs.get('decision')}" if vs.get("ratio") is not None else "—"])
        if out.get("engine_line"):
            lines.append(f"serve it with (vLLM): {out.get('engine_line')}")
        if out.get("off_from") is not None:
            lines.append(f"speculation off from concurrency {out.get('off_from')}")
        if out.get("median_error") is not None:
            lines.append(f"median prediction error over the measured points: {out['median_error']:.0%}")
        self.sections.append(("The fastest settings", lines,
                              [(["concurrency", "setting", "predicted tok/s", "measured tok/s", "vs no draft"], rows)]
                              if rows else []))

    def predicted(self) -> dict[str, float | None]:
        """Test-drafter's accept length for each served config: the first check's for the draft as it
        was, the re-check's for the fixed one (the comparison's figure when it ran)."""
        cmp = self.out(plan.COMPARE)
        check, again = self.out(plan.CHECK), self.out(plan.RECHECK)
        return {plan.AS_SERVED: (cmp.get(plan.AS_SERVED) or {}).get("predicted")
                or (check.get("predicted") or {}).get("served"),
                plan.FIXED: (cmp.get(plan.FIXED) or {}).get("predicted")
                or (again.get("predicted") or {}).get("served")}

    def _steps(self) -> None:
        rows = [[x.name, x.state, ", ".join(x.runs) + (f" (unfinished attempts: {', '.join(x.earlier)})" if x.earlier
                                                        else ""), " ; ".join(x.commands), x.error or ""]
                for x in self.state.steps]
        self.sections.append(("Steps, their runs and the commands that reproduce them", [],
                              [(["step", "state", "runs (history)", "reproduce", "error"], rows)]))

    def chart_runs(self) -> dict[str, dict[str, Any]]:
        return {r: self.out(r) for r in plan.SERVED_STEPS if self.out(r).get("bench_run")}


def markdown(story: Story, chart: str | None) -> str:
    return sections_markdown("doctor " + story.state.doctor_id, story.sections, chart, "baseline, as served and fixed")


_CSS = """body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;margin:1em 0}
td,th{border:1px solid #999;padding:4px 8px;text-align:left}.bad{color:#b91c1c}.good{color:#15803d}
img{max-width:100%;display:block;margin:.5em 0}"""


def html_page(story: Story, chart: Path | None) -> str:
    e = esc
    title = f"doctor {story.state.doctor_id}"
    good = story.state.status in ("healthy", "fixed")
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>{_CSS}</style>"
             f"</head><body><h1>{e(title)}</h1>"]
    for heading, text, tables in story.sections:
        parts.append(f"<h2>{e(heading)}</h2><ul>")
        parts += [f"<li class='{('good' if good else 'bad') if heading == 'Summary' and i == 0 else ''}'>{e(t)}</li>"
                  for i, t in enumerate(text)]
        parts.append("</ul>")
        parts += html_tables(tables)
        if heading == CHART_SECTION and chart is not None:
            parts.append(html_chart(chart, "baseline, as served and fixed"))
    parts.append(f"<p><a href='{e(STATE_NAME)}'>{e(STATE_NAME)}</a>: every figure above, as recorded</p>"
                 "</body></html>\n")
    return "".join(parts)


def write(state: State, runs_dir: Path, mlflow: str | None = None) -> dict[str, Path]:
    """doctor.png (when a bench ran), doctor.md and doctor.html in the doctor's folder; a DoctorError
    (one paragraph naming the folder) when the disk refuses one of them. ``mlflow``: the page of the
    doctor's MLflow run, linked from the summary."""
    folder = runs_dir / state.doctor_id
    paths = {"markdown": folder / "doctor.md", "html": folder / "doctor.html", "json": folder / STATE_NAME,
             "chart": folder / CHART}
    story = Story(state, mlflow)
    try:
        chart_path = None
        runs = story.chart_runs()
        if runs:
            from draftops.doctor import chart  # matplotlib: only when there is something to draw
            chart_path = chart.draw(runs, story.predicted(), paths["chart"])
        atomic_write_text(paths["markdown"], markdown(story, CHART if chart_path else None))
        atomic_write_text(paths["html"], html_page(story, chart_path))
    except OSError as exc:
        raise DoctorError(f"the doctor's report could not be written into {folder} ({exc.strerror or exc}); free "
                          f"disk space there. {STATE_NAME} holds every step's figures, and `invoke doctor --resume "
                          f"{state.doctor_id}` writes the report again.") from None
    return paths


def _samples(check: dict[str, Any]) -> str:
    """How many dump samples the check scored: the sequential verdict stops once decided, so say of how many."""
    scored, total = check.get("samples"), check.get("samples_total")
    if total is not None and scored is not None and scored < total:
        return f"{scored} of {total} samples scored: the sequential verdict was decided there"
    return f"{scored} samples"
