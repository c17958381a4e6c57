"""Verdicts on drafts trained outside the demo (tests/support/drafter_lab.py: another target language, drafts
trained on chosen layers): a paired comparison over samples decides, a barely trained draft is
UNKNOWN, a config whose id count differs from the fc width is a clear error, and the report shows
the fix in the convention of the file being fixed."""
from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from draftops import report as rich_report
from draftops.documents import parse
from draftops.documents.drafter_report import DrafterReport
from remote.drafter import ConfigError, load_checkpoint
from remote.drafter.cli import main
from tests.support.drafter_lab import BARELY, NEIGHBOUR, TRAINED, WELL_TRAINED, lab, run, save, trained_weights


@pytest.fixture(scope="module")
def neighbour(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Trained on [emb, l1, l2], configured for [emb, l1, l3]: a couple of points worse."""
    root = tmp_path_factory.mktemp("neighbour")
    return run(root / "out", save(root / "ckpt", trained_weights(WELL_TRAINED), NEIGHBOUR))


def _full_step0(report: dict, role: str) -> float:
    return report["metrics"][role]["verifier"]["full_acc"][0]


def test_a_served_layout_a_couple_of_points_below_the_best_is_a_mismatch(neighbour: dict) -> None:
    v, c = neighbour["verdict"], neighbour["verdict"]["comparison"]
    gap = _full_step0(neighbour, "best") - _full_step0(neighbour, "served")
    scan = {tuple(r["layer_ids"]): r["acc"] for r in neighbour["layouts"]}
    assert 0 < scan[tuple(TRAINED)] - scan[tuple(NEIGHBOUR)] < 0.03  # a 3-point step-0 tolerance said MATCH
    assert 0.01 < gap < 0.05
    assert v["status"] == "MISMATCH" and v["reason"] is None
    assert v["fix_layer_ids"] == TRAINED and v["fix_layer_ids_vllm"] == [i + 1 for i in TRAINED]
    assert c["outcome"] == "better" and c["significant"] and c["samples"] == neighbour["data"]["samples"]
    assert c["gain_ci"][0] > 0 and c["sign_test_p"] < c["alpha"] == 0.05
    assert all(g > 0 for g in c["step_gain"]) and len(c["step_gain"]) == 3  # every TTT step compared
    pal = neighbour["predicted_accept_length"]
    assert c["gain"] == pytest.approx(pal["best"] - pal["served"])
    msg = v["message"]
    for part in (f"{c['gain']:+.3f} tokens per verify", f"of {c['samples']} samples", "sign test",
                 f"{pal['best']:.2f}", f"{pal['served']:.2f}", "count as the same", str([0, 2, 3])):
        assert part in msg, (part, msg)


def test_the_served_layout_is_the_trained_one(tmp_path: Path) -> None:
    report = run(tmp_path / "out", save(tmp_path / "ckpt", trained_weights(WELL_TRAINED), TRAINED))
    v = report["verdict"]
    assert v["status"] == "MATCH" and v["fix_layer_ids"] is None and v["reason"] is None
    assert v["served_slots"] == v["best_slots"] == [0, 1, 2]


def test_a_barely_trained_draft_is_unknown_with_the_reason(tmp_path: Path) -> None:
    report = run(tmp_path / "out", save(tmp_path / "ckpt", trained_weights(BARELY), NEIGHBOUR))
    v = report["verdict"]
    assert v["status"] == "UNKNOWN" and v["reason"] == "near_chance" and v["fix_layer_ids"] is None
    chance = v["chance"]
    assert chance["near_chance"] and chance["best_step0"] <= chance["threshold"]
    assert 0 < chance["constant_guess_acc"] < chance["threshold"] < 1
    assert "near chance" in v["message"] and f"{chance['constant_guess_acc']:.3f}" in v["message"]
    assert max(r["acc"] for r in report["layouts"]) < chance["threshold"]  # every layout, not just two


def test_too_few_samples_are_inconclusive_not_a_match(tmp_path: Path) -> None:
    report = run(tmp_path / "out", save(tmp_path / "ckpt", trained_weights(WELL_TRAINED), NEIGHBOUR),
                 limit=5, layout_samples=5)
    v = report["verdict"]
    assert v["status"] == "UNKNOWN" and v["reason"] == "inconclusive"
    assert v["comparison"]["samples"] == 5 and not v["comparison"]["significant"]
    assert "not significant" in v["message"] and "more samples" in v["message"]


def test_the_message_quotes_only_the_full_set_numbers(neighbour: dict) -> None:
    """The scan (first 64 samples) picks the best layout; the message's accuracies are all from the
    metrics pass over every sample, and the two sets give different numbers here."""
    msg = neighbour["verdict"]["message"]
    full = [_full_step0(neighbour, "best"), _full_step0(neighbour, "served")]
    scan = [r["acc"] for r in neighbour["layouts"] if r["tags"]]
    assert neighbour["data"]["layout_scan_samples"] < neighbour["data"]["samples"]
    for acc in full:
        assert f"{acc:.3f}" in msg
    for acc in scan:
        assert all(abs(acc - f) > 5e-4 for f in full) and f"{acc:.3f}" not in msg
    assert f"all {neighbour['data']['samples']} evaluated samples" in msg


def _panel_text(report: dict) -> str:
    out = io.StringIO()
    read = parse(DrafterReport, json.loads(json.dumps(report)), "report.json")     # as the task reads it
    Console(file=out, width=400, color_system=None).print(rich_report.verdict_panel(read))
    return out.getvalue()


def test_the_fix_line_shows_the_ids_of_the_file_being_fixed_first(neighbour: dict, tmp_path: Path) -> None:
    spec_line = next(line for line in _panel_text(neighbour).splitlines() if "fix:" in line)
    ids = re.findall(r"\[[-\d, ]+\]", spec_line)
    assert ids[:2] == ["[0, 2, 3]", "[-1, 1, 2]"] and "vLLM convention" in spec_line  # speculators: vLLM ids
    flat = run(tmp_path / "out", save(tmp_path / "flat", trained_weights(WELL_TRAINED), NEIGHBOUR, fmt="flat"))
    flat_line = next(line for line in _panel_text(flat).splitlines() if "fix:" in line)
    assert re.findall(r"\[[-\d, ]+\]", flat_line)[:2] == ["[-1, 1, 2]", "[0, 2, 3]"]
    assert "eagle_config.eagle_aux_hidden_state_layer_ids" in flat_line


def test_a_config_with_fewer_ids_than_fc_slots_is_a_clear_error(tmp_path: Path) -> None:
    ckpt = save(tmp_path / "ckpt", trained_weights(WELL_TRAINED), TRAINED)
    cfg = json.loads((ckpt / "config.json").read_text())
    for ids in ([0, 2], [0, 2, 3, 4]):
        cfg["eagle_aux_hidden_state_layer_ids"] = ids
        (ckpt / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(ConfigError) as exc:
            load_checkpoint(ckpt)
        msg = str(exc.value)
        assert "\n" not in msg and str(ckpt / "config.json") in msg and "eagle_aux_hidden_state_layer_ids" in msg
        assert f"lists {len(ids)} aux layer ids" in msg and "takes 3 slots" in msg and "Fix:" in msg


def test_the_cli_turns_the_id_count_error_into_its_clear_error_exit(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:

    ckpt = save(tmp_path / "ckpt", trained_weights(WELL_TRAINED), [-1, 1])
    code = main(["eval", "--ckpt", str(ckpt), "--data", str(lab().data), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 3 and err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert "eagle_aux_hidden_state_layer_ids" in err and not (tmp_path / "out" / "report.json").exists()


@pytest.mark.parametrize("convention,shown", [("vllm", "fix [0, 2, 3] (vLLM ids)"),
                                              ("sglang", "fix [-1, 1, 2] (SGLang ids)")])
def test_the_history_headline_shows_the_fix_in_the_config_files_convention(convention: str, shown: str) -> None:
    from draftops.cli.history import headline
    from draftops.history import RunRecord

    rec = RunRecord(run_id="r", kind="test-drafter", host="local",
                    metrics={"predicted_served": 1.5, "predicted_best": 2.5, "steps": 3, "serving_convention":
                             convention, "fix_layer_ids": [-1, 1, 2], "fix_layer_ids_vllm": [0, 2, 3]})
    assert headline(rec).endswith(shown)


@pytest.mark.parametrize("engine", ["vllm", "sglang", None])
def test_the_advice_for_an_embedding_id_is_for_the_engine_the_host_serves_with(engine: str | None,
                                                                               tmp_path: Path) -> None:
    """The fix holds the embedding: vLLM captures it natively, only SGLang needs the capture patch, so a
    vLLM host is never told to patch SGLang (issue 22, item 4)."""
    report = run(tmp_path / "out", save(tmp_path / "ckpt", trained_weights(WELL_TRAINED), NEIGHBOUR), engine=engine)
    verdict = report["verdict"]
    assert verdict["status"] == "MISMATCH" and -1 in verdict["fix_layer_ids"] and verdict["advice_engine"] == engine
    panel = _panel_text(report)
    native = "vLLM captures the embedding output (0) natively"
    if engine == "vllm":
        assert "SGLang" not in verdict["message"].split("Put ")[1].split(" In SGLang ids")[0]
        assert native in verdict["message"] and "patch-sglang" not in panel
    elif engine == "sglang":
        assert "patch-sglang.apply" in verdict["message"] and native not in verdict["message"]
        assert "needs the SGLang capture patch" in panel
    else:
        assert "patch-sglang.apply" in verdict["message"] and native in verdict["message"]


def test_the_host_engine_is_its_serve_profiles_engine() -> None:
    from draftops.inventory import HostSpec, ServeProfile
    from draftops.serve.profiles import serving_engine
    assert serving_engine(HostSpec(name="local", transport="local")) == "vllm"
    assert serving_engine(HostSpec(name="gpu", address="g")) == "sglang"
    assert serving_engine(HostSpec(name="gpu", address="g", serve={"a": ServeProfile(engine="vllm")})) == "vllm"
    assert serving_engine(HostSpec(name="gpu", address="g", serve={
        "a": ServeProfile(engine="vllm"), "b": ServeProfile(engine="sglang")})) is None
