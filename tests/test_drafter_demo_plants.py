"""Issue 38's three mistakes planted in the demo, each a MATCH with no finding before: a target whose
config has a rope scaling the draft lacks, a draft that knows 32 positions served at the target's
2,048, a draft_vocab_size that disagrees with d2t. Each is now exactly its finding, with its numbers
and a fix, and the layout verdict is untouched (still MATCH: the aux layers are right)."""
from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from remote.eagle.formats import LAYER_CONFIG
from tests.support.drafter_support import demo, run_eval

#: Llama-3.1's scaled rope as transformers 5 writes it (the demo target's config uses rope_parameters)
LLAMA31_PARAMETERS = {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 8192}}


def _copy(src: Path, out: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    shutil.copytree(src, out)
    cfg = json.loads((out / "config.json").read_text())
    edit(cfg)
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def _evaluate(tmp_path: Path, plant: str) -> dict[str, Any]:
    d = demo()
    draft, target = d.draft_fixed, d.target
    if plant == "rope":
        target = _copy(d.target, tmp_path / "target", lambda c: c.update(LLAMA31_PARAMETERS))
    elif plant == "context":
        draft = _copy(d.draft_fixed, tmp_path / "draft", lambda c: c[LAYER_CONFIG].update(max_position_embeddings=32))
    else:
        draft = _copy(d.draft_fixed, tmp_path / "draft", lambda c: c.update(draft_vocab_size=64))
    return run_eval(tmp_path / "out", ckpt=draft, verifier=target, limit=64, layout_samples=16)


@pytest.mark.parametrize(("plant", "finding"), [("rope", "rope-differs"), ("context", "context-beyond-training"),
                                                ("vocab", "vocab-size-mismatch")])
def test_each_planted_mistake_is_its_finding_with_numbers_and_a_fix(tmp_path: Path, plant: str, finding: str) -> None:
    report = _evaluate(tmp_path, plant)
    assert [f["id"] for f in report["findings"]] == [finding], report["findings"]
    assert report["verdict"]["status"] == "MATCH"
    found = report["findings"][0]
    if plant == "rope":
        assert found["evidence"]["keys"] == ["factor", "high_freq_factor", "low_freq_factor",
                                             "original_max_position_embeddings", "rope_theta", "rope_type"]
        assert "Copy rope_parameters from the target's config.json" in found["fix"]
        assert "under transformer_layer_config" in found["fix"]
        assert found["evidence"]["max_angle_gap_rad"] > 0.1
    elif plant == "context":
        assert found["evidence"]["served_context"] == 2048 and found["evidence"]["draft_max_position_embeddings"] == 32
        assert "2,048 positions" in found["text"] and "max_position_embeddings is 32" in found["text"]
        assert found["evidence"]["accuracy_by_position"] == report["accuracy_by_position"]["buckets"]
    else:
        assert (found["evidence"]["draft_config"], found["evidence"]["lm_head_rows"]) == (64, 48)
        assert found["severity"] == "bad" and "Set draft_vocab_size to 48 in" in found["fix"]


def test_a_served_context_past_the_dumps_is_the_finding_too(tmp_path: Path) -> None:
    """The serve profile's context (--served-context) against the dumps' 40-token samples: the draft's
    config allows 2,048, but it never trained past its data."""
    report = run_eval(tmp_path / "out", ckpt=demo().draft_fixed, served_context=1024, limit=64, layout_samples=16)
    found = [f for f in report["findings"] if f["id"] == "context-beyond-training"]
    assert len(found) == 1 and found[0]["evidence"]["longest_scored"] == report["accuracy_by_position"]["longest"]
    assert "the longest sequence scored in the dumps has at most" in found[0]["text"]
    assert run_eval(tmp_path / "fits", ckpt=demo().draft_fixed, served_context=32, limit=64,
                    layout_samples=16)["findings"] == []
