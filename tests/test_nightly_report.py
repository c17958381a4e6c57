"""A night that regresses against earlier nights already in the history: `invoke nightly` on a local
host exits 2, and the report shows the regression in Markdown, in the HTML page and in the trend plot."""
from __future__ import annotations

import base64
import re
import shutil
from datetime import datetime, timedelta, timezone

import pytest
import yaml

from draftops import history
from tests.conftest import REPO, copy_remote_package
from tests.support.drafter_support import demo
from tests.support.tasks import invoke

pytestmark = pytest.mark.slow


@pytest.fixture
def regressed_night(make_project, tmp_path, no_inventory_env):
    """A project whose history holds 7 nights of step-0 accuracy 0.9 then one of 0.05, and a playbook
    that measures the (badly wired) demo draft, whose real step-0 accuracy is far below 0.9."""
    root = make_project({"loc": {"transport": "local", "root": str(tmp_path / "locroot")}}, "loc")
    (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
    copy_remote_package(root)
    shutil.copytree(demo().root, tmp_path / "locroot" / "state" / "demo")
    (root / "playbooks").mkdir()
    (root / "playbooks" / "p.yaml").write_text(yaml.safe_dump({
        "setup": "demo", "hosts": ["loc"], "thresholds": {"drafter.*": 2},
        "steps": [{"name": "drafter", "task": "test-drafter", "args": {"steps": 3, "limit": 16}}]}))
    hist = history.for_project(root)
    start = datetime.now(timezone.utc) - timedelta(days=8)
    for n, acc in enumerate([0.9, 0.91, 0.9, 0.89, 0.9, 0.9, 0.9, 0.05]):
        hist.record(history.RunRecord(run_id=f"old-{n}", kind="nightly", host="loc",
                                      time=history.to_iso(start + timedelta(days=n)), settings={"setup": "demo"},
                                      metrics={"drafter.step0_acc": acc}, verdict="ok"))
    done = invoke(root, "nightly", "--playbook", "playbooks/p.yaml")
    (folder,) = (root / "runs").glob("nightly-*")
    return root, folder, done


def test_regression_exits_2_and_the_report_says_so(regressed_night):
    root, folder, done = regressed_night
    # the shipped demo is a MISMATCH (✗ findings): a ✗ finding outranks a regression in the exit code, as the
    # README's nightly row orders them (1 failed step, 3 ✗ finding, 2 regression); the regression is still reported
    assert done.returncode == 3, done.stdout + done.stderr
    assert "1 regression" in done.stdout and "✗ MISMATCH" in done.stdout
    md = (folder / "report.md").read_text()
    row = next(ln for ln in md.splitlines() if ln.startswith("| drafter.step0_acc"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "0.9" and cells[-1] == "REGRESSION" and cells[3].startswith("-9")
    assert re.search(r"accept_length.predicted .*INSUFFICIENT DATA", md)    # never measured before
    assert "loc: NOT HEALTHY" in md                                          # the ✗ finding names the host's state
    page = (folder / "report.html").read_text()
    assert "<tr class='REGRESSION'><td>drafter.step0_acc" in page
    images = re.findall(r"src='data:image/png;base64,([^']+)'", page)
    assert images and all(base64.b64decode(i).startswith(b"\x89PNG") for i in images)
    assert "src='http" not in page and "<script" not in page               # self-contained
    (drafter_run,) = [p.name for p in (root / "runs").glob("*-test-drafter-*")]
    assert f"<a href='../{drafter_run}/'>" in page and f"[../{drafter_run}/]" in md
    row = history.for_project(root).latest(kind="nightly")
    assert row is not None and row.verdict == "findings"                # the ✗ finding, as the exit code
