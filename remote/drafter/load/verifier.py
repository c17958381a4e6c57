"""The three tensors of the target (verifier) model the drafter needs, read without loading it.

``embed_tokens`` (when the draft checkpoint ships none), ``model.norm`` and the ``lm_head`` rows of
the draft vocabulary (speculators' ``verifier_norm`` and ``verifier_lm_head[t2d]``).  Names are
found by suffix so wrapped models (``language_model.model.*``) work too; MTP layers are skipped.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..errors import MissingTensorError, ShapeMismatchError
from ..store.tensorstore import TensorStore
from .config import Fields, json_object


class Verifier:
    """A target checkpoint in HF layout (``model.embed_tokens.weight``, ``model.norm.weight``,
    ``lm_head.weight``), sharded or not."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.store = TensorStore.open(self.path)
        self.config, fields = _read_config(self.path)
        self._layers = fields.integer("num_hidden_layers") if fields else None
        names = [n for n in self.store.names() if ".layers." not in n and not n.startswith("layers.")]
        self.embed_name = _pick(names, "embed_tokens.weight")
        self.norm_name = _pick([n for n in names if n.endswith("model.norm.weight") or n == "norm.weight"],
                               "norm.weight")
        head = _pick(names, "lm_head.weight")
        if head is None and self.config.get("tie_word_embeddings") is False:
            # the embedding would stand in for the head and every verifier target would be wrong
            raise MissingTensorError(
                "The verifier has no lm_head and its config says the head is not the embedding "
                "(tie_word_embeddings false)", path=self.path, tensor="lm_head.weight",
                expected="present", found="absent",
                fix="copy the target's complete weights (the shard holding lm_head.weight is missing)")
        self.head_name = head or self.embed_name
        self.tied = head is None

    @property
    def num_hidden_layers(self) -> int | None:
        return self._layers

    @property
    def hidden_size(self) -> int:
        name = self._require(self.embed_name, "model.embed_tokens.weight")
        shape = self.store.shape(name)
        if len(shape) != 2:
            raise ShapeMismatchError("The verifier's embedding is not a matrix", path=self.path, tensor=name,
                                     expected="[V, H]", found=list(shape),
                                     fix="pass --verifier the target model folder in HF layout")
        return shape[1]

    def check_head_width(self, hidden: int) -> None:
        """``model.norm`` [H] and ``lm_head`` [V, H] must have the embedding's width: a verifier
        assembled from two models would otherwise fail inside torch, or score with a broadcast norm."""
        for wanted, found_name in (("model.norm.weight", self.norm_name), ("lm_head.weight", self.head_name)):
            name = self._require(found_name, wanted)
            shape = self.store.shape(name)
            expected = [hidden] if wanted == "model.norm.weight" else f"[V, {hidden}]"
            if len(shape) != (1 if wanted == "model.norm.weight" else 2) or shape[-1] != hidden:
                raise ShapeMismatchError(
                    "A verifier tensor's width differs from its embedding's and the draft's",
                    path=self.store.info(name).path, tensor=name, expected=expected, found=list(shape),
                    fix="pass --verifier one complete target model folder, the one the draft was trained for")

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


#: a bad verifier config value: the fix is the target's own config, not the draft's --config
VERIFIER_SOURCE = "as in the target model's own config.json (pass --verifier the target's folder)"


def _read_config(path: Path) -> tuple[dict[str, Any], Fields | None]:
    """The target's text config (``text_config`` of a multimodal one), with checked reads of it."""
    file = path / "config.json" if path.is_dir() else path.parent / "config.json"
    if not file.is_file():
        return {}, None
    cfg = json_object(file, "The verifier config.json", "repair or remove the file")
    text = cfg.get("text_config")
    if isinstance(text, dict):
        return text, Fields(text, file, "text_config.", VERIFIER_SOURCE)
    return cfg, Fields(cfg, file, "", VERIFIER_SOURCE)
