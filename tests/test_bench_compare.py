"""`bench compare`: runs built from the engines' real output formats, predictions recorded through the
test-drafter hook's conversion (one from a real evaluation of the demo), and the findings that
must follow from the numbers each test chooses."""
from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from draftops.bench import compare as comparing
from draftops.bench import outputs, render, result
from draftops.bench.result import DraftInfo
from draftops.errors import BenchError
from draftops.history import History
from remote.bench.digest import config_digest, file_digest
from tests.support import bench_runs as runs
from tests.support.comparisons import compare as _compare
from tests.support.drafter_support import demo, run_eval

TOL = comparing.TOLERANCE


def _codes(cmp: comparing.Comparison) -> list[str]:
    return [f.code for f in cmp.findings]


def _draft(digest: str, ids: list[int], path: str = "/m/draft") -> DraftInfo:
    return DraftInfo(path=path, digest=digest, format="speculators", layer_ids=ids, layer_id_convention="vllm")


def _against_the_baseline(hist: History, name: str, tok_s: list[float], accept: float, digest: str,
                          ids: list[int]) -> comparing.Comparison:
    """A vLLM run of the draft (``digest``, vLLM ``ids``) compared with the baseline these tests share."""
    base = runs.vllm_run("base", tok_s=[90.0, 91.0, 89.0])
    return _compare(hist, base, runs.vllm_run(name, tok_s=tok_s, accept=accept, draft=_draft(digest, ids)))


@pytest.fixture
def hist(tmp_path: Path) -> History:
    return History(tmp_path / "runs" / "history.sqlite")


@pytest.fixture
def mismatch(hist: History) -> dict:
    """test-drafter said MISMATCH for config A (ids [1, 4, 7]), predicting 1.50 as served and 3.60 with
    the fix [0, 1, 3] (vLLM ids)."""
    report = runs.drafter_report(status="MISMATCH", served=1.50, best=3.60, configured=[1, 4, 7],
                                 fix=[-1, 0, 2], fix_vllm=[0, 1, 3], walk=(1.45, 3.10))
    runs.record_prediction(hist, "td-1", report, "sha256:aaaa000000000000")
    return report


# --- accept length against the prediction --------------------------------------------------------

def test_wrong_config_served_faithfully_says_fix_the_config(hist: History, mismatch: dict) -> None:
    cmp = _against_the_baseline(hist, "spec", [46.7, 47.0, 46.1], 1.50 * 1.04, "sha256:aaaa000000000000", [1, 4, 7])
    assert _codes(cmp)[:2] == ["config-wrong", "spec-slower"]
    assert "draft-config --ckpt /m/draft --from-report td-1" in cmp.findings[0].text
    assert "3.60" in cmp.findings[0].text and "MISMATCH" in cmp.findings[0].text
    assert cmp.speedup == pytest.approx(46.7 / 90.0)
    assert "wiring-suspect" not in _codes(cmp) and "draft-limit" not in _codes(cmp)


def test_fixed_ids_measured_near_the_best_prediction_means_the_draft_is_the_limit(
        hist: History, mismatch: dict) -> None:
    base = runs.vllm_run("base", tok_s=[90.0, 91.0, 89.0])
    fixed = runs.vllm_run("fixed", tok_s=[150.0, 152.0, 149.0], accept=3.60 * 0.95,
                          draft=_draft("sha256:bbbb000000000000", [0, 1, 3]))
    pred = comparing.find_prediction(hist, fixed)
    assert pred is not None and pred.role == "best" and pred.value == pytest.approx(3.60)
    assert pred.walk == pytest.approx(3.10)                          # the walk of the same role
    cmp = _compare(hist, base, fixed)
    assert "draft-limit" in _codes(cmp) and "spec-faster" in _codes(cmp)
    assert not {"wiring-suspect", "config-wrong", "spec-slower"} & set(_codes(cmp))


