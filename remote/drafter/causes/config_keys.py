"""``config-key-ignored`` (failure-modes.md #4): the draft was trained with a config key (a norm
flag) that the serving engine's version does not read, so it serves another model. Which engine
reads which key from which version is data (remote/eagle/engine_rules.py KEYS); the evidence is the
draft scored twice on the same samples and layout, as trained and as the engine runs it (the
evaluation's metrics pass scores the variant ``as_engine_runs`` builds)."""
from __future__ import annotations

import copy
import dataclasses
import shlex
from typing import Any

from ...eagle import convention, engine_rules
from ..measures import CONFIG_KEY_IGNORED
from ..model.draft import Eagle3Draft
from .facts import Facts
from .finding import Finding

ID = "config-key-ignored"
#: a step-0 drop at least this large makes the finding ``bad``; below it, ``warn``
BAD_DROP = 0.02
#: the draft's structure flag behind each key (DraftArch field)
FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")


def engine_of(facts_engine: str | None, fmt: str) -> str:
    return facts_engine or convention.serving_convention(fmt)


def ignored(draft: Eagle3Draft, engine: str, version: str | None) -> list[engine_rules.KeyRead]:
    """The keys this draft was trained with that ``engine`` at ``version`` does not read."""
    on = [flag for flag in FLAGS if getattr(draft.arch, flag)]
    return engine_rules.ignored_keys(engine, version, on)


def as_engine_runs(draft: Eagle3Draft, keys: list[engine_rules.KeyRead]) -> Eagle3Draft:
    """The same weights with the ignored keys off (a shallow copy: the tensors are shared)."""
    variant = copy.copy(draft)
    off: dict[str, Any] = {k.key: False for k in keys}
    variant.arch = dataclasses.replace(draft.arch, **off)
    return variant


def check(facts: Facts) -> list[Finding]:
    measured = facts.measured(CONFIG_KEY_IGNORED)
    if not measured:
        return []
    trained, served = measured["as_trained"], measured["as_engine_runs"]
    if trained["step0_acc"] is None or served["step0_acc"] is None:
        return []
    drop = trained["step0_acc"] - served["step0_acc"]
    engine = convention.ENGINE_NAME[measured["engine"]]
    name = f"{engine} {measured['engine_version']}" + (
        " (assumed: the newest version read; pass --engine-version)" if measured["version_assumed"] else "")
    keys = measured["keys"]
    listed = "; ".join(f"`{k['key']}` ({k['what']}; {k['since']})" for k in keys)
    text = (f"The draft was trained with {listed}, which {name} ignores, so it serves another model: run as "
            f"{engine} runs it (layout {measured['layer_ids']}, {measured['samples']} samples, "
            f"{measured['basis']} targets), step-0 accuracy goes from {trained['step0_acc']:.3f} to "
            f"{served['step0_acc']:.3f} ({-drop:+.3f}) and the predicted accept length from "
            f"{trained['accept_length']:.2f} to {served['accept_length']:.2f}.")
    names = ", ".join(k["key"] for k in keys)
    readers = [k for k in keys if k["since_version"]]
    fix = (f"Serve with an engine version that reads {names}"
           + (f" ({'; '.join(k['since'] for k in readers)})" if readers else "")
           + (", e.g. vLLM 0.32" if measured["engine"] == convention.SGLANG else "")
           + f", or retrain the draft with {names} false (the training config of "
           f"{shlex.quote(str(facts.opts.ckpt))}).")
    evidence = {"engine": measured["engine"], "engine_version": measured["engine_version"],
                "version_assumed": measured["version_assumed"], "keys": [k["key"] for k in keys],
                "step0_acc_as_trained": trained["step0_acc"], "step0_acc_as_engine_runs": served["step0_acc"],
                "step0_change": -drop, "accept_length_as_trained": trained["accept_length"],
                "accept_length_as_engine_runs": served["accept_length"], "basis": measured["basis"]}
    return [Finding(id=ID, severity="bad" if drop >= BAD_DROP else "warn", text=text, evidence=evidence,
                    fix=fix)]


def describe(keys: list[engine_rules.KeyRead], engine: str) -> list[dict[str, Any]]:
    """The keys as the report's measurement holds them."""
    return [{"key": k.key, "what": k.what, "since": engine_rules.since_text(k, engine),
             "since_version": ".".join(map(str, k.since)) if k.since else None} for k in keys]
