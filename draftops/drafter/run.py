"""Run the evaluator on the host as one job: one process (``python -m remote.drafter eval``), or with
``gpus`` its torchrun launcher (one host, or one Slurm job of several nodes); a torchrun over several
hosts is one job per host (drafter/spread.run_spread)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from draftops.drafter import spread
from draftops.link.host import Host
from draftops.runs import jobs
from draftops.runs.tools import JobView, ToolResult, run_job
from draftops.serve.request import demo_dir
from remote.drafter.options import EvalOptions

NAME = TASK = "test-drafter"
EVALUATOR = "remote.drafter"


def evaluate(hosts: Sequence[Host], options: EvalOptions, given: dict[str, Any], view: JobView, *,
             gpus: int | None = None, nodes: int | None = None, port: int | None = None) -> ToolResult:
    """The evaluator's job (its run folder pulled, its result read once), on the first of ``hosts`` or
    under torchrun across them; the demo's cache is each host's own."""
    argv = ["eval", *options.to_argv()]
    if gpus and len(hosts) > 1:
        return spread.run_spread(hosts, gpus, argv, name=NAME, view=view, env=_env, task=TASK, given=given,
                                 port=port or spread.DEFAULT_PORT)
    host = hosts[0]
    # a local host without torch: one line from the command's builder, no job
    command, slurm = (spread.one_job(host, gpus, argv, nodes=nodes, port=port) if gpus
                      else (jobs.python_module_command(host, EVALUATOR, argv), None))
    return run_job(host, NAME, command, view=view, env=_env(host), task=TASK, given=given, slurm=slurm)


def _env(host: Host) -> dict[str, str]:
    return {"DRAFTOPS_DEMO_DIR": demo_dir(host.state_dir)}
