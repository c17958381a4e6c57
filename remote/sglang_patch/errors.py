"""Why the patcher refuses to act.

Every error carries a one-paragraph message that names the file or field at fault and the fix; the
envelope prints it on stderr and as an ``error`` event and exits REFUSED (remote/exitcodes.py)
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

Beside it, ``VerifyFailed``: verify's finding (exit CHECK_FAILED), not a refusal. All of them derive
from ``remote.exitcodes.ToolError``, whose envelope (``exitcodes.main``) reports them.
"""
from __future__ import annotations

from ..exitcodes import CHECK_FAILED, ToolError


class PatchError(ToolError):
    """Base class: the patcher refused (exit REFUSED); nothing was changed."""


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


class VerifyFailed(ToolError):
    """``verify`` ran to the end and a file does not capture the embedding: a finding (exit
    CHECK_FAILED, its message alone on stderr), not a refusal; patch.json's ``error_type`` stays null."""

    exit_code = CHECK_FAILED
    headed = False
