"""`invoke test-drafter --gpus N [--hosts a,b]`: the evaluator under torchrun, on one host or spread
over several.

One host (or one Slurm job of several nodes): one job running the launcher (``python -m
remote.drafter.launch``, remote/drafter/launch/launcher.py) with one rank per GPU (:func:`one_job`). Several
hosts: one ordinary job per host (each survives a dropped link and is listed by `invoke runs`), each
launching its ranks as node ``i`` of ``len(hosts)`` with the rendezvous on the first host's address
as the others reach it (hosts.yaml's ``address``; 127.0.0.1 for ``local``) and ``port``.  Rank 0 runs
on the first host, so the report is that job's, pulled and read as any test-drafter run's; a node that
failed is named in the failure of the whole. Any node that fails ends the run: node 0 failing stops
the others, and a later node failing first (seen by :mod:`draftops.drafter.nodewatch` while node 0 is
followed) stops node 0 and the rest, rather than leaving them to their 300 s rendezvous timeout.
"""
from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from draftops import cmdline
from draftops.drafter import nodewatch
from draftops.errors import DraftopsError
from draftops.link.host import Host
from draftops.runs import jobs
from draftops.runs.tools import JobView, ToolResult, finish_job, follow
from draftops.terminal import clean
from remote.drafter.launch import launch_line

if TYPE_CHECKING:
    from draftops.slurmspec import SlurmOptions

LAUNCHER = launch_line.MODULE
DEFAULT_PORT = launch_line.DEFAULT_PORT
#: log lines quoted for a node that failed without an error of its own
LOG_LINES = 3


def one_job(host: Host, gpus: int, eval_args: list[str], *, nodes: int | None,
            port: int | None) -> tuple[str, SlurmOptions | None]:
    """The command (and Slurm settings) of a torchrun that is one job: the launcher with ``gpus`` ranks
    on one host, or on a Slurm host one job of ``nodes`` nodes whose ``srun`` starts it on each
    (:func:`slurm_command`). Several hosts are :func:`run_spread`'s, one job per host."""
    slurm = host.spec.scheduler == "slurm"
    argv = launch_line.launcher_args(gpus, eval_args, **(SLURM_NODE if slurm else {}))
    command = jobs.python_module_command(host, LAUNCHER, argv)
    if not slurm:
        return command, None
    from draftops.slurmspec import SlurmOptions  # pydantic: only for a Slurm host

    return _srun(command, port or DEFAULT_PORT), SlurmOptions(nodes=nodes or 1, extra_args=["--ntasks-per-node=1"])


def endpoint(host: Host, port: int) -> str:
    """The first host's rendezvous endpoint as the other hosts reach it."""
    address = host.spec.address if host.spec.transport != "local" and host.spec.address else "127.0.0.1"
    return f"{address}:{port}"


def run_spread(hosts: Sequence[Host], gpus: int, eval_args: list[str], *, name: str, view: JobView,
               env: Callable[[Host], Mapping[str, str]] | None = None, task: str | None = None,
               given: Mapping[str, Any] | None = None, port: int = launch_line.DEFAULT_PORT) -> ToolResult:
    """Run ``python -m remote.drafter eval_args`` as ``gpus`` ranks on each of several ``hosts`` and
    return the first host's :class:`ToolResult` (rank 0's report), its failure naming every node that
    failed. ``env(host)``: the environment of that host's job."""
    where = endpoint(hosts[0], port)
    started: list[tuple[Host, jobs.Job]] = []
    try:
        for rank, host in enumerate(hosts):
            argv = launch_line.launcher_args(gpus, eval_args, nnodes=len(hosts), node_rank=rank, endpoint=where)
            job = jobs.start(host, name, jobs.python_module_command(host, LAUNCHER, argv),
                             env=env(host) if env else None, task=task,
                             args={**(given or {}), "node": f"{rank}/{len(hosts)}"})
            started.append((host, job))
    except (DraftopsError, OSError):
        for host, job in started:      # a node that cannot start: the others would wait for it in vain
            jobs.kill(host, job.id)
        raise
    first, fallen = _follow_node_0(hosts[0], started, view)
    failed = [] if fallen is None else [_fell(fallen, len(hosts))]
    for rank, (host, job) in enumerate(started[1:], 1):
        if fallen is not None and fallen.node.rank == rank:
            continue
        if not first.ok and _stop_node(host, job.id):  # the others would wait for node 0 until their timeout
            cause = "node 0 failed" if fallen is None else f"node {fallen.node.rank} failed"
            failed.append(f"node {rank} (host {host.name}, run {job.id}) stopped, as {cause}")
            continue
        final = follow(host, job.id, JobView())     # bounded: the rendezvous and collective timeouts
        if final.get("state") != "succeeded":
            failed.append(f"node {rank} (host {host.name}, run {job.id}) {clean(str(final.get('state')))} "
                          f"(exit {final.get('exit_code')}): {_reason(host, job.id, final)}")
    if failed:
        said = "" if fallen is not None else first.error_message or ""
        parts = [said, "Other nodes:" if fallen is None else "", "; ".join(failed) + "."]
        first.error = {**(first.error or {}), "message": " ".join(part for part in parts if part)}
    return first