def test_measured_far_below_prediction_suspects_the_wiring(hist: History, mismatch: dict) -> None:
    cmp = _against_the_baseline(hist, "fixed", [60.0, 61.0, 59.0], 3.60 * 0.6, "sha256:bbbb000000000000", [0, 1, 3])
    assert _codes(cmp)[:2] == ["wiring-suspect", "spec-slower"]
    text = cmp.findings[0].text
    assert "40% below" in text and "test-drafter --ckpt /m/draft --steps 3" in text
    assert "fix it first" in cmp.findings[1].text


def test_sglang_wiring_hint_names_patch_and_cuda_graph(hist: History) -> None:
    report = runs.drafter_report(status="MATCH", served=2.9, best=2.9, configured=[-1, 1, 3], fmt_name="flat")
    runs.record_prediction(hist, "td-s", report, "sha256:cccc000000000000")
    draft = DraftInfo(path="/m/draft", digest="sha256:cccc000000000000", format="flat", layer_ids=[-1, 1, 3],
                      layer_id_convention="sglang")
    base = runs.sglang_run("base", tok_s=[300.0, 301.0, 299.0])
    spec = runs.sglang_run("spec", tok_s=[280.0, 281.0, 279.0], accept=1.9, draft=draft)
    cmp = _compare(hist, base, spec)
    wiring = next(f for f in cmp.findings if f.code == "wiring-suspect")
    assert "patch-sglang" in wiring.text and "CUDA-graph" in wiring.text


@pytest.mark.parametrize("factor,expected", [(0.89, "wiring-suspect"), (0.91, "draft-limit"),
                                             (1.09, "draft-limit"), (1.12, "above-prediction")])
def test_tolerance_edges(hist: History, factor: float, expected: str) -> None:
    report = runs.drafter_report(status="MATCH", served=3.0, best=3.0, configured=[0, 1, 3])
    runs.record_prediction(hist, "td-m", report, "sha256:dddd000000000000")
    base = runs.vllm_run("base", tok_s=[90.0, 90.0, 90.0])
    spec = runs.vllm_run("spec", tok_s=[120.0, 120.0, 120.0], accept=3.0 * factor,
                         draft=_draft("sha256:dddd000000000000", [0, 1, 3]))
    codes = _codes(_compare(hist, base, spec))
    assert expected in codes
    assert len({"wiring-suspect", "draft-limit", "above-prediction", "config-wrong"} & set(codes)) == 1


def test_no_prediction_for_this_digest_or_step_count(hist: History, mismatch: dict) -> None:
    base = runs.vllm_run("base", tok_s=[90.0, 90.0, 90.0])
    other = runs.vllm_run("other", tok_s=[100.0] * 3, accept=2.0, draft=_draft("sha256:eeee000000000000", [5, 6, 7]))
    five = runs.vllm_run("five", tok_s=[100.0] * 3, accept=2.0, steps=5,
                         draft=_draft("sha256:aaaa000000000000", [1, 4, 7]))
    for spec, steps in ((other, 3), (five, 5)):
        cmp = _compare(hist, base, spec)
        note = next(f for f in cmp.findings if f.code == "no-prediction")
        assert f"invoke test-drafter --ckpt /m/draft --steps {steps}" in note.text
        assert cmp.predictions[spec.run_id] is None


def test_newest_prediction_wins_and_failed_ones_are_ignored(hist: History) -> None:
    old = runs.drafter_report(status="MATCH", served=2.0, best=2.0, configured=[0, 1, 3])
    new = runs.drafter_report(status="MATCH", served=2.5, best=2.5, configured=[0, 1, 3])
    runs.record_prediction(hist, "td-old", old, "sha256:ffff000000000000", time="2026-11-01T00:00:00Z")
    runs.record_prediction(hist, "td-new", new, "sha256:ffff000000000000", time="2026-11-02T00:00:00Z")
    failed = runs.records.test_drafter_record("td-failed", "local",
                                              {"state": "failed", "ended": "2026-11-03T00:00:00Z"},
                                              runs.read_report(new), {"steps": 3},
                                              git_rev=None, config_digest="sha256:ffff000000000000")
    hist.record(failed)
    spec = runs.vllm_run("spec", tok_s=[100.0] * 3, accept=2.5, draft=_draft("sha256:ffff000000000000", [0, 1, 3]))
    pred = comparing.find_prediction(hist, spec)
    assert pred is not None and pred.run_id == "td-new" and pred.value == pytest.approx(2.5)


