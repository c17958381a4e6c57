"""Issue 38's config and engine-version causes, their parts one by one: the regression table's version
ranges, accuracy by position (counted, merged across ranks, rendered), the UNKNOWN verdict's commands
(pasteable once the laptop rebuilds them), speculators' four-layer dumps read with the final layer
included, the served context the host's profile hands the evaluator. The findings themselves, on real
evaluations in the three dump formats, are tests/test_cause_cases.py's."""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import torch

from draftops import cmdline
from draftops.documents.drafter_report import DrafterReport
from draftops.serve.host_engine import HostEngine
from remote.drafter import EvalOptions
from remote.drafter.errors import OptionError
from remote.drafter.scoring.metrics import StepCounts, bucket_start, position_bucket
from remote.drafter.scoring.reduce import counts as merged
from remote.drafter.verdict.unknown_layers import advice, speculators_default
from remote.eagle import regressions


@pytest.mark.parametrize(("version", "found"), [
    ("0.17.0", []), ("0.17.1", ["vllm #41838"]), ("0.18.2", ["vllm #41838"]), ("0.19.1", ["vllm #41838"]),
    ("0.19.1+cpu", ["vllm #41838"]), ("0.19.2", []), ("0.32.0", []), ("v0.17.1rc1", ["vllm #41838"]),
])
def test_a_vllm_version_is_in_a_regression_range_only_where_the_sources_confirm_it(version: str,
                                                                                  found: list[str]) -> None:
    assert [r.issue for r in regressions.affecting("vllm", version)] == found


def test_a_range_can_hold_one_post_release_and_a_target_family() -> None:
    vl = "qwen2_5_vl Qwen2_5_VLForConditionalGeneration"
    found = regressions.affecting("sglang", "0.5.5.post3", vl)
    assert [r.issue for r in found] == ["SpecForge #310 (sglang PR #13904)"]
    assert regressions.affecting("sglang", "0.5.5.post2", vl) == []      # before the regression
    assert regressions.affecting("sglang", "0.5.5", vl) == []
    assert regressions.affecting("sglang", "0.5.5.post3", "llama LlamaForCausalLM") == []   # a text target
    assert regressions.affecting("sglang", None) == [] and regressions.affecting("vllm", "main") == []


def test_every_regression_names_its_issue_a_confirmed_range_and_a_fix() -> None:
    for r in regressions.REGRESSIONS:
        first, last = regressions.version_key(r.first), regressions.version_key(r.last)
        assert first is not None and last is not None and first <= last, r
        assert r.issue and r.what and (r.fixed_in or r.fix), r


def test_positions_fall_in_doubling_buckets() -> None:
    assert position_bucket(torch.tensor([0, 7, 8, 15, 16, 31, 32, 2047, 2048])).tolist() == [0, 0, 1, 1, 2, 2, 3, 8, 9]
    assert [bucket_start(b) for b in range(5)] == [0, 8, 16, 32, 64]


def _counts(right_until: int, n: int = 40) -> StepCounts:
    """One sample of ``n`` rows whose step-0 prediction is right on rows below ``right_until``."""
    sc = StepCounts(1)
    target = torch.arange(n)[None, :]
    pred = torch.where(torch.arange(n) < right_until, torch.arange(n), -5)[None, :]
    sc.update([pred], target, torch.ones(1, n, dtype=torch.bool))
    return sc


def test_step0_accuracy_by_position_shows_decay_where_the_draft_stops_knowing() -> None:
    sc = _counts(right_until=30)           # rows 0..29 right: token positions 2..31
    rows = {(b["from"], b["to"]): (b["correct"], b["total"]) for b in sc.by_position()}
    assert rows == {(0, 7): (6, 6), (8, 15): (8, 8), (16, 31): (16, 16), (32, 63): (0, 10)}
    assert sc.longest == 42                # 40 rows: the last row drafts the sample's token 41
    both = merged([sc, _counts(right_until=40, n=70)])
    rows = {(b["from"], b["to"]): (b["correct"], b["total"]) for b in both.by_position()}
    assert rows[(32, 63)] == (0 + 10, 10 + 32) and rows[(64, 127)] == (0, 8) and both.longest == 72
    assert sc.to_dict()["by_position"] == sc.by_position()


def test_the_report_renders_accuracy_by_position_in_one_line() -> None:
    from draftops.report import _position_line

    doc = {"schema": DrafterReport.SCHEMA, "accuracy_by_position": {
        "layout": "served", "basis": "verifier", "longest": 42, "buckets": _counts(right_until=30).by_position()}}
    line = _position_line(DrafterReport.model_validate(doc))
    assert line == ("step-0 acc by token position (served layout, verifier targets): 0-7 100.0%, 8-15 100.0%, "
                    "16-31 100.0%, 32-63 0.0%")
    assert _position_line(DrafterReport.model_validate({"schema": DrafterReport.SCHEMA})) is None


