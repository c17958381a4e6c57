"""The demo reproduces the seed's bug and the evaluator diagnoses it (and accepts the fix)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from remote import events
from remote.drafter.report import SCHEMA
from tests.support.drafter_support import SPEC, demo, layout_acc, run_eval

REPO = Path(__file__).resolve().parent.parent
TRAINED = SPEC.trained_ids  # [-1, l_a, l_b]
BUGGY = SPEC.buggy_ids  # [l_a, l_b, l_c]


@pytest.fixture(scope="module")
def buggy(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run_eval(tmp_path_factory.mktemp("buggy"), expected_acc=0.85, full=True)  # the complete report


def test_demo_verdict_is_mismatch_with_the_embedding_fix(buggy: dict) -> None:
    v = buggy["verdict"]
    assert v["status"] == "MISMATCH"
    assert v["fix_layer_ids"] == TRAINED == [-1, SPEC.layer_a, SPEC.layer_b]
    assert v["fix_layer_ids_vllm"] == [0, SPEC.layer_a + 1, SPEC.layer_b + 1]
    assert v["needs_capture_patch"] is True
    assert str(TRAINED) in v["message"] and "patch" in v["message"]
    assert v["basis"] == "verifier"


def test_trained_layout_is_accurate_and_configured_one_is_not(buggy: dict) -> None:
    trained, configured = layout_acc(buggy, TRAINED), layout_acc(buggy, BUGGY)
    assert trained >= 0.8
    assert configured <= trained / 2
    best = [r for r in buggy["layouts"] if "best" in r["tags"]]
    assert [r["layer_ids"] for r in best] == [TRAINED]
    # The default demo draft is in the speculators format: vLLM reads its ids (l + 1 each).
    assert "configured-vllm" in next(r for r in buggy["layouts"] if r["layer_ids"] == BUGGY)["tags"]
    assert buggy["checkpoint"]["configured_layer_ids"] == [i + 1 for i in BUGGY]
    assert len(buggy["layouts"]) == 10  # C(5, 3) ascending choices


def test_data_targets_tell_the_same_story(buggy: dict) -> None:
    rows = {tuple(r["layer_ids"]): r["step0_acc"]["data"] for r in buggy["layouts"]}
    assert rows[tuple(TRAINED)] >= 0.75
    assert rows[tuple(BUGGY)] <= rows[tuple(TRAINED)] / 2


def test_embedding_slot_has_by_far_the_smallest_norm(buggy: dict) -> None:
    norms = buggy["slot_norms"]
    assert [n["role"] for n in norms] == ["embedding", "layer 1", "layer 3", "layer 4", "final"]
    emb, rest = norms[0]["rms"], [n["rms"] for n in norms[1:]]
    assert emb * 20 < min(rest)


def test_metrics_and_accept_length(buggy: dict) -> None:
    m = buggy["metrics"]
    assert m["steps"] == 3 and m["basis"] == "verifier"
    assert m["served"]["layer_ids"] == BUGGY and m["best"]["layer_ids"] == TRAINED
    for role in ("served", "best"):
        for basis in ("data", "verifier"):
            full = m[role][basis]["full_acc"]
            assert len(full) == 3 and full == sorted(full, reverse=True)  # cumulative chains only shrink
            assert m[role][basis]["top5_acc_0"] >= full[0]
    pal = buggy["predicted_accept_length"]
    best = m["best"]["verifier"]["full_acc"]
    assert pal["best"] == pytest.approx(1 + sum(best))
    assert pal["served"] < 1.6 < 3.0 < pal["best"]
    # a greedy server's rounds over the same text: each role's own walk, inside [1, 1 + K]; the trained
    # layout is right in runs, so rounds skip through easy stretches and the walk sits below the
    # average over positions (docs/bench.md, measured against predicted)
    for role in ("served", "best"):
        walk = m[role]["verifier"]["walk"]
        assert walk["rounds"] > 0 and pal["walk"][role] == pytest.approx(1 + walk["accepted"] / walk["rounds"])
        assert 1.0 <= pal["walk"][role] <= 4.0
    assert pal["walk"]["best"] < pal["best"] - 0.1
    assert pal["walk"]["served"] < 1.6 < 2.5 < pal["walk"]["best"]


def test_configured_ids_under_both_conventions(buggy: dict) -> None:
    # speculators-format ids [l_a+1, l_b+1, l_c+1]: vLLM (which reads this format) feeds slots 1-3;
    # read as SGLang ids they would name a layer the dump does not have.
    sglang, vllm = buggy["interpretations"]
    assert vllm["convention"] == "vllm" and vllm["slots"] == [1, 2, 3]
    assert sglang["convention"] == "sglang" and sglang["slots"] is None
    assert sglang["missing"]
    assert buggy["verdict"]["serving_convention"] == "vllm"


def test_expected_accuracy_gap_is_flagged(buggy: dict) -> None:
    e = buggy["verdict"]["expected_acc"]
    assert e["expected"] == 0.85 and e["flagged"] is True
    assert e["gap"] == pytest.approx(0.85 - e["served"])
    assert e["best"] > 0.8


def test_report_sections_and_file(buggy: dict, tmp_path: Path) -> None:
    assert buggy["schema"] == SCHEMA
    for key in ("verdict", "slot_norms", "layouts", "metrics", "predicted_accept_length", "checkpoint",
                "data", "interpretations", "run", "warnings"):
        assert key in buggy
    ck, data = buggy["checkpoint"], buggy["data"]
    assert ck["format"] == "speculators" and ck["configured_layer_ids"] == [i + 1 for i in BUGGY]
    assert ck["structure"]["num_aux"] == 3 and ck["structure"]["head_dim"] == 32
    assert data["slot_layer_ids"] == SPEC.slot_ids and data["final_slot"] == 4
    assert data["samples"] == SPEC.samples and data["formats"] == ["safetensors"]


def test_draft_saved_with_the_right_ids_matches(tmp_path: Path) -> None:
    report = run_eval(tmp_path, ckpt=demo().draft_fixed, steps=2)
    v = report["verdict"]
    assert v["status"] == "MATCH" and v["fix_layer_ids"] is None
    assert v["needs_capture_patch"] is True  # serving [-1, ...] on SGLang still needs the patch
    assert report["metrics"]["best"] is None and report["metrics"]["served"]["layer_ids"] == TRAINED
    assert report["predicted_accept_length"]["served"] > 2.5
    assert json.loads((tmp_path / "report.json").read_text())["verdict"]["status"] == "MATCH"


def test_cli_eval_reuses_the_demo_and_streams_events(tmp_path: Path) -> None:
    root = demo().root
    marker = root / "DEMO.json"
    before = marker.stat().st_mtime_ns
    env = {**os.environ, "DRAFTOPS_DEMO_DIR": str(root), "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "remote.drafter", "eval", "--out", str(tmp_path),
                           "--limit", "64", "--layout-samples", "32", "--full"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert marker.stat().st_mtime_ns == before  # complete demo reused, not rebuilt
    parsed = [e for e in map(events.parse, proc.stdout.splitlines()) if e]
    assert any(e["event"] == "progress" for e in parsed)
    result = [e for e in parsed if e["event"] == "result"]
    assert result and Path(result[-1]["path"]) == tmp_path / "report.json"
    assert result[-1]["status"] == "MISMATCH"
    assert "verdict: MISMATCH" in proc.stdout
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["data"]["samples"] == 64
    assert report["verdict"]["expected_acc"]["flagged"] is True  # demo passes its val accuracy


def test_a_damaged_demo_file_names_the_demo_and_how_to_build_it_again(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture) -> None:
    import shutil

    from remote.drafter.cli import main
    copy = tmp_path / "demo dir"
    shutil.copytree(demo().root, copy)
    weights = copy / demo().draft.relative_to(demo().root) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])                  # a cut-off copy
    rel = {name: copy / getattr(demo(), name).relative_to(demo().root) for name in ("draft", "data", "target")}
    code = main(["eval", "--ckpt", str(rel["draft"]), "--data", str(rel["data"]), "--verifier", str(rel["target"]),
                 "--out", str(tmp_path / "out"), "--limit", "4"])
    err = " ".join(capsys.readouterr().err.split())
    assert code != 0 and "truncated" in err and str(weights) in err
    assert f"part of the generated demo in {copy}" in err and f"rm -r '{copy}'" in err
    assert "invoke test-drafter` builds the demo again" in err
    # the same error in files that are not the demo's says nothing of a demo
    (copy / "DEMO.json").unlink()
    assert main(["eval", "--ckpt", str(rel["draft"]), "--data", str(rel["data"]), "--verifier", str(rel["target"]),
                 "--out", str(tmp_path / "out"), "--limit", "4"]) != 0
    assert "generated demo" not in capsys.readouterr().err
