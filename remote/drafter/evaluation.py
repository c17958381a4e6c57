"""``eval``: load a draft and a dump, diagnose the aux layout, measure TTT accuracy, write the report.

Two passes over the data: a layout scan (step 0 only, every ascending choice of A slots out of S,
on the first ``layout_samples`` samples, plus per-slot norms) that picks the best-scoring layout,
then the full K-step metrics on every evaluated sample for the layout the serving engine would feed
(``served``) and, when it differs, that best layout (``best``).  The verdict compares the two on
those same samples (stats.py) and never uses the scan's numbers.

With ``--engine-states`` (the engine's own states a capture check kept, every layer boundary a slot)
the same two passes run again on that second dump set, for the layout the engine feeds, the one
training used and the best there (``_on_engine_states``): the figures trainer dumps holding only
training's slots cannot give.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import itertools
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .. import events
from ..eagle import convention, engine_rules
from . import report
from .causes import config_keys
from .causes.states import CAPTURE
from .context import EvalContext
from .data import chattemplate, dumpformats, engine_states, trainermap
from .data.batching import Batch, background, iter_batches, iter_planned, plan, to_device
from .data.dumps import DumpSet, SlotInfo
from .data.measured import read_capture_check
from .data.trainermap import TRAINER_MAP
from .errors import (
    ConfigError,
    DataError,
    DrafterError,
    RankError,
    ShapeMismatchError,
    UnsupportedError,
)
from .launch import distributed
from .load import config, vocabmap
from .load.checkpoint import CheckpointInfo, load_checkpoint
from .load.verifier import Verifier
from .measures import CHAT_TEMPLATE, CONFIG_KEY_IGNORED
from .model import headshare, kvcache
from .model.draft import Eagle3Draft
from .options import EvalOptions
from .scoring import agreement, policy, reduce, sequential, stats, temperature
from .scoring.chance import ChanceLevel
from .scoring.score import LayoutScore, Observer, VerifierHead, new_score, score_batch
from .scoring.slotstats import STATS, SlotStats
from .verdict import layouts, unknown_layers
from .verdict.layouts import Evidence, Interpretation, Measured
from .verdict.results import Results


def resolve_device(name: str) -> tuple[torch.device, torch.dtype]:
    """auto -> cuda when present; fp32 on CPU (exact), bf16 on GPU (how drafts are served)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UnsupportedError("CUDA was requested but torch sees no GPU", expected="a CUDA device",
                               found=f"torch {torch.__version__} without CUDA",
                               fix="use --device auto or cpu, or a CUDA build of torch")
    device = torch.device(name)
    return device, (torch.bfloat16 if device.type == "cuda" else torch.float32)


def evaluate(opts: EvalOptions) -> dict[str, Any]:
    """Run the whole evaluation and write ``report.json`` into ``opts.out``; returns the report.  As
    one rank of a torchrun (distributed.py) it scores its share; rank 0 alone reports and writes,
    the other ranks return ``{}``."""
    opts.validate()
    config.locate(opts.ckpt, opts.config)      # a folder that is no draft is told so before any "loading" line
    started = time.time()
    device, dtype = resolve_device(distributed.device_of(opts.device))
    world = distributed.from_env(device)
    try:
        if world.size > 1 and not opts.full:
            raise RankError("A torchrun of the evaluator runs the full pass; the sequential verdict is one process's",
                            field="--full", fix="pass --full (python -m remote.drafter.launch adds it)")
        return _evaluate(opts, world, device, dtype, started)
    finally:
        distributed.teardown(world)


def _evaluate(opts: EvalOptions, world: distributed.World, device: torch.device, dtype: torch.dtype,
              started: float) -> dict[str, Any]:
    where = f" (rank {world.rank} of {world.size})" if world.size > 1 else ""
    _log(f"loading {opts.ckpt} and {opts.data} on {device} ({dtype}){where}")
    ctx = _agreed(world, lambda: _load(opts, device, dtype), opts)
    count = len(ctx.dumps.files) if opts.limit is None else min(opts.limit, len(ctx.dumps.files))
    _log(f"layout scan: every choice of {ctx.draft.arch.num_aux} of {ctx.slot_count} slots")
    scan_n = min(count, opts.layout_samples)
    # the sequential verdict scans and scores in a seeded random order; the full pass in file order
    picked = list(range(count)) if opts.full else sequential.order(count, opts.seed)
    extra: dict[str, Any] = dict(ctx.extra)
    slot_stats = _slot_stats(ctx) if world.main else None
    norms, scan, basis = _scan(ctx, picked[:scan_n], opts, slot_stats if world.size == 1 else None)
    if slot_stats is not None and world.size > 1:
        _slot_stats_pass(ctx, picked[:scan_n], opts, slot_stats)
    if slot_stats is not None:
        extra[STATS] = slot_stats.to_dict()
    slot_ids = ctx.dumps.slots.layer_ids
    interps = layouts.interpret(ctx.info.configured_layer_ids, slot_ids, ctx.num_layers,
                                read_by=ctx.info.ids_by_engine or None)
    served = _served(interps, ctx, opts)
    roles = _roles(scan, basis, served, ctx.draft.arch.num_aux)
    variant = _as_engine_runs(ctx, opts, roles)
    swap, inherit = _head_swap(ctx, opts, roles), _kv_inherit(ctx, opts, roles)
    variants = _variants(ctx.draft, variant, swap, inherit, roles)
    seq: dict[str, Any] | None = None
    if opts.full:
        _log(f"metrics: {opts.steps} TTT steps on {count} samples")
        full, tokens, chance, coverage = _metrics(ctx, range(count), roles, opts, variants)
        scored = count
    else:
        _log(f"metrics: {opts.steps} TTT steps on samples in a random order (seed {opts.seed}) until the verdict "
             f"is decided, of {count}")
        full, tokens, chance, coverage, seq = _sequential(ctx, picked, scan_n, roles, opts, variants, basis)
        scored = seq["samples_scored"]
    off_policy = _policy_extra(ctx, opts)   # a collective under torchrun: before the other ranks leave
    if world.size > 1:
        _merge_context(ctx)
        if not world.main:
            return {}
    as_engine_runs = full.pop(_VARIANT, None)   # a measurement for the findings, not a layout of the report
    as_target_head = full.pop(_HEAD, None)
    as_fp8_kv = full.pop(_KV, None)
    if ctx.tally is not None:
        role = "served" if "served" in full else "best"
        at = full.get(role)
        counts = at.counts(basis) if at is not None else None
        extra[temperature.ID] = ctx.tally.to_dict(role, counts.accept_length(opts.steps) if counts else None)
    evidence = _evidence(ctx, opts, full, chance, basis, scan, scan_n, scored)
    if seq is not None:
        evidence = dataclasses.replace(evidence, total=count,
                                       comparison=_sequential_comparison(evidence.comparison, seq))
    verdict = layouts.decide(evidence, served, slot_ids, ctx.final_slot, ctx.info.format, opts.layout_tolerance,
                             opts.engine)
    verdict = unknown_layers.with_commands(verdict, opts.data, opts.ckpt, ctx.dumps.format, ctx.slot_count,
                                           ctx.num_layers)
    if opts.measured is not None and CAPTURE not in extra:
        verdict = _measured_from_engine(verdict, opts.measured)
    on_engine = _on_engine_states(ctx, opts, dtype) if opts.engine_states is not None else None
    if seq is not None:
        seq["samples_read"] = ctx.read["samples"]
    doc = report.build(opts, ctx, Results(
        samples=scored, tokens=tokens, norms=norms, scan=scan, scan_samples=scan_n, interps=interps,
        verdict=verdict, basis=basis, full=full, dtype=str(dtype).replace("torch.", ""),
        seconds=time.time() - started, skipped=dict(ctx.skipped), coverage=coverage, engine_states=on_engine,
        extra={**extra, CHAT_TEMPLATE.key: _chat_format(ctx, opts), **off_policy,
               **_variant_extra(variant, as_engine_runs, full, basis, opts, ctx, scored),
               **_head_extra(swap, as_target_head, full, basis, opts, ctx, scored),
               **_kv_extra(inherit, as_fp8_kv, full, basis, opts, scored)},
        total=count, sequential=seq, read=dict(ctx.read)))
    path = report.write(doc, Path(opts.out))
    _log(f"report written to {path}")
    events.result(str(path), status=verdict.status)
    return doc


