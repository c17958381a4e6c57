"""The versioned JSON report of ``eval`` (schema documented in docs/drafter.md).

The local side renders tables from it, so keys are only ever added within a schema version;
renaming or removing one bumps ``SCHEMA``.
"""
from __future__ import annotations

import errno
import json
import math
from pathlib import Path
from typing import Any

import torch

from ..eagle import acceptlength, convention
from ..fileio import atomic_write_bytes
from . import causes, measures
from .causes.states import CAPTURE
from .context import EvalContext
from .data import dumpformats, trainerconfig
from .errors import OptionError, ResourceError
from .options import EvalOptions
from .scoring.score import LayoutScore
from .scoring.temperature import ID
from .verdict import layouts
from .verdict.results import Results

SCHEMA = "draftops.drafter-report/1"
REPORT_NAME = "report.json"


def build(opts: EvalOptions, ctx: EvalContext, res: Results) -> dict[str, Any]:
    """Assemble the report dict."""
    slot_ids = ctx.dumps.slots.layer_ids
    ids_of = (lambda slots: [slot_ids[s] for s in slots]) if slot_ids is not None else (lambda slots: None)
    expected = _expected(opts, res)
    note = _expected_note(expected) if expected and expected["flagged"] else ""
    findings = causes.collect(causes.Facts(opts, ctx, res, res.extra))
    layouts.not_nothing_to_fix(res.verdict, [f.id for f in findings if f.severity == "bad"])
    served_acc = _accept(res.full.get("served"), res.basis, opts.steps)
    best_acc = _accept(res.full.get("best"), res.basis, opts.steps)
    return {
        "schema": SCHEMA,
        "verdict": {**res.verdict.to_dict(), "message": res.verdict.message + note,
                    "diagnosis": res.verdict.diagnosis + note,
                    "serving_convention": convention.serving_convention(ctx.info.format),
                    "advice_engine": opts.engine,
                    "expected_acc": expected, "findings": [f.id for f in findings],
                    "expected_accept": _expected_accept(opts, served_acc if served_acc is not None else best_acc)},
        "findings": [f.to_dict() for f in findings],   # the records' report.json form, unchanged
        "slot_layers_from": _layers_from(opts, ctx),
        "slot_norms": [{"slot": i, "layer_id": slot_ids[i] if slot_ids else None,
                        "role": layouts.slot_role(i, slot_ids, ctx.final_slot), "rms": rms}
                       for i, rms in enumerate(res.norms)],
        "layouts": [{"slots": list(s), "layer_ids": ids_of(s),
                     "step0_acc": {"data": sc.step0("data"), "verifier": sc.step0("verifier")},
                     "acc": sc.step0(res.basis), "states": "dumps",
                     "tags": _tags(s, res)} for s, sc in res.scan.items()],
        "interpretations": [i.to_dict() for i in res.interps],
        "metrics": {"steps": opts.steps, "basis": res.basis, "states": "dumps",
                    **{role: _evaluation(sc, ids_of) for role, sc in res.full.items()},
                    **{role: None for role in ("served", "best") if role not in res.full}},
        "predicted_accept_length": {"steps": opts.steps, "basis": res.basis, "states": "dumps",
                                    "served": served_acc, "best": best_acc,
                                    "value": served_acc if served_acc is not None else best_acc,
                                    "definition": acceptlength.PREDICTED, "walk_definition": acceptlength.WALK,
                                    "walk": {"served": _walked(res.full.get("served"), res.basis),
                                             "best": _walked(res.full.get("best"), res.basis)},
                                    "ci": _accept_ci(res.sequential)},
        "accuracy_by_position": _by_position(res),
        "sequential": res.sequential,
        "temperature": res.extra.get(ID),
        "engine_states": res.engine_states,
        "checkpoint": ctx.info.to_dict(),
        "verifier": ctx.verifier.describe() if ctx.verifier else None,
        "data": {
            "path": str(ctx.dumps.root), "formats": ctx.dumps.formats, "files": len(ctx.dumps.files),
            "first_files": [str(f) for f in ctx.dumps.files[:5]], "samples": res.samples,
            "tokens": res.tokens, "layout_scan_samples": res.scan_samples, "slots": ctx.slot_count,
            "hidden_size": ctx.hidden_size, "slot_layer_ids": list(slot_ids) if slot_ids else None,
            "layer_id_convention_in_file": ctx.dumps.slots.convention, "data_config": ctx.dumps.slots.path,
            "num_hidden_layers": ctx.num_layers, "final_slot": ctx.final_slot,
            "final_slot_source": ctx.final_source,
            "skipped": [{"path": path, "reason": why} for path, why in res.skipped.items()],
            "vocab_coverage": res.coverage,
            **measures.in_report(res.extra),   # slot_statistics, vocab_mapping, chat_format (measures.py)
            "samples_total": res.total if res.total is not None else res.samples,
            "read": res.read,
        },
        "run": {"device": str(ctx.device), "dtype": res.dtype, "seconds": round(res.seconds, 3),
                "torch": torch.__version__, "steps": opts.steps, "limit": opts.limit,
                "batch_tokens": ctx.budget, "max_len": opts.max_len, "alpha": opts.alpha,
                "layout_tolerance": opts.layout_tolerance, "min_skill": opts.min_skill,
                "mode": "full" if opts.full else "sequential", "seed": None if opts.full else opts.seed},
        "warnings": list(ctx.info.warnings),
    }


