"""The JSON documents the remote tools write, each read once, where it enters, into its typed model.

A remote tool (stdlib + torch, no pydantic) writes a versioned JSON document; the local side reads
it here, once, into a pydantic model, and every reader after that uses attributes: no ``.get()``
chains, no ``isinstance`` guards. One model per document (docs/architecture.md § The JSON documents
says which reads which): ``drafter_report``, ``serve_inspect``, ``sglang_patch``, ``draft_config``,
``env_check``, ``bench_compare`` (``compare.json``), ``bench_run`` (a bench run's ``runner.json`` and
``host.json``); the bench result, which the local side writes too, is ``draftops.bench.result`` (its
own messages, these checks).

The rules every model follows, so a document is refused the same way whichever it is:

- Keys are only ever added within a version, so a model allows keys it does not name (a newer tool
  of the same version), and a reader refuses a version it does not know with a message naming it.
- A document that fails its model is one paragraph naming the file and the field
  (:class:`~draftops.errors.DocumentError`), never a pydantic traceback. NaN and infinity are
  refused (the tools write null for a value they did not measure), and so are values of the wrong
  type, as ``draftops.bench.result.load`` does for the bench result.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from draftops.errors import DocumentError
from remote import jsonread


class Part(BaseModel):
    """A part of a document: unknown keys are kept (keys are only ever added within a version)."""

    model_config = ConfigDict(extra="allow")


class Document(Part):
    """A whole document: its ``schema`` value and the task that writes it again (for the fix)."""

    SCHEMA: ClassVar[str] = ""        # empty: a run's own file that names no version (must be an object)
    TASK: ClassVar[str] = ""          # what to run again when the file is broken


D = TypeVar("D", bound=Document)


class NamedStep(Protocol):
    """A step of a document of steps: its name, its runs and those of its attempts that did not finish."""

    name: str
    runs: list[str]
    earlier: list[str]


S = TypeVar("S", bound=NamedStep)


class StepsOf(Generic[S]):
    """What a document of steps (doctor.json, tune.json) answers about them, over its ``steps``."""

    if TYPE_CHECKING:
        steps: list[S]

    def step(self, name: str) -> S:
        return next(s for s in self.steps if s.name == name)

    def has(self, name: str) -> bool:
        return any(s.name == name for s in self.steps)

    def runs(self) -> list[str]:
        return [run for s in self.steps for run in (*s.earlier, *s.runs)]


def non_finite(value: Any, where: str = "") -> str | None:
    """The dotted path of the first NaN or infinity in a JSON value (json reads them; no tool writes them)."""
    if isinstance(value, float) and not math.isfinite(value):
        return where or "(top level)"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = non_finite(item, f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None


def first_problem(exc: ValidationError) -> str:
    """``field 'a.b': what is wrong (N problem(s) in all)``: the first of pydantic's errors, in one line."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "(top level)"
    return f"field '{where}': {first['msg']} ({len(exc.errors())} problem(s) in all)"


def parse(model: type[D], doc: Any, source: str | Path) -> D:
    """``doc`` (parsed JSON) as ``model``; ``source`` names the file (or the answer) in the message."""
    again = f"run `{model.TASK}` again" if model.TASK else "run the tool that wrote it again"
    _check_schema(model, doc, source, again)
    where = non_finite(doc)
    if where is not None:
        raise DocumentError(f"{source}: field '{where}' is not a finite number (NaN or infinity); the tool writes "
                            f"null for a value it did not measure, so the file was edited or is broken: {again}.")
    try:
        return model.model_validate(doc)
    except ValidationError as exc:
        raise DocumentError(f"{source}: {first_problem(exc)}. The file was edited or written by a broken run: "
                            f"{again}.") from None


def other_schema(doc: Any, schema: str) -> Any:
    """What ``doc`` (parsed JSON) is instead of a ``schema`` document: the ``schema`` it names, or its
    type's name when it is no object; None when it is one. Every versioned file's reader asks this."""
    if isinstance(doc, dict) and doc.get("schema") == schema:
        return None
    return doc.get("schema") if isinstance(doc, dict) else type(doc).__name__


def _check_schema(model: type[Document], doc: Any, source: str | Path, again: str) -> None:
    """Refuse another version than the model's (or, for a file that names none, a value that is no object)."""
    if isinstance(doc, dict) and not model.SCHEMA:
        return
    if not model.SCHEMA:
        raise DocumentError(f"{source} holds {type(doc).__name__}, not a JSON object; the run that wrote it was "
                            f"cut off or the file was edited: {again}.")
    found = other_schema(doc, model.SCHEMA)
    if found is None:
        return
    raise DocumentError(f"{source} has schema {found!r}; this draftops reads {model.SCHEMA}. Use a draftops "
                        f"of the same generation as the run that wrote it, or {again}.")


def load(model: type[D], path: Path) -> D:
    """Read the file at ``path`` as ``model`` (see :func:`parse`); unreadable JSON is one paragraph too."""
    try:
        doc = jsonread.load(Path(path))          # a regular file only (not a FIFO, not /dev/zero), bounded
    except FileNotFoundError:
        raise DocumentError(f"there is no {path}: give the id of a run whose folder holds it "
                            "(`invoke runs --local` lists them).") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise DocumentError(f"{path} is not readable JSON ({exc}); the run that wrote it may have been cut "
                            f"off: run `{model.TASK or 'the tool'}` again.") from None
    return parse(model, doc, path)
