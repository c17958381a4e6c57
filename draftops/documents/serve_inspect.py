"""``draftops.serve-inspect/1``: what ``remote.serve inspect`` found on the host about the engine, the
target and the draft, as the chosen engine will read them.

Written by ``remote/serve/configs.py`` (``inspect``; its parts: ``engine_info``, ``TargetInfo.to_json``,
``draft_facts``, ``convention.Reading.to_dict``, ``CaptureStatus.to_dict``); read here once, by
``draftops.serve.hosttool.inspect`` for the pre-start checks (``draftops.serve.checks``) and the
start of ``invoke serve``, and as the ``inspect`` part of a bench run's ``host.json``
(``draftops.documents.bench_run``). Problems are data here (``target_error``, ``draft.error``,
``sglang.error``); the local side words the refusals.
"""
from __future__ import annotations

from typing import Any

from draftops.documents import Document, Part


class EngineFacts(Part):
    """``engine``: whether the serve profile's python imports the engine, and its version."""

    name: str | None = None
    python: str | None = None
    importable: bool = False
    version: str | None = None
    location: str | None = None


class TargetFacts(Part):
    """``target``: the target's config (``remote.draft_config.target.TargetInfo``)."""

    path: str | None = None
    num_hidden_layers: int | None = None
    hidden_size: int | None = None
    architectures: list[str] = []
    max_position_embeddings: int | None = None


class Reading(Part):
    """``draft.reading``: the ids one engine reads from the draft config (``convention.Reading``)."""

    engine: str | None = None
    format: str | None = None
    field: str | None = None               # None: the engine fell back to its default
    ids: list[int] | None = None
    boundaries: list[int] | None = None
    fallback: bool = False
    out_of_range: list[int] = []
    ignored: dict[str, list[int]] = {}
    malformed: dict[str, Any] = {}         # field -> what the user's config holds there, as written
    needs_embedding: bool = False


class DraftFacts(Part):
    """``draft``: the draft's config; past ``error`` only what could be read, past ``format`` only
    when the format was recognised. ``architectures`` and ``speculators_model_type`` are the user's
    config values as written (any JSON), for the refusal's text."""

    path: str | None = None
    config: str | None = None
    error: str | None = None
    architectures: Any = None
    speculators_model_type: Any = None
    algorithm: str | None = None
    max_position_embeddings: int | None = None
    weights: list[str] = []
    format: str | None = None
    native_engine: str | None = None
    reading: Reading | None = None
    explain: str = ""
    ids_by_engine: dict[str, list[int] | None] = {}


class CaptureSummary(Part):
    """``sglang.summary``: the SGLang the patcher found, and each patched file's state."""

    version: str | None = None
    dir: str | None = None
    files: dict[str, str] = {}


class CaptureFacts(Part):
    """``sglang``: whether the host's SGLang captures what the draft's ids ask for (``CaptureStatus``)."""

    summary: CaptureSummary | None = None       # None: SGLang was not found
    embedding: list[str] = []                   # model files that would not capture id -1
    graph: list[str] = []                       # runners that replace the ids in graph mode
    error: str | None = None
    # read as a bench result's ``patch_state``; ``CaptureStatus.to_dict`` has never written it, so
    # that field is null today (kept as it was; a key the tool may add within the version)
    state: str | None = None


class ServeInspect(Document):
    SCHEMA = "draftops.serve-inspect/1"
    TASK = "invoke serve"

    engine: EngineFacts = EngineFacts()
    target: TargetFacts | None = None
    target_error: str | None = None
    draft: DraftFacts | None = None
    sglang: CaptureFacts | None = None