def _layers_from(opts: EvalOptions, ctx: EvalContext) -> str | None:
    """Where the slots' layer ids came from: a capture-check, data_config.json, or nowhere (said why
    for the formats that never record them)."""
    if opts.measured is not None and CAPTURE not in ctx.extra:
        return "capture-check (measured from the engine): " + str(opts.measured)
    slots = ctx.dumps.slots
    if slots.source is not None:
        known = ("" if slots.layer_ids is not None else
                 " (aux slots only: the target's layer count is unknown; pass --verifier)")
        return f"{slots.source}: {slots.path}{known}"
    if slots.path is not None or ctx.dumps.format not in dumpformats.TRAINERS:
        return slots.path
    yaml = trainerconfig.yaml_next_to(ctx.dumps.root)
    unread = (f"; {yaml} looks like a trainer's YAML run config, which the host side cannot read (its ml-env "
              "has no YAML parser): copy its aux_hidden_state_layer_ids into data_config.json" if yaml else "")
    return (f"unknown: {dumpformats.NAME[ctx.dumps.format]} dumps do not record their layers and no trainer "
            "config next to them names them; pass a data_config.json next to them (or one folder up) or run "
            f"`invoke capture-check`{unread}")


def _tags(slots: tuple[int, ...], res: Results) -> list[str]:
    tags = []
    if list(slots) == res.verdict.best_slots:
        tags.append("best")
    for interp in res.interps:
        if interp.slots is not None and tuple(interp.slots) == slots:
            tags.append(f"configured-{interp.convention}")
    return tags


def _evaluation(score: LayoutScore, ids_of: Any) -> dict[str, Any]:
    return {"slots": list(score.slots), "layer_ids": ids_of(score.slots), "states": "dumps",
            "data": score.data.to_dict(),
            "verifier": score.verifier.to_dict() if score.verifier else None}


def _by_position(res: Results) -> dict[str, Any] | None:
    """Step-0 accuracy of the served (else best) layout by position bucket: decay with position shows
    a draft trained on shorter sequences than it serves (finding context-beyond-training)."""
    role = "served" if "served" in res.full else "best" if "best" in res.full else None
    if role is None:
        return None
    counts = res.full[role].counts(res.basis) or res.full[role].data
    return {"layout": role, "basis": res.basis, "positions": "token index in the sample",
            "longest": counts.longest, "buckets": counts.by_position()}


def _accept(score: LayoutScore | None, basis: str, steps: int) -> float | None:
    return (score.counts(basis) or score.data).accept_length(steps) if score is not None else None


def _accept_ci(seq: dict[str, Any] | None) -> dict[str, Any] | None:
    """The sequential verdict's interval for each layout's accept length (mean over samples; None for
    the full pass, whose figures are exact for the samples it has)."""
    if seq is None:
        return None
    accept = seq["accept_length"]
    return {"level": seq["ci_level"], "over": "samples (each weighs the same), a confidence sequence",
            **{role: (accept[role] or {}).get("ci") for role in ("served", "best")}}


