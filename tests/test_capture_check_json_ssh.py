"""capture-check's `--json` and its findings in a night (issue 35, items 13 and 15), over a real sshd
with the hidden-state engine's test double as the serve profile's engine (tests/doubles/vllm_hs, as
tests/test_capture_check_task_ssh.py): the demo's draft as shipped is fed other layers than it was
trained on, which the check reports as `draft MISMATCH`."""
from __future__ import annotations

import json

import pytest
import yaml

from tests.support.capture_projects import project  # noqa: F401  (the module's fixture)
from tests.support.tasks import invoke

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


def test_capture_check_json(project):  # noqa: F811
    done = invoke(project, "capture-check", "--draft", "demo", "--samples", "4", "--json")
    doc = json.loads(done.stdout)
    assert done.returncode == 0 and doc["exit_code"] == 0, done.stderr[-3000:]
    assert doc["task"] == "capture-check" and doc["result"]["schema"] == "draftops.capture-check/1"
    assert doc["result"]["draft"]["status"] == "MISMATCH"
    on_disk = json.loads((project / "runs" / doc["run_id"] / "capture-check.json").read_text())
    assert doc["result"] == on_disk
    assert "draft MISMATCH" in " ".join(done.stderr.split())        # the table and story, for a person


def test_a_capture_check_step_that_finds_a_mismatch_makes_the_night_not_healthy(project):  # noqa: F811
    steps = [{"name": "capture", "task": "capture-check", "args": {"draft": "demo", "samples": 4}}]
    (project / "playbooks").mkdir(exist_ok=True)
    (project / "playbooks" / "cc.yaml").write_text(yaml.safe_dump({"hosts": ["box"], "steps": steps}))
    done = invoke(project, "nightly", "--playbook", "playbooks/cc.yaml")
    assert done.returncode == 3, done.stdout[-3000:] + done.stderr[-3000:]
    assert "box / capture (capture-check): ok, but ✗ draft-MISMATCH" in done.stdout
    assert "box: NOT HEALTHY" in done.stdout
