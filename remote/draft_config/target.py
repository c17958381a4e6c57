"""What the rewriter needs from the target model's config: layer count, width, architecture."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .config_file import read_config
from .errors import ConfigFormatError

#: nested configs of multimodal wrappers (Kimi K2.5 keeps DeepSeek's config in text_config)
_NESTED = ("text_config", "language_config", "llm_config")


@dataclass
class TargetInfo:
    path: str
    num_hidden_layers: int
    hidden_size: int | None
    architectures: list[str]
    max_position_embeddings: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def load_target(path: Path) -> TargetInfo:
    """Read the target's config.json (``path`` is the model folder or the file itself)."""
    config, _, data = read_config(path, "target", "Pass --target the target model folder (the one SGLang "
                                  "serves), or leave --target out to skip the range check.")
    holders = [data] + [data[k] for k in _NESTED if isinstance(data.get(k), dict)]
    layers = _first_int(holders, "num_hidden_layers")
    if layers is None:
        raise ConfigFormatError(
            f"{config} has no num_hidden_layers (top level or {', '.join(_NESTED)}); cannot check "
            "the layer ids against the target. Leave --target out to skip the check."
        )
    archs = [str(a) for a in data.get("architectures") or []]
    return TargetInfo(path=str(config), num_hidden_layers=layers,
                      hidden_size=_first_int(holders, "hidden_size"), architectures=archs,
                      max_position_embeddings=_first_int(holders, "max_position_embeddings"))


def _first_int(holders: list[dict[str, Any]], key: str) -> int | None:
    for holder in holders:
        value = holder.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None
