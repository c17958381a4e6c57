"""``draftops.capture-check/1``: ``capture-check.json``, what the serving engine's own hidden states
say of a dump's slots (and of a draft's configured ids).

Written by ``remote/capture/cli.py``; read here once, then shown by ``draftops.cli.capture`` and
read by ``invoke serve`` and ``invoke test-drafter`` (``draftops.serve.capture_checks``).
"""
from __future__ import annotations

from draftops.documents import Document, Part


class SlotEntry(Part):
    slot: int
    boundary: int
    relative_error: float
    runner_up: int | None = None
    runner_up_error: float | None = None
    threshold: float | None = None
    matched: bool
    cosine: float | None = None
    norm_ratio: float | None = None
    layer: str | None = None
    vllm_id: int | None = None
    sglang_id: int | None = None
    declared_boundary: int | None = None
    agrees_with_data_config: bool | None = None


class Difference(Part):
    slot: int
    nearest_boundary: int
    relative_error: float
    kind: str
    text: str


class DraftFix(Part):
    field: str
    ids: list[int]
    engine: str
    boundaries: list[int]
    sglang_ids: list[int]
    vllm_ids: list[int]
    needs_capture_patch: bool = False


class DraftFeed(Part):
    path: str
    format: str
    engine: str
    field: str | None = None
    ids: list[int] | None = None
    fallback: bool = False
    fed_boundaries: list[int] | None = None
    trained_slots: list[int] = []
    trained_boundaries: list[int | None] = []
    status: str
    fix: DraftFix | None = None


class EngineInfo(Part):
    name: str
    version: str | None = None
    python: str
    tp: int = 1


class TargetInfo(Part):
    path: str
    num_hidden_layers: int
    hidden_size: int
    config_sha256: str
    weights_listing_sha256: str


class DataInfo(Part):
    path: str
    samples: int
    tokens: int
    slots: int


class EngineStates(Part):
    """``engine_states`` (added): the engine's own states for the samples sent, kept as a speculators
    dump set every boundary of which is a slot (vLLM only); ``path`` None and ``absent`` saying why
    otherwise (SGLang returns the final post-norm state only)."""

    path: str | None = None
    samples: int = 0
    slots: int = 0
    bytes: int = 0
    dtype: str | None = None
    absent: str | None = None


class CaptureCheck(Document):
    SCHEMA = "draftops.capture-check/1"
    TASK = "invoke capture-check"

    status: str
    headline: str
    lines: list[str]
    engine: EngineInfo
    target: TargetInfo
    data: DataInfo
    match_rule: str
    slots: list[SlotEntry]
    final_slot: int | None = None
    differences: list[Difference] = []
    draft: DraftFeed | None = None
    seconds: dict[str, float] = {}
    engine_states: EngineStates | None = None     # added: absent from reports older than it
