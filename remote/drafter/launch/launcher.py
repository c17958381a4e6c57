"""``python -m remote.drafter.launch --gpus N [--nnodes M --node-rank R --endpoint HOST:PORT] eval ...``:
the evaluator under torchrun, one rank per GPU (gloo ranks on a CPU host), each scoring its share.

It checks what it can before any rank starts (the GPUs the host has, the node rank, the endpoint),
runs ``torch.distributed.run`` with the line launch_line.py builds, and, when a rank dies or fails,
ends with one paragraph naming which rank, on which host, and why (its exit code and signal, or
the paragraph the rank left in torchrun's error file), removing a report.json the run wrote: a run
that failed leaves none.  ``--gpus`` implies ``--full`` (a torchrun scores every sample).
"""
from __future__ import annotations

import argparse
import errno
import os
import signal
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ... import exitcodes, stackcheck

if __name__ == "__main__":
    stackcheck.require("drafter.launch")    # before .distributed, which imports torch
from ..errors import OptionError, RankError  # noqa: E402
from .distributed import MARK, TIMEOUT_ENV  # noqa: E402
from .launch_line import COLLECTIVE_TIMEOUT_S, RDZV_TIMEOUT_S, torchrun_args  # noqa: E402


def cpu_ranks_cap() -> int:
    """The most gloo ranks on a CPU host: one per core (at least 2, so two ranks run anywhere)."""
    return max(2, os.cpu_count() or 1)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m remote.drafter.launch",
                                     description="Run `python -m remote.drafter eval` under torchrun.")
    parser.add_argument("--gpus", type=int, required=True, help="ranks on this node: one per GPU (gloo on CPU)")
    parser.add_argument("--nnodes", type=int, default=1, help="nodes of the run (1)")
    parser.add_argument("--node-rank", type=int, default=0, help="this node's place among them (0: the first)")
    parser.add_argument("--endpoint", help="HOST:PORT of the rendezvous on the first node (several nodes)")
    parser.add_argument("--rdzv-timeout", type=int, default=RDZV_TIMEOUT_S,
                        help=f"seconds the nodes wait for each other ({RDZV_TIMEOUT_S})")
    parser.add_argument("--collective-timeout", type=int, default=COLLECTIVE_TIMEOUT_S,
                        help=f"seconds a rank waits for the slowest one ({COLLECTIVE_TIMEOUT_S})")
    parser.add_argument("command", choices=("eval",))
    parser.add_argument("eval_args", nargs=argparse.REMAINDER, help="the flags of `python -m remote.drafter eval`")
    return parser


def _flag(args: Sequence[str], name: str, default: str) -> str:
    """The value of ``name`` among the eval flags (``--out X`` or ``--out=X``)."""
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return default


def check(opts: argparse.Namespace) -> None:
    """What can be refused before any rank starts, one paragraph each."""
    import torch

    host = socket.gethostname()
    device = _flag(opts.eval_args, "--device", "auto")
    if opts.gpus < 1:
        raise OptionError("--gpus must be at least 1", field="--gpus", expected="an integer >= 1", found=opts.gpus,
                          fix="pass --gpus the number of GPUs of this host to use")
    gpu = device in ("auto", "cuda") and torch.cuda.is_available()
    if gpu and opts.gpus > (have := torch.cuda.device_count()):
        raise OptionError(f"--gpus {opts.gpus} asks for more GPUs than host {host} has", field="--gpus",
                          expected=f"at most {have} (torch.cuda.device_count())",
                          found=opts.gpus, fix=f"pass --gpus {have} or less")
    if device == "cuda" and not torch.cuda.is_available():
        raise OptionError(f"--device cuda was asked for, but torch sees no GPU on host {host}", field="--device",
                          expected="a CUDA device", found=f"torch {torch.__version__} without one",
                          fix="use --device auto (gloo ranks on the CPU) or a host with GPUs")
    if not gpu and opts.gpus > (cap := cpu_ranks_cap()):
        raise OptionError(f"--gpus {opts.gpus} asks for more CPU ranks than host {host} runs", field="--gpus",
                          expected=f"at most {cap} gloo ranks on a CPU host (one per core)",
                          found=opts.gpus, fix=f"pass --gpus {cap} or less (this host has no GPU torch "
                                               "can use, so each rank is a CPU process)")
    if opts.nnodes < 1 or not 0 <= opts.node_rank < opts.nnodes:
        raise OptionError("--node-rank must be one of the --nnodes nodes", field="--node-rank",
                          expected=f"0..{max(opts.nnodes - 1, 0)} with --nnodes >= 1",
                          found=f"--node-rank {opts.node_rank} of --nnodes {opts.nnodes}",
                          fix="number the nodes 0..N-1 in the order of the host list, the first holding the endpoint")
    if opts.nnodes > 1:
        _check_endpoint(opts.endpoint)
        if opts.node_rank == 0:
            _check_port_free(opts.endpoint, opts.nnodes)
    for flag in ("--rdzv-timeout", "--collective-timeout"):
        value = getattr(opts, flag[2:].replace("-", "_"))
        if value < 1:
            raise OptionError(f"{flag} must be at least 1 second", field=flag, expected="seconds >= 1", found=value,
                              fix=f"pass {flag} a bound in seconds")


def _check_endpoint(endpoint: str | None) -> None:
    host, _, port = (endpoint or "").rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise OptionError("Several nodes need the rendezvous endpoint of the first one", field="--endpoint",
                          expected="HOST:PORT, the first node's address as the other nodes reach it",
                          found=endpoint, fix="pass --endpoint HOST:PORT (port 1-65535)")


