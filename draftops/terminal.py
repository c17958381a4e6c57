"""Make text from a host safe to show on the user's terminal.

Job logs and remote error messages are written by programs we do not control; an escape sequence in
them could move the cursor, retitle the window, rewrite what was shown before or set a clipboard
(OSC 52). Everything shown from a host goes through :func:`clean` first: newlines and tabs stay,
escape sequences and other control characters go.
"""
from __future__ import annotations

import re

_ESCAPES = re.compile(
    r"""
      \x1b\[[0-?]*[ -/]*[@-~]?            # CSI: ESC [ params intermediates final
    | \x1b\][^\x07\x1b\x9c\n]*(?:\x07|\x1b\\|\x9c)?   # OSC: ESC ] ... BEL or ST (or the line's end)
    | \x1b[PX^_][^\x1b\x9c\n]*(?:\x1b\\|\x9c)?        # DCS, SOS, PM, APC strings
    | \x1b[ -/]*[0-~]?                    # any other escape: ESC intermediates final
    | \x9b[0-?]*[ -/]*[@-~]?              # 8-bit CSI
    | [\x90\x98\x9d-\x9f][^\x07\x9c\n]*(?:\x07|\x9c)?  # 8-bit DCS/SOS/OSC/PM/APC strings
    """,
    re.VERBOSE,
)
# C0 controls except tab and newline, DEL, C1 controls, and the bidi overrides that reorder what is
# shown ("Trojan Source").
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def clean(text: str) -> str:
    """``text`` without terminal escape sequences or control characters (tabs and newlines kept).

    A carriage return inside a line (progress bars redraw that way) keeps what a terminal would
    show: the text after the last one."""
    if not needs_cleaning(text):                  # the common case, at a few hundred ns per line
        return text
    if "\r" in text:
        text = "\n".join(_last_redraw(line) for line in text.replace("\r\n", "\n").split("\n"))
    return _CONTROLS.sub("", _ESCAPES.sub("", text))


def needs_cleaning(text: str) -> bool:
    """Whether ``text`` holds anything :func:`clean` would change (ESC and CR are controls too)."""
    return _CONTROLS.search(text) is not None


def _last_redraw(line: str) -> str:
    parts = [part for part in line.split("\r") if part]
    return parts[-1] if parts else ""


def markup_safe(text: str) -> str:
    """Host text ready for rich markup: terminal escapes and control characters removed, then rich's
    brackets escaped (rich imported only when something is shown)."""
    from rich.markup import escape as rich_escape

    return rich_escape(clean(text))
