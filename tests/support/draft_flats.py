"""A flat-format copy made by the draft-flat tool, as its tests make it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def flat_copy(ckpt: Path, dest: Path, *args: str, result: Path | None = None) -> subprocess.CompletedProcess:
    """``python -m remote.draft_flat`` as the host runs it."""
    out = ["--out", str(result)] if result else []
    return subprocess.run([sys.executable, "-m", "remote.draft_flat", "--ckpt", str(ckpt), "--dest", str(dest),
                           *args, *out], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
