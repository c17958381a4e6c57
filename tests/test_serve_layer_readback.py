"""vLLM says at model load which aux layers it captures; serve reads that line back, so the asked-vs-
effective table can hold the draft's layer ids against the engine's (the setting a wrong config gets
wrong). The lines are vLLM 0.32's own (v1/worker/gpu_model_runner.py, gpu/spec_decode/eagle/eagle3_utils.py)."""
from __future__ import annotations

import pytest

from draftops.serve import engines


@pytest.mark.parametrize("line, ids", [
    ("(EngineCore pid=1) INFO 12-01 10:00:00 [gpu_model_runner.py:5243] Using auxiliary layers from "
     "speculative config: (1, 2, 3)", [1, 2, 3]),
    ("INFO [eagle3_utils.py:27] Using Eagle3 auxiliary layers from config: [0, 14, 27]", [0, 14, 27]),
    ("INFO [eagle3_utils.py:30] Using Eagle3 auxiliary layers from model: (2, 14, 25)", [2, 14, 25]),
    ("INFO nothing about layers", None),
])
def test_vllm_reads_back_the_aux_layer_ids_it_logged(line, ids):
    got = engines.get("vllm").effective(lambda path, body: (404, ""), f"INFO start\n{line}\n")
    assert got["aux_layer_ids"] == ids
