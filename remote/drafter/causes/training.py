"""Training causes (failure-modes.md #9): the ``undertrained`` finding.

A draft served on the layout it was trained on (verdict MATCH, so no layout finding explains it), or
near chance on every layout (UNKNOWN ``near_chance``: no layout can be told apart, the accuracy itself
is the problem), whose per-position accuracy on the evaluated dumps falls below the floors
speculators' nightly holds its drafts to, [0.4, 0.1, 0.01], is limited by its training, not by its
wiring. It is a residual cause: ``causes.collect`` drops it when another finding explains the draft. The figures
are the full (cumulative) accuracies ``full_acc_k``: the share of positions whose draft tokens
0..k are all right, which is vLLM's per-position acceptance (accepted at position k / drafts).
The field's figures go with the fix: SpecForge #128 (50k samples: accept length 1.94; the EAGLE-3
paper used 500k+), speculators #751 (examples with 5k samples).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ... import jsonread
from .facts import Facts
from .finding import Finding

FLOORS = (0.4, 0.1, 0.01)   # speculators nightly: per-position floors of full_acc_k, k = 0, 1, 2
SIZE_KEYS = ("num_train_samples", "train_samples", "num_training_samples", "train_dataset_size",
             "train_data_size", "dataset_size", "num_samples", "num_train_examples")
EPOCH_KEYS = ("num_train_epochs", "num_epochs", "epochs")
#: files next to the draft (or one folder up) where trainers record their run's settings
TRAINER_FILES = ("training_args.json", "train_config.json", "training_config.json", "trainer_config.json",
                 "args.json", "trainer_state.json")
FIELD = ("SpecForge #128: 50k samples gave accept length 1.94, the EAGLE-3 paper trained on 500k+; "
         "speculators #751's examples use 5k samples")


def _find(doc: Any, keys: tuple[str, ...], depth: int = 0, *, whole: bool = False) -> Any:
    """The first value of one of ``keys`` in a JSON document, searched breadth-first to depth 3: a finite
    positive number (a whole one when ``whole``), since JSON's NaN and Infinity and 0.5 samples are no size."""
    if not isinstance(doc, dict) or depth > 3:
        return None
    for key in keys:
        value = doc.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0 \
                and (not whole or float(value).is_integer()):
            return value
    for value in doc.values():
        found = _find(value, keys, depth + 1, whole=whole)
        if found is not None:
            return found
    return None


def training_size(config_path: str, ckpt: str) -> dict[str, Any]:
    """The training data size (samples) and epochs as the draft's config or its trainer's files record
    them; ``source`` None when nothing does (the finding then says unknown)."""
    candidates = [Path(config_path)]
    for folder in (Path(ckpt), Path(ckpt).parent):
        candidates += [folder / name for name in TRAINER_FILES]
    out: dict[str, Any] = {"samples": None, "epochs": None, "source": None}
    for path in candidates:
        try:
            doc = jsonread.load(path) if path.is_file() else None
        except (OSError, UnicodeDecodeError, ValueError):   # jsonread: nested too deep is a ValueError
            continue   # a trainer's side file is optional: an unreadable one is no evidence
        samples, epochs = _find(doc, SIZE_KEYS, whole=True), _find(doc, EPOCH_KEYS)
        if samples is not None and out["samples"] is None:
            out.update(samples=int(samples), source=str(path))
        if epochs is not None and out["epochs"] is None:
            out["epochs"] = epochs
    return out


def check(facts: Facts) -> list[Finding]:
    res = facts.res
    near_chance = res.verdict.status == "UNKNOWN" and res.verdict.reason == "near_chance"
    if res.verdict.status != "MATCH" and not near_chance:
        return []   # a wrong or undecided layout explains low accuracy first (the verdict says so)
    score = res.full.get("served") or res.full.get("best")
    if score is None:
        return []
    counts = score.counts(res.basis) or score.data
    steps = facts.opts.steps
    acc = counts.full_acc()[: min(steps, len(FLOORS))]
    below = [k for k, a in enumerate(acc) if a is not None and a < FLOORS[k]]
    if not below:
        return []
    size = training_size(facts.ctx.info.config_path, facts.ctx.info.path)
    accept = counts.accept_length(steps)
    shown = ", ".join(f"{a:.3f}" if a is not None else "n/a" for a in acc)
    floors = ", ".join(str(f) for f in FLOORS[: len(acc)])
    data = (f"it was trained on {size['samples']} samples" + (f" for {size['epochs']} epochs" if size["epochs"] else "")
            + f" ({size['source']})") if size["samples"] else "its training data size is unknown (neither its config "\
        "nor a trainer file next to it records it)"
    how = ("The draft is near chance on every layout (no layout can be told apart), and" if near_chance else
           "The draft is served on the layout it was trained on, but")
    text = (f"{how} its per-position accuracy on the "
            f"{res.samples} evaluated samples is [{shown}] against the floors [{floors}] (position"
            f"{'s' if len(below) > 1 else ''} {', '.join(str(k) for k in below)} below), for a predicted accept length "
            f"of {accept:.2f} at {steps} steps; {data}.")
    return [Finding(id="undertrained", severity="warn", text=text,
                    evidence={"full_acc": acc, "floors": list(FLOORS[: len(acc)]), "below": below,
                              "predicted_accept_length": accept, "verdict": res.verdict.status, "steps": steps,
                              "basis": res.basis,
                              "samples_evaluated": res.samples, "training_samples": size["samples"],
                              "training_epochs": size["epochs"], "training_size_source": size["source"]},
                    fix=(f"Train on more data or for more epochs ({FIELD}); check the accuracies on held-out dumps "
                         "again with `invoke test-drafter` before serving."))]