def test_missing_measured_accept_length(hist: History, mismatch: dict) -> None:
    base = runs.sglang_run("base", tok_s=[90.0] * 3)
    spec = runs.sglang_run("spec", tok_s=[95.0] * 3, accept=None, draft=_draft("sha256:aaaa000000000000", [1, 4, 7]))
    cmp = _compare(hist, base, spec)
    assert "no-accept-length" in _codes(cmp)
    assert "--decode-log-interval 1" in next(f.text for f in cmp.findings if f.code == "no-accept-length")


# --- the run pair, settings and measurement quality ----------------------------------------------

def test_settings_that_differ_are_named(hist: History) -> None:
    base = runs.sglang_run("base", tok_s=[90.0] * 3, max_running_requests=48, output_len=256)
    spec = runs.sglang_run("spec", tok_s=[95.0] * 3, accept=2.0, version="0.5.13",
                           draft=_draft("sha256:1234000000000000", [0, 1, 3]))
    diff = next(f for f in _compare(hist, base, spec).findings if f.code == "settings-differ").text
    assert "max running requests 48 vs 8" in diff and "output length 256 vs 128" in diff
    assert "engine version 0.5.10 vs 0.5.13" in diff
    assert "concurrency" not in diff and "dataset" not in diff


def test_same_settings_raise_no_difference_and_unset_max_running_is_warned(hist: History) -> None:
    base = runs.vllm_run("base", tok_s=[90.0] * 3, max_running_requests=None)
    spec = runs.vllm_run("spec", tok_s=[95.0] * 3, accept=2.0, max_running_requests=None,
                         draft=_draft("sha256:1234000000000000", [0, 1, 3]))
    codes = _codes(_compare(hist, base, spec))
    assert "settings-differ" not in codes and "max-running-unset" in codes


def test_random_ids_sampling_and_client_server_disagreement_are_flagged(hist: History) -> None:
    base = runs.vllm_run("base", tok_s=[90.0] * 3, dataset="random", dataset_kind="random-ids", temperature=None)
    spec = runs.vllm_run("spec", tok_s=[95.0] * 3, accept=2.0, server_accept=2.6, dataset="random",
                         dataset_kind="random-ids", temperature=None,
                         draft=_draft("sha256:1234000000000000", [0, 1, 3]))
    assert spec.accept_length is not None and spec.accept_length.cross_check is not None
    assert spec.accept_length.cross_check["agree"] is False
    codes = _codes(_compare(hist, base, spec))
    assert {"random-ids", "not-greedy", "accept-disagree"} <= set(codes)
    agreeing = runs.vllm_run("ok", tok_s=[95.0] * 3, accept=2.0, draft=_draft("sha256:1234000000000000", [0, 1, 3]))
    assert not {"random-ids", "not-greedy", "accept-disagree"} & set(_codes(_compare(hist, base.model_copy(
        update={"settings": agreeing.settings}), agreeing)))


def test_failed_run_and_noise(hist: History) -> None:
    base = runs.vllm_run("base", tok_s=[80.0, 100.0, 120.0])
    spec = runs.vllm_run("spec", tok_s=[103.0], accept=2.0, status="failed", failure="server died in repeat 2",
                         draft=_draft("sha256:1234000000000000", [0, 1, 3]))
    cmp = _compare(hist, base, spec)
    assert cmp.findings[0].code == "run-failed" and "server died in repeat 2" in cmp.findings[0].text
    assert "within-noise" in _codes(cmp)               # 3% apart, repeats spread 40%
    steady = runs.vllm_run("steady", tok_s=[100.0] * 3)
    assert "within-noise" not in _codes(_compare(hist, steady, runs.vllm_run(
        "spec2", tok_s=[120.0] * 3, accept=2.0, draft=_draft("sha256:1234000000000000", [0, 1, 3]))))


