"""Prompt files for the benchmark clients.

draftops takes one dataset format, JSONL with a ``prompt`` per line (what ``vllm bench serve
--dataset-name custom`` reads as is). SGLang's client reads ShareGPT JSON (``--dataset-name
sharegpt --dataset-path``, in every version), so the runner converts the file on the host.
"""
from __future__ import annotations

import itertools
import json
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from ..fileio import atomic_write_text
from .errors import BenchParseError

#: a prompt file larger than this is refused: the runner holds it (and its conversion) in memory
MAX_BYTES = 256 << 20
#: one line (one prompt) longer than this is refused while reading, never read whole
MAX_LINE = 8 << 20
_FIX = 'Give a regular UTF-8 JSONL file with one {"prompt": "..."} object per line.'
_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str | None:
    """What a non-regular file is, in words; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _refuse_kind(path: Path, mode: int) -> None:
    kind = _kind(mode)
    if kind is not None:
        real = os.path.realpath(path)
        where = f" (it leads to {real})" if real != str(path) else ""
        raise BenchParseError(f"the dataset {path} is {kind}{where}, not a regular file: reading it would never "
                              f"end or block the benchmark. {_FIX}")


def _refuse_size(path: Path, size: int) -> None:
    if size > MAX_BYTES:
        raise BenchParseError(f"the dataset {path} holds {size} bytes, more than the {MAX_BYTES >> 20} MiB a prompt "
                              f"file may have (the benchmark keeps it in memory). Use fewer prompts. {_FIX}")


def _open(path: Path) -> BinaryIO:
    """The dataset opened for reading, only if it is (after links) a regular file of a bounded size:
    /dev/zero would grow the runner without end and a FIFO would block it. Checked before the open and
    again on the open file (O_NONBLOCK, so opening a FIFO swapped in meanwhile cannot block)."""
    try:
        _refuse_kind(path, os.stat(path).st_mode)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise BenchParseError(f"cannot read the dataset {path}: {exc.strerror or exc}. {_FIX}") from None
    try:
        info = os.fstat(fd)
        _refuse_kind(path, info.st_mode)
        _refuse_size(path, info.st_size)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of the file, each line bounded by MAX_LINE and the whole by MAX_BYTES."""
    total = 0
    with _open(path) as fh:
        for lineno in itertools.count(1):
            raw = fh.readline(MAX_LINE + 1)
            if not raw:
                return
            total += len(raw)
            if len(raw) > MAX_LINE and not raw.endswith(b"\n"):
                raise BenchParseError(f"{path}:{lineno}: the line is longer than {MAX_LINE >> 20} MiB; a prompt "
                                      f"line must be shorter. {_FIX}")
            _refuse_size(path, total)           # it grew while being read
            try:
                yield lineno, raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise BenchParseError(f"{path}:{lineno}: not UTF-8 ({exc.reason} at byte {exc.start}). "
                                      f"{_FIX}") from None


def read_prompts(path: str | Path) -> list[str]:
    """The prompts of a JSONL file; any bad line is an error naming the file and line."""
    path = Path(path)
    prompts = []
    for lineno, line in _lines(path):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise BenchParseError(f"{path}:{lineno}: not JSON ({exc}); each line must be one "
                                  '{"prompt": "..."} object.') from exc
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"]:
            raise BenchParseError(f'{path}:{lineno}: no non-empty string "prompt" field; each line must be '
                                  'one {"prompt": "..."} object.')
        prompts.append(row["prompt"])
    if not prompts:
        raise BenchParseError(f'{path}: no prompts; it needs one {{"prompt": "..."}} object per line.')
    return prompts


def to_sharegpt(prompts: list[str]) -> list[dict[str, object]]:
    """ShareGPT conversations SGLang's sampler accepts (≥2 turns; the reply is replaced by the
    fixed ``--sharegpt-output-len``, so it only has to be non-empty)."""
    return [{"id": f"draftops-{i}", "conversations": [{"from": "human", "value": p},
                                                       {"from": "gpt", "value": "."}]}
            for i, p in enumerate(prompts)]


def write_sharegpt(src: str | Path, dest: str | Path) -> int:
    """Convert ``src`` (prompt JSONL) into ``dest`` (ShareGPT JSON); returns the prompt count."""
    prompts = read_prompts(src)
    atomic_write_text(Path(dest), json.dumps(to_sharegpt(prompts), ensure_ascii=False))
    return len(prompts)


def main() -> int:
    """``python -m remote.bench.datasets PROMPTS.jsonl SHAREGPT.json``: prints the prompt count; a
    file that cannot be converted is a BenchParseError, which the envelope reports (exit REFUSED)."""
    print(write_sharegpt(sys.argv[1], sys.argv[2]))
    return 0


if __name__ == "__main__":
    from .. import exitcodes  # only as a tool: the runner and the local side import this module
    exitcodes.run("bench-datasets", main)
