"""``draftops.draft-flat/1``: ``draft_flat.json``, the flat-format copy ``invoke draft-flat`` wrote.

Written by ``remote/draft_flat/__main__.py`` (its fields: ``remote/draft_flat/__init__.py``); read here
once, then shown by ``draftops.cli.sglang.show_draft_flat``.
"""
from __future__ import annotations

from draftops.documents import Document


class DraftFlatResult(Document):
    SCHEMA = "draftops.draft-flat/1"
    TASK = "invoke draft-flat"

    ok: bool = False
    ckpt: str
    dest: str | None = None
    source_ids: list[int] | None = None
    layer_ids: list[int] | None = None
    ids_from: str | None = None
    tensors: int = 0
    renamed: int = 0
    bytes: int = 0
    files: list[str] = []
    warnings: list[str] = []
