"""Layout diagnosis: which dump slots the draft was trained on, and what its config makes a server feed.

Ids are kept in SGLang's explicit-id convention (id = output of decoder layer id, -1 = the
embedding output; SGLang captures loop index id+1).  vLLM's id k is the state after k layers, i.e.
SGLang id k-1.  With null ids both engines fall back to capturing after layers [2, n//2, n-3].
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ...eagle import convention, formats
from ..scoring.stats import INCONCLUSIVE, SAME, Comparison

STATUS_MATCH, STATUS_MISMATCH, STATUS_UNKNOWN = "MATCH", "MISMATCH", "UNKNOWN"


@dataclass(frozen=True)
class Interpretation:
    """What one engine would capture for the configured ids, and whether the dump has it."""

    convention: str
    configured_ids: list[int] | None
    captured_ids: list[int] | None  # SGLang ids actually captured, ascending
    slots: list[int] | None  # dump slots holding them, or None
    missing: list[int]  # captured ids absent from the dump
    note: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def engine_default(num_layers: int | None) -> list[int] | None:
    """SGLang id list both engines capture when the draft config has no ids."""
    if num_layers is None:
        return None
    return convention.default_ids(convention.SGLANG, num_layers)


def interpret(configured: list[int] | None, slot_ids: Sequence[int] | None, num_layers: int | None,
              read_by: Mapping[str, list[int] | None] | None = None) -> list[Interpretation]:
    """The layouts the config implies under SGLang's and vLLM's conventions.

    ``read_by`` gives the ids each engine reads from the config (the engines read different fields:
    a flat config with only top-level ids is read by vLLM, while SGLang falls back to its default);
    without it, every engine reads ``configured``."""
    out = []
    for engine in convention.ENGINES:
        configured = read_by.get(engine) if read_by is not None else configured
        if configured is None:
            captured = engine_default(num_layers)
            note = ("no ids in the config: the engine captures its default "
                    + ("after layers [2, n/2, n-3]" if captured else "(unknown: num_hidden_layers unknown)"))
        else:
            captured = sorted(convention.convert(configured, engine, convention.SGLANG))
            note = ("id = output of layer id, -1 = embedding (SGLang captures index id+1)"
                    if engine == convention.SGLANG else "id = state after id layers, 0 = embedding")
        slots, missing = _locate(captured, slot_ids)
        out.append(Interpretation(engine, configured, captured, slots, missing, note))
    return out




def _locate(captured: list[int] | None, slot_ids: Sequence[int] | None) -> tuple[list[int] | None, list[int]]:
    if captured is None or slot_ids is None:
        return None, []
    missing = [c for c in captured if c not in slot_ids]
    if missing:
        return None, missing
    return [list(slot_ids).index(c) for c in captured], []


def slot_role(slot: int, slot_ids: Sequence[int] | None, final_slot: int | None) -> str:
    if slot == final_slot:
        return "final"
    if slot_ids is None:
        return "unknown"
    return "embedding" if slot_ids[slot] == -1 else f"layer {slot_ids[slot]}"


def describe(slots: Sequence[int], slot_ids: Sequence[int] | None, final_slot: int | None) -> str:
    """The slots' roles, ``layer k`` being the output of layer k: SGLang's ids, named as such."""
    roles = [slot_role(s, slot_ids, final_slot) for s in slots]
    named = " (SGLang ids)" if any(r.startswith("layer ") for r in roles) else ""
    return "[" + ", ".join(roles) + "]" + named


@dataclass(frozen=True)
class Measured:
    """One layout measured on every evaluated sample, on the verdict's basis."""

    slots: tuple[int, ...]
    step0: float | None
    accept_length: float


