"""Why the patcher refuses to act.

Every error carries a one-paragraph message that names the file or field at fault and the fix; the
CLI prints it on stderr and as an ``error`` event and exits REFUSED (remote/exitcodes.py)
without having changed any file.

    PatchError
    ├── SglangNotFound      no importable ``sglang`` package, or no readable version
    ├── UnknownShape        code matches none of the shapes this patch version knows
    ├── UnsupportedVersion  the requested model file cannot capture configured ids at all
    ├── ModifiedFile        a file differs from what draftops recorded (someone else edited it)
    ├── NotWritable         site-packages (or a file in it) cannot be replaced by this user
    ├── CompileFailed       a patched file would not byte-compile
    ├── StateError          the state folder is missing a record or holds a corrupt backup
    └── Busy                another apply/revert holds the install's lock
"""
from __future__ import annotations

from ..exitcodes import REFUSED


class PatchError(Exception):
    """Base class: the patcher refused; nothing was changed."""

    #: process exit status the CLI uses for this error
    exit_code = REFUSED


class SglangNotFound(PatchError):
    """``importlib.util.find_spec("sglang")`` found nothing, or no version could be read."""


class UnknownShape(PatchError):
    """A file's code matches no known shape; patching it blindly could break the server."""


class UnsupportedVersion(PatchError):
    """The installed SGLang cannot capture configured layer ids for the requested model."""


class ModifiedFile(PatchError):
    """A file's sha256 differs from the one recorded in the state folder."""


class NotWritable(PatchError):
    """The files to change cannot be replaced by this user."""


class CompileFailed(PatchError):
    """A patched file does not byte-compile; the original stays in place."""


class StateError(PatchError):
    """The state folder lacks the record or backup needed for the action."""


class Busy(PatchError):
    """Another apply or revert on the same SGLang install is still running."""
