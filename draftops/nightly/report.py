"""The morning report: ``report.md`` and a self-contained ``report.html`` (plots embedded as data URIs,
so the one file can be mailed or opened anywhere), plus the PNG trend plots beside them.

Layout (orchestration.md §4.5): header, health summary (infrastructure failures apart from step
failures), counts line, a table per host of every metric sorted by severity, links to the raw files.
"""
from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote

from draftops.errors import PlaybookError
from draftops.nightly import detect
from draftops.nightly.night import HostNightReport, Night
from draftops.nightly.plots import draw_trends
from draftops.nightly.runner import FAILED, INFRA, SKIPPED, end_words
from draftops.terminal import clean
from remote.fileio import atomic_write_text

# Markdown that text from a playbook or a host could start: emphasis, code, links, images, raw HTML,
# table cells, strike-through; `_` only where it could open or close emphasis (not inside a word).
_MD_SPECIAL = re.compile(r"[\\`*\[\]<>|~&]|(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])")
_MD_ENTITY = {"<": "&lt;", ">": "&gt;", "&": "&amp;"}


def md(text: object) -> str:
    """``text`` as one line of literal Markdown: control characters and line breaks (a newline would
    start a heading or end a table row) become spaces, and every character Markdown would read as
    markup or HTML is escaped."""
    flat = " ".join(clean(str(text)).replace("\u2028", " ").replace("\u2029", " ").replace("\x85", " ").split())
    return _MD_SPECIAL.sub(lambda m: _MD_ENTITY.get(m.group(), "\\" + m.group()), flat)


def md_link(target: str) -> str:
    """A relative link target that Markdown reads as one path, whatever its characters."""
    return quote(target, safe="/.-_~")


def esc(text: object) -> str:
    """Text for the HTML page: cleaned of control characters, then HTML-escaped (quotes too)."""
    return html.escape(clean(str(text)))


#: a table of a sectioned report: its header and its rows
SectionTable = tuple[list[str], list[list[str]]]
#: the chart of a sectioned report stands after this section
CHART_SECTION = "Predicted vs measured"


def sections_markdown(title: str, sections: Sequence[tuple[str, list[str], list[SectionTable]]],
                      chart: str | None, chart_alt: str) -> str:
    """A report of sections (heading, lines, tables), as the doctor and the tune write theirs, in
    Markdown: a line is a bullet, the chart (its file name) after the section CHART_SECTION."""
    lines = [f"# {md(title)}", ""]
    for heading, text, tables in sections:
        lines += [f"## {md(heading)}", ""] + [f"- {md(t)}" for t in text]
        for header, rows in tables:
            lines += ["", "| " + " | ".join(md(h) for h in header) + " |", "|" + "---|" * len(header)]
            lines += ["| " + " | ".join(md(c) for c in row) + " |" for row in rows]
        lines.append("")
        if heading == CHART_SECTION and chart:
            lines += [f"![{chart_alt}]({chart})", ""]
    return "\n".join(lines)