@dataclass(frozen=True)
class Evidence:
    """What the verdict is decided on.  Every accuracy in it comes from the metrics pass over all
    evaluated samples; the layout scan (a subset) only chose which layout is ``best``."""

    basis: str
    steps: int
    samples: int  # samples evaluated by the metrics pass
    scored_rows: int  # step-0 rows scored on the basis (0: nothing was scored)
    scan_layouts: int
    scan_samples: int
    best: Measured
    served: Measured | None  # None: the served layout is not in the dump
    comparison: Comparison | None  # best vs served; None when they are one layout or served is None
    chance_constant: float | None  # step-0 accuracy of always guessing the most frequent target
    chance_token: int | None  # that target (target vocab id)
    chance_current: float | None  # ... of guessing from the current token alone (cross-fitted)
    min_skill: float
    nonfinite: list[str]  # why some values were not finite (skipped files, NaN logits)
    total: int | None = None  # the sequential verdict: samples there were (``samples`` of them scored)


@dataclass
class Verdict:
    status: str
    fix_layer_ids: list[int] | None
    fix_layer_ids_vllm: list[int] | None
    needs_capture_patch: bool
    message: str  # the whole story in one paragraph: diagnosis, the figures behind it, advice
    basis: str
    best_slots: list[int]
    served_slots: list[int] | None
    tolerance: float
    reason: str | None = None  # why UNKNOWN: non_finite, nothing_scored, near_chance, no_layer_ids, inconclusive
    comparison: dict[str, Any] | None = None
    chance: dict[str, Any] | None = None
    # The message in parts, so a view can show each fact once: the figures the report holds as
    # numbers (accept lengths, the paired test) are in the message only, never in these two.
    diagnosis: str = ""  # what the engine will feed against what the draft was trained on
    advice: str = ""  # what to do (the ids to write and what serving them needs), or "Nothing to fix."

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Said:
    """One verdict's text in its three parts (full sentences each; ``figures`` may be empty)."""

    diagnosis: str
    figures: str = ""
    advice: str = ""

    @property
    def message(self) -> str:
        return " ".join(part for part in (self.diagnosis, self.figures, self.advice) if part)


def chance_summary(ev: Evidence) -> dict[str, Any] | None:
    """The chance level (the better hidden-state-blind guess, chance.py) and whether every layout
    stays near it: closes less than ``min_skill`` of the gap from it to perfect."""
    guesses = [g for g in (ev.chance_constant, ev.chance_current) if g is not None]
    if not guesses:
        return None
    level = max(guesses)
    top = max([m.step0 for m in (ev.best, ev.served) if m is not None and m.step0 is not None], default=None)
    threshold = level + ev.min_skill * (1.0 - level)
    return {"basis": ev.basis, "level": level, "constant_guess_acc": ev.chance_constant,
            "constant_guess_token": ev.chance_token, "current_token_acc": ev.chance_current,
            "min_skill": ev.min_skill, "threshold": threshold, "best_step0": top,
            "near_chance": top is not None and top <= threshold}


def embedding_advice(engine: str | None, fixing: bool) -> str:
    """What serving an embedding id (SGLang -1, vLLM 0) needs, for the engine the host serves with
    (None: both). vLLM captures boundary 0 natively (vllm-cpu.md); stock SGLang needs the patch."""
    sglang = ("apply the SGLang embedding-capture patch (`invoke patch-sglang.apply`): unpatched SGLang "
              "cannot capture the embedding output (-1)")
    vllm = "vLLM captures the embedding output (0) natively, so no patch is needed"
    if engine == convention.VLLM:
        return f"; {vllm}."
    if engine == convention.SGLANG:
        return f" and {sglang}." if fixing else f" (the ids include -1: {sglang})."
    return f"; to serve it with SGLang, {sglang}; {vllm}."


@dataclass(frozen=True)
class _Case:
    """What every branch of ``decide`` reads."""

    ev: Evidence
    served: Interpretation
    slot_ids: Sequence[int] | None
    final_slot: int | None
    fmt: str
    tolerance: float
    advise_for: str | None

    @property
    def where(self) -> str:
        ev = self.ev
        if ev.total is not None and ev.total != ev.samples:
            return (f"on {ev.samples} of {ev.total} samples, scored in a random order until the verdict was decided "
                    f"({ev.basis} targets)")
        return f"on all {ev.samples} evaluated samples ({ev.basis} targets)"

    @property
    def engine(self) -> str:
        return convention.ENGINE_NAME[self.served.convention]

    def describe(self, slots: Sequence[int]) -> str:
        """The slots' layers in the served engine's ids, named (one convention per verdict)."""
        if self.slot_ids is None:
            return describe(slots, self.slot_ids, self.final_slot)
        return self.ids([self.slot_ids[s] for s in slots])

    def ids(self, sglang_ids: list[int]) -> str:
        """SGLang-convention ids written in the served engine's convention, named."""
        engine = self.served.convention
        return convention.ids_text(convention.convert(sglang_ids, convention.SGLANG, engine), engine)

    def nothing_to_fix(self) -> str:
        patch = -1 in (self.served.captured_ids or [])
        return "Nothing to fix" + (embedding_advice(self.advise_for, False) if patch else ".")


