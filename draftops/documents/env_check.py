"""``draftops.env/1``: ``env.json``, what ``invoke env.check`` found in the host's ml-env.

Written by ``remote/envcheck.py`` (``collect``); read here once, then shown by ``invoke env.check``
(``draftops.cli.env.env_rows``) and summed up in a night's report header
(``draftops.nightly.results.describe``).
"""
from __future__ import annotations

from typing import Any

from pydantic import Field

from draftops.documents import Document, Part


class Device(Part):
    """``torch.devices[]``: one CUDA device as torch sees it."""

    index: int | None = None
    name: str | None = None
    memory_gib: float | None = None
    capability: str | None = None


class TorchInfo(Part):
    """``torch``: whether the ml-env imports torch (``error`` says why not), its build and devices."""

    available: bool = False
    error: str | None = None
    version: str | None = None
    cuda_build: str | None = None
    cuda_available: bool | None = None
    devices: list[Device] = []


class GpuRow(Part):
    """``nvidia_smi[]``: one row of ``nvidia-smi --query-gpu``, its fields as nvidia-smi names them (in
    its order), or the one ``error`` saying why nvidia-smi gave no rows."""

    index: str | None = None
    name: str | None = None
    memory_total: str | None = Field(None, alias="memory.total")
    driver_version: str | None = None
    error: str | None = None

    def shown(self) -> dict[str, Any]:
        """The fields the row holds, by nvidia-smi's names, in its order (for the env.check table)."""
        return self.model_dump(by_alias=True, exclude_unset=True)


class EnvCheck(Document):
    SCHEMA = "draftops.env/1"
    TASK = "invoke env.check"

    python: str | None = None
    executable: str | None = None
    platform: str | None = None
    hostname: str | None = None
    packages: dict[str, str | None] = {}
    torch: TorchInfo = TorchInfo()
    nvidia_smi: list[GpuRow] | None = None          # None: no nvidia-smi on the host
