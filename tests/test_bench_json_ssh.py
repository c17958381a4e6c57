"""`invoke bench --json` (issue 35, item 13) against a server `invoke serve` started with the SGLang test
double (tests/doubles/sglang writes the real formats), on a local host: stdout is one document holding
bench-result.json as written, the summary a person reads is on stderr."""
from __future__ import annotations

import json

import pytest

from tests.support.bench_folders import prompts_file
from tests.support.serving import ok, project, serve_draft  # noqa: F401
from tests.support.tasks import invoke

pytestmark = pytest.mark.ssh


def test_bench_json(project, tmp_path):  # noqa: F811
    root = project("loc")
    serve_draft(root, tmp_path)
    try:
        done = invoke(root, "bench", "--prompts", "3", "--repeats", "2", "--output-len", "16",
                      "--dataset", prompts_file(tmp_path), "--json")
        doc = json.loads(done.stdout)
        assert done.returncode == 0 and doc["exit_code"] == 0 and doc["task"] == "bench", done.stderr[-3000:]
        written = json.loads((root / "runs" / doc["run_id"] / "bench-result.json").read_text())
        assert doc["result"] == written and written["schema"] == "draftops.bench-result/1"
        assert "output tok/s" in done.stderr
    finally:
        ok(invoke(root, "serve.stop", "--all"))