def test_baseline_is_put_first_and_two_speculative_runs_show_the_change(hist: History, mismatch: dict) -> None:
    base = runs.vllm_run("base", tok_s=[90.0] * 3)
    wrong = runs.vllm_run("wrong", tok_s=[46.0] * 3, accept=1.5, draft=_draft("sha256:aaaa000000000000", [1, 4, 7]))
    fixed = runs.vllm_run("fixed", tok_s=[150.0] * 3, accept=3.5, draft=_draft("sha256:bbbb000000000000", [0, 1, 3]))
    swapped = _compare(hist, wrong, base)
    assert (swapped.a.run_id, swapped.b.run_id) == ("base", "wrong")
    change = _compare(hist, wrong, fixed)
    info = next(f for f in change.findings if f.code == "change")
    assert "accept length 1.50 → 3.50" in info.text and "46.0 → 150.0" in info.text
    assert {"config-wrong", "draft-limit"} <= set(_codes(change))


# --- default pair from the history ---------------------------------------------------------------

def test_default_pair_latest_baseline_and_speculative_of_the_same_host_engine_target(tmp_path: Path,
                                                                                     hist: History) -> None:
    d = _draft("sha256:1234000000000000", [0, 1, 3])
    runs.save(tmp_path, runs.vllm_run("b-old", tok_s=[80.0], time="2026-11-01T00:00:00Z"), hist)
    runs.save(tmp_path, runs.vllm_run("b-new", tok_s=[90.0], time="2026-11-02T00:00:00Z"), hist)
    runs.save(tmp_path, runs.sglang_run("b-gpu", tok_s=[900.0], time="2026-11-03T00:00:00Z"), hist)
    runs.save(tmp_path, runs.vllm_run("s-1", tok_s=[50.0], accept=1.5, draft=d, time="2026-11-04T00:00:00Z"), hist)
    runs.save(tmp_path, runs.vllm_run("s-failed", tok_s=[50.0], accept=1.5, draft=d, status="failed",
                                      time="2026-11-06T00:00:00Z"), hist)
    assert comparing.default_pair(hist) == ("b-new", "s-1")
    runs.save(tmp_path, runs.sglang_run("s-gpu", tok_s=[1500.0], accept=3.0, draft=d, time="2026-11-05T00:00:00Z"),
              hist)
    assert comparing.default_pair(hist) == ("b-gpu", "s-gpu")
    assert comparing.default_pair(hist, host="local") == ("b-new", "s-1")


def test_default_pair_without_baseline_uses_the_previous_speculative_run(tmp_path: Path, hist: History) -> None:
    d = _draft("sha256:1234000000000000", [0, 1, 3])
    with pytest.raises(BenchError, match="no successful speculative benchmark"):
        comparing.default_pair(hist)
    runs.save(tmp_path, runs.vllm_run("s-1", tok_s=[50.0], accept=1.5, draft=d, time="2026-11-04T00:00:00Z"), hist)
    with pytest.raises(BenchError, match="only one benchmark"):
        comparing.default_pair(hist)
    runs.save(tmp_path, runs.vllm_run("s-2", tok_s=[70.0], accept=2.5, draft=d, time="2026-11-05T00:00:00Z"), hist)
    assert comparing.default_pair(hist) == ("s-1", "s-2")


# --- files ---------------------------------------------------------------------------------------

