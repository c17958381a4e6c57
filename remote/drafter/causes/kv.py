"""``draft-kv-dtype`` (failure-modes.md, more causes: vLLM's speculative ``kv_cache_dtype``, tokenspeed
#1012): the serve profile launches the target with an FP8 KV cache and the engine's version gives the
draft's cache the same dtype, so the draft attends over keys and values rounded to FP8 at scale 1.0.
The rule is remote/drafter/model/kvcache.py; the evidence is the draft scored with exact and with FP8-rounded
keys and values on the same samples and layout."""
from __future__ import annotations

from typing import Any

from ...eagle import convention
from ..model.kvcache import DRAFT_FIELD_SINCE, ID
from .facts import Facts

#: a step-0 drop at least this large makes the finding ``bad``; below it, ``warn``
BAD_DROP = 0.02
SINCE = ".".join(map(str, DRAFT_FIELD_SINCE))


def check(facts: Facts) -> list[dict[str, Any]]:
    measured = facts.extra.get(ID)
    if not measured:
        return []
    exact, fp8 = measured["exact"], measured["fp8"]
    if exact["step0_acc"] is None or fp8["step0_acc"] is None:
        return []
    drop = exact["step0_acc"] - fp8["step0_acc"]
    name = f"{convention.ENGINE_NAME[measured['engine']]} {measured['engine_version']}" + (
        " (assumed: the newest version read; pass --engine-version)" if measured["version_assumed"] else "")
    dtype = measured["target_kv_cache_dtype"]
    why = ("its speculative config sets no kv_cache_dtype of the draft's own, so the draft inherits it"
           if measured["draft_field"] else
           f"this version has no kv_cache_dtype of the draft's own (vLLM has one from {SINCE}), so the draft "
           "inherits it")
    text = (f"The serve profile launches the target with --kv-cache-dtype {dtype} and {name} gives the draft's KV "
            f"cache the same: {why}. With its keys and values stored as {dtype} at scale 1.0 (no calibrated KV "
            f"scales; {measured['samples']} samples, {measured['basis']} targets), the draft's step-0 "
            f"accuracy goes from {exact['step0_acc']:.3f} to {fp8['step0_acc']:.3f} ({-drop:+.3f}) and its predicted "
            f"accept length from {exact['accept_length']:.2f} to {fp8['accept_length']:.2f} (tokenspeed #1012: "
            "2.6-2.8 to 1.79 for a draft following its target's FP8 KV).")
    if measured["draft_field"]:
        fix = ("Keep the draft's KV in bf16 while the target's stays FP8: add \"kv_cache_dtype\": \"bfloat16\" to the "
               "speculative config the serve profile launches with (vLLM PR #48787: "
               "--speculative_config.kv_cache_dtype bfloat16), or drop --kv-cache-dtype from the profile's extra_args.")
    else:
        fix = (f"Serve with vLLM {SINCE} or later and set the speculative config's \"kv_cache_dtype\": \"bfloat16\" "
               "(PR #48787), or drop --kv-cache-dtype from the profile's extra_args (a bf16 cache for both).")
    evidence = {"engine": measured["engine"], "engine_version": measured["engine_version"],
                "version_assumed": measured["version_assumed"], "target_kv_cache_dtype": dtype,
                "draft_kv_cache_dtype": measured["draft_kv_cache_dtype"], "draft_field": measured["draft_field"],
                "step0_acc_exact_kv": exact["step0_acc"], "step0_acc_fp8_kv": fp8["step0_acc"],
                "step0_change": -drop, "accept_length_exact_kv": exact["accept_length"],
                "accept_length_fp8_kv": fp8["accept_length"], "basis": measured["basis"]}
    return [{"id": ID, "severity": "bad" if drop >= BAD_DROP else "warn", "text": text, "evidence": evidence,
             "fix": fix}]
