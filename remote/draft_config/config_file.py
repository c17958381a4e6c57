"""The draft's config.json as draft-config rewrites it: read, its ids, a copy with new ids.

The formats, the ids field of each and the id arithmetic are ``remote.eagle``'s; this module only
reads the file, refuses what is not an EAGLE-3 draft config, and builds the rewritten object. Ids
enter and leave in SGLang's output-of-layer convention; ``to_file`` converts for the file's format.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import jsonread
from ..eagle import convention, formats
from ..eagle.formats import EAGLE_CONFIG, FLAT, IDS_KEY, is_int
from .errors import ConfigFormatError


@dataclass
class DraftConfig:
    """A checkpoint's config.json, parsed, with its format."""

    path: Path
    raw: bytes
    data: dict[str, Any]
    format: str

    @property
    def field(self) -> str:
        return formats.ids_field(self.format)

    @property
    def convention(self) -> str:
        return formats.FILE_CONVENTION[self.format]

    def file_ids(self) -> list[int] | None:
        """Ids as stored in the file (file convention), or None when absent/null."""
        ids = formats.field_value(self.data, self.field)
        if ids is None:
            return None
        if not isinstance(ids, list) or not all(is_int(v) for v in ids):
            raise ConfigFormatError(
                f"{self.path}: {self.field} is {ids!r}, not a list of integers. Fix it by hand "
                "or restore the checkpoint's original config.json."
            )
        return list(ids)

    def to_file(self, sglang_ids: list[int]) -> list[int]:
        """SGLang-convention ids as this format stores them."""
        return convention.sglang_to_file(self.format, sglang_ids)

    def with_ids(self, sglang_ids: list[int]) -> dict[str, Any]:
        """A copy of the config with the ids replaced (key order kept)."""
        data = jsonread.loads(self.raw)
        written = self.to_file(sglang_ids)
        if self.format == FLAT:
            eagle = data.get(EAGLE_CONFIG)
            if eagle is None:
                data[EAGLE_CONFIG] = {IDS_KEY: written}
            elif isinstance(eagle, dict):
                eagle[IDS_KEY] = written
            else:
                raise ConfigFormatError(
                    f"{self.path}: {EAGLE_CONFIG} is {type(eagle).__name__}, not an object; fix it "
                    "by hand before rewriting the layer ids."
                )
        else:
            data[IDS_KEY] = written
        return data

    def hidden_size(self) -> int | None:
        """The draft's own hidden size."""
        holder = formats.layer_config(self.data, self.format)
        value = holder.get("hidden_size") if isinstance(holder, dict) else None
        return value if is_int(value) else None

    def target_hidden_size(self) -> int | None:
        value = self.data.get("target_hidden_size")
        return value if is_int(value) else None

    def declared_aux_count(self) -> int | None:
        """``num_aux_hidden_states`` when the config declares it (SGLang >= 0.5.12 honours it)."""
        for holder in (self.data, self.data.get(EAGLE_CONFIG)):
            if isinstance(holder, dict) and is_int(holder.get("num_aux_hidden_states")):
                return holder["num_aux_hidden_states"]
        return None

    def stray_top_level_ids(self) -> list[int] | None:
        """Flat configs only: a top-level id list SGLang ignores (vLLM prefers it)."""
        if self.format != FLAT:
            return None
        ids = self.data.get(IDS_KEY)
        return ids if isinstance(ids, list) else None


def read_config(folder: Path, what: str, fix: str) -> tuple[Path, bytes, Any]:
    """``folder/config.json`` (or ``folder`` itself when it is a file): the file, its bytes and its JSON,
    read bounded; one that cannot be read is a ConfigFormatError naming the ``what`` config and ``fix``."""
    path = folder if folder.is_file() else folder / "config.json"
    try:
        raw = jsonread.read_bounded(path)
        return path, raw, jsonread.loads(raw)
    except (OSError, ValueError) as exc:
        raise ConfigFormatError(f"Cannot read the {what} config {path} ({exc}). {fix}") from exc


def load(ckpt: Path) -> DraftConfig:
    """Read ``ckpt/config.json`` (or ``ckpt`` itself when it is a file) and detect its format."""
    path, raw, data = read_config(ckpt, "draft", "Pass --ckpt the checkpoint folder that holds config.json.")
    if not isinstance(data, dict):
        raise ConfigFormatError(f"{path} holds {type(data).__name__}, not a JSON object.")
    fmt = formats.detect(data)
    if fmt is None:
        raise ConfigFormatError(f"{path} is not an EAGLE-3 draft config: {formats.NOT_A_DRAFT}. Point "
                                "--ckpt at the draft checkpoint, not the target.")
    return DraftConfig(path=path, raw=raw, data=data, format=fmt)
