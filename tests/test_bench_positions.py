"""Per position, measured (issue 24 item 6): the bench result keeps the engine's per-position
acceptance, normalised to conditional acceptance, from the engines' real output formats through
the runner's parsers."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from draftops.bench import result, runner
from draftops.bench.plan import BenchSettings, Client, Server, plan
from remote.bench import client_output, server_metrics
from remote.bench.runner import host_facts
from tests import bench_formats as fmt
from tests.drafter_support import demo

# --- normalisation -------------------------------------------------------------------------------

def test_conditional_acceptance_from_vllms_cumulative_per_position_shares() -> None:
    assert result.conditional([0.8, 0.6, 0.3]) == pytest.approx([0.8, 0.75, 0.5])
    assert result.conditional([0.0, 0.0]) == [0.0, None]          # no draft got to step 1: no figure
    assert result.conditional([]) == []


def _vllm_record(drafts: int, per_pos: list[int]) -> client_output.ClientRecord:
    doc = fmt.vllm_bench_result(ttfts_ms=[80.0], tpots_ms=[10.0], itls_ms=[10.0], output_tokens=100, duration=1.0,
                                spec={"drafts": drafts, "draft_tokens": 3 * drafts, "accepted": sum(per_pos),
                                      "per_pos": per_pos})
    return client_output.parse_vllm(json.dumps(doc)).records[0]


def _window(drafts: int, per_pos: list[int]) -> server_metrics.WindowAccept | None:
    before = fmt.vllm_metrics_text(drafts=1000, draft_tokens=3000, accepted=500, per_pos=[300, 150, 50])
    after = fmt.vllm_metrics_text(drafts=1000 + drafts, draft_tokens=3000 + 3 * drafts, accepted=500 + sum(per_pos),
                                  per_pos=[300 + per_pos[0], 150 + per_pos[1], 50 + per_pos[2]], engines=2)
    return server_metrics.accept_length_window(server_metrics.spec_counters(before),
                                               server_metrics.spec_counters(after))


def test_per_position_is_pooled_over_repeats_by_drafts_and_says_its_source_and_definition() -> None:
    recs = [_vllm_record(100, [80, 60, 30]), _vllm_record(300, [240, 120, 60])]
    got = result.build_per_position("vllm", recs, [None, None])
    assert got.available and got.source == "client" and got.drafts == 400
    assert got.cumulative == pytest.approx([320 / 400, 180 / 400, 90 / 400])
    assert got.conditional == pytest.approx([0.8, 180 / 320, 90 / 180])
    assert got.reached == pytest.approx([400, 320, 180])
    assert "bonus token is not in it" in (got.definition or "") and "cumulative" in (got.definition or "")
    # a client result without per-position figures: the /metrics window's counters (summed over engines)
    bare = client_output.parse_vllm(json.dumps({"completed": 1, "output_throughput": 5.0})).records[0]
    window = _window(200, [100, 50, 10])
    from_window = result.build_per_position("vllm", [bare], [window])
    assert from_window.source == "metrics window"
    assert from_window.cumulative == pytest.approx([0.5, 0.25, 0.05])
    assert from_window.conditional == pytest.approx([0.5, 0.5, 0.2])
    none = result.build_per_position("vllm", [bare], [None])
    assert not none.available and "not available" in (none.note or "")


def test_sglang_has_no_per_position_figure_and_says_why() -> None:
    got = result.build_per_position("sglang", [None], [None])
    assert not got.available and got.cumulative == []
    assert "cumulative since the last /flush_cache" in (got.note or "") and "bonus token" in (got.note or "")


def test_the_runner_keeps_the_per_position_figures_of_a_real_run_folder(tmp_path: Path) -> None:
    """runner.build on a run folder as the job leaves it: the client's --save-result JSON and the
    /metrics pages before and after the repeat."""
    client = Client.from_probe({"engine": "vllm", "client": "vllm bench serve", "flags": {}}, python="/py")
    bench = plan(client, Server("http://127.0.0.1:1", "/m/t", "/m/t", True), BenchSettings(repeats=1),
                 runner.RUN_DIR_TOKEN)
    served = runner.ServedBy(engine="vllm", port=1, base_url="http://127.0.0.1:1", python="/py", target="/m/t",
                             draft="/m/d", pid=None, log="/x", run_id="serve-1", effective={}, asked={})
    d = demo()
    facts = json.loads(json.dumps(host_facts("vllm", sys.executable, str(d.target), str(d.draft))))
    (tmp_path / "host.json").write_text(json.dumps(facts))
    (tmp_path / "runner.json").write_text(json.dumps({
        "status": "succeeded", "started": "2026-12-01T10:00:00Z", "ended": "2026-12-01T10:01:00Z",
        "steps": [{"name": "rep1", "exit_code": 0, "server_alive_after": True}]}))
    spec = {"drafts": 200, "draft_tokens": 600, "accepted": 260, "per_pos": [150, 80, 30]}
    (tmp_path / "client-rep1.json").write_text(json.dumps(fmt.vllm_bench_result(
        ttfts_ms=[80.0], tpots_ms=[10.0], itls_ms=[10.0], output_tokens=100, duration=1.0, spec=spec)))
    (tmp_path / "metrics-before-rep1.prom").write_text(fmt.vllm_metrics_text(drafts=0, per_pos=[0, 0, 0]))
    (tmp_path / "metrics-after-rep1.prom").write_text(fmt.vllm_metrics_text(
        drafts=200, draft_tokens=600, accepted=260, per_pos=[150, 80, 30]))
    res = runner.build(run_id="r", host="h", folder=tmp_path, job=runner.job_plan(bench, served), bench=bench,
                       served=served, job_state="succeeded")
    assert res.per_position is not None and res.per_position.source == "client"
    assert res.per_position.cumulative == pytest.approx([0.75, 0.4, 0.15])
    assert res.per_position.conditional == pytest.approx([0.75, 80 / 150, 30 / 80])
    assert res.repeats[0].server_per_position == pytest.approx([0.75, 0.4, 0.15])
    assert res.accept_length is not None and res.accept_length.value == pytest.approx(2.3)
    back = result.load(result.write(res, tmp_path / "out"))
    assert back.per_position == res.per_position                    # kept through the file
    doc = json.loads((tmp_path / "out" / result.RESULT_NAME).read_text())
    del doc["per_position"]                                          # a result written before the key
    (tmp_path / "out" / result.RESULT_NAME).write_text(json.dumps(doc))
    assert result.load(tmp_path / "out").per_position is None
