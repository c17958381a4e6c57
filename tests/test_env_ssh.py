"""env.setup / env.check through the real invoke CLI, over a real sshd."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, copy_remote_package, ssh_entry
from tests.support.tasks import invoke

pytestmark = pytest.mark.ssh


def hostile_venv(tmp_path: Path) -> Path:
    """The ml-env path every test here uses: quotes, $(), backticks, `;`, spaces and a newline (R3).
    Were any of it run by a shell, a `pwned*` file would appear in tmp_path."""
    return tmp_path / "venvs" / (f"ml env'$(touch {tmp_path}/pwned1)`touch {tmp_path}/pwned2`;"
                                 f"touch {tmp_path}/pwned3;\"\nx")


def assert_nothing_injected(tmp_path: Path) -> None:
    assert not list(tmp_path.glob("pwned*")), "a hostile path was run as shell code"


@pytest.fixture
def env_project(make_project, sshd, tmp_path, no_inventory_env):
    (tmp_path / "reqs.txt").write_text("# nothing to install: the venv itself is the test\n")
    base_python = tmp_path / f"base 'py`$(touch {tmp_path}/pwned4)`" / "python"   # hostile too
    base_python.parent.mkdir(parents=True)
    base_python.symlink_to(sys.executable)
    entry = ssh_entry(sshd, tmp_path, env={"venv": str(hostile_venv(tmp_path)),
                                           "requirements": str(tmp_path / "reqs.txt"),
                                           "base_python": str(base_python)})
    project = make_project({"box": entry}, default="box")
    (project / "tasks.py").write_text((REPO / "tasks.py").read_text())
    copy_remote_package(project)
    return project


def test_env_setup_is_idempotent_and_rehashes_on_change(env_project, tmp_path):
    first = invoke(env_project, "env.setup")
    assert first.returncode == 0, first.stdout + first.stderr
    venv = hostile_venv(tmp_path)
    assert (venv / "bin" / "python").exists() and "ready" in first.stdout
    assert_nothing_injected(tmp_path)
    marker = (venv / ".draftops-env-hash").read_text()
    second = invoke(env_project, "env.setup")
    assert second.returncode == 0 and "up to date" in second.stdout and "nothing to do" in second.stdout
    (tmp_path / "reqs.txt").write_text("# changed\n")
    third = invoke(env_project, "env.setup")
    assert third.returncode == 0 and "ready" in third.stdout
    assert (venv / ".draftops-env-hash").read_text() != marker
    assert_nothing_injected(tmp_path)


def test_env_setup_failure_is_reported(env_project, tmp_path):
    (tmp_path / "reqs.txt").write_text("--no-index\ndefinitely-not-a-package-draftops==9.9\n")
    result = invoke(env_project, "env.setup")
    assert result.returncode == 1 and "failed (exit 1)" in result.stderr
    # the reason reaches the user: pip's own line, naming the requirement it could not install
    assert "No matching distribution found for definitely-not-a-package-draftops==9.9" in result.stdout
    assert not (hostile_venv(tmp_path) / ".draftops-env-hash").exists()
    assert_nothing_injected(tmp_path)


def test_sync_then_env_check_on_one_host_writes_table_and_json(env_project, tmp_path):
    missing = invoke(env_project, "env.check")
    assert missing.returncode == 1 and " -m invoke env.setup`" in missing.stderr     # box: the default host
    result = invoke(env_project, "env.setup", "sync", "env.check", "--host", "box")
    # the ml-env built here has no torch (reqs.txt installs nothing): env.check shows its table and
    # writes its JSON, then fails, naming the fix (tests/test_host_without_torch_ssh.py)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "cannot import torch or safetensors" in result.stderr and " -m invoke env.setup`" in result.stderr
    assert (tmp_path / "hostroot/code/remote/envcheck.py").exists()   # --host applied to sync too
    assert not (env_project / ".draftops/code/remote").exists()
    assert "torch" in result.stdout and "sglang" in result.stdout
    rows = [line.strip("│ ").split()[0] for line in result.stdout.splitlines() if line.startswith("│")]
    assert rows.count("torch") == 1 and rows.count("numpy") == 1, result.stdout   # item 5: torch once
    assert_nothing_injected(tmp_path)
    reports = list((env_project / "runs").glob("*-env-check-*/env.json"))
    assert len(reports) == 1
    report = json.loads(reports[0].read_text())
    assert report["python"] == sys.version.split()[0] and "torch" in report


def test_runs_lists_and_bad_host_errors_are_one_paragraph(env_project):
    result = invoke(env_project, "runs", "--host", "nope")
    assert result.returncode == 1
    assert "Unknown host 'nope'" in result.stderr and "Traceback" not in result.stderr
    ok = invoke(env_project, "runs")
    assert ok.returncode == 0 and "runs on box" in ok.stdout


def _follow_a_long_job(project: Path, sigint: Any) -> tuple[str, subprocess.Popen]:
    """Start `echo tick; sleep 600` on the project's host and `invoke logs --follow` it, with SIGINT
    set to ``sigint`` in that process (a suite run as a background job of a script has SIGINT
    ignored, and children inherit that); returns once "tick" was shown."""
    import signal
    import time

    from draftops.link.host import close_all, open_host
    from draftops.runs import jobs
    host = open_host(None, project)
    # long enough that starting invoke on a loaded machine (seen: over 30 s) cannot outlast it
    job = jobs.start(host, "long", "echo tick; sleep 600", cwd=".")
    close_all()
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "logs", job.id, "--follow"], cwd=project,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, sigint))
    assert proc.stdout is not None
    seen = ""
    deadline = time.monotonic() + 120      # a loaded machine can take seconds just to start invoke
    while "tick" not in seen and time.monotonic() < deadline and proc.poll() is None:
        seen += proc.stdout.readline()
    assert "tick" in seen, seen
    return job.id, proc


def _stop(project: Path, run_id: str, proc: subprocess.Popen) -> None:
    from draftops.link.host import open_host
    from draftops.runs import jobs
    if proc.poll() is None:
        proc.kill()
        proc.communicate(timeout=30)
    jobs.kill(open_host(None, project), run_id, grace_s=2)


def test_ctrl_c_on_logs_follow_detaches_and_the_job_keeps_running(env_project):
    import signal

    from draftops.link.host import open_host
    from draftops.runs import jobs
    run_id, proc = _follow_a_long_job(env_project, signal.SIG_DFL)    # Ctrl-C as from a terminal
    try:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 130
        assert "detached" in out and f"invoke logs {run_id} --follow" in out, out
        assert jobs.status(open_host(None, env_project), run_id)["state"] == "running"
    finally:
        _stop(env_project, run_id, proc)


def test_a_follow_started_with_sigint_ignored_keeps_following(env_project):
    """`nohup invoke logs --follow &` means "ignore Ctrl-C": draftops' own Ctrl-C handler must not
    take that back."""
    import signal
    import time
    run_id, proc = _follow_a_long_job(env_project, signal.SIG_IGN)
    try:
        proc.send_signal(signal.SIGINT)
        time.sleep(3)
        assert proc.poll() is None, "an ignored SIGINT stopped the follow"
    finally:
        _stop(env_project, run_id, proc)


def test_a_venv_cut_off_before_pip_was_installed_is_repaired_by_the_rerun(env_project, tmp_path):
    """`python -m venv` makes bin/python first and installs pip last (seconds later): a setup
    interrupted in between left a venv every later setup skipped, then failed in (no module named pip)."""
    venv = hostile_venv(tmp_path)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)  # the cut-off state
    (tmp_path / "reqs.txt").write_text("--no-index\n")      # pip runs, installs nothing
    result = invoke(env_project, "env.setup")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "No module named pip" not in result.stdout and "ready" in result.stdout
    assert subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "--version"], capture_output=True).returncode == 0
    assert_nothing_injected(tmp_path)


def test_env_setup_shows_its_steps_not_pips_output_and_says_where_the_log_is(env_project, tmp_path):
    """The new user's `env.setup --engine vllm` printed 537 lines of raw pip output; an install
    shows its own steps, keeps pip's lines in the run's log (and says where) and names the next step."""
    (tmp_path / "reqs.txt").write_text("pip\n")          # installed already: pip says so, offline
    result = invoke(env_project, "env.setup")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "creating venv" in result.stdout and "env ready" in result.stdout
    assert "Requirement already satisfied" not in result.stdout
    log = Path(result.stdout.split("full log: ", 1)[1].split()[0])
    assert log.is_file() and "Requirement already satisfied: pip" in log.read_text()
    assert "next: `" in result.stdout and " -m invoke env.check`" in result.stdout    # box: the default host
