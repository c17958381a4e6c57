"""The state folder: each original file (and its sha256) saved before draftops first writes it.

Layout, keyed by SGLang version and file::

    <state>/<sglang version>/<srt__models__llama.py>.json           record (see ``Record``)
    <state>/<sglang version>/<srt__models__llama.py>.<sha12>.orig   the original bytes

``revert`` restores the ``.orig`` bytes only while the file still has the sha256 draftops wrote,
so a file someone edited afterwards is never clobbered. Backups are kept after a revert.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..fileio import atomic_write_bytes, sha256_bytes, write_exclusive
from .errors import StateError


def default_state_dir() -> Path:
    """``$DRAFTOPS_STATE_DIR/sglang-patch``, else ``~/.draftops/sglang-patch``."""
    base = os.environ.get("DRAFTOPS_STATE_DIR")
    return (Path(base) if base else Path.home() / ".draftops") / "sglang-patch"


@dataclass
class Record:
    """What draftops did to one file of one SGLang version."""

    file: str
    sglang_version: str
    sglang_dir: str
    original_sha256: str
    backup: str
    mode: int
    saved_at: str
    patched_sha256: str | None = None
    patch_version: int | None = None


class StateStore:
    """Records and backups for one SGLang version."""

    def __init__(self, root: Path, version: str) -> None:
        self.root = Path(root).expanduser()
        self.dir = self.root / version.replace(os.sep, "_")

    def _stem(self, rel: str) -> Path:
        return self.dir / rel.replace("/", "__")

    def _record_path(self, rel: str) -> Path:
        return self._stem(rel).with_name(self._stem(rel).name + ".json")

    def record(self, rel: str) -> Record | None:
        """The record for ``rel``, or None; a corrupt record is a StateError."""
        path = self._record_path(rel)
        try:
            return Record(**json.loads(path.read_text(encoding="utf-8")))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as exc:
            raise StateError(
                f"The draftops record {path} cannot be read ({exc}). Move it aside and run "
                "`status` again; reinstall sglang if its files no longer match their originals."
            ) from exc

    def save_original(self, rel: str, data: bytes, *, sglang_dir: Path, version: str,
                      mode: int) -> Record:
        """Save ``data`` as the original of ``rel`` (never overwriting another backup)."""
        sha = sha256_bytes(data)
        backup = self._stem(rel).with_name(f"{self._stem(rel).name}.{sha[:12]}.orig")
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            if backup.exists():
                if sha256_bytes(backup.read_bytes()) != sha:
                    raise StateError(
                        f"The backup {backup} exists but does not hold the bytes of {rel} it is "
                        "named after. Move it aside and apply again."
                    )
            else:
                write_exclusive(backup, data)
        except OSError as exc:
            raise StateError(
                f"Cannot save the original of {rel} under {self.dir} ({exc}); nothing was "
                "patched. Pass a writable --state-dir or set DRAFTOPS_STATE_DIR."
            ) from exc
        record = Record(file=rel, sglang_version=version, sglang_dir=str(sglang_dir),
                        original_sha256=sha, backup=str(backup), mode=mode,
                        saved_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        self.write(record)
        return record

    def write(self, record: Record) -> None:
        """Store ``record`` (atomically)."""
        path = self._record_path(record.file)
        try:
            atomic_write_bytes(path, (json.dumps(asdict(record), indent=2) + "\n").encode("utf-8"))
        except OSError as exc:  # every caller writes records before touching SGLang
            raise StateError(
                f"Cannot write the draftops record {path} ({exc}); SGLang was not changed. Free "
                "space there, or pass a writable --state-dir (DRAFTOPS_STATE_DIR), and run again."
            ) from exc

    def forget(self, rel: str) -> None:
        """Drop the record of ``rel`` after a revert (its backup stays)."""
        path = self._record_path(rel)
        try:
            path.unlink()
        except FileNotFoundError:
            pass

    def original(self, record: Record) -> bytes:
        """The saved original bytes, checked against the recorded sha256."""
        try:
            data = Path(record.backup).read_bytes()
        except OSError as exc:
            raise StateError(
                f"The saved original of {record.file} ({record.backup}) cannot be read ({exc}). "
                f"Reinstall sglang=={record.sglang_version} to get the original back."
            ) from exc
        if sha256_bytes(data) != record.original_sha256:
            raise StateError(
                f"The saved original {record.backup} does not match the recorded sha256 "
                f"{record.original_sha256[:12]}; it was changed after draftops saved it. "
                f"Reinstall sglang=={record.sglang_version} to get the original back."
            )
        return data