def _policy_extra(ctx: EvalContext, opts: EvalOptions) -> dict[str, Any]:
    """The off-policy measurement of the metrics pass (every rank's tally, on rank 0), for causes/policy.py."""
    tally = ctx.extra.get(policy.ID)
    if tally is None:
        return {}
    parts = ctx.world.gather(tally)
    if parts is None:
        return {}
    merged = policy.PolicyTally()
    for part in parts:
        merged.merge(part)
    return {policy.ID: merged.to_dict(opts.alpha)}


def _served(interps: list[layouts.Interpretation], ctx: EvalContext, opts: EvalOptions) -> layouts.Interpretation:
    """What the server feeds: the host's engine decides (``--engine``), reading the field it reads
    (SGLang a speculators config's nested field only, so its default where that is empty); without
    one, the engine whose convention the format is written in (SGLang for flat, vLLM for speculators).
    One engine's terms for the verdict and the findings alike, never a MATCH for the engine the host
    does not run above a finding for the one it does."""
    engine = opts.engine or convention.serving_convention(ctx.info.format)
    return next(i for i in interps if i.convention == engine)


def _chat_format(ctx: EvalContext, opts: EvalOptions) -> dict[str, Any] | None:
    """``data.chat_format``: the verifier's chat template against the samples evaluated (None without
    a verifier, whose folder holds the tokenizer)."""
    if ctx.chat is not None:
        return ctx.chat.to_dict()
    return chattemplate.no_template(opts.verifier) if opts.verifier is not None else None


def _measured_from_engine(verdict: layouts.Verdict, source: Path) -> layouts.Verdict:
    """The slot layers came from the engine's own states: the verdict says so first."""
    run = source.parent.name
    head = f"Measured from the engine (capture-check run {run}): "
    verdict.message = head + verdict.message
    verdict.diagnosis = head + verdict.diagnosis if verdict.diagnosis else verdict.diagnosis
    return verdict


#: the most layouts scanned on the engine's states: every choice of 3 of a 32-layer target's 33
#: boundaries is 5456; beyond this only the served and trained layouts are scored there
MAX_ENGINE_LAYOUTS = 6000


