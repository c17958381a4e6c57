"""The host's server registry: ``<root>/state/servers/<port>.json``, one entry per started server.

The entry points at the server's run folder (the detached job that owns its process group); its
liveness always comes from the run, never from the entry, so a crashed server reads as dead.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..fileio import atomic_write_bytes


def _path(state: Path, port: int) -> Path:
    return state / "servers" / f"{int(port)}.json"


def entries(state: Path) -> list[dict[str, Any]]:
    folder = state / "servers"
    rows = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            row = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(row, dict):
            rows.append(row)
    return sorted(rows, key=lambda r: r.get("port") or 0)


def put(state: Path, port: int, entry: dict[str, Any]) -> dict[str, Any]:
    path = _path(state, port)
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = {**entry, "port": int(port)}
    atomic_write_bytes(path, (json.dumps(entry, indent=2) + "\n").encode(), mode=0o600)
    return entry


def remove(state: Path, port: int, run_id: str | None = None) -> dict[str, Any]:
    """Drop the entry for ``port`` (only if it still belongs to ``run_id``, when given)."""
    path = _path(state, port)
    try:
        row = json.loads(path.read_text())
    except (OSError, ValueError):
        return {"port": port, "removed": False}
    if run_id and row.get("run_id") != run_id:
        return {"port": port, "removed": False, "owner": row.get("run_id")}
    path.unlink()
    return {"port": port, "removed": True}
