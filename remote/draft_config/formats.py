"""The two draft config formats and where each keeps its aux layer ids.

* flat (SGLang/vLLM-native ``LlamaForCausalLMEagle3``):
  ``eagle_config.eagle_aux_hidden_state_layer_ids`` in SGLang's output-of-layer convention
  (-1 = embedding; SGLang captures before layer id + 1). The only field SGLang's target reads.
* speculators (``speculators_model_type``): top-level ``eagle_aux_hidden_state_layer_ids`` in the
  vLLM/speculators convention (id k = residual stream after k layers, 0 = embedding), i.e. the
  SGLang id + 1; speculators rejects negative ids there.

Ids enter and leave this module in the SGLang convention; ``to_file``/``from_file`` convert.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigFormatError

FLAT = "flat"
SPECULATORS = "speculators"
SGLANG_CONVENTION = "sglang-output-of-layer"
VLLM_CONVENTION = "vllm-after-k-layers"
IDS_KEY = "eagle_aux_hidden_state_layer_ids"


@dataclass
class DraftConfig:
    """A checkpoint's config.json, parsed, with its format."""

    path: Path
    raw: bytes
    data: dict[str, Any]
    format: str

    @property
    def field(self) -> str:
        return f"eagle_config.{IDS_KEY}" if self.format == FLAT else IDS_KEY

    @property
    def convention(self) -> str:
        return SGLANG_CONVENTION if self.format == FLAT else VLLM_CONVENTION

    def file_ids(self) -> list[int] | None:
        """Ids as stored in the file (file convention), or None when absent/null."""
        holder = self.data.get("eagle_config") if self.format == FLAT else self.data
        ids = holder.get(IDS_KEY) if isinstance(holder, dict) else None
        if ids is None:
            return None
        if not isinstance(ids, list) or not all(_is_int(v) for v in ids):
            raise ConfigFormatError(
                f"{self.path}: {self.field} is {ids!r}, not a list of integers. Fix it by hand "
                "or restore the checkpoint's original config.json."
            )
        return list(ids)

    def to_file(self, sglang_ids: list[int]) -> list[int]:
        """SGLang-convention ids as this format stores them."""
        return list(sglang_ids) if self.format == FLAT else [v + 1 for v in sglang_ids]

    def with_ids(self, sglang_ids: list[int]) -> dict[str, Any]:
        """A copy of the config with the ids replaced (key order kept)."""
        data = json.loads(self.raw)
        written = self.to_file(sglang_ids)
        if self.format == FLAT:
            eagle = data.get("eagle_config")
            if eagle is None:
                data["eagle_config"] = {IDS_KEY: written}
            elif isinstance(eagle, dict):
                eagle[IDS_KEY] = written
            else:
                raise ConfigFormatError(
                    f"{self.path}: eagle_config is {type(eagle).__name__}, not an object; fix it "
                    "by hand before rewriting the layer ids."
                )
        else:
            data[IDS_KEY] = written
        return data

    def hidden_size(self) -> int | None:
        """The draft's own hidden size."""
        holder = (self.data.get("transformer_layer_config") if self.format == SPECULATORS
                  else self.data)
        value = holder.get("hidden_size") if isinstance(holder, dict) else None
        return value if _is_int(value) else None

    def target_hidden_size(self) -> int | None:
        value = self.data.get("target_hidden_size")
        return value if _is_int(value) else None

    def declared_aux_count(self) -> int | None:
        """``num_aux_hidden_states`` when the config declares it (SGLang >= 0.5.12 honours it)."""
        for holder in (self.data, self.data.get("eagle_config")):
            if isinstance(holder, dict) and _is_int(holder.get("num_aux_hidden_states")):
                return holder["num_aux_hidden_states"]
        return None

    def stray_top_level_ids(self) -> list[int] | None:
        """Flat configs only: a top-level id list SGLang ignores (vLLM prefers it)."""
        if self.format != FLAT:
            return None
        ids = self.data.get(IDS_KEY)
        return ids if isinstance(ids, list) else None


def load(ckpt: Path) -> DraftConfig:
    """Read ``ckpt/config.json`` (or ``ckpt`` itself when it is a file) and detect its format."""
    path = ckpt if ckpt.is_file() else ckpt / "config.json"
    try:
        raw = path.read_bytes()
        data = json.loads(raw)
    except (OSError, ValueError) as exc:
        raise ConfigFormatError(
            f"Cannot read the draft config {path} ({exc}). Pass --ckpt the checkpoint folder that "
            "holds config.json."
        ) from exc
    if not isinstance(data, dict):
        raise ConfigFormatError(f"{path} holds {type(data).__name__}, not a JSON object.")
    return DraftConfig(path=path, raw=raw, data=data, format=detect(data, path))


def detect(data: dict[str, Any], path: Path) -> str:
    """``speculators`` or ``flat``; anything else is refused."""
    if "speculators_model_type" in data or "transformer_layer_config" in data:
        return SPECULATORS
    archs = data.get("architectures") or []
    if "eagle_config" in data or any("eagle3" in str(a).lower() for a in archs):
        return FLAT
    raise ConfigFormatError(
        f"{path} is not an EAGLE-3 draft config: it has no speculators_model_type or "
        "transformer_layer_config (speculators format), and no eagle_config or *Eagle3* entry in "
        "architectures (flat format). Point --ckpt at the draft checkpoint, not the target."
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