def port_taken(endpoint: str, nnodes: int) -> RankError:
    """The first node cannot hold the rendezvous: its port is taken (torch says EADDRINUSE, and the
    other nodes would wait for it until their --rdzv-timeout)."""
    port = endpoint.rpartition(":")[2]
    return RankError(f"The rendezvous port {port} is taken on host {socket.gethostname()} (node 0 of {nnodes}, "
                     f"which holds the rendezvous {endpoint}): another process listens on it, so this torchrun "
                     "cannot start, and no node waits for it", field="--endpoint",
                     expected="a free port on the first host", found=f"port {port} in use",
                     fix="run it again with another rendezvous port (test-drafter's --port; `ss -ltnp` on that "
                         "host lists the process listening on this one), or stop that process")


def _check_port_free(endpoint: str | None, nnodes: int) -> None:
    """Node 0 binds the rendezvous port on every address (torch's TCP store): a port already listened on
    is refused before any rank starts, not reported as nodes that never met."""
    port = int((endpoint or "").rpartition(":")[2])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)     # a closed run's TIME_WAIT is no owner
        try:
            probe.bind(("", port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise port_taken(str(endpoint), nnodes) from None


def _in_use(exc: BaseException) -> bool:
    """torch's rendezvous failed because its port is taken (its message, or its cause's)."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if "EADDRINUSE" in str(seen) or "address already in use" in str(seen).lower():
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def describe(rank: int, failure: Any, nproc: int, node_rank: int) -> str:
    """One rank's failure in words: which rank, where, its exit code or signal, and what it said."""
    where = f"rank {rank} (node {node_rank}, local rank {failure.local_rank}, host {socket.gethostname()}, " \
            f"pid {failure.pid})"
    if failure.exitcode < 0:
        name = failure.signal_name()
        how = f"was killed by signal {-failure.exitcode} ({name})"
        if name == "SIGKILL":
            how += ": killed from outside, or by the kernel for lack of memory (dmesg says which)"
        elif name == "SIGTERM":
            how += " (torchrun stops the other ranks so when one fails)"
    else:
        how = f"exited with code {failure.exitcode} ({exitcodes.meaning(failure.exitcode)})"
    said = failure.message if isinstance(failure.message, str) else str(failure.message)
    if said and not said.startswith(("To enable traceback", "Signal ")):
        how += f": {said}"
    return f"{where} {how}"


def run(opts: argparse.Namespace) -> int:
    """torchrun with the ranks; a failure as a RankError naming the rank that failed first."""
    from torch.distributed import DistError
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.run import parse_args
    from torch.distributed.run import run as torchrun

    check(opts)
    eval_args = list(opts.eval_args)
    if "--full" not in eval_args:
        eval_args.append("--full")     # a torchrun scores every sample (docs/drafter.md § torchrun)
    os.environ[MARK] = "1"
    os.environ[TIMEOUT_ENV] = str(opts.collective_timeout)
    report = Path(_flag(eval_args, "--out", ".")) / "report.json"
    started = time.time()
    argv = torchrun_args(opts.gpus, ["eval", *eval_args], nnodes=opts.nnodes, node_rank=opts.node_rank,
                         endpoint=opts.endpoint, rdzv_timeout=opts.rdzv_timeout)
    try:
        torchrun(parse_args(argv))
    except ChildFailedError as exc:
        _drop_partial(report, started)
        first, failure = exc.get_first_failure()
        others = sorted(r for r in exc.failures if r != first)
        text = describe(first, failure, opts.gpus, opts.node_rank)
        if others:
            text += "; then " + "; ".join(describe(r, exc.failures[r], opts.gpus, opts.node_rank) for r in others)
        raise RankError(f"The torchrun of the evaluator failed and wrote no report: {text}") from None
    except (DistError, RendezvousError) as exc:
        _drop_partial(report, started)
        if opts.nnodes > 1 and opts.node_rank == 0 and _in_use(exc):
            raise port_taken(str(opts.endpoint), opts.nnodes) from None
        raise RankError(f"Node {opts.node_rank} of {opts.nnodes} (host {socket.gethostname()}) did not meet the other "
                        f"nodes at the rendezvous {opts.endpoint or 'on this node'} within {opts.rdzv_timeout} s: "
                        f"{(str(exc).splitlines() or [type(exc).__name__])[0]}", field="--endpoint",
                        fix="start the launcher on every node with the same --nnodes and --endpoint (the first "
                            "node's address as the others reach it, its port free there and open between them), "
                            "or raise --rdzv-timeout") from None
    except SignalException as exc:
        # torchrun's own handler turns SIGTERM/SIGINT into this Exception once it has stopped the ranks:
        # end as any tool stopped by that signal does (exitcodes.run), not as an internal error
        _drop_partial(report, started)
        if exc.sigval == signal.SIGINT:
            raise KeyboardInterrupt from None
        raise exitcodes.Stopped() from None
    except BaseException:
        _drop_partial(report, started)
        raise
    return exitcodes.OK


def _drop_partial(report: Path, started: float) -> None:
    """A report.json this failed run wrote goes: a failed run leaves none (an earlier run's is kept)."""
    try:
        if report.stat().st_mtime >= started - 1:
            report.unlink()
    except FileNotFoundError:
        pass


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    opts = parser.parse_args(argv)
    return exitcodes.main("drafter-launch", lambda: run(opts))


if __name__ == "__main__":
    exitcodes.run("drafter-launch", lambda: run(build_parser().parse_args()))