def _on_engine_states(ctx: EvalContext, opts: EvalOptions, dtype: torch.dtype) -> dict[str, Any]:
    """The report's ``engine_states``: the draft scored on the engine's own states (every boundary a
    slot) for the layout the engine feeds, the one training used and the best of the scan there, by
    the same scan and metrics passes as on the dumps."""
    assert opts.engine_states is not None
    states = engine_states.open_for(opts.engine_states, ctx.dumps, ctx.hidden_size)
    ids = list(states.slots.layer_ids or ())
    ectx = dataclasses.replace(ctx, world=distributed.SINGLE, dumps=states, slot_count=len(ids),
                               final_slot=states.slots.final_slot,
                               final_source="the engine's final boundary (capture check)",
                               num_layers=states.slots.num_hidden_layers or ctx.num_layers, skipped={}, extra={},
                               chat=None, read={"samples": 0, "bytes": 0}, tally=None)
    if ectx.head is None and ctx.verifier is not None:
        ectx.head = _verifier_head(ctx.verifier, ctx.draft, ctx.device, dtype)
    count = len(states.files) if opts.limit is None else min(opts.limit, len(states.files))
    interps = layouts.interpret(ctx.info.configured_layer_ids, ids, ectx.num_layers,
                                read_by=ctx.info.ids_by_engine or None)
    served = _served(interps, ctx, opts)
    aux = ctx.draft.arch.num_aux
    roles: dict[str, tuple[int, ...]] = {}
    if served.slots is not None and len(served.slots) == aux:
        roles["served"] = tuple(served.slots)
    trained = _trained_ids(ctx)
    if trained is not None and all(i in ids for i in trained):
        roles["trained"] = tuple(ids.index(i) for i in trained)
    combos = list(itertools.combinations(range(len(ids)), aux))
    scanned = len(combos) <= MAX_ENGINE_LAYOUTS
    _log(f"engine states: {count} samples of {states.root}, "
         + (f"every choice of {aux} of {len(ids)} boundaries" if scanned else "the served and trained layouts"))
    if scanned:
        _, scan, basis = _scan(ectx, range(count), opts, combos=combos)
        roles["best"] = _roles(scan, basis, served, aux).get("best", roles.get("served", combos[0]))
    full, tokens, _, _ = _metrics(ectx, range(count), roles, opts)
    basis = "verifier" if ectx.head is not None else "data"

    def row(role: str, score: LayoutScore) -> dict[str, Any]:
        counts = score.counts(basis) or score.data
        layer_ids = [ids[s] for s in score.slots]
        return {"role": role, "states": "engine", "slots": list(score.slots), "layer_ids": layer_ids,
                "layer_ids_vllm": convention.convert(layer_ids, convention.SGLANG, convention.VLLM),
                "step0_acc": counts.full_acc()[0],   # nothing scored (every file NaN): no 1.0 made up
                "accept_length": counts.accept_length(opts.steps) if counts.full_acc()[0] is not None else None}
    return {"path": str(states.root), "states": "engine", "samples": count, "tokens": tokens, "basis": basis,
            # engine-state files not scored (NaN/inf), as the top-level ``skipped`` names the dumps' own
            "skipped": [{"path": path, "reason": why} for path, why in ectx.skipped.items()],
            "steps": opts.steps, "slots": len(ids), "slot_layer_ids": ids, "final_slot": ectx.final_slot,
            "scanned_layouts": len(combos) if scanned else 0,
            "trained_from": _trained_from(ctx, trained),
            "served_interpretation": served.to_dict(),
            "layouts": [row(role, full[role]) for role in ("served", "trained", "best") if role in full],
            "agreement": agreement.compare(states, ctx.dumps, engine_states.indices(states))}


def _trained_ids(ctx: EvalContext) -> list[int] | None:
    """The SGLang ids of the slots training read: the first ``num_aux`` slots other than the final one,
    as speculators' loader (``hidden_states[:, :-1]``) and SpecForge's and ModelOpt's (their aux
    states) read them; None when the dumps' layers are unknown."""
    ids = ctx.dumps.slots.layer_ids
    if ids is None:
        return None
    aux = [ids[s] for s in range(ctx.slot_count) if s != ctx.final_slot][: ctx.draft.arch.num_aux]
    return aux if len(aux) == ctx.draft.arch.num_aux else None


def _trained_from(ctx: EvalContext, trained: list[int] | None) -> str:
    if trained is None:
        return "unknown: the dumps' slot layers are unknown (no data_config.json and no --measured)"
    kind = dumpformats.NAME.get(ctx.dumps.format, ctx.dumps.format)
    return f"the dumps' aux slots ({kind}): the first {len(trained)} slots other than the final one"


def _load(opts: EvalOptions, device: torch.device, dtype: torch.dtype) -> EvalContext:
    verifier = Verifier(opts.verifier) if opts.verifier else None
    draft, info = load_checkpoint(opts.ckpt, opts.config, verifier, device, dtype)
    dumps = DumpSet.open(opts.data)
    first = dumps.load(0)
    _, s, h = first.hidden.shape
    arch = draft.arch
    if h != arch.aux_hidden_size:
        raise ShapeMismatchError(
            "The dump's hidden size differs from the draft's aux width per slot", path=first.path,
            tensor="hidden_states", expected=f"[T, S, {arch.aux_hidden_size}]",
            found=list(first.hidden.shape),
            fix="the dump and the draft come from different target models; pass the matching --data/--ckpt",
        )
    if s < arch.num_aux:
        raise DataError("The dump has fewer slots than the draft's fc takes", path=first.path,
                        tensor="hidden_states", expected=f">= {arch.num_aux} slots", found=f"{s} slots",
                        fix="dump at least as many layers as the draft was trained on")
    found = _found(opts, dumps, draft, info, s)
    slots = dumps.slots
    if slots.layer_ids is not None and len(slots.layer_ids) != s:
        raise ConfigError("data_config.json lists a different number of layer ids than the dump has slots",
                          path=slots.path, tensor="layer_ids", expected=f"{s} ids",
                          found=list(slots.layer_ids),
                          fix="list one layer id per slot of hidden_states, in slot order")
    if slots.final_slot is not None and not 0 <= int(slots.final_slot) < s:
        raise ConfigError("final_slot in data_config.json is not a slot of the dump", path=slots.path,
                          tensor="final_slot", expected=f"0..{s - 1} or null", found=slots.final_slot,
                          fix="set final_slot to the index of the final-layer slot, or null")
    num_layers = slots.num_hidden_layers or (verifier.num_hidden_layers if verifier else None)
    dumps.slots = slots = slots.with_layers(num_layers)
    final_slot, final_source = _final_slot(slots, num_layers, s, arch.num_aux)
    head = None
    if verifier is not None:
        if final_slot is None:
            info.warnings.append("a verifier was given but the dump has no final-layer slot: "
                                 "verifier targets are skipped")
        else:
            head = _verifier_head(verifier, draft, device, dtype)
    budget = opts.batch_tokens or (16384 if device.type == "cuda" else 8192)
    template = chattemplate.Template.read(opts.verifier) if opts.verifier else None
    return EvalContext(draft, info, dumps, verifier, head, s, h, final_slot, final_source, num_layers,
                       device, budget, chat=chattemplate.Scan(template) if template else None, extra=found,
                       tally=_tally(opts, info, draft, verifier, head, dtype))


