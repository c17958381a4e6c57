"""Causes that depend on the host engine's version (``--engine``/``--engine-version``, which
`invoke test-drafter` reads from the host's serve profile and package metadata):

* ``multi-layer-draft``: a draft with more than one decoder layer. SGLang's EAGLE-3 draft model
  refuses it ("EAGLE3 currently only supports 1 layer", ``LlamaForCausalLMEagle3``; its multi-layer
  EAGLE is for MTP targets only, sglang #36536); vLLM runs several layers from the release after
  PR #26164 (merged 2025-10-03: 0.11.1), and reports later draft positions collapsing with two
  (vllm #33330, open).
* ``engine-known-regression``: the version is in a range remote/eagle/regressions.py lists.
"""
from __future__ import annotations

import shlex
from typing import Any

from ...eagle import convention, engine_rules, regressions
from .facts import Facts

LAYERS_ID = "multi-layer-draft"
REGRESSION_ID = "engine-known-regression"
#: the first vLLM release that builds more than one EAGLE-3 decoder layer (PR #26164)
VLLM_MULTI_LAYER = (0, 11, 1)


def check(facts: Facts) -> list[dict[str, Any]]:
    return _multi_layer(facts) + _regressions(facts)


def _engine(facts: Facts) -> tuple[str | None, str | None]:
    engine = facts.opts.engine
    version = facts.opts.engine_version if engine else None
    return engine, version


def _steps(facts: Facts) -> list[float | None]:
    res = facts.res
    score = res.full.get("served") or res.full.get("best")
    counts = (score.counts(res.basis) or score.data) if score is not None else None
    return counts.cond_acc() if counts is not None else []


def _multi_layer(facts: Facts) -> list[dict[str, Any]]:
    layers = facts.ctx.draft.arch.num_layers
    if layers <= 1:
        return []
    engine, version = _engine(facts)
    parsed = engine_rules.parse(version) if version else None
    cond = _steps(facts)
    per_step = ", ".join(f"step {k}: {a:.3f}" for k, a in enumerate(cond) if a is not None)
    severity = "warn"
    if engine == convention.SGLANG:
        severity = "bad"
        served = (f"SGLang{' ' + version if version else ''} refuses it at load (\"EAGLE3 currently only supports "
                  "1 layer\"; its multi-layer EAGLE is for MTP targets only, sglang #36536)")
    elif engine == convention.VLLM and parsed is not None and parsed[:3] < VLLM_MULTI_LAYER:
        severity = "bad"
        served = (f"vLLM {version} builds one decoder layer (several came with PR #26164, in 0.11.1), so the "
                  "draft does not run as trained")
    else:
        name = f"vLLM {version}" if engine == convention.VLLM and version else "vLLM (0.11.1 on)"
        every = "both" if layers == 2 else f"all {layers}"
        served = (f"{name} runs {every} layers, but reports later draft positions collapsing with two "
                  "(vllm #33330, open); SGLang refuses it (sglang #36536)")
    text = (f"The draft has {layers} decoder layers: {served}."
            + (f" Its conditional accuracy per draft step on the dumps ({per_step}) is what a server's per-position "
               "acceptance should reach; later positions below it are that collapse." if per_step else ""))
    draft = shlex.quote(str(facts.opts.ckpt))
    fix = ("Serve it with vLLM 0.11.1 or newer and bench it (`invoke bench`) against this prediction, or retrain "
           f"a one-layer draft (num_hidden_layers 1 in the training config of {draft}).")
    evidence = {"num_layers": layers, "engine": engine, "engine_version": version, "cond_acc": cond}
    return [{"id": LAYERS_ID, "severity": severity, "text": text, "evidence": evidence, "fix": fix}]


def _target_type(facts: Facts) -> str:
    verifier = facts.ctx.verifier
    if verifier is None:
        return ""
    cfg = verifier.config
    arch = cfg.get("architectures")
    names = [a for a in arch if isinstance(a, str)] if isinstance(arch, list) else []
    kind = cfg.get("model_type")
    return " ".join(([kind] if isinstance(kind, str) else []) + names)


def _regressions(facts: Facts) -> list[dict[str, Any]]:
    engine, version = _engine(facts)
    if engine is None or version is None:
        return []   # an assumed version is no evidence of a regression
    found = regressions.affecting(engine, version, _target_type(facts))
    out = []
    name = convention.ENGINE_NAME.get(engine, engine)
    for r in found:
        release = f"move to {name} {r.fixed_in}" if r.fixed_in else "no release is confirmed to fix it"
        text = (f"The host serves with {name} {version}, inside the range {r.first} to {r.last} of {r.issue}: "
                f"{r.what}; {release}.")
        fix = (f"Move to {name} {r.fixed_in} or newer." if r.fixed_in else r.fix[0].upper() + r.fix[1:] + ".")
        evidence = {"engine": engine, "engine_version": version, "issue": r.issue, "affected": [r.first, r.last],
                    "fixed_in": r.fixed_in}
        out.append({"id": REGRESSION_ID, "severity": "warn", "text": text, "evidence": evidence, "fix": fix})
    return out
