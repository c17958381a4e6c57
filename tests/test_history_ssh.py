"""Every `invoke test-drafter` over a real sshd lands in the local history: the demo's MISMATCH with
its predictions, fix and the digest of the config it read on the host; a failed run as failed; and
a history that cannot be written only warns."""
from __future__ import annotations

import json
import shutil
import sys

import pytest

from draftops.history import History
from remote.bench.digest import file_digest
from tests.conftest import REPO, copy_remote_package, ssh_entry
from tests.support.drafter_support import demo
from tests.support.tasks import invoke_wide as invoke

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


def test_test_drafter_runs_are_recorded(make_project, sshd, tmp_path, no_inventory_env) -> None:
    project = make_project({"box": ssh_entry(sshd, tmp_path, python=sys.executable)}, "box")
    (project / "tasks.py").write_text((REPO / "tasks.py").read_text())
    copy_remote_package(project)
    host_demo = tmp_path / "hostroot" / "state" / "demo"
    shutil.copytree(demo().root, host_demo)
    first = invoke(project, "sync", "test-drafter")
    assert first.returncode == 0, first.stdout + first.stderr
    run_dir = next((project / "runs").glob("*-test-drafter-*"))
    report = json.loads((run_dir / "report.json").read_text())
    hist = History(project / "runs" / "history.sqlite")
    rec = hist.get(run_dir.name)
    assert rec is not None and rec.kind == "test-drafter" and rec.host == "box" and rec.verdict == "MISMATCH"
    assert rec.draft == report["checkpoint"]["path"]
    assert rec.draft_digest == file_digest(report["checkpoint"]["config_path"])   # read on the host
    assert rec.metrics["steps"] == 3
    assert rec.metrics["predicted_served"] == pytest.approx(report["predicted_accept_length"]["served"])
    assert rec.metrics["predicted_best"] == pytest.approx(report["predicted_accept_length"]["best"])
    assert rec.metrics["predicted_walk_best"] == pytest.approx(report["predicted_accept_length"]["walk"]["best"])
    assert rec.metrics["fix_layer_ids"] == report["verdict"]["fix_layer_ids"]
    assert rec.settings["steps"] == 3 and rec.settings["device"] == report["run"]["device"]

    # a run that fails is recorded as failed; a history that cannot be written only warns
    history_file = project / "runs" / "history.sqlite"
    saved = history_file.read_bytes()
    for name in ("history.sqlite-wal", "history.sqlite-shm"):
        (project / "runs" / name).unlink(missing_ok=True)
    history_file.write_bytes(b"garbage" * 100)
    broken = invoke(project, "test-drafter", "--ckpt", str(tmp_path / "no such draft"), "--data", str(tmp_path))
    assert broken.returncode == 1
    assert "not recorded in the local history" in broken.stdout and "Traceback" not in broken.stderr
    history_file.write_bytes(saved)
    failed = invoke(project, "test-drafter", "--ckpt", str(tmp_path / "no such draft"), "--data", str(tmp_path))
    assert failed.returncode == 1
    rows = hist.query(kind="test-drafter")
    assert [r.verdict for r in rows] == ["failed", "MISMATCH"]
    assert rows[0].settings["ckpt"] == str(tmp_path / "no such draft")
    listed = invoke(project, "runs", "--local", "--kind", "test-drafter")
    assert listed.returncode == 0 and run_dir.name in listed.stdout and "MISMATCH" in listed.stdout