def _tally(opts: EvalOptions, info: CheckpointInfo, draft: Eagle3Draft, verifier: Verifier | None,
           head: VerifierHead | None, dtype: torch.dtype) -> temperature.TemperatureTally | None:
    """The prediction at ``--temperature`` needs the target's whole distribution: the verifier's head
    on the dumps' final-layer slot; without them the report says why it has none."""
    if not opts.temperatures:
        return None
    if verifier is None or head is None:
        info.warnings.append("--temperature needs the target's distribution: pass --verifier (the target model) "
                             "and dumps with a final-layer slot; no prediction at temperature was made")
        return None
    emit = draft.draft_to_target(torch.arange(draft.arch.draft_vocab_size, device=draft.device)).cpu()
    return temperature.TemperatureTally(opts.temperatures, opts.steps, temperature.target_head(
        verifier, draft.arch.vocab_size, draft.device, dtype, draft.arch.rms_norm_eps), emit)


def _found(opts: EvalOptions, dumps: DumpSet, draft: Eagle3Draft, info: CheckpointInfo, slots: int
           ) -> dict[str, Any]:
    """What the files next to the draft and the dumps say for the cause checks (ctx.extra); a capture
    check's measured slot layers replace data_config.json's (``dumps.slots``)."""
    found: dict[str, Any] = {}
    if opts.measured is not None:
        measured, differs = read_capture_check(opts.measured, slots)
        if measured is not None:
            dumps.slots = measured
        else:  # the dumps are not of the target as served: the finding target-differs says so
            found[CAPTURE] = differs
    if info.vocab_map is None or info.vocab_map.pattern is None:  # a broken map has its own finding
        mapped = trainermap.compare(dumps.root, draft.w["d2t"], draft.arch.vocab_size)
        if mapped is not None:
            found[TRAINER_MAP] = mapped
    return found


def _log(line: str) -> None:
    """A plain log line between the machine-readable events."""
    print(f"drafter: {line}", flush=True)


def _final_slot(info: SlotInfo, num_layers: int | None, slots: int, num_aux: int) -> tuple[int | None, str | None]:
    """The dump slot holding the target's final pre-norm state (see docs/drafter.md)."""
    given, slot_ids = info.final_slot, info.layer_ids
    if info.final_slot_given:
        return (int(given) if given is not None else None), info.final_source
    if slot_ids is not None and num_layers is not None and num_layers - 1 in slot_ids:
        return list(slot_ids).index(num_layers - 1), "num_hidden_layers"
    if slots > num_aux:
        return slots - 1, "last slot (speculators convention)"
    return None, None


def _verifier_head(verifier: Verifier, draft: Eagle3Draft, device: torch.device,
                   dtype: torch.dtype) -> VerifierHead:
    arch = draft.arch
    if verifier.hidden_size != arch.hidden_size:
        raise ShapeMismatchError("The verifier's hidden size differs from the draft's", path=verifier.path,
                                 tensor=verifier.embed_name, expected=f"[V, {arch.hidden_size}]",
                                 found=f"[V, {verifier.hidden_size}]",
                                 fix="pass --verifier the target model the draft was trained for")
    verifier.check_head_width(arch.hidden_size)
    targets = draft.draft_to_target(torch.arange(arch.draft_vocab_size, device=draft.device)).cpu()
    inside = (targets >= 0) & (targets < arch.vocab_size)  # a broken (arange) map sends some past the vocab
    order = torch.argsort(torch.where(inside, targets, arch.vocab_size))[: int(inside.sum())]
    rows = torch.zeros(arch.draft_vocab_size, arch.hidden_size)  # a draft id the target lacks: logit 0
    rows[order] = verifier.lm_head_rows(targets[order]).to(torch.float32)
    return VerifierHead(verifier.final_norm().to(device, dtype), rows.to(device, dtype), arch.rms_norm_eps)


def _batches(ctx: EvalContext, samples: Sequence[int], max_len: int | None, in_order: bool = False,
             slots: Sequence[int] | None = None, start: int = 0) -> Generator[Batch, None, None]:
    """Batches of ``samples``, read ahead on threads (``background``: the next batches' files are read
    while this one is scored).  Sorted by length (less padding) unless ``in_order`` (the sequential
    verdict's blocks of at most ``sequential.BLOCK`` samples); only ``slots`` are read when given.
    Sorted, the batches are planned from the files' token counts and a rank of a torchrun takes every
    ``world.size``-th of them (the same batches as one process's); where the format has no token counts
    in a header, its contiguous share of the samples.  ``start``: the first sample's position."""
    load = ctx.load if slots is None else functools.partial(ctx.load, slots=slots)
    pin, shape = ctx.device.type == "cuda", (ctx.slot_count, ctx.hidden_size)
    lengths = None if in_order else ctx.dumps.lengths_of(samples)
    if lengths:
        ranked = sorted(zip(lengths, samples, strict=True))
        planned = plan([i for _, i in ranked], [n for n, _ in ranked], ctx.budget, max_len)
        host = iter_planned(load, ctx.world.shard(planned), max_len, pin=pin, shape=shape)
    else:
        mine = ctx.world.chunk(list(enumerate(samples, start)))
        host = iter_batches(load, [i for _, i in mine], ctx.budget, max_len, pin=pin, shape=shape,
                            max_samples=sequential.BLOCK if in_order else None, start=mine[0][0] if mine else start)
    return to_device(background(host), ctx.device)


def _verifier_targets(ctx: EvalContext, batch: Batch) -> torch.Tensor | None:
    if ctx.head is None or ctx.final_slot is None:
        return None
    return ctx.head.targets(batch.final(ctx.final_slot))


def _slot_stats(ctx: EvalContext) -> SlotStats | None:
    """The comparison of the slots with the target's own states, when a verifier of the dumps' width
    and vocabulary is given (slotstats.py)."""
    v = ctx.verifier
    if v is None or v.embed_name is None:
        return None
    rows, width = (list(v.store.shape(v.embed_name)) + [0, 0])[:2]
    if width != ctx.hidden_size or rows < ctx.draft.arch.vocab_size:
        return None
    embed = ctx.draft.w["embed_tokens.weight"]
    mine = ctx.info.embed_source == "checkpoint"
    return SlotStats.prepare(v, ctx.dumps.slots.layer_ids, embed if mine else None, None if mine else embed)


