"""Run the evaluator on the host: one process (``python -m remote.drafter eval``), or with ``gpus`` a
torchrun (runs/spread.py: its launcher on one host, on several hosts, or one Slurm job of several nodes)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from draftops.link.host import Host
from draftops.runs.tools import JobView, ToolResult, run_tool
from draftops.serve.request import demo_dir
from remote.drafter.options import EvalOptions

NAME = TASK = "test-drafter"


def evaluate(hosts: Sequence[Host], options: EvalOptions, given: dict[str, Any], view: JobView, *,
             gpus: int | None = None, nodes: int | None = None, port: int | None = None) -> ToolResult:
    """The evaluator's job (its run folder pulled, its result read once), on the first of ``hosts`` or
    under torchrun across them; the demo's cache is each host's own."""
    argv = ["eval", *options.to_argv()]
    if gpus:
        from draftops.runs.spread import run_torchrun  # not at import: `invoke --list` loads no remote/ module

        return run_torchrun(hosts, gpus, argv, nodes=nodes, port=port, name=NAME, view=view, task=TASK,
                            given=given, env=lambda h: {"DRAFTOPS_DEMO_DIR": demo_dir(h.state_dir)})
    host = hosts[0]
    return run_tool(host, "remote.drafter", argv, name=NAME, view=view, task=TASK, given=given,
                    env={"DRAFTOPS_DEMO_DIR": demo_dir(host.state_dir)})
