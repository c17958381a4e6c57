"""The ranks of a torchrun of the evaluator: who this process is, its share of the work, and the
process group, every wait bounded.

``python -m remote.drafter.launch --gpus N ...`` (launch.py) starts one ``python -m remote.drafter
eval`` per GPU under torchrun; each finds its rank here (:func:`from_env`). One process is the
world of one (:data:`SINGLE`): the evaluator runs the same code either way, sharing out nothing.
The default group is NCCL on GPUs and gloo on CPU; what the ranks exchange (counts, fingerprints)
is small Python data on the host, so it travels on a gloo group in both cases.
"""
from __future__ import annotations

import datetime
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from ..errors import RankError
from .launch_line import COLLECTIVE_TIMEOUT_S

T = TypeVar("T")

#: set by the launcher for its ranks: an evaluator that finds it is one rank of a torchrun
MARK = "DRAFTOPS_DRAFTER_TORCHRUN"
#: seconds a collective may wait for the slowest rank (the launcher's --collective-timeout)
TIMEOUT_ENV = "DRAFTOPS_COLLECTIVE_TIMEOUT"
DEFAULT_TIMEOUT_S = COLLECTIVE_TIMEOUT_S


@dataclass(frozen=True)
class World:
    """This process's rank among ``size`` (``local_rank`` on its node, whose name is ``host``)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    host: str = ""
    group: Any = None   # the gloo group the objects travel on (None: the world of one)

    @property
    def main(self) -> bool:
        """Rank 0: the one that reports and writes report.json."""
        return self.rank == 0

    def shard(self, items: Sequence[T]) -> list[T]:
        """This rank's share of ``items``: every ``size``-th one from its rank (all of them alone)."""
        return list(items[self.rank::self.size])

    def chunk(self, items: Sequence[T]) -> list[T]:
        """This rank's contiguous share of ``items`` (the first ranks one more when they do not divide)."""
        base, extra = divmod(len(items), self.size)
        start = self.rank * base + min(self.rank, extra)
        return list(items[start:start + base + (1 if self.rank < extra else 0)])

    def all_gather(self, value: T) -> list[T]:
        """Every rank's ``value``, in rank order (within the collective timeout)."""
        if self.size == 1:
            return [value]
        out: list[Any] = [None] * self.size
        _collective(self, "exchange", lambda: torch.distributed.all_gather_object(out, value, group=self.group))
        return out

    def gather(self, value: T) -> list[T] | None:
        """Every rank's ``value`` on rank 0, in rank order; None on the others."""
        if self.size == 1:
            return [value]
        out: list[Any] | None = [None] * self.size if self.main else None
        _collective(self, "gather", lambda: torch.distributed.gather_object(value, out, dst=0, group=self.group))
        return out


SINGLE = World()


def _collective(world: World, what: str, call: Any) -> None:
    """``call()``; a rank that died or hung past the timeout ends this one with one paragraph (the
    launcher names the rank that died first)."""
    try:
        call()
    except RuntimeError as exc:
        raise RankError(f"Rank {world.rank} of {world.size} (host {world.host}) could not {what} the counts with the "
                        f"other ranks: one of them ended or hung past the collective timeout ({_timeout_s()} s): "
                        f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
                        fix="see the launcher's line naming the rank that failed first; a slow rank needs a longer "
                            "--collective-timeout") from exc


def _timeout_s() -> int:
    try:
        return max(1, int(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S)))
    except ValueError:
        return DEFAULT_TIMEOUT_S


def from_env(device: torch.device) -> World:
    """The world this process is in: :data:`SINGLE`, or (under the launcher) its rank, after joining
    the process group (NCCL on a CUDA ``device``, gloo on CPU)."""
    if os.environ.get(MARK) != "1" or "RANK" not in os.environ:
        return SINGLE
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    timeout = datetime.timedelta(seconds=_timeout_s())
    dist = torch.distributed
    if not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
            dist.init_process_group("nccl", timeout=timeout, device_id=device)
        else:
            dist.init_process_group("gloo", timeout=timeout)
    group = dist.new_group(backend="gloo", timeout=timeout) if device.type == "cuda" else dist.group.WORLD
    return World(rank, size, local, socket.gethostname(), group)


def device_of(name: str) -> str:
    """The device a rank runs on: ``cuda:LOCAL_RANK`` for a rank of a GPU torchrun, else ``name``."""
    if os.environ.get(MARK) == "1" and name in ("auto", "cuda") and torch.cuda.is_available():
        return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return name


def teardown(world: World) -> None:
    """Leave the process group (nothing for the world of one)."""
    if world.size > 1 and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
