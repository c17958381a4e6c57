"""A night's health includes what its steps concluded (issue 22, item 1): a night whose bench.compare
step says ✗ (wiring-suspect, config-wrong) is not healthy, its report shows the compare's findings and
`invoke nightly` exits 3. The compare is the real task, run by the night on bench results built the way
the runner builds them (tests/bench_runs.py), so the night reads the compare.json bench.compare wrote."""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from draftops import history
from draftops.bench.result import DraftInfo
from tests import bench_runs as runs
from tests.conftest import REPO
from tests.laptop_venv import laptop_python
from tests.test_env_ssh import invoke

pytestmark = pytest.mark.slow
PAST = "2025-06-01T10:00:00Z"          # the bench runs are older than the night: not its own measurements


@pytest.fixture
def project(make_project, tmp_path, no_inventory_env) -> Path:
    root = make_project({"loc": {"transport": "local", "root": str(tmp_path / "locroot")}}, "loc")
    (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
    (root / "playbooks").mkdir()
    hist = history.for_project(root)
    report = runs.drafter_report(status="MISMATCH", served=1.50, best=3.60, configured=[1, 4, 7],
                                 fix=[-1, 0, 2], fix_vllm=[0, 1, 3])
    runs.record_prediction(hist, "td-1", report, "sha256:aaaa000000000000", time=PAST)
    draft = DraftInfo(path="/m/draft", digest="sha256:bbbb000000000000", format="speculators",
                      layer_ids=[0, 1, 3], layer_id_convention="vllm")
    runs.save(root, runs.vllm_run("base", tok_s=[90.0, 91.0, 89.0], host="loc", time=PAST), hist)
    # far below the 3.60 predicted for the fixed ids: the server does not feed the draft its hidden states
    runs.save(root, runs.vllm_run("wired-wrong", tok_s=[60.0, 61.0, 59.0], accept=3.60 * 0.6, draft=draft,
                                  host="loc", time=PAST), hist)
    # within 10% of the prediction: the draft itself is the limit, nothing is wrong
    runs.save(root, runs.vllm_run("wired-right", tok_s=[150.0, 152.0, 149.0], accept=3.60 * 0.95, draft=draft,
                                  host="loc", time=PAST), hist)
    return root


def night(root: Path, run_b: str):
    steps = [{"name": "compare", "task": "bench.compare", "args": {"run_a": "base", "run_b": run_b}}]
    (root / "playbooks" / "p.yaml").write_text(yaml.safe_dump({"hosts": ["loc"], "steps": steps}))
    done = invoke(root, "nightly", "--playbook", "playbooks/p.yaml")
    folder = max((root / "runs").glob("nightly-*"))
    return done, folder


def test_a_bad_finding_of_the_compare_step_makes_the_night_not_healthy(project):
    done, folder = night(project, "wired-wrong")
    out = done.stdout + done.stderr
    assert done.returncode == 3, out
    assert "loc: NOT HEALTHY — 1 steps: 1 ok, 0 failed, 0 skipped; 2 ✗ findings" in done.stdout, out
    assert "✗" in done.stderr and "findings" in done.stderr
    (compare_run,) = [p for p in (project / "runs").glob("*bench-compare-*")]
    written = json.loads((compare_run / "compare.json").read_text())
    bad = [f for f in written["findings"] if f["severity"] == "bad"]
    assert [f["code"] for f in bad] == ["wiring-suspect", "spec-slower"]
    flat = " ".join(done.stdout.split())
    # the compare's own words, on the terminal and in the report; on the terminal its `invoke …` is rebuilt
    # as the user can paste it (draftops/cmdline.py: the program as this process was started, issue 35)
    as_started = f"`{shlex.quote(laptop_python())} -m invoke "
    for f in bad:
        text = " ".join(f["text"].split()).replace("`invoke ", as_started)
        assert f"{compare_run.name}: ✗ {f['code']}: {text}" in flat
    md = (folder / "report.md").read_text()
    assert "loc: NOT HEALTHY" in md and "### loc: findings" in md
    assert all(f"✗ {f['code']} ({compare_run.name})" in md for f in bad)
    page = (folder / "report.html").read_text()
    assert "<li class='failed'>✗ wiring-suspect" in page and "NOT HEALTHY" in page
    row = history.for_project(project).latest(kind="nightly")
    assert row is not None and row.verdict == "findings"
    assert "bad:wiring-suspect" in row.settings["findings"]


def test_a_compare_that_finds_nothing_wrong_leaves_the_night_healthy(project):
    done, folder = night(project, "wired-right")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "loc: healthy — 1 steps: 1 ok" in done.stdout
    md = (folder / "report.md").read_text()
    assert "✓ draft-limit" in md and "✗" not in md
    row = history.for_project(project).latest(kind="nightly")
    assert row is not None and row.verdict == "ok"