def test_result_file_roundtrip_and_refusals(tmp_path: Path) -> None:
    res = runs.vllm_run("r1", tok_s=[90.0, 95.0, 100.0], accept=2.0, draft=_draft("sha256:1", [0, 1, 3]))
    folder = result.write(res, tmp_path / "r1").parent
    back = result.load(folder)
    assert back == res and back.metrics.output_throughput.median == pytest.approx(95.0)
    assert back.metrics.output_throughput.spread == pytest.approx(10 / 95)
    doc = json.loads((folder / result.RESULT_NAME).read_text())
    assert doc["schema"] == "draftops.bench-result/1"
    doc["metrics"]["output_throughput"]["median"] = "fast"
    (folder / result.RESULT_NAME).write_text(json.dumps(doc))
    with pytest.raises(BenchError, match="metrics.output_throughput.median"):
        result.load(folder)
    (folder / result.RESULT_NAME).write_text(json.dumps({**doc, "schema": "draftops.bench-result/9"}))
    with pytest.raises(BenchError, match="bench-result/9"):
        result.load(folder)
    (folder / result.RESULT_NAME).write_text('{"schema": "draftops.bench-result/1", "run_id": ')
    with pytest.raises(BenchError, match="not readable JSON"):
        result.load(folder)
    with pytest.raises(BenchError, match="invoke runs --local"):
        result.load(tmp_path / "missing")


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def test_outputs_markdown_json_and_chart(tmp_path: Path, hist: History, mismatch: dict) -> None:
    base = runs.vllm_run("base", tok_s=[90.0, 91.0, 89.0])
    spec = runs.vllm_run("spec|pipe", tok_s=[46.7, 47.0, 46.1], accept=1.55,
                         draft=_draft("sha256:aaaa000000000000", [1, 4, 7]))
    cmp = _compare(hist, base, spec)
    paths = outputs.write(cmp, tmp_path / "cmp")
    doc = json.loads(paths["json"].read_text())
    assert [f["code"] for f in doc["findings"]] == _codes(cmp)
    assert doc["predictions"]["spec|pipe"]["run_id"] == "td-1" and doc["speedup"] == pytest.approx(cmp.speedup)
    md = paths["markdown"].read_text()
    assert "| accept length (predicted) | — | 1.50 |" in md and "spec\\|pipe" in md
    assert "| accept length (greedy rounds on the dumps) | — | 1.45 |" in md   # the served role's walk
    assert "**bad** (config-wrong)" in md and "![output tok/s and accept length](compare.png)" in md
    width, height = _png_size(paths["chart"])
    assert (width, height) == (900, 400)
    assert not list((tmp_path / "cmp").glob("*.tmp"))
    from rich.console import Console
    console = Console(record=True, width=160)
    render.show(cmp, console)
    shown = console.export_text()
    assert "config-wrong" not in shown and "the config is wrong" in shown and "×0.52" in shown


# --- the seed's story on a real test-drafter report ----------------------------------------------

@pytest.mark.slow
def test_seed_story_on_the_real_demo_report(tmp_path: Path, hist: History) -> None:
    """test-drafter on the demo says MISMATCH; a bench of the served (wrong) ids that measures what it
    predicts for them says: fix the config; after the fix, a bench near its best prediction says the
    wiring is right and the draft is the limit."""
    paths = demo()
    report = run_eval(tmp_path / "eval", steps=3)
    verdict, accept = report["verdict"], report["predicted_accept_length"]
    assert verdict["status"] == "MISMATCH"
    draft_dir = tmp_path / "draft"
    shutil.copytree(paths.draft, draft_dir)
    wrong_digest = file_digest(draft_dir)
    runs.record_prediction(hist, "td-demo", {**report, "checkpoint": {**report["checkpoint"],
                                                                     "path": str(draft_dir)}}, wrong_digest)
    config = json.loads((draft_dir / "config.json").read_text())
    configured = report["checkpoint"]["configured_layer_ids"]
    config["eagle_aux_hidden_state_layer_ids"] = verdict["fix_layer_ids_vllm"]
    fixed_digest = config_digest(json.dumps(config).encode())
    assert fixed_digest != wrong_digest

    base = runs.vllm_run("base", tok_s=[90.0, 90.5, 89.5])
    wrong = runs.vllm_run("wrong", tok_s=[46.7, 47.0, 46.4], accept=accept["served"] * 1.02,
                          draft=DraftInfo(path=str(draft_dir), digest=wrong_digest, format="speculators",
                                          layer_ids=configured, layer_id_convention="vllm"))
    fixed = runs.vllm_run("fixed", tok_s=[140.0, 141.0, 139.0], accept=accept["best"] * 0.97,
                          draft=DraftInfo(path=str(draft_dir), digest=fixed_digest, format="speculators",
                                          layer_ids=verdict["fix_layer_ids_vllm"], layer_id_convention="vllm"))
    before = _compare(hist, base, wrong)
    assert _codes(before)[0] == "config-wrong" and "spec-slower" in _codes(before)
    after = _compare(hist, base, fixed)
    assert "draft-limit" in _codes(after) and "spec-faster" in _codes(after)
    assert after.predictions["fixed"] is not None and after.predictions["fixed"].role == "best"
    change = _compare(hist, wrong, fixed)
    assert f"accept length {accept['served'] * 1.02:.2f} → {accept['best'] * 0.97:.2f}" in next(
        f.text for f in change.findings if f.code == "change")