def decide(ev: Evidence, served: Interpretation, slot_ids: Sequence[int] | None, final_slot: int | None,
           fmt: str, tolerance: float, advise_for: str | None = None) -> Verdict:
    """MATCH, MISMATCH or UNKNOWN (with ``reason``) from the measured evidence; see docs/drafter.md."""
    case = _Case(ev, served, slot_ids, final_slot, fmt, tolerance, advise_for)
    best = ev.best.slots
    fix = [slot_ids[s] for s in best] if slot_ids is not None else None
    fix_vllm = convention.convert(fix, convention.SGLANG, convention.VLLM) if fix is not None else None
    chance = chance_summary(ev)
    status, said, reason = _unusable(case, chance) or _judged(case, fix)
    with_fix = status == STATUS_MISMATCH
    patch = -1 in (fix or []) if with_fix else (status == STATUS_MATCH and -1 in (served.captured_ids or []))
    return Verdict(status, fix if with_fix else None, fix_vllm if with_fix else None, patch, said.message,
                   ev.basis, list(best), list(ev.served.slots) if ev.served is not None else None, tolerance,
                   reason, ev.comparison.to_dict() if ev.comparison is not None else None, chance,
                   said.diagnosis, said.advice)


def not_nothing_to_fix(verdict: Verdict, bad: list[str]) -> None:
    """A MATCH is about the layout only: where a ``bad`` finding stands below it, its advice must not
    say there is nothing to fix (the finding's own fix is the one to apply)."""
    if verdict.status != STATUS_MATCH or not bad or not verdict.advice.startswith("Nothing to fix"):
        return
    many = len(bad) > 1
    advice = (f"The layout is right, but {len(bad)} finding{'s' if many else ''} below ({', '.join(bad)}) "
              f"{'are' if many else 'is'} not: apply {'their' if many else 'its'} fix.")
    if verdict.message.endswith(verdict.advice):
        verdict.message = verdict.message[:len(verdict.message) - len(verdict.advice)] + advice
    verdict.advice = advice


def _unusable(case: _Case, chance: dict[str, Any] | None) -> tuple[str, Said, str] | None:
    """UNKNOWN when the evidence cannot tell layouts apart: non-finite values, nothing scored, near chance."""
    ev = case.ev
    if ev.nonfinite:
        more = f" (and {len(ev.nonfinite) - 3} more)" if len(ev.nonfinite) > 3 else ""
        return STATUS_UNKNOWN, Said(
            "Some values are not finite, so no verdict is given: " + "; ".join(ev.nonfinite[:3]) + more
            + ". NaN or inf in the dumps means the capture went wrong, and every score built on them is "
            "meaningless.", advice="Regenerate those dump files (or remove them) and rerun."), "non_finite"
    if ev.scored_rows == 0:
        return STATUS_UNKNOWN, Said(
            f"Nothing was scored: the {ev.samples} evaluated samples hold no position with a next token and "
            "loss_mask 1 (--limit 0, samples shorter than 2 tokens, or an all-zero loss_mask), so there is no "
            "evidence for any layout.", advice="Evaluate samples that have scored tokens."), "nothing_scored"
    if chance is not None and chance["near_chance"]:
        current = chance["current_token_acc"]
        return STATUS_UNKNOWN, Said(
            f"Every layout scores near chance, so the layouts cannot be told apart: the best, "
            f"{case.describe(ev.best.slots)}, reaches step-0 accuracy {chance['best_step0']:.3f} {case.where}, "
            f"against {chance['constant_guess_acc']:.3f} for always guessing the most frequent target (token "
            f"{chance['constant_guess_token']})"
            + (f" and {current:.3f} for guessing from the current token alone" if current is not None else "")
            + f", guesses that ignore the hidden states; near chance means closing less than {ev.min_skill:.0%} "
            f"of the gap from the better of them to perfect (at most {chance['threshold']:.3f}).",
            advice="The draft looks barely trained, or it was trained for another target: check its training "
                   "loss and --expected-acc, and that --data and --verifier belong to its target."), "near_chance"
    return None


