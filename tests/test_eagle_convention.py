"""remote/eagle/convention: which field each engine reads, what it captures, and the usable id range."""
from __future__ import annotations

import pytest

from remote.eagle import convention as cv

FLAT = {"architectures": ["LlamaForCausalLMEagle3"],
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 15, 28]}}
SPEC = {"speculators_model_type": "eagle3", "eagle_aux_hidden_state_layer_ids": [2, 16, 29]}


def test_sglang_reads_eagle_config_as_output_of_layer():
    r = cv.read("sglang", FLAT, "flat", 32)
    assert r.field == "eagle_config.eagle_aux_hidden_state_layer_ids"
    assert r.ids == [1, 15, 28] and r.boundaries == [2, 16, 29]
    assert not r.fallback and r.out_of_range == [] and not r.needs_embedding


def test_sglang_ignores_top_level_ids_and_falls_back_to_its_default():
    r = cv.read("sglang", SPEC, "speculators", 32)
    assert r.fallback and r.field is None and r.ids is None
    assert r.boundaries == [2, 16, 29] == cv.default_boundaries(32)
    assert r.ignored == {"eagle_aux_hidden_state_layer_ids": [2, 16, 29]}
    text = cv.explain(r, 32)
    assert "silently falls back" in text and "not read by SGLang" in text


def test_vllm_reads_top_level_first_then_eagle_config_as_after_k_layers():
    both = {**FLAT, "eagle_aux_hidden_state_layer_ids": [0, 3, 5]}
    r = cv.read("vllm", both, "flat", 32)
    assert r.field == "eagle_aux_hidden_state_layer_ids" and r.boundaries == [0, 3, 5]
    assert r.ignored == {"eagle_config.eagle_aux_hidden_state_layer_ids": [1, 15, 28]}
    flat_only = cv.read("vllm", FLAT, "flat", 32)
    assert flat_only.field == "eagle_config.eagle_aux_hidden_state_layer_ids"
    assert flat_only.boundaries == [1, 15, 28]            # one layer earlier than SGLang's [2, 16, 29]
    text = cv.explain(flat_only, 32)
    assert "SGLang's convention" in text and "[2, 16, 29]" in text


@pytest.mark.parametrize("engine, ids, bad", [
    ("sglang", [-1, 2, 30], []), ("sglang", [-1, 2, 31], [31]), ("sglang", [-2, 3], [-2]),
    ("vllm", [0, 3, 32], []), ("vllm", [-1, 33], [-1, 33]),
])
def test_usable_range_per_engine(engine, ids, bad):
    key = {"sglang": "eagle_config", "vllm": None}[engine]
    config = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": ids}} if key else {
        "eagle_aux_hidden_state_layer_ids": ids}
    assert cv.read(engine, config, "flat", 32).out_of_range == bad


def test_embedding_ids_and_malformed_values():
    assert cv.read("sglang", {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [-1, 1, 3]}},
                   "flat", 6).needs_embedding
    assert cv.read("vllm", {"eagle_aux_hidden_state_layer_ids": [0, 2, 4]}, "speculators", 6).needs_embedding
    bad = cv.read("sglang", {"eagle_config": {"eagle_aux_hidden_state_layer_ids": "1,2,3"}}, "flat", 6)
    assert bad.malformed == {"eagle_config.eagle_aux_hidden_state_layer_ids": "1,2,3"} and bad.fallback
    empty = {"eagle_aux_hidden_state_layer_ids": [], "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}}
    assert cv.read("vllm", empty, "flat", 6).ids == [1, 2, 3]           # vLLM: `if not layer_ids` -> next
    assert cv.read("sglang", {"eagle_config": {"eagle_aux_hidden_state_layer_ids": []}}, "flat", 6).malformed
    with pytest.raises(ValueError, match="unknown engine"):
        cv.read("tgi", FLAT, "flat", 6)


def test_conventions_round_trip_and_format_mapping():
    for engine in cv.ENGINES:
        assert cv.from_boundaries(engine, cv.to_boundaries(engine, [-1, 4, 9])) == [-1, 4, 9]
    assert cv.serving_convention("flat") == "sglang" and cv.serving_convention("speculators") == "vllm"
    assert cv.draft_algorithm(FLAT) == "eagle3" and cv.draft_algorithm(SPEC) == "eagle3"
    assert cv.draft_algorithm({"architectures": ["LlamaForCausalLMEagle"]}) == "eagle"
    assert cv.draft_algorithm({"speculators_model_type": "EAGLE"}) == "eagle"
    assert cv.draft_algorithm({"architectures": ["LlamaForCausalLM"]}) is None
