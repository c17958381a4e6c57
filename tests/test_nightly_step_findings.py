"""Every step's findings count in a night (issue 35, item 15): a night whose test-drafter step gives
MISMATCH (the demo as shipped) is not healthy, although every step exited 0. The night is real: the
`local` host, the demo of this session (tests/support/demo_cache.py) and the test-drafter task as a user runs
it; the readers of bench's and capture-check's files are fed the files those tasks write."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from draftops import history
from draftops.history import RunRecord
from draftops.nightly import results
from tests.support.drafter_support import local_demo_project
from tests.support.tasks import invoke


@pytest.fixture
def project(make_project, no_inventory_env) -> Path:
    """A project on the `local` host whose host root holds this session's demo (as generated)."""
    root = local_demo_project(make_project())
    (root / "playbooks").mkdir()
    return root


@pytest.mark.slow
def test_a_mismatch_of_the_test_drafter_step_makes_the_night_not_healthy(project):
    steps = [{"name": "sync", "task": "sync"},
             {"name": "demo", "task": "test-drafter", "args": {"steps": 3}, "needs": ["sync"]}]
    (project / "playbooks" / "p.yaml").write_text(yaml.safe_dump({"hosts": ["local"], "steps": steps}))
    done = invoke(project, "nightly", "--playbook", "playbooks/p.yaml", timeout=600)
    out = done.stdout + done.stderr
    (run,) = [p for p in (project / "runs").iterdir() if p.name.endswith("test-drafter") or "-test-drafter-" in p.name]
    report = json.loads((run / "report.json").read_text())
    assert report["verdict"]["status"] == "MISMATCH", out       # the demo as shipped
    assert done.returncode == 3, out
    assert "local / demo (test-drafter): ok, but ✗ MISMATCH" in done.stdout, out
    assert "local: NOT HEALTHY — 2 steps: 2 ok, 0 failed, 0 skipped" in done.stdout, out
    assert f"local / {run.name}: ✗ MISMATCH:" in done.stdout, out
    bad = [f["id"] for f in report["findings"] if f["severity"] == "bad"]
    folder = max((project / "runs").glob("nightly-*"))
    md = (folder / "report.md").read_text()
    assert "### local: findings" in md and f"✗ MISMATCH ({run.name})" in md
    assert all(f"✗ {code} ({run.name})" in md for code in bad)
    row = history.for_project(project).latest(kind="nightly")
    assert row is not None and row.verdict == "findings"
    assert "bad:MISMATCH" in row.settings["findings"]


def _run(run_id: str, kind: str, verdict: str = "succeeded") -> RunRecord:
    return RunRecord(run_id=run_id, kind=kind, host="local", time="2026-12-01T00:00:00Z", verdict=verdict)


def test_a_drafter_report_that_cannot_be_read_is_a_bad_finding(tmp_path):
    folder = tmp_path / "runs" / "td-1"
    folder.mkdir(parents=True)
    (folder / "report.json").write_text('{"schema": "draftops.drafter-report/1", "verdict": {"status": NaN}}')
    (f,) = results.findings_of([_run("td-1", "test-drafter", "MISMATCH")], tmp_path)
    assert f.bad and f.code == "report-unreadable" and str(folder / "report.json") in f.text


def test_a_failed_run_brings_no_findings_of_its_own(tmp_path):
    assert results.findings_of([_run("td-2", "test-drafter", "failed"), _run("b-1", "bench", "failed")],
                               tmp_path) == []


def test_bench_warnings_are_findings(tmp_path):
    folder = tmp_path / "runs" / "b-1"
    folder.mkdir(parents=True)
    (folder / "bench-result.json").write_text(json.dumps({"warnings": ["client and server accept lengths differ"]}))
    (f,) = results.findings_of([_run("b-1", "bench")], tmp_path)
    assert (f.severity, f.code, f.text) == ("warn", "bench-warning", "client and server accept lengths differ")
    (folder / "bench-result.json").write_text("[" * 5000)          # deeper than the reader goes
    (f,) = results.findings_of([_run("b-1", "bench")], tmp_path)
    assert f.bad and f.code == "bench-result-unreadable"


@pytest.mark.parametrize(("status", "draft", "expected"), [
    ("MATCHED", None, [("good", "MATCHED")]),
    ("NOT_THIS_TARGET", None, [("bad", "NOT_THIS_TARGET")]),
    ("MATCHED", "MISMATCH", [("good", "MATCHED"), ("bad", "draft-MISMATCH")]),
])
def test_the_capture_checks_a_step_log_names_are_read(tmp_path, status, draft, expected):
    folder = tmp_path / "runs" / "cc-1"
    folder.mkdir(parents=True)
    doc = {"schema": "draftops.capture-check/1", "status": status, "headline": "h", "lines": [],
           "engine": {"name": "vllm", "python": "/p"}, "match_rule": "r", "slots": [],
           "target": {"path": "/t", "num_hidden_layers": 6, "hidden_size": 64, "config_sha256": "a",
                      "weights_listing_sha256": "b"},
           "data": {"path": "/d", "samples": 1, "tokens": 8, "slots": 3}}
    if draft:
        doc["draft"] = {"path": "/dr", "format": "speculators", "engine": "vllm", "status": draft}
    (folder / "capture-check.json").write_text(json.dumps(doc))
    log = "capture check ...\nreport: runs/cc-1/capture-check.json\n"
    found = results.findings_of([], tmp_path, log)
    assert [(f.severity, f.code) for f in found] == expected
