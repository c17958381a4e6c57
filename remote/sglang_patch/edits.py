"""Byte-exact text edits located through ``ast`` nodes.

The patch rewrites a handful of spans (a method name, an expression, a call) and inserts a few
lines; everything else must stay byte for byte as shipped so that ``revert`` and ``diff`` stay
trivial. ``ast`` gives line numbers and UTF-8 byte columns, which ``Source`` turns into offsets.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass


@dataclass(frozen=True)
class Edit:
    """Replace ``data[start:end]`` by ``text`` (an insertion when start == end)."""

    start: int
    end: int
    text: str


class Source:
    """A python file's bytes plus its parsed tree, with node-to-offset helpers."""

    def __init__(self, data: bytes, filename: str = "<sglang>") -> None:
        self.data = data
        self.filename = filename
        self.tree = ast.parse(data, filename=filename)
        self._line_starts = [0]
        for line in data.splitlines(keepends=True):
            self._line_starts.append(self._line_starts[-1] + len(line))

    def offset(self, lineno: int, col: int) -> int:
        """Byte offset of (1-based line, byte column)."""
        return self._line_starts[lineno - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        """Byte range of ``node``'s source text."""
        return (self.offset(node.lineno, node.col_offset),  # type: ignore[attr-defined]
                self.offset(node.end_lineno, node.end_col_offset))  # type: ignore[attr-defined]

    def segment(self, node: ast.AST) -> str:
        """Source text of ``node``."""
        start, end = self.span(node)
        return self.data[start:end].decode("utf-8")

    def line_start(self, node: ast.AST) -> int:
        """Offset of the first byte of ``node``'s first line."""
        return self._line_starts[node.lineno - 1]  # type: ignore[attr-defined]

    def indent(self, node: ast.AST) -> str:
        """Leading whitespace of ``node``'s first line."""
        start = self.line_start(node)
        line = self.data[start:self.offset(node.lineno, node.col_offset)]  # type: ignore[attr-defined]
        return line.decode("utf-8") if not line.strip() else " " * len(line)

    def comment_before(self, node: ast.AST, text: str) -> Edit:
        """An edit inserting ``# text`` on its own line above statement ``node``."""
        return Edit(self.line_start(node), self.line_start(node), f"{self.indent(node)}# {text}\n")

    def append(self, text: str) -> Edit:
        """An edit appending ``text`` after the last byte (adding a newline first if missing)."""
        end = len(self.data)
        lead = "" if self.data.endswith(b"\n") or not self.data else "\n"
        return Edit(end, end, lead + text)

    def apply(self, edits: list[Edit]) -> bytes:
        """The file with ``edits`` applied; overlapping edits are a bug and raise ValueError."""
        out = self.data
        last_start = len(out) + 1
        for edit in sorted(edits, key=lambda e: (e.start, e.end), reverse=True):
            if edit.end > last_start:
                raise ValueError(f"overlapping edits at byte {edit.start} in {self.filename}")
            out = out[:edit.start] + edit.text.encode("utf-8") + out[edit.end:]
            last_start = edit.start
        return out


def parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    """Map every node to its parent (ast has no back links)."""
    out: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            out[child] = node
    return out


def enclosing_statement(node: ast.AST, parent_of: dict[ast.AST, ast.AST]) -> ast.stmt:
    """The innermost statement that contains ``node``."""
    current = node
    while not isinstance(current, ast.stmt):
        current = parent_of[current]
    return current
