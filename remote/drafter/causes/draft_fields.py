"""The few draft-config values the config-level cause checks compare (positions.py, vocab_size.py)
that the loader does not keep: read once per evaluation from the same file, through the draft
config's checked reader (config.read_json: bounded, regular files only), each with the dotted name
a fix must name (the decoder fields sit in ``transformer_layer_config`` in the speculators format)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...eagle import formats
from ..load import config
from .facts import Facts

#: where a key is read from when neither config gives it (transformers' LlamaConfig default)
DEFAULT_MAX_POSITIONS = 2048


@dataclass(frozen=True)
class DraftFields:
    """Raw values of the draft config (None: absent or not an integer)."""

    path: str
    prefix: str                        # dotted prefix of the decoder fields ("" or "transformer_layer_config.")
    max_position_embeddings: int | None
    draft_vocab_size: int | None
    vocab_size: int | None


def _integer(obj: Any, key: str) -> int | None:
    if not isinstance(obj, dict) or not config.is_integral(obj.get(key)):
        return None
    return int(obj[key])


def read(facts: Facts) -> DraftFields:
    """The draft config's fields, cached on ``facts.extra`` (several checks ask)."""
    cached = facts.extra.get(_KEY)
    if isinstance(cached, DraftFields):
        return cached
    raw, path = config.read_json(facts.opts.ckpt, facts.opts.config)
    fmt = facts.ctx.info.format
    layer = formats.layer_config(raw, fmt)
    found = DraftFields(str(path), formats.layer_prefix(fmt), _integer(layer, "max_position_embeddings"),
                        _integer(raw, "draft_vocab_size"), _integer(layer, "vocab_size"))
    facts.extra[_KEY] = found
    return found


_KEY = "draft-config-fields"
