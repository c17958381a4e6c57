"""The three tensors of the target (verifier) model the drafter needs, read without loading it.

``embed_tokens`` (when the draft checkpoint ships none), ``model.norm`` and the ``lm_head`` rows of
the draft vocabulary (speculators' ``verifier_norm`` and ``verifier_lm_head[t2d]``).  Names are
found by suffix so wrapped models (``language_model.model.*``) work too; MTP layers are skipped.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from .errors import ConfigError, MissingTensorError
from .tensorstore import TensorStore


class Verifier:
    """A target checkpoint in HF layout (``model.embed_tokens.weight``, ``model.norm.weight``,
    ``lm_head.weight``), sharded or not."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.store = TensorStore.open(self.path)
        self.config = _read_config(self.path)
        names = [n for n in self.store.names() if ".layers." not in n and not n.startswith("layers.")]
        self.embed_name = _pick(names, "embed_tokens.weight")
        self.norm_name = _pick([n for n in names if n.endswith("model.norm.weight") or n == "norm.weight"],
                               "norm.weight")
        head = _pick(names, "lm_head.weight")
        self.head_name = head or self.embed_name
        self.tied = head is None

    @property
    def num_hidden_layers(self) -> int | None:
        value = self.config.get("num_hidden_layers")
        return int(value) if value is not None else None

    @property
    def hidden_size(self) -> int:
        return self.store.shape(self._require(self.embed_name, "model.embed_tokens.weight"))[1]

    def embed_tokens(self) -> torch.Tensor:
        return self.store.get(self._require(self.embed_name, "model.embed_tokens.weight"))

    def final_norm(self) -> torch.Tensor:
        return self.store.get(self._require(self.norm_name, "model.norm.weight"))

    def lm_head_rows(self, target_ids: torch.Tensor) -> torch.Tensor:
        """Rows ``target_ids`` (ascending) of the lm_head: [len(ids), H]."""
        return self.store.get_rows(self._require(self.head_name, "lm_head.weight"), target_ids)

    def describe(self) -> dict[str, Any]:
        return {"path": str(self.path), "files": [str(f) for f in self.store.files],
                "embed": self.embed_name, "norm": self.norm_name, "lm_head": self.head_name,
                "tied_lm_head": self.tied, "num_hidden_layers": self.num_hidden_layers}

    def _require(self, name: str | None, wanted: str) -> str:
        if name is None:
            raise MissingTensorError(
                "The verifier checkpoint lacks a tensor the drafter needs",
                path=self.path, tensor=wanted, expected="present", found="absent",
                fix="pass --verifier the target model folder in HF layout (with its safetensors shards)",
            )
        return name


def _pick(names: list[str], suffix: str) -> str | None:
    hits = [n for n in names if n == suffix or n.endswith("." + suffix)]
    return min(hits, key=len) if hits else None


def _read_config(path: Path) -> dict[str, Any]:
    file = path / "config.json" if path.is_dir() else path.parent / "config.json"
    if not file.is_file():
        return {}
    try:
        cfg = json.loads(file.read_text())
    except ValueError as exc:
        raise ConfigError(f"The verifier config.json is not valid JSON ({exc})", path=file,
                          fix="repair or remove the file") from exc
    return cfg.get("text_config") or cfg