def _scan(ctx: EvalContext, samples: Sequence[int], opts: EvalOptions, slot_stats: SlotStats | None = None,
          combos: list[tuple[int, ...]] | None = None) -> tuple[list[float], dict[tuple[int, ...], LayoutScore], str]:
    if combos is None:
        combos = list(itertools.combinations(range(ctx.slot_count), ctx.draft.arch.num_aux))
    scan = {c: new_score(c, 1, ctx.head is not None) for c in combos}
    norm_parts: list[tuple[int, torch.Tensor]] = []   # per batch: (first position, per-slot float64 sums)
    rows = done = 0
    count = len(ctx.world.chunk(samples))   # this rank's share, about
    with torch.inference_mode():
        for batch in _batches(ctx, samples, opts.max_len):
            valid = torch.arange(batch.states.shape[1], device=ctx.device)[None, :] <= batch.lengths[:, None]
            rms = batch.states.float().pow(2).mean(-1).sqrt()  # [B, T, S]
            norm_parts.append((int(batch.positions[0]), (rms.double() * valid[..., None]).sum((0, 1)).cpu()))
            rows += int(valid.sum())
            if slot_stats is not None:
                slot_stats.update(batch)
            vt = _verifier_targets(ctx, batch)
            for combo in combos:
                score_batch(ctx.draft, batch, scan[combo], 1, vt)
            done += batch.lengths.shape[0]
            events.progress(done, count, "layout scan samples")
    basis = "verifier" if ctx.head is not None else "data"
    if ctx.world.size > 1:
        scan, norm_sum, rows = reduce.gather_scan(ctx.world, scan, norm_parts, rows, ctx.slot_count)
    else:
        norm_sum = reduce.norms([norm_parts], ctx.slot_count)
    return [float(x) for x in norm_sum / max(rows, 1)], scan, basis


def _slot_stats_pass(ctx: EvalContext, samples: Sequence[int], opts: EvalOptions, slot_stats: SlotStats) -> None:
    """Rank 0 of a torchrun compares the scan's first batches with the target (MAX_ROWS rows, as one
    process does within its scan), reading them again on its own: not counted in ``data.read``."""
    solo = dataclasses.replace(ctx, world=distributed.SINGLE, chat=None, skipped={}, read={"samples": 0, "bytes": 0})
    with torch.inference_mode(), contextlib.closing(_batches(solo, samples, opts.max_len)) as batches:
        for batch in batches:
            if slot_stats.full:
                break
            slot_stats.update(batch)


def _roles(scan: dict[tuple[int, ...], LayoutScore], basis: str, served: Interpretation,
           num_aux: int) -> dict[str, tuple[int, ...]]:
    """The layouts the metrics pass measures: what the engine feeds, and the scan's best."""
    accs = {s: (v.step0(basis) if v.step0(basis) is not None else -1.0) for s, v in scan.items()}
    best = max(accs, key=lambda s: (accs[s], [-x for x in s]))
    roles: dict[str, tuple[int, ...]] = {}
    if served.slots is not None and len(served.slots) == num_aux:
        roles["served"] = tuple(served.slots)
    if best != roles.get("served"):
        roles["best"] = best
    return roles


@dataclass(frozen=True)
class _Variant:
    """The draft as the serving engine runs it (config keys it ignores switched off), scored on ``slots``."""

    draft: Eagle3Draft
    slots: tuple[int, ...]
    engine: str
    keys: list[dict[str, Any]]
    role: str = "as-engine-runs"   # its role in the metrics pass (not a layout role of the report)
    kv_store: kvcache.Store | None = None   # how its KV cache holds keys and values (None: exact)


def _as_engine_runs(ctx: EvalContext, opts: EvalOptions, roles: dict[str, tuple[int, ...]]) -> _Variant | None:
    """A variant for the config-key-ignored check (causes/config_keys.py) when the engine the host
    serves with ignores a key this draft was trained with; scored on the trained (best) layout."""
    engine = config_keys.engine_of(opts.engine, ctx.info.format)
    keys = config_keys.ignored(ctx.draft, engine, opts.engine_version)
    if not keys:
        return None
    slots = roles.get("best", roles.get("served"))
    assert slots is not None
    return _Variant(config_keys.as_engine_runs(ctx.draft, keys), slots, engine,
                    config_keys.describe(keys, engine))


def _variant_extra(variant: _Variant | None, score: LayoutScore | None, full: dict[str, LayoutScore], basis: str,
                   opts: EvalOptions, ctx: EvalContext, count: int) -> dict[str, Any]:
    """What the config-key-ignored check reads: both runs' step-0 accuracy and accept length."""
    if variant is None or score is None:
        return {}
    trained = next(sc for sc in full.values() if sc.slots == variant.slots)

    def run(score: LayoutScore) -> dict[str, float | None]:
        counts = score.counts(basis) or score.data
        return {"step0_acc": counts.full_acc()[0], "accept_length": counts.accept_length(opts.steps)}

    version, assumed = engine_rules.effective(variant.engine, opts.engine_version)
    slot_ids = ctx.dumps.slots.layer_ids
    return {CONFIG_KEY_IGNORED.key: {
        "engine": variant.engine, "engine_version": version, "version_assumed": assumed, "keys": variant.keys,
        "layer_ids": [slot_ids[s] for s in variant.slots] if slot_ids else list(variant.slots),
        "samples": count, "basis": basis, "as_trained": run(trained), "as_engine_runs": run(score)}}


_VARIANT = "as-engine-runs"  # the variant's role in the metrics pass (not a layout role of the report)
_HEAD = "as-target-head"  # the draft with the parts its engine replaces taken from the target (headshare.py)


def _trained_slots(roles: dict[str, tuple[int, ...]]) -> tuple[int, ...]:
    slots = roles.get("best", roles.get("served"))
    assert slots is not None
    return slots


def _head_swap(ctx: EvalContext, opts: EvalOptions, roles: dict[str, tuple[int, ...]]) -> headshare.Swap | None:
    """The draft as its engine runs it when that engine's version replaces its own embed_tokens or lm_head
    with the target's (headshare.py), for the draft-head-replaced check; None when nothing is replaced."""
    if ctx.verifier is None or not roles:
        return None
    engine, verifier = config_keys.engine_of(opts.engine, ctx.info.format), ctx.verifier

    def embed() -> torch.Tensor | None:   # read only when the engine version replaces the draft's
        return verifier.embed_tokens() if verifier.embed_name is not None else None

    def rows() -> torch.Tensor:
        head = ctx.head or _verifier_head(verifier, ctx.draft, ctx.device, ctx.draft.w["lm_head.weight"].dtype)
        return head.rows
    return headshare.prepare(ctx.draft, engine, opts.engine_version, headshare.read_config(ctx.info.config_path),
                             embed, rows)


