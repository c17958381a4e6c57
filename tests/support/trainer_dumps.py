"""Writers of SpecForge's and ModelOpt's hidden-state dump formats, for tests (the layouts in
remote/drafter/data/dumpformats.py): the demo's states, or any [N, T, S, H] slots, written out as each
trainer writes them, holding only the slots training used (aux slots, then the final one)."""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file


def _split(slots: torch.Tensor, aux: list[int], final: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([T, k*H] aux concatenated on the last axis in the given order, [T, H] final) of one sample."""
    return slots[:, aux].reshape(slots.shape[0], -1).contiguous(), slots[:, final].contiguous()


def write_specforge(folder: Path, ids: torch.Tensor, slots: torch.Tensor, aux: list[int], final: int,
                    per_folder: int = 64, gz_from: int | None = None) -> list[Path]:
    """One ``data_{i}.ckpt`` per sample in ``rows_{a}-{b}/`` folders of ``per_folder``; samples from
    ``gz_from`` on as ``.ckpt.gz``. ``ids`` [N, T], ``slots`` [N, T, S, H]. Returns the files in order."""
    out = []
    for i in range(ids.shape[0]):
        start = i // per_folder * per_folder
        sub = folder / f"rows_{start}-{start + per_folder}"
        sub.mkdir(parents=True, exist_ok=True)
        a, f = _split(slots[i], aux, final)
        record = {"input_ids": ids[i][None].clone(), "loss_mask": torch.ones(ids.shape[1], dtype=torch.long),
                  "hidden_state": f, "aux_hidden_state": a}
        if gz_from is not None and i >= gz_from:
            path = sub / f"data_{i}.ckpt.gz"
            with gzip.open(path, "wb") as fh:
                torch.save(record, fh)
        else:
            path = sub / f"data_{i}.ckpt"
            torch.save(record, path)
        out.append(path)
    return out


def write_modelopt(folder: Path, ids: torch.Tensor, slots: torch.Tensor, aux: list[int], final: int) -> list[Path]:
    """One ``conv-{i}.pt`` per conversation: input_ids, hidden_states (final), aux_hidden_states."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(ids.shape[0]):
        a, f = _split(slots[i], aux, final)
        path = folder / f"conv-{i}.pt"
        torch.save({"input_ids": ids[i].clone(), "hidden_states": f, "aux_hidden_states": a}, path)
        out.append(path)
    return out


def write_speculators(folder: Path, ids: torch.Tensor, slots: torch.Tensor, keep: list[int]) -> None:
    """speculators safetensors dumps holding only the slots ``keep`` (in that order)."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(ids.shape[0]):
        save_file({"token_ids": ids[i].contiguous(), "hidden_states": slots[i][:, keep].contiguous()},
                  str(folder / f"hs_{i}.safetensors"))


def write_data_config(folder: Path, cfg: dict[str, Any]) -> Path:
    path = folder / "data_config.json"
    path.write_text(json.dumps(cfg, indent=2) + "\n")
    return path
