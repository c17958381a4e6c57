"""The healthy case every broken one is made from: the lab draft trained well on the layers its
config names, the lab dumps written in each trainer's format (only the aux slots and the final one,
plus a data_config.json saying which layers, as SpecForge and ModelOpt write them), the lab target
as verifier.  Built once per process; the training is cached on disk by tests/support/drafter_lab.py."""
from __future__ import annotations

import atexit
import functools
import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from tests.support.drafter_lab import SLOT_IDS, TRAINED, WELL_TRAINED, LabSpec, lab, save, trained_weights
from tests.support.trainer_dumps import write_data_config, write_modelopt, write_specforge, write_speculators

FORMATS = ("speculators", "specforge", "modelopt")
#: how the report's ``data.formats`` names each
REPORTED = {"speculators": "safetensors", "specforge": "specforge", "modelopt": "modelopt"}
AUX = [SLOT_IDS.index(i) for i in TRAINED]  # the lab slots of the trained layers
FINAL = len(SLOT_IDS) - 1  # the lab's final slot (SGLang id 4 = n - 1)
#: eval options every case runs with unless its Variant overrides them (small and fast)
FAST: dict[str, Any] = {"limit": 96, "layout_samples": 32}


@dataclass(frozen=True)
class Variant:
    """What one case evaluates: a draft folder, the dumps per format, the verifier and extra options.
    ``data`` None means the healthy dumps; ``verifier`` None means the healthy (lab) target."""

    draft: Path
    data: dict[str, Path] | None = None
    verifier: Path | None = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Healthy:
    """The healthy case's folders, and helpers that copy them with one change."""

    root: Path
    draft: Path
    data: dict[str, Path]  # format -> dump folder
    target: Path

    def variant(self) -> Variant:
        return Variant(self.draft, self.data, self.target)

    def complete(self, v: Variant) -> Variant:
        """``v`` with the healthy dumps and verifier where it keeps them."""
        return Variant(v.draft, v.data or self.data, v.verifier or self.target, v.options)

    def draft_with(self, out: Path, change: Callable[[dict[str, torch.Tensor]], None],
                   config: Callable[[dict[str, Any]], None] | None = None) -> Path:
        """A copy of the healthy draft at ``out`` with its tensors (and its config.json) edited in place."""
        return rewrite_draft(self.draft, out, change, config)

    def dumps_with(self, out: Path, ids: torch.Tensor, slots: torch.Tensor,
                   data_config: dict[str, Any] | None = None) -> dict[str, Path]:
        """``ids`` [N, T] and lab-shaped ``slots`` [N, T, 5, H] written in every format under ``out``."""
        return write_formats(out, ids, slots, data_config or DATA_CONFIG)


DATA_CONFIG: dict[str, Any] = {"layer_ids": [SLOT_IDS[i] for i in AUX + [FINAL]], "layer_id_convention": "sglang",
                               "final_slot": len(AUX), "num_hidden_layers": LabSpec().layers}


def write_formats(out: Path, ids: torch.Tensor, slots: torch.Tensor, data_config: dict[str, Any]) -> dict[str, Path]:
    """The same states in the three formats, each holding only the aux slots and the final one."""
    folders = {fmt: out / fmt for fmt in FORMATS}
    write_speculators(folders["speculators"], ids, slots, AUX + [FINAL])
    write_specforge(folders["specforge"], ids, slots, AUX, FINAL, per_folder=64)
    write_modelopt(folders["modelopt"], ids, slots, AUX, FINAL)
    for folder in folders.values():
        write_data_config(folder, data_config)
    return folders


def rewrite_draft(src: Path, out: Path, change: Callable[[dict[str, torch.Tensor]], None],
                  config: Callable[[dict[str, Any]], None] | None = None) -> Path:
    """Copy the draft folder ``src`` to ``out``, then let ``change`` edit its tensors (and ``config``
    its config.json) in place."""
    shutil.copytree(src, out)
    weights = load_file(out / "model.safetensors")
    change(weights)
    save_file({k: v.contiguous() for k, v in weights.items()}, out / "model.safetensors")
    if config is not None:
        cfg = json.loads((out / "config.json").read_text())
        config(cfg)
        (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out


@functools.lru_cache(maxsize=1)
def healthy() -> Healthy:
    """The healthy case, once per process (in a temporary folder removed at exit)."""
    root = Path(tempfile.mkdtemp(prefix="draftops-causes-"))
    atexit.register(shutil.rmtree, root, True)
    the_lab = lab()
    draft = save(root / "draft", trained_weights(WELL_TRAINED), TRAINED)
    data = write_formats(root / "data", the_lab.ids, the_lab.slots(), DATA_CONFIG)
    return Healthy(root, draft, data, the_lab.target)