def test_task_default_tolerance_is_the_compare_modules() -> None:
    from draftops.cli import bench as bench_task
    assert bench_task.TOLERANCE == comparing.TOLERANCE


@pytest.mark.parametrize("run_id", ["run-$\\frac{1}{$-x", "a$^$b", "a$b$c"])
def test_chart_draws_a_run_id_with_dollar_signs_as_text_not_math(tmp_path: Path, run_id: str) -> None:
    """A run id read from an edited or foreign result may hold `$`: matplotlib would parse it as math."""
    from draftops.bench import chart
    base = runs.vllm_run("base", tok_s=[90.0, 91.0, 89.0])
    spec = runs.vllm_run(run_id, tok_s=[46.7, 47.0, 46.1], accept=1.55,
                         draft=_draft("sha256:aaaa000000000000", [1, 4, 7]))
    cmp = comparing.compare(base, spec, {base.run_id: None, spec.run_id: None})
    paths = outputs.write(cmp, tmp_path / "cmp")
    assert _png_size(paths["chart"]) == (900, 400)
    label = chart._label(cmp, "b")
    assert label.count("$") == label.count("\\$") == run_id.count("$")      # every one escaped


@pytest.mark.parametrize("served", [0.0, -1.0, 0.5])
def test_a_recorded_prediction_below_one_token_is_not_a_prediction(hist: History, served: float) -> None:
    """An accept length counts the verified token too, so it is at least 1; a history row below that
    (an edited or broken record) must not be divided by, nor judged against."""
    report = runs.drafter_report(status="MATCH", served=served, best=3.60, configured=[1, 4, 7],
                                 fix=[-1, 0, 2], fix_vllm=[0, 1, 3])
    runs.record_prediction(hist, "td-bad", report, "sha256:aaaa000000000000")
    base = runs.vllm_run("base", tok_s=[90.0, 91.0, 89.0])
    spec = runs.vllm_run("spec", tok_s=[46.7, 47.0, 46.1], accept=1.55,
                         draft=_draft("sha256:aaaa000000000000", [1, 4, 7]))
    cmp = _compare(hist, base, spec)
    assert cmp.predictions["spec"] is None and "no-prediction" in _codes(cmp)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_a_result_with_nan_or_inf_is_refused_naming_the_field(tmp_path: Path, literal: str) -> None:
    """The writer never writes them (pydantic writes null); an edited NaN throughput read as a number
    said "speculative is ×nan faster", an infinite accept length failed the chart with a traceback."""
    res = runs.vllm_run("r1", tok_s=[90.0, 95.0, 100.0], accept=2.0, draft=_draft("sha256:1", [0, 1, 3]))
    folder = result.write(res, tmp_path / "r1").parent
    doc = json.loads((folder / result.RESULT_NAME).read_text())
    doc["accept_length"]["value"] = "@@"
    (folder / result.RESULT_NAME).write_text(json.dumps(doc).replace('"@@"', literal))
    with pytest.raises(BenchError, match=r"field 'accept_length.value'.*not a finite number"):
        result.load(folder)


@pytest.fixture
def full_disk(tmp_path: Path):
    """A 64 KiB tmpfs (mounting needs root with CAP_SYS_ADMIN), nearly filled."""
    from tests.conftest import small_tmpfs
    with small_tmpfs(tmp_path / "disk", "64k") as disk:
        (disk / "filler").write_bytes(b"x" * (40 * 1024))      # compare.json fits, the chart does not
        yield disk


def test_a_full_disk_while_writing_the_comparison_is_one_paragraph(full_disk: Path, hist: History) -> None:
    base = runs.vllm_run("base", tok_s=[90.0, 91.0, 89.0])
    spec = runs.vllm_run("spec", tok_s=[46.7, 47.0, 46.1], accept=1.55, draft=_draft("sha256:aaaa000000000000", [1]))
    cmp = _compare(hist, base, spec)
    with pytest.raises(BenchError, match=r"cannot write the comparison into .*cmp.*No space left.*Free"):
        outputs.write(cmp, full_disk / "cmp")
    assert not [p.name for p in (full_disk / "cmp").iterdir() if "tmp" in p.name]    # no temporary left


