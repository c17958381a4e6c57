"""``draftops.draft-config/1``: ``draft_config.json``, what ``invoke draft-config`` wrote (or would write).

Written by ``remote/draft_config/__main__.py`` (its fields: ``remote/draft_config/__init__.py``);
read here once, then shown by ``draftops.cli.sglang.show_draft_config``.
"""
from __future__ import annotations

from pydantic import Field

from draftops.documents import Document


class DraftConfigResult(Document):
    SCHEMA = "draftops.draft-config/1"
    TASK = "invoke draft-config"

    ok: bool = False
    config: str | None = None
    format: str | None = None
    ids_field: str | None = Field(None, alias="field")
    old_ids: list[int] | None = None
    written_ids: list[int] | None = None
    changed: bool = False
    dry_run: bool = False
    backup: str | None = None
    warnings: list[str] = []
