"""The pre-start checks of `invoke serve`: catch, before a GPU hour is spent, what the engine would
silently change or get wrong. Each refusal is one paragraph: what is wrong, what the engine would do,
and what to change. Facts about the files come from the host (``remote/serve`` inspect)."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from draftops import cmdline
from draftops.errors import ServeRefused
from draftops.link.host import Host
from draftops.serve import hosttool, launch_algorithm, verdicts
from draftops.serve.engines import SPECULATIVE_MAX
from draftops.serve.launch_algorithm import ALGORITHM_ID
from draftops.serve.request import DEMO, Plan
from draftops.serve.verdicts import Measured, Verdict
from draftops.terminal import clean
from remote.eagle import convention
from remote.eagle.engine_rules import LAYER_FINDINGS

if TYPE_CHECKING:
    from draftops.documents.serve_inspect import CaptureFacts, DraftFacts, Reading, ServeInspect, TargetFacts

OVERRIDE_WARNING = ("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
                    "speculative_eagle_topk == 1")


@dataclass
class Findings:
    """Refusals stop the start (unless overridden); warnings and notes are shown."""

    refusals: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def refuse_unless(self, overridden: bool, flag: str, text: str, fix: str) -> None:
        """A refusal the user may override with ``flag``: then it is shown as a warning."""
        if overridden:
            self.warnings.append(f"{text} Serving anyway ({flag}).")
        else:
            self.refusals.append(f"{text} {fix}")


def _flags(*pairs: tuple[str, int | None]) -> str:
    return ", ".join(f"{name} {value}" for name, value in pairs if value is not None)


def flag_checks(plan: Plan, found: Findings) -> None:
    """Speculative flags and extra arguments: no host needed."""
    req, launch, engine = plan.request, plan.launch, plan.engine
    given = {"--steps": req.steps, "--topk": req.topk, "--draft-tokens": req.draft_tokens}
    for name, value in given.items():
        if value is not None and not 1 <= value <= SPECULATIVE_MAX[name]:
            found.refusals.append(f"{name} {value} is not a count from 1 to {SPECULATIVE_MAX[name]}; speculative "
                                  "steps, topk and draft tokens are all at least 1.")
            return
    if launch.draft is None and any(v is not None for v in given.values()):
        found.refusals.append(
            f"--baseline serves the target with no draft, so {_flags(*given.items())} would be ignored. "
            "Drop them; start the speculative run with the same profile so both use the same max "
            "running requests.")
        return
    launched = launch_algorithm.from_extra_args(engine.name, launch.extra_args)
    if launch.draft is not None and launch_algorithm.runs_as_eagle(launched):
        found.refusals.append(
            f"{ALGORITHM_ID}: serve profile {plan.profile.name!r} of host {plan.profile.host!r} sets the "
            f"speculative algorithm {launched!r} in `extra_args`; the engine keeps the last value, so it would "
            "run the EAGLE-3 draft as EAGLE-1/2, skip its fc without an error and accept nothing (accept length "
            "exactly 1.0, SGLang PR #21272). Remove it from extra_args: `invoke serve` launches "
            + ("--speculative-algorithm EAGLE3" if engine.name == convention.SGLANG else 'method "eagle3"')
            + " itself.")
        return
    owned = [a for a in launch.extra_args if a.split("=", 1)[0] in engine.owned_flags]
    if owned:
        flag = owned[0].split("=", 1)[0]
        found.refusals.append(
            f"Serve profile {plan.profile.name!r} of host {plan.profile.host!r} passes {flag} in "
            f"`extra_args`, but `invoke serve` sets that flag itself (from {engine.owned_flags[flag]}); "
            "with two values the engine silently keeps the last one. Remove it from extra_args and use "
            f"{engine.owned_flags[flag]} instead.")
    if launch.draft is None:
        return
    if engine.name == convention.SGLANG:
        _sglang_flags(plan, found)
    else:
        _vllm_flags(plan, found)


def _sglang_flags(plan: Plan, found: Findings) -> None:
    steps, topk, tokens = plan.launch.steps, plan.launch.topk, plan.launch.draft_tokens
    given = {"--steps": steps, "--topk": topk, "--draft-tokens": tokens}
    missing = [k for k, v in given.items() if v is None]
    if missing and len(missing) < 3:
        how = ("an AssertionError, because --steps is missing" if steps is None
               else "a TypeError (`None > 1`), because --topk is missing" if topk is None
               else "draft tokens left to auto-choice while steps and topk are fixed")
        found.refusals.append(
            f"SGLang needs all three speculative flags or none: you gave {_flags(*given.items())} but not "
            f"{', '.join(missing)}. SGLang would fail at start-up with {how}. Give all three (for "
            "example --steps 3 --topk 1 --draft-tokens 4), or none to let SGLang choose (5, 4, 8 for "
            "Llama targets; 3, 1, 4 for the others).")
        return
    if steps is None or topk is None or tokens is None:
        found.notes.append("speculative steps/topk/draft tokens: SGLang's automatic choice (read back "
                           "below once the server is up)")
        return
    if topk == 1 and tokens != steps + 1:
        what = (f"With --topk 1 SGLang drafts a chain, and it silently replaces --draft-tokens {tokens} by "
                f"--steps + 1 = {steps + 1}: the server would verify {steps + 1} draft tokens per step, not "
                f"{tokens}. Its only trace is one log line: `{OVERRIDE_WARNING}`.")
        found.refuse_unless(plan.request.allow_override, "--allow-override", what,
                            f"Ask for --draft-tokens {steps + 1}, or a --topk above 1 for a tree that can use "
                            f"{tokens} tokens, or pass --allow-override to accept SGLang's adjustment.")
    if topk > 1:
        room = topk + (steps - 1) * topk ** 2
        if tokens - 1 > room:
            found.refusals.append(
                f"With --topk {topk} and --steps {steps} the draft tree holds at most topk + (steps-1)·topk² "
                f"= {room} candidates, so --draft-tokens {tokens} ({tokens - 1} besides the root) cannot be "
                "filled. SGLang does not check this when parsing arguments; it fails at run time or "
                f"during CUDA-graph capture (torch.topk: selected index k out of range). Use --draft-tokens "
                f"{room + 1} or fewer, or more --steps or a larger --topk.")


def _vllm_flags(plan: Plan, found: Findings) -> None:
    steps, topk, tokens = plan.launch.steps, plan.launch.topk, plan.launch.draft_tokens
    assert steps is not None
    if (topk not in (None, 1)) or (tokens is not None and tokens != steps + 1):
        found.refusals.append(
            f"vLLM serves an EAGLE-3 draft as a chain: num_speculative_tokens = --steps = {steps} draft "
            f"tokens, verified {steps + 1} at a time; it has no topk tree. "
            f"{_flags(('--topk', topk), ('--draft-tokens', tokens))} "
            f"cannot be honoured. Drop --topk and --draft-tokens (or give --topk 1 --draft-tokens "
            f"{steps + 1}) and set the chain length with --steps.")
    else:
        found.notes.append(f"vLLM speculative config: method eagle3, num_speculative_tokens = --steps = {steps}")


def fact_checks(plan: Plan, facts: ServeInspect, verdict: Verdict | None, found: Findings,
                measured: Measured | None = None) -> None:
    """Checks on what the host holds: the engine, the target, the draft's config and the patch; the
    latest test-drafter verdict and capture-check measurement of the draft, when there are any."""
    host, engine, launch = plan.profile.host, plan.engine, plan.launch
    if not facts.engine.importable:
        install = ("`invoke env.setup --engine vllm --host " + host + "`" if engine.name == "vllm"
                   else "SGLang into the host's ml-env (`invoke env.setup`, with sglang in its requirements)")
        found.refusals.append(
            f"Host {host!r}: the python {launch.python} (serve profile {plan.profile.name!r}) cannot import "
            f"{engine.name}, so the server would die at once. Install it with {install}, or point `python:` "
            "in the serve profile (or `engine_python:` in the host entry) at the interpreter that has it.")
    if facts.target_error:
        found.refusals.append(
            f"Host {host!r}: the target {launch.target} cannot be served: {facts.target_error} Set "
            "`target:` in the serve profile, or pass --target, to the model folder on the host.")
    draft = facts.draft
    if launch.draft is None or draft is None:
        return
    if draft.error:
        found.refusals.append(f"Host {host!r}: {draft.error}. Pass --draft the draft checkpoint folder "
                              "(the one that holds config.json and the safetensors).")
        return
    _algorithm(plan, draft, found)
    if draft.reading is None:
        return
    _layer_ids(plan, draft, draft.reading, facts.target, found)
    _capture_patch(plan, draft.reading, facts.sglang, found)
    _verdict(plan, draft, verdict, found)
    _measured(plan, draft, measured, found)
    _context(plan, draft, facts.target, found)


def _algorithm(plan: Plan, draft: DraftFacts, found: Findings) -> None:
    algorithm = draft.algorithm
    if algorithm == "eagle3":
        return
    if algorithm is None and plan.engine.name == "vllm":
        # vLLM's EAGLEConfig names the model class itself under method eagle3 (LlamaForCausalLM ->
        # Eagle3LlamaForCausalLM), so a plain architecture serves; an EAGLE-1/2 head fails to load
        # there (its fc has another width) rather than accepting nothing
        found.notes.append(f"the draft's config declares architectures {draft.architectures}; vLLM "
                           "serves it as Eagle3<architecture> under method eagle3")
        return
    declared = (f"speculators_model_type {draft.speculators_model_type!r}" if draft.speculators_model_type
                else f"architectures {draft.architectures}")
    flag = "--speculative-algorithm EAGLE3" if plan.engine.name == "sglang" else '"method": "eagle3"'
    found.refusals.append(
        f"{ALGORITHM_ID}: the draft {plan.launch.draft} is not an EAGLE-3 draft: its config declares "
        f"{declared}. `invoke serve` starts {plan.engine.label} with {flag}, which needs an EAGLE-3 head "
        "(architectures LlamaForCausalLMEagle3, or speculators_model_type eagle3); an EAGLE-1/2 head under "
        "EAGLE3, or an EAGLE-3 head under EAGLE, loads without an error and accepts almost nothing (accept length "
        "1.0, SGLang PR #21272). Point --draft at an EAGLE-3 checkpoint.")


def _layer_ids(plan: Plan, draft: DraftFacts, reading: Reading, target: TargetFacts | None,
               found: Findings) -> None:
    name = plan.engine.label
    layers = target.num_hidden_layers if target else None
    for field_name, value in reading.malformed.items():
        found.refusals.append(
            f"The draft config {draft.config} holds {value!r} in `{field_name}`, which {name} reads as "
            "the aux layer ids; that is not a non-empty list of integers. Write the ids with `invoke "
            f"draft-config --ckpt {plan.launch.draft} --layer-ids ...` (SGLang convention, e.g. -1,2,30).")
    explanation = draft.explain
    bad = reading.out_of_range
    if bad and layers and target:
        low, high = convention.usable_ids(plan.engine.name, layers)
        found.refusals.append(
            f"The draft's layer ids do not fit the target: {explanation} The target "
            f"({target.path}) has {layers} layers, so {name} can only capture ids {low}..{high}; "
            f"{bad} {'is' if len(bad) == 1 else 'are'} outside. The server would fail to start or feed the "
            f"draft the wrong states. Fix the ids with `invoke draft-config --ckpt {plan.launch.draft} "
            "--layer-ids ...`, or check that the target is the model the draft was trained for.")
        return
    crossed = draft.native_engine != plan.engine.name
    if reading.fallback or crossed or reading.ignored:
        where = (f"This is a {draft.format} config, written for "
                 f"{convention.ENGINE_NAME[draft.native_engine or 'sglang']}, served by {name}. "
                 if crossed else "")
        found.warnings.append(where + explanation)
    else:
        found.notes.append(explanation)


def _capture_patch(plan: Plan, reading: Reading, sglang: CaptureFacts | None, found: Findings) -> None:
    if plan.engine.name != convention.SGLANG:
        return
    host = plan.profile.host
    if sglang:
        found.warnings.extend(sglang.graph)
    if not reading.needs_embedding:
        return
    if sglang is None or sglang.error:
        found.refusals.append(
            f"The draft's ids include -1 (the embedding output), which stock SGLang does not capture, and "
            f"the capture patch's status on host {host!r} could not be read: "
            f"{(sglang.error if sglang else None) or 'SGLang was not found'}. Check with `invoke patch-sglang "
            f"--host {host}`.")
    elif sglang.embedding:
        version = sglang.summary.version if sglang.summary else None
        found.refusals.append(
            f"The draft's ids include -1 (the embedding output), which SGLang {version} on host {host!r} "
            f"does not capture: {'; '.join(sglang.embedding)}. Without the patch SGLang crashes on the "
            f"first capture or feeds the draft another layer. Run `invoke patch-sglang.apply --host {host}` "
            "(it keeps the originals; `patch-sglang.revert` restores them), then serve again.")
    else:
        found.notes.append(f"capture patch: SGLang {sglang.summary.version if sglang.summary else None} "
                           "captures the embedding (id -1)")


def fix_task(plan: Plan, draft: DraftFacts) -> str:
    """The task that applies a layer-id fix to this draft on this engine (``convention.fix_task``)."""
    return convention.fix_task(plan.engine.name, draft.format)


def _verdict(plan: Plan, draft: DraftFacts, verdict: Verdict | None, found: Findings) -> None:
    if verdict is None:
        found.notes.append("no local `invoke test-drafter` report for this draft (runs/*/report.json)")
        return
    current = draft.ids_by_engine.get(convention.VLLM)
    judged = verdict.serving_convention
    crossed = judged is not None and judged != plan.engine.name
    _bad_findings(plan, verdict, found, stale=verdict.stale(current) or crossed)
    head = f"latest test-drafter verdict (run {verdict.run_id}): {verdict.status}"
    if verdict.stale(current):
        found.notes.append(f"{head}, for ids {verdict.configured_ids}; the config now holds {current}, "
                           "so it no longer applies: re-run `invoke test-drafter` to check the new ids")
        return
    if crossed:
        # the verdict and its layer findings judge the ids as the other engine reads them (SGLang:
        # flat-config field, +1 rule, capture patch): their warning and fix do not apply to this engine
        found.notes.append(
            f"{head}, judged as {convention.ENGINE_NAME.get(judged or '', '?')} reads the ids; you serve with "
            f"{plan.engine.label}, which reads them as above, so that verdict and its layer-id fix do not "
            f"apply here (a test-drafter run on a host that serves with {plan.engine.label} judges them)")
        return
    if verdict.status != "MISMATCH":
        found.notes.append(head)
        return
    if plan.request.draft == DEMO:
        # The demo exists to show the seed's bug: served as configured, it measures the low accept
        # length the report predicts. test-drafter showed the diagnosis: here the figures and the command.
        found.warnings.append(
            f"The verdict of test-drafter run {verdict.run_id} is MISMATCH"
            f"{': ' + _predicted(verdict) if _predicted(verdict) else ''}; the demo is served as configured to "
            "show it. Fix it with:\n"
            f"  {cmdline.command(fix_task(plan, draft), '--ckpt', 'demo', '--from-report', verdict.run_id)}")
        return
    # any other draft with this verdict is refused unless --force: the refusal is all the user sees
    found.refuse_unless(plan.request.force, "--force",
                        f"The latest `invoke test-drafter` verdict for this draft (run {verdict.run_id}) is "
                        f"MISMATCH: {clean(verdict.why)}"
                        + (f" {_predicted(verdict).capitalize()}." if _predicted(verdict) else ""),
                        "Serving it would spend GPU time at a low accept length. Apply the fix with `invoke "
                        f"{fix_task(plan, draft)} --ckpt {plan.launch.draft} --from-report {verdict.run_id}` and "
                        "test again, or pass --force to serve it as it is.")


def _bad_findings(plan: Plan, verdict: Verdict, found: Findings, stale: bool = False) -> None:
    """A `bad` finding of the latest report (e.g. vocab-map-identity) is refused unless --force (the demo:
    shown). One about the weights stays after the config's ids change or when the report judged another
    engine's reading (``stale``); one about the ids does not, and while the verdict is MISMATCH the
    verdict's own refusal says it."""
    for fid, _, text, fix in verdict.bad:
        if fid in LAYER_FINDINGS and (stale or verdict.status == "MISMATCH"):
            continue
        said = f"test-drafter run {verdict.run_id} found {fid}: {clean(text)}"
        if plan.request.draft == DEMO:
            found.warnings.append(f"{said} Fix: {clean(fix)}")
            continue
        found.refuse_unless(plan.request.force, "--force", said,
                            f"Serving it would spend GPU time on drafts the target rejects. Fix: {clean(fix)} Then "
                            f"run `invoke test-drafter` again, or pass --force to serve it as it is.")


