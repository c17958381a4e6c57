"""``runs/<tune-id>/tune.{md,html}`` (and tune.png) from tune.json alone: the answer first, then what it
rests on (the acceptance profile and where the server parts from it, the round's cost, every predicted
and measured point), then the steps. One ``story`` feeds both pages and the terminal; every host value
is escaped for the format written (nightly/report.py's ``md``/``esc``)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from draftops.documents.tune import TuneDoc
from draftops.errors import TuneError
from draftops.nightly.report import CHART_SECTION, esc, html_chart, html_tables, sections_markdown
from draftops.tune.state import resume_command
from remote.fileio import atomic_write_text

CHART = "tune.png"
Table = tuple[list[str], list[list[str]]]
Section = tuple[str, list[str], list[Table]]


def _f(x: Any, digits: int = 0) -> str:
    return "—" if not isinstance(x, (int, float)) else f"{x:,.{digits}f}"


def _k(k: int | None) -> str:
    return "—" if k is None else ("no draft" if k == 0 else f"K={k}")


def _set(doc: TuneDoc, k: int | None, topk: int = 1, draft_tokens: int | None = None) -> str:
    """The setting in the engine's own terms: ``K=3`` (vLLM) or ``3/2/6`` (SGLang's steps/topk/draft tokens)."""
    if doc.engine != "sglang" or not k:
        return _k(k)
    return f"{k}/{topk}/{draft_tokens if draft_tokens is not None else k + 1}"


def _vs(v: dict[str, Any] | None) -> str:
    if not v or v.get("ratio") is None:
        return "—"
    lo, hi = v.get("ci") or [None, None]
    return f"×{v['ratio']:.2f} ({_f(lo, 2)}–{_f(hi, 2)}) {v.get('decision')}"


def summary(doc: TuneDoc) -> list[str]:
    """What the user acts on, in words (the first lines of every page and of the terminal)."""
    lines = [f"tune {doc.tune_id} of draft {doc.args.draft} on host {doc.host}: {doc.status}"
             + (f" at step {doc.stopped_at} ({doc.why})" if doc.stopped_at else "")]
    if doc.status in ("stopped", "failed"):
        lines.append(f"stopped at step {doc.stopped_at}; `{resume_command(doc.tune_id, doc.host)}` continues from "
                     "there (finished steps are not run again)")
    for b in doc.best:
        setting = _set(doc, b.k, b.topk, b.draft_tokens)
        lines.append(f"concurrency {b.concurrency}: {setting}, predicted {_f(b.predicted_tok_s)} tok/s, measured "
                     f"{_f(b.measured_tok_s)}" + (f"; vs no draft {_vs(b.vs_baseline)}" if b.vs_baseline else ""))
    if doc.engine == "sglang":
        lines.append("SGLang settings are steps/topk/draft tokens: --speculative-num-steps, "
                     "--speculative-eagle-topk, --speculative-num-draft-tokens")
    if doc.engine_args:
        lines.append(f"engine arguments ({'SGLang' if doc.engine == 'sglang' else 'vLLM'}): "
                     f"{doc.engine_args.get('line')}")
        if doc.engine_args.get("serve"):
            lines.append(f"serve it: {doc.engine_args['serve']}")
        top = doc.engine_args.get("max_batch")
        if doc.off_from is None:
            lines.append("speculation pays at every concurrency measured")
        elif isinstance(top, int) and doc.off_from > top:
            lines.append(f"speculation off from concurrency {doc.off_from}, above the servers' max running requests "
                         f"({top}): no batch reaches it, so no engine setting can say it; serve such traffic "
                         "without a draft")
        elif doc.engine == "sglang":
            lines.append(f"speculation off from concurrency {doc.off_from}: SGLang has no setting for it, so serve "
                         "that traffic from a server without a draft")
        else:
            lines.append(f"speculation off from concurrency {doc.off_from} (K 0 in the schedule from there)")
    if doc.median_error is not None:
        lines.append(f"median prediction error over the measured points: {doc.median_error:.0%}")
    lines.append(f"budget: {doc.spent_s:.0f} s of {doc.args.budget_s:.0f} s spent; left running: "
                 + (", ".join(doc.left_running) or "nothing"))
    return lines


def _top_measured(doc: TuneDoc, concurrency: int) -> str:
    """The fastest measured setting at ``concurrency``, in the engine's own terms."""
    here = [p for p in doc.points if p.concurrency == concurrency and p.measured_tok_s is not None]
    if not here:
        return "—"
    top = max(here, key=lambda p: p.measured_tok_s or 0.0)
    return _set(doc, top.k, top.topk, top.draft_tokens)


def _answer(doc: TuneDoc) -> Section:
    rows = [[str(b.concurrency), _set(doc, b.k, b.topk, b.draft_tokens), _f(b.predicted_tok_s), _f(b.measured_tok_s),
             f"{_top_measured(doc, b.concurrency)} {_f(b.best_measured_tok_s)}", _vs(b.vs_baseline),
             _vs(b.vs_configured)]
            for b in doc.best]
    text = [f"{b.concurrency}: {b.why}" for b in doc.best]
    if doc.engine_args:
        text.append(str(doc.engine_args.get("note")))
    header = ["conc", "setting", "pred tok/s", "meas tok/s", "best measured", "vs no draft (95% CI)",
              f"vs {_set(doc, doc.configured_k)}"]
    return "The answer", text, [(header, rows)]


