"""Standalone EAGLE-3 draft evaluator (GPU side; torch + safetensors + stdlib only).

Public API::

    from remote.drafter import load_checkpoint, Verifier, DumpSet, evaluate, EvalOptions

    draft, info = load_checkpoint("ckpt/", verifier=Verifier("target/"))   # or verifier=None
    logits = draft.forward(aux, input_ids, steps=3)   # list of [B, N, Vd], one per TTT step
    report = evaluate(EvalOptions(ckpt=Path("ckpt"), data=Path("dumps")))  # also writes report.json

See docs/drafter.md for the alignment of ``aux``/``input_ids``, the CLI and the report schema.
"""
from .checkpoint import CheckpointInfo, load_checkpoint
from .data import DumpSet, Sample, SlotInfo
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
from .evaluate import evaluate
from .model import DraftArch, Eagle3Draft
from .options import EvalOptions
from .report import SCHEMA
from .verifier import Verifier

__all__ = [
    "SCHEMA", "CheckpointInfo", "ConfigError", "CorruptFileError", "DataError", "DraftArch", "DrafterError",
    "DumpSet", "Eagle3Draft", "EmptyDataError", "EvalOptions", "MissingTensorError", "NonFiniteError",
    "OptionError", "ResourceError", "Sample", "ShapeMismatchError", "SlotInfo", "UnsupportedError", "Verifier",
    "evaluate", "load_checkpoint",
]
