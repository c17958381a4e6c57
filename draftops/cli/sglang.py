"""Tasks for the seed's fix: patch the host's SGLang to capture the embedding, rewrite draft configs.

`patch-sglang` is a namespace (`invoke patch-sglang` = status, `invoke patch-sglang.apply`, ...):
Invoke has no optional positional arguments.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from invoke import Context
from invoke.exceptions import Exit

from draftops import cmdline
from draftops.cli.common import HOST_HELP, connect, ensure_code, friendly, live, project_root
from draftops.cli.options import task
from draftops.console import console, escape, safe
from draftops.drafter.demo import ensure_demo
from draftops.errors import JobError
from draftops.link.host import Host
from draftops.runs import jobs
from draftops.runs.hostfiles import host_path
from draftops.runs.tools import run_tool
from draftops.serve.profiles import serving_engine
from draftops.serve.request import DEMO, DEMO_DRAFT, DEMO_TARGET, demo_dir

if TYPE_CHECKING:
    from rich.console import Console

    from draftops.documents.draft_config import DraftConfigResult
    from draftops.documents.draft_flat import DraftFlatResult
    from draftops.documents.sglang_patch import SglangPatch

STATE_STYLE = {"native": "green", "patched": "green", "needs-patch": "yellow", "unsupported": "dim",
               "modified": "red bold"}


def show_patch(report: SglangPatch, host: str, out: Console) -> None:
    """patch.json as a table of files and states, then its checks and notes."""
    from rich.table import Table

    table = Table(title=f"SGLang {escape(str(report.sglang_version))} on {host}: {escape(str(report.action))}",
                  title_justify="left")
    for col in ("file", "model", "state", "detail"):
        table.add_column(col, overflow="fold")
    changed = set(report.changed)
    for row in report.files:
        mark = " (changed)" if row.file in changed else ""
        table.add_row(escape(row.file), escape(row.model),
                      f"[{STATE_STYLE.get(row.state, 'white')}]{escape(row.state)}[/]{mark}", escape(row.detail or ""))
    out.print(table)
    for check in report.checks:
        colour = "green" if check.ok else "red"
        out.print(f"  [{colour}]{'ok' if check.ok else 'FAIL'}[/] {escape(check.file)}: "
                  f"{escape(check.check)} {escape(check.detail or '')}")
    for note in report.notes:
        out.print(f"[dim]{escape(note)}[/]")


def _patch(c: Context, action: str, host: str | None, models: str | None) -> None:
    host = connect(c, host)
    ensure_code(host)
    args = [action, "--out", jobs.RUN_DIR]
    if models:
        args += ["--models", models]
    done = run_tool(host, "remote.sglang_patch", args, name=f"patch-sglang-{action}", view=live("hide"),
                    env={"DRAFTOPS_STATE_DIR": host.state_dir})
    from draftops.documents.sglang_patch import SglangPatch  # pydantic: once the run has ended

    patch = done.document(SglangPatch)
    if patch is not None and patch.files:
        show_patch(patch, host.name, console)
    done.check()


_PATCH_HELP = {"host": HOST_HELP, "models": "comma-separated model files (default: all supported)"}


def _patch_task(action: str, doc: str) -> Any:
    """One task per action (Invoke has no optional positional arguments)."""
    def body(c: Context, host: str | None = None, models: str | None = None) -> None:
        _patch(c, action, host, models)
    body.__name__, body.__doc__ = action, doc
    return task(default=action == "status", help=_PATCH_HELP)(friendly(body))


status = _patch_task("status", "Per SGLang model file: embedding capture native, patched, or needing the patch.")
apply = _patch_task("apply", "Patch the host's SGLang (originals saved with sha256 first; idempotent).")
verify = _patch_task("verify", "Check that patched files compile and map [-1, a, b] to the embedding, a+1, b+1.")
revert = _patch_task("revert", "Restore the original files byte for byte (refused if changed by someone else).")


CAPTURE_REPORT = "capture-check.json"


def _ids_from_report(c: Context, host: Host, run_id: str) -> tuple[list[str], Path | None]:
    """`--from-report RUN_ID`: the report on the host if the run is there, else the pulled copy here; a
    test-drafter run's report.json or a capture-check run's capture-check.json (both carry a verdict)."""
    try:
        status = jobs.status(host, run_id)
        name = CAPTURE_REPORT if status.get("task") == "capture-check" else "report.json"
        return ["--from-report", f"{host.runs_dir}/{run_id}/{name}"], None
    except JobError:
        folder = project_root(c) / "runs" / run_id
        local = folder / CAPTURE_REPORT if (folder / CAPTURE_REPORT).is_file() else folder / "report.json"
        if not local.is_file():
            raise Exit(cmdline.commands_in(f"error: no run {run_id!r} on host {host.name!r} and no {local}; pass the "
                                           "id of a `invoke test-drafter` or `invoke capture-check` run (see "
                                           "`invoke runs`).", host.name), code=1) from None
        from remote.draft_config.errors import DraftConfigError
        from remote.draft_config.report import read_fix
        try:
            fix = read_fix(local)
        except DraftConfigError as exc:
            raise Exit(f"error: {exc}", code=1) from None
        return ["--layer-ids", ",".join(str(i) for i in fix.ids)], local


@task(help={"ckpt": "draft checkpoint folder on the host (`demo`: the generated demo's draft)",
            "layer_ids": "new ids, SGLang convention: -1,2,30",
            "from_report": "take the fix from this test-drafter or capture-check run id",
            "target": "target model folder on the host (checks the id range)", "dry_run": "validate only",
            "host": HOST_HELP})
@friendly
def draft_config(c: Context, ckpt: str, layer_ids: str | None = None, from_report: str | None = None,
                 target: str | None = None, dry_run: bool = False, host: str | None = None) -> None:
    """Rewrite the draft's aux layer ids in its config (either format), keeping a backup."""
    if bool(layer_ids) == bool(from_report):
        raise Exit("error: give exactly one of --layer-ids (e.g. -1,2,30) or --from-report RUN_ID.", code=1)
    host = connect(c, host)
    ensure_code(host)
    if ckpt == DEMO:    # the demo draft `invoke serve --draft demo` serves, checked against its target
        ensure_demo(host, live("hide"))
        ckpt, target = f"{demo_dir(host.state_dir)}/{DEMO_DRAFT}", target or f"{demo_dir(host.state_dir)}/{DEMO_TARGET}"
    target = host_path(host, target)
    engine = serving_engine(host.spec)
    args = ["--ckpt", str(host_path(host, ckpt)), "--out", jobs.RUN_DIR]
    # the SGLang survey only where SGLang serves: on a vLLM host "no sglang importable" is noise
    args += ["--engine", engine] if engine == "vllm" else ["--sglang-status"]
    if layer_ids:
        args += ["--layer-ids", layer_ids]
    else:
        extra, _ = _ids_from_report(c, host, str(from_report))
        args += extra
    if target:
        args += ["--target", target]
    if dry_run:
        args.append("--dry-run")
    done = run_tool(host, "remote.draft_config", args, name="draft-config", view=live("hide"),
                    env={"DRAFTOPS_STATE_DIR": host.state_dir}).check()
    from draftops.documents.draft_config import DraftConfigResult  # pydantic: once the run has ended

    result = done.document(DraftConfigResult)
    if result is not None:
        show_draft_config(result, console)


