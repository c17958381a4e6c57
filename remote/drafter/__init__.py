"""Standalone EAGLE-3 draft evaluator (GPU side; torch + safetensors + stdlib only).

Public API::

    from remote.drafter import load_checkpoint, Verifier, DumpSet, evaluate, EvalOptions

    draft, info = load_checkpoint("ckpt/", verifier=Verifier("target/"))   # or verifier=None
    logits = draft.forward(aux, input_ids, steps=3)   # list of [B, N, Vd], one per TTT step
    report = evaluate(EvalOptions(ckpt=Path("ckpt"), data=Path("dumps")))  # also writes report.json

The names load on first use (PEP 562), so a stdlib-only submodule such as ``demo_spec`` runs
without torch. See docs/drafter.md for the alignment of ``aux``/``input_ids``, the CLI and the report schema.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .data.dumps import DumpSet, Sample, SlotInfo
    from .errors import (
        ConfigError,
        CorruptFileError,
        DataError,
        DrafterError,
        EmptyDataError,
        MissingTensorError,
        NonFiniteError,
        OptionError,
        ResourceError,
        ShapeMismatchError,
        UnsupportedError,
    )
    from .evaluation import evaluate
    from .load.checkpoint import CheckpointInfo, load_checkpoint
    from .load.verifier import Verifier
    from .model.draft import DraftArch, Eagle3Draft
    from .options import EvalOptions
    from .report import SCHEMA

_WHERE = {
    "CheckpointInfo": "load.checkpoint", "load_checkpoint": "load.checkpoint",
    "DumpSet": "data.dumps", "Sample": "data.dumps", "SlotInfo": "data.dumps",
    **dict.fromkeys(("ConfigError", "CorruptFileError", "DataError", "DrafterError", "EmptyDataError",
                     "MissingTensorError", "NonFiniteError", "OptionError", "ResourceError",
                     "ShapeMismatchError", "UnsupportedError"), "errors"),
    "evaluate": "evaluation", "DraftArch": "model.draft", "Eagle3Draft": "model.draft", "EvalOptions": "options",
    "SCHEMA": "report", "Verifier": "load.verifier",
}

__all__ = [
    "SCHEMA", "CheckpointInfo", "ConfigError", "CorruptFileError", "DataError", "DraftArch", "DrafterError",
    "DumpSet", "Eagle3Draft", "EmptyDataError", "EvalOptions", "MissingTensorError", "NonFiniteError",
    "OptionError", "ResourceError", "Sample", "ShapeMismatchError", "SlotInfo", "UnsupportedError", "Verifier",
    "evaluate", "load_checkpoint",
]


def __getattr__(name: str) -> Any:
    """Load a public name's submodule the first time the name is asked for."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
