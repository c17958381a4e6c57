"""``draft-head-replaced`` (failure-modes.md, more causes: vllm #27737, #28549): the draft ships its own
trained ``embed_tokens`` or ``lm_head``, but the serving engine's version replaces them with the target's
at load, so it serves another model.  The rules per engine and version are remote/drafter/model/headshare.py;
the evidence is the draft scored twice on the same samples and layout, with its own parts and with the
target's (the metrics pass scores the variant headshare.prepare builds)."""
from __future__ import annotations

import shlex
from typing import Any

from ...eagle import convention
from ..model.headshare import EMBED, ID
from .facts import Facts

#: a step-0 drop at least this large makes the finding ``bad``; below it, ``warn``
BAD_DROP = 0.02


def check(facts: Facts) -> list[dict[str, Any]]:
    measured = facts.extra.get(ID)
    if not measured:
        return []
    own, target = measured["own"], measured["target"]
    if own["step0_acc"] is None or target["step0_acc"] is None:
        return []
    drop = own["step0_acc"] - target["step0_acc"]
    engine = convention.ENGINE_NAME[measured["engine"]]
    name = f"{engine} {measured['engine_version']}" + (
        " (assumed: the newest version read; pass --engine-version)" if measured["version_assumed"] else "")
    parts = measured["parts"]
    listed = "; ".join(f"its {part} ({measured['differs'][part]:.3g} relative RMS from the target's), which {name} "
                       f"{rule}" for part, rule in parts.items())
    text = (f"The draft ships its own {' and '.join(parts)}, trained apart from the target's: {listed}. Run with the "
            f"target's in their place (layout {measured['layer_ids']}, {measured['samples']} samples, "
            f"{measured['basis']} targets), step-0 accuracy goes from {own['step0_acc']:.3f} to "
            f"{target['step0_acc']:.3f} ({-drop:+.3f}) and the predicted accept length from "
            f"{own['accept_length']:.2f} to {target['accept_length']:.2f}.")
    ckpt = shlex.quote(str(facts.opts.ckpt))
    fix = ("Serve with vLLM 0.12.0 or later, which keeps a draft's own distinct embed_tokens and lm_head "
           "(PR #28549)" if measured["engine"] == convention.VLLM else
           "Serve with vLLM 0.12.0 or later (PR #28549 keeps a draft's own parts; SGLang replaces them"
           + (", and its embed_tokens whenever target_hidden_size equals hidden_size)" if EMBED in parts else ")"))
    fix += (f", or retrain the draft of {ckpt} with the target's {' and '.join(parts)} frozen (what speculators "
            "0.9 does), so the replacement changes nothing.")
    evidence = {"engine": measured["engine"], "engine_version": measured["engine_version"],
                "version_assumed": measured["version_assumed"], "parts": sorted(parts),
                "relative_difference": {k: float(f"{v:.6g}") for k, v in measured["differs"].items()},
                "step0_acc_own": own["step0_acc"], "step0_acc_target_parts": target["step0_acc"],
                "step0_change": -drop, "accept_length_own": own["accept_length"],
                "accept_length_target_parts": target["accept_length"], "basis": measured["basis"]}
    return [{"id": ID, "severity": "bad" if drop >= BAD_DROP else "warn", "text": text, "evidence": evidence,
             "fix": fix}]
