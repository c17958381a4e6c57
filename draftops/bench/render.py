"""A comparison as a rich table plus findings (terminal) and as Markdown (the run folder)."""
from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from draftops.bench.compare import Comparison, definitions
from draftops.bench.positions import MIN_REACHED, PositionTable, StepRow
from draftops.terminal import clean

STYLE = {"bad": "red", "warn": "yellow", "good": "green", "info": "cyan"}
MARK = {"bad": "✗", "warn": "!", "good": "✓", "info": "·"}


def _safe(text: object) -> str:
    """Text that came (in part) from a host or a result file, ready for rich: escapes stripped,
    markup escaped."""
    return escape(clean(str(text)))


def _run_ids(cmp: Comparison) -> str:
    """The two run ids, each whole: a user pastes them into the next command."""
    return f"A {_safe(cmp.a.run_id)}  vs  B {_safe(cmp.b.run_id)}"


def table(cmp: Comparison, width: int | None = None) -> Table:
    """The two runs side by side. At ``width`` too narrow for both run ids whole, the run row is left
    out (the line above the table names them whole) and the values fold rather than end in `…`."""
    out = Table(title="bench compare", title_justify="left")
    out.add_column("")
    out.add_column("A", justify="right", overflow="fold")
    out.add_column("B", justify="right", overflow="fold")
    label = max((len(str(row["metric"])) for row in cmp.rows), default=0)
    ids_fit = width is None or 1 + 3 * 3 + label + len(cmp.a.run_id) + len(cmp.b.run_id) <= width
    for row in cmp.rows:
        if row["metric"] == "run" and not ids_fit:
            continue
        out.add_row(_safe(row["metric"]), _safe(row["a_text"]), _safe(row["b_text"]),
                    style="bold" if row["metric"].startswith(("output tok/s", "speedup", "accept length (")) else "")
    return out


def findings_panel(cmp: Comparison) -> Panel:
    lines = [f"[{STYLE.get(f.severity, 'white')}]{MARK.get(f.severity, '-')} {_safe(f.text)}[/]"
             for f in cmp.findings] or ["nothing to report"]
    worst = cmp.headline.severity if cmp.headline else "info"
    return Panel("\n".join(lines), title="findings", border_style=STYLE.get(worst, "white"))


