"""Per position, predicted vs measured (issue 24 item 6): the bench result keeps the engine's
per-position acceptance, normalised to conditional acceptance; `bench compare` holds it against
test-drafter's per-step prediction and names the first position where they part. The predictions
come from a real evaluation of the demo recorded through the test-drafter hook's conversion; the
bench runs from the engines' real output formats through the runner's parsers."""
from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from draftops.bench import compare as comparing
from draftops.bench import outputs, positions, render, result, runner
from draftops.bench.plan import BenchSettings, Client, Server, plan
from draftops.bench.result import DraftInfo
from draftops.history import History
from remote.bench import client_output, server_metrics
from remote.bench.digest import config_digest, file_digest
from remote.bench.runner import host_facts
from tests.support import bench_formats as fmt
from tests.support import bench_runs as runs
from tests.support.drafter_support import demo, run_eval


def _codes(cmp: comparing.Comparison) -> list[str]:
    return [f.code for f in cmp.findings]


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


# --- bench compare on the demo's prediction ------------------------------------------------------

@pytest.fixture(scope="module")
def demo_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """test-drafter on the demo at K=3: MISMATCH, with per-step cond_acc for served and best layouts."""
    report = run_eval(tmp_path_factory.mktemp("eval") / "eval", steps=3)
    assert report["verdict"]["status"] == "MISMATCH"
    return report


@pytest.fixture
def story(tmp_path: Path, demo_report: dict[str, Any]) -> dict[str, Any]:
    """The real report recorded as test-drafter's hook records it; the wrong and the fixed config's
    drafts as bench results describe them."""
    hist = History(tmp_path / "runs" / "history.sqlite")
    draft_dir = tmp_path / "draft"
    shutil.copytree(demo().draft, draft_dir)
    wrong_digest = file_digest(draft_dir)
    report = {**demo_report, "checkpoint": {**demo_report["checkpoint"], "path": str(draft_dir)}}
    runs.record_prediction(hist, "td-demo", report, wrong_digest)
    verdict = demo_report["verdict"]
    config = json.loads((draft_dir / "config.json").read_text())
    config["eagle_aux_hidden_state_layer_ids"] = verdict["fix_layer_ids_vllm"]
    metrics = demo_report["metrics"]
    return {"hist": hist,
            "wrong": DraftInfo(path=str(draft_dir), digest=wrong_digest, format="speculators",
                               layer_ids=demo_report["checkpoint"]["configured_layer_ids"],
                               layer_id_convention="vllm"),
            "fixed": DraftInfo(path=str(draft_dir), digest=config_digest(json.dumps(config).encode()),
                               format="speculators", layer_ids=verdict["fix_layer_ids_vllm"],
                               layer_id_convention="vllm"),
            "served": metrics["served"]["verifier"], "best": metrics["best"]["verifier"]}


def _compare(hist: History, a, b) -> comparing.Comparison:
    return comparing.compare(a, b, {r.run_id: comparing.find_prediction(hist, r) for r in (a, b)})


def test_the_demos_wrong_config_parts_from_the_trained_layout_at_step_0(story: dict[str, Any]) -> None:
    """The server runs the wrong ids faithfully: per position it measures what test-drafter predicts
    for them, and already at step 0 far less than the trained layout."""
    base = runs.vllm_run("base", tok_s=[90.0, 90.5, 89.5])
    wrong = runs.vllm_run("wrong", tok_s=[46.7, 47.0, 46.4], draft=story["wrong"], per_pos=story["served"]["full_acc"])
    cmp = _compare(story["hist"], base, wrong)
    assert _codes(cmp)[0] == "config-wrong"                          # the existing findings stay as they were
    pred = cmp.predictions["wrong"]
    assert pred is not None and pred.role == "served"
    assert pred.cond_served == pytest.approx(story["served"]["cond_acc"])
    assert pred.cond_rows_best == story["best"]["cond_total"]
    (table,) = cmp.positions
    assert table.part is None and table.trained_part is not None and table.trained_part.step == 0
    assert table.rows[0].verdict == "agree"
    assert table.rows[0].trained == pytest.approx(story["best"]["cond_acc"][0])
    assert table.rows[-1].verdict == "too few drafts"               # hardly a draft got past step 0
    found = next(f for f in cmp.findings if f.code == "positions-config")
    assert "parts from the trained layout's at step 0" in found.text
    assert f"{story['best']['cond_acc'][0]:.2f}" in found.text and "other hidden states than training" in found.text


