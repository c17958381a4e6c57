"""Render a drafter report (``draftops.drafter-report/1``, see docs/drafter.md) as rich tables.

Pure presentation: it reads the report the remote evaluator wrote, as its model
(``draftops.documents.drafter_report``, read once where it entered), and never recomputes a metric.
The report stores layer ids in SGLang's convention; a screen writes every id list in one convention,
the host engine's own (``screen_engine``), named once above the tables and in each id column's
header.
"""
from __future__ import annotations

from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from draftops.cmdline import commands_in
from draftops.documents.drafter_report import (
    Accept,
    Comparison,
    DrafterReport,
    EngineStatesPart,
    Finding,
    SequentialPart,
    TemperaturePart,
)
from draftops.terminal import markup_safe as escape
from remote.eagle import acceptlength, convention
from remote.eagle.engine_rules import LAYER_FINDINGS
from remote.eagle.formats import IDS_KEY, NESTED_FIELD


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def screen_engine(report: DrafterReport) -> str:
    """The one convention this screen writes layer ids in: the host engine's (the one the verdict
    advises for), else the one the draft's config stores its ids in."""
    verdict = report.verdict
    engine = verdict.advice_engine or verdict.serving_convention
    return engine if engine in convention.ENGINES else convention.SGLANG


def convention_line(report: DrafterReport) -> str:
    """The screen's heading: the one convention its id lists are written in, named once."""
    engine = screen_engine(report)
    whose = "the host engine's" if report.verdict.advice_engine else "the draft config's"
    return f"layer ids below: {convention.NAMED[engine]} ({whose} convention)"


def _ids(ids: list[int] | None, engine: str) -> str:
    """SGLang-convention ids as stored in the report, written in ``engine``'s convention."""
    return "—" if ids is None else str(convention.convert(ids, convention.SGLANG, engine))


def _role(role: str | None) -> str:
    """A slot's role without the evaluator's SGLang layer number ("layer 3"): the id column holds
    the id, in this screen's convention."""
    text = role or ""
    return "layer output" if text.startswith("layer ") else text


def slot_table(report: DrafterReport) -> Table:
    engine = screen_engine(report)
    name = convention.ENGINE_NAME[engine]
    table = Table(title="hidden-state slots (mean RMS per token)", title_justify="left")
    for col in ("slot", f"{name} id", "role", "rms"):
        table.add_column(col, justify="right" if col in ("slot", "rms") else "left")
    for row in report.slot_norms:
        layer = "—" if row.layer_id is None else _ids([row.layer_id], engine)[1:-1]
        table.add_row(str(row.slot), layer, escape(_role(row.role)),
                      "n/a" if row.rms is None else f"{row.rms:.3f}")
    return table


def layout_table(report: DrafterReport) -> Table:
    basis = report.metrics.basis
    scanned = report.data.layout_scan_samples
    table = Table(title=f"aux layouts tried on the dumps' states (step-0 accuracy on the first {scanned} samples, "
                        f"{basis} targets; "
                        "this scan only picks the best layout)", title_justify="left")
    engine = screen_engine(report)
    for col in (f"{convention.ENGINE_NAME[engine]} ids", "slots", "step-0 acc", ""):
        table.add_column(col)
    served = report.verdict.served_slots
    rows = sorted(report.layouts, key=lambda r: -(r.acc or 0.0))
    for row in rows:
        tags = ", ".join(row.tags)
        style = "bold green" if "best" in tags else ("bold red" if row.slots == served else "")
        table.add_row(_ids(row.layer_ids, engine), str(row.slots), _pct(row.acc), escape(tags), style=style)
    return table


