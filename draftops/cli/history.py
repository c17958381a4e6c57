"""The task side of the local run history: `invoke runs --local` and the one-call hooks that record
a task's run (``record_serve``; a test-drafter's is recorded by its flow, draftops/drafter/record.py).
Recording never fails the task it follows: a history that cannot be written is a warning, and the
run's own files stay in runs/<id>/."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from invoke import Context

from draftops import history, records, tracking
from draftops.cli.common import friendly, project_root, warn
from draftops.cli.jsonout import answer
from draftops.cli.options import task
from draftops.console import console, err_console, escape, fit_columns, show_not_shown, table_width
from draftops.link.host import Host
from draftops.runs.hostfiles import config_digest_of
from draftops.runs.tools import ToolResult
from draftops.terminal import clean

if TYPE_CHECKING:
    from rich.console import Console

    from draftops.documents.capture_check import CaptureCheck

LOCAL_RUNS_HELP = {
    "local": "list the local run history (runs/history.sqlite) instead of the host's run folders",
    "kind": "with --local: only runs of this kind (test-drafter, serve, bench, compare)",
    "draft": "with --local: only runs of this draft (its path, last path part, or config digest prefix)",
    "since": "with --local: only runs since a date (2026-11-30), a time (2026-11-30T14:05) or an age (12h, 7d)",
}
VERDICT_STYLE = {"MATCH": "green", "MISMATCH": "red", "succeeded": "green", "failed": "red", "UNKNOWN": "yellow",
                 "draft-limit": "green", "spec-faster": "green", "wiring-suspect": "red", "config-wrong": "red",
                 "spec-slower": "red"}


def _num(value: Any, fmt: str) -> str | None:
    return format(value, fmt) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def headline(rec: history.RunRecord) -> str:
    """The one figure that says what a run found."""
    m = rec.metrics
    if rec.kind == "test-drafter":
        parts = [(f"predicted accept {_num(m.get('predicted_served'), '.2f') or '—'}"
                 f" (best {_num(m.get('predicted_best'), '.2f') or '—'}) at K={m.get('steps')}")]
        if m.get("fix_layer_ids") is not None:  # in the convention of the config being fixed
            vllm = m.get("serving_convention") == "vllm" and m.get("fix_layer_ids_vllm") is not None
            parts.append(f"fix {m['fix_layer_ids_vllm']} (vLLM ids)" if vllm
                         else f"fix {m['fix_layer_ids']} (SGLang ids)")
        return ", ".join(parts)
    if rec.kind == "bench":
        tok = _num(m.get("output_throughput"), ".1f")
        acc = _num(m.get("accept_length"), ".2f")
        return ", ".join(p for p in (f"{tok} tok/s" if tok else None, f"accept {acc}" if acc else None) if p)
    if rec.kind == "serve":
        ready = _num(m.get("ready_s"), ".0f")
        eff = m.get("effective")
        eff = eff if isinstance(eff, dict) else {}
        spec = ", ".join(f"{k}={v}" for k, v in sorted(eff.items())
                         if not str(k).startswith("_") and isinstance(v, (int, float, str)))[:60]
        return (f"ready in {ready} s" if ready else str(rec.verdict)) + (f"; {spec}" if spec else "")
    if rec.kind == "compare":
        speed = _num(m.get("speedup"), ".2f")
        return f"{rec.settings.get('a')} vs {rec.settings.get('b')}" + (f", ×{speed}" if speed else "")
    shown = [f"{k} {v}" for k, v in m.items()
             if not str(k).startswith("_") and isinstance(v, (int, float, str)) and not isinstance(v, bool)]
    return ", ".join(shown[:3])


def _short(path: str | None, width: int = 28) -> str:
    if not path:
        return ""
    return path if len(path) <= width else "…" + path[-(width - 1):]


def show_local_runs(c: Context, *, host: str | None = None, kind: str | None = None, draft: str | None = None,
                    since: str | None = None, last: int | None = None) -> None:
    """`invoke runs --local`: the history table, newest first (the ``last`` newest; None: all)."""
    root = project_root(c)
    found = history.for_project(root).query(kind=kind, host=host, draft=draft,
                                            since=history.parse_since(since) if since else None)
    filters = ", ".join(f"{k} {v}" for k, v in (("kind", kind), ("host", host), ("draft", draft),
                                                  ("since", since)) if v)
    shown = found if last is None else found[:last]
    answer({"history": str(root / "runs" / history.DB_NAME), "runs": [dataclasses.asdict(r) for r in shown],
            "not_shown": len(found) - len(shown)})
    show_history(shown, f"local run history ({root / 'runs' / history.DB_NAME})", filters, console)
    show_not_shown(len(found), len(shown), err_console)


#: which columns earn their place first when the terminal is narrow (id, kind, headline; then verdict,
#: time, host, engine, draft, target as the width allows; a verdict without its column opens the headline)
HISTORY_PRIORITY = ["id", "kind", "headline", "verdict", "time (UTC)", "host", "engine", "draft", "target"]
HEADLINE_MIN = 20
HEADLINE_WANTED = 64


def history_cells(rec: history.RunRecord) -> dict[str, str]:
    """One run's cells as plain text (not yet escaped), by column."""
    engine = " ".join(p for p in (rec.engine, rec.engine_version) if p)
    draft_text = _short(rec.draft) + (f" {rec.draft_digest[7:15]}" if rec.draft_digest else "")
    return {"id": rec.run_id, "kind": rec.kind, "host": rec.host, "time (UTC)": clean(rec.time[:19].replace("T", " ")),
            "engine": engine, "target": _short(rec.target), "draft": draft_text.strip(), "verdict": rec.verdict or "",
            "headline": headline(rec)}


