"""The whole serving loop as a nightly on a local host: serve the baseline, bench, stop, serve the
draft, bench, compare, stop; with the SGLang test double as the engine (tests/doubles/sglang: its
server and its bench_serving client write SGLang's real formats). The night's row must hold the
throughputs, the measured accept length and the speedup that bench and bench.compare recorded."""
from __future__ import annotations

import json

import pytest
import yaml

from draftops import history
from tests.conftest import REPO, copy_remote_package
from tests.support.playbooks import task_names
from tests.support.serving import draft_config, profile, write_model
from tests.support.tasks import invoke

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif("bench.run" not in task_names(), reason="needs `invoke bench` (the bench runner, "
                                 "branch bench-run); runs once it is merged")]


def test_the_serving_loop_as_a_nightly(make_project, tmp_path, no_inventory_env):
    serve = {"default": profile(tmp_path)}
    root = make_project({"loc": {"transport": "local", "root": str(tmp_path / "locroot"), "serve": serve}}, "loc")
    (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
    copy_remote_package(root)
    draft = write_model(tmp_path / "draft", draft_config([1, 15, 28]))
    bench = {"prompts": 4, "repeats": 2, "output_len": 16}
    steps = [{"name": "serve-baseline", "task": "serve", "args": {"baseline": True}},
             {"name": "bench-baseline", "task": "bench", "args": bench, "needs": ["serve-baseline"]},
             {"name": "stop-baseline", "task": "serve.stop", "args": {"all": True}, "cleanup": True},
             {"name": "serve-draft", "task": "serve",
              "args": {"draft": draft, "steps": 3, "topk": 1, "draft_tokens": 4}},
             {"name": "bench-draft", "task": "bench", "args": bench, "needs": ["serve-draft"]},
             {"name": "compare", "task": "bench.compare", "needs": ["bench-baseline", "bench-draft"]},
             {"name": "stop", "task": "serve.stop", "args": {"all": True}, "cleanup": True}]
    (root / "playbooks").mkdir()
    (root / "playbooks" / "loop.yaml").write_text(yaml.safe_dump({"hosts": ["loc"], "steps": steps}))

    done = invoke(root, "nightly", "--playbook", "playbooks/loop.yaml")
    # the double's throughputs are timed, so the compare may find speculation slower (✗ spec-slower):
    # the night's health follows whatever the compare wrote
    (compare,) = (root / "runs").glob("*-bench-compare-*")
    bad = [f for f in json.loads((compare / "compare.json").read_text())["findings"] if f["severity"] == "bad"]
    assert done.returncode == (3 if bad else 0), done.stdout + done.stderr
    row = history.for_project(root).latest(kind="nightly")
    assert row is not None and row.verdict == ("findings" if bad else "ok")
    m = row.metrics
    assert m["baseline.tok_s"] > 0 and m["speculative.tok_s"] > 0
    assert 1.0 < m["accept_length.measured"] <= 4.0
    assert m["speedup"] == pytest.approx(m["speculative.tok_s"] / m["baseline.tok_s"], rel=0.05)
    (folder,) = (root / "runs").glob("nightly-*")
    assert {"trend-loc-tok_s.png", "trend-loc-speedup.png", "trend-loc-accept_length.png"} <= \
        {p.name for p in folder.iterdir()}
    md = (folder / "report.md").read_text()
    assert "- **engine**: sglang 0.5.10" in md and "speculative.tok_s" in md
    assert json.loads(json.dumps(row.settings))["steps"]["stop"] == "ok"
