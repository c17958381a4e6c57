"""`invoke collect RUN_ID` (issue 35, item 19): a test-drafter whose `invoke` died (a dropped laptop,
SIGKILL) runs on; `logs --follow` and `pull` bring its folder home but neither shows the verdict nor
records it; `collect` does both, as the task would have. Over a real sshd, with the real evaluator."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, ssh_entry
from tests.support.drafter_support import task_project
from tests.support.laptop_venv import laptop_python
from tests.support.tasks import invoke

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


@pytest.fixture
def project(tmp_path, sshd):
    entry = ssh_entry(sshd, tmp_path, python=sys.executable)
    return task_project(tmp_path, {"box": entry}, "box", demo_roots=(tmp_path / "hostroot",))


def _left_behind(project, hostroot) -> str:
    """Start `invoke sync test-drafter`, and SIGKILL it once its job runs on the host: the run id."""
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(REPO)}
    env.pop("DRAFTOPS_HOST", None)
    proc = subprocess.Popen([laptop_python(), "-m", "invoke", "sync", "test-drafter", "--full"], cwd=project, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            started = [p for p in (hostroot / "runs").glob("*-test-drafter-*") if (p / "log").is_file()]
            if started:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=30)
                return started[0].name
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.kill()
    pytest.fail(f"test-drafter never started a job (exit {proc.returncode})")


def test_collect_shows_the_verdict_and_records_the_run_that_pull_does_not(project, tmp_path):
    run_id = _left_behind(project, tmp_path / "hostroot")
    followed = invoke(project, "logs", run_id, "--follow")
    assert followed.returncode == 0, followed.stdout + followed.stderr
    assert invoke(project, "pull", run_id).returncode == 0
    assert (project / "runs" / run_id / "report.json").is_file()
    assert run_id not in invoke(project, "runs", "--local", "--all").stdout      # what item 19 found
    done = invoke(project, "collect", run_id)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert "MISMATCH" in said and "fix it with:" in said
    assert f"invoke draft-config --ckpt demo --from-report {run_id}" in said or "--from-report " + run_id in said
    listed = invoke(project, "runs", "--local", "--all")
    row = " ".join(line for line in listed.stdout.splitlines() if run_id[:15] in line or "MISMATCH" in line)
    assert "MISMATCH" in row, listed.stdout
    again = invoke(project, "collect", run_id)                  # twice: the same row, updated in place
    assert again.returncode == 0 and "MISMATCH" in again.stdout


def test_collect_refuses_a_run_it_cannot_finish(project):
    done = invoke(project, "sync")
    assert done.returncode == 0, done.stderr
    started = invoke(project, "env.check")
    run_id = next(p.name for p in (project / "runs").glob("*-env-check-*"))
    assert started.returncode == 0, started.stdout + started.stderr
    refused = invoke(project, "collect", run_id)
    said = " ".join((refused.stdout + refused.stderr).split())
    assert refused.returncode == 1 and "is a run of env-check" in said, said
    assert "finishes test-drafter, capture-check, bench runs" in said