def test_the_demos_fixed_config_agrees_per_position(story: dict[str, Any]) -> None:
    base = runs.vllm_run("base", tok_s=[90.0, 90.5, 89.5])
    measured = [share * 0.96 for share in story["best"]["full_acc"]]     # greedy rounds: a little below
    fixed = runs.vllm_run("fixed", tok_s=[140.0, 141.0, 139.0], draft=story["fixed"], per_pos=measured)
    cmp = _compare(story["hist"], base, fixed)
    assert "draft-limit" in _codes(cmp) and "spec-faster" in _codes(cmp)
    (table,) = cmp.positions
    assert table.role == "best" and [r.verdict for r in table.rows] == ["agree"] * 3
    assert [r.predicted for r in table.rows] == pytest.approx(story["best"]["cond_acc"])
    assert not any(r.trained is not None for r in table.rows)          # the prediction is the trained layout's
    assert "positions-agree" in _codes(cmp) and not {"positions-input", "positions-later"} & set(_codes(cmp))


def test_step_0_low_on_the_fixed_ids_names_the_input_wiring(story: dict[str, Any]) -> None:
    best = story["best"]["full_acc"]
    broken = runs.vllm_run("broken", tok_s=[60.0] * 3, draft=story["fixed"],
                           per_pos=[best[0] * 0.5, best[1] * 0.5, best[2] * 0.5])
    cmp = _compare(story["hist"], runs.vllm_run("base", tok_s=[90.0] * 3), broken)
    assert _codes(cmp)[0] == "wiring-suspect"
    found = next(f for f in cmp.findings if f.code == "positions-input")
    assert "part at step 0" in found.text and "the input wiring" in found.text
    assert cmp.positions[0].rows[1].verdict == "not judged"         # only the first parting is named


def test_step_0_right_and_a_later_step_low_names_the_ttt_path(story: dict[str, Any]) -> None:
    cond = story["best"]["cond_acc"]
    cumulative = [cond[0], cond[0] * 0.5, cond[0] * 0.5 * cond[2]]   # step 1 accepted half as often
    later = runs.vllm_run("later", tok_s=[100.0] * 3, draft=story["fixed"], per_pos=cumulative)
    cmp = _compare(story["hist"], runs.vllm_run("base", tok_s=[90.0] * 3), later)
    found = next(f for f in cmp.findings if f.code == "positions-later")
    assert "part at step 1" in found.text and "after agreeing at steps 0..0" in found.text
    assert "TTT/attention path or the num-steps settings" in found.text
    assert [r.verdict for r in cmp.positions[0].rows] == ["agree", "low", "not judged"]


def test_compare_md_and_json_show_per_position_predicted_vs_measured(tmp_path: Path, story: dict[str, Any]) -> None:
    wrong = runs.vllm_run("wrong", tok_s=[46.7, 47.0, 46.4], draft=story["wrong"], time="2026-11-30T10:00:00Z",
                          per_pos=story["served"]["full_acc"])
    fixed = runs.vllm_run("fixed", tok_s=[140.0, 141.0, 139.0], draft=story["fixed"], time="2026-11-30T11:00:00Z",
                          per_pos=[share * 0.96 for share in story["best"]["full_acc"]])
    cmp = _compare(story["hist"], wrong, fixed)
    assert [t.run_id for t in cmp.positions] == ["wrong", "fixed"]
    paths = outputs.write(cmp, tmp_path / "cmp")
    md = paths["markdown"].read_text()
    assert "## Per position: wrong" in md and "## Per position: fixed" in md
    assert "| step | predicted (served ids) | predicted (trained layout) | measured | drafts reached |  |" in md
    cond0 = story["best"]["cond_acc"][0]
    assert f"| 0 | {story['served']['cond_acc'][0]:.2f} | {cond0:.2f} | " in md
    assert "bonus token is not in it" in md and "cond\\_acc\\_k" in md
    doc = json.loads(paths["json"].read_text())
    assert [t["run_id"] for t in doc["per_position"]] == ["wrong", "fixed"]
    assert doc["per_position"][0]["trained_part"]["step"] == 0 and doc["per_position"][1]["part"] is None
    assert doc["per_position"][1]["source"] == "client"
    from rich.console import Console
    console = Console(record=True, width=200, color_system=None)
    render.show(cmp, console)
    shown = console.export_text()
    assert "per position: wrong" in shown and "predicted (trained layout)" in shown


