"""Layer-id causes (failure-modes.md #1 and #2), decided by the engine the host serves with, its
version (remote/eagle/engine_rules.py) and the draft config:

* ``ids-missing-engine-default``: the engine reads no ids, so it captures its default layers;
* ``layer-convention-shift``: the engine turns the ids into other layers than the ones the draft was
  trained on, and another engine's (or version's, or the trainer's slot) convention turns them into
  exactly those: the ids were written for that convention;
* ``layer-ids-wrong``: the engine feeds other layers and no convention explains it;
* ``final-boundary-uncapturable``: the draft needs the final layer's output, which this engine
  version cannot capture (SGLang captures inside its decoder loop).

The layers the draft was trained on are the verdict's best layout (layouts.py), scored on the dumps.
"""
from __future__ import annotations

import shlex
from typing import Any

from ...eagle import convention, engine_rules
from ...eagle.engine_rules import FIRST_IS_1, KEEP_IF_FINAL, PLUS1, RULE_TEXT, THROUGH
from ..verdict.layouts import STATUS_MATCH, STATUS_MISMATCH
from .facts import Facts
from .finding import Finding

SLOT_SHIFT = "slot-shift"


def check(facts: Facts) -> list[Finding]:
    case = _Case.of(facts)
    if case is None:
        return []
    if case.ids is None:
        return [case.missing()]
    if case.fed == case.trained:
        return [case.uncapturable()] if max(case.fed) > case.last else []
    if case.fed_is_fine():
        return []
    why = case.shift()
    return [case.shifted(why) if why else case.wrong()]


