"""What a test-drafter run was asked for, and the two forms it takes from there: the evaluator's
options (``EvalOptions``, whose ``to_argv`` is the job's argument list) and the job's own record of
its arguments (``given``: job.json, `invoke runs`, the history row)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftops.link.host import Host
from draftops.runs import jobs
from draftops.runs.hostfiles import host_path
from draftops.serve.host_engine import HostEngine
from remote.drafter.options import EvalOptions


@dataclass(frozen=True)
class Asked:
    """The flags of one evaluation, paths as typed for the host (``ckpt``/``data`` None: the demo)."""

    ckpt: str | None = None
    data: str | None = None
    verifier: str | None = None
    config: str | None = None
    steps: int = 3
    limit: int | None = None
    expected_acc: float | None = None
    expected_accept_length: float | None = None
    expected_from: str | None = None
    full: bool = False
    seed: int | None = None
    device: str = "auto"
    gpus: int | None = None     # a torchrun of this many ranks per host (implies full)
    hosts: tuple[str, ...] = ()  # --hosts, when the torchrun spreads over several
    nodes: int | None = None    # --nodes of a Slurm host
    port: int | None = None     # the torchrun's rendezvous port on its first node
    measured: str | None = None  # the capture-check run whose measured slot layers it uses
    temperatures: tuple[float, ...] = ()  # also predict the accept length at these sampling temperatures

    def on_host(self, host: Host) -> Asked:
        """The paths made absolute as the host reads them (``hostfiles.host_path``)."""
        return dataclasses.replace(self, ckpt=host_path(host, self.ckpt), data=host_path(host, self.data),
                                   verifier=host_path(host, self.verifier), config=host_path(host, self.config))

    @property
    def scores_all(self) -> bool:
        return self.full or bool(self.gpus)      # a torchrun scores every sample

    def options(self, served: HostEngine, runs_dir: str, kept_states: bool) -> EvalOptions:
        """The evaluator's options: these flags, the engine the host serves with, the measured layers."""
        measured = f"{runs_dir}/{self.measured}" if self.measured else None
        return EvalOptions(
            ckpt=Path(self.ckpt or ""), data=Path(self.data or ""), demo=not (self.ckpt and self.data),
            verifier=_path(self.verifier), config=_path(self.config), steps=self.steps, limit=self.limit,
            expected_acc=self.expected_acc, expected_accept_length=self.expected_accept_length,
            expected_from=self.expected_from or "vllm", full=self.scores_all, seed=self.seed or 0,
            device=self.device, **served.eval_fields(), temperatures=self.temperatures, out=Path(jobs.RUN_DIR),
            measured=_path(measured and f"{measured}/capture-check.json"),
            engine_states=_path(measured and kept_states and f"{measured}/engine-states"))

    def given(self) -> dict[str, Any]:
        """The run's arguments as the job and the history keep them."""
        return {"ckpt": self.ckpt, "data": self.data, "verifier": self.verifier, "config": self.config,
                "steps": self.steps, "limit": self.limit, "expected_acc": self.expected_acc,
                "expected_accept_length": self.expected_accept_length, "expected_from": self.expected_from,
                "device": self.device, "measured_by": self.measured,
                **({"full": True} if self.scores_all else {}), **({"seed": self.seed} if self.seed is not None else {}),
                **({"gpus": self.gpus} if self.gpus else {}),
                **({"hosts": ",".join(self.hosts)} if len(self.hosts) > 1 else {}),
                **({"nodes": self.nodes} if self.nodes else {}),
                **({"temperature": ",".join(f"{t:g}" for t in self.temperatures)} if self.temperatures else {})}


def _path(text: str | None | bool) -> Path | None:
    return Path(text) if isinstance(text, str) and text else None
