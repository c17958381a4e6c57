"""Every argument of a doctor checked before its first step, and what its steps need on the host.

A port out of range, an unknown serve profile, a draft with no target to serve it with, or an engine
not installed used to surface only at the baseline, after the check had run (and a suggested
``--resume`` failed the same way forever); the built-in host even served the *demo's* target for a
draft of another model. Here each is one paragraph before anything runs, naming the flag and the fix.
"""
from __future__ import annotations

from draftops import cmdline
from draftops.doctor import plan
from draftops.errors import DoctorError
from draftops.link.host import Host
from draftops.runs.hostfiles import host_path
from draftops.runs.tools import ask_tool
from draftops.serve import profiles
from draftops.serve.request import DEMO
from remote import exitcodes


def check(host: Host, args: plan.Args, left: list[str] | None = None) -> None:
    """Refuse ``args`` in one paragraph when a step ``left`` to run (default: all) would fail on them;
    no host call (the profile is resolved from hosts.yaml)."""
    if args.port is not None and not 1 <= args.port <= 65535:
        raise DoctorError(f"--port {args.port} is not a TCP port (1-65535); nothing was run.")
    chosen = profiles.resolve(host.spec, args.profile)          # an unknown --profile: its own paragraph
    engine_steps = [s for s in (plan.steps(args) if left is None else left) if s in (*plan.SERVED_STEPS, plan.CAPTURE)]
    if args.draft == DEMO and args.target:
        raise DoctorError(f"the demo draft was trained for the demo's target only: drop --target {args.target} "
                          "with --draft demo.")
    if args.draft != DEMO and engine_steps and not (args.target or chosen.settings.target):
        raise DoctorError(f"the doctor's steps {', '.join(engine_steps)} serve the target model of --draft "
                          f"{args.draft}, and serve profile {chosen.name!r} of host {host.name!r} names none "
                          "(no `target:`). Give it with --target PATH (the model the draft was trained for, on "
                          f"the host), or set `target:` in the profile; --no-bench checks and fixes without serving. "
                          "Nothing was run.")


def engine(host: Host, args: plan.Args, left: list[str] | None = None) -> None:
    """The engine's interpreter exists on the host when a step ``left`` serves or captures (one quick
    stdlib call with it, once the code is on the host), or the one command that installs it."""
    needed_by = [s for s in (plan.steps(args) if left is None else left) if s in (*plan.SERVED_STEPS, plan.CAPTURE)]
    if not needed_by:
        return
    chosen = profiles.resolve(host.spec, args.profile)
    python = host_path(host, chosen.python)
    answer = ask_tool(host, "remote.serve", ["port", "1", "--host", "127.0.0.1"], python=python, timeout=60)
    if answer.exit_code != exitcodes.NO_PYTHON and "No such file" not in answer.stderr:
        return
    install = cmdline.command("env.setup", *(["--engine", "vllm"] if chosen.engine == "vllm" else []),
                              host=host.name)
    raise DoctorError(f"the doctor's steps {', '.join(needed_by)} run {chosen.engine} with {python} (serve profile "
                      f"{chosen.name!r} of host {host.name!r}), which does not exist there: the engine is not "
                      f"installed. Install it first with `{install}`"
                      + (" (with sglang in the host's requirements)" if chosen.engine != "vllm" else "")
                      + ", then run the doctor again; --no-bench checks and fixes without an engine. Nothing was run.")