def show_history(found: list[history.RunRecord], title: str, filters: str, out: Console) -> None:
    """History records as a table (``filters``: what the query was limited to, for the title). Only the
    columns that fit whole are shown (id, kind, verdict and headline first, more on a wider terminal);
    an id is never broken: where even those four do not fit, one run per line, its id first."""
    from rich.table import Table

    out.print(escape(title + (f": {filters}" if filters else "")), soft_wrap=True)
    rows = [history_cells(rec) for rec in found]
    natural = {col: max([len(r[col]) for r in rows] + [len(col)]) for col in HISTORY_PRIORITY}
    natural = {col: natural[col] for col in ("id", "kind", "host", "time (UTC)", "engine", "target", "draft",
                                               "verdict", "headline")}
    needed = [natural["id"], natural["kind"], HEADLINE_MIN]
    if rows and table_width(needed) > out.width:
        _history_lines(rows, out)
    else:
        # the headline keeps up to HEADLINE_WANTED before a lesser column (time, host, ...) is added
        room = out.width - table_width([natural["id"], natural["kind"]]) - 3
        reserve = max(HEADLINE_MIN, min(natural["headline"], HEADLINE_WANTED, room))
        shown = fit_columns(out.width, natural, HISTORY_PRIORITY, "headline", reserve)
        table = Table()
        for col in shown:
            table.add_column(col, no_wrap=col != "headline", overflow="fold" if col == "headline" else "ellipsis")
        for row in rows:
            if "verdict" not in shown and row["verdict"]:
                row = {**row, "headline": f"{row['verdict']}: {row['headline']}"}
            table.add_row(*(_cell(col, row[col]) for col in shown))
        out.print(table)
    _history_notes(found, filters, out)


def _cell(col: str, text: str) -> str:
    return f"[{VERDICT_STYLE.get(text, 'white')}]{escape(text)}[/]" if col == "verdict" else escape(text)


def _history_lines(rows: list[dict[str, str]], out: Console) -> None:
    """Too narrow for a table: each run's id on its own line, whole, then what it found, indented."""
    for row in rows:
        out.print(escape(row["id"]), soft_wrap=True)
        out.print("  " + " ".join(_cell(col, row[col]) for col in ("kind", "verdict") if row[col]) +
                  f"  {escape(row['headline'])}")


def _history_notes(found: list[history.RunRecord], filters: str, out: Console) -> None:
    if any(rec.kind in ("test-drafter", "bench") for rec in found):
        out.print("[dim]accept: tokens per verify, the bonus token included (measured: 1 + accepted/drafts; "
                  "predicted: 1 + sum_k full_acc_k over the K TTT steps).[/]")
    if not found:
        out.print("[dim]no runs recorded" + (" match" if filters else " yet") +
                  "; test-drafter, serve and bench record theirs here.[/]")


def record_serve(host: Host, rec_args: dict[str, Any]) -> None:
    """Record a serve run (ready or failed) in the local history; never fails the task."""
    def build(git_rev: str | None) -> history.RunRecord:
        draft = rec_args.get("draft")
        digest = config_digest_of(host, f"{draft}/config.json") if draft else None
        return records.serve_record(host=host.name, draft_digest=digest, git_rev=git_rev, **rec_args)

    records.keep(host.project_root, f"serve run {rec_args.get('run_id')}", build, warn)


def record_capture_check(done: ToolResult, given: dict[str, Any], doc: CaptureCheck | None, root: Path) -> None:
    """Record a finished capture-check run (its result read by the task) in the local history."""
    records.keep(root, f"run {done.run_id}", lambda rev: records.capture_check_record(
        done.run_id, done.host, done.final, doc, given, git_rev=rev), warn)


@task(help={"since": "only runs since a date (2026-11-30), a time (2026-11-30T14:05) or an age (12h, 7d)",
            "host": "only runs of this host (default: every host)"})
@friendly
def export(c: Context, since: str | None = None, host: str | None = None) -> None:
    """Send the local run history to the MLflow tracking server in $MLFLOW_TRACKING_URI.

    Experiment $MLFLOW_EXPERIMENT_NAME (default draftops), one MLflow run per history row, named by
    its run id, with its files; idempotent: a run already there is not sent again. A doctor's and a
    night's steps are nested under it."""
    root = project_root(c)
    done = tracking.export(root, history.parse_since(since) if since else None, host,
                           lambda line: console.print(escape(line), soft_wrap=True))
    where = tracking.target()
    at = f"{tracking.shown(where.uri)} (experiment {where.experiment})" if where else "?"
    console.print(escape(f"{len(done.sent)} run(s) sent to MLflow at {at}; {len(done.already)} already there, "
                         "not sent again."), soft_wrap=True)
