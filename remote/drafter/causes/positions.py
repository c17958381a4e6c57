"""Position causes: the draft sees other positions than it was trained for.

* ``rope-differs``: the draft's rope (theta, scaling type and factors) differs from the target's.
  A trainer builds the draft's rope from the target's config, and a converter that drops
  ``rope_scaling`` serves the draft with default rope (speculators PR #574: acceptance falls at long
  context). The evidence is the largest angle the two rotations disagree by within the served context.
* ``context-beyond-training``: the served context (the serve profile's ``context_length``, else the
  target's ``max_position_embeddings``) exceeds the draft's ``max_position_embeddings``, or, where a
  context was given, the longest sequence in the dumps (sglang #6783: a 2,048-position draft serves
  worse than no draft beyond 2k; speculators PR #684 added sliding-window drafts for it). The
  evidence is the served layout's step-0 accuracy by position bucket (report ``accuracy_by_position``).
"""
from __future__ import annotations

import math
import shlex
from typing import Any

import torch

from ..model import rope
from ..model.rope import RopeSpec
from ..scoring.metrics import StepCounts
from . import draft_fields
from .facts import Facts

ROPE_ID = "rope-differs"
CONTEXT_ID = "context-beyond-training"
#: keys that size a table rather than shape the rotation: never a rope difference by themselves
_SIZE_KEYS = ("max_position_embeddings",)


def check(facts: Facts) -> list[dict[str, Any]]:
    return _rope_differs(facts) + _context(facts)


def _target_rope(facts: Facts) -> tuple[RopeSpec, dict[str, Any]] | None:
    verifier = facts.ctx.verifier
    if verifier is None or not verifier.config:
        return None
    try:
        return RopeSpec.from_config(verifier.config), verifier.config
    except (TypeError, ValueError, AttributeError):
        return None   # a target config the loader's checks never saw: no comparison, no guess


#: rope types that rotate a text token as default rope does: multimodal rope (Qwen2-VL and later) gives a
#: text position the same index in every section, so for the text a draft sees it is the default rotation
_AS_DEFAULT = {"mrope": ("mrope_section", "mrope_interleaved")}


def _shape(spec: RopeSpec) -> dict[str, Any]:
    """What shapes the rotation (the table's size left out), multimodal rope read as the default one."""
    shape = {k: v for k, v in spec.to_dict().items() if k not in _SIZE_KEYS}
    drop = _AS_DEFAULT.get(str(shape.get("rope_type")))
    if drop is not None:
        shape = {k: v for k, v in shape.items() if k not in drop}
        shape["rope_type"] = "default"
    return shape


def _describe(shape: dict[str, Any]) -> str:
    """``llama3 rope, theta 500000 (factor 8.0, ...)``: the rotation in one phrase."""
    rest = ", ".join(f"{k} {v}" for k, v in shape.items() if k not in ("rope_type", "rope_theta"))
    return f"{shape.get('rope_type')} rope, theta {shape.get('rope_theta'):g}" + (f" ({rest})" if rest else "")


def served_context(facts: Facts) -> tuple[int | None, str]:
    """The context the host serves (the profile's context_length), else the target's max_position_embeddings."""
    if facts.opts.served_context is not None:
        return facts.opts.served_context, "the serve profile's context_length"
    target = facts.ctx.verifier.config if facts.ctx.verifier is not None else {}
    value = target.get("max_position_embeddings") if isinstance(target, dict) else None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value, "the target's max_position_embeddings"
    return None, ""


def _angle_gap(draft: RopeSpec, target: RopeSpec, head_dim: int, positions: int) -> float | None:
    """The largest difference (radians, wrapped to [0, pi]) between the two rotations' angles over
    positions 0..positions-1 (sampled: 64 positions spread over the range, the last included)."""
    try:
        f_d, _ = rope.inv_freq(draft, head_dim)
        f_t, _ = rope.inv_freq(target, head_dim)
    except Exception:   # noqa: BLE001 - a rope type the evaluator cannot build: the keys still differ
        return None
    if f_d.shape != f_t.shape:
        return None
    pos = torch.linspace(0, max(positions - 1, 0), 64, dtype=torch.float64).round()
    diff = torch.remainder(pos[:, None] * (f_d.double() - f_t.double())[None, :], 2 * math.pi)
    return float(torch.minimum(diff, 2 * math.pi - diff).max())