def _follow_node_0(host: Host, started: Sequence[tuple[Host, jobs.Job]],
                   view: JobView) -> tuple[ToolResult, nodewatch.Fallen | None]:
    """Follow node 0 to its end while the later nodes are watched: the first of them that fails stops
    node 0 at once (its follow then ends), rather than leaving it to its rendezvous timeout."""
    node_0 = started[0][1].id

    def stop_node_0(fallen: nodewatch.Fallen) -> None:
        try:
            _stop_node(host, node_0)
        except (DraftopsError, OSError):
            pass                    # node 0 then ends by its own timeouts, as before the watch

    later = [nodewatch.Node(rank, h, job.id) for rank, (h, job) in enumerate(started[1:], 1)]
    with nodewatch.NodeWatch(later, stop_node_0) as watch:
        first = finish_job(host, node_0, view=view)
    return first, watch.fallen


def _fell(fallen: nodewatch.Fallen, nodes: int) -> str:
    """The paragraph's head when a later node failed first: which node, its host and its error."""
    node, final = fallen.node, fallen.final
    return (f"node {node.rank} of {nodes} (host {node.host.name}, run {node.run_id}) failed first "
            f"({clean(str(final.get('state')))}, exit {final.get('exit_code')}): "
            f"{_reason(node.host, node.run_id, final).rstrip('.')}; so the run was ended: node 0 stopped")


def slurm_command(host: Host, gpus: int, eval_args: list[str], port: int) -> str:
    """The command of the one Slurm job of a torchrun on ``--nodes`` nodes: inside the job, the first
    node of its allocation holds the rendezvous, and ``srun`` starts the launcher once per node, each
    with its node's rank (docs/slurm.md § torchrun)."""
    argv = launch_line.launcher_args(gpus, eval_args, **SLURM_NODE)
    return _srun(jobs.python_module_command(host, LAUNCHER, argv), port)


#: a node's place in the Slurm job, as its shell reads it (the rendezvous: the allocation's first node)
SLURM_NODE = {"nnodes": "$SLURM_NNODES", "node_rank": "$SLURM_NODEID", "endpoint": "$DRAFTOPS_RDZV"}


def _srun(per_node: str, port: int) -> str:
    return ('first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1) && '
            f'[ -n "$first" ] && export DRAFTOPS_RDZV="$first:{int(port)}" && '
            'exec srun --nodes="$SLURM_NNODES" --ntasks-per-node=1 --kill-on-bad-exit=1 '
            f"sh -c {shlex.quote(per_node)}")


def _stop_node(host: Host, run_id: str) -> bool:
    """End a node whose run can no longer meet node 0 (SIGTERM, then SIGKILL); False when it had already
    ended (its own status and reason then tell why)."""
    if jobs.status(host, run_id).get("state") not in ("starting", "running"):
        return False
    jobs.kill(host, run_id, grace_s=5.0)
    return True


def _reason(host: Host, run_id: str, final: Mapping[str, Any]) -> str:
    """The node's own error, else the last lines of its log (a python that never ran the launcher
    writes no error event), else where to read that log."""
    outcome = final.get("outcome") or {}
    if outcome.get("error"):
        return clean(str(outcome["error"]))
    lines: list[str] = []
    try:
        jobs.read_log(host, run_id, lines.append, lines=LOG_LINES)
    except (DraftopsError, OSError):
        pass
    said = " ".join(line.strip()[:300] for line in lines if line.strip())
    return said or f"see its log (`{cmdline.command('logs', run_id, host=host.name)}`)"