def _variants(draft: Eagle3Draft, keys: _Variant | None, swap: headshare.Swap | None,
              inherit: kvcache.Inherit | None, roles: dict[str, tuple[int, ...]]) -> list[_Variant]:
    """The drafts as the engine runs them that the metrics pass scores next to the layouts (the findings'
    evidence): config keys ignored, parts replaced by the target's, an FP8 KV cache."""
    out = [keys] if keys is not None else []
    if swap is not None:
        out.append(_Variant(swap.draft, _trained_slots(roles), swap.engine, [], _HEAD))
    if inherit is not None:
        out.append(_Variant(draft, _trained_slots(roles), inherit.engine, [], _KV, inherit.store))
    return out


_KV = "as-served-kv"  # the draft with its keys and values rounded as the served FP8 cache stores them (kvcache.py)


def _kv_inherit(ctx: EvalContext, opts: EvalOptions, roles: dict[str, tuple[int, ...]]) -> kvcache.Inherit | None:
    """The draft with an FP8 KV cache when the serve profile's KV dtype reaches the draft's cache (kvcache.py)."""
    if not roles:
        return None
    engine = config_keys.engine_of(opts.engine, ctx.info.format)
    return kvcache.prepare(engine, opts.engine_version, opts.serve_kv_cache_dtype,
                           opts.serve_draft_kv_cache_dtype)


def _kv_extra(inherit: kvcache.Inherit | None, score: LayoutScore | None, full: dict[str, LayoutScore], basis: str,
              opts: EvalOptions, count: int) -> dict[str, Any]:
    """What the draft-kv-dtype check reads: the draft with exact and with FP8-rounded keys and values."""
    if inherit is None or score is None:
        return {}
    exact = next(sc for sc in full.values() if sc.slots == score.slots)
    return {kvcache.ID: {"engine": inherit.engine, "engine_version": inherit.version,
                         "version_assumed": inherit.assumed, "target_kv_cache_dtype": inherit.target_dtype,
                         "draft_kv_cache_dtype": opts.serve_draft_kv_cache_dtype,
                         "draft_field": inherit.draft_field, "samples": count, "basis": basis,
                         "exact": _run(exact, basis, opts), "fp8": _run(score, basis, opts)}}


def _run(sc: LayoutScore, basis: str, opts: EvalOptions) -> dict[str, float | None]:
    counts = sc.counts(basis) or sc.data
    return {"step0_acc": counts.full_acc()[0], "accept_length": counts.accept_length(opts.steps)}


def _head_extra(swap: headshare.Swap | None, score: LayoutScore | None, full: dict[str, LayoutScore], basis: str,
                opts: EvalOptions, ctx: EvalContext, count: int) -> dict[str, Any]:
    """What the draft-head-replaced check reads: the draft's own parts against the target's, scored alike."""
    if swap is None or score is None:
        return {}
    own = next(sc for sc in full.values() if sc.slots == score.slots)

    def run(sc: LayoutScore) -> dict[str, float | None]:
        counts = sc.counts(basis) or sc.data
        return {"step0_acc": counts.full_acc()[0], "accept_length": counts.accept_length(opts.steps)}

    slot_ids = ctx.dumps.slots.layer_ids
    return {headshare.ID: {
        "engine": swap.engine, "engine_version": swap.version, "version_assumed": swap.assumed,
        "parts": swap.parts, "differs": swap.differs, "samples": count, "basis": basis,
        "layer_ids": [slot_ids[s] for s in score.slots] if slot_ids else list(score.slots),
        "own": run(own), "target": run(score)}}


Stop = Callable[[dict[str, LayoutScore]], bool]


def _metrics(ctx: EvalContext, samples: Sequence[int], roles: dict[str, tuple[int, ...]], opts: EvalOptions,
             variants: Sequence[_Variant] = (), stop: Stop | None = None, then: Sequence[int] = (),
             ) -> tuple[dict[str, LayoutScore], int, ChanceLevel, dict[str, Any]]:
    """The K-step metrics of every role on ``samples``.  With ``stop`` (the sequential verdict) they are
    scored in the order given, in blocks, and the pass ends the first time ``stop(scores)`` says so;
    if it never does, ``then`` (the scan's samples) is scored after them, so the counts cover every
    sample as the full pass's do.  Only the slots the roles use (and the final one) are read."""
    scores = {role: new_score(slots, opts.steps, ctx.head is not None) for role, slots in roles.items()}
    drafts = {role: ctx.draft for role in roles}
    for variant in variants:
        scores[variant.role] = new_score(variant.slots, opts.steps, ctx.head is not None)
        drafts[variant.role] = variant.draft
    stores = {v.role: v.kv_store for v in variants}
    draft = ctx.draft
    emit_ids = draft.draft_to_target(torch.arange(draft.arch.draft_vocab_size, device=draft.device)).cpu()
    emit = torch.zeros(draft.arch.vocab_size, dtype=torch.bool)
    emit[emit_ids[(emit_ids >= 0) & (emit_ids < draft.arch.vocab_size)]] = True
    if ctx.head is not None:  # verifier targets are draft-vocab ids, all of them emittable
        chance = ChanceLevel(draft.arch.draft_vocab_size, torch.ones(draft.arch.draft_vocab_size, dtype=torch.bool))
    else:
        chance = ChanceLevel(draft.arch.vocab_size, emit)
    t2d = draft.w.get("t2d")
    stored = t2d.to(draft.device) if t2d is not None and t2d.shape[0] == emit.shape[0] else None
    coverage = vocabmap.Coverage(emit.to(draft.device), stored)
    slots = _needed_slots(ctx, [sc.slots for sc in scores.values()])
    watched = _policy_role(ctx, roles)
    at_temperature = "served" if "served" in roles else "best"   # the layout the prediction at T is for
    tokens = done = 0
    count = len(ctx.world.chunk(samples)) + len(then)
    passes = [(samples, stop, 0), (then, None, len(samples))] if stop is not None else [(samples, None, 0)]
    with torch.inference_mode():
        for part, check, start in passes:
            for batch in _batches(ctx, part, opts.max_len, in_order=stop is not None, slots=slots, start=start):
                vt = _verifier_targets(ctx, batch)
                if vt is not None:
                    chance.update(batch.input_ids, vt, batch.scored, batch.positions)
                else:
                    chance.update(batch.input_ids, batch.next_ids.clamp(min=0), batch.scored & (batch.next_ids >= 0),
                                  batch.positions)
                coverage.update(batch.next_ids, batch.scored)
                seen = _policy_observer(ctx, batch, emit, emit_ids) if watched else None
                for role, score in scores.items():
                    with kvcache.stored(stores.get(role)):
                        score_batch(drafts[role], batch, score, opts.steps, vt,
                                    observe=seen if role == watched else None,
                                    observe_steps=_observer(ctx, batch) if role == at_temperature else None)
                tokens += int(batch.lengths.sum()) + batch.lengths.shape[0]
                done += batch.lengths.shape[0]
                events.progress(done, count, "metrics samples")
                if check is not None and check(scores):
                    return scores, tokens, chance, coverage.to_dict()
    if ctx.world.size > 1:
        scores, tokens, chance = _gathered(ctx.world, scores, tokens, chance, coverage)
        _gather_tally(ctx)
    return scores, tokens, chance, coverage.to_dict()