def _measured(plan: Plan, draft: DraftFacts, measured: Measured | None, found: Findings) -> None:
    """A capture-check of this draft on this target and engine: the engine's own states said which layers
    it feeds. A MISMATCH there is refused (the demo: shown), unless the config changed since."""
    if measured is None:
        return
    current = draft.ids_by_engine.get(plan.engine.name)
    head = f"capture-check run {measured.run_id} (measured from the engine): {measured.status}"
    if measured.stale(current):
        found.notes.append(f"{head}, for ids {measured.configured_ids}; the config now holds {current}, so it no "
                           "longer applies: run `invoke capture-check` again to measure the new ids")
        return
    if measured.status != "MISMATCH":
        found.notes.append(head)
        return
    engine = plan.engine.name
    said = (f"The engine's own hidden states (capture-check run {measured.run_id}) show that {plan.engine.label} "
            f"will feed this draft layers {convention.boundaries_text(measured.fed, engine)}, while training fed "
            f"layers {convention.boundaries_text(measured.trained, engine)}.")
    ckpt = "demo" if plan.request.draft == DEMO else plan.launch.draft
    fix = cmdline.command(fix_task(plan, draft), "--ckpt", ckpt, "--from-report", measured.run_id)
    if plan.request.draft == DEMO:
        found.warnings.append(f"{said} The demo is served as configured to show it. Fix it with:\n  {fix}")
        return
    found.refuse_unless(plan.request.force, "--force", said,
                        f"Apply the measured fix (ids {measured.fix_ids}) with `{fix}`, or pass --force to serve "
                        "it as it is.")


