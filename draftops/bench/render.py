"""A comparison as a rich table plus findings (terminal) and as Markdown (the run folder)."""
from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from draftops.bench.compare import Comparison

STYLE = {"bad": "red", "warn": "yellow", "good": "green", "info": "cyan"}
MARK = {"bad": "✗", "warn": "!", "good": "✓", "info": "·"}


def table(cmp: Comparison) -> Table:
    out = Table(title=f"bench compare: A {cmp.a.run_id}  vs  B {cmp.b.run_id}", title_justify="left")
    out.add_column("")
    out.add_column("A", justify="right")
    out.add_column("B", justify="right")
    for row in cmp.rows:
        out.add_row(escape(row["metric"]), escape(row["a_text"]), escape(row["b_text"]),
                    style="bold" if row["metric"].startswith(("output tok/s", "speedup", "accept length (")) else "")
    return out


def findings_panel(cmp: Comparison) -> Panel:
    lines = [f"[{STYLE.get(f.severity, 'white')}]{MARK.get(f.severity, '-')} {escape(f.text)}[/]"
             for f in cmp.findings] or ["nothing to report"]
    worst = cmp.headline.severity if cmp.headline else "info"
    return Panel("\n".join(lines), title="findings", border_style=STYLE.get(worst, "white"))


def show(cmp: Comparison, console: Console) -> None:
    console.print(table(cmp))
    console.print(findings_panel(cmp))


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(cmp: Comparison, chart_name: str | None = "compare.png") -> str:
    lines = [f"# bench compare: {cmp.a.run_id} vs {cmp.b.run_id}", "",
             (f"A is the {cmp.a.mode} run, B the {cmp.b.mode} run; accept lengths are tokens per verify step, "
             f"judged against test-drafter's prediction with a {cmp.tolerance:.0%} tolerance."), "",
             "| | A | B |", "|---|---:|---:|"]
    lines += [f"| {_md_cell(r['metric'])} | {_md_cell(r['a_text'])} | {_md_cell(r['b_text'])} |" for r in cmp.rows]
    lines += ["", "## Findings", ""]
    lines += [f"- **{f.severity}** ({f.code}): {f.text}" for f in cmp.findings] or ["- nothing to report"]
    if chart_name:
        lines += ["", f"![output tok/s and accept length]({chart_name})"]
    return "\n".join(lines) + "\n"
