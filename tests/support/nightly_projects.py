"""A project holding a night's runs, as the nightly findings tests build it."""
from __future__ import annotations

from pathlib import Path

import pytest

from draftops import history
from draftops.bench.result import DraftInfo
from tests.conftest import REPO
from tests.support import bench_runs as runs

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
