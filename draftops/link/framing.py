"""Reading the host agent's framed answers (docs/protocol.md § Framing).

The host's shell start-up files may print anything before the agent runs, so every reply starts
after a marker line that holds a nonce the local side chose for this call; what comes before it is
noise. These helpers only split bytes: ``draftops.link.agent`` turns a ``FramingError`` into an
``AgentError`` that names the host and the command.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from draftops.onhost import wire
from draftops.terminal import clean

HEADER_MAX = 1 << 16     # a stream header longer than this is refused


class FramingError(ValueError):
    """The bytes after a reply marker are not one JSON object on one line."""


def marker(prefix: str, nonce: str) -> bytes:
    return f"\n{prefix}{nonce}\n".encode()


def _json_object(line: bytes, what: str) -> dict[str, Any]:
    shown = clean(line[:200].decode("utf-8", "replace"))
    try:
        value = json.loads(line)
    except ValueError:
        raise FramingError(f"its {what} is not JSON: {shown!r}") from None
    if not isinstance(value, dict):
        raise FramingError(f"its {what} is not a JSON object: {shown!r}")
    return value


def split_replies(stdout: bytes, nonce: str) -> tuple[list[dict[str, Any]], bytes]:
    """The JSON replies in an agent's stdout (each on the line after a marker) and the noise before
    the first marker. A marker followed by something that is not a JSON object is a FramingError."""
    noise, *framed = stdout.split(marker(wire.FRAME_PREFIX, nonce))
    return [_json_object(part.split(b"\n", 1)[0], "reply") for part in framed], noise


def error_text(stderr: bytes, nonce: str) -> str:
    """The agent's error message: what follows its error marker, or all of stderr (a traceback, or a
    shell's "python3: not found") when there is none."""
    mark = marker(wire.ERROR_PREFIX, nonce)
    if mark in stderr:
        stderr = stderr.rsplit(mark, 1)[1]
    return stderr.decode("utf-8", "replace")


class Unframer:
    """Skips what comes before an agent stream's marker (bounded: keeps its first and last 4 KiB for
    error messages), reads the JSON header line after it, then passes every byte on."""

    NOISE_KEPT = 4096

    def __init__(self, nonce: str, on_output: Callable[[bytes], object],
                 on_header: Callable[[dict[str, Any]], None]):
        self.marker = marker(wire.FRAME_PREFIX, nonce)
        self.on_output, self.on_header = on_output, on_header
        self.pending = bytearray()
        self.noise_head, self.noise_tail, self.noise_dropped = bytearray(), bytearray(), False
        self.framed = False
        self.header: dict[str, Any] | None = None

    @property
    def noise(self) -> bytes:
        """What came before the marker (or everything, when none came), middle left out if long."""
        rest = self.noise_tail + (b"" if self.framed else self.pending)
        return bytes(self.noise_head) + (b"\n...\n" if self.noise_dropped else b"") + bytes(rest)

    def _keep_noise(self, data: bytes | bytearray) -> None:
        room = self.NOISE_KEPT - len(self.noise_head)
        self.noise_head += data[:max(0, room)]
        self.noise_tail += data[max(0, room):]
        if len(self.noise_tail) > self.NOISE_KEPT:
            self.noise_dropped = True
            del self.noise_tail[:len(self.noise_tail) - self.NOISE_KEPT]

    def feed(self, chunk: bytes) -> None:
        if self.header is not None:
            self.on_output(chunk)
            return
        self.pending += chunk
        if not self.framed:
            at = self.pending.find(self.marker)
            if at < 0:
                cut = max(0, len(self.pending) - (len(self.marker) - 1))   # a marker may straddle chunks
                self._keep_noise(self.pending[:cut])
                del self.pending[:cut]
                return
            self._keep_noise(self.pending[:at])
            del self.pending[:at + len(self.marker)]
            self.framed = True
        end = self.pending.find(b"\n")
        if end < 0:
            if len(self.pending) > HEADER_MAX:
                raise FramingError(f"its stream header is longer than {HEADER_MAX >> 10} KiB")
            return
        self.header = _json_object(bytes(self.pending[:end]), "stream header")
        rest = bytes(self.pending[end + 1:])
        self.pending.clear()
        self.on_header(self.header)
        if rest:
            self.on_output(rest)
