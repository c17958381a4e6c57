"""The draft-config digest: what ties a benchmark of a served draft to the test-drafter run that
predicted its accept length.

It hashes the config's *content* (keys sorted, no whitespace), so re-indenting a config keeps the
digest while changing a layer id changes it. A file that is not JSON is hashed as bytes.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from .. import jsonread

PREFIX = "sha256:"
LENGTH = 16


def config_digest(data: bytes) -> str:
    """``sha256:<16 hex>`` of the canonical JSON of a draft config (or of the raw bytes)."""
    try:
        canonical = json.dumps(jsonread.loads(data), sort_keys=True, separators=(",", ":"),
                               ensure_ascii=False).encode()
    except (ValueError, UnicodeDecodeError):
        canonical = data
    return PREFIX + hashlib.sha256(canonical).hexdigest()[:LENGTH]


def file_digest(path: str | Path) -> str:
    """Digest of a config file, or of ``<folder>/config.json`` for a checkpoint folder."""
    path = Path(path)
    return config_digest((path / "config.json" if path.is_dir() else path).read_bytes())


def main() -> int:
    """``python -m remote.bench.digest CONFIG...``: one ``DIGEST PATH`` line per file."""
    for arg in sys.argv[1:]:
        print(file_digest(arg), arg)
    return 0


if __name__ == "__main__":
    from .. import exitcodes  # only as a tool: the local side imports this module for config_digest
    exitcodes.run("bench-digest", main)