class _Case:
    """One draft's ids as the serving engine reads them, what it captures, and what training fed."""

    def __init__(self, facts: Facts, engine: str, ids: list[int] | None, slot_ids: list[int], n: int) -> None:
        self.facts, self.engine, self.ids, self.slot_ids, self.n = facts, engine, ids, slot_ids, n
        opts, ctx = facts.opts, facts.ctx
        given = opts.engine_version if opts.engine in (None, engine) else None
        self.version, self.assumed = engine_rules.effective(engine, given)
        config = ctx.verifier.config if ctx.verifier is not None else {}
        model_type = config.get("model_type")
        self.model_type = model_type if isinstance(model_type, str) else None
        self.rule = engine_rules.id_rule(engine, self.version, self.model_type)
        self.fed = (engine_rules.boundaries(self.rule, ids, n) if ids
                    else convention.default_boundaries(n))
        self.trained = sorted(slot_ids[s] + 1 for s in facts.res.verdict.best_slots)
        self.last = engine_rules.last_boundary(engine, self.version, self.model_type, n)

    @classmethod
    def of(cls, facts: Facts) -> _Case | None:
        """None when there is nothing to judge: no slot layers, no layer count, or no decided verdict."""
        ctx, res = facts.ctx, facts.res
        slot_ids, n = ctx.dumps.slots.layer_ids, ctx.num_layers
        if slot_ids is None or n is None or res.verdict.status not in (STATUS_MATCH, STATUS_MISMATCH):
            return None
        engine = facts.opts.engine or convention.serving_convention(ctx.info.format)
        by_engine = ctx.info.ids_by_engine
        ids = by_engine.get(engine) if by_engine else ctx.info.configured_layer_ids
        return cls(facts, engine, list(ids) if ids else None, list(slot_ids), n)

    # -- what is said about the engine ----------------------------------------------------------
    @property
    def name(self) -> str:
        version = f"{convention.ENGINE_NAME[self.engine]} {self.version}"
        return version + (" (assumed: the newest version read; pass --engine-version)" if self.assumed else "")

    def said(self, bounds: list[int]) -> str:
        """Boundaries in the serving engine's own ids, the convention named (one per screen)."""
        return convention.boundaries_text(bounds, self.engine)

    @property
    def target(self) -> str:
        return f"a {self.model_type} target" if self.model_type else "this target"

    @property
    def field(self) -> str:
        return " then ".join(f"`{f}`" for f in convention.READS[self.engine])

    # -- scores -------------------------------------------------------------------------------
    def _slots(self, bounds: list[int]) -> tuple[int, ...] | None:
        try:
            return tuple(self.slot_ids.index(b - 1) for b in bounds)
        except ValueError:
            return None

    def _score(self, bounds: list[int]) -> tuple[float | None, float | None]:
        """(step-0 accuracy, predicted accept length) of the layout ``bounds`` on the verdict's basis:
        from the metrics pass when it measured that layout, else step 0 from the scan; None: not in the dump."""
        res, slots = self.facts.res, self._slots(bounds)
        if slots is None:
            return None, None
        for score in res.full.values():
            if score.slots == slots:
                counts = score.counts(res.basis) or score.data
                return counts.full_acc()[0], counts.accept_length(self.facts.opts.steps)
        scanned = res.scan.get(slots)
        return (scanned.step0(res.basis) if scanned is not None else None), None

    def evidence(self) -> dict[str, Any]:
        fed_acc, fed_len = self._score(self.fed)
        trained_acc, trained_len = self._score(self.trained)
        return {"engine": self.engine, "engine_version": self.version, "version_assumed": self.assumed,
                "target_model_type": self.model_type, "num_hidden_layers": self.n, "configured_ids": self.ids,
                "rule": self.rule, "fed_boundaries": self.fed, "trained_boundaries": self.trained,
                "last_capturable_boundary": self.last, "fed_step0_acc": fed_acc, "trained_step0_acc": trained_acc,
                "fed_accept_length": fed_len, "trained_accept_length": trained_len,
                "basis": self.facts.res.basis}

    def fed_is_fine(self) -> bool:
        """The fed layout is in the dump and the verdict found it as good as the trained one."""
        verdict = self.facts.res.verdict
        slots = self._slots(self.fed)
        return (slots is not None and verdict.status == STATUS_MATCH and verdict.served_slots is not None
                and tuple(verdict.served_slots) == slots)

    def _scores(self) -> str:
        """Step-0 accuracies only: the accept lengths are the verdict's figures (said once, in its panel)."""
        fed_acc, fed_len = self._score(self.fed)
        trained_acc, _ = self._score(self.trained)
        fed = ("the layers fed are not in the dump, so they cannot be scored" if fed_acc is None
               else f"as fed, the draft scores step-0 accuracy {fed_acc:.3f}"
               + ("" if fed_len is not None else " (layout scan)"))
        trained = "n/a" if trained_acc is None else f"{trained_acc:.3f}"
        return (f"{fed[0].upper()}{fed[1:]}; on the layers it was trained on, {trained} "
                f"({self.facts.res.basis} targets).")

    # -- fixes ----------------------------------------------------------------------------------
    def _fix(self) -> str:
        ckpt = shlex.quote(str(self.facts.opts.ckpt))
        if max(self.trained) > self.last:
            return self._final_fix()
        ids = ",".join(str(b - 1) for b in self.trained)
        fmt = self.facts.ctx.info.format
        if self.engine == convention.SGLANG and convention.serving_convention(fmt) != convention.SGLANG:
            # draft-config writes a speculators config's own (vLLM) field, which SGLang never reads
            field = convention.READS[self.engine][0]
            return (f"Serve SGLang a flat-format copy of {ckpt}: SGLang reads only `{field}`, so "
                    f"`invoke draft-flat --ckpt {ckpt} --layer-ids {ids}` writes one with [{ids.replace(',', ', ')}] "
                    f"there (SGLang ids) beside it, then serve that copy; or serve this {fmt} config with vLLM")
        fix = f"`invoke draft-config --ckpt {ckpt} --layer-ids {ids}`"   # in backticks: shown, it names the program
        sglang = self.engine == convention.SGLANG
        native = engine_rules.captures_embedding(self.engine, self.version, self.model_type)
        if sglang and ((0 in self.trained and not native) or self.rule == FIRST_IS_1):
            fix += (" and `invoke patch-sglang.apply` (SGLang needs the capture patch for the embedding, -1, and "
                    "to add 1 to ids whose first is not 1)" if self.rule == FIRST_IS_1
                    else " and `invoke patch-sglang.apply` (stock SGLang cannot capture the embedding, -1)")
        return fix + " (SGLang ids; draft-config writes them in the config's own convention)"

    def _final_fix(self) -> str:
        return ("Serve with vLLM, which captures every boundary 0..n, or retrain the draft on layers "
                f"{convention.ENGINE_NAME[self.engine]} captures (boundaries 0..{self.last}, SGLang ids "
                f"-1..{self.last - 1})")

    # -- findings -------------------------------------------------------------------------------
    def _finding(self, fid: str, severity: str, text: str, fix: str | None = None) -> Finding:
        return Finding(id=fid, severity=severity, text=text, evidence=self.evidence(), fix=fix or self._fix())

    def missing(self) -> Finding:
        default = convention.default_boundaries(self.n)
        same = self.fed == self.trained
        text = (f"The draft config has no aux layer ids where {convention.ENGINE_NAME[self.engine]} reads them "
                f"({self.field}), so {self.name} captures its default (after layers 2, n//2 and n-3): layers "
                f"{self.said(default)} of this {self.n}-layer target, while the draft was trained on layers "
                f"{self.said(self.trained)}. " + ("They happen to be the same, but only by default: write them down. "
                                              if same else "") + self._scores())
        return self._finding("ids-missing-engine-default", "warn" if same else "bad", text)

    def uncapturable(self) -> Finding:
        text = (f"The draft was trained on layers {self.said(self.trained)}, which include the final "
                f"layer's output (boundary {self.n} of {self.n}); {self.name} captures inside its decoder loop, "
                f"up to boundary {self.last}, so it cannot feed it (SGLang #32334, vLLM #46788): the server "
                f"crashes or captures fewer states than the draft's fc takes. " + self._scores())
        return self._finding("final-boundary-uncapturable", "bad", text, self._final_fix())

    def shift(self) -> str | None:
        """The convention under which the configured ids mean the trained layers, if one does."""
        assert self.ids is not None
        for rule in (PLUS1, THROUGH, FIRST_IS_1, KEEP_IF_FINAL):
            if rule != self.rule and engine_rules.boundaries(rule, self.ids, self.n) == self.trained:
                return rule
        if sorted([0, *self.fed[:-1]]) == self.trained:
            return SLOT_SHIFT
        return None

    def shifted(self, why: str) -> Finding:
        assert self.ids is not None
        reads = (f"{self.name} reads {self.ids} from {self.field} and, on {self.target}, "
                 f"{RULE_TEXT[self.rule]}: it feeds layers {self.said(self.fed)}")
        if why == SLOT_SHIFT:
            how = (f"the trainer's slot convention explains it: the draft was trained on the embedding and the "
                   f"first {len(self.fed) - 1} of those layers, {self.said(self.trained)} (a dump of the embedding "
                   f"then layers {self.said(self.fed)}, of which training took all but the last slot, as "
                   "speculators' hidden_states[:-1] does), so the list is shifted by one slot")
        else:
            how = (f"the draft was trained on layers {self.said(self.trained)}, which is what these ids mean "
                   f"for a reader that {RULE_TEXT[why]}: the ids were written in that convention")
        tail = (f" Boundary {max(self.fed)} is beyond the last one it captures ({self.last}): the server "
                "crashes or captures fewer states (SGLang #32334)." if max(self.fed) > self.last else "")
        text = f"{reads}, but {how}.{tail} {self._scores()}"
        return self._finding("layer-convention-shift", "bad", text)

    def wrong(self) -> Finding:
        assert self.ids is not None
        text = (f"{self.name} reads {self.ids} from {self.field} and {RULE_TEXT[self.rule]}: it feeds the states "
                f"layers {self.said(self.fed)}, but the draft was trained on layers {self.said(self.trained)}, and no "
                f"engine's, version's or trainer's convention turns these ids into them: the ids are simply "
                f"wrong. {self._scores()}")
        return self._finding("layer-ids-wrong", "bad", text)
