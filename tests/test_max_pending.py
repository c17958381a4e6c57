"""`--max-pending SECONDS` on the tasks that follow a job (test-drafter, capture-check, bench, serve, doctor):
a number of seconds from 1 to slurmspec.MAX_PENDING_S, checked as Invoke reads the command line, and
refused with one paragraph on a host that has no scheduler (its jobs never queue). What it does on a
Slurm host is tested against the real cluster in tests/test_slurm_tasks_ssh.py."""
from __future__ import annotations

import pytest
from invoke.exceptions import ParseError

from draftops import slurmspec
from draftops.cli import bench, capture, doctor, drafter, options, serve
from tests.conftest import REPO
from tests.support.tasks import invoke

TASKS = {"test-drafter": drafter.test_drafter, "capture-check": capture.capture_check, "bench": bench.run,
         "serve": serve.start, "doctor": doctor.doctor}


def test_the_flag_is_bounded_like_hosts_yaml_max_pending():
    assert options.MAX_PENDING_S == slurmspec.MAX_PENDING_S      # one bound, written twice for start-up's sake
    for name, task_ in TASKS.items():
        assert task_.options.get("max_pending") is options.MAX_PENDING, name
        assert "Slurm" in task_.help["max_pending"], name
    assert options.MAX_PENDING.read("--max-pending", "90") == 90.0
    assert options.MAX_PENDING.read("--max-pending", str(slurmspec.MAX_PENDING_S)) == slurmspec.MAX_PENDING_S
    for bad in ("nan", "inf", "-inf", "0", "-5", "0.5", "1e9", "soon", ""):
        with pytest.raises(ParseError, match="--max-pending .* is not a number of seconds from 1 to 604800"):
            options.MAX_PENDING.read("--max-pending", bad)


@pytest.fixture
def plain_project(make_project, tmp_path, no_inventory_env):
    root = make_project({"here": {"transport": "local", "root": str(tmp_path / "hostroot")}}, default="here")
    (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
    return root


def test_a_bad_value_is_one_line_before_anything_runs(plain_project):
    done = invoke(plain_project, "test-drafter", "--max-pending", "nan")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "error: --max-pending 'nan' is not a number of seconds from 1 to 604800 (7 days): how long a job may "
        "wait in the Slurm queue before the task stops waiting for it."], done.stderr
    assert not (plain_project / "hostroot").exists()


@pytest.mark.parametrize("task_", ["test-drafter", "serve", "doctor --draft demo"])
def test_a_host_without_a_scheduler_refuses_the_flag_in_one_paragraph(plain_project, task_):
    done = invoke(plain_project, *task_.split(), "--max-pending", "60")
    assert done.returncode == 1, done.stdout + done.stderr
    text = " ".join(done.stderr.split())
    assert text == ("error: Host 'here' has no scheduler (no `scheduler: slurm` in hosts.yaml): its jobs start at "
                    "once and never wait in a queue, so --max-pending bounds nothing there. Drop --max-pending, or "
                    "name a Slurm host with --host."), done.stderr
    assert not (plain_project / "hostroot" / "runs").exists()          # nothing started, nothing synced