def metrics_table(report: DrafterReport) -> Table:
    metrics = report.metrics
    steps = metrics.steps
    samples = report.data.samples
    table = Table(title=f"per-step accuracy on the dumps' states, all {samples} samples, full / cond (full: steps "
                        "0..k all right; cond: step k given the earlier ones)", title_justify="left")
    engine = screen_engine(report)
    table.add_column(f"layout ({convention.ENGINE_NAME[engine]} ids)")
    table.add_column("targets")
    for k in range(steps):
        table.add_column(f"k={k}", justify="right")
    table.add_column("top-5 @0", justify="right")
    for role, evaluation in (("served", metrics.served), ("best", metrics.best)):
        if not evaluation:
            continue
        for basis, counts in (("data", evaluation.data), ("verifier", evaluation.verifier)):
            if not counts:
                continue
            full = _per_step(counts.full_acc, steps)
            cond = _per_step(counts.cond_acc, steps)
            cells = [f"{_pct(full[k])} / {_pct(cond[k])}" for k in range(steps)]
            table.add_row(f"{role} {_ids(evaluation.layer_ids, engine)}", basis, *cells, _pct(counts.top5_acc_0))
    return table


def temperature_table(part: TemperaturePart) -> Table:
    """The accept length predicted at each sampling temperature asked for, per draft sampling method
    (greedy: vLLM's default and SGLang's chain; probabilistic: vLLM's draft_sample_method=probabilistic)."""
    level = "95%" if part.level is None else f"{part.level:.0%}"
    table = Table(title=f"predicted accept length at temperature T (K={part.steps}, served layout; {level} CI over "
                        "samples; greedy, probabilistic: over positions; per round: a greedy-draft server on the "
                        "dumps' text)",
                  title_justify="left")
    for name in ("T", "greedy", "CI", "per round", "CI", "probabilistic", "CI"):
        table.add_column(name, justify="right")

    def ci(pair: list[float] | None) -> str:
        return f"{pair[0]:.2f}-{pair[1]:.2f}" if pair and len(pair) == 2 else "—"
    for row in part.predictions:
        rounds = row.greedy.per_round
        table.add_row(f"{row.temperature:g}", _fmt(row.greedy.accept_length), ci(row.greedy.ci),
                      _fmt(rounds.accept_length if rounds else None), ci(rounds.ci if rounds else None),
                      _fmt(row.probabilistic.accept_length), ci(row.probabilistic.ci))
    return table


def engine_states_table(es: EngineStatesPart, dumps_accept: dict[str, float | None],
                        engine: str = convention.SGLANG) -> Table:
    """The draft on the engine's own states (a capture check kept them), next to the dumps' figure for
    the same role: trainer dumps holding only training's slots have no served figure of their own.
    Ids in ``engine``'s convention, the screen's one."""
    table = Table(title=f"on the engine's own states ({es.samples} samples a capture check sent, {es.basis} "
                        f"targets, K={es.steps}; {escape(es.path)})"
                        + (f"; {len(es.skipped)} not scored (NaN/inf), e.g. {escape(es.skipped[0].path)}: "
                           f"{escape(es.skipped[0].reason)}" if es.skipped else ""), title_justify="left")
    for col in ("layout", f"{convention.ENGINE_NAME[engine]} ids", "step-0 acc (engine)",
                "accept length (engine)", "accept length (dumps)"):
        table.add_column(col, justify="left" if col.startswith("layout") or "ids" in col else "right")
    for row in es.layouts:
        table.add_row(escape(row.role), _ids(row.layer_ids, engine), _pct(row.step0_acc),
                      _fmt(row.accept_length), _fmt(dumps_accept.get(row.role)))
    return table


def _per_step(values: list[float | None] | None, steps: int) -> list[float | None]:
    """One value per step: a list shorter than ``steps`` (or none) is padded with unknowns."""
    return [*(values or [])[:steps], *[None] * (steps - len(values or []))]


def verdict_panel(report: DrafterReport) -> Panel:
    """Status, diagnosis, the figures, the fix: each fact once (the message repeats the figures in prose,
    so it is shown only for a report older than the ``diagnosis`` field)."""
    verdict = report.verdict
    status = verdict.status or "?"
    colour = {"MATCH": "green", "MISMATCH": "red"}.get(status, "yellow")
    lines = [f"[bold {colour}]{escape(status)}[/]"]
    fix_line = _fix_line(report)
    if verdict.diagnosis:
        lines.append(escape(verdict.diagnosis))
        flagged = bool(verdict.expected_acc and verdict.expected_acc.flagged)
        lines += _figure_lines(report, expected_in_diagnosis=flagged)
        if fix_line or verdict.advice:
            lines.append(fix_line or escape(verdict.advice))
    else:
        lines.append(escape(verdict.message))
        lines += [fix_line] if fix_line else []
        lines += _figure_lines(report, expected_in_diagnosis=False)
    return Panel("\n".join(lines), title="verdict", border_style=colour)


