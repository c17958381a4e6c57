"""An installed distribution's version, read from its ``.dist-info`` without importlib.metadata.

``importlib.metadata`` imports the email parser to read METADATA: 14–22 ms of a quick host tool
(``remote.serve inspect``, ``remote.bench.probe``) that only wants one version line. This reads the
same file the same way for the common layout, a ``<name>-<version>.dist-info`` folder in a sys.path
entry, and leaves everything else (eggs, zips, a folder without a Version line, two candidates in
one folder) to importlib.metadata itself, so the answer is always the one it would give.
"""
from __future__ import annotations

import os
import re
import sys

_SEPARATORS = re.compile(r"[-_.]+")


def _normal(name: str) -> str:
    """A distribution name as the wheel spec escapes it in folder names (PEP 503, then ``-`` as ``_``)."""
    return _SEPARATORS.sub("_", name).lower()


def version(dist: str, path: list[str] | None = None) -> str | None:
    """The version of ``dist`` that ``importlib.metadata.version`` reports for ``path`` (default
    sys.path), or None when it is not installed."""
    wanted = _normal(dist)
    for entry in sys.path if path is None else path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        found = [n for n in names if n.lower().endswith((".dist-info", ".egg-info", ".egg"))
                 and _normal(n.rsplit(".", 1)[0].split("-", 1)[0]) == wanted]
        if not found:
            continue
        if len(found) == 1 and found[0].lower().endswith(".dist-info"):
            told = _metadata_version(os.path.join(entry or ".", found[0], "METADATA"))
            if told is not None:
                return told
        return _slow(dist, path)            # an egg, two copies, no Version line: as importlib says
    zipped = any(os.path.isfile(p) for p in (sys.path if path is None else path))   # a zip or egg file entry
    return _slow(dist, path) if zipped else None


def _metadata_version(metadata: str) -> str | None:
    """The ``Version:`` header of a METADATA file (headers end at the first blank line)."""
    try:
        with open(metadata, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if not line.strip():
                    return None
                if line.lower().startswith("version:"):
                    return line.split(":", 1)[1].strip() or None
    except OSError:
        return None
    return None


def _slow(dist: str, path: list[str] | None) -> str | None:
    import importlib.metadata
    try:
        if path is None:
            return importlib.metadata.version(dist)
        for found in importlib.metadata.distributions(name=dist, path=path):
            return found.version
        return None
    except importlib.metadata.PackageNotFoundError:
        return None
