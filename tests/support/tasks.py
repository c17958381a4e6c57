"""Tasks run as a user runs them: `invoke ARGS` in a project folder, in a process of its own."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support.laptop_venv import laptop_python

REPO = Path(__file__).resolve().parents[2]


def invoke(project: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 600,
           columns: int = 200) -> subprocess.CompletedProcess:
    """Run `invoke ARGS` in ``project`` as a user would (its tasks.py is the repo's), with the laptop's
    python (``laptop_python``: the base install under the ``laptop`` fixture). This process's
    ``DRAFTOPS_INVENTORY`` is not passed on (``env`` may set one), nor ever a ``DRAFTOPS_HOST``: the
    project's hosts.yaml decides, as for a user in that folder."""
    full_env = {**os.environ, "COLUMNS": str(columns), "PYTHONPATH": str(REPO)}
    full_env.pop("DRAFTOPS_INVENTORY", None)
    full_env.update(env or {})
    full_env.pop("DRAFTOPS_HOST", None)
    return subprocess.run([laptop_python(), "-m", "invoke", *args], cwd=project, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def invoke_wide(project: Path, *args: str) -> subprocess.CompletedProcess:
    """``invoke`` at 2000 columns, so that no table it prints is cut."""
    return invoke(project, *args, timeout=300, columns=2000)