def _profile(doc: TuneDoc) -> Section:
    prof = doc.profile or {}
    check = doc.profile_check or {}
    server = {int(r.get("step", -1)): r for r in check.get("rows") or [] if isinstance(r, dict)}
    rows = []
    for d, p in enumerate(prof.get("conditional") or []):
        row = server.get(d) or {}
        rows.append([str(d + 1), _f(p, 3), _f(row.get("measured"), 3), str(row.get("verdict") or "—")])
    text = [f"test-drafter run {prof.get('run')} ({prof.get('source')}, {prof.get('samples')} positions at depth 1)"]
    if check:
        text.append(f"against the server's own counters (bench run {check.get('bench_run')}): {check.get('text')}")
    return "Acceptance profile (conditional, per draft depth)", text, [(["depth", "test-drafter", "server", "verdict"],
                                                                        rows)]


def _cost(doc: TuneDoc) -> Section:
    cost = doc.cost or {}
    rows = []
    chosen = {b.concurrency: b.k for b in doc.best}
    for c, base in sorted((int(c), v) for c, v in (cost.get("baseline_s") or {}).items()):
        fixed, per = (cost.get("fixed_s") or {}).get(str(c)), (cost.get("per_token_s") or {}).get(str(c))
        k = chosen.get(c) or 0
        even = (fixed + per * k) / base if k and fixed is not None and per is not None else None
        rows.append([str(c), _f(base * 1e3, 1), _f(fixed * 1e3 if fixed is not None else None, 1),
                     _f(per * 1e3 if per is not None else None, 2), _f(even, 2)])
    text = ["round = concurrency × accept length / throughput, fitted per concurrency as fixed + per draft token × K; "
            "break-even: the accept length at which the chosen K is as fast as no draft"]
    return "Cost of a round (ms)", text, [(["conc", "no-draft step", "round fixed", "per token", "break-even L"], rows)]


def _points(doc: TuneDoc) -> Section:
    shown = doc.points if doc.engine != "sglang" else [p for p in doc.points if p.measured_tok_s is not None]
    rows = [[str(p.concurrency), _set(doc, p.k, p.topk, p.draft_tokens), _f(p.accept_length_predicted, 2),
             _f(p.accept_length_measured, 2),
             _f(p.predicted_tok_s), _f(p.measured_tok_s), "—" if p.error is None else f"{p.error:+.0%}", p.role]
            for p in shown]
    text = [] if doc.engine != "sglang" else [f"the measured settings of the {len(doc.points)} predicted "
                                               "(every one is in tune.json's points)"]
    header = ["conc", "steps/topk/N" if doc.engine == "sglang" else "K", "L pred", "L meas", "pred tok/s",
              "meas tok/s", "error", "role"]
    return "Predicted vs measured", text, [(header, rows)]


def _steps(doc: TuneDoc) -> Section:
    rows = [[s.name, s.state, _f(s.seconds), ", ".join([*s.earlier, *s.runs]) or "—",
             s.error or str((s.outcome or {}).get("reason") or "")] for s in doc.steps]
    return "Steps and their runs", list(doc.notes), [(["step", "state", "s", "runs (history)", "error"], rows)]


def story(doc: TuneDoc) -> list[Section]:
    return [("Summary", summary(doc), []), _answer(doc), _profile(doc), _cost(doc), _points(doc), _steps(doc)]


def markdown(doc: TuneDoc, chart: str | None) -> str:
    return sections_markdown("tune " + doc.tune_id, story(doc), chart, "predicted tok/s against K per concurrency")


_CSS = ("body{font-family:sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #999;padding:4px 8px;text-align:left}img{max-width:100%}")


def html_page(doc: TuneDoc, chart: Path | None) -> str:
    title = f"tune {doc.tune_id}"
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)}</title><style>{_CSS}</style>"
             f"</head><body><h1>{esc(title)}</h1>"]
    for heading, text, tables in story(doc):
        parts.append(f"<h2>{esc(heading)}</h2><ul>" + "".join(f"<li>{esc(t)}</li>" for t in text) + "</ul>")
        parts += html_tables(tables)
        if heading == CHART_SECTION and chart is not None:
            parts.append(html_chart(chart, "predicted tok/s against K"))
    parts.append("<p><a href='tune.json'>tune.json</a>: every figure above, as recorded</p></body></html>\n")
    return "".join(parts)


def write(doc: TuneDoc, folder: Path) -> dict[str, Path]:
    paths = {"markdown": folder / "tune.md", "html": folder / "tune.html", "json": folder / "tune.json",
             "chart": folder / CHART}
    try:
        chart_path = None
        if any(p.predicted_tok_s is not None for p in doc.points):
            from draftops.tune import chart  # matplotlib: only when there is something to draw
            chart_path = chart.draw(list(doc.points), {b.concurrency: b.k for b in doc.best}, paths["chart"],
                                    {b.concurrency: _set(doc, b.k, b.topk, b.draft_tokens) for b in doc.best})
        atomic_write_text(paths["markdown"], markdown(doc, CHART if chart_path else None))
        atomic_write_text(paths["html"], html_page(doc, chart_path))
    except OSError as exc:
        raise TuneError(f"the tune's report could not be written into {folder} ({exc.strerror or exc}); free disk "
                        f"space there. tune.json holds every figure, and `invoke tune --resume {doc.tune_id}` writes "
                        "the report again.") from None
    return paths
