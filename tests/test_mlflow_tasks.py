"""The tasks with MLFLOW_TRACKING_URI set, on the built-in `local` host with the demo, against a real
``mlflow server`` (tests/support/mlflow_server.py): the README's main job logs its run (named by its run id,
experiment `draftops`, the verdict as a tag, the accept-length metrics, report.json), and with the
server stopped it still succeeds and says once that it could not log; the doctor's report links to
its MLflow run, its steps nested under it; `runs.export` twice sends the history once."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from draftops.history import History
from tests.conftest import REPO
from tests.support.drafter_support import local_demo_project
from tests.support.mlflow_server import MlflowServer

pytestmark = [pytest.mark.slow]
RUN_ID = re.compile(r"\d{8}-\d{6}-test-drafter-[0-9a-f]+")


@pytest.fixture
def project(make_project, no_inventory_env) -> Path:
    """A project on the `local` host whose host root holds this session's demo (as generated)."""
    root = local_demo_project(make_project())
    return root


def invoke(root: Path, uri: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "DRAFTOPS_MLFLOW"))}
    env.update({"COLUMNS": "200", "PYTHONPATH": str(REPO), "MLFLOW_TRACKING_URI": uri,
                "DRAFTOPS_MLFLOW_TIMEOUT": "60"})     # a loaded machine's first import of the client
    env.pop("DRAFTOPS_HOST", None)
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=root, env=env, capture_output=True,
                          text=True, timeout=600)


def test_the_main_job_logs_its_run_and_still_succeeds_with_the_server_stopped(project, tmp_path) -> None:
    server = MlflowServer(tmp_path / "store").start()
    try:
        done = invoke(project, server.uri, "sync", "test-drafter")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "MLflow" not in done.stdout + done.stderr
        (run_id,) = set(RUN_ID.findall(done.stdout))
        run = server.run_named(run_id)                        # experiment `draftops`, named by the run id
        assert run.data.tags["verdict"] == "MISMATCH" and run.data.tags["kind"] == "test-drafter"
        assert run.data.metrics["predicted_served"] > 1 and run.data.metrics["predicted_best"] > 1
        client = server.client()
        assert len(client.get_metric_history(run.info.run_id, "predicted_cond_served")) >= 2   # one per position
        assert "report.json" in {f.path for f in client.list_artifacts(run.info.run_id)}
    finally:
        server.kill()
    stopped = invoke(project, server.uri, "test-drafter")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    lines = [ln for ln in (stopped.stdout + stopped.stderr).splitlines() if "MLflow" in ln]
    assert len(lines) == 1 and "not logged to MLflow" in lines[0] and "invoke runs.export --since" in lines[0], lines
    server.start()                                            # back: export sends the missing run, then nothing
    try:
        first = invoke(project, server.uri, "runs.export")
        assert first.returncode == 0 and "1 run(s) sent" in first.stdout and "1 already there" in first.stdout, \
            first.stdout + first.stderr
        again = invoke(project, server.uri, "runs.export")
        assert again.returncode == 0 and "0 run(s) sent" in again.stdout and "2 already there" in again.stdout
        assert len(server.runs()) == 2
    finally:
        server.kill()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    running = MlflowServer(tmp_path_factory.mktemp("mlflow")).start()
    yield running
    running.kill()


def test_the_doctors_report_links_its_mlflow_run_with_its_steps_nested(project, server) -> None:
    done = invoke(project, server.uri, "doctor", "--draft", "demo", "--fix", "--no-bench")
    assert done.returncode == 0, done.stdout + done.stderr
    (report,) = (project / "runs").glob("*-doctor-*/doctor.md")
    doctor = server.run_named(report.parent.name)
    assert f"MLflow: {server.uri}/#/experiments/{doctor.info.experiment_id}/runs/{doctor.info.run_id}" \
        in report.read_text()
    steps = [r for r in server.runs() if r.data.tags.get("mlflow.parentRunId") == doctor.info.run_id]
    hist = History(project / "runs" / "history.sqlite")
    made = {r.run_id for r in hist.query() if r.run_id in hist.get(report.parent.name).metrics["runs"]}
    assert {r.info.run_name for r in steps} == made and len(made) >= 3           # check, fix, recheck
    assert {r.data.tags["kind"] for r in steps} == {"test-drafter", "draft-config"}
    files = {f.path for f in server.client().list_artifacts(doctor.info.run_id)}
    assert {"doctor.json", "doctor.md", "doctor.html"} <= files


def test_the_nightly_report_links_each_hosts_mlflow_run(make_project, tmp_path, no_inventory_env, server) -> None:
    root = make_project({"loc": {"transport": "local", "root": str(tmp_path / "locroot")}}, "loc")
    (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
    (root / "playbooks").mkdir()
    (root / "playbooks" / "p.yaml").write_text(yaml.safe_dump({"hosts": ["loc"], "setup": "mlflow",
                                                               "steps": [{"name": "sync", "task": "sync"}]}))
    done = invoke(root, server.uri, "nightly", "--playbook", "playbooks/p.yaml")
    assert done.returncode == 0, done.stdout + done.stderr
    (folder,) = (root / "runs").glob("nightly-*/")
    night = server.run_named(f"{folder.name}-loc")
    assert night.data.tags["kind"] == "nightly" and night.data.tags["verdict"] == "ok"
    url = f"{server.uri}/#/experiments/{night.info.experiment_id}/runs/{night.info.run_id}"
    assert f"- **MLflow**: {url}" in (folder / "report.md").read_text().splitlines()
    assert {"report.md", "report.html"} <= {f.path for f in server.client().list_artifacts(night.info.run_id)}