def _rope_differs(facts: Facts) -> list[dict[str, Any]]:
    found = _target_rope(facts)
    if found is None:
        return []
    target, _ = found
    if not (math.isfinite(target.theta) and target.theta > 0):
        return []   # a target config no engine would load: nothing to compare the draft with
    draft = facts.ctx.draft.arch.rope
    mine, theirs = _shape(draft), _shape(target)
    keys = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
    if not keys:
        return []
    fields = draft_fields.read(facts)
    served, _ = served_context(facts)
    gap = _angle_gap(draft, target, facts.ctx.draft.arch.head_dim, served or draft_fields.DEFAULT_MAX_POSITIONS)
    span = served or draft_fields.DEFAULT_MAX_POSITIONS
    text = (f"The draft's rope is {_describe(mine)}, its target's {_describe(theirs)} (differing: {', '.join(keys)}): "
            f"a trainer builds the draft's rope from the target's config, so the draft was trained with the "
            f"target's positions and the engine serves it with others (speculators PR #574: rope_scaling dropped "
            f"in conversion)"
            + (f"; over the first {span:,} positions the two rotations disagree by up to {gap:.2f} rad."
               if gap is not None else "."))
    copy = "rope_parameters" if "rope_parameters" in (facts.ctx.verifier.config if facts.ctx.verifier else {}) \
        else "rope_theta and rope_scaling"
    under = f" under {fields.prefix.rstrip('.')}" if fields.prefix else ""
    target_path = shlex.quote(str(facts.ctx.verifier.path)) if facts.ctx.verifier else "the target"
    fix = (f"Copy {copy} from the target's config.json ({target_path}) into the draft's config "
           f"{shlex.quote(fields.path)}{under}, unless the draft was really trained with its own rope "
           "(its training config says which).")
    evidence = {"keys": keys, "draft": mine, "target": theirs, "max_angle_gap_rad": gap,
                "served_context": served}
    return [{"id": ROPE_ID, "severity": "warn", "text": text, "evidence": evidence, "fix": fix}]


def _counts(facts: Facts) -> StepCounts | None:
    res = facts.res
    score = res.full.get("served") or res.full.get("best")
    return (score.counts(res.basis) or score.data) if score is not None else None


def _longest(facts: Facts) -> int | None:
    """Tokens in the longest sample scored (the served layout's counts), None when none was."""
    counts = _counts(facts)
    return counts.longest or None if counts is not None else None


def by_position(facts: Facts) -> list[dict[str, Any]]:
    """The served (else best) layout's step-0 accuracy by position bucket, on the report's basis."""
    counts = _counts(facts)
    return counts.by_position() if counts is not None else []


def _context(facts: Facts) -> list[dict[str, Any]]:
    served, source = served_context(facts)
    if served is None:
        return []
    fields = draft_fields.read(facts)
    trained = fields.max_position_embeddings or draft_fields.DEFAULT_MAX_POSITIONS
    longest = _longest(facts) if facts.opts.served_context is not None else None
    past_config = served > trained
    past_data = longest is not None and served > longest
    if not (past_config or past_data):
        return []
    buckets = by_position(facts)
    decay = ", ".join(f"{b['from']}-{b['to']}: {b['acc']:.3f}" for b in buckets if b["acc"] is not None)
    why = []
    if past_config:
        given = "" if fields.max_position_embeddings else f" (absent: {trained:,}, the Llama default)"
        why.append(f"the draft's max_position_embeddings is {trained:,}{given}")
    if past_data:
        why.append(f"the longest sequence scored in the dumps has at most {longest:,} tokens")
    text = (f"The host serves a context of {served:,} positions ({source}), but {' and '.join(why)}: beyond that "
            "the draft drafts at positions it never trained on, and acceptance falls with position "
            "(sglang #6783: a 2,048-position draft served below no draft past 2k)"
            + (f"; step-0 accuracy by position here: {decay}." if decay else "."))
    fix = ("Train (or fine-tune) the draft on sequences as long as the served context, or serve a smaller "
           f"context (the serve profile's context_length <= {min(trained, longest or trained):,}), or use a "
           "sliding-window draft (EAGLE 3.1; speculators PR #684), keeping max_position_embeddings in "
           f"{shlex.quote(fields.path)} what the draft was trained for.")
    evidence = {"served_context": served, "served_context_from": source,
                "draft_max_position_embeddings": fields.max_position_embeddings, "longest_scored": longest,
                "accuracy_by_position": buckets}
    return [{"id": CONTEXT_ID, "severity": "warn", "text": text, "evidence": evidence, "fix": fix}]
