"""The usage and training findings (docs/drafter.md § Findings) on real files: the lab's target with a
chat template, its dumps raw or chat-formatted, drafts trained well or barely; and the demo."""
from __future__ import annotations

import io
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console

from draftops.documents import load
from draftops.documents.drafter_report import DrafterReport
from draftops.report import show
from remote.drafter.causes import training
from remote.drafter.data import chattemplate
from remote.drafter.errors import ConfigError, OptionError
from remote.eagle import acceptlength
from tests.support import usage_causes
from tests.support.drafter_lab import run
from tests.support.drafter_support import run_eval


def ids(report: dict[str, Any]) -> list[str]:
    return [f["id"] for f in report["findings"]]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("usage")
    return {"target": usage_causes.chat_target(tmp / "target"), "chat": usage_causes.chat_dumps(tmp / "chat"),
            "mixed": usage_causes.chat_dumps(tmp / "mixed", share=0.5),
            "good": usage_causes.well_trained(tmp / "good"), "barely": usage_causes.barely_trained(tmp / "barely"),
            "tmp": tmp}


def test_a_healthy_draft_on_chat_formatted_dumps_gets_no_finding(world):
    report = run(world["tmp"] / "healthy", world["good"], data=world["chat"], verifier=world["target"], full=True)
    assert report["verdict"]["status"] == "MATCH" and ids(report) == []
    chat = report["data"]["chat_format"]
    opener = usage_causes.marker_ids()[0]
    assert chat["status"] == "chat" and chat["chat_formatted"] is True
    assert chat["role_markers"] == [{"id": opener, "token": usage_causes.OPEN}]   # the EOS is no role marker
    assert chat["opens_with_marker"] == chat["samples"] == 192


def test_raw_dumps_against_a_chat_template_are_the_chat_template_finding(world):
    report = run(world["tmp"] / "raw", world["good"], verifier=world["target"], full=True)
    assert ids(report) == ["chat-template"] == report["verdict"]["findings"]
    f = report["findings"][0]
    assert f["severity"] == "warn" and f["evidence"]["opens_with_marker"] == 0 and f["evidence"]["samples"] == 192
    assert "none of the 192 evaluated samples" in f["text"] and usage_causes.OPEN in f["text"]
    assert "--chat-template" in f["fix"]
    assert report["data"]["chat_format"]["chat_formatted"] is False


def test_a_template_applied_to_half_the_samples_is_named_with_its_share(world):
    report = run(world["tmp"] / "mixed", world["good"], data=world["mixed"], verifier=world["target"], full=True)
    assert ids(report) == ["chat-template"]
    f = report["findings"][0]
    assert f["evidence"]["status"] == "mixed" and f["evidence"]["opens_with_marker"] == 96
    assert "only 96 of the 192" in f["text"]


def test_a_doubled_bos_is_seen_in_the_token_sequences(tmp_path):
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "chat_template": "{{ bos_token }}[INST] {{ messages[0]['content'] }}",
        "added_tokens_decoder": {"1": {"content": "<s>", "special": True}, "2": {"content": "</s>", "special": True},
                                 "3": {"content": "[INST]", "special": True}}}))
    template = chattemplate.Template.read(folder)
    assert template is not None and template.markers == {3: "[INST]"} and template.bos_id == 1
    scan = chattemplate.Scan(template)
    for i in range(10):
        scan.see(i, torch.tensor([1, 1, 3, 9, 9] if i < 4 else [1, 3, 9, 9]))
    scan.see(0, torch.tensor([5, 6]))       # a sample seen again (the layout scan, then the metrics pass)
    chat = scan.to_dict()
    assert chat["samples"] == 10 and chat["double_bos"] == 4 and chat["status"] == "chat"
    [f] = chattemplate.finding(chat)
    assert f["id"] == "chat-template" and "4 of the 10" in f["text"] and "add_special_tokens=False" in f["fix"]