def _judged(case: _Case, fix: list[int] | None) -> tuple[str, Said, str | None]:
    """The verdict on usable evidence: UNKNOWN without layer ids or significance, else MATCH or MISMATCH."""
    ev, served = case.ev, case.served
    best_txt = case.describe(ev.best.slots)
    if fix is None:
        return STATUS_UNKNOWN, Said(
            f"The dump has no data_config.json with per-slot layer ids, so the configured ids cannot be "
            f"checked. Of the {ev.scan_layouts} layouts scanned, the draft scores best on slots "
            f"{list(ev.best.slots)} {best_txt}.",
            f"Step-0 accuracy {_acc(ev.best)}, predicted accept length {ev.best.accept_length:.2f} at "
            f"K={ev.steps} {case.where}.",
            "Write data_config.json with the layer id of each slot and rerun."), "no_layer_ids"
    if ev.served is not None and ev.served.slots == ev.best.slots:
        return STATUS_MATCH, Said(
            f"The layout {case.engine} feeds for the configured ids {served.configured_ids}, {best_txt}, is the "
            f"best of the {ev.scan_layouts} layouts scanned.",
            f"Step-0 accuracy {_acc(ev.best)}, predicted accept length {ev.best.accept_length:.2f} at "
            f"K={ev.steps} {case.where}.", case.nothing_to_fix()), None
    cmp_ = ev.comparison
    if ev.served is not None and cmp_ is not None and cmp_.outcome in (SAME, INCONCLUSIVE):
        return _same_or_unsure(case, ev.served, cmp_)
    return STATUS_MISMATCH, _mismatch(case, fix), None


def _same_text(case: _Case, cmp_: Comparison) -> str:
    return (f"layouts count as the same when the best gains less than {case.tolerance:.1%} of the served "
            f"accept length ({cmp_.margin:.3f} tokens per verify here)")


def _same_or_unsure(case: _Case, served_m: Measured, cmp_: Comparison) -> tuple[str, Said, str | None]:
    ev, served = case.ev, case.served
    best_txt, served_txt = case.describe(ev.best.slots), case.describe(served_m.slots)
    if cmp_.outcome == SAME:
        return STATUS_MATCH, Said(
            f"The layout {case.engine} feeds for the configured ids {served.configured_ids}, {served_txt}, "
            f"scores the same as the scan's best, {best_txt}, {case.where}.",
            f"Predicted accept length {served_m.accept_length:.2f} vs {ev.best.accept_length:.2f} at "
            f"K={ev.steps} ({_stats(cmp_)}); {_same_text(case, cmp_)}.", case.nothing_to_fix()), None
    return STATUS_UNKNOWN, Said(
        f"The best layout, {best_txt}, scores above the one {case.engine} feeds for the configured ids "
        f"{served.configured_ids}, {served_txt}, {case.where}, but with {cmp_.samples} samples that is not "
        f"significant at alpha {cmp_.alpha:g}.",
        f"Predicted accept length {ev.best.accept_length:.2f} vs {served_m.accept_length:.2f} at K={ev.steps} "
        f"({_stats(cmp_)}).",
        "Evaluate more samples (--limit, or a larger dump) before changing the ids."), "inconclusive"


