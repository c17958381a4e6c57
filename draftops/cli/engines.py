"""The engine half of the env tasks: `env.setup --engine NAME` and the engine rows of `env.check`.

Kept apart from cli/env.py so the ml-env tasks stay as they are; the install logic itself lives
in draftops/env/engine_env.py.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from draftops import cmdline
from draftops.cli.common import live
from draftops.console import console, escape
from draftops.env import engine_env
from draftops.link.host import Host
from draftops.runs.tools import run_job

if TYPE_CHECKING:
    from rich.table import Table


def setup_engine(host: Host, engine: str, venv: str | None) -> None:
    """Install ``engine`` into its own venv on the host unless its content hash is current."""
    plan = engine_env.plan(host, engine, venv)
    if plan.up_to_date:
        console.print(f"[green]env[/] {host.name}: {escape(plan.venv)} is up to date "
                      f"({plan.recipe.dist} {plan.recipe.version}, hash {plan.digest[:12]}); nothing to do")
        return
    note = (f": installing {plan.recipe.dist} {plan.recipe.version} into {escape(plan.venv)} (minutes; it "
            "survives a dropped link)")
    done = run_job(host, f"engine-setup-{plan.recipe.name}", engine_env.setup_script(plan), cwd=".",
                   view=live("steps", note=note)).check()
    log = done.folder / "log" if done.folder else done.run_id
    console.print(f"[green]env[/] {host.name}: {plan.recipe.name} ready in {escape(plan.venv)} "
                  f"(hash {plan.digest[:12]}); full log: {escape(str(log))}")
    console.print(f"next: {engine_env.next_step(plan.recipe, host.name)}")


def add_engine_rows(engines: list[dict[str, Any]], table: Table) -> None:
    """One row per engine draftops installs (``engine_env.probe``): its version and venv, or where it
    would go."""
    served = {r["engine"]: r for r in engines if r.get("profile") and r["version"]}
    for row in engines:
        venv = escape(row["venv"])
        setup = escape(cmdline.command("env.setup", "--engine", row["engine"]))
        if row.get("profile"):
            found = f"{escape(row['version'])} in {venv}" if row["version"] else f"[red]not importable[/] from {venv}"
            table.add_row(f"engine {row['engine']} (serve profile {escape(row['profile'])})", found)
            continue
        if not row["version"]:
            other = served.get(row["engine"])
            table.add_row(f"engine {row['engine']}", (
                f"[dim]not in {venv}[/] (serve profile {escape(other['profile'])} runs it from its own python, "
                "below)") if other else f"[dim]not installed[/] (would go to {venv}: `{setup}`)")
            continue
        stale = "" if row["current"] else f" [yellow](incomplete or older install: run `{setup}`)[/]"
        table.add_row(f"engine {row['engine']}", f"{row['version']} in {venv}{stale}")
