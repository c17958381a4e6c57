"""`--json` on the tasks a script reads (issue 35, item 13): stdout holds one JSON document and nothing
else, the text a person reads goes to stderr, and a refusal or a finding's exit code is in the document
too. The tasks run as a user runs them: `invoke` in a project, the real test-drafter and doctor on the
demo of the `local` host, bench.compare and `runs --local` on bench results built as the runner builds
them (tests/support/bench_runs.py). Also item 12: test-drafter --strict, and piped progress lines."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from draftops.cli.jsonout import SCHEMA, finite
from tests.support.drafter_support import local_demo_project
from tests.support.nightly_projects import project as compare_project  # noqa: F401  (a fixture)
from tests.support.tasks import invoke


def document(done) -> dict:
    """stdout as one JSON document (json.loads refuses anything around it)."""
    doc = json.loads(done.stdout)
    assert doc["schema"] == SCHEMA
    return doc


@pytest.fixture
def demo_project(make_project, no_inventory_env) -> Path:
    root = local_demo_project(make_project())
    return root


@pytest.mark.slow
def test_test_drafter_json_strict_on_the_shipped_demo(demo_project):
    done = invoke(demo_project, "test-drafter", "--steps", "3", "--json", "--strict", timeout=600)
    doc = document(done)
    assert done.returncode == 3 and doc["exit_code"] == 3, done.stderr
    assert doc["task"] == "test-drafter" and doc["run_id"] and "MISMATCH" in doc["error"]
    report = doc["result"]
    assert report["schema"] == "draftops.drafter-report/1" and report["verdict"]["status"] == "MISMATCH"
    on_disk = json.loads((demo_project / "runs" / doc["run_id"] / "report.json").read_text())
    assert report == on_disk
    assert "fix it with:" in done.stderr and "MISMATCH" in done.stderr      # the human text, on stderr
    assert "\n… " in done.stderr            # piped: the job's progress is shown as lines, not nothing
    # without --strict a finished evaluation exits 0 whatever it found (as --help says)
    plain = invoke(demo_project, "test-drafter", "--steps", "3", timeout=600)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert "fix it with:" in plain.stdout
    helped = invoke(demo_project, "test-drafter", "--help")
    assert "--strict" in helped.stdout and "--json" in helped.stdout and "MISMATCH" in helped.stdout


@pytest.mark.slow
def test_doctor_json_holds_its_state(demo_project):
    done = invoke(demo_project, "doctor", "--draft", "demo", "--json", timeout=600)
    doc = document(done)
    assert done.returncode == 3 and doc["exit_code"] == 3, done.stderr       # not healthy
    assert doc["result"]["schema"] == "draftops.doctor/1" and doc["result"]["status"] == "unhealthy"
    assert doc["run_id"] == doc["result"]["doctor_id"]
    assert "NOT HEALTHY" in done.stderr


@pytest.mark.slow
def test_bench_compare_and_runs_json(compare_project):  # noqa: F811
    done = invoke(compare_project, "bench.compare", "--run-a", "base", "--run-b", "wired-wrong", "--json")
    doc = document(done)
    assert done.returncode == 0 and doc["exit_code"] == 0 and doc["error"] is None, done.stderr
    written = json.loads((compare_project / "runs" / doc["run_id"] / "compare.json").read_text())
    assert doc["result"] == written
    assert "wiring-suspect" in [f["code"] for f in doc["result"]["findings"]]
    assert "findings" in done.stderr and "✗ run B (wired-wrong)" in done.stderr    # for a person
    listed = invoke(compare_project, "runs", "--local", "--json", "--last", "2")
    runs = document(listed)["result"]
    assert [r["kind"] for r in runs["runs"]] == ["compare", "bench"] and runs["not_shown"] == 3   # td-1, 2 benches
    assert runs["runs"][0]["run_id"] == doc["run_id"]
    assert "local run history" in listed.stderr


@pytest.mark.slow
def test_a_refusal_under_json_is_a_document_too(compare_project):  # noqa: F811
    done = invoke(compare_project, "bench.compare", "--run-a", "base", "--json")
    doc = document(done)
    assert done.returncode == 1 and doc["exit_code"] == 1 and doc["result"] is None
    assert "give both --run-a and --run-b" in doc["error"]


def test_non_finite_numbers_become_null():
    assert finite({"a": [math.nan, 1.5, {"b": math.inf}], "c": "x"}) == {"a": [None, 1.5, {"b": None}], "c": "x"}
