"""The command lines of a torchrun of the evaluator, built in one place: the launcher's (``python -m
remote.drafter.launch ...``, what ``invoke test-drafter --gpus`` and a Slurm job script run on each
node) and torchrun's own (what the launcher runs).  Standard library only: the laptop builds them too.

One node: ``--standalone`` (a rendezvous on this node, a free port).  Several: a static rendezvous
on the first node's ``--endpoint`` (torch's TCP store there), each node's rank given by its place
in the list (``--node-rank``), so rank 0, the one that writes report.json, runs on the first node
(a dynamic c10d rendezvous would order the nodes by their names instead).
"""
from __future__ import annotations

from collections.abc import Sequence

#: the rendezvous port on the first node when none is given
DEFAULT_PORT = 29517
#: seconds the nodes wait for each other at the rendezvous (launcher: --rdzv-timeout)
RDZV_TIMEOUT_S = 300
#: seconds a collective waits for the slowest rank (launcher: --collective-timeout)
COLLECTIVE_TIMEOUT_S = 3600
MODULE = "remote.drafter.launch"


def launcher_args(gpus: int | str, drafter_args: Sequence[str], *, nnodes: int | str = 1, node_rank: int | str = 0,
                  endpoint: str | None = None) -> list[str]:
    """The argv after ``python -m remote.drafter.launch``; ``drafter_args`` are those of ``python -m
    remote.drafter`` (``eval ...``).  Values may be shell text (``$SLURM_NODEID``) that the caller
    leaves unquoted."""
    if not drafter_args or drafter_args[0] != "eval":
        raise ValueError(f"a torchrun runs `python -m remote.drafter eval ...`, not {list(drafter_args)[:1]}")
    out = ["--gpus", str(gpus)]
    if str(nnodes) != "1":
        out += ["--nnodes", str(nnodes), "--node-rank", str(node_rank), "--endpoint", str(endpoint)]
    return [*out, *drafter_args]


def torchrun_args(gpus: int, eval_args: Sequence[str], *, nnodes: int = 1, node_rank: int = 0,
                  endpoint: str | None = None, rdzv_timeout: int = RDZV_TIMEOUT_S,
                  run_id: str = "draftops") -> list[str]:
    """The argv of ``torch.distributed.run`` for one process per GPU, each ``python -m remote.drafter
    eval_args`` (``eval_args`` begin with ``eval``)."""
    out = ["--nproc-per-node", str(gpus), "--max-restarts", "0", "--monitor-interval", "0.5"]
    if nnodes == 1:
        out += ["--standalone"]
    else:
        out += ["--nnodes", str(nnodes), "--node-rank", str(node_rank), "--rdzv-backend", "static",
                "--rdzv-endpoint", str(endpoint), "--rdzv-id", run_id, "--rdzv-conf", f"timeout={rdzv_timeout}"]
    return [*out, "--module", "remote.drafter", *eval_args]
