"""``algorithm-eagle-not-eagle3`` (failure-modes.md #3): an EAGLE-3 draft (it has the fc over the
target's aux states) that the engine would run as EAGLE-1/2, because its config declares EAGLE
(speculators_model_type or speculators_config.algorithm "eagle", or a flat ``LlamaForCausalLMEagle``)
or because the host's serve profile launches ``--speculative-algorithm EAGLE`` / vLLM method
``eagle``. The engine then skips the fc silently (the widths happen to match) and accepts nothing:
accept length exactly 1.0 (SGLang #21272)."""
from __future__ import annotations

import shlex

from .facts import Facts
from .finding import Finding

ID = "algorithm-eagle-not-eagle3"
#: what the serve side passes as --serve-algorithm when a profile sets one that is not EAGLE-3
EAGLE_NAMES = ("eagle", "nextn")


def check(facts: Facts) -> list[Finding]:
    info, opts, res = facts.ctx.info, facts.opts, facts.res
    declared = info.algorithm
    launched = (opts.serve_algorithm or "").lower() or None
    from_config = declared == "eagle"
    from_launch = launched in EAGLE_NAMES
    if not (from_config or from_launch):
        return []
    served = res.full.get("served") or res.full.get("best")
    counts = (served.counts(res.basis) or served.data) if served is not None else None
    as_eagle3 = counts.accept_length(opts.steps) if counts is not None else None
    why = []
    if from_config:
        why.append(f"its config ({info.config_path}) declares {info.algorithm_source}")
    if from_launch:
        why.append(f"the host's serve profile launches it with {opts.serve_algorithm!r}")
    text = (f"This is an EAGLE-3 draft (its fc takes {info.arch.num_aux} aux states), but "
            f"{' and '.join(why)}: the engine runs it as EAGLE-1/2, skips the fc without an error and accepts "
            f"nothing, accept length exactly 1.0 (SGLang #21272)"
            + (f", against {as_eagle3:.2f} predicted as an EAGLE-3 draft at K={opts.steps}." if as_eagle3 else "."))
    ckpt = shlex.quote(str(opts.ckpt))
    fixes = []
    if from_config:
        fixes.append(f"declare EAGLE-3 in {shlex.quote(info.config_path)}: architectures "
                     "[\"LlamaForCausalLMEagle3\"] (flat) or speculators_model_type and "
                     "speculators_config.algorithm \"eagle3\" (speculators)")
    if from_launch:
        fixes.append("remove the speculative algorithm from the serve profile's extra_args in hosts.yaml "
                     "(`invoke serve` launches --speculative-algorithm EAGLE3 / method eagle3 itself)")
    evidence = {"declared_algorithm": declared, "launch_algorithm": opts.serve_algorithm,
                "accept_length_as_eagle": 1.0, "accept_length_as_eagle3": as_eagle3, "steps": opts.steps,
                "num_aux": info.arch.num_aux}
    return [Finding(id=ID, severity="bad", text=text, evidence=evidence,
                    fix="; ".join(fixes)[0].upper() + "; ".join(fixes)[1:] + f" (draft {ckpt}).")]