def _fed(case: _Case) -> str:
    """What the configured ids make the engine feed (the second half of a MISMATCH diagnosis)."""
    served, engine = case.served, case.engine
    if case.ev.served is not None:
        fed = case.describe(case.ev.served.slots)
        if fed.startswith(f"{served.configured_ids} "):      # the same numbers: name them once
            return f"its config ids {fed} make {engine} feed exactly those layers"
        return f"its config ids {served.configured_ids} make {engine} feed {fed}"
    if served.captured_ids is None:
        return ("its config has no aux layer ids, so the engines capture their default (after layers "
                "[2, n/2, n-3]) and the target's layer count n is unknown here")
    ids = (f"its config ids {served.configured_ids} make {engine} capture" if served.configured_ids is not None
           else f"its config has no ids where {engine} reads them, so {engine} captures its default,")
    if served.missing:
        return (f"{ids} layers {case.ids(served.captured_ids)}, which are not all in this dump "
                f"(missing {convention.convert(sorted(set(served.missing)), convention.SGLANG, served.convention)})")
    return (f"the engine default makes {engine} capture {len(served.captured_ids)} layers "
            f"{served.captured_ids}, while the draft's fc takes {len(case.ev.best.slots)}")


def _mismatch(case: _Case, fix: list[int]) -> Said:
    ev, cmp_ = case.ev, case.ev.comparison
    where = case.where
    if ev.served is not None and cmp_ is not None:
        figures = (f"{where[0].upper()}{where[1:]}, the trained layout predicts an accept length of "
                   f"{ev.best.accept_length:.2f} at K={ev.steps} against {ev.served.accept_length:.2f} as served "
                   f"({_stats(cmp_)}; step-0 accuracy {_acc(ev.best)} vs {_acc(ev.served)}); "
                   f"{_same_text(case, cmp_)}.")
    else:
        figures = (f"The trained layout scores step-0 accuracy {_acc(ev.best)}, predicted accept length "
                   f"{ev.best.accept_length:.2f} at K={ev.steps} {where}.")
    fix_vllm = convention.convert(fix, convention.SGLANG, convention.VLLM)
    vllm_file = convention.serving_convention(case.fmt) == convention.VLLM   # the file's own convention first
    if vllm_file and case.advise_for == convention.SGLANG:
        return Said(f"The draft was trained on {case.describe(ev.best.slots)}, but {_fed(case)}.", figures,
                    _flat_advice(fix))
    advice = (f"Put \"{formats.ids_field(case.fmt)}\": {fix_vllm if vllm_file else fix} in the draft config.json"
              + (" (speculators' own convention, as vLLM reads it: 0 is the embedding)" if vllm_file else ""))
    advice += (embedding_advice(case.advise_for, True) if -1 in fix
               else "." if case.advise_for == convention.VLLM else "; no SGLang patch is needed.")
    advice += (f" In SGLang ids (a flat config's eagle_config) the fix is {fix}." if vllm_file
               else f" vLLM reads the same layout as {fix_vllm}.")
    return Said(f"The draft was trained on {case.describe(ev.best.slots)}, but {_fed(case)}.", figures, advice)


def _flat_advice(fix: list[int]) -> str:
    """The fix where SGLang serves a speculators draft: SGLang reads ids only from a flat config's
    eagle_config, so writing them into this config.json (draft-config) changes nothing it reads."""
    return (f"SGLang never reads this speculators config's ids: serve it a flat-format copy with {fix} (SGLang "
            "ids) in its eagle_config (`invoke draft-flat`, the fix line below)"
            + (embedding_advice(convention.SGLANG, True) if -1 in fix else "; no SGLang patch is needed.")
            + f" vLLM reads this config as it is, with {convention.convert(fix, convention.SGLANG, convention.VLLM)} "
            "(vLLM ids).")


def _acc(m: Measured) -> str:
    return "n/a" if m.step0 is None else f"{m.step0:.3f}"


def _stats(c: Comparison) -> str:
    """The paired test in a few words: gain, CI, per-sample wins/losses, sign-test p."""
    return (f"gain {c.gain:+.3f} tokens per verify, {1 - c.alpha:.0%} CI {c.gain_ci[0]:+.3f} to "
            f"{c.gain_ci[1]:+.3f}; better on {c.samples_better} of {c.samples} samples, worse on "
            f"{c.samples_worse}; sign test p = {c.sign_test_p:.2g}")
