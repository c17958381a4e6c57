"""``target-rotated`` (failure-modes.md #7 and more causes: vllm-ascend #5974, #6914; vllm #36223): the
engine's own states (``--engine-states``, kept by a capture check) have the dumps' norms but hardly any
per-dimension agreement with them: the served target works in a rotated basis (QuaRot or another
rotation quantization), so the draft's fc reads every coordinate as something else.  Norms alone hide
it, as a cosine hid the embedding scale.  Measured by remote/drafter/scoring/agreement.py."""
from __future__ import annotations

from typing import Any

from .facts import Facts

ID = "target-rotated"
#: norms this close (engine / dump) are "the same size"; a rotation keeps them exactly
NORM_BAND = (0.8, 1.25)
#: below this mean cosine the coordinates disagree (matching states of a bf16 engine: about 0.99)
COSINE_MAX = 0.5
#: an orthogonal fit leaving less than this (relative) is one rotation
FIT_MAX = 0.2
FIX = ("Fold the rotation into the draft: multiply its fc.weight on the right by blockdiag(Q, ..., Q), one Q "
       "per aux slot, with the rotation matrix the quantizer saved (vllm-ascend #6914 does this at load; vllm "
       "#36223 proposes it), and un-rotate the embed_tokens it shares with the target (vllm-ascend #7038); or "
       "serve the unrotated target; or dump the rotated target's states and retrain the draft on them.")


def check(facts: Facts) -> list[dict[str, Any]]:
    engine = facts.res.engine_states or {}
    measured = engine.get("agreement")
    if not measured:
        return []
    rotated = [s for s in measured["slots"] if NORM_BAND[0] <= s["norm_ratio"] <= NORM_BAND[1]
               and s["cosine"] < COSINE_MAX]
    if not rotated:
        return []
    def span(key: str) -> str:
        values = [s[key] for s in rotated if s[key] is not None]
        lo, hi = min(values), max(values)
        return f"{lo:.3f}" if f"{lo:.3f}" == f"{hi:.3f}" else f"{lo:.3f} to {hi:.3f}"

    fits = [s["rotation_residual"] for s in rotated]
    fit = (f"; one orthogonal map fits each to {max(fits):.2g} relative residual or less"
           if all(f is not None and f < FIT_MAX for f in fits) else "")
    text = (f"The served target's states are the dumps' rotated: on {measured['rows']} rows of "
            f"{measured['samples']} engine-state samples (the capture check's, {engine.get('path')}), "
            f"{len(rotated)} of the {len(measured['slots'])} layers both hold (SGLang ids "
            f"{[s['layer_id'] for s in rotated]}) have norm ratio {span('norm_ratio')} (engine / dump) but mean "
            f"cosine {span('cosine')} and per-dimension correlation {span('dim_correlation')}{fit}. A rotation "
            "keeps every norm, so only the per-dimension agreement shows it; served, the draft's fc reads every "
            "coordinate as another." + _scores(facts, engine))
    evidence = {"rows": measured["rows"], "samples": measured["samples"], "norm_band": list(NORM_BAND),
                "cosine_max": COSINE_MAX, "slots": rotated, **_accepts(facts, engine)}
    return [{"id": ID, "severity": "bad", "text": text, "evidence": evidence, "fix": FIX}]


def _accepts(facts: Facts, engine: dict[str, Any]) -> dict[str, Any]:
    res = facts.res
    score = res.full.get("served") or res.full.get("best")
    counts = (score.counts(res.basis) or score.data) if score is not None else None
    rows = {row["role"]: row for row in engine.get("layouts", [])}
    on_engine = (rows.get("trained") or rows.get("served") or {}).get("accept_length")
    return {"accept_length_dumps": float(f"{counts.accept_length(facts.opts.steps):.6g}") if counts else None,
            "accept_length_engine_states": float(f"{on_engine:.6g}") if on_engine is not None else None,
            "steps": facts.opts.steps}


def _scores(facts: Facts, engine: dict[str, Any]) -> str:
    got = _accepts(facts, engine)
    if got["accept_length_dumps"] is None or got["accept_length_engine_states"] is None:
        return ""
    return (f" The draft's predicted accept length at K={got['steps']} is {got['accept_length_dumps']:.2f} on the "
            f"dumps and {got['accept_length_engine_states']:.2f} on the engine's states.")
