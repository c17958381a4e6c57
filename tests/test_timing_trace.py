"""The per-call trace benchmarks/loop_overhead.py --trace prints: with DRAFTOPS_TIMING=1 every command
a real `invoke` process runs on the host is recorded with its label and round trip, and the sync
benchmark's stage split does not count those lines a second time."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import loop_overhead
from benchmarks import sync as sync_bench
from draftops import timing
from draftops.link import agent
from tests.conftest import REPO, copy_remote_package


def run_invoke(project: Path, *args: str) -> tuple[subprocess.CompletedProcess, float, float]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "DRAFTOPS_TIMING": "1"}
    env.pop("DRAFTOPS_HOST", None)
    spawned, started = time.time(), time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "invoke", *args], cwd=project, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    return done, spawned, time.perf_counter() - started


@pytest.fixture
def project(make_project, no_inventory_env) -> Path:
    root = make_project()
    copy_remote_package(root)      # remote.serve runs from the synced code, as on every host
    (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
    return root


def test_a_real_call_is_traced_command_by_command(project: Path) -> None:
    done, spawned, seconds = run_invoke(project, "sync")
    assert done.returncode == 0, done.stderr
    trace = loop_overhead.trace_of("sync", done.stderr, spawned, seconds)
    # a first sync on the local host: the agent (its boot, then the transfer) and nothing else
    assert trace["execs"], done.stderr
    assert all(label.startswith("agent:") for label in trace["execs"]), trace["execs"]
    in_execs = sum(sum(v) for v in trace["execs"].values())
    assert 0 < trace["start_up"] < seconds and 0 < in_execs < seconds - trace["start_up"]
    # the sync benchmark's split ignores the exec lines and still finds its own stages
    split = sync_bench.stage_split(done.stderr, spawned, spawned + seconds)
    assert split and not any(name.startswith("agent:") for name in split)
    for stage in ("interpreter + invoke", "imports", "inventory", "host shell start-up", "agent", "apply"):
        assert split[stage] > 0, (stage, split)
    assert split["rest of the task"] >= 0, split


def test_a_host_tool_is_labelled_by_its_module_and_command(project: Path) -> None:
    done, spawned, seconds = run_invoke(project, "serve.status")
    assert done.returncode == 0, done.stderr
    assert "remote.serve:servers" in loop_overhead.trace_of("serve.status", done.stderr, spawned, seconds)["execs"]


@pytest.mark.parametrize(("command", "label"), [
    ("cd 'a b' && exec env X='1 2' /opt/py -m remote.serve http 8000", "remote.serve:http"),
    ("F=1 /venv/bin/python '/root/it'\"'\"'s/agent-0123456789ab.py' /root/it\\'s status run-1", "agent:status"),
    ("F=1 python -c 'import sys\nprint(1)' /root agent-0123456789ab.py prepare", "agent:prepare"),
    ("tail -n 200 '/root/runs/x/log'", "tail"),
    ("echo 'unbalanced", "echo"),
])
def test_labels(command: str, label: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(timing, "ENABLED", True)
    timing.ran(command, 0.25)
    assert capsys.readouterr().err == f"{timing.PREFIX}exec {label} 0.250000\n"


def test_the_agents_first_call_is_labelled_by_its_command(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture) -> None:
    """The first call of a process boots the agent inline: its whole source is on the command line."""
    monkeypatch.setattr(timing, "ENABLED", True)
    boot = agent._BOOT.format(src=agent.AGENT_SOURCE)
    timing.ran(f"F=1 /venv/bin/python -c {shlex.quote(boot)} /root {agent.AGENT_NAME} apply code", 0.5)
    assert capsys.readouterr().err == f"{timing.PREFIX}exec agent:apply 0.500000\n"


def test_nothing_is_written_without_the_flag(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(timing, "ENABLED", False)
    timing.ran("python -m remote.serve servers", 1.0)
    assert capsys.readouterr().err == ""
