"""`invoke --list` and `invoke --help TASK` stay instant: listing the tasks imports none of the heavy
libraries that only running a task needs (issue 13). Checked by the modules a real `invoke` process
loads (python -X importtime), not by timing it: the result does not depend on the machine's load."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

# What only running a task needs: SSH (paramiko, fabric, cryptography), the inventory's schemas
# (pydantic), output (rich), .gitignore matching (pathspec), and what the GPU side uses.
HEAVY = ("paramiko", "fabric", "cryptography", "nacl", "bcrypt", "pydantic", "pydantic_core", "rich",
         "pathspec", "torch", "numpy", "matplotlib", "safetensors", "draftops.inventory", "mlflow")


def imported(*invoke_args: str) -> tuple[set[str], str]:
    """The modules an `invoke ARGS` process imports in the repo, and what it printed."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("DRAFTOPS_HOST", None)
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "invoke", *invoke_args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines()
             if line.startswith("import time:") and "|" in line}
    return names, proc.stdout


def heavy_among(names: set[str]) -> list[str]:
    """The heavy ones among ``names``, each package once (``draftops.inventory`` by its own name)."""
    return sorted({name if name in HEAVY else name.split(".")[0] for name in names
                   if name in HEAVY or name.split(".")[0] in HEAVY})


@pytest.mark.parametrize("args", [("--list",), ("--help", "sync"), ("--help", "test-drafter"),
                                  ("--help", "serve.start"), ("--help", "runs.export")])
def test_listing_and_help_import_no_heavy_library(args):
    names, out = imported(*args)
    assert "draftops.cli.core" in names     # the task modules were loaded: the check is not vacuous
    assert heavy_among(names) == [], f"`invoke {' '.join(args)}` imported {', '.join(heavy_among(names))}"
    if args == ("--list",):
        for task in ("sync", "test-drafter", "serve.start", "env.check", "patch-sglang.apply", "pull"):
            assert task in out


def test_the_check_sees_a_heavy_import_when_there_is_one():
    """The same measurement on a process that does import the inventory finds pydantic and rich."""
    code = "import tasks, draftops.inventory, draftops.report"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", code], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120, check=True)
    names = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert {"pydantic", "rich", "draftops.inventory"} <= set(heavy_among(names))
