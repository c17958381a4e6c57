"""The tasks on a Slurm host, as a user types them: `invoke sync test-drafter --host cluster` runs as a
Slurm job and pulls the same report as on `local`; `invoke runs` shows its Slurm job; `invoke kill`
cancels a queued job; a job left pending past its bound is reported, not waited on forever."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest
import yaml

from draftops.nightly import queuetime
from tests.conftest import REPO, ssh_entry
from tests.support.drafter_support import task_project
from tests.support.laptop_venv import laptop_python
from tests.support.tasks import invoke

pytestmark = [pytest.mark.ssh, pytest.mark.slurm, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster_project(tmp_path_factory, login_sshd, slurm):
    base = tmp_path_factory.mktemp("slurm-tasks")
    entry = ssh_entry(login_sshd, base, python=sys.executable, scheduler="slurm", engine="vllm",
                      slurm={"time": "15", "tasks": {"test-drafter": {"time": "20"}}})
    project = task_project(base, {"cluster": entry}, "local", demo_roots=(base / "hostroot",), local_demo=True)
    slurm.cancel_all()
    yield project
    slurm.cancel_all()


def test_sync_test_drafter_on_the_cluster_is_a_slurm_job_with_the_same_report_as_local(cluster_project, slurm):
    done = invoke(cluster_project, "sync", "test-drafter", "--steps", "3", "--host", "cluster")
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = (cluster_project / "runs").glob("*-test-drafter-*")
    on_cluster = json.loads((run_dir / "report.json").read_text())
    job_id = json.loads((run_dir / "slurm.json").read_text())["job_id"]
    assert "TimeLimit=00:20:00" in slurm.run("scontrol", "show", "job", job_id).stdout   # the task's override
    local = invoke(cluster_project, "test-drafter", "--steps", "3", "--host", "local")
    assert local.returncode == 0, local.stdout + local.stderr
    (local_dir,) = [d for d in (cluster_project / "runs").glob("*-test-drafter-*") if d != run_dir]
    here = json.loads((local_dir / "report.json").read_text())
    assert on_cluster["verdict"] == here["verdict"]
    assert [f["id"] for f in on_cluster["findings"]] == [f["id"] for f in here["findings"]]
    listing = invoke(cluster_project, "runs", "--host", "cluster")
    assert listing.returncode == 0, listing.stderr
    assert f"Slurm job {job_id}" in listing.stdout and run_dir.name in listing.stdout, listing.stdout


def test_a_task_pending_past_its_bound_is_reported_and_kill_cancels_it(cluster_project, slurm):
    hosts = yaml.safe_load((cluster_project / "hosts.yaml").read_text())
    hosts["hosts"]["cluster"]["slurm"]["tasks"]["env-check"] = {"cpus": slurm.cpus + 1, "max_pending": 3}
    (cluster_project / "hosts.yaml").write_text(yaml.safe_dump(hosts))
    done = invoke(cluster_project, "env.check", "--host", "cluster")
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "did not start" in out and "PartitionConfig" in out and "past its bound of 3 s" in out, out
    run_id = out.split("run ", 1)[1].split()[0]
    listing = invoke(cluster_project, "runs", "--host", "cluster")
    assert "PENDING (reason: PartitionConfig)" in listing.stdout, listing.stdout
    # `invoke logs --follow`, which the message names, waits for the job past the bound, until it ends
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(REPO)}
    env.pop("DRAFTOPS_HOST", None)
    follower = subprocess.Popen([laptop_python(), "-m", "invoke", "logs", run_id, "--follow", "--host", "cluster"],
                                cwd=cluster_project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            follower.wait(timeout=8)                             # still following the queued job
    finally:
        killed = invoke(cluster_project, "kill", run_id, "--host", "cluster")
        followed = follower.communicate(timeout=60)[0].decode()
    assert killed.returncode == 0, killed.stdout + killed.stderr
    assert f"job {run_id}: killed" in followed, followed
    # no process of it ever ran: Slurm's "0:0" is not shown as its exit status
    assert "while it waited in Slurm's queue; it never ran" in followed and "exit 0" not in followed, followed
    assert slurm.run("squeue", "-h", "-n", run_id).stdout.strip() == ""
    listing = invoke(cluster_project, "runs", "--host", "cluster")
    assert "CANCELLED" in listing.stdout, listing.stdout
    del hosts["hosts"]["cluster"]["slurm"]["tasks"]["env-check"]
    (cluster_project / "hosts.yaml").write_text(yaml.safe_dump(hosts))


@contextmanager
def impossible_drafter_task(project, slurm):
    """hosts.yaml's test-drafter task asks more CPUs than the node has (its jobs stay PENDING with
    reason PartitionConfig) while the block runs; the task's settings are put back after."""
    hosts = yaml.safe_load((project / "hosts.yaml").read_text())
    kept = hosts["hosts"]["cluster"]["slurm"]["tasks"]["test-drafter"]
    hosts["hosts"]["cluster"]["slurm"]["tasks"]["test-drafter"] = {"cpus": slurm.cpus + 1}
    (project / "hosts.yaml").write_text(yaml.safe_dump(hosts))
    try:
        yield
    finally:
        hosts["hosts"]["cluster"]["slurm"]["tasks"]["test-drafter"] = kept
        (project / "hosts.yaml").write_text(yaml.safe_dump(hosts))