def show_draft_config(result: DraftConfigResult, out: Console) -> None:
    """draft_config.json in two lines: the ids before and after, the backup, the warnings."""
    verb = "would write" if result.dry_run else ("wrote" if result.changed else "kept")
    out.print(f"[green]draft-config[/] {safe(result.config)} ({safe(result.format)}, "
              f"`{safe(result.ids_field)}`): {safe(result.old_ids)} → {verb} "
              f"{safe(result.written_ids)}")
    if result.backup:
        out.print(f"  backup: {safe(result.backup)}")
    for warning in result.warnings:
        out.print(f"  [yellow]warning[/]: {safe(warning)}")


@task(help={"ckpt": "speculators-format draft checkpoint folder on the host (`demo`: the generated demo's draft)",
            "out": "new folder for the copy on the host (default: CKPT-flat beside it; never replaced)",
            "layer_ids": "ids to write, SGLang convention: -1,2,30 (default: the checkpoint's own, converted)",
            "from_report": "take the ids from this test-drafter or capture-check run's fix",
            "host": HOST_HELP})
@friendly
def draft_flat(c: Context, ckpt: str, out: str | None = None, layer_ids: str | None = None,
               from_report: str | None = None, host: str | None = None) -> None:
    """Write a flat-format (LlamaForCausalLMEagle3) copy of a speculators draft: what SGLang reads.

    SGLang reads a draft's aux layer ids only from a flat config's eagle_config and loads layer 0 only
    as midlayer.*, so a speculators checkpoint runs on SGLang's default layers; the copy holds the
    same tensor bytes under SGLang's names, the ids in eagle_config. The source is never written."""
    if layer_ids and from_report:
        raise Exit("error: give at most one of --layer-ids (e.g. -1,2,30) or --from-report RUN_ID.", code=1)
    host_ = connect(c, host)
    ensure_code(host_)
    if ckpt == DEMO:
        ensure_demo(host_, live("hide"))
        ckpt = f"{demo_dir(host_.state_dir)}/{DEMO_DRAFT}"
    source = str(host_path(host_, ckpt))
    dest = str(host_path(host_, out)) if out else source.rstrip("/") + "-flat"
    args = ["--ckpt", source, "--dest", dest, "--out", jobs.RUN_DIR]
    if layer_ids:
        args += ["--layer-ids", layer_ids]
    elif from_report:
        extra, _ = _ids_from_report(c, host_, str(from_report))
        args += extra
    done = run_tool(host_, "remote.draft_flat", args, name="draft-flat", view=live("hide")).check()
    from draftops.documents.draft_flat import DraftFlatResult  # pydantic: once the run has ended

    result = done.document(DraftFlatResult)
    if result is not None:
        show_draft_flat(result, console)


def show_draft_flat(result: DraftFlatResult, out: Console) -> None:
    """draft_flat.json in a few lines: the copy, its ids, how to serve it, the warnings."""
    out.print(f"[green]draft-flat[/] {safe(result.dest)}: {result.tensors} tensors ({result.renamed} renamed "
              f"midlayer.*), ids {safe(result.layer_ids)} in eagle_config (SGLang convention, from the "
              f"{safe(result.ids_from)})", soft_wrap=True)
    for warning in result.warnings:
        out.print(f"  [yellow]warning[/]: {safe(warning)}", soft_wrap=True)
    out.print(f"  serve it with SGLang: {safe(cmdline.command('serve', '--draft', result.dest or ''))}", soft_wrap=True)
