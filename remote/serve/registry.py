"""The host's server registry: ``<root>/state/servers/<port>.json``, one entry per started server.

The entry points at the server's run folder (the detached job that owns its process group); its
liveness always comes from the run, never from the entry, so a crashed server reads as dead.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..fileio import atomic_write_bytes, write_exclusive


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


def _read(path: Path) -> dict[str, Any] | None:
    try:
        row = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return row if isinstance(row, dict) else None


def put(state: Path, port: int, entry: dict[str, Any], *, token: str | None = None,
        exclusive: bool = False) -> dict[str, Any]:
    """Write the entry for ``port``.

    ``exclusive`` claims a free port for one `invoke serve` call (the file is created, never
    replaced), so two calls racing for a port cannot both start; ``token`` updates only the entry
    that call claimed (a server stopped meanwhile by another call stays forgotten)."""
    path = _path(state, port)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps({**entry, "port": int(port)}, indent=2) + "\n").encode()
    if exclusive:
        try:
            write_exclusive(path, data)
        except FileExistsError:
            return {"port": port, "written": False, "owner": _read(path)}
        return {"port": port, "written": True}
    if token is not None and (_read(path) or {}).get("token") != token:
        return {"port": port, "written": False, "owner": _read(path)}
    atomic_write_bytes(path, data, mode=0o644)
    return {"port": port, "written": True}


def remove(state: Path, port: int, run_id: str | None = None, token: str | None = None) -> dict[str, Any]:
    """Drop the entry for ``port``, only if it still belongs to ``run_id`` / ``token`` when given."""
    path = _path(state, port)
    row = _read(path)
    if row is None:
        return {"port": port, "removed": False}
    if (run_id and row.get("run_id") != run_id) or (token and row.get("token") != token):
        return {"port": port, "removed": False, "owner": row.get("run_id")}
    path.unlink()
    return {"port": port, "removed": True}
