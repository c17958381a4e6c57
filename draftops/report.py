"""Render a drafter report (``draftops.drafter-report/1``, see docs/drafter.md) as rich tables.

Pure presentation: it reads the JSON the remote evaluator wrote and never recomputes a metric.
"""
from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from remote.bench.numbers import finite
from remote.eagle.formats import IDS_KEY, NESTED_FIELD

SUPPORTED_SCHEMA = "draftops.drafter-report/1"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def slot_table(report: dict[str, Any]) -> Table:
    table = Table(title="hidden-state slots (mean RMS per token)", title_justify="left")
    for col in ("slot", "layer id", "role", "rms"):
        table.add_column(col, justify="right" if col in ("slot", "rms") else "left")
    for row in report.get("slot_norms", []):
        table.add_row(str(row["slot"]), str(row.get("layer_id")), row.get("role") or "",
                      f"{row['rms']:.3f}")
    return table


def layout_table(report: dict[str, Any]) -> Table:
    basis = report.get("metrics", {}).get("basis", "data")
    scanned = (report.get("data") or {}).get("layout_scan_samples")
    table = Table(title=f"aux layouts tried (step-0 accuracy on the first {scanned} samples, {basis} targets; "
                        "this scan only picks the best layout)", title_justify="left")
    for col in ("layer ids (SGLang)", "slots", "step-0 acc", ""):
        table.add_column(col)
    served = report.get("verdict", {}).get("served_slots")
    rows = sorted(report.get("layouts", []), key=lambda r: -(r.get("acc") or 0.0))
    for row in rows:
        tags = ", ".join(row.get("tags") or [])
        style = "bold green" if "best" in tags else ("bold red" if row.get("slots") == served else "")
        table.add_row(str(row.get("layer_ids")), str(row.get("slots")), _pct(row.get("acc")), tags, style=style)
    return table


def metrics_table(report: dict[str, Any]) -> Table:
    metrics = report.get("metrics", {})
    steps = metrics.get("steps", 0)
    samples = (report.get("data") or {}).get("samples")
    table = Table(title=f"per-step accuracy on all {samples} samples, full / cond (full: steps 0..k all right; "
                        "cond: step k given the earlier ones)", title_justify="left")
    table.add_column("layout (SGLang ids)")
    table.add_column("targets")
    for k in range(steps):
        table.add_column(f"k={k}", justify="right")
    table.add_column("top-5 @0", justify="right")
    for role in ("served", "best"):
        evaluation = metrics.get(role)
        if not evaluation:
            continue
        for basis in ("data", "verifier"):
            counts = evaluation.get(basis)
            if not counts:
                continue
            full = counts.get("full_acc") or [None] * steps
            cond = counts.get("cond_acc") or [None] * steps
            cells = [f"{_pct(full[k])} / {_pct(cond[k])}" for k in range(steps)]
            table.add_row(f"{role} {evaluation.get('layer_ids')}", basis, *cells, _pct(counts.get("top5_acc_0")))
    return table


def verdict_panel(report: dict[str, Any]) -> Panel:
    """Status, diagnosis, the figures, the fix: each fact once (the message repeats the figures in prose,
    so it is shown only for a report older than the ``diagnosis`` field)."""
    verdict = report.get("verdict", {})
    status = verdict.get("status", "?")
    colour = {"MATCH": "green", "MISMATCH": "red"}.get(status, "yellow")
    lines = [f"[bold {colour}]{escape(str(status))}[/]"]
    fix_line = _fix_line(report)
    if verdict.get("diagnosis"):
        lines.append(escape(str(verdict["diagnosis"])))
        lines += _figure_lines(report, expected_in_diagnosis=bool((verdict.get("expected_acc") or {}).get("flagged")))
        if fix_line or verdict.get("advice"):
            lines.append(fix_line or escape(str(verdict["advice"])))
    else:
        lines.append(escape(str(verdict.get("message", ""))))
        lines += [fix_line] if fix_line else []
        lines += _figure_lines(report, expected_in_diagnosis=False)
    return Panel("\n".join(lines), title="verdict", border_style=colour)