def _bounded_by_max_pending(project, *task: str) -> tuple[str, float, str, dict]:
    """``invoke TASK --host cluster --max-pending 3`` of a run the node cannot take: it ends (exit 1) with
    the bound and Slurm's reason; its output, its seconds, the run it named and that run's job.json."""
    started = time.monotonic()
    done = invoke(project, *task, "--host", "cluster", "--max-pending", "3")
    waited = time.monotonic() - started
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "past its bound of 3 s" in out and "PartitionConfig" in out, out
    run_id = out.split("run ", 1)[1].split()[0]
    job = json.loads((project.parent / "hostroot" / "runs" / run_id / "job.json").read_text())
    return out, waited, run_id, job


def test_max_pending_on_the_command_line_bounds_one_run_over_hosts_yaml(cluster_project, slurm):
    """hosts.yaml asks the impossible (more CPUs than the node has) and sets no bound; `--max-pending 3`
    ends this one run's wait with Slurm's reason; the job stays queued, with the bound in its job.json."""
    with impossible_drafter_task(cluster_project, slurm):
        out, waited, run_id, job = _bounded_by_max_pending(cluster_project, "test-drafter", "--steps", "3")
        assert waited < 60, waited
        assert job["slurm"]["max_pending"] == 3.0
        assert slurm.run("squeue", "-h", "-n", run_id, "-o", "%T").stdout.strip() == "PENDING"
        assert invoke(cluster_project, "kill", run_id, "--host", "cluster").returncode == 0


def test_doctor_max_pending_bounds_its_check_and_ends_the_doctor_with_slurms_reason(cluster_project, slurm):
    """`invoke doctor --max-pending 3` on the cluster: its check (a test-drafter job asking more CPUs than
    the node has) stops waiting after 3 s with Slurm's reason; the doctor ends on that step (exit 1)
    and cancels the queued job, saying so; its job.json held the doctor's bound."""
    with impossible_drafter_task(cluster_project, slurm):
        out, waited, run_id, job = _bounded_by_max_pending(cluster_project, "doctor", "--draft", "demo")
        assert waited < 90, waited
        assert job["slurm"]["max_pending"] == 3.0 and "-test-drafter-" in run_id
        # the doctor leaves nothing behind: it cancelled the queued check, and says so (not "it stays queued")
        text = " ".join(out.split())
        assert f"stopped run {run_id}, which the doctor was following" in text, out
        assert "The doctor cancels it as it ends" in text and "stays queued" not in text, out
        assert "invoke doctor --resume " in text and "--max-pending SECONDS" in text, out
        assert slurm.run("squeue", "-h", "-n", run_id).stdout.strip() == ""