def test_a_full_disk_while_writing_the_bench_result_is_one_paragraph(full_disk: Path) -> None:
    (full_disk / "more filler").write_bytes(b"x" * (20 * 1024))
    res = runs.vllm_run("r1", tok_s=[90.0, 95.0, 100.0], accept=2.0, draft=_draft("sha256:1", [0, 1, 3]))
    with pytest.raises(BenchError, match=r"cannot write bench-result.json into .*r1.*No space left"):
        result.write(res, full_disk / "r1")


def test_a_result_whose_median_lies_outside_its_range_still_draws(tmp_path: Path, hist: History) -> None:
    """An edited result (median below its own min): the error bars came out negative and matplotlib
    refused the whole chart with a ValueError."""
    base = runs.vllm_run("base", tok_s=[90.0, 91.0, 89.0])
    spec = runs.vllm_run("spec", tok_s=[46.7, 47.0, 46.1], accept=1.55, draft=_draft("sha256:aaaa000000000000", [1]))
    spec.metrics.output_throughput.median = 10.0           # below min 46.1
    base.metrics.output_throughput.median = 500.0          # above max 91.0
    paths = outputs.write(_compare(hist, base, spec), tmp_path / "cmp")
    assert _png_size(paths["chart"]) == (900, 400)


# --- issue 22: noise, labelled ids, stale advice, host text in the terminal and in Markdown -------

def test_a_difference_inside_the_repeats_spread_is_undecided_with_its_interval(tmp_path: Path,
                                                                               hist: History) -> None:
    from draftops.bench import chart
    base = runs.vllm_run("base", tok_s=[35.0, 45.7, 57.0])          # spread 48%
    spec = runs.vllm_run("spec", tok_s=[52.1, 52.0, 52.2], accept=2.0,
                         draft=_draft("sha256:1234000000000000", [0, 1, 3]))
    cmp = _compare(hist, base, spec)
    assert cmp.within_noise and cmp.speed is not None and cmp.speed.decision == "undecided"
    assert cmp.speed.lo is not None and cmp.speed.hi is not None and cmp.speed.lo < 1 < cmp.speed.hi
    texts = " ".join(f.text for f in cmp.findings)
    assert "spec-faster" not in _codes(cmp) and "No decision" in texts and "95% CI" in texts
    speed = next(r for r in cmp.rows if r["metric"].startswith("speedup"))
    assert speed["b_text"].startswith("×1.1") and ": undecided (about" in speed["b_text"]
    assert chart.title(cmp).endswith(": undecided")
    outside = _compare(hist, runs.vllm_run("steady", tok_s=[45.7] * 3), spec)
    assert not outside.within_noise and outside.speed is not None and outside.speed.decision == "faster"
    assert chart.title(outside).startswith("×1.14 (95% CI ×1.") and "spec-faster" in _codes(outside)
    doc = outside.to_dict()["throughput"]
    assert doc["decision"] == "faster" and doc["alpha"] == 0.05 and doc["margin"] == 0.05
    assert doc["ci"][0] > 1 and "no per-request samples" in doc["method"]


def test_layer_ids_are_labelled_with_their_engine_convention(hist: History, mismatch: dict) -> None:
    vllm = runs.vllm_run("spec", tok_s=[46.0] * 3, accept=1.5, draft=_draft("sha256:aaaa000000000000", [1, 4, 7]))
    sglang = runs.sglang_run("sg", tok_s=[46.0] * 3, accept=1.5, draft=DraftInfo(
        path="/m/flat", digest="sha256:0000000000000001", format="flat", layer_ids=[-1, 1, 3],
        layer_id_convention="sglang"))
    cmp = _compare(hist, vllm, sglang)
    ids = next(r for r in cmp.rows if r["metric"] == "draft layer ids")
    assert ids["a_text"] == "[1, 4, 7] (vLLM ids: 0 = embedding)"
    assert ids["b_text"] == "[-1, 1, 3] (SGLang ids: -1 = embedding)"
    wrong = next(f for f in cmp.findings if f.code == "config-wrong")
    assert "[-1, 0, 2] (SGLang ids: -1 = embedding)" in wrong.text