def _p(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def _has_trained(t: PositionTable) -> bool:
    return any(r.trained is not None for r in t.rows)


def _position_cells(t: PositionTable, row: StepRow) -> list[str]:
    cells = [str(row.step), _p(row.predicted)]
    if _has_trained(t):
        cells.append(_p(row.trained))
    return cells + [_p(row.measured), "—" if row.reached is None else f"{row.reached:.0f}", row.verdict]


def _position_header(t: PositionTable) -> list[str]:
    layout = "served ids" if t.role == "served" else "ids now served"
    head = ["step", f"predicted ({layout})"]
    if _has_trained(t):
        head.append("predicted (trained layout)")
    return head + ["measured", "drafts reached", ""]


def _position_caption(t: PositionTable) -> str:
    """What the numbers are: both conditional, where each comes from, the tolerance."""
    if not t.available:
        return f"measured: {t.note}"
    source = {"client": "the vLLM client's spec_decode_per_position_acceptance_rates",
              "metrics window": "vLLM's /metrics per-position counters around each repeat"}.get(t.source or "",
                                                                                              t.source or "?")
    return (f"conditional acceptance P(step k right | steps < k right): predicted = test-drafter run "
            f"{t.prediction_run}'s cond_acc_k (teacher-forced); measured = {source} ({t.definition}); part = more "
            f"than ±{t.tolerance:.2f} apart, judged where at least {MIN_REACHED} drafts got to the step (and as "
            "many evaluated rows)")


def position_table(t: PositionTable) -> Table:
    out = Table(title=f"per position: {_safe(t.run_id)}", title_justify="left", caption=_safe(_position_caption(t)),
                caption_justify="left")
    for i, name in enumerate(_position_header(t)):
        out.add_column(name, justify="left" if i == len(_position_header(t)) - 1 else "right")
    for row in t.rows:
        style = "red" if row.verdict in ("low", "high") else ""
        out.add_row(*[_safe(c) for c in _position_cells(t, row)], style=style)
    return out


def show(cmp: Comparison, console: Console) -> None:
    console.print(f"bench compare: {_run_ids(cmp)}", soft_wrap=True)   # never broken inside an id
    console.print(table(cmp, console.width))
    for t in cmp.positions:
        console.print(position_table(t))
    console.print(findings_panel(cmp))
    for name, meaning in definitions(cmp.a, cmp.b).items():
        console.print(f"[dim]accept length {escape(name)} = {escape(meaning)}[/]")


def md_text(text: object) -> str:
    """Text for one Markdown line: no line breaks (a newline in a path would start a heading or a
    list), HTML and Markdown characters escaped outside code spans (a `<script>` or `<img onerror>` in
    a host string is shown, not run), terminal escapes stripped. The findings quote commands in
    backticks: those spans are kept as they are, pasteable; backticks that do not pair are escaped."""
    out = clean(str(text)).replace("\r", " ").replace("\n", " ")
    parts = out.split("`")
    if len(parts) % 2 == 0 or "``" in out:          # not simple pairs: no code spans at all
        return _md_escape(out)
    return "".join(_md_code(part) if i % 2 else _md_escape(part) for i, part in enumerate(parts))


def _md_code(text: str) -> str:
    """A code span; one holding HTML's characters as an HTML <code> with everything escaped (a raw
    `<` is literal inside a Markdown span, but not to every reader of the file)."""
    if any(ch in text for ch in "<>&"):
        return "<code>" + _md_escape(text) + "</code>"     # Markdown is read inside inline HTML
    return f"`{text}`"


def _md_escape(text: str) -> str:
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("\\", "\\\\")
    for ch in "`[]*_#!|~":
        text = text.replace(ch, "\\" + ch)
    return text


def _md_cell(text: str) -> str:
    """A table cell: everything escaped (a pipe ends a cell even inside a code span)."""
    return _md_escape(clean(str(text)).replace("\r", " ").replace("\n", " "))


def markdown(cmp: Comparison, chart_name: str | None = "compare.png") -> str:
    lines = [f"# bench compare: {md_text(cmp.a.run_id)} vs {md_text(cmp.b.run_id)}", "",
             (f"A is the {cmp.a.mode} run, B the {cmp.b.mode} run; accept lengths are tokens per verify step, "
             f"judged against test-drafter's prediction with a {cmp.tolerance:.0%} tolerance."), "",
             "| | A | B |", "|---|---:|---:|"]
    lines += [f"| {_md_cell(r['metric'])} | {_md_cell(r['a_text'])} | {_md_cell(r['b_text'])} |" for r in cmp.rows]
    for t in cmp.positions:
        lines += ["", f"## Per position: {md_text(t.run_id)}", "", md_text(_position_caption(t)), "",
                  "| " + " | ".join(_md_cell(h) for h in _position_header(t)) + " |",
                  "|" + "---:|" * (len(_position_header(t)) - 1) + "---|"]
        lines += ["| " + " | ".join(_md_cell(c) for c in _position_cells(t, row)) + " |" for row in t.rows]
    lines += ["", "## What each accept length counts", ""]
    lines += [f"- {md_text(k)}: {md_text(v)}" for k, v in definitions(cmp.a, cmp.b).items()]
    lines += ["", "## Findings", ""]
    lines += [f"- **{f.severity}** ({f.code}): {md_text(f.text)}" for f in cmp.findings] or ["- nothing to report"]
    if chart_name:
        lines += ["", f"![output tok/s and accept length]({chart_name})"]
    return "\n".join(lines) + "\n"
