"""Serving over the real sshd: a project with serve profiles, the engine doubles, and what a served run
leaves (its processes, its registry)."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO, copy_remote_package, ssh_entry
from tests.support.sshd import free_port

DOUBLES = REPO / "tests" / "doubles"


FAST = {"DRAFTOPS_SGLANG_DOUBLE_LOAD_S": "0.3", "DRAFTOPS_SGLANG_DOUBLE_WARMUP_S": "0.5"}


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _live_environs() -> Iterator[tuple[int, list[bytes]]]:
    """(pid, environment entries) of every live, non-zombie process this user can read."""
    for name in os.listdir("/proc"):
        if not name.isdigit() or not _alive(int(name)):
            continue
        try:
            yield int(name), Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
        except OSError:
            continue


def run_processes(run_id: str) -> list[int]:
    """Live processes of a server run (every job process inherits DRAFTOPS_RUN_ID)."""
    marker = f"DRAFTOPS_RUN_ID={run_id}".encode()
    return [pid for pid, environ in _live_environs() if marker in environ]


def processes_of_runs_under(folder: Path) -> list[int]:
    """Live processes of every job whose run folder lies under ``folder`` (DRAFTOPS_RUN_DIR)."""
    prefix = f"DRAFTOPS_RUN_DIR={folder}/".encode()
    return [pid for pid, environ in _live_environs() if any(e.startswith(prefix) for e in environ)]


def stop_processes(pids: list[int], grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL whatever is still alive after ``grace_s``, and wait (5 s at most) until it
    is gone: a KILL is delivered asynchronously, and on a loaded machine the process lingers a moment."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            pids = [pid for pid in pids if _alive(pid)]
            if not pids:
                return
            time.sleep(0.1)


def write_model(folder: Path, config: dict[str, Any]) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def target_config(layers: int = 32, arch: str = "LlamaForCausalLM") -> dict[str, Any]:
    return {"architectures": [arch], "num_hidden_layers": layers, "hidden_size": 64, "vocab_size": 64,
            "max_position_embeddings": 4096}


def draft_config(ids: list[int]) -> dict[str, Any]:
    return {"architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1, "hidden_size": 64,
            "max_position_embeddings": 4096, "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids}}


def profile(tmp: Path, double: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    """A serve profile whose engine is the SGLang double, put on the path by this test only; ``double``:
    the double's own settings (its ``DRAFTOPS_SGLANG_DOUBLE_*`` variables: a fault, a delay)."""
    entry = {"engine": "sglang", "python": sys.executable, "port": free_port(), "max_running_requests": 8,
             "extra_args": ["--decode-log-interval", 1],
             "target": write_model(tmp / "target", target_config()),
             "env": {"PYTHONPATH": str(DOUBLES), **FAST, **(double or {})}}
    return {**entry, **extra}


@pytest.fixture
def project(make_project, sshd, tmp_path, no_inventory_env):
    def make(where: str, /, **profiles: dict[str, Any]) -> Path:
        serve = profiles or {"default": profile(tmp_path)}
        hosts = {"box": ssh_entry(sshd, tmp_path, serve=serve),
                 "loc": {"transport": "local", "root": str(tmp_path / "locroot"), "serve": serve}}
        root = make_project(hosts, default=where)
        (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
        copy_remote_package(root)
        return root
    yield make
    # A test that failed before its `serve.stop` must not leave its server (the SGLang double, its
    # children) running into the next tests and past the session: stop every job of its host roots.
    stop_processes(processes_of_runs_under(tmp_path))


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def refused(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 1, result.stdout + result.stderr
    return " ".join((result.stdout + result.stderr).split())     # rich wraps lines


def registry(project: Path) -> dict[str, Any]:
    hosts = yaml.safe_load((project / "hosts.yaml").read_text())["hosts"]
    return hosts


def run_id_of(output: str) -> str:
    return output.split("started run ", 1)[1].split()[0]


def serve_draft(root: Path, tmp_path: Path) -> str:
    """A draft of aux layer ids [1, 15, 28] (SGLang's), served on ``root``'s default host with 3 steps,
    topk 1 and 4 draft tokens, as the bench tests serve it; the draft's path."""
    from tests.support.tasks import invoke

    draft = write_model(tmp_path / "draft", draft_config([1, 15, 28]))
    ok(invoke(root, "serve", "--draft", draft, "--steps", "3", "--topk", "1", "--draft-tokens", "4"))
    return draft
