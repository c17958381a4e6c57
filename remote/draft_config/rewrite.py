"""Write the new config.json: backup first (never overwriting one), then an atomic replace."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from ..fileio import atomic_write_bytes, writable, write_exclusive
from .errors import WriteError


def backup_path(config: Path, stamp: str) -> Path:
    """First free ``config.json.draftops-bak-<stamp>[-n]`` next to ``config``."""
    candidate = config.with_name(f"{config.name}.draftops-bak-{stamp}")
    n = 2
    while candidate.exists():
        candidate = config.with_name(f"{config.name}.draftops-bak-{stamp}-{n}")
        n += 1
    return candidate


def write_config(config: Path, raw: bytes, data: dict[str, Any]) -> Path:
    """Back ``raw`` up, then replace ``config`` with ``data``; returns the backup path."""
    if not writable(config):
        raise WriteError(
            f"Cannot rewrite {config}: this user (uid {os.getuid()}) may not write it or its "
            "folder. Run as the checkpoint's owner; nothing was written."
        )
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    text = json.dumps(data, indent=_indent_of(raw), ensure_ascii=False) + "\n"
    for _ in range(100):
        backup = backup_path(config, stamp)
        try:
            write_exclusive(backup, raw)
            break
        except FileExistsError:  # another writer took the name between the check and the open
            continue
        except OSError as exc:
            raise WriteError(
                f"Cannot write the backup {backup} ({exc}); nothing was written.") from exc
    else:
        raise WriteError(f"No free backup name next to {config}; nothing was written.")
    try:
        atomic_write_bytes(config, text.encode("utf-8"))
    except OSError as exc:
        raise WriteError(
            f"Writing {config} failed ({exc}); the original is unchanged (backup at {backup})."
        ) from exc
    return backup


def _indent_of(raw: bytes) -> int:
    """Indent width of the existing file, so the rewrite diffs cleanly (default 2)."""
    for line in raw.decode("utf-8", "replace").splitlines()[1:]:
        stripped = line.lstrip(" ")
        if stripped:
            return (len(line) - len(stripped)) or 2
    return 2