def _figure_lines(report: DrafterReport, expected_in_diagnosis: bool) -> list[str]:
    """The verdict's numbers: predicted and walked accept lengths, the paired test, the training gap."""
    verdict = report.verdict
    lines = []
    accept = report.predicted_accept_length
    seq = report.sequential
    if seq is not None:
        lines.append(_sequential_line(seq))
    if accept:
        where = (f"on the {report.data.samples} samples scored" if seq is not None
                 else f"on all {report.data.samples} samples")
        lines.append(f"predicted accept length at K={accept.steps} {where} "
                     f"({escape(accept.basis or '?')} targets): " + _served_best(accept.served, accept.best)
                     + _accept_ci(accept))
        lines.append(f"[dim]accept length: {escape(accept.definition or acceptlength.PREDICTED)}[/]")
        if accept.walk.served is not None or accept.walk.best is not None:
            lines.append("a greedy server's rounds on this text (tokens per verify; docs/bench.md, measured "
                         f"against predicted): {_served_best(accept.walk.served, accept.walk.best)}")
    positions = _position_line(report)
    if positions:
        lines.append(positions)
    if verdict.comparison:
        lines.append(_comparison_line(verdict.comparison))
    expected = verdict.expected_acc
    if expected and not expected_in_diagnosis:
        flag = "[red]gap flagged[/]" if expected.flagged else "[green]within tolerance[/]"
        lines.append(f"training-reported step-0 acc {_pct(expected.expected)} vs served "
                     f"{_pct(expected.served)}: {flag}")
    given = verdict.expected_accept
    if given and given.value is not None:
        flag = "[red]gap flagged[/]" if given.flagged else "[green]within tolerance[/]"
        lines.append(f"expected accept length {_fmt(given.given)} from {escape(str(given.source))} "
                     f"({escape(given.source_definition or '')}) = {_fmt(given.value)} as 1 + accepted/drafts, vs "
                     f"predicted {_fmt(given.predicted)}: {flag}")
    return lines


def _position_line(report: DrafterReport) -> str | None:
    """Step-0 accuracy by position bucket, so decay with position shows (finding context-beyond-training)."""
    by = report.accuracy_by_position
    rows = [b for b in (by.buckets if by else []) if b.acc is not None]
    if by is None or len(rows) < 2:
        return None
    cells = ", ".join(f"{b.start}-{b.end} {_pct(b.acc)}" for b in rows)
    where = f"{escape(by.layout or '?')} layout, {escape(by.basis or '?')} targets"
    return f"step-0 acc by token position ({where}): {cells}"


def _sequential_line(seq: SequentialPart) -> str:
    """How far the sequential verdict read, and why it stopped (docs/drafter.md § Sequential verdict)."""
    alpha = "?" if seq.alpha is None else f"{seq.alpha:g}"
    read = f"; {seq.samples_read} read, read-ahead and the layout scan's {seq.scan_samples} included" \
        if seq.samples_read is not None else ""
    return (f"verdict after {seq.samples_scored} of {seq.samples_total} samples (sequential, α={alpha}, "
            f"seed {seq.seed}{read}): {escape(seq.decided_by or '?')}; `--full` scores every sample")


def _accept_ci(accept: Accept) -> str:
    """The sequential verdict's intervals, when it gave them."""
    ci = accept.ci
    if ci is None or (ci.served is None and ci.best is None):
        return ""
    level = "" if ci.level is None else f"{ci.level:.0%} "
    parts = [f"{role} {lo:.2f} to {hi:.2f}" for role, pair in (("served", ci.served), ("best", ci.best))
             if pair for lo, hi in [pair[:2]]]
    return f" ({level}CI over samples: {', '.join(parts)})"


