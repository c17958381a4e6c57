"""`invoke runs` as it reads a job that was told to stop: a job (a server under `serve.stop`) that
exits as asked on SIGTERM is "stopped", not "killed exit 0"; one that needed SIGKILL stays "killed".
Through the runner's and the agent's real status files, on the sshd and on `local`."""
from __future__ import annotations

import io

import pytest
from rich.console import Console

from draftops.console import show_runs
from draftops.link.host import open_host
from draftops.runs import jobs
from tests.support.processes import wait_state

pytestmark = pytest.mark.ssh


@pytest.fixture(params=["box", "local"])
def project(request, make_project, sshd, tmp_path, no_inventory_env):
    from tests.conftest import ssh_entry
    return make_project({"box": ssh_entry(sshd, tmp_path)}, default=request.param)


@pytest.mark.parametrize("script, shown", [
    ("trap 'exit 0' TERM; echo up; while :; do sleep 0.1; done", "stopped"),       # a server's clean stop
    ("exec python3 -c 'import time; print(\"up\", flush=True); time.sleep(60)'", "stopped"),  # dies of TERM
    ("trap '' TERM; echo up; while :; do sleep 0.1; done", "killed"),                # needs SIGKILL
])
def test_a_job_told_to_stop_is_listed_as_stopped_when_it_exits_as_asked(project, script, shown):
    host = open_host(None, project)
    job = jobs.start(host, "serve-vllm-8000", script)
    wait_state(project, job.id, {"running"})
    final = jobs.kill(host, job.id, grace_s=0.5)
    assert final["state"] == "killed"
    buffer = io.StringIO()
    show_runs(jobs.list_runs(host, [job.id]), host.name, Console(file=buffer, width=200, color_system=None))
    row = next(line for line in buffer.getvalue().splitlines() if job.id in line)
    assert f" {shown} " in row, row
