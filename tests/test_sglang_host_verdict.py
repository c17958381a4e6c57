"""On an SGLang host the verdict speaks SGLang (issue 35, item 17): test-drafter of a speculators
draft judges the layout SGLang feeds (SGLang reads only a flat config's eagle_config, so its
default), never the one vLLM would feed, and its fix is the flat-format copy, not ids written into
a config.json SGLang never reads; a `bad` finding is never under a MATCH that says nothing to fix.
Real evaluator runs on the generated demo, rendered by the real show function at 80 columns."""
from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from draftops.cli.drafter import show_result
from draftops.documents import parse
from draftops.documents.drafter_report import DrafterReport
from remote.drafter.verdict import layouts
from tests.support.drafter_support import demo, run_eval

RUN_ID = "20261206-051500-test-drafter-5a1b"
TRAINED = [-1, 1, 3]        # the demo's trained layers, SGLang ids


def shown(report: dict[str, Any], ckpt: str) -> str:
    out = io.StringIO()
    data = parse(DrafterReport, json.loads(json.dumps(report)), "report.json")
    show_result(data, f"runs/{RUN_ID}/report.json", RUN_ID, ckpt, Console(file=out, width=80, color_system=None))
    return " ".join(out.getvalue().replace("│", " ").split())


@pytest.mark.parametrize("draft", ["draft_fixed", "draft"])
def test_a_speculators_draft_on_sglang_is_judged_by_what_sglang_feeds(tmp_path: Path, draft: str) -> None:
    """draft_fixed holds the right ids for vLLM (what draft-config wrote); draft the seed's wrong ones.
    Either way SGLang reads neither: one MISMATCH, in SGLang's terms, fixed by draft-flat."""
    ckpt = demo().root / draft
    report = run_eval(tmp_path, ckpt=ckpt, engine="sglang", engine_version="0.5.13")
    verdict = report["verdict"]
    assert verdict["status"] == "MISMATCH" and verdict["fix_layer_ids"] == TRAINED, verdict["message"]
    assert "SGLang" in verdict["diagnosis"] and "vLLM feeds" not in verdict["message"]
    assert "draft-flat" in verdict["advice"] and "in the draft config.json" not in verdict["advice"]
    assert [f["id"] for f in report["findings"] if f["severity"] == "bad"] == ["ids-missing-engine-default"]
    text = shown(report, str(ckpt))
    assert "Nothing to fix" not in text and "MATCH" not in text.replace("MISMATCH", "")
    assert f"invoke draft-flat --ckpt {ckpt} --from-report {RUN_ID}" in text
    assert "draft-config" not in text
    assert "fix: a flat-format copy with eagle_config.eagle_aux_hidden_state_layer_ids = [-1, 1, 3]" in text


def test_the_same_draft_on_vllm_still_matches(tmp_path: Path) -> None:
    """The host's engine decides: vLLM reads draft_fixed's ids, so there it is right."""
    report = run_eval(tmp_path, ckpt=demo().root / "draft_fixed", engine="vllm")
    assert report["verdict"]["status"] == "MATCH" and report["findings"] == []


def test_a_bad_finding_under_a_match_replaces_nothing_to_fix(tmp_path: Path) -> None:
    """Whatever else a finding says is wrong (a key the engine ignores, a vocabulary map), a MATCH
    about the layout never ends in 'Nothing to fix' above it."""
    report = run_eval(tmp_path, ckpt=demo().root / "draft_fixed", engine="vllm")
    verdict = layouts.Verdict(**{k: report["verdict"][k] for k in (
        "status", "fix_layer_ids", "fix_layer_ids_vllm", "needs_capture_patch", "message", "basis", "best_slots",
        "served_slots", "tolerance", "reason", "comparison", "chance", "diagnosis", "advice")})
    assert verdict.advice.startswith("Nothing to fix")
    layouts.not_nothing_to_fix(verdict, ["config-key-ignored"])
    assert "Nothing to fix" not in verdict.message + verdict.advice
    assert "config-key-ignored" in verdict.advice and verdict.message.endswith(verdict.advice)
    layouts.not_nothing_to_fix(verdict, [])
    assert verdict.status == "MATCH"


def test_serve_reads_the_verdict_as_judged_for_the_hosts_engine(tmp_path: Path) -> None:
    """serve's check of the latest verdict: judged for SGLang, it is not called 'judged as vLLM reads
    the ids' on the SGLang host that judged it."""
    from draftops.serve import verdicts
    ckpt = demo().root / "draft_fixed"
    run_eval(tmp_path / "runs" / RUN_ID, ckpt=ckpt, engine="sglang", engine_version="0.5.13")
    verdict = verdicts.latest(tmp_path / "runs", str(ckpt))
    assert verdict is not None and verdict.status == "MISMATCH" and verdict.serving_convention == "sglang"