def test_advice_for_a_config_that_was_fixed_since_the_run_is_not_to_fix_it_again(hist: History,
                                                                                 mismatch: dict) -> None:
    wrong = runs.vllm_run("wrong", tok_s=[46.0] * 3, accept=1.5, time="2026-11-30T10:00:00Z",
                          draft=_draft("sha256:aaaa000000000000", [1, 4, 7]))
    fixed = runs.vllm_run("fixed", tok_s=[150.0] * 3, accept=3.5, time="2026-11-30T11:00:00Z",
                          draft=_draft("sha256:bbbb000000000000", [0, 1, 3]))
    pair = _compare(hist, wrong, fixed)
    changed = next(f for f in pair.findings if f.code == "config-changed")
    assert "wrong" in changed.text and "sha256:bbbb000000000000 in run fixed" in changed.text
    assert not any("draft-config" in f.text for f in pair.findings)
    # against a baseline, the draft's current config comes from the history (the serve after the fix)
    hist.record(runs.records.serve_record("serve-2", "local", engine="vllm", engine_version="0.32.0",
                                          target="/m/target", draft="/m/draft", draft_digest="sha256:bbbb000000000000",
                                          asked={}, effective={}, state="ready", ready_s=1.0,
                                          git_rev=None))
    base = runs.vllm_run("base", tok_s=[90.0] * 3)
    current = {r.run_id: comparing.current_config(hist, r) for r in (base, wrong)}
    later = comparing.compare(base, wrong, {"wrong": comparing.find_prediction(hist, wrong)}, TOL, current)
    assert "config-changed" in _codes(later) and "config-wrong" not in _codes(later)
    assert not any("draft-config" in f.text for f in later.findings)
    still = comparing.compare(base, wrong, {"wrong": comparing.find_prediction(hist, wrong)}, TOL,
                              {"wrong": ("sha256:aaaa000000000000", "serve-1")})
    assert "config-wrong" in _codes(still)


HOSTILE = ("/m/x\x1b]52;c;ZWNobw==\x07\x1b[2J\n# owned <script>alert(1)</script> | <img src=x onerror=alert(1)> "
           "[l](javascript:x)")


def test_host_text_in_a_comparison_is_cleaned_on_the_terminal_and_escaped_in_markdown(
        tmp_path: Path, hist: History, mismatch: dict) -> None:
    from rich.console import Console
    base = runs.vllm_run("base", tok_s=[90.0] * 3)
    spec = runs.vllm_run("20261201-101010-bench-vllm-8000-abcd", tok_s=[46.0] * 3, accept=1.5,
                         draft=_draft("sha256:aaaa000000000000", [1, 4, 7], path=HOSTILE))
    cmp = _compare(hist, base, spec)
    assert any(HOSTILE in f.text for f in cmp.findings)            # the finding quotes the path
    console = Console(record=True, width=80, color_system=None)
    render.show(cmp, console)
    shown = console.export_text()
    assert "\x1b" not in shown and "\x07" not in shown
    assert "A base  vs  B 20261201-101010-bench-vllm-8000-abcd" in shown.splitlines()[0]   # ids whole
    md = outputs.write(cmp, tmp_path / "cmp")["markdown"].read_text()
    assert "\x1b" not in md and "<script" not in md and "<img" not in md and "[l](javascript" not in md
    assert [line for line in md.splitlines() if line.startswith("#")] == [
        "# bench compare: base vs 20261201-101010-bench-vllm-8000-abcd", "## What each accept length counts",
        "## Findings"]
    table = [line for line in md.splitlines() if line.startswith("|")]
    assert table and all(len(line.replace("\\|", "").split("|")) == 5 for line in table)
    finding = next(line for line in md.splitlines() if "config-wrong" in line)
    assert "<code>invoke draft-config --ckpt " in finding           # the command stays code
