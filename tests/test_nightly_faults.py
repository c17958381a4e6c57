"""Faults around a night on the local host (cheap steps only): two nights started at once, a history
that cannot be written, a host the inventory does not know, a task that does not exist."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from tests.test_env_ssh import invoke

pytestmark = pytest.mark.slow


@pytest.fixture
def project(make_project, tmp_path, no_inventory_env) -> Path:
    root = make_project({"loc": {"transport": "local", "root": str(tmp_path / "locroot")}}, "loc")
    (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
    (root / "playbooks").mkdir()
    return root


def playbook(root: Path, **book) -> str:
    book.setdefault("hosts", ["loc"])
    book.setdefault("steps", [{"name": "sync", "task": "sync"}])
    (root / "playbooks" / "p.yaml").write_text(yaml.safe_dump(book))
    return "playbooks/p.yaml"


def test_two_nights_at_once_keep_their_own_folders(project):
    path = playbook(project)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("DRAFTOPS_HOST", None)
    procs = [subprocess.Popen([sys.executable, "-m", "invoke", "nightly", "--playbook", path], cwd=project, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    folders = sorted((project / "runs").glob("nightly-*"))
    assert len(folders) == 2 and all((f / "report.html").exists() for f in folders)


def test_a_history_that_cannot_be_written_still_gives_a_report(project):
    path = playbook(project)
    (project / "runs" / "history.sqlite").mkdir(parents=True)           # not a database: a folder
    done = invoke(project, "nightly", "--playbook", path)
    assert done.returncode == 1, done.stdout + done.stderr
    (folder,) = (project / "runs").glob("nightly-*")
    md = (folder / "report.md").read_text()
    assert "loc: ERROR — 1 steps: 1 ok" in md and "could not be read from the history" in md, md
    assert "[exit 0]" in (folder / "loc" / "01-sync.log").read_text()


def test_unknown_host_and_unknown_task_are_refused_before_anything_runs(project):
    done = invoke(project, "nightly", "--playbook", playbook(project, hosts=["loc", "ghost"]))
    assert done.returncode == 1 and "ghost" in done.stderr and "hosts.yaml" in done.stderr, done.stderr
    done = invoke(project, "nightly", "--playbook", playbook(project, steps=[{"name": "s", "task": "snyc"}]))
    assert done.returncode == 1 and "unknown task `snyc`" in done.stderr and "`sync`" in done.stderr, done.stderr
    assert not list((project / "runs").glob("nightly-*"))