def _figure_lines(report: dict[str, Any], expected_in_diagnosis: bool) -> list[str]:
    """The verdict's numbers: predicted and walked accept lengths, the paired test, the training gap."""
    verdict = report.get("verdict", {})
    lines = []
    accept = report.get("predicted_accept_length") or {}
    if accept:
        samples = (report.get("data") or {}).get("samples")
        lines.append(f"predicted accept length at K={accept.get('steps')} on all {samples} samples "
                     f"({escape(str(accept.get('basis') or '?'))} targets): "
                     + _served_best(finite(accept.get("served")), finite(accept.get("best"))))
        walk = accept.get("walk")
        walk = walk if isinstance(walk, dict) else {}
        served_walk, best_walk = finite(walk.get("served")), finite(walk.get("best"))
        if served_walk is not None or best_walk is not None:
            lines.append("a greedy server's rounds on this text (tokens per verify; docs/bench.md, measured "
                         f"against predicted): {_served_best(served_walk, best_walk)}")
    comparison = verdict.get("comparison")
    if comparison:
        lines.append(_comparison_line(comparison))
    expected = verdict.get("expected_acc")
    if expected and not expected_in_diagnosis:
        flag = "[red]gap flagged[/]" if expected.get("flagged") else "[green]within tolerance[/]"
        lines.append(f"training-reported step-0 acc {_pct(expected.get('expected'))} vs served "
                     f"{_pct(expected.get('served'))}: {flag}")
    return lines


def _served_best(served: float | None, best: float | None) -> str:
    """Both values; only the served one when it is the best layout (no second evaluation then)."""
    if best is None and served is not None:
        return f"served {_fmt(served)} (the best layout)"
    return f"served {_fmt(served)}, best layout {_fmt(best)}"


def _fix_line(report: dict[str, Any]) -> str | None:
    """The ids to write, in the convention of the file being fixed first (bold), the other after."""
    verdict = report.get("verdict", {})
    sglang, vllm = verdict.get("fix_layer_ids"), verdict.get("fix_layer_ids_vllm")
    if sglang is None:
        return None
    speculators = verdict.get("serving_convention") == "vllm" or (
        (report.get("checkpoint") or {}).get("format") == "speculators")
    patch = _capture_note(verdict.get("advice_engine")) if verdict.get("needs_capture_patch") else ""
    if speculators:
        return (f"fix: {IDS_KEY} = [bold]{escape(str(vllm))}[/] (vLLM convention, as this "
                f"speculators-format config stores them: 0 = embedding); in SGLang ids {escape(str(sglang))}"
                + patch)
    return (f"fix: {NESTED_FIELD} = [bold]{escape(str(sglang))}[/] (SGLang ids, "
            f"as this flat config stores them: -1 = embedding); vLLM reads the same layout as "
            f"{escape(str(vllm))}" + patch)


def _capture_note(engine: str | None) -> str:
    """What the embedding id needs, for the engine the host serves with (None: both)."""
    if engine == "vllm":
        return "; vLLM captures the embedding natively (no patch)"
    if engine == "sglang":
        return "; needs the SGLang capture patch (invoke patch-sglang.apply)"
    return "; SGLang needs the capture patch (invoke patch-sglang.apply), vLLM captures it natively"


def _comparison_line(c: dict[str, Any]) -> str:
    alpha = c.get("alpha", 0.05)
    lo, hi = (c.get("gain_ci") or [None, None])[:2]
    return (f"paired over {c.get('samples')} samples (alpha {alpha}): accept-length gain of the best layout "
            f"{_signed(c.get('gain'))} ({1 - alpha:.0%} CI {_signed(lo)} to {_signed(hi)}), better on "
            f"{c.get('samples_better')} samples, worse on {c.get('samples_worse')}, sign test p = "
            f"{_p(c.get('sign_test_p'))}; the same when the gain is under {_fmt3(c.get('margin'))} "
            f"({_pct(c.get('tolerance'))} of the served accept length): {escape(str(c.get('outcome')))}")


def _signed(x: float | None) -> str:
    return "—" if x is None else f"{x:+.3f}"


def _fmt3(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def _p(x: float | None) -> str:
    return "—" if x is None else f"{x:.2g}"


def _fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def show(report: dict[str, Any], console: Console) -> None:
    """Print every table of the report, verdict last (it is what the user acts on)."""
    if report.get("schema") != SUPPORTED_SCHEMA:
        console.print(f"[yellow]report schema {report.get('schema')!r}; this draftops reads "
                      f"{SUPPORTED_SCHEMA}: some fields may be missing[/]")
    console.print(slot_table(report))
    console.print(layout_table(report))
    console.print(metrics_table(report))
    console.print(verdict_panel(report))