def test_a_night_on_the_cluster_reports_each_steps_queue_wait_apart_from_its_run(cluster_project, slurm):
    """playbooks/cluster.yaml on the cluster host: its env and drafter steps queue as Slurm jobs while an
    outside job holds every CPU of the node, so they wait in the queue for real; the night's report
    gives each step's wait and run time as read from the slurm.json and status.json the steps pulled."""
    (cluster_project / "playbooks").mkdir(exist_ok=True)
    shutil.copy(REPO / "playbooks" / "cluster.yaml", cluster_project / "playbooks" / "cluster.yaml")
    blocker = slurm.run("sbatch", "--parsable", f"--cpus-per-task={slurm.cpus}", "--job-name=blocker",
                        "--wrap", "sleep 8").stdout.strip()
    assert blocker.isdigit()
    started = time.time()
    done = invoke(cluster_project, "nightly", "--playbook", "playbooks/cluster.yaml")
    out = done.stdout + done.stderr
    # the shipped demo is a MISMATCH, so the night's test-drafter step makes it NOT HEALTHY: exit 3 (issue 35)
    assert done.returncode == 3, out
    assert "cluster: NOT HEALTHY" in out and "ok, but ✗ MISMATCH" in out, out
    (night,) = [p for p in (cluster_project / "runs").glob("nightly-*") if p.stat().st_mtime >= started]
    md = " ".join((night / "report.md").read_text().split())
    pulled = {}
    for folder in (cluster_project / "runs").iterdir():
        mark = folder / ".draftops-pulled.json"
        if mark.is_file() and mark.stat().st_mtime >= started:
            pulled[folder.name] = queuetime.of_run(folder)
    (env_run,) = [r for r in pulled if "-env-check-" in r]
    (drafter_run,) = [r for r in pulled if "-test-drafter-" in r]
    for step, run in (("env", env_run), ("drafter", drafter_run)):
        queued, ran = pulled[run]
        assert ran > 0, (run, ran)
        line = f"cluster / {step} ({'env.check' if step == 'env' else 'test-drafter'}): waited {queued:.0f} s in " \
               f"Slurm's queue, ran {ran:.0f} s (1 job)"
        assert line in md, md
        slurm_json = json.loads((cluster_project / "runs" / run / "slurm.json").read_text())
        assert slurm_json["job_id"].isdigit()
    # the first job queued behind the blocker for most of its 8 s (Slurm's own SubmitTime/StartTime)
    assert max(pulled[env_run][0], pulled[drafter_run][0]) >= 4, pulled
    assert "queued" in out and "in Slurm" in out, out           # each step's end line says so too
    print(*[line.strip() for line in (night / "report.md").read_text().splitlines() if "Slurm's queue" in line],
          sep="\n")                                          # the figures docs/slurm.md quotes


def test_gpus_2_nodes_1_is_one_slurm_job_whose_srun_starts_2_gloo_ranks(cluster_project, slurm):
    """torchrun under Slurm (issue 28 item 4): one job of --nodes 1 --ntasks-per-node 1, srun running the
    launcher on its node, 2 gloo ranks; the report is local's --full one."""
    from tests.support.torchrun import comparable

    before = set((cluster_project / "runs").glob("*-test-drafter-*"))
    done = invoke(cluster_project, "sync", "test-drafter", "--host", "cluster", "--gpus", "2", "--nodes", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = set((cluster_project / "runs").glob("*-test-drafter-*")) - before
    sbatch = (run_dir / "sbatch").read_text()
    assert "--nodes=1" in sbatch and "--ntasks-per-node=1" in sbatch, sbatch
    command = json.loads((run_dir / "job.json").read_text())["command"]
    assert "exec srun --nodes=\"$SLURM_NNODES\" --ntasks-per-node=1" in command and "remote.drafter.launch" in command
    assert json.loads((run_dir / "slurm.json").read_text())["job_id"]
    on_cluster = json.loads((run_dir / "report.json").read_text())
    before = set((cluster_project / "runs").glob("*-test-drafter-*"))
    local = invoke(cluster_project, "test-drafter", "--host", "local", "--full")
    assert local.returncode == 0, local.stdout + local.stderr
    (local_dir,) = set((cluster_project / "runs").glob("*-test-drafter-*")) - before
    here = json.loads((local_dir / "report.json").read_text())
    base = cluster_project.parent

    def demo_paths_out(report: dict) -> dict:
        text = json.dumps(comparable(report))
        for root in (base / "hostroot" / "state" / "demo", cluster_project / ".draftops" / "state" / "demo"):
            text = text.replace(str(root), "DEMO")
        return json.loads(text)
    assert demo_paths_out(on_cluster) == demo_paths_out(here)