def _served_best(served: float | None, best: float | None) -> str:
    """Both values; only the served one when it is the best layout (no second evaluation then)."""
    if best is None and served is not None:
        return f"served {_fmt(served)} (the best layout)"
    return f"served {_fmt(served)}, best layout {_fmt(best)}"


def _fix_line(report: DrafterReport) -> str | None:
    """The ids to write, in the convention of the file being fixed first (bold), the other after."""
    verdict = report.verdict
    sglang, vllm = verdict.fix_layer_ids, verdict.fix_layer_ids_vllm
    if sglang is None:
        return None
    speculators = verdict.serving_convention == "vllm" or report.checkpoint.format == "speculators"
    patch = _capture_note(verdict.advice_engine) if verdict.needs_capture_patch else ""
    if speculators and verdict.advice_engine == "sglang":   # SGLang never reads a speculators config's ids
        return (f"fix: a flat-format copy with {NESTED_FIELD} = [bold]{escape(str(sglang))}[/] "
                f"({convention.NAMED['sglang']}; draft-flat)" + patch)
    if speculators and verdict.advice_engine == "vllm":     # the host's convention is the file's: one list
        return (f"fix: {IDS_KEY} = [bold]{escape(str(vllm))}[/] ({convention.NAMED['vllm']}, as this "
                "speculators-format config stores them)" + patch)
    if speculators:
        return (f"fix: {IDS_KEY} = [bold]{escape(str(vllm))}[/] (vLLM convention, as this "
                f"speculators-format config stores them: 0 = embedding); in SGLang ids {escape(str(sglang))}"
                + patch)
    if verdict.advice_engine == "sglang":
        return (f"fix: {NESTED_FIELD} = [bold]{escape(str(sglang))}[/] ({convention.NAMED['sglang']}, "
                "as this flat config stores them)" + patch)
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


def _comparison_line(c: Comparison) -> str:
    lo, hi = [*c.gain_ci, None, None][:2]
    return (f"paired over {c.samples} samples (alpha {c.alpha}): accept-length gain of the best layout "
            f"{_signed(c.gain)} ({1 - c.alpha:.0%} CI {_signed(lo)} to {_signed(hi)}), better on "
            f"{c.samples_better} samples, worse on {c.samples_worse}, sign test p = "
            f"{_p(c.sign_test_p)}; the same when the gain is under {_fmt3(c.margin)} "
            f"({_pct(c.tolerance)} of the served accept length): {escape(str(c.outcome))}")


def _signed(x: float | None) -> str:
    return "—" if x is None else f"{x:+.3f}"


def _fmt3(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def _p(x: float | None) -> str:
    return "—" if x is None else f"{x:.2g}"


def _fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def show(report: DrafterReport, console: Console) -> None:
    """Print every table of the report, the verdict then its findings last (what the user acts on)."""
    console.print(convention_line(report))
    console.print(slot_table(report))
    console.print(layout_table(report))
    console.print(metrics_table(report))
    if report.engine_states is not None:
        accept = report.predicted_accept_length
        dumps = {"served": accept.served, "best": accept.best} if accept else {}
        console.print(engine_states_table(report.engine_states, dumps, screen_engine(report)))
    if report.temperature is not None and report.temperature.predictions:
        console.print(temperature_table(report.temperature))
    console.print(verdict_panel(report))
    if report.findings:
        console.print(findings_panel(report))


def findings_panel(report: DrafterReport) -> Panel:
    """The named causes found in this draft, each with its fix ("bad" ones first)."""
    ordered = sorted(report.findings, key=lambda f: f.severity != "bad")
    told = report.verdict.status == "MISMATCH"   # the verdict above tells a layer finding's story and its fix

    def line(f: Finding) -> str:
        head = f"[bold {'red' if f.severity == 'bad' else 'yellow'}]{escape(f.severity)}[/] {escape(f.id)}: "
        if told and f.id in LAYER_FINDINGS:
            return head + "the verdict above (evidence in report.json)"
        return head + f"{escape(commands_in(f.text))} fix: {escape(commands_in(f.fix))}"

    lines = [line(f) for f in ordered]
    colour = "red" if any(f.severity == "bad" for f in ordered) else "yellow"
    return Panel("\n".join(lines), title="findings", border_style=colour)
