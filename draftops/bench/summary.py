"""One bench run as a rich table: what `invoke bench` shows when its run is home."""
from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from draftops.bench.compare import measured_definition
from draftops.bench.result import BenchResult
from draftops.bench.stats import Stat

ROWS = (("output tok/s", "output_throughput", 1), ("requests/s", "request_throughput", 2),
        ("TTFT median ms", "ttft_median_ms", 1), ("TTFT p99 ms", "ttft_p99_ms", 1),
        ("TPOT median ms", "tpot_median_ms", 2), ("TPOT p99 ms", "tpot_p99_ms", 2),
        ("ITL median ms", "itl_median_ms", 2), ("ITL p99 ms", "itl_p99_ms", 2))


def cell(stat: Stat | None, digits: int) -> str:
    if stat is None or stat.median is None:
        return "—"
    spread = f" (±{stat.spread / 2:.0%})" if stat.spread else ""
    return f"{stat.median:.{digits}f}{spread}"


def table(res: BenchResult) -> Table:
    what = f"{res.engine.name} {res.engine.version or ''}".strip()
    mode = f"draft {res.draft.path}" if res.draft else "baseline"
    out = Table(title=f"bench {res.run_id} ({res.status}): {what} on {res.host.name}, {mode}", title_justify="left")
    out.add_column("metric")
    out.add_column(f"median over {res.settings.repeats} repeat(s)", justify="right")
    for label, key, digits in ROWS:
        out.add_row(label, cell(getattr(res.metrics, key), digits))
    accept = res.accept_length
    if accept is not None:
        out.add_row("accept length (client)", cell(accept.client, 3))
        out.add_row(f"accept length ({accept.server_source or 'server'})", cell(accept.server, 3))
        check = accept.cross_check or {}
        if check.get("agree") is not None:
            out.add_row("client vs server", "agree" if check["agree"] else f"[red]DISAGREE {check['rel_diff']:.0%}[/]")
        out.add_row("[dim]accept length =[/]", f"[dim]{escape(measured_definition(res))}[/]")
    if res.speculative is not None:
        spec = res.speculative
        out.add_row("speculative (effective)", escape(f"{spec.algorithm} steps={spec.num_steps} topk={spec.topk} "
                                                      f"draft tokens={spec.num_draft_tokens}"))
    out.add_row("prompts", escape(f"{res.settings.prompts} × {res.settings.repeats}, {res.settings.dataset_kind}: "
                                  f"{res.settings.dataset}"))
    return out


def show(res: BenchResult, console: Console) -> None:
    console.print(table(res))
    for warning in res.warnings:
        console.print(f"[yellow]warning[/]: {escape(warning)}")
    if res.failure:
        console.print(f"[red]failed[/]: {escape(res.failure)}")
