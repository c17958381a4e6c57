"""The engine's own hidden states for the samples the capture check sent, kept as a speculators-format
dump set (``<run>/engine-states/``): SpecForge's and ModelOpt's dumps hold only the slots training
used, so the layout the engine will feed can only be scored on these (``eval --engine-states``).

Each file is ``hs_{i}.safetensors`` (``i``: the sample's index in the dump set it was sent from, so the
drafter can check the tokens against that dump) with ``token_ids`` [T] and ``hidden_states`` [T, n+1, H]
in the dtype the engine gave; ``data_config.json`` names the slots: vLLM boundaries 0..n, the final
slot n, the target's ``num_hidden_layers``. Files are written atomically, the config last (a folder
without it is an unfinished keep, and the drafter refuses it). A pull leaves the folder on the host
(``HOST_ONLY``): only the host's tools read it, and on a real target it runs to gigabytes.
"""
from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import torch

from .. import fileio

FOLDER = "engine-states"
CONFIG = "data_config.json"
#: draftops/onhost/wire.py HOST_ONLY: a pull leaves the folder on the host (remote/ imports nothing of draftops)
HOST_ONLY = ".draftops-host-only"
#: bytes per value the disk check counts before the engine has said its dtype (fp32, the widest it gives)
BYTES_PER_VALUE = 4


def kept_bytes(tokens: int, boundaries: int, hidden: int) -> int:
    """What keeping ``tokens`` rows of every boundary costs on disk, at most."""
    return tokens * boundaries * hidden * BYTES_PER_VALUE


class Keeper:
    """Writes one file per sample into ``folder``; ``finish`` writes the config; ``discard`` removes it
    all (a check that failed keeps nothing)."""

    def __init__(self, folder: Path, num_layers: int) -> None:
        self.folder = folder
        self.num_layers = num_layers
        self.samples = 0
        self.bytes = 0
        self.dtype: str | None = None
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)

    def add(self, index: int, token_ids: torch.Tensor, hidden: torch.Tensor) -> None:
        from safetensors.torch import save

        data = save({"token_ids": token_ids.to(torch.long).reshape(-1).contiguous(),
                     "hidden_states": hidden.contiguous()})
        fileio.atomic_write_bytes(self.folder / f"hs_{index}.safetensors", data)
        self.samples += 1
        self.bytes += len(data)
        self.dtype = str(hidden.dtype).replace("torch.", "")

    def finish(self) -> dict[str, Any]:
        """Write data_config.json; the report's ``engine_states`` entry."""
        n = self.num_layers
        config = {"layer_ids": list(range(n + 1)), "layer_id_convention": "vllm", "final_slot": n,
                  "num_hidden_layers": n,
                  "source": "invoke capture-check: the engine's own states at every layer boundary "
                            "(0 = embedding, k = after k layers) for the dump samples it was sent"}
        buf = io.StringIO()
        json.dump(config, buf, indent=2)
        fileio.atomic_write_text(self.folder / CONFIG, buf.getvalue() + "\n")
        fileio.atomic_write_text(self.folder / HOST_ONLY, f"The engine's states for {self.samples} dump samples "
                                 f"({self.bytes} bytes) stay on the host: `invoke test-drafter` scores the draft "
                                 "on them there (eval --engine-states).\n")
        return {"path": str(self.folder), "samples": self.samples, "slots": n + 1, "bytes": self.bytes,
                "layer_id_convention": "vllm", "layer_ids": list(range(n + 1)), "final_slot": n, "dtype": self.dtype}

    def discard(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def absent(why: str) -> dict[str, Any]:
    """The report's ``engine_states`` entry when none were kept."""
    return {"path": None, "samples": 0, "slots": 0, "absent": why}