def test_the_batchers_reader_threads_count_every_sample_once(tmp_path):
    """The batcher's reader threads call ``see`` at once: every sample counts, once (a lost update made
    the same dumps count differently in two formats)."""
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": "[INST] {{ messages[0]['content'] }}",
        "added_tokens_decoder": {"3": {"content": "[INST]", "special": True}}}))
    template = chattemplate.Template.read(folder)
    assert template is not None
    scan = chattemplate.Scan(template)
    ids = [torch.tensor([3, 9, 9, 3] * 64) if i % 2 else torch.tensor([9, 9] * 128) for i in range(4000)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: scan.see(i, ids[i]), [*range(4000), *range(4000)]))
    chat = scan.to_dict()
    assert (chat["samples"], chat["opens_with_marker"], chat["contains_marker"]) == (4000, 2000, 2000)


def test_a_broken_tokenizer_config_is_one_clear_error(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text('{"chat_template": ')
    with pytest.raises(ConfigError) as err:
        chattemplate.Template.read(tmp_path)
    assert "tokenizer_config.json" in str(err.value) and "Fix:" in str(err.value)


def test_a_barely_trained_draft_is_undertrained_with_its_numbers_and_an_unknown_data_size(world):
    report = run(world["tmp"] / "barely", world["barely"], data=world["chat"], verifier=world["target"])
    assert ids(report) == ["undertrained"]
    f = report["findings"][0]
    ev = f["evidence"]
    acc = report["metrics"]["served"]["verifier"]["full_acc"]
    assert ev["full_acc"] == acc[:3] and ev["floors"] == [0.4, 0.1, 0.01] and 0 in ev["below"]
    assert ev["training_samples"] is None and "unknown" in f["text"]
    assert f"{ev['predicted_accept_length']:.2f}" in f["text"] and "500k" in f["fix"]


def test_the_training_data_size_comes_from_the_trainers_record(world, tmp_path):
    import shutil
    ckpt = usage_causes.with_training_record(Path(shutil.copytree(world["barely"], tmp_path / "ck")), 192, 3)
    report = run(tmp_path / "out", ckpt, data=world["chat"], verifier=world["target"])
    ev = report["findings"][0]["evidence"]
    assert ev["training_samples"] == 192 and ev["training_epochs"] == 3
    assert "trained on 192 samples for 3 epochs" in report["findings"][0]["text"]
    assert training.training_size(str(ckpt / "config.json"), str(world["good"]))["samples"] is None


def test_the_demo_has_a_template_without_role_markers_and_no_usage_finding(tmp_path):
    report = run_eval(tmp_path, limit=32, expected_accept_length=2.4, expected_from="specforge")
    assert report["data"]["chat_format"]["status"] == "no-role-markers"
    assert "chat-template" not in ids(report) and "undertrained" not in ids(report)   # its MISMATCH explains it
    # a SpecForge simulated_acc_len has no +1 for the bonus token: 2.4 is 3.4 tokens per verify
    e, pal = report["verdict"]["expected_accept"], report["predicted_accept_length"]
    assert e["given"] == 2.4 and e["value"] == pytest.approx(3.4) and e["source"] == "specforge"
    assert e["predicted"] == pal["served"] and e["flagged"] is True       # the demo's wrong ids: about 1.07
    assert pal["definition"] == acceptlength.PREDICTED and pal["walk_definition"] == acceptlength.WALK
    path = tmp_path / "report.json"
    console = Console(file=io.StringIO(), width=400, record=True)
    show(load(DrafterReport, path), console)
    text = console.export_text()
    assert "accept length: 1 + sum over the K TTT steps" in text and "= 3.40 as 1 + accepted/drafts" in text


def test_an_expected_source_outside_the_known_definitions_is_refused(tmp_path):
    with pytest.raises(OptionError, match="--expected-from"):
        run_eval(tmp_path, limit=1, expected_accept_length=2.0, expected_from="eagle")