def test_the_unknown_verdict_names_commands_that_paste_for_paths_with_spaces_and_quotes(tmp_path: Path) -> None:
    data = tmp_path / "my dumps; 'x'"
    data.mkdir()
    ckpt = tmp_path / "the draft"
    text = advice(data, ckpt)
    assert "data_config.json" in text and "run config" in text
    shown = cmdline.commands_in(text, host="box")
    command = next(line for line in shown.split("`") if "capture-check" in line)
    words = shlex.split(command)
    assert words[words.index("--data") + 1] == str(data) and words[words.index("--draft") + 1] == str(ckpt)
    assert words[words.index("--host") + 1] == "box"
    (data / "run.yaml").write_text("model: {}\n")
    assert "run.yaml" in advice(data, ckpt) and "save it as .json" in advice(data, ckpt)


def test_speculators_four_slot_dumps_are_told_their_default_layers_final_included() -> None:
    said = speculators_default("safetensors", 4, 32)
    assert '{"layer_ids": [2, 16, 29, 32], "layer_id_convention": "vllm", "final_slot": 3}' in said
    assert speculators_default("safetensors", 3, 32) == "" and speculators_default("modelopt", 4, 32) == ""
    assert speculators_default("safetensors", 4, None) == ""
    assert speculators_default("safetensors", 4, 5) == ""    # [2, 2, 2, 5]: no default a dump could hold


def test_served_context_is_an_option_in_range_and_the_profile_hands_it_over(tmp_path: Path) -> None:
    EvalOptions(ckpt=tmp_path, data=tmp_path, served_context=2048).validate()
    for bad in (0, -1, 1.5, True):
        with pytest.raises(OptionError, match="--served-context"):
            EvalOptions(ckpt=tmp_path, data=tmp_path, served_context=bad).validate()   # type: ignore[arg-type]
    args = HostEngine("vllm", "0.32.0", None, 1024).eval_args()
    assert args == ["--engine", "vllm", "--engine-version", "0.32.0", "--served-context", "1024"]
    assert "--served-context" not in HostEngine("vllm", None, None).eval_args()


def test_a_speculators_dump_of_four_layers_with_the_final_one_is_read_right(tmp_path: Path) -> None:
    """speculators' data generation captures [2, n//2, n-3, n] (vLLM ids): three aux layers and the final
    one, n. Here the lab's [0, 2, 3] + [5] (its 5 layers): the final slot is 3, the layers read as
    SGLang's [-1, 1, 2, 4], and the trained layout is served."""
    from tests.support.drafter_lab import TRAINED, WELL_TRAINED, lab, run, save, trained_weights
    from tests.support.trainer_dumps import write_data_config, write_speculators

    the_lab = lab()
    data = tmp_path / "hidden_states"
    write_speculators(data, the_lab.ids, the_lab.slots(), [0, 1, 2, 4])
    write_data_config(data, {"layer_ids": [0, 2, 3, 5], "layer_id_convention": "vllm"})
    draft = save(tmp_path / "draft", trained_weights(WELL_TRAINED), TRAINED)
    report = run(tmp_path / "out", draft, data=data, limit=32, layout_samples=16)
    assert report["data"]["slot_layer_ids"] == [-1, 1, 2, 4] and report["data"]["final_slot"] == 3
    assert report["verdict"]["status"] == "MATCH", report["verdict"]["message"]
    assert report["accuracy_by_position"]["buckets"] and report["accuracy_by_position"]["layout"] == "served"
    json.dumps(report)   # the report stays JSON


def test_rope_shapes_differ_by_what_rotates_a_text_token_not_by_the_table_size() -> None:
    from remote.drafter.causes.positions import _angle_gap, _shape
    from remote.drafter.model.rope import RopeSpec

    qwen_vl = RopeSpec.from_config({"rope_theta": 1e6, "max_position_embeddings": 128000,
                                    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}})
    draft = RopeSpec.from_config({"rope_theta": 1e6, "max_position_embeddings": 2048})
    assert _shape(qwen_vl) == _shape(draft)            # text positions rotate alike; the size is no difference
    llama31 = RopeSpec.from_config({"rope_theta": 500000.0, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}})
    dropped = RopeSpec.from_config({"rope_theta": 500000.0})   # speculators PR #574's conversion
    assert _shape(llama31) != _shape(dropped)
    gap = _angle_gap(dropped, llama31, 128, 131072)
    assert gap is not None and 1.0 < gap <= 3.1416      # far apart at long context
    assert _angle_gap(dropped, dropped, 128, 131072) == 0.0
