"""A project for capture-check over the real sshd with the vLLM double."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, ssh_entry
from tests.support.drafter_support import task_project

DOUBLE = REPO / "tests" / "doubles" / "vllm_hs"


@pytest.fixture(scope="module")
def project(tmp_path_factory, sshd) -> Path:
    base = tmp_path_factory.mktemp("capture-task")
    engine = base / "engine" / "python"
    engine.parent.mkdir()
    engine.write_text(f'#!/bin/sh\nPYTHONPATH="{DOUBLE}:$PYTHONPATH" exec "{sys.executable}" "$@"\n')
    engine.chmod(0o755)
    entry = ssh_entry(sshd, base, python=sys.executable, engine="vllm",
                      serve={"cpu": {"python": str(engine), "context_length": 1024,
                                     "extra_args": ["--dtype", "float32", "--enforce-eager"]}})
    return task_project(base, {"box": entry}, "box", demo_roots=(base / "hostroot",))