def _walked(score: LayoutScore | None, basis: str) -> float | None:
    """Tokens per round of a greedy server decoding the dump text (metrics.walk; docs/bench.md)."""
    return (score.counts(basis) or score.data).walked_accept_length() if score is not None else None


def _expected(opts: EvalOptions, res: Results) -> dict[str, Any] | None:
    """Compare a training-reported step-0 accuracy with what the served and best layouts score."""
    if opts.expected_acc is None:
        return None
    expected = opts.expected_acc / 100 if opts.expected_acc > 1 else opts.expected_acc
    measured = {role: sc.step0(res.basis) for role, sc in res.full.items()}
    served = measured.get("served")
    reference = served if served is not None else measured.get("best")
    gap = expected - reference if reference is not None else None
    return {"expected": expected, "served": served, "best": measured.get("best"),
            "gap": gap, "tolerance": opts.acc_tolerance,
            "flagged": gap is not None and gap > opts.acc_tolerance}


def _expected_accept(opts: EvalOptions, predicted: float | None) -> dict[str, Any] | None:
    """An accept length the user brought (``--expected-accept-length``), converted from its source's
    definition to 1 + accepted/drafts before it is held against the prediction (failure-modes.md #12)."""
    if opts.expected_accept_length is None:
        return None
    value = acceptlength.normalize(opts.expected_accept_length, opts.expected_from)
    gap = value - predicted if predicted is not None else None
    return {"given": opts.expected_accept_length, "source": opts.expected_from,
            "source_definition": acceptlength.SOURCES[opts.expected_from][0], "value": value,
            "definition": acceptlength.VLLM, "predicted": predicted, "gap": gap, "tolerance": opts.accept_tolerance,
            "flagged": gap is not None and gap > opts.accept_tolerance * value}


def _expected_note(e: dict[str, Any]) -> str:
    served = "n/a" if e["served"] is None else f"{e['served']:.1%}"
    note = f" Training reported {e['expected']:.1%} step-0 accuracy; the served layout scores {served}"
    if e["best"] is not None and e["best"] >= e["expected"] - e["tolerance"]:
        return note + (f", the best layout {e['best']:.1%}: the training number is reproduced once the ids "
                       "are fixed.")
    if e["best"] is not None:
        return note + (f" and even the best layout only {e['best']:.1%}: check the other causes too (verifier "
                       "targets without the final norm, norm flags, a different validation split).")
    return note + "."


def write(doc: dict[str, Any], out_dir: Path) -> Path:
    """Write ``report.json`` atomically (a reader never sees half a file; a failed write leaves
    nothing behind, and two runs sharing ``--out`` never share a temporary file)."""
    path = out_dir / REPORT_NAME
    doc, nulled = finite(doc)
    if nulled:   # json.dumps wrote Infinity, which no JSON reader takes: the local side refused the whole report
        doc.setdefault("warnings", []).append(
            f"{len(nulled)} figure(s) overflowed to NaN or infinity and are written as null: "
            f"{', '.join(nulled[:5])}{' ...' if len(nulled) > 5 else ''} (a dump value near the float32 limit "
            "squares past it)")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, (json.dumps(doc, indent=2, sort_keys=False, allow_nan=False) + "\n").encode())
    except OSError as exc:
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
        kind = ResourceError if full else OptionError
        raise kind(f"The report cannot be written ({exc.strerror or exc})", path=path, field="--out",
                   fix=("free space there or pass --out a folder on another disk" if full else
                        "pass --out a folder this user can create and write")) from exc
    return path


def finite(value: Any, where: str = "") -> tuple[Any, list[str]]:
    """``value`` with every NaN or infinite float made None, and where each was (``slot_norms[2].rms``)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None, [where or "."]
    if isinstance(value, dict):
        out, found = {}, []
        for key, item in value.items():
            out[key], more = finite(item, f"{where}.{key}" if where else str(key))
            found += more
        return out, found
    if isinstance(value, (list, tuple)):
        pairs = [finite(item, f"{where}[{i}]") for i, item in enumerate(value)]
        return [p[0] for p in pairs], [w for p in pairs for w in p[1]]
    return value, []
