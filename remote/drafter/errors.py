"""Errors raised by the drafter, each with a one-paragraph message a person can act on.

The GPU host cannot import ``draftops``, so the hierarchy lives here, under ``remote.exitcodes.ToolError``:
the envelope of ``python -m remote.drafter`` (``exitcodes.main``) turns any of them into exit code 3,
the message on stderr and one ``error`` event on stdout (``to_dict``: kind, message, path, field,
tensor, expected, found, fix; and the exit code) for a program that follows the job's log.
Every message names the file and the field or tensor involved, what was expected and what was
found, and how to fix it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..exitcodes import ToolError


class DrafterError(ToolError):
    """Base of every error the drafter reports instead of a traceback (exit REFUSED)."""

    kind = "drafter"

    def __init__(
        self,
        problem: str,
        *,
        path: str | Path | None = None,
        field: str | None = None,
        tensor: str | None = None,
        expected: Any = None,
        found: Any = None,
        fix: str | None = None,
    ) -> None:
        self.problem = problem
        self.path = str(path) if path is not None else None
        self.field = field
        self.tensor = tensor
        self.expected = expected
        self.found = found
        self.fix = fix
        super().__init__(self._compose())

    def _compose(self) -> str:
        parts = [self.problem.rstrip(".") + "."]
        if self.path:
            parts.append(f"File: {self.path}.")
        if self.field:
            parts.append(f"Field: {self.field}.")
        if self.tensor:
            parts.append(f"Tensor: {self.tensor}.")
        if self.expected is not None or self.found is not None:
            parts.append(f"Expected {_fmt(self.expected)}, found {_fmt(self.found)}.")
        if self.fix:
            parts.append("Fix: " + self.fix.rstrip(".") + ".")
        return " ".join(parts).replace("\r", " ").replace("\n", " ")  # one paragraph, always

    def event_fields(self) -> dict[str, Any]:
        """The ``error`` event says all of :meth:`to_dict`."""
        return {k: v for k, v in self.to_dict().items() if k != "message"}

    def to_dict(self) -> dict[str, Any]:
        """Machine-readable form for the ``error`` event."""
        return {
            "kind": self.kind,
            "message": str(self),
            "path": self.path,
            "field": self.field,
            "tensor": self.tensor,
            "expected": _fmt(self.expected) if self.expected is not None else None,
            "found": _fmt(self.found) if self.found is not None else None,
            "fix": self.fix,
        }


def _fmt(value: Any, limit: int = 200) -> str:
    if isinstance(value, (tuple, list)) and all(isinstance(v, int) for v in value):
        text = "[" + ", ".join(str(v) for v in value) + "]"
    else:
        text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ConfigError(DrafterError):
    """config.json is missing, unreadable, holds a bad value, or contradicts the weights."""

    kind = "config"


class OptionError(DrafterError):
    """A command-line option (or EvalOptions field) is out of its range."""

    kind = "option"


class ResourceError(DrafterError):
    """The machine ran out of memory for this evaluation."""

    kind = "resource"


class NonFiniteError(DrafterError):
    """A weight tensor holds NaN or inf (a dump with such values is skipped, not an error)."""

    kind = "non_finite"


class CorruptFileError(DrafterError):
    """A safetensors/.pt file is truncated or not parseable."""

    kind = "corrupt_file"


class MissingTensorError(DrafterError):
    """A tensor the forward pass needs is in none of the files."""

    kind = "missing_tensor"


class ShapeMismatchError(DrafterError):
    """Two tensors (or a tensor and the config) disagree on a dimension."""

    kind = "shape_mismatch"


class DataError(DrafterError):
    """The hidden-state dump cannot be used as given."""

    kind = "data"


class EmptyDataError(DataError):
    """The data path holds no dump file."""

    kind = "empty_data"


class UnsupportedError(DrafterError):
    """A feature of the checkpoint this evaluator does not implement."""

    kind = "unsupported"


class RankError(DrafterError):
    """A torchrun of the evaluator that cannot go on: a rank died or failed, or the ranks disagree
    about their dumps (remote/drafter/launch/distributed.py, launch.py)."""

    kind = "rank"
