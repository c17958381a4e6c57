"""A night told to stop (SIGTERM from cron's or systemd's shutdown, a kill) ends the running step's process
tree, still runs its clean-up steps (no server is left alive), writes its report and its history row, and
exits 143; and, with its output in a pipe, it says each step as it starts and ends. The server is the
SGLang test double (tests/doubles/sglang) started by the real `invoke serve`; the step that is running
when the signal comes is `serve.logs --follow`, which never ends by itself."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from draftops import history
from tests.conftest import REPO, copy_remote_package
from tests.support.serving import profile
from tests.support.tasks import invoke

pytestmark = pytest.mark.slow


def _pids_running(root: Path) -> list[int]:
    """Processes whose working folder is the project (the night's steps run there)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if os.readlink(entry / "cwd") == str(root) and b"invoke" in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_sigterm_ends_the_step_runs_the_cleanup_and_still_reports(make_project, tmp_path, no_inventory_env):
    serve = {"default": profile(tmp_path)}
    root = make_project({"loc": {"transport": "local", "root": str(tmp_path / "locroot"), "serve": serve}}, "loc")
    (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
    copy_remote_package(root)
    steps = [{"name": "serve", "task": "serve", "args": {"baseline": True}},
             {"name": "follow", "task": "serve.logs", "args": {"follow": True}, "needs": ["serve"]},
             {"name": "after", "task": "serve.status", "needs": ["serve"]},
             {"name": "stop", "task": "serve.stop", "args": {"all": True}, "cleanup": True}]
    (root / "playbooks").mkdir()
    (root / "playbooks" / "p.yaml").write_text(yaml.safe_dump({"hosts": ["loc"], "steps": steps}))
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(REPO)}
    env.pop("DRAFTOPS_HOST", None)
    night = subprocess.Popen([sys.executable, "-m", "invoke", "nightly", "--playbook", "playbooks/p.yaml"], cwd=root,
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    try:
        assert night.stdout is not None
        for line in night.stdout:                 # a pipe, not a terminal: every step start and end is said
            seen.append(line)
            if "loc / follow (serve.logs): started" in line:
                break
        assert any("loc / serve (serve): started" in ln for ln in seen), seen
        assert any("loc / serve (serve): ok in " in ln for ln in seen), seen
        time.sleep(1.0)                           # the follow is under way
        night.send_signal(signal.SIGTERM)
        out, err = night.communicate(timeout=120)
    finally:
        if night.poll() is None:
            night.kill()
    out = "".join(seen) + out
    assert night.returncode == 143, out + err
    assert "stopped by SIGTERM" in err and "Traceback" not in err, err
    assert "loc / follow (serve.logs): failed (exit None)" in out and "loc / stop (serve.stop): ok" in out, out
    assert "loc / after (serve.status): skipped: the night was stopped (SIGTERM)" in out, out
    assert _pids_running(root) == [], "a step of the stopped night is still running"
    assert "no draftops servers" in invoke(root, "serve.status").stdout       # the clean-up stopped it
    row = history.for_project(root).latest(kind="nightly")
    assert row is not None and row.verdict == "stopped"
    assert row.settings["steps"] == {"serve": "ok", "follow": "failed", "after": "skipped", "stop": "ok"}
    (folder,) = (root / "runs").glob("nightly-*")
    md = (folder / "report.md").read_text()
    assert "loc: STOPPED (SIGTERM)" in md and (folder / "report.html").stat().st_size > 0
    assert "the night was stopped (SIGTERM)" in (folder / "loc" / "02-follow.log").read_text()