def html_tables(tables: Sequence[SectionTable]) -> list[str]:
    """A section's tables on the HTML page."""
    parts: list[str] = []
    for header, rows in tables:
        parts.append("<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>")
        parts += ["<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows]
        parts.append("</table>")
    return parts


def html_chart(chart: Path, alt: str) -> str:
    """The chart inlined into the HTML page (the page stands alone)."""
    data = base64.b64encode(chart.read_bytes()).decode()
    return f"<img id='chart' alt='{alt}' src='data:image/png;base64,{data}'>"


def _fmt(x: float | None, pct: bool = False) -> str:
    if x is None:
        return "—"
    return f"{x:+.1f}%" if pct else f"{x:.4g}"


def header(night: Night) -> list[tuple[str, str]]:
    facts: dict[str, set[str]] = {}
    for h in night.hosts:
        for key, val in h.outcome.facts.items():
            facts.setdefault(key, set()).add(f"{val} ({h.outcome.host})" if len(night.hosts) > 1 else val)
    rows = [("date", night.started[:19].replace("T", " ") + " UTC"), ("revision", night.revision or "unknown"),
            ("playbook", f"{night.playbook.name} ({night.playbook_path})"), ("setup", night.playbook.setup),
            ("hosts", ", ".join(h.outcome.host for h in night.hosts))]
    for key in ("gpu", "driver", "engine", "torch", "draft"):
        rows.append((key, "; ".join(sorted(facts.get(key, set()))) or "not reported by this night's steps"))
    rows.append(("accept lengths", ACCEPT_DEFINITIONS))
    logged = [(h.outcome.host, h.logged.url) for h in night.hosts if h.logged]
    if logged:          # each host's night is an MLflow run, its steps' runs nested under it
        rows.append(("MLflow", "; ".join(url + (f" ({host})" if len(night.hosts) > 1 else "") for host, url in logged)))
    return rows


#: what the nights' accept_length.* metrics count (remote/eagle/acceptlength.py; failure-modes.md #12)
ACCEPT_DEFINITIONS = ("tokens per verify, the bonus token included: accept_length.measured = 1 + accepted/drafts "
                      "(vLLM's /metrics; SGLang's since the flush before each repeat), accept_length.predicted = "
                      "1 + sum_k full_acc_k (test-drafter)")


def counts_line(night: Night) -> str:
    total = detect.counts([v for h in night.hosts for v in h.verdicts])
    return " · ".join(f"{n} {name.lower()}" for name, n in total.items())


def _state(night: Night, h: HostNightReport) -> str:
    o = h.outcome
    if night.stopped:
        return f"STOPPED ({night.stopped})"
    if o.error or o.infra_failed or o.failed:
        return "ERROR" if o.error else "INFRASTRUCTURE FAILURE" if o.infra_failed else "STEP FAILURE"
    return "NOT HEALTHY" if o.flagged else "REGRESSION" if h.regressed else "healthy"


def health(night: Night) -> list[str]:
    """One line per host, then one per failed or skipped step."""
    lines = []
    for h in night.hosts:
        o = h.outcome
        n_ok = sum(1 for s in o.steps if s.status == "ok")
        n_failed = sum(1 for s in o.steps if s.status == FAILED)
        n_skipped = sum(1 for s in o.steps if s.status == SKIPPED)
        n_bad = sum(1 for f in o.findings if f.bad)
        state = _state(night, h)
        lines.append(f"{o.host}: {state} — {len(o.steps)} steps: {n_ok} ok, {n_failed} failed, {n_skipped} skipped"
                     + (f"; {n_bad} ✗ finding{'s' if n_bad != 1 else ''}" if n_bad else ""))
        if o.error:
            lines.append(f"  {o.host}: {o.error}")
        for s in o.steps:
            if s.status == FAILED:
                kind = "infrastructure" if s.failure == INFRA else "step"
                lines.append(f"  {o.host} / {s.name} ({s.task}) failed [{kind}]: {s.reason}")
            elif s.status == SKIPPED:
                lines.append(f"  {o.host} / {s.name} ({s.task}) skipped: {s.reason}")
            elif s.flagged:
                lines.append(f"  {o.host} / {s.name} ({s.task}) {end_words(s)}")
            if s.queue is not None:        # a Slurm host: the wait in its queue, apart from the run
                lines.append(f"  {o.host} / {s.name} ({s.task}): waited {s.queue.queued_s:.0f} s in Slurm's "
                             f"queue, ran {s.queue.ran_s:.0f} s ({s.queue.jobs} job{'s' if s.queue.jobs != 1 else ''})")
        lines += [f"  {o.host} / {f.run_id}: {f.mark} {f.code}: {f.text}" for f in o.findings if f.bad]
    return lines


def findings_lines(h: HostNightReport) -> list[str]:
    """Every finding of the host's night (✗ first, as bench.compare orders them), one line each."""
    return [f"{f.mark} {f.code} ({f.run_id}): {f.text}" for f in h.outcome.findings]


COLUMNS = ("metric", "baseline (geo. mean)", "current", "change", "95% CI", "limit", "verdict")


def _ci(v: detect.MetricVerdict) -> str:
    """The change's interval (draftops.comparison's rule against the baseline nights)."""
    return "—" if v.ci_pct is None else f"{_fmt(v.ci_pct[0], True)}…{_fmt(v.ci_pct[1], True)}"


def table_rows(verdicts: list[detect.MetricVerdict]) -> list[list[str]]:
    return [[v.metric + (" ↓" if v.lower_is_better else " ↑"), _fmt(v.baseline), _fmt(v.current),
             _fmt(v.change_pct, True), _ci(v), _fmt(v.limit_pct, True).lstrip("+"),
             v.verdict] for v in verdicts]


def _raw_files(night: Night) -> list[Path]:
    return sorted(p for p in night.folder.rglob("*") if p.is_file() and p.suffix in (".log", ".json"))


def _run_ids(night: Night) -> list[str]:
    """The runs the steps recorded whose folders are here (next to the night's, under runs/): a serve
    run's folder stays on the host, and a link to it would lead nowhere."""
    runs = night.folder.parent
    return sorted({r for h in night.hosts for r in h.outcome.run_ids if (runs / r).is_dir()})


def title(night: Night) -> str:
    return f"{night.night_id}: playbook {night.playbook.name}"


def markdown(night: Night, plots: dict[str, list[Path]]) -> str:
    out = [f"# {md(title(night))}", ""]
    out += [f"- **{md(k)}**: {md(v)}" for k, v in header(night)]
    out += ["", "## Health", ""] + [f"- {md(ln)}" for ln in health(night)]
    out += ["", "## Counts", "", md(counts_line(night)), ""]
    for h in night.hosts:
        host = md(h.outcome.host)
        out += [f"## {host}", "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        rows = table_rows(h.verdicts) or [["(no metrics this night)"] + [""] * (len(COLUMNS) - 1)]
        out += ["| " + " | ".join(md(c) for c in r) + " |" for r in rows]
        if h.outcome.findings:
            out += ["", f"### {host}: findings", ""] + [f"- {md(ln)}" for ln in findings_lines(h)]
        out += [""] + [f"![{md(p.stem)}]({md_link(p.name)})" for p in plots.get(h.outcome.host, [])] + [""]
    out += ["## Raw files", ""]
    out += [f"- [{md(p.relative_to(night.folder))}]({md_link(str(p.relative_to(night.folder)))})"
            for p in _raw_files(night)]
    out += [f"- run {md(r)}: [../{md(r)}/](../{md_link(r)}/)" for r in _run_ids(night)]
    return "\n".join(out) + "\n"


_CSS = """body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;margin:1em 0}
td,th{border:1px solid #999;padding:4px 8px;text-align:right}td:first-child,th:first-child{text-align:left}
.REGRESSION{background:#f8b4b4}.SUSPICIOUS{background:#fde68a}.IMPROVED{background:#bbf7d0}
#header td{text-align:left}.failed{color:#b91c1c}img{max-width:100%;display:block;margin:.5em 0}"""


def html_page(night: Night, plots: dict[str, list[Path]]) -> str:
    e = esc
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title(night))}</title>"
             f"<style>{_CSS}</style></head><body><h1>{e(title(night))}</h1><table id='header'>"]
    parts += [f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in header(night)]
    parts += ["</table><h2>Health</h2><ul id='health'>"]
    bad = ("failed [", "FAILURE", ": ERROR", ": REGRESSION", ": NOT HEALTHY", ": ✗ ", ", but ✗ ", ": STOPPED")
    parts += [f"<li class='{'failed' if any(b in ln for b in bad) else ''}'>{e(ln.strip())}</li>"
              for ln in health(night)]
    parts += [f"</ul><h2>Counts</h2><p id='counts'>{e(counts_line(night))}</p>"]
    for h in night.hosts:
        parts += [f"<h2>{e(h.outcome.host)}</h2><table class='metrics'><tr>"]
        parts += [f"<th>{e(c)}</th>" for c in COLUMNS] + ["</tr>"]
        for row in table_rows(h.verdicts):
            parts.append(f"<tr class='{e(row[-1].replace(' ', '_'))}'>" + "".join(f"<td>{e(c)}</td>" for c in row)
                         + "</tr>")
        parts.append("</table>")
        if h.outcome.findings:
            parts.append(f"<h3>{e(h.outcome.host)}: findings</h3><ul class='findings'>")
            parts += [f"<li class='{'failed' if f.bad else ''}'>{e(ln)}</li>"
                      for f, ln in zip(h.outcome.findings, findings_lines(h), strict=True)]
            parts.append("</ul>")
        for p in plots.get(h.outcome.host, []):
            data = base64.b64encode(p.read_bytes()).decode()
            parts.append(f"<img alt='{e(p.stem)}' src='data:image/png;base64,{data}'>")
    parts.append("<h2>Raw files</h2><ul>")
    parts += [f"<li><a href='{e(str(p.relative_to(night.folder)))}'>{e(str(p.relative_to(night.folder)))}</a></li>"
              for p in _raw_files(night)]
    parts += [f"<li>run <a href='../{e(r)}/'>{e(r)}</a></li>" for r in _run_ids(night)]
    parts.append("</ul></body></html>\n")
    return "".join(parts)


class ReportError(PlaybookError):
    """The report could not be written (a full disk, a folder made read-only)."""


def write(night: Night) -> dict[str, Path]:
    """Draw the plots and write report.md and report.html into the night's folder; ReportError (one
    paragraph naming the folder) when that fails."""
    md_path, page = night.folder / "report.md", night.folder / "report.html"
    try:
        plots = {h.outcome.host: draw_trends(h.outcome.host, h.trend, night.folder) for h in night.hosts}
        atomic_write_text(md_path, markdown(night, plots))
        atomic_write_text(page, html_page(night, plots))
    except OSError as exc:
        raise ReportError(f"the night's report could not be written into {night.folder} ({exc.strerror or exc}). "
                          "The night is recorded in the history (`invoke runs --local --kind nightly`) and its step "
                          "logs are in that folder; free disk space there. No half-written report was left."
                          ) from None
    return {"markdown": md_path, "html": page}
