"""One layer-id convention per screen, named beside every id list (issue 35, item 8): the host
engine's own. test-drafter's layer findings (the doctor shows the same texts) write layers in the
serving engine's ids and say which; `remote.eagle.convention.ids_text` is the one helper every
renderer uses (bench.compare's table and findings included). Real evaluator runs on the demo."""
from __future__ import annotations

from pathlib import Path

import pytest

from draftops.bench import compare
from remote.eagle import convention
from remote.eagle.engine_rules import LAYER_FINDINGS
from tests.support.drafter_support import demo, run_eval


@pytest.mark.parametrize(("engine", "own", "other"), [("vllm", "(vLLM ids: 0 = embedding)", "SGLang ids"),
                                                      ("sglang", "(SGLang ids: -1 = embedding)", "vLLM ids")])
def test_layer_findings_speak_the_host_engines_ids_and_name_them(tmp_path: Path, engine: str, own: str,
                                                                  other: str) -> None:
    extra = {"engine_version": "0.5.13"} if engine == "sglang" else {}
    report = run_eval(tmp_path, ckpt=demo().draft, engine=engine, full=True, **extra)
    layer = [f for f in report["findings"] if f["id"] in LAYER_FINDINGS]
    assert layer, report["findings"]
    for finding in layer:
        text = finding["text"]
        assert own in text and other not in text, text
        assert "after layers [" not in text and "dump [embedding" not in text, text


def test_one_helper_names_every_convention() -> None:
    assert convention.ids_text([-1, 1, 3], "sglang") == "[-1, 1, 3] (SGLang ids: -1 = embedding)"
    assert convention.ids_text([0, 2, 4], "vllm") == "[0, 2, 4] (vLLM ids: 0 = embedding)"
    assert convention.boundaries_text([0, 2, 4], "sglang") == convention.ids_text([-1, 1, 3], "sglang")
    assert convention.boundaries_text([0, 2, 4], "vllm") == convention.ids_text([0, 2, 4], "vllm")
    assert compare.ids_text([0, 2, 4], "vllm") == convention.ids_text([0, 2, 4], "vllm")
    assert convention.ids_text(None, "vllm") == "—"
