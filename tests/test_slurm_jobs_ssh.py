"""Jobs on a Slurm host, for real: a one-node Slurm cluster (tests/support/slurm.py) behind a real sshd as
its login node. Every job is a batch job; its state, node, end and faults come from Slurm."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from draftops.errors import SchedulerError
from draftops.link import host as host_module
from draftops.link.host import open_host
from draftops.runs import jobs, sync
from draftops.serve import hosttool, lifecycle
from tests.conftest import copy_remote_package, ssh_entry
from tests.support.sshd import free_port

pytestmark = [pytest.mark.ssh, pytest.mark.slurm]

RESULT = 'echo "@@draftops {\\"event\\": \\"result\\", \\"verdict\\": \\"OK\\"}"'


@pytest.fixture
def cluster_project(make_project, login_sshd, slurm, tmp_path, no_inventory_env):
    """A project whose default host `cluster` is the Slurm login node; the node is idle at the start."""
    slurm.cancel_all()
    entry = ssh_entry(login_sshd, tmp_path, scheduler="slurm", persist=0, slurm={"time": "10"})
    yield make_project({"cluster": entry}, default="cluster")
    slurm.cancel_all()


def wait_for(project: Path, run_id: str, check, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    row: dict = {}
    while time.monotonic() < deadline:
        row = jobs.status(open_host(None, project), run_id)
        if check(row):
            return row
        time.sleep(0.3)
    raise AssertionError(f"run {run_id} never got there: {row}")


def job_fields(slurm, job_id: str) -> dict[str, str]:
    out = slurm.run("scontrol", "show", "job", "-o", job_id).stdout
    return dict(item.split("=", 1) for item in out.split() if "=" in item)


def test_a_job_is_a_slurm_batch_job_named_by_its_run_and_ends_as_its_command_did(cluster_project, slurm):
    host = open_host(None, cluster_project)
    job = jobs.start(host, "hello", f"echo on $(hostname) in $SLURM_JOB_ID; {RESULT}; exit 3")
    assert job.pid is None                              # its runner starts on the node, not here
    final = jobs.follow(host, job.id, (lines := []).append)
    assert final["state"] == "failed" and final["exit_code"] == 3
    assert final["outcome"]["verdict"] == "OK"          # result events reach status.json as before
    recorded = json.loads(Path(host.runs_dir, job.id, "slurm.json").read_text())
    assert recorded["job_id"].isdigit()
    assert any(line == f"on {slurm.node} in {recorded['job_id']}" for line in lines), lines
    fields = job_fields(slurm, recorded["job_id"])
    assert fields["JobName"] == job.id and fields["StdOut"] == f"{host.runs_dir}/{job.id}/log"
    assert fields["TimeLimit"] == "00:10:00"            # the host's slurm: time
    assert fields["WorkDir"] == str(Path(host.runs_dir).parent)     # --chdir: the host's root, never sbatch's cwd
    row = wait_for(cluster_project, job.id, lambda r: r["slurm"]["state"] == "FAILED")
    assert row["slurm"]["node"] == slurm.node and row["slurm"]["exit_code"] == 3
    assert isinstance(row["slurm"]["queued_s"], float)


def test_a_job_pending_on_an_impossible_request_shows_slurms_reason_and_its_bound_ends_the_wait(
        cluster_project, slurm):
    host = open_host(None, cluster_project)
    too_many = slurm.cpus + 1
    job = jobs.start(host, "greedy", "echo never", slurm=_options(cpus=too_many, max_pending=3))
    row = wait_for(cluster_project, job.id, lambda r: r.get("slurm", {}).get("reason"))
    assert row["state"] == "starting" and row["slurm"]["state"] == "PENDING"
    assert row["slurm"]["reason"] == "PartitionConfig", row     # more CPUs than the node has
    assert "reason: PartitionConfig" in row["note"]
    started = time.monotonic()
    final = jobs.follow(host, job.id, lambda line: None)        # not waited on forever: its bound
    assert time.monotonic() - started < 30
    assert final["state"] == "starting" and "past its bound of 3 s" in final["note"], final
    assert slurm.run("squeue", "-h", "-n", job.id, "-o", "%T").stdout.strip() == "PENDING"   # still queued
    killed = jobs.kill(host, job.id)
    assert killed["state"] == "killed" and killed["slurm"]["state"] == "CANCELLED"


def test_scancel_from_outside_draftops_reads_as_cancelled(cluster_project, slurm):
    host = open_host(None, cluster_project)
    job = jobs.start(host, "victim", "echo begun; sleep 300")
    row = wait_for(cluster_project, job.id, lambda r: r["state"] == "running")
    assert row["slurm"]["state"] == "RUNNING" and row["slurm"]["node"] == slurm.node
    assert slurm.run("scancel", row["slurm"]["job_id"]).returncode == 0
    final = jobs.follow(host, job.id, (lines := []).append)
    assert final["state"] == "killed", final
    assert final["slurm"]["state"] == "CANCELLED" and "cancelled" in final["slurm"]["words"]
    assert "begun" in lines


def test_slurmctld_down_is_one_paragraph_and_nothing_is_queued_twice_when_it_returns(cluster_project, slurm):
    host = open_host(None, cluster_project)
    slurm.stop_controller()
    try:
        with pytest.raises(SchedulerError) as caught:
            jobs.start(host, "while-down", "echo ran >> ran.txt")
    finally:
        slurm.start_controller()
    message = str(caught.value)
    assert message.startswith("Host 'cluster'") and "Unable to contact slurm controller" in message
    assert "\n" not in message.strip()
    (failed,) = [r for r in jobs.list_runs(host) if r["name"] == "while-down"]
    assert failed["state"] == "failed" and "not submitted" in failed["outcome"]["error"]
    assert Path(host.runs_dir, failed["id"], "unsubmitted").is_file()
    assert slurm.run("squeue", "-h", "-n", failed["id"]).stdout.strip() == ""     # nothing queued behind it
    again = jobs.start(host, "while-down", "echo ran")
    assert jobs.follow(host, again.id, lambda line: None)["state"] == "succeeded"
    names = slurm.run("squeue", "-h", "--states=all", "-o", "%j").stdout.split()
    assert names.count(failed["id"]) == 0 and names.count(again.id) == 1


def test_a_job_queued_despite_a_failed_submission_never_runs_its_command(cluster_project, slurm):
    """The lost-answer case: sbatch failed as far as draftops knows, but the job was queued; its runner
    sees the run marked as given up and does not run the command a second submission runs."""
    host = open_host(None, cluster_project)
    job = jobs.start(host, "ghost", "echo ran > ran.txt; sleep 30", slurm=_options(extra_args=["--begin=now+3"]))
    Path(host.runs_dir, job.id, "unsubmitted").write_text("test: given up\n")   # before Slurm starts it
    row = wait_for(cluster_project, job.id, lambda r: r.get("slurm", {}).get("state") == "FAILED")
    assert not Path(host.code_dir, "ran.txt").exists()
    assert "does not run it" in Path(host.runs_dir, job.id, "log").read_text()
    assert row["state"] == "failed"


def test_a_dropped_ssh_link_does_not_touch_a_running_job(cluster_project, slurm, login_sshd):
    host = open_host(None, cluster_project)
    job = jobs.start(host, "steady", "echo one; sleep 4; echo two")
    wait_for(cluster_project, job.id, lambda r: r["state"] == "running")
    host.transport.close()
    host_module.close_all()
    login_sshd.stop_sessions()                          # every SSH session of the login node goes
    row = wait_for(cluster_project, job.id, lambda r: r["state"] not in ("running", "starting"))
    assert row["state"] == "succeeded" and row["slurm"]["state"] in ("COMPLETED", "RUNNING", "COMPLETING")
    log = Path(open_host(None, cluster_project).runs_dir, job.id, "log").read_text()
    assert "one" in log and "two" in log


@pytest.mark.slow
def test_a_job_killed_at_its_time_limit_is_timeout_with_its_log_and_run_folder_kept(cluster_project, slurm):
    """Also as a server: a registry entry whose job Slurm ended at its time limit is listed dead with
    Slurm's words (`serve.status`), never alive."""
    copy_remote_package(cluster_project)
    host = open_host(None, cluster_project)
    sync.sync(host)
    job = jobs.start(host, "slowpoke", "echo step 1; echo partial > \"$DRAFTOPS_RUN_DIR/partial.txt\"; sleep 600",
                     slurm=_options(time="1"))
    port = free_port()
    entry = {"token": "t0ken", "run_id": job.id, "engine": "vllm", "profile": "default", "target": "/m",
             "draft": None, "listen": "127.0.0.1", "asked": {}, "effective": None,
             "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    assert hosttool.register(host, port, entry, exclusive=True)
    final = jobs.follow(host, job.id, (lines := []).append)          # Slurm ends it after a minute
    assert final["state"] == "failed", final
    assert final["slurm"]["state"] == "TIMEOUT" and "time limit" in final["slurm"]["words"]
    assert "step 1" in lines
    folder = jobs.pull(host, job.id)
    assert (folder / "partial.txt").read_text() == "partial\n" and "step 1" in (folder / "log").read_text()
    assert json.loads((folder / "slurm.json").read_text())["final"]["state"] == "TIMEOUT"
    (server,) = [s for s in lifecycle.servers(host) if s.port == port]
    assert not server.alive and server.shown_state == "dead"
    assert "TIMEOUT, stopped by Slurm at its time limit" in (server.note or ""), server.note


def _options(**fields):
    from draftops.slurmspec import SlurmOptions
    return SlurmOptions(**fields)


def test_a_job_run_outside_the_tests_folders_is_caught(slurm, tmp_path):
    """The check the `slurm` fixture makes at the end of every session (tests/conftest.py): a job
    submitted without --chdir/--output from another folder (the repository, once) is named, with the
    slurm-<id>.out it left there. Every job of draftops' agent runs in the host's root, under tmp."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    job_id = slurm.run("sbatch", "--parsable", "--wrap", "true", cwd=elsewhere).stdout.strip()
    assert job_id.isdigit()
    deadline = time.monotonic() + 30
    while not (elsewhere / f"slurm-{job_id}.out").exists() or f"JobId={job_id} " not in _completions(slurm):
        assert time.monotonic() < deadline, "the job never ended"
        time.sleep(0.3)
    strays = slurm.strays(tmp_path / "inside", elsewhere)
    assert f"job {job_id} (wrap) ran in {elsewhere}" in strays
    assert f"{elsewhere}/slurm-{job_id}.out in the repository" in strays
    assert not [s for s in slurm.strays(tmp_path, tmp_path) if f"job {job_id} " in s]


def _completions(slurm) -> str:
    log = slurm.folder / "jobcomp.log"
    return log.read_text() if log.is_file() else ""
