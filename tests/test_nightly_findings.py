"""A night's health includes what its steps concluded (issue 22, item 1): a night whose bench.compare
step says ✗ (wiring-suspect, config-wrong) is not healthy, its report shows the compare's findings and
`invoke nightly` exits 3. The compare is the real task, run by the night on bench results built the way
the runner builds them (tests/support/bench_runs.py), so the night reads the compare.json bench.compare wrote."""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from draftops import history
from tests.support.laptop_venv import laptop_python
from tests.support.nightly_projects import project  # noqa: F401  (fixtures)
from tests.support.tasks import invoke

pytestmark = pytest.mark.slow


def night(root: Path, run_b: str):
    steps = [{"name": "compare", "task": "bench.compare", "args": {"run_a": "base", "run_b": run_b}}]
    (root / "playbooks" / "p.yaml").write_text(yaml.safe_dump({"hosts": ["loc"], "steps": steps}))
    done = invoke(root, "nightly", "--playbook", "playbooks/p.yaml")
    folder = max((root / "runs").glob("nightly-*"))
    return done, folder


def test_a_bad_finding_of_the_compare_step_makes_the_night_not_healthy(project):  # noqa: F811
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


def test_a_compare_that_finds_nothing_wrong_leaves_the_night_healthy(project):  # noqa: F811
    done, folder = night(project, "wired-right")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "loc: healthy — 1 steps: 1 ok" in done.stdout
    md = (folder / "report.md").read_text()
    assert "✓ draft-limit" in md and "✗" not in md
    row = history.for_project(project).latest(kind="nightly")
    assert row is not None and row.verdict == "ok"