def _policy_role(ctx: EvalContext, roles: dict[str, tuple[int, ...]]) -> str | None:
    """The role whose step 0 the off-policy measurement (policy.py) watches: the layout the draft was trained
    on (the best; the served one when they agree), where its tokens carry the most signal; None without
    verifier targets.  Its tally lives in ``ctx.extra`` (one per pass)."""
    if ctx.head is None or ctx.final_slot is None:
        return None
    ctx.extra[policy.ID] = policy.PolicyTally()
    return "best" if "best" in roles else "served" if "served" in roles else None


def _policy_observer(ctx: EvalContext, batch: Batch, emit: torch.Tensor, emit_ids: torch.Tensor) -> Observer:
    tally: policy.PolicyTally = ctx.extra[policy.ID]
    assert ctx.head is not None and ctx.final_slot is not None
    head, final, device = ctx.head, batch.final(ctx.final_slot), batch.next_ids.device

    def observe(rows: torch.Tensor, draft_ids: torch.Tensor) -> None:
        tally.observe(head, final, batch.next_ids, batch.scored, emit.to(device), emit_ids.to(device), rows, draft_ids)
    return observe


def _observer(ctx: EvalContext, batch: Batch) -> temperature.Observer | None:
    if ctx.tally is None or ctx.final_slot is None:
        return None
    return ctx.tally.observer(batch, ctx.final_slot)


def _gather_tally(ctx: EvalContext) -> None:
    """The ranks' counts at temperature on rank 0 (put back in one process's order there)."""
    if ctx.tally is None:
        return
    parts = ctx.world.gather(ctx.tally.state())
    if parts is not None:
        ctx.tally.merge(parts[1:])


def _gathered(world: distributed.World, scores: dict[str, LayoutScore], tokens: int, chance: ChanceLevel,
              coverage: vocabmap.Coverage) -> tuple[dict[str, LayoutScore], int, ChanceLevel]:
    """The metrics pass of every rank on rank 0, exactly (reduce.py); the other ranks keep their own."""
    parts = world.gather((scores, tokens, chance, reduce.coverage_state(coverage)))
    if parts is None:
        return scores, tokens, chance
    reduce.coverage(coverage, [p[3] for p in parts])
    return reduce.scores([p[0] for p in parts]), sum(p[1] for p in parts), reduce.chance([p[2] for p in parts])


def _merge_context(ctx: EvalContext) -> None:
    """What every rank's loads found (samples skipped, bytes read, the chat-template scan), on rank 0."""
    parts = ctx.world.gather((ctx.skipped, ctx.read, reduce.chat_state(ctx.chat)))
    if parts is None:
        return
    for skipped, _, _ in parts[1:]:
        ctx.skipped.update(skipped)
    ctx.read = {key: sum(p[1][key] for p in parts) for key in ctx.read}
    if ctx.chat is not None:
        reduce.chat(ctx.chat, [p[2] for p in parts])


#: what every rank's dumps must agree on before scoring (fingerprint of format and layout)
FINGERPRINT = ("format", "samples", "files", "slots", "hidden_size", "layer_ids", "final_slot")


def _fingerprint(ctx: EvalContext) -> dict[str, Any]:
    names = "\n".join(str(f.relative_to(ctx.dumps.root)) if f != ctx.dumps.root else f.name for f in ctx.dumps.files)
    return {"format": ctx.dumps.format, "samples": len(ctx.dumps.files),
            "files": hashlib.sha256(names.encode()).hexdigest()[:16], "slots": ctx.slot_count,
            "hidden_size": ctx.hidden_size, "layer_ids": list(ctx.dumps.slots.layer_ids or []) or None,
            "final_slot": ctx.final_slot}


def _agreed(world: distributed.World, load: Callable[[], EvalContext], opts: EvalOptions) -> EvalContext:
    """Each rank loads its own draft and dumps, then (a torchrun) the ranks compare what they found
    before any is scored: a rank that could not load, or dumps of another format or layout, end every
    rank with one paragraph naming the ranks, their hosts and what differs."""
    if world.size == 1:
        return load()
    ctx: EvalContext | None = None
    problem = None
    try:
        ctx = load()
    except DrafterError as exc:
        problem = str(exc)
    found = world.all_gather({"rank": world.rank, "host": world.host, "data": str(opts.data), "error": problem,
                              **(_fingerprint(ctx) if ctx is not None else {})})
    failed = [f for f in found if f["error"]]
    if failed:
        raise RankError(" ".join(f"Rank {f['rank']} of {world.size} (host {f['host']}, --data {f['data']}) could "
                                 f"not load its draft or dumps: {f['error']}" for f in failed))
    differ = [key for key in FINGERPRINT if len({repr(f[key]) for f in found}) > 1]
    if differ:
        seen = "; ".join(f"rank {f['rank']} (host {f['host']}, --data {f['data']}): "
                         + ", ".join(f"{key} {f[key]}" for key in differ) for f in found)
        raise RankError(f"The ranks' dumps differ in {', '.join(differ)}, so their counts cannot be added: {seen}",
                        field="--data", expected="the same dump set (format, files, slots, layer ids) on every rank",
                        found=", ".join(differ),
                        fix="give every host the same dumps at --data (a shared filesystem or a copy of the same "
                            "files); each rank scores its own share of them")
    assert ctx is not None
    ctx.world = world
    return ctx


