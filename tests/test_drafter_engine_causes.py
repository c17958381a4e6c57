"""Engine causes (issue 25, causes 1-4): drafts trained on the lab target (tests/support/drafter_lab.py),
saved with the config a real mistake produces, evaluated for real; each gets exactly its finding,
decided by the engine, its version and the config, and the healthy draft gets none. The lab target
has 5 layers; its dump holds boundaries [0, 2, 3, 4, 5] (SGLang ids [-1, 1, 2, 3, 4], 4 = the final
layer's output); the healthy draft was trained on [0, 2, 3] (SGLang ids [-1, 1, 2])."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from remote.drafter.model.layers import Weights
from remote.eagle import engine_rules
from tests.cause_cases.engine import save_residual_normed
from tests.support import drafter_lab as L


def ids(report: dict[str, Any]) -> list[str]:
    return [f["id"] for f in report["findings"]]


def evaluate(tmp_path: Path, name: str, w: Weights, layer_ids: list[int], fmt: str = "flat",
             edit: Any = None, **kw: Any) -> dict[str, Any]:
    ckpt = L.save(tmp_path / name, w, layer_ids, fmt)
    if edit is not None:
        cfg = json.loads((ckpt / "config.json").read_text())
        edit(cfg)
        (ckpt / "config.json").write_text(json.dumps(cfg))
    return L.run(tmp_path / f"{name}-out", ckpt, **kw)


@pytest.fixture(scope="module")
def healthy() -> Weights:
    return L.trained_weights(L.WELL_TRAINED)


@pytest.mark.parametrize("fmt,engine", [("flat", None), ("speculators", None), ("flat", "sglang"),
                                        ("speculators", "vllm")])
def test_a_healthy_draft_gets_no_engine_finding(tmp_path, healthy, fmt, engine):
    report = evaluate(tmp_path, "ok", healthy, [-1, 1, 2], fmt, engine=engine, engine_version=None)
    assert report["verdict"]["status"] == "MATCH" and ids(report) == [], report["findings"]


def test_the_seed_slot_shift_is_a_convention_shift_with_scores_and_the_fix(tmp_path, healthy):
    # the seed's bug: the config lists [1, 2, 3], training took [embedding, 1, 2] (hidden_states[:-1])
    report = evaluate(tmp_path, "seed", healthy, [1, 2, 3], engine="sglang", engine_version="0.5.10")
    assert report["verdict"]["status"] == "MISMATCH" and ids(report) == ["layer-convention-shift"]
    f = report["findings"][0]
    ev = f["evidence"]
    assert f["severity"] == "bad" and ev["fed_boundaries"] == [2, 3, 4] and ev["trained_boundaries"] == [0, 2, 3]
    assert ev["engine_version"] == "0.5.10" and not ev["version_assumed"]
    assert ev["fed_step0_acc"] < ev["trained_step0_acc"] - 0.1
    assert f"{ev['fed_step0_acc']:.3f}" in f["text"] and "SGLang 0.5.10" in f["text"] and "one slot" in f["text"]
    assert "--layer-ids -1,1,2" in f["fix"] and "patch-sglang.apply" in f["fix"]
    # the verdict keeps its keys and its fix
    assert report["verdict"]["fix_layer_ids"] == [-1, 1, 2] and report["verdict"]["findings"] == ids(report)


def test_the_demo_seed_bug_is_a_convention_shift():
    import tempfile

    from tests.support.drafter_support import run_eval
    with tempfile.TemporaryDirectory() as out:
        report = run_eval(Path(out))
    assert report["verdict"]["status"] == "MISMATCH"
    assert "layer-convention-shift" in ids(report), report["findings"]


@pytest.fixture(scope="module")
def deep() -> Weights:
    """Trained on boundaries [2, 3, 4] (SGLang ids [1, 2, 3])."""
    return L.trained_weights(L.WELL_TRAINED, (1, 2, 3))


def test_vllm_ids_read_by_sglang_shift_onto_the_final_boundary(tmp_path, deep):
    # SGLang #32334: ids written as boundaries, SGLang adds 1 and reaches the final layer's output
    report = evaluate(tmp_path, "vllm-ids", deep, [2, 3, 4], engine="sglang")
    assert ids(report) == ["layer-convention-shift"]
    f = report["findings"][0]
    assert f["evidence"]["fed_boundaries"] == [3, 4, 5] and f["evidence"]["trained_boundaries"] == [2, 3, 4]
    assert "takes the ids as boundaries" in f["text"] and "#32334" in f["text"]
    assert "assumed" in f["text"] and f["evidence"]["engine_version"] == engine_rules.ASSUMED["sglang"]
    assert "--layer-ids 1,2,3" in f["fix"]


@pytest.fixture(scope="module")
def deepseek_target(tmp_path_factory) -> Path:
    """The lab target declared as a DeepSeek-V3 model (the SGLang setter of PR #25454)."""
    folder = tmp_path_factory.mktemp("deepseek") / "target"
    shutil.copytree(L.lab().target, folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "deepseek_v3"}))
    return folder


