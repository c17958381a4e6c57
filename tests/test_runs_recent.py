"""`invoke runs` shows the end of a long history: the host's latest runs (the agent reads only their
status, not every run's), how many were left out, `--last N` and `--all`; `--local` alike."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from draftops.history import History
from draftops.link.host import open_host
from tests.conftest import REPO
from tests.support import bench_runs as runs

IDS = [f"20260101-0000{i:02d}-quick-{i:04x}" for i in range(5)]


def invoke(project: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "2000", "PYTHONPATH": str(REPO)}
    env.pop("DRAFTOPS_HOST", None)
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=project, env=env, capture_output=True,
                          text=True, timeout=300, check=False)


def fake_run(runs_dir: Path, run_id: str) -> None:
    """A finished run folder as the runner leaves it (job.json + status.json)."""
    folder = runs_dir / run_id
    folder.mkdir(parents=True)
    (folder / "job.json").write_text(json.dumps({"id": run_id, "name": "quick", "task": "quick",
                                                 "command": "true", "created": "2026-01-01T00:00:00Z"}))
    (folder / "status.json").write_text(json.dumps({"state": "succeeded", "exit_code": 0, "pid": 1}))


@pytest.fixture
def project(make_project, no_inventory_env, tmp_path) -> Path:
    root = make_project({"here": {"transport": "local", "root": str(tmp_path / "hostroot")}}, default="here")
    (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
    runs_dir = tmp_path / "hostroot" / "runs"
    for run_id in reversed(IDS):                      # made out of order: ids, not creation, order them
        fake_run(runs_dir, run_id)
    (runs_dir / "a-link").symlink_to(runs_dir / IDS[0])          # never a run, and not counted
    (runs_dir / "stray-file").write_text("x")
    (runs_dir / "zz-not-a-run-id").mkdir()        # counted as the oldest, not as the newest run
    return root


def test_agent_recent_reads_the_last_runs_and_counts_all(project: Path, tmp_path: Path) -> None:
    agent = open_host(None, project).agent
    rows, total = agent.recent(2)
    assert [r["id"] for r in rows] == IDS[-2:] and total == len(IDS) + 1
    assert all(r["state"] == "succeeded" for r in rows)
    rows, total = agent.recent(100)
    assert [r["id"] for r in rows] == ["zz-not-a-run-id", *IDS] and total == len(IDS) + 1


def test_agent_recent_on_a_host_without_runs(make_project, no_inventory_env, tmp_path: Path) -> None:
    root = make_project({"here": {"transport": "local", "root": str(tmp_path / "empty")}}, default="here")
    assert open_host(None, root).agent.recent(3) == ([], 0)


def test_runs_last_all_and_the_note_of_what_was_left_out(project: Path) -> None:
    two = invoke(project, "runs", "--last", "2")
    assert two.returncode == 0, two.stderr
    assert [i for i in IDS if i in two.stdout] == IDS[-2:]
    assert "4 earlier run(s) not shown" in two.stderr and "--all" in two.stderr
    every = invoke(project, "runs", "--all")
    assert every.returncode == 0 and all(i in every.stdout for i in IDS) and "not shown" not in every.stderr
    default = invoke(project, "runs")                   # 5 runs: fewer than the default bound
    assert default.returncode == 0 and all(i in default.stdout for i in IDS) and "not shown" not in default.stderr
    for bad in ("0", "-3"):
        refused = invoke(project, "runs", "--last", bad)
        assert refused.returncode == 1 and "--last must be 1 or more" in refused.stderr
        assert "Traceback" not in refused.stderr


def test_runs_local_last(project: Path) -> None:
    hist = History(project / "runs" / "history.sqlite")
    report = runs.drafter_report(status="MATCH", served=3.0, best=3.0, configured=[1, 4, 7],
                                 fix=[1, 4, 7], fix_vllm=[1, 4, 7], ckpt="/data/drafts/demo")
    recorded = [f"20261130-0{h}0000-test-drafter-aaa{h}" for h in range(1, 5)]
    for run_id in recorded:
        runs.record_prediction(hist, run_id, report, "sha256:aaaa000000000000",
                               time=f"2026-11-30T0{run_id[10]}:00:00Z")
    newest = invoke(project, "runs", "--local", "--last", "1")
    assert newest.returncode == 0, newest.stderr
    assert [i for i in recorded if i in newest.stdout] == recorded[-1:]
    assert "3 earlier run(s) not shown" in newest.stderr
    every = invoke(project, "runs", "--local", "--all")
    assert all(i in every.stdout for i in recorded) and "not shown" not in every.stderr