def test_sglang_and_older_records_show_what_is_missing_without_findings(tmp_path: Path) -> None:
    hist = History(tmp_path / "history.sqlite")
    report = runs.drafter_report(status="MATCH", served=2.9, best=2.9, configured=[-1, 1, 3], fmt_name="flat",
                                 cond=([0.8, 0.7, 0.6], [0.8, 0.7, 0.6]))
    runs.record_prediction(hist, "td-s", report, "sha256:cccc000000000000")
    draft = DraftInfo(path="/m/draft", digest="sha256:cccc000000000000", format="flat", layer_ids=[-1, 1, 3],
                      layer_id_convention="sglang")
    cmp = _compare(hist, runs.sglang_run("base", tok_s=[300.0] * 3),
                   runs.sglang_run("spec", tok_s=[400.0] * 3, accept=2.8, draft=draft))
    (table,) = cmp.positions
    assert not table.available and [r.verdict for r in table.rows] == ["no figure"] * 3
    assert not [c for c in _codes(cmp) if c.startswith("positions-")]
    assert "cumulative since the last /flush\\_cache" in render.markdown(cmp)
    # a test-drafter row recorded before the per-step figures: no table, the accept-length findings as before
    old = runs.drafter_report(status="MATCH", served=3.0, best=3.0, configured=[0, 1, 3])
    runs.record_prediction(hist, "td-old", old, "sha256:dddd000000000000")
    spec = runs.vllm_run("v", tok_s=[120.0] * 3, per_pos=[0.8, 0.6, 0.5], draft=DraftInfo(
        path="/m/v", digest="sha256:dddd000000000000", format="speculators", layer_ids=[0, 1, 3],
        layer_id_convention="vllm"))
    later = _compare(hist, runs.vllm_run("b", tok_s=[90.0] * 3), spec)
    assert later.positions == [] and "draft-limit" in _codes(later)


def test_too_few_predicted_rows_are_not_judged() -> None:
    measured = result.PerPosition(available=True, source="client", drafts=1000, cumulative=[0.9, 0.1],
                                  conditional=[0.9, 0.1 / 0.9], reached=[1000, 900])
    table = positions.compare_positions("run B", "b", measured, [0.9, 0.9], prediction_run="td", role="served",
                                        predicted_rows=[500, 5])
    assert table.part is None and [r.verdict for r in table.rows] == ["agree", "too few rows predicted"]


def test_an_edited_history_row_with_junk_per_step_figures_is_no_figure_not_a_crash(tmp_path: Path) -> None:
    hist = History(tmp_path / "history.sqlite")
    report = runs.drafter_report(status="MATCH", served=3.0, best=3.0, configured=[0, 1, 3])
    rec = runs.record_prediction(hist, "td-junk", report, "sha256:eeee000000000000")
    hist.record(dataclasses.replace(rec, metrics={**rec.metrics, "predicted_cond_served": ["x", 2.0, True, 0.8],
                                                  "predicted_cond_rows_served": "many"}))
    spec = runs.vllm_run("v", tok_s=[120.0] * 3, per_pos=[0.8, 0.6, 0.5], draft=DraftInfo(
        path="/m/v", digest="sha256:eeee000000000000", format="speculators", layer_ids=[0, 1, 3],
        layer_id_convention="vllm"))
    cmp = _compare(hist, runs.vllm_run("b", tok_s=[90.0] * 3), spec)
    pred = cmp.predictions["v"]
    assert pred is not None and pred.cond_served == [None, None, None, 0.8] and pred.cond_rows_served is None
    assert [r.verdict for r in cmp.positions[0].rows][:3] == ["no figure"] * 3
    assert "draft-limit" in _codes(cmp)