def test_the_shift_depends_on_the_sglang_version(tmp_path, healthy, deepseek_target):
    before = evaluate(tmp_path, "v512", healthy, [-1, 1, 2], engine="sglang", engine_version="0.5.12",
                      verifier=deepseek_target)
    assert ids(before) == []
    after = evaluate(tmp_path, "v513", healthy, [-1, 1, 2], engine="sglang", engine_version="0.5.13",
                     verifier=deepseek_target)
    assert after["verdict"]["status"] == before["verdict"]["status"] == "MATCH"
    assert ids(after) == ["layer-convention-shift"]
    f = after["findings"][0]
    assert f["evidence"]["rule"] == engine_rules.FIRST_IS_1 and f["evidence"]["fed_boundaries"] == [-1, 1, 2]
    assert "SGLang 0.5.13" in f["text"] and "#25454" in f["text"] and "deepseek_v3" in f["text"]
    assert f["evidence"]["fed_step0_acc"] is None and "not in the dump" in f["text"]
    assert "patch-sglang.apply" in f["fix"]


def test_ids_no_convention_explains_are_simply_wrong(tmp_path, healthy):
    report = evaluate(tmp_path, "wrong", healthy, [-1, 2, 3], engine="sglang")
    assert ids(report) == ["layer-ids-wrong"]
    f = report["findings"][0]
    assert f["evidence"]["fed_boundaries"] == [0, 3, 4] and "--layer-ids -1,1,2" in f["fix"]
    assert f["evidence"]["fed_accept_length"] < f["evidence"]["trained_accept_length"]


def test_missing_ids_say_which_default_layers_and_what_they_score(tmp_path, healthy):
    def drop(cfg: dict[str, Any]) -> None:
        del cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]

    report = evaluate(tmp_path, "none", healthy, [-1, 1, 2], edit=drop, engine="sglang")
    assert ids(report) == ["ids-missing-engine-default"]
    f = report["findings"][0]
    assert f["severity"] == "bad" and f["evidence"]["fed_boundaries"] == [2, 2, 2]
    assert "[1, 1, 1] (SGLang ids: -1 = embedding)" in f["text"] and "5-layer" in f["text"]    # SGLang's own ids
    assert f"{f['evidence']['fed_step0_acc']:.3f}" in f["text"]
    assert "--layer-ids -1,1,2" in f["fix"]


@pytest.fixture(scope="module")
def final() -> Weights:
    """Trained on boundaries [3, 4, 5]: the last is the final layer's output."""
    return L.trained_weights(L.WELL_TRAINED, (2, 3, 4))


def test_a_final_boundary_sglang_cannot_capture_but_vllm_can(tmp_path, final):
    sglang = evaluate(tmp_path, "final", final, [2, 3, 4], engine="sglang")
    assert sglang["verdict"]["status"] == "MATCH" and ids(sglang) == ["final-boundary-uncapturable"]
    f = sglang["findings"][0]
    assert f["evidence"]["last_capturable_boundary"] == 4 and "vLLM" in f["fix"]
    vllm = evaluate(tmp_path, "final-v", final, [2, 3, 4], "speculators", engine="vllm")
    assert ids(vllm) == []