def _predicted(verdict: Verdict) -> str:
    """The report's two predicted accept lengths in a few words ("" when it holds neither)."""
    def fmt(x: float | None) -> str:
        return "?" if x is None else f"{x:.2f}"

    if verdict.accept_served is None and verdict.accept_best is None:
        return ""
    return (f"predicted accept length {fmt(verdict.accept_served)} as configured, "
            f"{fmt(verdict.accept_best)} with the trained layout")


def _context(plan: Plan, draft: DraftFacts, target: TargetFacts | None, found: Findings) -> None:
    draft_max = draft.max_position_embeddings
    context = plan.launch.context_length or (target.max_position_embeddings if target else None)
    source = ("the profile's context_length" if plan.launch.context_length
              else "the target's max_position_embeddings")
    if draft_max and context and draft_max < context:
        found.warnings.append(
            f"The draft's max_position_embeddings is {draft_max}, below the {context}-token context the "
            f"server accepts ({source}): on prompts longer than {draft_max} tokens the draft runs past the "
            "positions it was trained on and acceptance collapses (SGLang #6783). Benchmark with shorter "
            "prompts, set `context_length` in the profile, or use a draft trained on longer contexts.")


def refused_or_facts(host: Host, plan: Plan, env: Mapping[str, str], runs_dir: Path, *,
                     capture: bool) -> ServeInspect:
    """The checks a step of a larger command (the doctor, the tune) makes before it starts a server, as
    `invoke serve` makes them: the flags, then the host's facts against the draft's latest test-drafter
    verdict (and, with ``capture``, its latest capture-check); a ServeRefused with every refusal, else
    the facts."""
    launch = plan.launch
    found = Findings(notes=list(plan.notes))
    flag_checks(plan, found)
    facts = hosttool.inspect(host, launch.python, env, plan.engine.name, launch.target, launch.draft)
    verdict = verdicts.latest(runs_dir, launch.draft) if launch.draft else None
    measured = verdicts.latest_capture(runs_dir, launch.draft, launch.target, plan.engine.name) \
        if launch.draft and capture else None
    fact_checks(plan, facts, verdict, found, measured)
    if found.refusals:
        raise ServeRefused(*found.refusals)
    return facts