def _needed_slots(ctx: EvalContext, layouts: Sequence[Sequence[int]]) -> list[int] | None:
    """The slots the metrics pass reads: those of the layouts scored and, for verifier targets, the
    final one (None: every slot, so the files are read whole)."""
    needed = {s for layout in layouts for s in layout}
    if ctx.head is not None and ctx.final_slot is not None:
        needed.add(ctx.final_slot)
    return sorted(needed) if len(needed) < ctx.slot_count else None


def _sequential(ctx: EvalContext, picked: list[int], scan_n: int, roles: dict[str, tuple[int, ...]],
                opts: EvalOptions, variants: Sequence[_Variant], basis: str
                ) -> tuple[dict[str, LayoutScore], int, ChanceLevel, dict[str, Any], dict[str, Any]]:
    """The sequential verdict's metrics pass (sequential.py): the samples the scan did not see, in the
    seeded order, until the served-vs-best comparison is decided (or, with one layout to measure, one
    block); at the end of the data undecided, the scan's samples too, and the full pass's rule decides."""
    compared = "served" in roles and "best" in roles
    test = sequential.SequentialTest(opts.alpha, opts.layout_tolerance, opts.steps, compared=compared)
    watch = sequential.Watch(test, basis, "served" if "served" in roles else "best")

    def stop(scores: dict[str, LayoutScore]) -> bool:
        return bool(ctx.skipped) or any(sc.nonfinite for sc in scores.values()) or watch(scores)

    # the chat-template scan counts the layout scan's samples only: which later files the read-ahead
    # loads before the stop depends on thread timing, and the evidence must not
    chat, ctx.chat = ctx.chat, None
    try:
        full, tokens, chance, coverage = _metrics(ctx, picked[scan_n:], roles, opts, variants, stop=stop,
                                                  then=picked[:scan_n])
    finally:
        ctx.chat = chat
    first = next(iter(full.values()))
    scored = (first.counts(basis) or first.data).per_sample().samples
    broken = bool(ctx.skipped) or any(sc.nonfinite for sc in full.values())
    decided_by = (sequential.DECIDED if test.outcome is not None else
                  sequential.ONE_LAYOUT if not compared and watch.done else
                  sequential.NON_FINITE if broken else sequential.END_OF_DATA)
    info = {"method": sequential.METHOD, "seed": opts.seed, "order": "random.Random(seed).shuffle of the sample "
            "indices; the first layout_samples of that order are the layout scan's, scored last",
            "block_samples": sequential.BLOCK, "samples_total": len(picked), "scan_samples": scan_n,
            "samples_scored": scored, "decided_by": decided_by, **test.to_dict()}
    return full, tokens, chance, coverage, info


def _sequential_comparison(cmp_: stats.Comparison | None, seq: dict[str, Any]) -> stats.Comparison | None:
    """The comparison as the sequential test decided it: its outcome, and its interval for the mean
    per-sample gain in place of the bootstrap's (which optional stopping would invalidate).  Undecided
    (end of data), the full pass's own comparison of every sample stands."""
    if cmp_ is None or seq["outcome"] is None:
        return cmp_
    return dataclasses.replace(cmp_, method=sequential.METHOD, outcome=seq["outcome"],
                               significant=seq["outcome"] == stats.BETTER, gain_ci=list(seq["gain_ci"]))


def _evidence(ctx: EvalContext, opts: EvalOptions, full: dict[str, LayoutScore], chance: ChanceLevel,
              basis: str, scan: dict[tuple[int, ...], LayoutScore], scan_n: int, count: int) -> Evidence:
    """The full-set measurements the verdict is decided on."""
    def measured(score: LayoutScore) -> Measured:
        counts = score.counts(basis)
        assert counts is not None
        return Measured(score.slots, counts.full_acc()[0], counts.accept_length(opts.steps))

    served = full.get("served")
    best = full.get("best", served)
    assert best is not None
    comparison = None
    if served is not None and "best" in full:
        served_counts, best_counts = served.counts(basis), full["best"].counts(basis)
        assert served_counts is not None and best_counts is not None
        comparison = stats.compare(served_counts.per_sample(), best_counts.per_sample(), opts.alpha,
                                   opts.layout_tolerance)
    nonfinite = [f"{path}: {why}" for path, why in ctx.skipped.items()]
    for name, group in (("the layout scan", scan.values()), ("the metrics pass", full.values())):
        bad = [(sc.slots, sc.nonfinite) for sc in group if sc.nonfinite]
        if bad:
            nonfinite.append(f"the draft's logits were NaN or inf on {sum(n for _, n in bad)} rows in {name} "
                             f"(layouts {[list(s) for s, _ in bad][:4]})")
    first = best.counts(basis)
    constant, token = chance.constant()
    if token is not None and ctx.head is not None:  # a draft-vocab id: report the target id
        token = int(ctx.draft.draft_to_target(torch.tensor([token], device=ctx.draft.device))[0])
    return Evidence(basis=basis, steps=opts.steps, samples=count,
                    scored_rows=first.full_total[0] if first is not None else 0, scan_layouts=len(scan),
                    scan_samples=scan_n, best=measured(best),
                    served=measured(served) if served is not None else None, comparison=comparison,
                    chance_constant=constant, chance_token=token, chance_current=chance.current_token(),
                    min_skill=opts.min_skill, nonfinite=nonfinite)
