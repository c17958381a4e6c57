"""Config-level causes (remote/drafter/causes/positions.py, vocab_size.py, engine_version.py): the
healthy draft and dumps, with one config value as a real mistake leaves it, or the host's engine
version. The lab target's config names no rope and no max_position_embeddings; a case that needs
them serves a copy of the target whose config.json says them."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from remote.eagle.formats import LAYER_CONFIG

from .healthy import Healthy, Variant

#: what a Llama-3.1 target's config says of its rope (a scaling the demo-style draft lacks)
LLAMA31_ROPE = {"rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                          "high_freq_factor": 4.0,
                                                          "original_max_position_embeddings": 8192}}


def target_with(base: Healthy, out: Path, **fields: Any) -> Path:
    """A copy of the lab target whose config.json also holds ``fields``."""
    shutil.copytree(base.target, out)
    cfg = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, **fields}))
    return out


def rope_differs(base: Healthy, out: Path) -> Variant:
    """The target has Llama-3.1's scaled rope; the draft's config kept default rope (speculators #574's
    conversion dropped rope_scaling)."""
    return Variant(base.draft, verifier=target_with(base, out / "target", **LLAMA31_ROPE))


def context_beyond_training(base: Healthy, out: Path) -> Variant:
    """A draft that knows 32 positions (its config's max_position_embeddings) served at the target's 2,048."""
    def edit(cfg: dict[str, Any]) -> None:
        cfg[LAYER_CONFIG]["max_position_embeddings"] = 32
    return Variant(base.draft_with(out / "draft", lambda w: None, edit),
                   verifier=target_with(base, out / "target", max_position_embeddings=2048))


def vocab_size_mismatch(base: Healthy, out: Path) -> Variant:
    """draft_vocab_size 16 above the lm_head's rows and d2t's length (a config written for another
    draft vocabulary, SpecForge PR #602)."""
    def edit(cfg: dict[str, Any]) -> None:
        cfg["draft_vocab_size"] = int(cfg["draft_vocab_size"]) + 16
    return Variant(base.draft_with(out / "draft", lambda w: None, edit))


def _second_layer(weights: dict[str, torch.Tensor]) -> None:
    """A second decoder layer that adds nothing (its output projections zero): the draft's predictions
    are the healthy ones, so the finding alone is the case's."""
    h = weights["norm.weight"].shape[0]
    for name in [n for n in weights if n.startswith("layers.0.") and "hidden_norm" not in n]:
        tensor = weights[name].clone()
        if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
            tensor = tensor[:, h:].clone()   # layers after the first take the hidden alone (H, not 2H)
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            tensor = torch.zeros_like(tensor)
        weights["layers.1." + name.removeprefix("layers.0.")] = tensor


def multi_layer_draft(base: Healthy, out: Path) -> Variant:
    """Two decoder layers, served by vLLM 0.32.0 (it runs both; vllm #33330 reports later positions
    collapsing)."""
    def edit(cfg: dict[str, Any]) -> None:
        cfg[LAYER_CONFIG]["num_hidden_layers"] = 2
    return Variant(base.draft_with(out / "draft", _second_layer, edit),
                   options={"engine": "vllm", "engine_version": "0.32.0"})


def engine_known_regression(base: Healthy, out: Path) -> Variant:
    """The host serves with vLLM 0.19.1, inside vllm #41838's confirmed range."""
    return Variant(base.draft, options={"engine": "vllm", "engine_version": "0.19.1"})