@pytest.mark.parametrize("how", ["flat-arch", "speculators-algorithm", "launch"])
def test_an_eagle3_draft_run_as_eagle_accepts_nothing(tmp_path, healthy, how):
    kw: dict[str, Any] = {}
    fmt, edit = "flat", None
    if how == "flat-arch":
        def edit(cfg: dict[str, Any]) -> None:
            cfg["architectures"] = ["LlamaForCausalLMEagle"]
    elif how == "speculators-algorithm":
        fmt = "speculators"

        def edit(cfg: dict[str, Any]) -> None:
            cfg["speculators_config"]["algorithm"] = "eagle"
    else:
        kw["serve_algorithm"] = "EAGLE"
    report = evaluate(tmp_path, how, healthy, [-1, 1, 2], fmt, edit=edit, **kw)
    assert ids(report) == ["algorithm-eagle-not-eagle3"]
    f = report["findings"][0]
    assert f["severity"] == "bad" and f["evidence"]["accept_length_as_eagle"] == 1.0
    assert f["evidence"]["accept_length_as_eagle3"] > 2 and "#21272" in f["text"]
    assert ("extra_args" in f["fix"]) == (how == "launch")


def test_a_key_sglang_ignores_is_measured_as_the_engine_runs_the_draft(tmp_path):
    ckpt = save_residual_normed(tmp_path / "nbr", "flat")   # both engines read a flat config's ids
    sglang = L.run(tmp_path / "nbr-sglang", ckpt, engine="sglang", engine_version="0.5.20")
    assert ids(sglang) == ["config-key-ignored"]
    f = sglang["findings"][0]
    ev = f["evidence"]
    assert ev["keys"] == ["norm_before_residual"] and ev["engine_version"] == "0.5.20"
    assert ev["step0_acc_as_trained"] == pytest.approx(sglang["metrics"]["served"]["verifier"]["full_acc"][0])
    assert ev["step0_change"] == pytest.approx(ev["step0_acc_as_engine_runs"] - ev["step0_acc_as_trained"])
    assert ev["step0_change"] != 0 and f"{ev['step0_acc_as_engine_runs']:.3f}" in f["text"]
    assert f["severity"] == ("bad" if -ev["step0_change"] >= 0.02 else "warn")
    assert "vLLM" in f["fix"] and "retrain" in f["fix"]
    # vLLM reads the key; it takes a flat config's ids as boundaries, so it gets vLLM's own format
    save_residual_normed(tmp_path / "nbr-spec", "speculators")
    vllm = L.run(tmp_path / "nbr-vllm", tmp_path / "nbr-spec", engine="vllm")
    assert ids(vllm) == [] and vllm["verdict"]["status"] == "MATCH"


def test_key_reads_are_data_per_engine_and_version():
    assert [k.key for k in engine_rules.ignored_keys("sglang", "0.5.15", ["norm_before_fc", "fc_norm"])] == [
        "norm_before_fc"]
    assert engine_rules.ignored_keys("sglang", "0.5.20", ["norm_before_fc", "fc_norm"]) == []
    assert [k.key for k in engine_rules.ignored_keys("sglang", "0.5.10", ["fc_norm", "norm_output"])] == [
        "fc_norm", "norm_output"]
    assert engine_rules.ignored_keys("vllm", None, ["norm_before_residual", "norm_before_fc"]) == []
    assert engine_rules.boundaries(engine_rules.KEEP_IF_FINAL, [23, 29, 36], 36) == [23, 29, 36]
    assert engine_rules.id_rule("sglang", "0.5.20", "gpt_oss") == engine_rules.KEEP_IF_FINAL
    assert engine_rules.id_rule("sglang", "0.4.6.post5", None) == engine_rules.IGNORED
