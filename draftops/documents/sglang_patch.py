"""``draftops.sglang-patch/1``: ``patch.json``, what ``invoke patch-sglang[.apply|.verify|.revert]`` did.

Written by ``remote/sglang_patch/__main__.py`` (its fields: ``remote/sglang_patch/__init__.py``);
read here once, then shown as a table by ``draftops.cli.sglang.show_patch``.
"""
from __future__ import annotations

from draftops.documents import Document, Part


class PatchedFile(Part):
    file: str
    model: str = ""
    state: str
    detail: str | None = None


class Check(Part):
    file: str
    check: str
    ok: bool
    detail: str | None = None


class SglangPatch(Document):
    SCHEMA = "draftops.sglang-patch/1"
    TASK = "invoke patch-sglang"

    action: str | None = None
    ok: bool = False
    sglang_version: str | None = None
    files: list[PatchedFile] = []
    changed: list[str] = []
    checks: list[Check] = []
    notes: list[str] = []
